/*
 * session.c — chat sessions (cellm_session in include/cellm.h): a
 * conversation that keeps the KV cache of its earlier turns on the engine,
 * so that the next turn computes only its new tokens.
 *
 * A session holds its history (rendered in full with the chat template at
 * each send, on the caller's thread) and, between turns, a sequence of KV
 * blocks with the tokens they hold (`kept`). A turn is an ordinary request
 * whose prompt is the rendered conversation. When the scheduler admits it,
 * it takes the session's blocks (session_adopt): it keeps them as far as
 * they agree with its prompt, token for token, and feeds only the rest.
 * When it finishes, its blocks and tokens become the session's kept KV and
 * its text the assistant's message (session_turn_end). The kept tokens are
 * what the model saw, so a template that renders earlier turns otherwise
 * (thinking stripped, a reply cut by a stop string, text that tokenizes
 * differently) only costs a recompute from the first token that differs.
 *
 * Idle sessions with kept blocks form a list, least recently used first;
 * the scheduler drops their blocks from the head when it runs short
 * (before preempting anything), and trimming drops them all. Everything
 * about kept KV runs on the engine thread; the public calls hand over
 * through the engine's mutex (see engine.h).
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"

/* ------------------------------------------------------- the kept list */

static void lru_remove(cellm_engine *e, cellm_session *s) {
    if (!s->in_lru) return;
    if (s->lru_prev)
        s->lru_prev->lru_next = s->lru_next;
    else
        e->lru_head = s->lru_next;
    if (s->lru_next)
        s->lru_next->lru_prev = s->lru_prev;
    else
        e->lru_tail = s->lru_prev;
    s->lru_prev = s->lru_next = NULL;
    s->in_lru = false;
    e->n_lru--;
    e->blocks_kept -= s->n_kept_blocks;
    s->n_kept_blocks = 0;
}

/* Blocks the sequence holds in all groups. */
static int32_t seq_blocks(const kv_cache *c, const kv_seq *q) {
    int32_t n = 0;
    for (int32_t g = 0; g < c->n_groups; g++)
        for (int32_t b = 0; b < c->max_blocks_per_seq; b++) n += q->table[g][b] >= 0;
    return n;
}

/* Puts an idle session that keeps blocks at the recent end of the list. */
static void lru_push(cellm_engine *e, cellm_session *s) {
    lru_remove(e, s);
    if (s->seq.n_pos == 0) return;
    s->n_kept_blocks = seq_blocks(e->kv, &s->seq);
    s->lru_prev = e->lru_tail;
    s->lru_next = NULL;
    if (e->lru_tail)
        e->lru_tail->lru_next = s;
    else
        e->lru_head = s;
    e->lru_tail = s;
    s->in_lru = true;
    e->n_lru++;
    e->blocks_kept += s->n_kept_blocks;
}

void session_keep(cellm_engine *e, cellm_session *s) {
    lru_push(e, s);
}

bool session_drop_lru(cellm_engine *e) {
    cellm_session *s = e->lru_head;
    if (!s) return false;
    lru_remove(e, s);
    kv_seq_reset(e->kv, &s->seq);
    return true;
}

int32_t session_drop_all(cellm_engine *e) {
    int32_t n = e->blocks_kept;
    while (session_drop_lru(e)) {
    }
    return n;
}

/* --------------------------------------------------- turns (engine thread) */

static void swap_seq(kv_seq *a, kv_seq *b) {
    kv_seq t = *a;
    *a = *b;
    *b = t;
}

void session_adopt(cellm_engine *e, cellm_request *r) {
    cellm_session *s = r->session;
    lru_remove(e, s);
    /* The prompt's last token is always computed: its logits give the
     * first token of the reply. */
    int32_t limit = r->n_prompt - 1, d = 0;
    if (limit > s->seq.n_pos) limit = s->seq.n_pos;
    while (d < limit && s->kept[d] == r->tokens[d]) d++;
    if (d < s->seq.n_pos && !kv_seq_truncate(e->kv, &s->seq, d)) {
        /* A sliding-window group has let go of positions the shorter
         * sequence needs again. */
        kv_seq_reset(e->kv, &s->seq);
        d = 0;
    }
    swap_seq(&r->seq, &s->seq); /* r's own tables were empty */
    r->seq.tokens = r->tokens;
    r->seq.n_keep = r->n_prompt;
    s->seq.tokens = s->kept;
    r->adopted = true;
    r->sched.n_cached = d;
}

void session_unadopt(cellm_engine *e, cellm_request *r) {
    cellm_session *s = r->session;
    swap_seq(&r->seq, &s->seq);
    r->seq.tokens = r->tokens;
    r->seq.n_keep = r->n_prompt;
    s->seq.tokens = s->kept;
    r->adopted = false;
    r->sched.n_cached = 0;
    lru_push(e, s);
}

void session_turn_end(cellm_engine *e, cellm_request *r, cellm_finish_reason why) {
    cellm_session *s = r->session;
    if (r->adopted) {
        swap_seq(&r->seq, &s->seq);
        r->seq.tokens = r->tokens;
        r->seq.n_keep = r->n_prompt;
        s->seq.tokens = s->kept;
        r->adopted = false;
        /* The tokens whose K/V are in the blocks: the prompt and the reply
         * but its last token, which was sampled and not fed. */
        memcpy(s->kept, r->tokens, (size_t)s->seq.n_pos * sizeof *s->kept);
    }
    /* (Not admitted: the session still keeps what it kept before.) */
    if (why == CELLM_FINISH_ERROR) kv_seq_reset(e->kv, &s->seq); /* what it holds is unknown */
    bool no_turn = why == CELLM_FINISH_ERROR ||
                   (why == CELLM_FINISH_CANCELLED && r->sched.n_tokens == r->n_prompt);
    if (no_turn) {
        s->n_msgs--;
        free((char *)s->msgs[s->n_msgs].content);
    } else {
        /* The send reserved the room; the reply's buffer becomes the
         * message. */
        s->msgs[s->n_msgs++] = (cellm_chat_message){"assistant", r->reply};
        r->reply = NULL;
    }
    lru_push(e, s);
}

void session_release_kv(cellm_engine *e, cellm_session *s) {
    lru_remove(e, s);
    kv_seq_free(e->kv, &s->seq);
}

void session_destroy(cellm_session *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_msgs; i++) free((char *)s->msgs[i].content);
    free(s->msgs);
    free(s->kept);
    free(s->bias);
    free(s);
}

/* ----------------------------------------------------------- public API */

cellm_session_params cellm_session_default_params(void) {
    cellm_session_params p;
    memset(&p, 0, sizeof p);
    cellm_request_params rp = cellm_request_default_params();
    p.sampling = rp.sampling;
    p.max_tokens = rp.max_tokens;
    return p;
}

cellm_status cellm_session_create(cellm_engine *e, const cellm_session_params *params,
                                  cellm_session **out) {
    if (!out) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_create: out is NULL");
    *out = NULL;
    if (!e) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_create: engine is NULL");
    if (!e->model->has_chat) return engine_fail(CELLM_ERR_UNSUPPORTED, e->model->chat_err);
    cellm_session_params p = params ? *params : cellm_session_default_params();
    cellm_status st = engine_check_sampling(&p.sampling);
    if (st) return st;
    cellm_session *s = calloc(1, sizeof *s);
    if (!s) return engine_fail(CELLM_ERR_NO_MEMORY, "out of memory");
    s->e = e;
    s->sampling = p.sampling;
    s->max_tokens = p.max_tokens;
    s->cap_msgs = 8;
    s->msgs = calloc((size_t)s->cap_msgs, sizeof *s->msgs);
    s->kept = malloc((size_t)e->kv->max_ctx * sizeof *s->kept);
    bool ok = s->msgs && s->kept;
    if (ok && p.sampling.n_logit_bias > 0) {
        size_t n = (size_t)p.sampling.n_logit_bias * sizeof *s->bias;
        s->bias = malloc(n);
        if (s->bias) memcpy(s->bias, p.sampling.logit_bias, n);
        ok = s->bias != NULL;
    }
    s->sampling.logit_bias = s->bias;
    if (ok && p.system) {
        char *sys = strdup(p.system);
        if (sys) s->msgs[s->n_msgs++] = (cellm_chat_message){"system", sys};
        ok = sys != NULL;
    }
    cellm_error err;
    err_clear(&err);
    /* Only the block tables are allocated: no block is taken yet, so this
     * does not touch what the engine thread owns. */
    if (!ok || kv_seq_init(e->kv, &s->seq, &err) != CELLM_OK) {
        session_destroy(s);
        return engine_fail(CELLM_ERR_NO_MEMORY, "out of memory");
    }
    *out = s;
    return CELLM_OK;
}

cellm_request_params cellm_session_request_params(const cellm_session *s) {
    cellm_request_params p = cellm_request_default_params();
    if (s) {
        p.sampling = s->sampling;
        p.max_tokens = s->max_tokens;
    }
    return p;
}

cellm_status cellm_session_send(cellm_session *s, const char *content,
                                const cellm_request_params *params, cellm_request **out) {
    if (!out) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_send: out is NULL");
    *out = NULL;
    if (!s || !content)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_send: a NULL argument");
    cellm_engine *e = s->e;
    cellm_request_params p = params ? *params : cellm_session_request_params(s);
    if (p.prompt || p.messages || p.tokens || p.messages_json || p.tools_json)
        return engine_fail(CELLM_ERR_INVALID_ARG,
                           "a session's turn takes no prompt, messages, messages_json, tools_json "
                           "or tokens: the session supplies the conversation");
    pthread_mutex_lock(&e->mu);
    bool busy = s->turn != NULL || s->free_pending;
    pthread_mutex_unlock(&e->mu);
    if (busy)
        return engine_fail(CELLM_ERR_INVALID_ARG, "the session's previous turn has not finished");
    /* Room for this message and the reply, so the engine thread can add
     * the reply without allocating. */
    if (s->n_msgs + 2 > s->cap_msgs) {
        int32_t cap = s->cap_msgs * 2;
        cellm_chat_message *m = realloc(s->msgs, (size_t)cap * sizeof *m);
        if (!m) return engine_fail(CELLM_ERR_NO_MEMORY, "out of memory");
        s->msgs = m;
        s->cap_msgs = cap;
    }
    char *copy = strdup(content);
    if (!copy) return engine_fail(CELLM_ERR_NO_MEMORY, "out of memory");
    s->msgs[s->n_msgs++] = (cellm_chat_message){"user", copy};
    p.messages = s->msgs;
    p.n_messages = s->n_msgs;
    cellm_status st = engine_submit(e, &p, s, out);
    if (st) {
        /* Not queued: the engine never saw it, the history is ours. */
        s->n_msgs--;
        free(copy);
    }
    return st;
}

cellm_status cellm_session_messages(cellm_session *s, const cellm_chat_message **msgs, int32_t *n) {
    if (!s || !msgs || !n)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_messages: a NULL argument");
    cellm_engine *e = s->e;
    pthread_mutex_lock(&e->mu);
    bool busy = s->turn != NULL && !engine_on_thread(e);
    pthread_mutex_unlock(&e->mu);
    if (busy) return engine_fail(CELLM_ERR_INVALID_ARG, "the session's turn is still running");
    *msgs = s->msgs;
    *n = s->n_msgs;
    return CELLM_OK;
}

void cellm_session_free(cellm_session *s) {
    if (!s) return;
    cellm_engine *e = s->e;
    bool on_thread = engine_on_thread(e);
    pthread_mutex_lock(&e->mu);
    if (s->turn) {
        s->turn->cancel = true;
        e->events++;
        pthread_cond_signal(&e->cv_work);
        if (on_thread) {
            /* From a callback: engine_finish frees it after the turn. */
            s->free_pending = true;
            pthread_mutex_unlock(&e->mu);
            return;
        }
        while (s->turn) engine_wait_locked(e);
    }
    if (on_thread) {
        pthread_mutex_unlock(&e->mu);
        session_release_kv(e, s);
        session_destroy(s);
        return; /* the stats catch up at the end of the step */
    }
    /* Its blocks are the engine thread's to give back. */
    s->next_free = e->session_frees;
    e->session_frees = s;
    e->events++;
    pthread_cond_signal(&e->cv_work);
    while (!s->dropped) engine_wait_locked(e);
    pthread_mutex_unlock(&e->mu);
    session_destroy(s);
}

/* ------------------------------------------------------- forks and copies */

/* A static role string for a message role (the history keeps only these). */
static const char *role_of(const char *role) {
    static const char *const roles[] = {"system", "user", "assistant"};
    for (int i = 0; i < 3; i++)
        if (role && !strcmp(role, roles[i])) return roles[i];
    return NULL;
}

cellm_status session_new_with(cellm_engine *e, const cellm_session_params *params,
                              const cellm_chat_message *msgs, int32_t n, cellm_session **out) {
    cellm_session_params p = params ? *params : cellm_session_default_params();
    p.system = NULL;
    cellm_session *s = NULL;
    cellm_status st = cellm_session_create(e, &p, &s);
    if (st) return st;
    if (n + 2 > s->cap_msgs) {
        cellm_chat_message *m = realloc(s->msgs, (size_t)(n + 2) * sizeof *m);
        if (!m) {
            session_destroy(s);
            return engine_fail(CELLM_ERR_NO_MEMORY, "out of memory");
        }
        s->msgs = m;
        s->cap_msgs = n + 2;
    }
    for (int32_t i = 0; i < n; i++) {
        const char *role = role_of(msgs[i].role);
        char *content = msgs[i].content ? strdup(msgs[i].content) : NULL;
        if (!role || !content) {
            free(content);
            session_release_kv(e, s); /* holds no block yet */
            session_destroy(s);
            return engine_fail(role ? CELLM_ERR_NO_MEMORY : CELLM_ERR_INVALID_ARG,
                               role ? "out of memory"
                                    : "a message role is not system, user or assistant");
        }
        s->msgs[s->n_msgs++] = (cellm_chat_message){role, content};
    }
    *out = s;
    return CELLM_OK;
}

typedef struct fork_job {
    cellm_session *from, *to;
} fork_job;

/* Engine thread: `to` shares the kept blocks of `from`. */
static void fork_kv(cellm_engine *e, void *arg) {
    fork_job *j = arg;
    if (j->from->seq.n_pos == 0) return;
    kv_seq_fork(e->kv, &j->to->seq, &j->from->seq);
    memcpy(j->to->kept, j->from->kept, (size_t)j->from->seq.n_pos * sizeof *j->to->kept);
    j->to->seq.tokens = j->to->kept;
    lru_push(e, j->from);
    lru_push(e, j->to);
}

cellm_status cellm_session_fork(cellm_session *s, cellm_session **out) {
    if (!out) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_fork: out is NULL");
    *out = NULL;
    if (!s) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_fork: session is NULL");
    cellm_engine *e = s->e;
    pthread_mutex_lock(&e->mu);
    bool busy = s->turn != NULL || s->free_pending;
    pthread_mutex_unlock(&e->mu);
    if (busy) return engine_fail(CELLM_ERR_INVALID_ARG, "the session's turn has not finished");
    if (engine_on_thread(e))
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_fork called from a callback");
    cellm_session_params p = cellm_session_default_params();
    p.sampling = s->sampling;
    p.max_tokens = s->max_tokens;
    cellm_session *f = NULL;
    cellm_status st = session_new_with(e, &p, s->msgs, s->n_msgs, &f);
    if (st) return st;
    fork_job j = {s, f};
    engine_run_job(e, fork_kv, &j);
    *out = f;
    return CELLM_OK;
}

/*
 * scheduler.c — continuous batching: the queues of an engine and the plan
 * of each step's flat batch (see engine.h; DESIGN.md section 6).
 *
 * A request is waiting (queued, no KV blocks) or running (admitted; its
 * sequence holds the blocks of the tokens computed so far). Both queues are
 * ordered by priority, high first, then by arrival, so the head is what
 * must progress first and the tail is what gives way first. A request's
 * tokens are its prompt followed by its completion; the scheduler only
 * knows that tokens [seq.n_pos, n_tokens) still have to be fed: one for a
 * decoding request, a whole prompt for a new one, prompt and completion for
 * one that was preempted.
 *
 * A step, under a budget of max_batch_tokens rows:
 *  1. every running request that decodes gets its one row, in queue order;
 *  2. running requests with more to feed (prompts) get chunks of what is
 *     left of the budget;
 *  3. waiting requests are admitted, in order, while the KV blocks of their
 *     whole input fit next to what is planned, and get a first chunk.
 * Blocks are counted exactly as forward_run reserves them. When a running
 * request's row does not fit, the tail of the running queue (lowest
 * priority, most recent) is preempted: its blocks go back to the pool and
 * it returns to the waiting queue, to be recomputed from its tokens later
 * (so its text is unchanged: the forward pass is batch-invariant and its
 * sampler keeps its state). No request is admitted in a step that
 * preempted, so a victim is not readmitted at once. A request alone in the
 * cache that still does not fit has outgrown the budget: it finishes with
 * CELLM_FINISH_LENGTH.
 *
 * A request admitted with nothing in the cache first takes the longest
 * prefix of its tokens that the prefix index holds (kv_seq_lookup): those
 * blocks are shared, not computed again, and count as held at admission.
 *
 * Sessions keep the blocks of their conversation between turns. Those
 * blocks give way first: when a running request's row or a waiting
 * request's admission does not fit, the least recently used idle session's
 * kept blocks are dropped before anything is preempted. A session's turn
 * takes its session's kept blocks when it is admitted (session_adopt), so
 * it only has to feed the tokens after the prefix they hold.
 */
#include <string.h>

#include "runtime/engine.h"

/* True when a comes before b in the queues. */
static bool before(const cellm_request *a, const cellm_request *b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->arrival < b->arrival;
}

void sched_enqueue(cellm_engine *e, cellm_request *r) {
    cellm_request **p = &e->waiting;
    while (*p && !before(r, *p)) p = &(*p)->next;
    r->next = *p;
    *p = r;
    e->n_waiting++;
}

static void running_insert(cellm_engine *e, cellm_request *r) {
    int32_t i = e->n_running;
    while (i > 0 && before(r, e->running[i - 1])) {
        e->running[i] = e->running[i - 1];
        i--;
    }
    e->running[i] = r;
    e->n_running++;
}

/* Index of r in the running queue, or -1. */
static int32_t running_index(const cellm_engine *e, const cellm_request *r) {
    for (int32_t i = 0; i < e->n_running; i++)
        if (e->running[i] == r) return i;
    return -1;
}

void sched_remove(cellm_engine *e, cellm_request *r) {
    int32_t i = running_index(e, r);
    if (i >= 0) {
        memmove(&e->running[i], &e->running[i + 1],
                sizeof(e->running[0]) * (size_t)(e->n_running - i - 1));
        e->n_running--;
        return;
    }
    for (cellm_request **p = &e->waiting; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            r->next = NULL;
            e->n_waiting--;
            return;
        }
}

/* ---------------------------------------------------------- block counting */

/* Blocks group g must take for positions [n_pos, n_pos + n) of r: the
 * missing ones and a copy of a shared block being filled. */
static int32_t missing_blocks(const cellm_engine *e, const cellm_request *r, int32_t g, int32_t n) {
    return kv_seq_need(e->kv, &r->seq, g, n);
}

/* Blocks of this step: `taken[g]` are promised to planned rows. */
typedef struct plan_blocks {
    int32_t taken[2];
} plan_blocks;

static int32_t avail(const cellm_engine *e, const plan_blocks *pb, int32_t g) {
    return e->kv->groups[g].n_free - pb->taken[g];
}

static bool fits(const cellm_engine *e, const plan_blocks *pb, const cellm_request *r, int32_t n) {
    for (int32_t g = 0; g < e->kv->n_groups; g++)
        if (missing_blocks(e, r, g, n) > avail(e, pb, g)) return false;
    return true;
}

static void take(cellm_engine *e, plan_blocks *pb, cellm_request *r, int32_t n) {
    for (int32_t g = 0; g < e->kv->n_groups; g++) pb->taken[g] += missing_blocks(e, r, g, n);
    r->plan_n = n;
}

/* The most rows of r, up to `want`, whose blocks fit: whole blocks are
 * dropped from the end until they do. */
static int32_t largest_fit(const cellm_engine *e, const plan_blocks *pb, const cellm_request *r,
                           int32_t want) {
    int32_t n = want;
    while (n > 0 && !fits(e, pb, r, n)) {
        int32_t end = r->seq.n_pos + n;                              /* exclusive */
        int32_t cut = (end - 1) / KV_BLOCK_TOKENS * KV_BLOCK_TOKENS; /* start of last block */
        n = cut - r->seq.n_pos;
    }
    return n > 0 ? n : 0;
}

/* Blocks group g still needs to hold r's whole input and its next token
 * (blocks a session's turn took from its session count as held): the
 * admission test. A windowed group holds at most its window, the block
 * being filled and one chunk. */
static int32_t admit_need(const cellm_engine *e, const cellm_request *r, int32_t g) {
    int32_t pos = kv_window_positions(e->kv->groups[g].window, r->n_tokens + 1,
                                      e->p.max_batch_tokens + e->kv->seq_slack);
    int32_t need = (pos + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    if (r->seq.n_pos > 0) {
        int32_t last = (r->seq.n_pos - 1) / KV_BLOCK_TOKENS;
        for (int32_t b = 0; b <= last; b++) need -= r->seq.table[g][b] >= 0;
    }
    need += kv_seq_cow(e->kv, &r->seq, g);
    return need > 0 ? need : 0;
}

static bool admit_fits(const cellm_engine *e, const plan_blocks *pb, const cellm_request *r) {
    for (int32_t g = 0; g < e->kv->n_groups; g++)
        if (admit_need(e, r, g) > avail(e, pb, g)) return false;
    return true;
}

/* Moves running[i] back to the waiting queue and frees its blocks. */
static void preempt_one(cellm_engine *e, int32_t i) {
    cellm_request *r = e->running[i];
    kv_seq_reset(e->kv, &r->seq);
    spec_drop(e, r);
    sched_remove(e, r);
    sched_enqueue(e, r);
    r->n_preempt++;
    e->n_preempt++;
}

/* preempt_one during a plan: r's planned rows go back to the budget. */
static void preempt(cellm_engine *e, plan_blocks *pb, int32_t *budget, int32_t i) {
    cellm_request *r = e->running[i];
    for (int32_t g = 0; g < e->kv->n_groups; g++)
        pb->taken[g] -= missing_blocks(e, r, g, r->plan_n);
    *budget += r->plan_n;
    r->plan_n = 0;
    preempt_one(e, i);
}

int32_t sched_preempt_all(cellm_engine *e) {
    int32_t n = e->n_running;
    while (e->n_running > 0) preempt_one(e, e->n_running - 1);
    return n;
}

/* Plans rows for the running requests of one kind (decode: one token to
 * feed; else: more). Returns false if it preempted. */
static bool plan_running(cellm_engine *e, plan_blocks *pb, int32_t *budget, bool decode) {
    bool preempted = false;
    for (int32_t i = 0; i<e->n_running && * budget> 0; i++) {
        cellm_request *r = e->running[i];
        int32_t pending = r->n_tokens - r->seq.n_pos;
        if (r->plan_n > 0 || pending <= 0 || (pending == 1) != decode) continue;
        /* A decoding request feeds its guesses after its pending token
         * (spec.c), as many as the budget and the blocks allow. */
        int32_t want = pending + (decode ? r->n_draft : 0);
        if (want > *budget) want = *budget;
        for (;;) {
            int32_t n = largest_fit(e, pb, r, want);
            if (n == 0 && want > 1 && decode) n = largest_fit(e, pb, r, 1);
            if (decode) r->n_draft = n > 1 ? n - 1 : 0;
            if (n > 0) {
                take(e, pb, r, n);
                *budget -= n;
                break;
            }
            if (session_drop_lru(e)) continue; /* idle sessions' blocks go first */
            preempted = true;
            if (e->n_running == 1) {
                /* Alone in the cache and still no room: it has outgrown
                 * the whole budget. */
                engine_finish(e, r, CELLM_FINISH_LENGTH, CELLM_OK, NULL);
                i--;
                break;
            }
            int32_t victim = e->n_running - 1;
            preempt(e, pb, budget, victim);
            if (victim == i) {
                i--;
                break;
            }
        }
    }
    return preempted;
}

/* True while r reports its prompt's log-probabilities (every row asks for
 * logits). */
static bool reports_prompt(const cellm_request *r) {
    return r->lp_prompt && r->lp_done < r->n_prompt;
}

/* Rows of r's planned chunk, from the start, that fit `left` rows of
 * logits; *used gets the rows of logits they take. */
static int32_t rows_within(const cellm_request *r, int32_t left, int32_t *used) {
    int32_t n = 0, want = 0;
    for (; n < r->plan_n; n++) {
        int32_t w = req_row_logits(r, r->seq.n_pos + n);
        if (want + w > left) break;
        want += w;
    }
    *used = want;
    return n;
}

/* The forward pass returns at most e->logit_rows rows of logits. Without
 * prompt_logprobs a plan never asks for more (one row per request, or its
 * pending token and guesses); the chunks of requests that report their
 * prompt, where every row asks, are cut to what is left, in queue order,
 * and go on next step. */
static void fit_logit_rows(cellm_engine *e) {
    bool any = false;
    for (int32_t i = 0; i < e->n_running && !any; i++)
        any = e->running[i]->plan_n > 0 && reports_prompt(e->running[i]);
    if (!any) return;
    int32_t left = e->logit_rows, used;
    for (int32_t i = 0; i < e->n_running; i++) {
        cellm_request *r = e->running[i];
        if (r->plan_n > 0 && !reports_prompt(r)) {
            rows_within(r, r->plan_n, &used);
            left -= used;
        }
    }
    for (int32_t i = 0; i < e->n_running; i++) {
        cellm_request *r = e->running[i];
        if (r->plan_n <= 0 || !reports_prompt(r)) continue;
        r->plan_n = rows_within(r, left, &used);
        left -= used;
    }
}

int32_t sched_plan_step(cellm_engine *e) {
    plan_blocks pb = {{0, 0}};
    int32_t budget = e->p.max_batch_tokens;
    for (int32_t i = 0; i < e->n_running; i++) e->running[i]->plan_n = 0;

    bool preempted = plan_running(e, &pb, &budget, true);
    preempted |= plan_running(e, &pb, &budget, false);

    while (!preempted && e->waiting && e->n_running < e->p.max_seqs && budget > 0) {
        cellm_request *r = e->waiting;
        bool adopted_now = r->session && !r->adopted;
        if (adopted_now) session_adopt(e, r);
        /* Nothing kept (a new request, a preempted one, a session whose
         * blocks were dropped): the longest cached prefix of its tokens,
         * always leaving the last one to compute. */
        int32_t found = 0;
        if (r->seq.n_pos == 0) {
            /* With prompt_logprobs the cache stands in only for rows whose
             * prompt tokens have been reported. */
            int32_t limit = r->n_tokens - 1;
            if (r->lp_prompt && r->lp_done < r->n_prompt && r->lp_done - 1 < limit)
                limit = r->lp_done > 0 ? r->lp_done - 1 : 0;
            found = kv_seq_lookup(e->kv, &r->seq, r->tokens, limit);
            if (found > 0 && r->n_preempt == 0) r->n_cached = found;
            if (found > 0) e->n_prefix_tok += (uint64_t)found;
        }
        bool ok = admit_fits(e, &pb, r);
        while (!ok && session_drop_lru(e)) ok = admit_fits(e, &pb, r);
        /* Into an empty cache a request always goes: it may still finish
         * within the budget, and nothing else would make room. */
        if (!ok && e->n_running > 0) {
            /* The cached blocks go back to the index; its session keeps
             * its blocks while it waits. */
            if (found > 0) {
                kv_seq_reset(e->kv, &r->seq);
                e->n_prefix_tok -= (uint64_t)found;
                if (r->n_preempt == 0) r->n_cached = 0;
            }
            if (adopted_now) session_unadopt(e, r);
            break;
        }
        e->waiting = r->next;
        r->next = NULL;
        e->n_waiting--;
        running_insert(e, r);
        r->plan_n = 0;
        int32_t want = r->n_tokens - r->seq.n_pos;
        if (want > budget) want = budget;
        int32_t n = largest_fit(e, &pb, r, want);
        if (n > 0) {
            take(e, &pb, r, n);
            budget -= n;
        }
    }

    fit_logit_rows(e);

    /* The flat batch, in queue order; a request's last row asks for logits
     * when it reaches the end of its tokens (req_row_logits). */
    int32_t n_rows = 0;
    e->n_fed = 0;
    for (int32_t i = 0; i < e->n_running; i++) {
        cellm_request *r = e->running[i];
        if (r->plan_n <= 0) continue;
        for (int32_t j = 0; j < r->plan_n; j++) {
            int32_t pos = r->seq.n_pos + j;
            /* Logits for the last token and the guesses after it. */
            e->rows[n_rows++] = (fwd_row){&r->seq, r->tokens[pos], pos, req_row_logits(r, pos)};
        }
        e->fed[e->n_fed++] = r;
    }
    return n_rows;
}

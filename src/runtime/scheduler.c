/*
 * scheduler.c — continuous batching: the queues of an engine and the plan
 * of each step's flat batch (see scheduler.h; DESIGN.md section 6).
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
 * Blocks are counted exactly as a pass reserves them (batch_reserve, which
 * every backend calls before it computes). When a running
 * request's row does not fit, the tail of the running queue (lowest
 * priority, most recent) is preempted: its blocks go back to the pool and
 * it returns to the waiting queue, to be recomputed from its tokens later
 * (so its text is unchanged: the forward pass is batch-invariant and its
 * sampler keeps its state). No request is admitted in a step that
 * preempted, so a victim is not readmitted at once. A request alone in the
 * cache that still does not fit has outgrown the budget: it finishes with
 * CELLM_FINISH_LENGTH (hooks.finish).
 *
 * A request admitted with nothing in the cache first takes the longest
 * prefix of its tokens that the prefix index holds (kv_seq_lookup): those
 * blocks are shared, not computed again, and count as held at admission.
 *
 * Sessions keep the blocks of their conversation between turns. Those
 * blocks give way first: when a running request's row or a waiting
 * request's admission does not fit, the least recently used idle session's
 * kept blocks are dropped before anything is preempted (hooks.reclaim). A
 * session's turn takes its session's kept blocks when it is admitted
 * (hooks.adopt), so it only has to feed the tokens after the prefix they
 * hold.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/scheduler.h"

cellm_status sched_init(sched *s, kv_cache *kv, const sched_limits *lim, const sched_hooks *hooks,
                        cellm_error *err) {
    memset(s, 0, sizeof *s);
    s->kv = kv;
    s->lim = *lim;
    s->hooks = *hooks;
    s->rows = malloc((size_t)lim->max_batch_tokens * sizeof *s->rows);
    s->running = malloc((size_t)lim->max_seqs * sizeof *s->running);
    s->fed = malloc((size_t)lim->max_seqs * sizeof *s->fed);
    if (!s->rows || !s->running || !s->fed) {
        sched_free(s);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    return CELLM_OK;
}

void sched_free(sched *s) {
    free(s->rows);
    free(s->running);
    free(s->fed);
    s->rows = NULL;
    s->running = s->fed = NULL;
}

/* True when a comes before b in the queues. */
static bool before(const sched_item *a, const sched_item *b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->arrival < b->arrival;
}

void sched_enqueue(sched *s, sched_item *it) {
    sched_item **p = &s->waiting;
    while (*p && !before(it, *p)) p = &(*p)->next;
    it->next = *p;
    *p = it;
    s->n_waiting++;
}

static void running_insert(sched *s, sched_item *it) {
    int32_t i = s->n_running;
    while (i > 0 && before(it, s->running[i - 1])) {
        s->running[i] = s->running[i - 1];
        i--;
    }
    s->running[i] = it;
    s->n_running++;
}

/* Index of it in the running queue, or -1. */
static int32_t running_index(const sched *s, const sched_item *it) {
    for (int32_t i = 0; i < s->n_running; i++)
        if (s->running[i] == it) return i;
    return -1;
}

void sched_remove(sched *s, sched_item *it) {
    int32_t i = running_index(s, it);
    if (i >= 0) {
        memmove(&s->running[i], &s->running[i + 1],
                sizeof(s->running[0]) * (size_t)(s->n_running - i - 1));
        s->n_running--;
        return;
    }
    for (sched_item **p = &s->waiting; *p; p = &(*p)->next)
        if (*p == it) {
            *p = it->next;
            it->next = NULL;
            s->n_waiting--;
            return;
        }
}

/* ---------------------------------------------------------- block counting */

/* Blocks group g must take for positions [n_pos, n_pos + n) of it: the
 * missing ones and a copy of a shared block being filled. */
static int32_t missing_blocks(const sched *s, const sched_item *it, int32_t g, int32_t n) {
    return kv_seq_need(s->kv, it->seq, g, n);
}

/* Blocks of this step: `taken[g]` are promised to planned rows. */
typedef struct plan_blocks {
    int32_t taken[2];
} plan_blocks;

static int32_t avail(const sched *s, const plan_blocks *pb, int32_t g) {
    return s->kv->groups[g].n_free - pb->taken[g];
}

static bool fits(const sched *s, const plan_blocks *pb, const sched_item *it, int32_t n) {
    for (int32_t g = 0; g < s->kv->n_groups; g++)
        if (missing_blocks(s, it, g, n) > avail(s, pb, g)) return false;
    return true;
}

static void take(sched *s, plan_blocks *pb, sched_item *it, int32_t n) {
    for (int32_t g = 0; g < s->kv->n_groups; g++) pb->taken[g] += missing_blocks(s, it, g, n);
    it->plan_n = n;
}

/* The most rows of it, up to `want`, whose blocks fit: whole blocks are
 * dropped from the end until they do. */
static int32_t largest_fit(const sched *s, const plan_blocks *pb, const sched_item *it,
                           int32_t want) {
    int32_t n = want;
    while (n > 0 && !fits(s, pb, it, n)) {
        int32_t end = it->seq->n_pos + n;                            /* exclusive */
        int32_t cut = (end - 1) / KV_BLOCK_TOKENS * KV_BLOCK_TOKENS; /* start of last block */
        n = cut - it->seq->n_pos;
    }
    return n > 0 ? n : 0;
}

/* Blocks group g still needs to hold its whole input and its next token
 * (blocks a session's turn took from its session count as held): the
 * admission test. A windowed group holds at most its window, the block
 * being filled and one chunk. */
static int32_t admit_need(const sched *s, const sched_item *it, int32_t g) {
    const kv_seq *q = it->seq;
    int32_t pos = kv_window_positions(s->kv->groups[g].window, it->n_tokens + 1,
                                      s->lim.max_batch_tokens + s->kv->seq_slack);
    int32_t need = (pos + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    if (q->n_pos > 0) {
        int32_t last = (q->n_pos - 1) / KV_BLOCK_TOKENS;
        for (int32_t b = 0; b <= last; b++) need -= q->table[g][b] >= 0;
    }
    need += kv_seq_cow(s->kv, q, g);
    return need > 0 ? need : 0;
}

static bool admit_fits(const sched *s, const plan_blocks *pb, const sched_item *it) {
    for (int32_t g = 0; g < s->kv->n_groups; g++)
        if (admit_need(s, it, g) > avail(s, pb, g)) return false;
    return true;
}

/* Moves running[i] back to the waiting queue and frees its blocks. */
static void preempt_one(sched *s, int32_t i) {
    sched_item *it = s->running[i];
    kv_seq_reset(s->kv, it->seq);
    s->hooks.preempted(s->hooks.ctx, it);
    sched_remove(s, it);
    sched_enqueue(s, it);
    it->n_preempt++;
    s->n_preempt++;
}

/* preempt_one during a plan: its planned rows go back to the budget. */
static void preempt(sched *s, plan_blocks *pb, int32_t *budget, int32_t i) {
    sched_item *it = s->running[i];
    for (int32_t g = 0; g < s->kv->n_groups; g++)
        pb->taken[g] -= missing_blocks(s, it, g, it->plan_n);
    *budget += it->plan_n;
    it->plan_n = 0;
    preempt_one(s, i);
}

int32_t sched_preempt_all(sched *s) {
    int32_t n = s->n_running;
    while (s->n_running > 0) preempt_one(s, s->n_running - 1);
    return n;
}

/* Plans rows for the running items of one kind (decode: one token to
 * feed; else: more). Returns false if it preempted. */
static bool plan_running(sched *s, plan_blocks *pb, int32_t *budget, bool decode) {
    bool preempted = false;
    for (int32_t i = 0; i<s->n_running && * budget> 0; i++) {
        sched_item *it = s->running[i];
        int32_t pending = it->n_tokens - it->seq->n_pos;
        if (it->plan_n > 0 || pending <= 0 || (pending == 1) != decode) continue;
        /* A decoding request feeds its guesses after its pending token
         * (spec.c), as many as the budget and the blocks allow. */
        int32_t want = pending + (decode ? it->n_draft : 0);
        if (want > *budget) want = *budget;
        for (;;) {
            int32_t n = largest_fit(s, pb, it, want);
            if (n == 0 && want > 1 && decode) n = largest_fit(s, pb, it, 1);
            if (decode) it->n_draft = n > 1 ? n - 1 : 0;
            if (n > 0) {
                take(s, pb, it, n);
                *budget -= n;
                break;
            }
            if (s->hooks.reclaim(s->hooks.ctx)) continue; /* idle sessions' blocks go first */
            preempted = true;
            if (s->n_running == 1) {
                /* Alone in the cache and still no room: it has outgrown
                 * the whole budget. */
                s->hooks.finish(s->hooks.ctx, it);
                i--;
                break;
            }
            int32_t victim = s->n_running - 1;
            preempt(s, pb, budget, victim);
            if (victim == i) {
                i--;
                break;
            }
        }
    }
    return preempted;
}

/* True while it reports its prompt's log-probabilities (every row asks
 * for logits). */
static bool reports_prompt(const sched_item *it) {
    return it->lp_done < it->lp_end;
}

/* Rows of its planned chunk, from the start, that fit `left` rows of
 * logits; *used gets the rows of logits they take. */
static int32_t rows_within(const sched_item *it, int32_t left, int32_t *used) {
    int32_t n = 0, want = 0;
    for (; n < it->plan_n; n++) {
        int32_t w = sched_row_logits(it, it->seq->n_pos + n);
        if (want + w > left) break;
        want += w;
    }
    *used = want;
    return n;
}

/* The forward pass returns at most lim.logit_rows rows of logits. Without
 * prompt_logprobs a plan never asks for more (one row per request, or its
 * pending token and guesses); the chunks of requests that report their
 * prompt, where every row asks, are cut to what is left, in queue order,
 * and go on next step. */
static void fit_logit_rows(sched *s) {
    bool any = false;
    for (int32_t i = 0; i < s->n_running && !any; i++)
        any = s->running[i]->plan_n > 0 && reports_prompt(s->running[i]);
    if (!any) return;
    int32_t left = s->lim.logit_rows, used;
    for (int32_t i = 0; i < s->n_running; i++) {
        sched_item *it = s->running[i];
        if (it->plan_n > 0 && !reports_prompt(it)) {
            rows_within(it, it->plan_n, &used);
            left -= used;
        }
    }
    for (int32_t i = 0; i < s->n_running; i++) {
        sched_item *it = s->running[i];
        if (it->plan_n <= 0 || !reports_prompt(it)) continue;
        it->plan_n = rows_within(it, left, &used);
        left -= used;
    }
}

int32_t sched_plan_step(sched *s) {
    plan_blocks pb = {{0, 0}};
    int32_t budget = s->lim.max_batch_tokens;
    for (int32_t i = 0; i < s->n_running; i++) s->running[i]->plan_n = 0;

    bool preempted = plan_running(s, &pb, &budget, true);
    preempted |= plan_running(s, &pb, &budget, false);

    while (!preempted && s->waiting && s->n_running < s->lim.max_seqs && budget > 0) {
        sched_item *it = s->waiting;
        bool adopted_now = s->hooks.adopt(s->hooks.ctx, it);
        /* Nothing kept (a new request, a preempted one, a session whose
         * blocks were dropped): the longest cached prefix of its tokens,
         * always leaving the last one to compute. */
        int32_t found = 0;
        if (it->seq->n_pos == 0) {
            /* With prompt_logprobs the cache stands in only for rows whose
             * prompt tokens have been reported. */
            int32_t limit = it->n_tokens - 1;
            if (reports_prompt(it) && it->lp_done - 1 < limit)
                limit = it->lp_done > 0 ? it->lp_done - 1 : 0;
            found = kv_seq_lookup(s->kv, it->seq, it->tokens, limit);
            if (found > 0 && it->n_preempt == 0) it->n_cached = found;
            if (found > 0) s->n_prefix_tok += (uint64_t)found;
        }
        bool ok = admit_fits(s, &pb, it);
        while (!ok && s->hooks.reclaim(s->hooks.ctx)) ok = admit_fits(s, &pb, it);
        /* Into an empty cache a request always goes: it may still finish
         * within the budget, and nothing else would make room. */
        if (!ok && s->n_running > 0) {
            /* The cached blocks go back to the index; its session keeps
             * its blocks while it waits. */
            if (found > 0) {
                kv_seq_reset(s->kv, it->seq);
                s->n_prefix_tok -= (uint64_t)found;
                if (it->n_preempt == 0) it->n_cached = 0;
            }
            if (adopted_now) s->hooks.unadopt(s->hooks.ctx, it);
            break;
        }
        s->waiting = it->next;
        it->next = NULL;
        s->n_waiting--;
        running_insert(s, it);
        it->plan_n = 0;
        int32_t want = it->n_tokens - it->seq->n_pos;
        if (want > budget) want = budget;
        int32_t n = largest_fit(s, &pb, it, want);
        if (n > 0) {
            take(s, &pb, it, n);
            budget -= n;
        }
    }

    fit_logit_rows(s);

    /* The flat batch, in queue order; a request's last row asks for logits
     * when it reaches the end of its tokens (sched_row_logits). */
    int32_t n_rows = 0;
    s->n_fed = 0;
    for (int32_t i = 0; i < s->n_running; i++) {
        sched_item *it = s->running[i];
        if (it->plan_n <= 0) continue;
        for (int32_t j = 0; j < it->plan_n; j++) {
            int32_t pos = it->seq->n_pos + j;
            /* Logits for the last token and the guesses after it. */
            s->rows[n_rows++] = (fwd_row){it->seq, it->tokens[pos], pos, sched_row_logits(it, pos)};
        }
        s->fed[s->n_fed++] = it;
    }
    return n_rows;
}

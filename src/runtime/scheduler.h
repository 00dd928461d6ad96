/*
 * scheduler.h — continuous batching: the running and waiting queues and
 * the plan of each step's flat batch (scheduler.c; DESIGN.md section 6).
 *
 * The scheduler knows a request only by the sched_item it embeds, and
 * reaches back to whoever owns the requests (the engine) through the hooks
 * given to sched_init: to finish a request that can never fit, to let go
 * of what a preempted one holds elsewhere, to drop idle KV kept outside
 * the queues, and to hand a request KV kept for it (a session's). So it
 * needs nothing of the engine, and a test drives it alone with fake
 * requests over a small KV cache (tests/test_scheduler.c).
 *
 * One thread (the engine's) owns a sched and its items' scheduling
 * fields: nothing here locks. A step allocates nothing.
 */
#ifndef CELLM_SCHEDULER_H
#define CELLM_SCHEDULER_H

#include <stdbool.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/kv_cache.h"

/* What the scheduler knows of a request; the request embeds it. */
typedef struct sched_item {
    /* The owner's, set before sched_enqueue and fixed after. */
    int32_t priority;      /* higher first */
    uint64_t arrival;      /* then lower (older) first */
    kv_seq *seq;           /* holds the KV of tokens[0 .. seq->n_pos) */
    const int32_t *tokens; /* the prompt, then the completion */
    /* With prompt log-probabilities, the prompt's length (else 0): while
     * lp_done < lp_end the rows of the prompt ask for logits. */
    int32_t lp_end;

    /* The owner's, kept current between steps. */
    int32_t n_tokens; /* tokens so far: [seq->n_pos, n_tokens) are still to feed */
    int32_t lp_done;  /* prompt tokens whose log-probabilities were reported */
    /* Guesses (speculative decoding) at tokens[n_tokens ..], fed after
     * the pending token: the plan cuts them to what fits. */
    int32_t n_draft;

    /* The scheduler's. */
    int32_t plan_n;          /* rows of this step's plan */
    int32_t n_preempt;       /* times preempted */
    int32_t n_cached;        /* prompt tokens it found in the KV (prefix cache; a session's) */
    struct sched_item *next; /* waiting queue */
} sched_item;

/* True when the item's row at position pos asks for logits: its last
 * token (and the guesses after it), and, while prompt log-probabilities
 * are left to report, each row whose logits give the next prompt token's. */
static inline bool sched_row_logits(const sched_item *it, int32_t pos) {
    if (pos + 1 >= it->n_tokens) return true;
    return pos + 1 >= it->lp_done && pos + 1 < it->lp_end;
}

/* What the scheduler asks of the owner of its items; ctx is passed back. */
typedef struct sched_hooks {
    void *ctx;
    /* Ends a request that has outgrown the whole KV cache (alone in it and
     * still short of blocks); must take it out of the queues
     * (sched_remove). */
    void (*finish)(void *ctx, sched_item *it);
    /* After a preemption gave its blocks back: lets go of what else is
     * held for it (a draft model's KV). */
    void (*preempted)(void *ctx, sched_item *it);
    /* Frees the KV kept outside the queues that matters least (an idle
     * session's); false when there is none. Tried before preempting. */
    bool (*reclaim)(void *ctx);
    /* At the head of the waiting queue, before its blocks are counted:
     * hands it KV kept for it elsewhere (a session's turn takes its
     * session's; sets n_cached). True when it took some, which unadopt
     * gives back should it not be admitted after all. */
    bool (*adopt)(void *ctx, sched_item *it);
    void (*unadopt)(void *ctx, sched_item *it);
} sched_hooks;

/* The limits a plan keeps to. */
typedef struct sched_limits {
    int32_t max_seqs;         /* running at once */
    int32_t max_batch_tokens; /* rows of a step */
    int32_t logit_rows;       /* rows of a step that may ask for logits */
} sched_limits;

typedef struct sched {
    /* Fixed at sched_init. */
    kv_cache *kv;
    sched_limits lim;
    sched_hooks hooks;

    /* The queues, each in priority order (high first), then oldest first:
     * the head must progress first, the tail gives way first. */
    sched_item **running; /* [lim.max_seqs] admitted: they hold KV */
    int32_t n_running;
    sched_item *waiting; /* no KV of their own yet */
    int32_t n_waiting;

    /* The last plan: the flat batch (sched_plan_step's rows), and whose
     * rows it holds, in queue order. */
    fwd_row *rows;    /* [lim.max_batch_tokens] */
    sched_item **fed; /* [lim.max_seqs] */
    int32_t n_fed;

    /* Counts, for the engine's stats. */
    uint64_t n_preempt;    /* preemptions */
    uint64_t n_prefix_tok; /* prompt positions taken from the prefix cache */
} sched;

/* An empty scheduler over `kv`: its arrays, for the limits (every hook
 * must be set). CELLM_ERR_NO_MEMORY when they cannot be allocated. */
cellm_status sched_init(sched *s, kv_cache *kv, const sched_limits *lim, const sched_hooks *hooks,
                        cellm_error *err);

/* Frees the arrays (the items are the owner's). A zeroed sched is fine. */
void sched_free(sched *s);

/* Puts `it` in the waiting queue at its place (priority, then arrival). */
void sched_enqueue(sched *s, sched_item *it);

/* Takes `it` out of the running or waiting queue, wherever it is. */
void sched_remove(sched *s, sched_item *it);

/* Plans one step: sets plan_n of running items (preempting and admitting
 * as blocks allow), then fills s->rows and s->fed. Returns the number of
 * rows. May finish items that can never fit (hooks.finish). */
int32_t sched_plan_step(sched *s);

/* Preempts every running item (memory pressure): blocks back to the pool,
 * items back to the waiting queue. Returns how many. */
int32_t sched_preempt_all(sched *s);

#endif /* CELLM_SCHEDULER_H */

/*
 * test_scheduler.c — the scheduler (src/runtime/scheduler.c) alone, with
 * no engine and no model: fake requests over a small KV cache of a tiny
 * model description (one layer, one head of 4), steps "run" by reserving
 * each planned row's KV with batch_reserve, as every backend does before
 * its pass (which must never fail: the plan counted the blocks), and
 * appending a token to every
 * request whose rows reached the end of its tokens. Checked: admission
 * under the block budget, priority order, preemption of the lowest
 * priority when blocks run out (after the hook that frees idle KV),
 * chunked prefill under the token budget, the logit-row limit with prompt
 * log-probabilities, a request that outgrows the whole cache, KV handed
 * over at admission (a session's) and given back when it does not fit,
 * and the prefix cache standing in at admission.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/batch.h"
#include "runtime/scheduler.h"

#define CTX 256
#define MAX_REQS 8

typedef struct fake_req {
    sched_item it;
    kv_seq seq;
    int32_t tokens[CTX];
    int32_t len; /* finishes when it has this many tokens */
    char name;
    bool done;
} fake_req;

typedef struct rig {
    model m;
    kv_cache *kv;
    sched s;
    fake_req reqs[MAX_REQS];
    int32_t n_reqs;
    uint64_t next_arrival;
    char log[256]; /* hook calls and finishes, in order: a letter and a name each */
    char plan[256];
    kv_seq idle;    /* KV kept outside the queues: hooks.reclaim frees it */
    kv_seq kept;    /* a session's kept KV, for `turn` */
    fake_req *turn; /* takes `kept` at admission (hooks.adopt) */
} rig;

static fake_req *req_of(sched_item *it) {
    return (fake_req *)((char *)it - offsetof(fake_req, it));
}

static void log_event(rig *g, char what, char name) {
    size_t n = strlen(g->log);
    assert_true(n + 2 < sizeof g->log);
    g->log[n] = what;
    g->log[n + 1] = name;
    g->log[n + 2] = '\0';
}

/* ------------------------------------------------------------------ hooks */

static void hook_finish(void *ctx, sched_item *it) {
    rig *g = ctx;
    fake_req *r = req_of(it);
    log_event(g, 'f', r->name);
    sched_remove(&g->s, it);
    kv_seq_reset(g->kv, &r->seq);
    r->done = true;
}

static void hook_preempted(void *ctx, sched_item *it) {
    rig *g = ctx;
    assert_int_equal(it->seq->n_pos, 0); /* its blocks went first */
    log_event(g, 'p', req_of(it)->name);
}

static bool hook_reclaim(void *ctx) {
    rig *g = ctx;
    if (g->idle.n_pos == 0) return false;
    kv_seq_reset(g->kv, &g->idle);
    log_event(g, 'r', '-');
    return true;
}

static void swap_seq(kv_seq *a, kv_seq *b) {
    kv_seq t = *a;
    *a = *b;
    *b = t;
}

static bool hook_adopt(void *ctx, sched_item *it) {
    rig *g = ctx;
    fake_req *r = req_of(it);
    if (r != g->turn || r->seq.n_pos > 0) return false;
    swap_seq(&r->seq, &g->kept);
    it->n_cached = r->seq.n_pos;
    log_event(g, 'a', r->name);
    return true;
}

static void hook_unadopt(void *ctx, sched_item *it) {
    rig *g = ctx;
    fake_req *r = req_of(it);
    swap_seq(&r->seq, &g->kept);
    it->n_cached = 0;
    log_event(g, 'u', r->name);
}

/* -------------------------------------------------------------------- rig */

/* A model with one full-attention layer of one KV head of 4: tiny blocks
 * (and room in the vocabulary for every request's tokens). */
static model tiny_model(void) {
    model m;
    memset(&m, 0, sizeof m);
    m.n_vocab = 1 << 20;
    m.n_head_kv = 1;
    m.head_dim = m.head_dim_v = 4;
    m.n_kv_groups = 1;
    m.kv_group_layers[0] = 1;
    return m;
}

/* A scheduler over a cache of exactly n_blocks blocks. */
static void rig_init(rig *g, int32_t n_blocks, int32_t max_seqs, int32_t max_batch_tokens,
                     int32_t logit_rows) {
    memset(g, 0, sizeof *g);
    g->m = tiny_model();
    cellm_error err;
    err_clear(&err);
    kv_cache *probe;
    assert_int_equal(kv_cache_create(&g->m, 1 << 20, CTX, 1, 1, CELLM_KV_F16, &probe, &err),
                     CELLM_OK);
    size_t block = probe->groups[0].block_bytes;
    kv_cache_free(probe);
    assert_int_equal(kv_cache_create(&g->m, (size_t)n_blocks * block, CTX, max_seqs,
                                     max_batch_tokens, CELLM_KV_F16, &g->kv, &err),
                     CELLM_OK);
    assert_int_equal(g->kv->groups[0].n_blocks, n_blocks);
    kv_cache_set_prefix(g->kv, false);
    sched_limits lim = {max_seqs, max_batch_tokens, logit_rows};
    sched_hooks hooks = {g, hook_finish, hook_preempted, hook_reclaim, hook_adopt, hook_unadopt};
    assert_int_equal(sched_init(&g->s, g->kv, &lim, &hooks, &err), CELLM_OK);
    assert_int_equal(kv_seq_init(g->kv, &g->idle, &err), CELLM_OK);
    assert_int_equal(kv_seq_init(g->kv, &g->kept, &err), CELLM_OK);
}

static void rig_free(rig *g) {
    for (int32_t i = 0; i < g->n_reqs; i++) kv_seq_free(g->kv, &g->reqs[i].seq);
    kv_seq_free(g->kv, &g->idle);
    kv_seq_free(g->kv, &g->kept);
    sched_free(&g->s);
    kv_cache_free(g->kv);
}

/* Token i of request `name`: the same for every request when `shared`. */
static int32_t token(char name, int32_t i, bool shared) {
    return shared ? 7 + i : name * 1000 + i;
}

/* A request of n_prompt tokens that finishes at len, put in the waiting
 * queue (arrival: the order of this call). */
static fake_req *submit(rig *g, char name, int32_t priority, int32_t n_prompt, int32_t len) {
    assert_true(g->n_reqs < MAX_REQS && len <= CTX);
    fake_req *r = &g->reqs[g->n_reqs++];
    memset(r, 0, sizeof *r);
    cellm_error err;
    err_clear(&err);
    assert_int_equal(kv_seq_init(g->kv, &r->seq, &err), CELLM_OK);
    for (int32_t i = 0; i < n_prompt; i++) r->tokens[i] = token(name, i, false);
    r->seq.tokens = r->tokens;
    r->name = name;
    r->len = len;
    r->it.priority = priority;
    r->it.arrival = g->next_arrival++;
    r->it.seq = &r->seq;
    r->it.tokens = r->tokens;
    r->it.n_tokens = n_prompt;
    sched_enqueue(&g->s, &r->it);
    return r;
}

/* Fills `seq` with n positions (as if a pass had written them). */
static void hold(rig *g, kv_seq *seq, int32_t n) {
    cellm_error err;
    err_clear(&err);
    assert_int_equal(kv_seq_reserve(g->kv, seq, n, &err), CELLM_OK);
    seq->n_pos += n;
}

/* Plans a step and runs it as the engine would, without computing: the
 * rows' blocks reserved and the sequences advanced as every backend does
 * (batch_reserve must succeed: the plan counted the blocks and the rows of
 * logits), and each request
 * whose rows reached the end of its tokens given its next token, or
 * finished at its length. Returns the plan: each fed request's name and
 * rows, in batch order ("A40 B40"). */
static const char *step(rig *g) {
    sched *s = &g->s;
    int32_t n = sched_plan_step(s), r = 0;
    assert_true(n <= s->lim.max_batch_tokens);
    g->plan[0] = '\0';
    for (int32_t i = 0; i < s->n_fed; i++) {
        sched_item *it = s->fed[i];
        size_t len = strlen(g->plan);
        snprintf(g->plan + len, sizeof g->plan - len, "%s%c%d", i ? " " : "", req_of(it)->name,
                 (int)it->plan_n);
        /* The request's rows, in order from its next position. */
        for (int32_t j = 0; j < it->plan_n; j++, r++) {
            assert_ptr_equal(s->rows[r].seq, it->seq);
            assert_int_equal(s->rows[r].pos, it->seq->n_pos + j);
            assert_int_equal(s->rows[r].token, it->tokens[it->seq->n_pos + j]);
        }
    }
    assert_int_equal(r, n);
    if (n > 0) {
        cellm_error err;
        err_clear(&err);
        assert_int_equal(batch_reserve(&g->m, g->kv, s->rows, n, s->lim.max_batch_tokens,
                                       s->lim.logit_rows, &err),
                         CELLM_OK);
        batch_advance(g->kv, s->rows, n);
    }
    for (int32_t i = 0; i < s->n_fed; i++) {
        sched_item *it = s->fed[i];
        fake_req *q = req_of(it);
        /* Prompt log-probabilities: the rows that asked report the next
         * prompt token. */
        for (int32_t pos = it->seq->n_pos - it->plan_n; pos < it->seq->n_pos; pos++)
            if (pos + 1 < it->lp_end && sched_row_logits(it, pos)) it->lp_done = pos + 2;
        if (it->seq->n_pos < it->n_tokens) continue; /* mid-prompt */
        q->tokens[it->n_tokens] = token(q->name, it->n_tokens, false);
        it->n_tokens++;
        if (it->n_tokens >= q->len) {
            sched_remove(s, it);
            kv_seq_reset(g->kv, &q->seq);
            q->done = true;
            log_event(g, 'd', q->name);
        }
    }
    return g->plan;
}

/* The names in the waiting queue, in order. */
static const char *waiting(rig *g) {
    static char buf[MAX_REQS + 1];
    int32_t n = 0;
    for (sched_item *it = g->s.waiting; it; it = it->next) buf[n++] = req_of(it)->name;
    buf[n] = '\0';
    assert_int_equal(n, g->s.n_waiting);
    return buf;
}

static int32_t used_blocks(rig *g) {
    return kv_cache_used_blocks(g->kv, 0);
}

/* ------------------------------------------------------------------ tests */

/* A request is admitted only when the blocks of its whole input fit next
 * to what runs, not when a first chunk would. */
static void test_admission_under_block_budget(void **state) {
    (void)state;
    rig g;
    rig_init(&g, 8, 8, 128, 8);
    /* 40 tokens and the next one: 3 blocks each. */
    submit(&g, 'A', 0, 40, 44);
    submit(&g, 'B', 0, 40, 44);
    fake_req *c = submit(&g, 'C', 0, 40, 44);
    assert_string_equal(step(&g), "A40 B40");
    assert_int_equal(g.s.n_running, 2);
    assert_string_equal(waiting(&g), "C");
    assert_int_equal(used_blocks(&g), 6);
    /* Two blocks are free: room for a chunk of C, not for all of it. */
    for (int i = 0; i < 3; i++) {
        assert_string_equal(step(&g), "A1 B1");
        assert_int_equal(c->seq.n_pos, 0);
    }
    assert_string_equal(g.log, "dAdB");
    assert_int_equal(used_blocks(&g), 0);
    assert_string_equal(step(&g), "C40");
    assert_int_equal(g.s.n_preempt, 0);
    rig_free(&g);
}

/* Both queues run by priority, then arrival; the batch follows the
 * running queue. */
static void test_priority_order(void **state) {
    (void)state;
    rig g;
    rig_init(&g, 32, 2, 64, 8);
    submit(&g, 'A', 0, 8, 12);
    submit(&g, 'B', 5, 8, 12);
    submit(&g, 'C', 0, 8, 12);
    submit(&g, 'D', 5, 8, 12);
    submit(&g, 'E', 9, 8, 9);
    assert_string_equal(waiting(&g), "EBDAC");
    assert_string_equal(step(&g), "E8 B8"); /* max_seqs 2 */
    assert_string_equal(g.log, "dE");
    assert_string_equal(step(&g), "B1 D8");
    /* A later request of a higher priority goes ahead of those waiting,
     * and, admitted, ahead of lower priorities in the batch. */
    submit(&g, 'F', 7, 8, 10);
    assert_string_equal(waiting(&g), "FAC");
    assert_string_equal(step(&g), "B1 D1");
    assert_string_equal(step(&g), "B1 D1");
    assert_string_equal(g.log, "dEdB");
    assert_string_equal(step(&g), "F8 D1");
    assert_string_equal(step(&g), "F1 A8");
    assert_string_equal(g.log, "dEdBdDdF");
    assert_string_equal(step(&g), "A1 C8");
    rig_free(&g);
}

/* When a running request's next row finds no block: first the KV kept
 * outside the queues goes (hooks.reclaim), then the tail of the running
 * queue, the lowest priority even when it came first, is preempted: its
 * blocks go back, it waits, nothing is admitted that step, and it is
 * readmitted and recomputed from its tokens when there is room. */
static void test_preempt_lowest_priority(void **state) {
    (void)state;
    rig g;
    rig_init(&g, 6, 4, 64, 8);
    hold(&g, &g.idle, 1); /* an idle session's block */
    fake_req *l = submit(&g, 'L', 0, 30, 200);
    fake_req *h = submit(&g, 'H', 1, 30, 60);
    assert_string_equal(step(&g), "H30 L30"); /* 2 blocks each, 1 left */
    /* Positions 30 and 31 fill their second blocks; 32 needs a third:
     * H takes the free one, L the idle session's. */
    assert_string_equal(step(&g), "H1 L1");
    assert_string_equal(step(&g), "H1 L1");
    assert_string_equal(g.log, "");
    assert_string_equal(step(&g), "H1 L1");
    assert_string_equal(g.log, "r-");
    assert_int_equal(used_blocks(&g), 6);
    /* Through position 47 in those blocks; at 48 H needs a fourth. */
    for (int i = 0; i < 15; i++) assert_string_equal(step(&g), "H1 L1");
    assert_int_equal(l->it.n_tokens, 49);
    assert_string_equal(step(&g), "H1");
    assert_string_equal(g.log, "r-pL");
    assert_int_equal(l->it.n_preempt, 1);
    assert_int_equal(h->it.n_preempt, 0);
    assert_int_equal(g.s.n_preempt, 1);
    assert_int_equal(l->seq.n_pos, 0);
    assert_string_equal(waiting(&g), "L");
    /* L needs 4 blocks for its 49 tokens and the next; 2 are free. */
    while (!h->done) {
        assert_string_equal(step(&g), "H1");
        assert_int_equal(l->it.n_tokens, 49);
    }
    assert_string_equal(g.log, "r-pLdH");
    /* Readmitted: all it had, recomputed, and on from there. */
    assert_string_equal(step(&g), "L49");
    assert_int_equal(l->it.n_tokens, 50);
    for (int32_t i = 0; i < 50; i++) assert_int_equal(l->tokens[i], token('L', i, false));
    assert_string_equal(step(&g), "L1");
    rig_free(&g);
}

/* A step holds max_batch_tokens rows: decoding requests first (a row
 * each), then prompts in chunks of what is left, in queue order. */
static void test_chunked_prefill(void **state) {
    (void)state;
    rig g;
    rig_init(&g, 32, 4, 16, 8);
    submit(&g, 'D', 0, 4, 100);
    fake_req *p = submit(&g, 'P', 0, 40, 41);
    assert_string_equal(step(&g), "D4 P12");
    assert_int_equal(p->seq.n_pos, 12);
    assert_string_equal(step(&g), "D1 P15");
    assert_string_equal(step(&g), "D1 P13");
    assert_string_equal(g.log, "dP");
    /* A prompt of a higher priority comes first in the batch, but the
     * decoding row still has its place in the budget. */
    submit(&g, 'Q', 3, 40, 41);
    assert_string_equal(step(&g), "Q15 D1");
    assert_string_equal(step(&g), "Q15 D1");
    assert_string_equal(step(&g), "Q10 D1");
    assert_string_equal(step(&g), "D1");
    rig_free(&g);
}

/* With prompt log-probabilities every prompt row asks for logits, and a
 * step's rows of logits are limited: the other requests' rows count first,
 * the reporting chunk is cut to what is left. */
static void test_logit_rows(void **state) {
    (void)state;
    rig g;
    rig_init(&g, 32, 4, 64, 4);
    fake_req *a = submit(&g, 'A', 0, 10, 11);
    a->it.lp_end = 10;
    submit(&g, 'B', 0, 6, 100);
    assert_string_equal(step(&g), "A3 B6");
    assert_int_equal(a->it.lp_done, 4);
    assert_string_equal(step(&g), "A3 B1");
    assert_string_equal(step(&g), "A3 B1");
    assert_int_equal(a->it.lp_done, 10);
    assert_string_equal(step(&g), "A1 B1");
    assert_string_equal(g.log, "dA");
    rig_free(&g);
}

/* Into an empty cache a request always goes, with what fits; alone and
 * still short of blocks, it has outgrown the cache: hooks.finish. */
static void test_outgrown(void **state) {
    (void)state;
    rig g;
    rig_init(&g, 2, 2, 64, 4);
    fake_req *a = submit(&g, 'A', 0, 40, 100);
    assert_string_equal(step(&g), "A32");
    assert_string_equal(step(&g), "");
    assert_string_equal(g.log, "fA");
    assert_true(a->done);
    assert_int_equal(g.s.n_running, 0);
    assert_int_equal(used_blocks(&g), 0);
    rig_free(&g);
}

/* KV kept for a request elsewhere (a session's) is handed over before its
 * blocks are counted (it holds 16 positions of 40 here), given back when
 * it is not admitted after all, and taken again when there is room. */
static void test_adopt_and_give_back(void **state) {
    (void)state;
    rig g;
    rig_init(&g, 6, 4, 64, 4);
    hold(&g, &g.kept, 16);
    submit(&g, 'X', 0, 60, 61); /* 4 blocks: one is left */
    fake_req *t = submit(&g, 'T', 0, 40, 100);
    g.turn = t;
    assert_string_equal(step(&g), "X60");
    assert_string_equal(g.log, "aTuTdX");
    assert_int_equal(t->seq.n_pos, 0);
    assert_int_equal(g.kept.n_pos, 16);
    assert_int_equal(t->it.n_cached, 0);
    assert_string_equal(step(&g), "T24");
    assert_string_equal(g.log, "aTuTdXaT");
    assert_int_equal(t->it.n_cached, 16);
    rig_free(&g);
}

/* A request admitted with nothing in the cache takes the longest cached
 * prefix of its tokens, always leaving its last token to compute. */
static void test_prefix_at_admission(void **state) {
    (void)state;
    rig g;
    rig_init(&g, 16, 4, 64, 4);
    kv_cache_set_prefix(g.kv, true);
    fake_req *a = submit(&g, 'A', 0, 40, 41);
    for (int32_t i = 0; i < 40; i++) a->tokens[i] = token('A', i, true);
    assert_string_equal(step(&g), "A40");
    fake_req *b = submit(&g, 'B', 0, 36, 37);
    for (int32_t i = 0; i < 36; i++) b->tokens[i] = token('B', i, i < 34);
    fake_req *c = submit(&g, 'C', 0, 32, 33);
    for (int32_t i = 0; i < 32; i++) c->tokens[i] = token('C', i, true);
    assert_string_equal(step(&g), "B4 C16");
    assert_int_equal(b->it.n_cached, 32);
    assert_int_equal(c->it.n_cached, 16); /* not its last block: its last token is computed */
    assert_int_equal(g.s.n_prefix_tok, 48);
    rig_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admission_under_block_budget),
        cmocka_unit_test(test_priority_order),
        cmocka_unit_test(test_preempt_lowest_priority),
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_logit_rows),
        cmocka_unit_test(test_outgrown),
        cmocka_unit_test(test_adopt_and_give_back),
        cmocka_unit_test(test_prefix_at_admission),
    };
    /* Whole under every build (no CELLM_TEST_FILTER: a few milliseconds). */
    return cmocka_run_group_tests(tests, NULL, NULL);
}

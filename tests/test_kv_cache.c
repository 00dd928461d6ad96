/*
 * test_kv_cache.c — the block pool of the paged KV cache (src/model/kv_cache.c)
 * under a randomized stress of more than a million operations: allocate
 * (reserve and write), fork, append, write into shared blocks (truncate,
 * then refill: copy-on-write), free, evict (trims, and allocations that
 * push idle cached blocks out) and prefix lookups. After every operation
 * the pool's reference counts must equal the references the live
 * sequences hold, and its free, idle and used counts must add up, with no
 * block lost or free twice; every few operations the contents every live
 * sequence sees must be what its own tokens wrote (so a wrong prefix
 * match, or a write that leaks into a block another sequence shares,
 * shows). A second run narrows the hash to 4 bits, so that nearly every
 * lookup meets colliding candidates and must tell them apart by tokens and
 * chain.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/kv_cache.h"

#define N_SEQ 8
#define CTX 256
#define WINDOW 40

typedef struct tseq {
    kv_seq s;
    bool live;
    int32_t tok[CTX];
    uint32_t pre[CTX]; /* running hash of tok[0..p] */
} tseq;

static uint64_t g_rng;

static uint32_t rnd(uint32_t n) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

static uint32_t step_hash(uint32_t h, int32_t t) {
    h ^= (uint32_t)t + 0x9e3779b9u;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    return h * 0xc2b2ae35u;
}

/* A model with a full-attention group of 2 layers and a windowed group of
 * 1 layer, with tiny rows. */
static model fake_model(void) {
    model m;
    memset(&m, 0, sizeof m);
    m.n_head_kv = 1;
    m.head_dim = m.head_dim_v = 4;
    m.n_kv_groups = 2;
    m.kv_group_layers[0] = 2;
    m.kv_group_window[0] = 0;
    m.kv_group_layers[1] = 1;
    m.kv_group_window[1] = WINDOW;
    return m;
}

/* Writes the stamps of positions [from, to) of t into every layer. */
static void write_stamps(kv_cache *c, tseq *t, int32_t from, int32_t to) {
    for (int32_t p = from; p < to; p++) {
        t->pre[p] = step_hash(p > 0 ? t->pre[p - 1] : 0, t->tok[p]);
        for (int32_t g = 0; g < c->n_groups; g++)
            for (int32_t l = 0; l < c->groups[g].n_layers; l++) {
                ((uint16_t *)kv_k(c, &t->s, g, l, p))[0] = (uint16_t)t->pre[p];
                ((uint16_t *)kv_v(c, &t->s, g, l, p))[0] = (uint16_t)(t->pre[p] >> 16);
            }
    }
}

/* Every position a live sequence holds reads back its own stamp. */
static void check_contents(kv_cache *c, tseq *seqs) {
    for (int32_t i = 0; i < N_SEQ; i++) {
        tseq *t = &seqs[i];
        if (!t->live) continue;
        for (int32_t g = 0; g < c->n_groups; g++)
            for (int32_t p = 0; p < t->s.n_pos; p++) {
                if (t->s.table[g][p / KV_BLOCK_TOKENS] < 0) {
                    /* Only a windowed group lets go, and only of what the
                     * next position cannot see. */
                    assert_true(c->groups[g].window > 0);
                    assert_true(p <= t->s.n_pos - c->groups[g].window);
                    continue;
                }
                int32_t l = c->groups[g].n_layers - 1;
                if (((uint16_t *)kv_k(c, &t->s, g, l, p))[0] != (uint16_t)t->pre[p] ||
                    ((uint16_t *)kv_v(c, &t->s, g, l, p))[0] != (uint16_t)(t->pre[p] >> 16)) {
                    print_error("seq %d group %d position %d: wrong contents\n", i, g, p);
                    fail();
                }
            }
    }
}

static void check_pool(kv_cache *c, tseq *seqs, uint32_t *refs0, uint32_t *refs1) {
    uint32_t *refs[2] = {refs0, refs1};
    for (int32_t g = 0; g < c->n_groups; g++) {
        memset(refs[g], 0, (size_t)c->groups[g].n_blocks * sizeof *refs[g]);
        for (int32_t i = 0; i < N_SEQ; i++) {
            if (!seqs[i].s.table[g]) continue;
            for (int32_t b = 0; b < c->max_blocks_per_seq; b++) {
                int32_t id = seqs[i].s.table[g][b];
                if (id < 0) continue;
                assert_true(seqs[i].live);
                assert_true(id < c->groups[g].n_blocks);
                refs[g][id]++;
            }
        }
    }
    const uint32_t *const crefs[2] = {refs0, refs1};
    const char *bad = kv_cache_check(c, crefs);
    if (bad) {
        print_error("pool invariant broken: %s\n", bad);
        fail();
    }
}

/* A token for position p: mostly a shared pattern, so prefixes repeat. */
static int32_t pick_token(const int32_t *pattern, int32_t p) {
    return rnd(16) ? pattern[p] : (int32_t)rnd(4);
}

/* Appends n tokens to t as the engine does: reserve, write, publish and
 * trim. False when the pool is short (nothing changes). */
static bool append(kv_cache *c, tseq *t, int32_t n, const int32_t *pattern) {
    if (t->s.n_pos + n > CTX) n = CTX - t->s.n_pos;
    if (n <= 0) return false;
    cellm_error err;
    err_clear(&err);
    if (kv_seq_reserve(c, &t->s, n, &err) != CELLM_OK) {
        assert_int_equal(err.code, CELLM_ERR_NO_MEMORY);
        return false;
    }
    int32_t from = t->s.n_pos;
    for (int32_t p = from; p < from + n; p++) t->tok[p] = pick_token(pattern, p);
    write_stamps(c, t, from, from + n);
    t->s.n_pos = from + n;
    t->s.tokens = t->tok;
    /* Sometimes a prompt boundary: windowed blocks past it that leave the
     * window go back empty instead of into the cache. */
    if (rnd(4) == 0) t->s.n_keep = rnd(2) ? (int32_t)rnd(CTX) : INT32_MAX;
    kv_seq_trim(c, &t->s);
    return true;
}

typedef struct counts {
    uint64_t ops, appends, forks, truncs, frees, evicts, lookups, hits;
} counts;

static void stress(uint64_t seed, uint64_t mask, int64_t n_ops, counts *k) {
    g_rng = seed;
    model m = fake_model();
    kv_cache *c = NULL;
    cellm_error err;
    err_clear(&err);
    /* Room for about four full sequences, so eviction and shortage are
     * common. */
    size_t budget = kv_cache_bytes(&m, CELLM_KV_F16, CTX, 4, 1);
    assert_int_equal(kv_cache_create(&m, budget, CTX, 4, 1, CELLM_KV_F16, &c, &err), CELLM_OK);
    assert_int_equal(c->anchor, 0);
    c->hash_mask = mask;
    static tseq seqs[N_SEQ];
    memset(seqs, 0, sizeof seqs);
    for (int32_t i = 0; i < N_SEQ; i++) assert_int_equal(kv_seq_init(c, &seqs[i].s, &err), 0);
    int32_t pattern[CTX];
    for (int32_t p = 0; p < CTX; p++) pattern[p] = (int32_t)rnd(4);
    uint32_t *refs0 = calloc((size_t)c->groups[0].n_blocks, sizeof *refs0);
    uint32_t *refs1 = calloc((size_t)c->groups[1].n_blocks, sizeof *refs1);
    assert_non_null(refs0);
    assert_non_null(refs1);

    for (int64_t op = 0; op < n_ops; op++) {
        tseq *t = &seqs[rnd(N_SEQ)];
        uint32_t what = rnd(100);
        if (what < 40) { /* allocate / append */
            if (append(c, t, 1 + (int32_t)rnd(t->s.n_pos ? 8 : 40), pattern)) {
                t->live = true;
                k->appends++;
            }
        } else if (what < 50) { /* fork a live sequence into a dead slot */
            tseq *d = &seqs[rnd(N_SEQ)];
            if (t->live && !d->live && d != t) {
                kv_seq_fork(c, &d->s, &t->s);
                memcpy(d->tok, t->tok, sizeof d->tok);
                memcpy(d->pre, t->pre, sizeof d->pre);
                d->s.tokens = d->tok;
                d->live = true;
                k->forks++;
            }
        } else if (what < 62) { /* cut back, so the next write lands in a shared block */
            if (t->live && t->s.n_pos > 0) {
                int32_t n = (int32_t)rnd((uint32_t)t->s.n_pos);
                if (!kv_seq_truncate(c, &t->s, n)) {
                    kv_seq_reset(c, &t->s);
                    t->live = false;
                }
                k->truncs++;
            }
        } else if (what < 75) { /* free */
            if (t->live) {
                kv_seq_reset(c, &t->s);
                t->live = false;
                k->frees++;
            }
        } else if (what < 77) { /* evict: a trim, or the idle blocks only */
            if (rnd(2))
                kv_cache_release_free(c);
            else
                kv_cache_drop_idle(c);
            k->evicts++;
        } else { /* lookup into a dead slot, then continue it */
            if (!t->live) {
                int32_t want = 16 + (int32_t)rnd(CTX - 16);
                for (int32_t p = 0; p < want; p++) t->tok[p] = pick_token(pattern, p);
                int32_t got = kv_seq_lookup(c, &t->s, t->tok, want);
                assert_true(got >= 0 && got <= want && got % KV_BLOCK_TOKENS == 0);
                assert_int_equal(t->s.n_pos, got);
                for (int32_t p = 0; p < got; p++)
                    t->pre[p] = step_hash(p > 0 ? t->pre[p - 1] : 0, t->tok[p]);
                t->s.tokens = t->tok;
                k->lookups++;
                if (got > 0) {
                    t->live = true;
                    k->hits++;
                }
            }
        }
        check_pool(c, seqs, refs0, refs1);
        if (op % 16 == 0) check_contents(c, seqs);
        k->ops++;
    }
    check_contents(c, seqs);
    print_message("mask %llx: %llu ops: %llu appends, %llu forks, %llu truncations, %llu frees, "
                  "%llu trims, %llu lookups (%llu hits, %llu positions), %llu copies on write, "
                  "%llu evictions\n",
                  (unsigned long long)mask, (unsigned long long)k->ops,
                  (unsigned long long)k->appends, (unsigned long long)k->forks,
                  (unsigned long long)k->truncs, (unsigned long long)k->frees,
                  (unsigned long long)k->evicts, (unsigned long long)k->lookups,
                  (unsigned long long)k->hits, (unsigned long long)c->n_hit_tokens,
                  (unsigned long long)c->n_cow, (unsigned long long)c->n_evict);
    /* Every kind of operation really happened. */
    assert_true(k->appends > 1000 && k->forks > 100 && k->truncs > 100 && k->frees > 100);
    assert_true(k->hits > 100 && c->n_cow > 100 && c->n_evict > 100);
    for (int32_t i = 0; i < N_SEQ; i++) kv_seq_free(c, &seqs[i].s);
    for (int32_t g = 0; g < c->n_groups; g++) assert_int_equal(kv_cache_used_blocks(c, g), 0);
    assert_null(kv_cache_check(c, NULL));
    free(refs0);
    free(refs1);
    kv_cache_free(c);
}

static void test_pool_stress(void **state) {
    (void)state;
    counts k;
    memset(&k, 0, sizeof k);
    stress(0x1234567887654321ull, ~(uint64_t)0, 1000000, &k);
    assert_true(k.ops >= 1000000);
}

static void test_pool_stress_collisions(void **state) {
    (void)state;
    counts k;
    memset(&k, 0, sizeof k);
    stress(0x0badc0ffee15600dull, 0xf, 200000, &k);
}

/* A prefix found in the index gives the same blocks; a write after a
 * shared position copies; the windowed group's early blocks are not
 * needed for a long prefix. */
static void test_lookup_basics(void **state) {
    (void)state;
    g_rng = 42;
    model m = fake_model();
    kv_cache *c = NULL;
    cellm_error err;
    err_clear(&err);
    assert_int_equal(kv_cache_create(&m, kv_cache_bytes(&m, CELLM_KV_F16, CTX, 4, 1), CTX, 4, 1,
                                     CELLM_KV_F16, &c, &err),
                     0);
    static tseq a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    assert_int_equal(kv_seq_init(c, &a.s, &err), 0);
    assert_int_equal(kv_seq_init(c, &b.s, &err), 0);
    int32_t pattern[CTX];
    for (int32_t p = 0; p < CTX; p++) pattern[p] = (int32_t)p * 7 % 11;
    /* a: 100 positions of the pattern. */
    assert_int_equal(kv_seq_reserve(c, &a.s, 100, &err), 0);
    memcpy(a.tok, pattern, sizeof a.tok);
    write_stamps(c, &a, 0, 100);
    a.s.n_pos = 100;
    a.s.tokens = a.tok;
    a.live = true;
    kv_seq_trim(c, &a.s);
    assert_int_equal(a.s.n_pub, 6);
    /* b asks for 90 of the same tokens: 5 whole blocks (80 positions). */
    memcpy(b.tok, pattern, sizeof b.tok);
    assert_int_equal(kv_seq_lookup(c, &b.s, b.tok, 90), 80);
    for (int32_t p = 0; p < 80; p++) b.pre[p] = a.pre[p];
    b.live = true;
    assert_int_equal(b.s.table[0][0], a.s.table[0][0]);
    assert_int_equal(b.s.table[0][4], a.s.table[0][4]);
    /* The windowed group holds only what position 80 can see. */
    assert_int_equal(b.s.table[1][0], -1);
    assert_true(b.s.table[1][4] >= 0);
    /* A different token in block 3 stops the match there. */
    static tseq d;
    memset(&d, 0, sizeof d);
    assert_int_equal(kv_seq_init(c, &d.s, &err), 0);
    memcpy(d.tok, pattern, sizeof d.tok);
    d.tok[50] ^= 1;
    /* Blocks 0..2 (48 positions) match; a's windowed blocks 0..2 left
     * its window but stay indexed, idle. */
    assert_int_equal(kv_seq_lookup(c, &d.s, d.tok, 100), 48);
    kv_seq_free(c, &d.s);
    /* b cuts back into block 4 and writes: the block is copied, a's is
     * untouched. */
    int32_t shared = b.s.table[0][4];
    assert_true(kv_seq_truncate(c, &b.s, 75));
    assert_int_equal(kv_seq_cow(c, &b.s, 0), 1);
    assert_int_equal(kv_seq_need(c, &b.s, 0, 1), 1);
    assert_int_equal(kv_seq_reserve(c, &b.s, 1, &err), 0);
    assert_true(b.s.table[0][4] != shared);
    assert_int_equal(a.s.table[0][4], shared);
    b.tok[75] = 99;
    write_stamps(c, &b, 75, 76);
    b.s.n_pos = 76;
    static tseq pair[N_SEQ];
    memset(pair, 0, sizeof pair);
    pair[0] = a;
    pair[1] = b;
    check_contents(c, pair);
    kv_seq_free(c, &a.s);
    kv_seq_free(c, &b.s);
    assert_true(kv_cache_idle_blocks(c, 0) > 0);
    assert_null(kv_cache_check(c, NULL));
    kv_cache_release_free(c);
    assert_int_equal(kv_cache_idle_blocks(c, 0), 0);
    assert_null(kv_cache_check(c, NULL));
    kv_cache_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_basics),
        cmocka_unit_test(test_pool_stress),
        cmocka_unit_test(test_pool_stress_collisions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

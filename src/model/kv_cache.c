/*
 * kv_cache.c — block pools, per-sequence block tables, copy-on-write and
 * the prefix index (see kv_cache.h).
 */
#include "model/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "base/pages.h"

int32_t kv_window_positions(int32_t window, int32_t n, int32_t chunk) {
    /* A pass adding `chunk` positions from p keeps the blocks from the one
     * holding p - window + 1 (the first key its first row sees) to the one
     * holding p + chunk - 1: at most ceil((window + chunk + 15) / 16) of
     * them, whatever p is (16-position blocks). */
    int64_t held = (int64_t)window + chunk + KV_BLOCK_TOKENS - 1;
    return window > 0 && held < n ? (int32_t)held : n;
}

static size_t blocks_of(int32_t positions) {
    return (size_t)(positions + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
}

/* Blocks group g of a cache shaped by (ctx, n_seqs, chunk) must hold: every
 * sequence decoding and one of them feeding a chunk (kv_cache_bytes). */
static size_t group_blocks(const kv_group *g, int32_t ctx, int32_t n_seqs, int32_t chunk) {
    return (size_t)(n_seqs - 1) * blocks_of(kv_window_positions(g->window, ctx, 1)) +
           blocks_of(kv_window_positions(g->window, ctx, chunk));
}

/* Each KV type: its name (for messages), how its K and V rows are stored,
 * whether heads are rotated first. */
static const struct {
    const char *name;
    kv_format kformat, vformat;
    bool rotated, recent;
} kv_types[] = {
    [CELLM_KV_F16] = {"f16", KV_FMT_F16, KV_FMT_F16, false, false},
    [CELLM_KV_Q8_0] = {"q8_0", KV_FMT_Q8_0, KV_FMT_Q8_0, false, false},
    [CELLM_KV_Q4_0] = {"q4_0", KV_FMT_Q4_0, KV_FMT_Q4_0, false, false},
    [CELLM_KV_Q4_0H] = {"q4_0h", KV_FMT_Q4_0, KV_FMT_Q4_0, true, false},
    [CELLM_KV_K5V4H] = {"k5v4h", KV_FMT_Q5_0, KV_FMT_Q4_0, true, false},
    [CELLM_KV_Q4_0HW] = {"q4_0hw", KV_FMT_Q4_0, KV_FMT_Q4_0, true, true},
    [CELLM_KV_K5V4HW] = {"k5v4hw", KV_FMT_Q5_0, KV_FMT_Q4_0, true, true},
    [CELLM_KV_Q3_0HW] = {"q3_0hw", KV_FMT_Q3_0, KV_FMT_Q3_0, true, true},
    [CELLM_KV_K4V3HW] = {"k4v3hw", KV_FMT_Q4_0, KV_FMT_Q3_0, true, true},
    /* keys per channel: KV_FMT_C4 rows and each block's metadata */
    [CELLM_KV_K4CV4HW] = {"k4cv4hw", KV_FMT_C4, KV_FMT_Q4_0, true, true},
};

/* A window type's f16 values of one position, every group and layer (0
 * for the other types). */
static size_t recent_position(const model *m, cellm_kv_type type) {
    if (!kv_types[type].recent) return 0;
    size_t row = kv_f16_position_row(m), n = 0;
    for (int32_t gi = 0; gi < m->n_kv_groups; gi++) n += (size_t)m->kv_group_layers[gi] * row;
    return n;
}

/* A sequence's f16 copies (the sink and the ring), in uint16 values. */
static size_t tail_elems(const model *m, cellm_kv_type type) {
    return recent_position(m, type) * (KV_BLOCK_TOKENS + KV_RING);
}

/* Shadow slots of a cache for n_seqs sequences: one a sequence (the block
 * its conversation ended on) and one more (a sink they share). */
static int32_t shadow_slots(int32_t n_seqs) {
    return n_seqs + 1;
}

/* The f16 copies a window type needs beside the blocks: each sequence's
 * tail, and the shadows. */
static size_t recent_bytes(const model *m, cellm_kv_type type, int32_t n_seqs) {
    return ((size_t)n_seqs * tail_elems(m, type) +
            (size_t)shadow_slots(n_seqs) * recent_position(m, type) * KV_BLOCK_TOKENS) *
           sizeof(uint16_t);
}

const char *kv_type_name(cellm_kv_type type) {
    return (unsigned)type < sizeof kv_types / sizeof kv_types[0] ? kv_types[type].name : NULL;
}

cellm_status kv_type_check(const model *m, cellm_kv_type type, cellm_error *err) {
    if ((unsigned)type >= sizeof kv_types / sizeof kv_types[0])
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "KV type %d is not one of f16, q8_0, q4_0, q4_0h, k5v4h, q4_0hw, k5v4hw, "
                       "q3_0hw, k4v3hw, k4cv4hw",
                       (int)type);
    const int32_t dims[2] = {m->head_dim, m->head_dim_v};
    for (int i = 0; i < 2; i++) {
        int32_t d = dims[i];
        if (kv_types[type].kformat != KV_FMT_F16 && d % 32 != 0)
            return err_set(
                err, CELLM_ERR_UNSUPPORTED,
                "KV type %s needs head sizes that are multiples of 32 (this model's: %d)",
                kv_types[type].name, d);
        if (kv_types[type].rotated && (d > 1024 || (d & (d - 1)) != 0))
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "KV type %s needs head sizes that are powers of two up to 1024 (this "
                           "model's: %d)",
                           kv_types[type].name, d);
    }
    return CELLM_OK;
}

static void group_sizes(const model *m, cellm_kv_type type, int32_t gi, kv_group *g) {
    g->n_layers = m->kv_group_layers[gi];
    g->window = m->kv_group_window[gi];
    g->k_row = (size_t)m->n_head_kv * kv_row_bytes(kv_types[type].kformat, (size_t)m->head_dim);
    g->v_row = (size_t)m->n_head_kv * kv_row_bytes(kv_types[type].vformat, (size_t)m->head_dim_v);
    g->k_meta = kv_types[type].kformat == KV_FMT_C4
                    ? (size_t)m->n_head_kv * kv_kc4_meta_bytes((size_t)m->head_dim)
                    : 0;
    g->layer_bytes = KV_BLOCK_TOKENS * (g->k_row + g->v_row) + g->k_meta;
    g->block_bytes = g->layer_bytes * (size_t)g->n_layers;
}

size_t kv_cache_token_bytes(const model *m, cellm_kv_type type) {
    kv_group g;
    size_t total = 0;
    for (int32_t gi = 0; gi < m->n_kv_groups; gi++) {
        group_sizes(m, type, gi, &g);
        total += g.block_bytes;
    }
    return total / KV_BLOCK_TOKENS; /* keys per channel: their metadata is per block */
}

size_t kv_cache_bytes(const model *m, cellm_kv_type type, int32_t ctx, int32_t n_seqs,
                      int32_t chunk) {
    size_t total = 0;
    for (int32_t gi = 0; gi < m->n_kv_groups; gi++) {
        kv_group g;
        group_sizes(m, type, gi, &g);
        total += group_blocks(&g, ctx, n_seqs, chunk) * g.block_bytes;
    }
    return total + recent_bytes(m, type, n_seqs);
}

cellm_status kv_cache_create(const model *m, size_t budget, int32_t max_ctx, int32_t n_seqs,
                             int32_t chunk, cellm_kv_type type, kv_cache **out, cellm_error *err) {
    *out = NULL;
    if (max_ctx <= 0 || max_ctx > (1 << 24))
        return err_set(err, CELLM_ERR_INVALID_ARG, "context length %d is not 1..16777216", max_ctx);
    if (n_seqs <= 0 || chunk <= 0)
        return err_set(err, CELLM_ERR_INVALID_ARG, "%d sequences, chunks of %d: both must be > 0",
                       n_seqs, chunk);
    cellm_status st = kv_type_check(m, type, err);
    if (st) return st;
    kv_cache *c = calloc(1, sizeof *c);
    if (!c) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    c->type = type;
    c->kformat = kv_types[type].kformat;
    c->vformat = kv_types[type].vformat;
    c->rotated = kv_types[type].rotated;
    c->n_groups = m->n_kv_groups;
    c->max_ctx = max_ctx;
    c->max_blocks_per_seq = (max_ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    c->anchor = -1;
    c->conv_floats = (size_t)m->n_conv_layers * (size_t)(m->conv_l - 1) * (size_t)m->n_embd;
    c->recent = kv_types[type].recent;
    c->tail_elems = tail_elems(m, type);
    c->shadow_elems = recent_position(m, type) * KV_BLOCK_TOKENS;
    c->tail_row = kv_f16_position_row(m);
    for (int32_t gi = 1; gi < m->n_kv_groups; gi++)
        c->tail_off[gi] = c->tail_off[gi - 1] + (size_t)m->kv_group_layers[gi - 1] *
                                                    (KV_BLOCK_TOKENS + KV_RING) * c->tail_row;
    /* The sequences' tails (allocated with the sequences) and the
     * shadows come out of the budget first; the blocks share the rest. */
    size_t tails = recent_bytes(m, type, n_seqs);
    if (tails >= budget) {
        kv_cache_free(c);
        return err_set(err, CELLM_ERR_NO_MEMORY,
                       "a KV budget of %zu bytes does not hold the %d sequences' f16 windows "
                       "(%zu bytes)",
                       budget, n_seqs, tails);
    }
    budget -= tails;
    size_t all = kv_cache_bytes(m, type, max_ctx, n_seqs, chunk) - tails;
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        kv_group *g = &c->groups[gi];
        group_sizes(m, type, gi, g);
        size_t need = group_blocks(g, max_ctx, n_seqs, chunk) * g->block_bytes;
        /* This group's share of the budget, in whole blocks. */
        size_t share =
            need * (budget / all) + (size_t)((double)(budget % all) * ((double)need / (double)all));
        size_t n = share / g->block_bytes;
        if (n > INT32_MAX / 2) n = INT32_MAX / 2;
        if (n == 0) {
            kv_cache_free(c);
            return err_set(err, CELLM_ERR_NO_MEMORY,
                           "a KV budget of %zu bytes holds no block (a block takes %zu bytes)",
                           budget, g->block_bytes);
        }
        g->n_blocks = (int32_t)n;
        g->map_bytes = n * g->block_bytes;
        g->mem = pages_map(g->map_bytes);
        g->free_list = malloc(n * sizeof *g->free_list);
        g->ref = calloc(n, sizeof *g->ref);
        g->resident = calloc(n, 1);
        uint32_t nb = 16;
        while (nb < n) nb *= 2;
        g->bucket_mask = nb - 1;
        g->hash = calloc(n, sizeof *g->hash);
        g->serial = calloc(n, sizeof *g->serial);
        g->link = calloc(n, sizeof *g->link);
        g->bucket = malloc((size_t)nb * sizeof *g->bucket);
        g->hnext = malloc(n * sizeof *g->hnext);
        g->lru_prev = malloc(n * sizeof *g->lru_prev);
        g->lru_next = malloc(n * sizeof *g->lru_next);
        if (c->anchor < 0 && g->window <= 0 && !c->conv_floats) {
            c->anchor = gi;
            g->toks = malloc(n * KV_BLOCK_TOKENS * sizeof *g->toks);
            if (c->recent && g->toks) {
                int32_t ns = shadow_slots(n_seqs);
                g->n_shadows = ns;
                g->shadow = malloc(n * sizeof *g->shadow);
                g->shadow_owner = malloc((size_t)ns * sizeof *g->shadow_owner);
                g->shadow_used = calloc((size_t)ns, sizeof *g->shadow_used);
                g->shadow_mem = malloc((size_t)ns * c->shadow_elems * sizeof *g->shadow_mem);
                if (!g->shadow || !g->shadow_owner || !g->shadow_used || !g->shadow_mem) {
                    free(g->toks);
                    g->toks = NULL; /* reported below */
                } else {
                    for (size_t i = 0; i < n; i++) g->shadow[i] = -1;
                    for (int32_t i = 0; i < ns; i++) g->shadow_owner[i] = -1;
                }
            }
        }
        if (!g->mem || !g->free_list || !g->ref || !g->resident || !g->hash || !g->serial ||
            !g->link || !g->bucket || !g->hnext || !g->lru_prev || !g->lru_next ||
            (c->anchor == gi && !g->toks)) {
            kv_cache_free(c);
            return err_set(err, CELLM_ERR_NO_MEMORY, "cannot allocate %zu bytes of KV cache",
                           n * g->block_bytes);
        }
        /* Lowest ids on top, so a fresh cache hands out blocks in order. */
        for (int32_t i = 0; i < g->n_blocks; i++) g->free_list[i] = g->n_blocks - 1 - i;
        g->n_free = g->n_empty = g->n_blocks;
        for (uint32_t i = 0; i < nb; i++) g->bucket[i] = -1;
        g->lru_head = g->lru_tail = -1;
    }
    c->scratch = malloc(2 * (size_t)c->max_blocks_per_seq * sizeof *c->scratch);
    if (!c->scratch) {
        kv_cache_free(c);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    c->prefix_on = c->anchor >= 0;
    c->hash_mask = ~(uint64_t)0;
    *out = c;
    return CELLM_OK;
}

void kv_cache_free(kv_cache *c) {
    if (!c) return;
    for (int32_t gi = 0; gi < 2; gi++) {
        pages_unmap(c->groups[gi].mem, c->groups[gi].map_bytes);
        free(c->groups[gi].free_list);
        free(c->groups[gi].ref);
        free(c->groups[gi].resident);
        free(c->groups[gi].hash);
        free(c->groups[gi].serial);
        free(c->groups[gi].link);
        free(c->groups[gi].toks);
        free(c->groups[gi].bucket);
        free(c->groups[gi].hnext);
        free(c->groups[gi].lru_prev);
        free(c->groups[gi].lru_next);
        free(c->groups[gi].shadow);
        free(c->groups[gi].shadow_owner);
        free(c->groups[gi].shadow_used);
        free(c->groups[gi].shadow_mem);
    }
    free(c->scratch);
    free(c->kmean);
    free(c->kscale);
    free(c);
}

int32_t kv_cache_used_blocks(const kv_cache *c, int32_t group) {
    return c->groups[group].n_blocks - c->groups[group].n_free;
}

cellm_status kv_seq_init(kv_cache *c, kv_seq *s, cellm_error *err) {
    memset(s, 0, sizeof *s);
    s->n_keep = INT32_MAX;
    s->slack = c->seq_slack;
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        s->table[gi] = malloc((size_t)c->max_blocks_per_seq * sizeof(int32_t));
        if (!s->table[gi]) {
            kv_seq_free(c, s);
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for a block table");
        }
        for (int32_t i = 0; i < c->max_blocks_per_seq; i++) s->table[gi][i] = -1;
    }
    if (c->conv_floats && !(s->conv = calloc(c->conv_floats, sizeof *s->conv))) {
        kv_seq_free(c, s);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for a convolution state");
    }
    if (c->tail_elems && !(s->tail = calloc(c->tail_elems, sizeof *s->tail))) {
        kv_seq_free(c, s);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for a sequence's f16 window");
    }
    return CELLM_OK;
}

/* ---------------------------------------------------------- the index */

#define CHAIN_SEED 0x6a09e667f3bcc908ull

/* A 64-bit mix with full avalanche (the finaliser of splitmix64). */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The hash of a block of tokens chained to the hash of the block before. */
static uint64_t chain_hash(const kv_cache *c, uint64_t parent, const int32_t *t) {
    uint64_t h = parent;
    for (int32_t i = 0; i < KV_BLOCK_TOKENS; i++) h = mix64(h ^ (uint32_t)t[i]) + (uint64_t)i;
    return h & c->hash_mask;
}

static uint32_t bucket_of(const kv_group *g, uint64_t h) {
    return (uint32_t)(h ^ (h >> 32)) & g->bucket_mask;
}

static void index_add(kv_cache *c, kv_group *g, int32_t b, uint64_t h, uint64_t link,
                      const int32_t *t) {
    g->hash[b] = h;
    g->serial[b] = ++c->next_serial;
    g->link[b] = link;
    if (t) memcpy(g->toks + (size_t)b * KV_BLOCK_TOKENS, t, KV_BLOCK_TOKENS * sizeof *t);
    uint32_t k = bucket_of(g, h);
    g->hnext[b] = g->bucket[k];
    g->bucket[k] = b;
}

static void index_remove(kv_group *g, int32_t b) {
    int32_t *p = &g->bucket[bucket_of(g, g->hash[b])];
    while (*p != b) p = &g->hnext[*p]; /* b is indexed, so it is in its bucket */
    *p = g->hnext[b];
    g->serial[b] = 0;
    if (g->shadow && g->shadow[b] >= 0) { /* its copy goes with it */
        g->shadow_owner[g->shadow[b]] = -1;
        g->shadow[b] = -1;
    }
}

/* ------------------------------------------------------------ shadows */

/* Copies block index b of s (positions [16b, 16b + 16) of its tail, every
 * group and layer) into shadow slot `slot` (to_shadow), or back. A shadow
 * holds each group's layers in turn, 16 positions each: a tail's layout
 * (tail_off) with 16 slots a layer instead of 16 + KV_RING. */
static void shadow_copy(kv_cache *c, kv_seq *s, int32_t b, int32_t slot, bool to_shadow) {
    const kv_group *ga = &c->groups[c->anchor];
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        uint16_t *grp = ga->shadow_mem + (size_t)slot * c->shadow_elems +
                        c->tail_off[gi] / (KV_BLOCK_TOKENS + KV_RING) * KV_BLOCK_TOKENS;
        for (int32_t l = 0; l < c->groups[gi].n_layers; l++)
            for (int32_t j = 0; j < KV_BLOCK_TOKENS; j++) {
                uint16_t *sh = grp + ((size_t)l * KV_BLOCK_TOKENS + (size_t)j) * c->tail_row;
                uint16_t *t = kv_tail(c, s, gi, l, b * KV_BLOCK_TOKENS + j);
                memcpy(to_shadow ? sh : t, to_shadow ? t : sh, c->tail_row * sizeof(uint16_t));
            }
    }
}

/* Copies block index b of s (which its tail holds) into a shadow of
 * anchor block id: a free slot, else the least recently used one. */
static void shadow_put(kv_cache *c, kv_seq *s, int32_t b, int32_t id) {
    kv_group *ga = &c->groups[c->anchor];
    int32_t slot = 0;
    for (int32_t i = 0; i < ga->n_shadows; i++) {
        if (ga->shadow_owner[i] < 0) {
            slot = i;
            break;
        }
        if (ga->shadow_used[i] < ga->shadow_used[slot]) slot = i;
    }
    if (ga->shadow_owner[slot] >= 0) ga->shadow[ga->shadow_owner[slot]] = -1;
    ga->shadow_owner[slot] = id;
    ga->shadow[id] = slot;
    ga->shadow_used[slot] = ++c->shadow_clock;
    shadow_copy(c, s, b, slot, true);
}

/* The shadow of anchor block id into s's tail as block index b. */
static void shadow_get(kv_cache *c, kv_seq *s, int32_t b, int32_t id) {
    kv_group *ga = &c->groups[c->anchor];
    int32_t slot = ga->shadow[id];
    ga->shadow_used[slot] = ++c->shadow_clock;
    shadow_copy(c, s, b, slot, false);
}

/* The anchor block after the one of serial `parent` that holds tokens t. */
static int32_t find_anchor(const kv_cache *c, uint64_t h, uint64_t parent, const int32_t *t) {
    const kv_group *g = &c->groups[c->anchor];
    for (int32_t b = g->bucket[bucket_of(g, h)]; b >= 0; b = g->hnext[b])
        if (g->hash[b] == h && g->link[b] == parent &&
            !memcmp(g->toks + (size_t)b * KV_BLOCK_TOKENS, t, KV_BLOCK_TOKENS * sizeof *t))
            return b;
    return -1;
}

/* The block of a non-anchor group at the position of the anchor block of
 * serial `anchor` (hash h). */
static int32_t find_tied(const kv_group *g, uint64_t h, uint64_t anchor) {
    for (int32_t b = g->bucket[bucket_of(g, h)]; b >= 0; b = g->hnext[b])
        if (g->hash[b] == h && g->link[b] == anchor) return b;
    return -1;
}

static void lru_unlink(kv_group *g, int32_t b) {
    if (g->lru_prev[b] >= 0)
        g->lru_next[g->lru_prev[b]] = g->lru_next[b];
    else
        g->lru_head = g->lru_next[b];
    if (g->lru_next[b] >= 0)
        g->lru_prev[g->lru_next[b]] = g->lru_prev[b];
    else
        g->lru_tail = g->lru_prev[b];
    g->n_idle--;
}

static void lru_append(kv_group *g, int32_t b) {
    g->lru_prev[b] = g->lru_tail;
    g->lru_next[b] = -1;
    if (g->lru_tail >= 0)
        g->lru_next[g->lru_tail] = b;
    else
        g->lru_head = b;
    g->lru_tail = b;
    g->n_idle++;
}

/* ------------------------------------------------------------ blocks */

/* Takes a block with one reference: an empty one, else the least recently
 * used idle one (out of the index). The caller has checked n_free. */
static int32_t block_take(kv_cache *c, kv_group *g) {
    int32_t b;
    if (g->n_empty > 0) {
        b = g->free_list[--g->n_empty];
    } else {
        b = g->lru_head;
        lru_unlink(g, b);
        index_remove(g, b);
        c->n_evict++;
    }
    g->n_free--;
    g->ref[b] = 1;
    if (!g->resident[b]) {
        g->resident[b] = 1;
        g->n_resident++;
    }
    return b;
}

/* One more reference to a block in use or idle in the index. */
static void block_hold(kv_group *g, int32_t b) {
    if (g->ref[b]++ == 0) {
        lru_unlink(g, b);
        g->n_free--;
    }
}

/* Drops a reference; at the last, an indexed block stays indexed, idle
 * (while the prefix cache is on), anything else becomes empty. */
static void block_release(const kv_cache *c, kv_group *g, int32_t b) {
    if (--g->ref[b] != 0) return;
    g->n_free++;
    if (g->serial[b] && c->prefix_on) {
        lru_append(g, b);
        return;
    }
    if (g->serial[b]) index_remove(g, b);
    g->free_list[g->n_empty++] = b;
}

/* Drops a reference; at the last, the block becomes empty, out of the
 * index even while the prefix cache is on (kv_seq.n_keep says when). */
static void block_release_uncached(kv_group *g, int32_t b) {
    if (--g->ref[b] != 0) return;
    g->n_free++;
    if (g->serial[b]) index_remove(g, b);
    g->free_list[g->n_empty++] = b;
}

void kv_seq_reset(kv_cache *c, kv_seq *s) {
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        if (!s->table[gi]) continue;
        /* Last block first: the end of a sequence is the least likely to
         * be shared, so it is the first evicted. */
        for (int32_t i = c->max_blocks_per_seq - 1; i >= 0; i--) {
            if (s->table[gi][i] >= 0) block_release(c, &c->groups[gi], s->table[gi][i]);
            s->table[gi][i] = -1;
        }
    }
    s->n_pos = 0;
    s->n_pub = 0;
    s->tail_lo = 0;
    if (s->conv) memset(s->conv, 0, c->conv_floats * sizeof *s->conv);
    if (s->tail) memset(s->tail, 0, c->tail_elems * sizeof *s->tail);
}

void kv_seq_free(kv_cache *c, kv_seq *s) {
    kv_seq_reset(c, s);
    for (int32_t gi = 0; gi < 2; gi++) free(s->table[gi]);
    free(s->conv);
    free(s->tail);
    memset(s, 0, sizeof *s);
}

int32_t kv_seq_cow(const kv_cache *c, const kv_seq *s, int32_t g) {
    if (s->n_pos % KV_BLOCK_TOKENS == 0) return 0;
    int32_t b = s->table[g][s->n_pos / KV_BLOCK_TOKENS];
    if (b < 0) return 0;
    /* Indexed blocks are full; this one is being refilled after a
     * truncation, and the index keeps the old contents. */
    return c->groups[g].ref[b] > 1 || c->groups[g].serial[b] != 0;
}

int32_t kv_seq_need(const kv_cache *c, const kv_seq *s, int32_t g, int32_t n) {
    if (n <= 0) return 0;
    int32_t first = s->n_pos / KV_BLOCK_TOKENS, last = (s->n_pos + n - 1) / KV_BLOCK_TOKENS;
    int32_t k = kv_seq_cow(c, s, g);
    for (int32_t b = first; b <= last; b++) k += s->table[g][b] < 0;
    return k;
}

cellm_status kv_seq_reserve(kv_cache *c, kv_seq *s, int32_t n, cellm_error *err) {
    if (n < 0 || s->n_pos > c->max_ctx - n)
        return err_set(err, CELLM_ERR_NO_MEMORY,
                       "context full: %d positions + %d new would pass the limit of %d", s->n_pos,
                       n, c->max_ctx);
    if (n == 0) return CELLM_OK;
    int32_t first = s->n_pos / KV_BLOCK_TOKENS, last = (s->n_pos + n - 1) / KV_BLOCK_TOKENS;
    /* Count first, so a shortage leaves the sequence untouched. */
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        int32_t missing = kv_seq_need(c, s, gi, n);
        if (missing > c->groups[gi].n_free)
            return err_set(err, CELLM_ERR_NO_MEMORY,
                           "KV cache full: %d more blocks needed, %d free", missing,
                           c->groups[gi].n_free);
    }
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        kv_group *g = &c->groups[gi];
        if (kv_seq_cow(c, s, gi)) {
            int32_t old = s->table[gi][first], id = block_take(c, g);
            if (c->ext.copy)
                c->ext.copy(c->ext.user, gi, id, old);
            else
                memcpy(g->mem + (size_t)id * g->block_bytes, g->mem + (size_t)old * g->block_bytes,
                       g->block_bytes);
            block_release(c, g, old);
            s->table[gi][first] = id;
            c->n_cow++;
        }
        for (int32_t b = first; b <= last; b++)
            if (s->table[gi][b] < 0) s->table[gi][b] = block_take(c, g);
    }
    return CELLM_OK;
}

/* Indexes the sequence's full blocks that are not yet. A block equal to
 * one already indexed (same prefix, computed by another sequence) is
 * swapped for it, so equal prefixes end up sharing memory. */
static void publish(kv_cache *c, kv_seq *s) {
    int32_t a = c->anchor;
    kv_group *ga = &c->groups[a];
    int32_t full = s->n_pos / KV_BLOCK_TOKENS;
    while (s->n_pub < full) {
        int32_t b = s->n_pub, id = s->table[a][b];
        int32_t prev = b > 0 ? s->table[a][b - 1] : -1;
        if (id < 0 || (b > 0 && (prev < 0 || ga->serial[prev] == 0))) return;
        if (ga->serial[id] == 0) {
            uint64_t parent = b > 0 ? ga->serial[prev] : 0;
            const int32_t *t = s->tokens + (size_t)b * KV_BLOCK_TOKENS;
            uint64_t h = chain_hash(c, b > 0 ? ga->hash[prev] : CHAIN_SEED, t);
            int32_t same = find_anchor(c, h, parent, t);
            if (same >= 0) {
                block_hold(ga, same);
                block_release(c, ga, id);
                s->table[a][b] = id = same;
            } else {
                index_add(c, ga, id, h, parent, t);
            }
        }
        /* A window type copies the block while the tail holds it: the
         * sink, and the blocks of the ring (a pass's last ones). */
        if (ga->shadow && ga->shadow[id] < 0 && (b == 0 || b * KV_BLOCK_TOKENS >= s->tail_lo))
            shadow_put(c, s, b, id);
        for (int32_t gi = 0; gi < c->n_groups; gi++) {
            kv_group *g = &c->groups[gi];
            int32_t k = s->table[gi][b];
            if (gi == a || k < 0 || g->serial[k]) continue;
            if (find_tied(g, ga->hash[id], ga->serial[id]) < 0)
                index_add(c, g, k, ga->hash[id], ga->serial[id], NULL);
        }
        s->n_pub++;
    }
}

void kv_seq_trim(kv_cache *c, kv_seq *s) {
    if (c->recent && s->n_pos - KV_RING > s->tail_lo) s->tail_lo = s->n_pos - KV_RING;
    if (c->prefix_on && s->tokens) publish(c, s);
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        kv_group *g = &c->groups[gi];
        if (g->window <= 0) continue;
        /* The next query is at n_pos and sees keys > n_pos - window. */
        int32_t dead_below = s->n_pos - g->window + 1 - s->slack; /* first visible key */
        for (int32_t b = 0; (b + 1) * KV_BLOCK_TOKENS <= dead_below; b++) {
            if (s->table[gi][b] >= 0) {
                if ((b + 1) * KV_BLOCK_TOKENS <= s->n_keep)
                    block_release(c, g, s->table[gi][b]);
                else
                    block_release_uncached(g, s->table[gi][b]);
                s->table[gi][b] = -1;
            }
        }
    }
}

bool kv_seq_truncate(kv_cache *c, kv_seq *s, int32_t n) {
    if (n < 0 || n > s->n_pos) return false;
    if (c->conv_floats && n < s->n_pos) return false; /* the state is of n_pos only */
    /* A window type's ring must still hold the window of the new end. */
    if (c->recent && n < s->n_pos && n > KV_BLOCK_TOKENS && kv_recent_floor(n) < s->tail_lo)
        return false;
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        int32_t w = c->groups[gi].window;
        int32_t from = w > 0 && n - w > 0 ? n - w : 0; /* first position still visible */
        for (int32_t p = from; p < n; p += KV_BLOCK_TOKENS)
            if (s->table[gi][p / KV_BLOCK_TOKENS] < 0) return false;
    }
    int32_t keep_blocks = (n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    for (int32_t gi = 0; gi < c->n_groups; gi++)
        for (int32_t b = c->max_blocks_per_seq - 1; b >= keep_blocks; b--)
            if (s->table[gi][b] >= 0) {
                block_release(c, &c->groups[gi], s->table[gi][b]);
                s->table[gi][b] = -1;
            }
    s->n_pos = n;
    if (s->n_pub > n / KV_BLOCK_TOKENS) s->n_pub = n / KV_BLOCK_TOKENS;
    return true;
}

void kv_seq_fork(kv_cache *c, kv_seq *dst, const kv_seq *src) {
    for (int32_t gi = 0; gi < c->n_groups; gi++)
        for (int32_t b = 0; b < c->max_blocks_per_seq; b++) {
            int32_t id = src->table[gi][b];
            if (id >= 0) block_hold(&c->groups[gi], id);
            dst->table[gi][b] = id;
        }
    dst->n_pos = src->n_pos;
    dst->n_pub = src->n_pub;
    if (c->conv_floats) memcpy(dst->conv, src->conv, c->conv_floats * sizeof *dst->conv);
    if (c->tail_elems) memcpy(dst->tail, src->tail, c->tail_elems * sizeof *dst->tail);
    dst->tail_lo = src->tail_lo;
}

/* First block a windowed group still needs at the end of `pos` positions. */
static int32_t first_needed(int32_t window, int32_t pos) {
    int32_t d = pos - window + 1;
    return window > 0 && d > 0 ? d / KV_BLOCK_TOKENS : 0;
}

int32_t kv_seq_lookup(kv_cache *c, kv_seq *s, const int32_t *tokens, int32_t n) {
    if (!c->prefix_on || c->anchor < 0 || s->n_pos != 0 || n < KV_BLOCK_TOKENS) return 0;
    int32_t a = c->anchor, nb = n / KV_BLOCK_TOKENS;
    if (nb > c->max_blocks_per_seq) nb = c->max_blocks_per_seq;
    kv_group *ga = &c->groups[a];
    int32_t *fa = c->scratch, *fo = c->scratch + c->max_blocks_per_seq;
    int32_t k = 0;
    uint64_t parent = 0, ph = CHAIN_SEED;
    while (k < nb) {
        const int32_t *t = tokens + (size_t)k * KV_BLOCK_TOKENS;
        uint64_t h = chain_hash(c, ph, t);
        int32_t id = find_anchor(c, h, parent, t);
        if (id < 0) break;
        fa[k++] = id;
        parent = ga->serial[id];
        ph = h;
    }
    int32_t o = c->n_groups == 2 ? 1 - a : -1;
    if (o >= 0)
        for (int32_t b = 0; b < k; b++)
            fo[b] = find_tied(&c->groups[o], ga->hash[fa[b]], ga->serial[fa[b]]);
    /* The longest prefix whose every group has what its end can see (a
     * window type: and the f16 copies of its sink and last block). */
    for (; k > 0; k--) {
        bool ok = true;
        if (o >= 0) {
            int32_t b = first_needed(c->groups[o].window, k * KV_BLOCK_TOKENS);
            while (b < k && fo[b] >= 0) b++;
            ok = b == k;
        }
        if (ga->shadow) ok = ok && ga->shadow[fa[0]] >= 0 && ga->shadow[fa[k - 1]] >= 0;
        if (ok) break;
    }
    if (k == 0) return 0;
    if (ga->shadow) {
        shadow_get(c, s, 0, fa[0]);
        if (k > 1) shadow_get(c, s, k - 1, fa[k - 1]);
        s->tail_lo = (k - 1) * KV_BLOCK_TOKENS;
    }
    for (int32_t b = 0; b < k; b++) {
        block_hold(ga, fa[b]);
        s->table[a][b] = fa[b];
    }
    if (o >= 0)
        for (int32_t b = first_needed(c->groups[o].window, k * KV_BLOCK_TOKENS); b < k; b++) {
            block_hold(&c->groups[o], fo[b]);
            s->table[o][b] = fo[b];
        }
    s->n_pos = k * KV_BLOCK_TOKENS;
    s->n_pub = k;
    c->n_hits++;
    c->n_hit_tokens += (uint64_t)s->n_pos;
    return s->n_pos;
}

int32_t kv_first_block(int32_t window, int32_t n_pos) {
    return first_needed(window, n_pos);
}

const uint8_t *kv_seq_block(const kv_cache *c, const kv_seq *s, int32_t g, int32_t b) {
    int32_t id = s->table[g][b];
    return id < 0 ? NULL : c->groups[g].mem + (size_t)id * c->groups[g].block_bytes;
}

bool kv_seq_set_block(kv_cache *c, kv_seq *s, int32_t g, int32_t b, const void *data) {
    kv_group *grp = &c->groups[g];
    if (grp->n_free == 0 || s->table[g][b] >= 0) return false;
    int32_t id = block_take(c, grp);
    memcpy(grp->mem + (size_t)id * grp->block_bytes, data, grp->block_bytes);
    s->table[g][b] = id;
    return true;
}

void kv_cache_drop_idle(kv_cache *c) {
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        kv_group *g = &c->groups[gi];
        while (g->lru_head >= 0) {
            int32_t b = g->lru_head;
            lru_unlink(g, b);
            index_remove(g, b);
            g->free_list[g->n_empty++] = b;
        }
    }
}

void kv_cache_set_prefix(kv_cache *c, bool on) {
    c->prefix_on = on && c->anchor >= 0;
    if (!c->prefix_on) kv_cache_drop_idle(c);
}

int32_t kv_cache_idle_blocks(const kv_cache *c, int32_t group) {
    return c->groups[group].n_idle;
}

const char *kv_cache_check(const kv_cache *c, const uint32_t *const refs[2]) {
    const char *bad = NULL;
    for (int32_t gi = 0; gi < c->n_groups && !bad; gi++) {
        const kv_group *g = &c->groups[gi];
        uint8_t *seen = calloc((size_t)g->n_blocks, 1); /* 1: free list, 2: LRU, 4: bucket */
        if (!seen) return "out of memory";
        if (g->n_empty + g->n_idle != g->n_free || g->n_empty < 0 || g->n_idle < 0)
            bad = "empty + idle blocks do not add up to the free count";
        for (int32_t i = 0; i < g->n_empty && !bad; i++) {
            int32_t b = g->free_list[i];
            if (b < 0 || b >= g->n_blocks || seen[b])
                bad = "a block is on the free list twice";
            else if (g->ref[b] || g->serial[b])
                bad = "a block on the free list is in use";
            else
                seen[b] |= 1;
        }
        int32_t n_lru = 0;
        for (int32_t b = g->lru_head, prev = -1; b >= 0 && !bad; prev = b, b = g->lru_next[b]) {
            if (g->lru_prev[b] != prev)
                bad = "the LRU list is broken";
            else if (seen[b] || ++n_lru > g->n_idle)
                bad = "a block is free twice";
            else if (g->ref[b] || !g->serial[b])
                bad = "an idle block is in use or not indexed";
            else
                seen[b] |= 2;
        }
        if (!bad && n_lru != g->n_idle) bad = "the LRU list does not hold the idle blocks";
        int32_t n_indexed = 0, n_in_buckets = 0, n_used = 0;
        for (int32_t b = 0; b < g->n_blocks && !bad; b++) {
            n_indexed += g->serial[b] != 0;
            n_used += g->ref[b] > 0;
            if (g->ref[b] == 0 && !seen[b]) bad = "a block is lost: no reference, not free";
            if (g->ref[b] > 0 && seen[b]) bad = "a block in use is also free";
            if (refs && refs[gi] && g->ref[b] != refs[gi][b])
                bad = "a reference count differs from the sequences' references";
        }
        for (uint32_t k = 0; k <= g->bucket_mask && !bad; k++)
            for (int32_t b = g->bucket[k]; b >= 0 && !bad; b = g->hnext[b]) {
                if ((seen[b] & 4) || !g->serial[b] || bucket_of(g, g->hash[b]) != k)
                    bad = "the hash index is broken";
                seen[b] |= 4;
                n_in_buckets++;
            }
        if (!bad && n_in_buckets != n_indexed) bad = "indexed blocks missing from the index";
        if (!bad && n_used != g->n_blocks - g->n_free) bad = "blocks in use != total - free";
        for (int32_t i = 0; i < g->n_shadows && !bad; i++) {
            int32_t o = g->shadow_owner[i];
            if (o >= 0 && (o >= g->n_blocks || g->shadow[o] != i || !g->serial[o]))
                bad = "a shadow's block does not name it, or is not indexed";
        }
        for (int32_t b = 0; g->shadow && b < g->n_blocks && !bad; b++)
            if (g->shadow[b] >= 0 && g->shadow_owner[g->shadow[b]] != b)
                bad = "a block names a shadow that is not its";
        free(seen);
    }
    return bad;
}

size_t kv_cache_release_free(kv_cache *c) {
    size_t released = 0;
    kv_cache_drop_idle(c);
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        kv_group *g = &c->groups[gi];
        /* Runs of adjacent free blocks, so that pages shared by two free
         * blocks go back too. */
        for (int32_t b = 0; b < g->n_blocks;) {
            if (g->ref[b] != 0) {
                b++;
                continue;
            }
            int32_t end = b, n_res = 0;
            while (end < g->n_blocks && g->ref[end] == 0) {
                n_res += g->resident[end];
                g->resident[end] = 0;
                end++;
            }
            g->n_resident -= n_res;
            if (n_res > 0) {
                /* Pages of blocks never used were not resident: count
                 * those of the resident blocks, at most what went back. */
                size_t n = pages_release(g->mem + (size_t)b * g->block_bytes,
                                         (size_t)(end - b) * g->block_bytes);
                size_t res = (size_t)n_res * g->block_bytes;
                released += n < res ? n : res;
            }
            b = end;
        }
    }
    return released;
}

size_t kv_cache_resident_bytes(const kv_cache *c) {
    size_t n = 0;
    for (int32_t gi = 0; gi < c->n_groups; gi++)
        n += (size_t)c->groups[gi].n_resident * c->groups[gi].block_bytes;
    return n;
}

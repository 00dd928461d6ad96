/*
 * kv_cache.c — block pools and per-sequence block tables (see kv_cache.h).
 */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "pages.h"

/* Positions a windowed group must hold for one sequence: the window plus
 * the block being filled, rounded to blocks. */
static int32_t group_positions(int32_t window, int32_t ctx) {
    if (window <= 0 || window + KV_BLOCK_TOKENS >= ctx) return ctx;
    return window + KV_BLOCK_TOKENS;
}

/* Each KV type: its name (for messages), how its rows are stored, whether
 * heads are rotated first. */
static const struct {
    const char *name;
    attn_kv_format format;
    bool rotated;
} kv_types[] = {
    [CELLM_KV_F16] = {"f16", ATTN_KV_F16, false},
    [CELLM_KV_Q8_0] = {"q8_0", ATTN_KV_Q8_0, false},
    [CELLM_KV_Q4_0] = {"q4_0", ATTN_KV_Q4_0, false},
    [CELLM_KV_Q4_0H] = {"q4_0h", ATTN_KV_Q4_0, true},
};

cellm_status kv_type_check(const model *m, cellm_kv_type type, cellm_error *err) {
    if ((unsigned)type >= sizeof kv_types / sizeof kv_types[0])
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "KV type %d is not one of f16, q8_0, q4_0, q4_0h", (int)type);
    const int32_t dims[2] = {m->head_dim, m->head_dim_v};
    for (int i = 0; i < 2; i++) {
        int32_t d = dims[i];
        if (kv_types[type].format != ATTN_KV_F16 && d % 32 != 0)
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
    attn_kv_format f = kv_types[type].format;
    g->n_layers = m->kv_group_layers[gi];
    g->window = m->kv_group_window[gi];
    g->k_row = (size_t)m->n_head_kv * attn_kv_row_bytes(f, (size_t)m->head_dim);
    g->v_row = (size_t)m->n_head_kv * attn_kv_row_bytes(f, (size_t)m->head_dim_v);
    g->layer_bytes = KV_BLOCK_TOKENS * (g->k_row + g->v_row);
    g->block_bytes = g->layer_bytes * (size_t)g->n_layers;
}

size_t kv_cache_token_bytes(const model *m, cellm_kv_type type) {
    kv_group g;
    size_t total = 0;
    for (int32_t gi = 0; gi < m->n_kv_groups; gi++) {
        group_sizes(m, type, gi, &g);
        total += g.block_bytes / KV_BLOCK_TOKENS;
    }
    return total;
}

size_t kv_cache_seq_bytes(const model *m, cellm_kv_type type, int32_t ctx) {
    size_t total = 0;
    for (int32_t gi = 0; gi < m->n_kv_groups; gi++) {
        kv_group g;
        group_sizes(m, type, gi, &g);
        int32_t pos = group_positions(g.window, ctx);
        size_t blocks = (size_t)(pos + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
        total += blocks * g.block_bytes;
    }
    return total;
}

cellm_status kv_cache_create(const model *m, size_t budget, int32_t max_ctx, cellm_kv_type type,
                             kv_cache **out, cellm_error *err) {
    *out = NULL;
    if (max_ctx <= 0 || max_ctx > (1 << 24))
        return err_set(err, CELLM_ERR_INVALID_ARG, "context length %d is not 1..16777216", max_ctx);
    cellm_status st = kv_type_check(m, type, err);
    if (st) return st;
    kv_cache *c = calloc(1, sizeof *c);
    if (!c) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    c->type = type;
    c->format = kv_types[type].format;
    c->rotated = kv_types[type].rotated;
    c->n_groups = m->n_kv_groups;
    c->max_ctx = max_ctx;
    c->max_blocks_per_seq = (max_ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    size_t per_seq = kv_cache_seq_bytes(m, type, max_ctx);
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        kv_group *g = &c->groups[gi];
        group_sizes(m, type, gi, g);
        int32_t pos = group_positions(g->window, max_ctx);
        size_t need = (size_t)(pos + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS * g->block_bytes;
        /* This group's share of the budget, in whole blocks. */
        size_t share = (size_t)((double)budget * ((double)need / (double)per_seq));
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
        if (!g->mem || !g->free_list || !g->ref || !g->resident) {
            kv_cache_free(c);
            return err_set(err, CELLM_ERR_NO_MEMORY, "cannot allocate %zu bytes of KV cache",
                           n * g->block_bytes);
        }
        /* Lowest ids on top, so a fresh cache hands out blocks in order. */
        for (int32_t i = 0; i < g->n_blocks; i++) g->free_list[i] = g->n_blocks - 1 - i;
        g->n_free = g->n_blocks;
    }
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
    }
    free(c);
}

int32_t kv_cache_used_blocks(const kv_cache *c, int32_t group) {
    return c->groups[group].n_blocks - c->groups[group].n_free;
}

cellm_status kv_seq_init(kv_cache *c, kv_seq *s, cellm_error *err) {
    memset(s, 0, sizeof *s);
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        s->table[gi] = malloc((size_t)c->max_blocks_per_seq * sizeof(int32_t));
        if (!s->table[gi]) {
            kv_seq_free(c, s);
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for a block table");
        }
        for (int32_t i = 0; i < c->max_blocks_per_seq; i++) s->table[gi][i] = -1;
    }
    return CELLM_OK;
}

static void block_release(kv_group *g, int32_t b) {
    if (--g->ref[b] == 0) g->free_list[g->n_free++] = b;
}

void kv_seq_reset(kv_cache *c, kv_seq *s) {
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        if (!s->table[gi]) continue;
        for (int32_t i = 0; i < c->max_blocks_per_seq; i++) {
            if (s->table[gi][i] >= 0) block_release(&c->groups[gi], s->table[gi][i]);
            s->table[gi][i] = -1;
        }
    }
    s->n_pos = 0;
}

void kv_seq_free(kv_cache *c, kv_seq *s) {
    kv_seq_reset(c, s);
    for (int32_t gi = 0; gi < 2; gi++) free(s->table[gi]);
    memset(s, 0, sizeof *s);
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
        int32_t missing = 0;
        for (int32_t b = first; b <= last; b++) missing += s->table[gi][b] < 0;
        if (missing > c->groups[gi].n_free)
            return err_set(err, CELLM_ERR_NO_MEMORY,
                           "KV cache full: %d more blocks needed, %d free", missing,
                           c->groups[gi].n_free);
    }
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        kv_group *g = &c->groups[gi];
        for (int32_t b = first; b <= last; b++) {
            if (s->table[gi][b] >= 0) continue;
            int32_t id = g->free_list[--g->n_free];
            g->ref[id] = 1;
            if (!g->resident[id]) {
                g->resident[id] = 1;
                g->n_resident++;
            }
            s->table[gi][b] = id;
        }
    }
    return CELLM_OK;
}

void kv_seq_trim(kv_cache *c, kv_seq *s) {
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        kv_group *g = &c->groups[gi];
        if (g->window <= 0) continue;
        /* The next query is at n_pos and sees keys > n_pos - window. */
        int32_t dead_below = s->n_pos - g->window + 1; /* first visible key */
        for (int32_t b = 0; (b + 1) * KV_BLOCK_TOKENS <= dead_below; b++) {
            if (s->table[gi][b] >= 0) {
                block_release(g, s->table[gi][b]);
                s->table[gi][b] = -1;
            }
        }
    }
}

bool kv_seq_truncate(kv_cache *c, kv_seq *s, int32_t n) {
    if (n < 0 || n > s->n_pos) return false;
    for (int32_t gi = 0; gi < c->n_groups; gi++) {
        int32_t w = c->groups[gi].window;
        int32_t from = w > 0 && n - w > 0 ? n - w : 0; /* first position still visible */
        for (int32_t p = from; p < n; p += KV_BLOCK_TOKENS)
            if (s->table[gi][p / KV_BLOCK_TOKENS] < 0) return false;
    }
    int32_t keep_blocks = (n + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    for (int32_t gi = 0; gi < c->n_groups; gi++)
        for (int32_t b = keep_blocks; b < c->max_blocks_per_seq; b++)
            if (s->table[gi][b] >= 0) {
                block_release(&c->groups[gi], s->table[gi][b]);
                s->table[gi][b] = -1;
            }
    s->n_pos = n;
    return true;
}

size_t kv_cache_release_free(kv_cache *c) {
    size_t released = 0;
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

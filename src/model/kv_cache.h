/*
 * kv_cache.h — the paged KV cache. Memory is a pool of fixed-size blocks
 * (16 token positions by default), allocated once from a byte budget. Each
 * sequence owns a block table that maps its positions to blocks, so a
 * sequence grows block by block and its memory returns to the pool the
 * moment it ends.
 *
 * Layers are split in KV groups: layers with full attention share one
 * group; layers with a sliding window (Gemma 3's local layers) share
 * another, whose blocks are freed as soon as they fall out of the window.
 * A block of a group holds K and V for every layer of the group:
 *
 *   block = [layer 0: K[16][kv_dim] V[16][kv_dim]] [layer 1: ...] ...
 *
 * (k4cv4hw, keys per channel: K[16][kv_dim] holds codes, and each head's
 * metadata, kv_format.h's KV_KC4, follows them, before V.)
 *
 * K and V rows are stored in the engine's KV type (cellm_kv_type): f16,
 * Q8_0 or Q4_0 blocks of 32 (each head's blocks in order, kv_format.h),
 * or, for the rotated types, blocks of each head rotated by attn_rotate:
 * Q4_0 for both (q4_0h), or Q5_0 keys with Q4_0 values (k5v4h: keys lose
 * far more to rounding than values); the window types q4_0hw and k5v4hw
 * store rows as q4_0h and k5v4h do and keep f16 copies of each sequence's
 * sink and recent positions (kv_cache.recent). Blocks carry a reference count: sequences
 * share blocks (a fork, a cached prefix), and a write into a shared block
 * copies it first (copy-on-write, in kv_seq_reserve).
 *
 * Prefix cache. A full block whose tokens a sequence knows (kv_seq.tokens)
 * is published in an index when the step that filled it ends: in the
 * anchor group (the first with full attention) under a hash of its 16
 * tokens chained to the hash of the block before it; in the other groups
 * under the same hash, tied to the anchor block of the same position. A
 * lookup walks a new sequence's tokens block by block and takes the
 * longest prefix whose blocks are all there. Hashes only find candidates:
 * a candidate matches when its tokens are equal and the block it was
 * chained to is the block matched one position earlier (blocks carry a
 * serial number that changes whenever a block is reused, so a chain never
 * points at a block that now holds something else). Windowed groups only
 * need the blocks still inside the window at the prefix's end. When a
 * published block's last reference goes, it stays in the index, idle, and
 * its contents stay valid; idle blocks count as free and are evicted,
 * least recently used first, when the pool has no empty block left.
 * Models with no full-attention group have no prefix cache.
 *
 * Short-convolution state (lfm2). A convolution layer keeps, per sequence,
 * the last conv_l - 1 inputs of its convolution: a small fixed-size state
 * beside the block tables (kv_seq.conv), which the forward pass reads and
 * advances row by row. It describes the sequence's end only, so such a
 * cache shares no prefixes (no prefix index: a cached block would need
 * the state at its boundary), a truncation is refused (the caller resets
 * and recomputes, as it does for a windowed group that let positions go),
 * a fork copies the state, and a reset zeroes it.
 *
 * The pool is mapped from the OS (pages.h), so a block costs no physical
 * memory until a sequence first writes it; kv_cache_release_free() gives
 * the pages of free blocks back under memory pressure. Each group counts
 * its resident blocks (handed out since their pages were last given back)
 * as an estimate of the memory the cache really holds.
 */
#ifndef CELLM_KV_CACHE_H
#define CELLM_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/kv_format.h"
#include "model/model.h"
#include "base/util.h"

#define KV_BLOCK_TOKENS 16
_Static_assert(KV_BLOCK_TOKENS == KV_BLOCK_POSITIONS, "kv_format.h's block");
/* Positions of a window type's recent ring: 31 for the window, the rest
 * for taking back guesses (a truncation of up to KV_RING - 31 positions
 * stays inside it; a longer one is refused, and the caller recomputes). */
#define KV_RING 48

typedef struct kv_group {
    int32_t n_layers;
    int32_t window;      /* 0: full attention */
    size_t k_row, v_row; /* bytes of one token's K (V) for one layer */
    size_t k_meta;       /* keys per channel (KV_FMT_C4): each head's metadata, after the K rows */
    size_t layer_bytes;  /* one layer's slice of a block */
    size_t block_bytes;
    int32_t n_blocks;
    uint8_t *mem; /* pages_map'd, map_bytes */
    size_t map_bytes;
    int32_t *free_list; /* stack of free block ids */
    int32_t n_free;
    uint32_t *ref;     /* references per block */
    uint8_t *resident; /* per block: written since its pages were given back */
    int32_t n_resident;

    /* The prefix index (see above). n_free counts empty blocks (on the
     * free list, n_empty of them) and idle indexed ones (n_idle, on the
     * LRU list, least recently used at lru_head). */
    int32_t n_empty, n_idle;
    uint64_t *hash;   /* chain hash of an indexed block */
    uint64_t *serial; /* per block: 0 when not indexed, else unique to this publication */
    uint64_t *link;   /* anchor group: serial of the block before (0: first);
                         others: serial of the anchor block of the same position */
    int32_t *toks;    /* anchor group: KV_BLOCK_TOKENS tokens per indexed block */
    int32_t *bucket;  /* [bucket_mask + 1] first indexed block of each bucket, -1: none */
    int32_t *hnext;   /* next indexed block in the same bucket */
    uint32_t bucket_mask;
    int32_t *lru_prev, *lru_next; /* idle indexed blocks */
    int32_t lru_head, lru_tail;
    /* A window type's anchor group: f16 copies ("shadows") of some
     * indexed blocks, taken from the publishing sequence's tail, so that
     * a sequence can take a cached prefix that ends at one (its window's
     * block before) and starts at one (the sink). NULL for the others. */
    int32_t *shadow;       /* per block: its shadow slot, -1: none */
    int32_t *shadow_owner; /* per slot: its block, -1: free */
    uint64_t *shadow_used; /* per slot: when last made or taken (least recent goes first) */
    uint16_t *shadow_mem;  /* [n_shadows][kv_cache.shadow_elems] */
    int32_t n_shadows;
} kv_group;

/* Where a GPU backend keeps the blocks' contents (model/backend.h): the
 * cache then never touches groups[].mem, and a copy-on-write asks
 * copy(user, group, dst, src) to copy block src to block dst before any
 * later write to either (the backend does it at the start of the pass that
 * reserved it). Set by the backend when it is made, cleared when it goes. */
typedef struct kv_storage {
    void *user;
    void (*copy)(void *user, int32_t group, int32_t dst, int32_t src);
} kv_storage;

/* Sums a forward pass adds up, row after row in batch order, while a
 * cache's calib is set (kv_calibrate's pass): per layer and KV channel
 * (n_head_kv * head_dim, after RoPE), the keys, their squares, and the
 * squares of the queries that meet them (averaged over the query heads of
 * the KV head); and the rows per layer. */
typedef struct kv_calib {
    int32_t n_layer, kd;
    double *sk, *sk2, *sq2; /* [n_layer][kd] */
    double *n;              /* [n_layer] */
} kv_calib;

typedef struct kv_cache {
    cellm_kv_type type;
    kv_format kformat, vformat; /* how a K (V) row is stored */
    bool rotated;               /* rows hold attn_rotate'd heads (queries must be rotated too) */
    int32_t n_groups;
    kv_group groups[2];
    int32_t max_blocks_per_seq; /* table capacity: max context / 16 */
    int32_t max_ctx;
    int32_t anchor;       /* group whose chain indexes prefixes; -1: no prefix cache */
    bool prefix_on;       /* publish and look up (kv_cache_set_prefix) */
    uint64_t next_serial; /* last serial handed out */
    uint64_t hash_mask;   /* applied to every chain hash: tests narrow it to force collisions */
    int32_t *scratch;     /* [2 * max_blocks_per_seq] for lookups */
    uint64_t n_hits, n_hit_tokens; /* lookups that found a prefix, and the positions they took */
    uint64_t n_cow, n_evict;       /* copies on write; idle blocks evicted for new ones */
    int32_t seq_slack;             /* kv_seq_init's kv_seq.slack (0 unless set) */
    size_t conv_floats;            /* a sequence's convolution state; 0: none */
    /* The window types (q4_0hw, k5v4hw): a query reads the sink (positions
     * 0..15) and the keys and values of its own block and the block
     * before it in f16, the rest in the pool's compressed rows. Each
     * sequence keeps f16 copies of those positions beside its tables
     * (kv_seq.tail: the sink, and a ring of the last KV_RING positions);
     * a forward pass reads its own rows from its scratch. */
    bool recent;
    size_t tail_row;     /* uint16 values of one position of one layer: K then V */
    size_t tail_off[2];  /* where group g's layers start in a tail, in uint16 */
    size_t tail_elems;   /* a sequence's tail, in uint16 (0: none) */
    size_t shadow_elems; /* one block's f16 copy, every group and layer, in uint16 */
    uint64_t shadow_clock;
    /* A window type's keys, centred and balanced per layer and channel
     * (kv_calibrate): before the rotation a key becomes (k - kmean) *
     * kscale and a query q / kscale, which leaves every score of a query
     * moved by the same amount (softmax does not see it) and spreads the
     * rounding error where queries are small. NULL until calibrated
     * (then as if 0 and 1). [n_layer][n_head_kv * head_dim] each. */
    float *kmean, *kscale;
    kv_calib *calib; /* set while a pass gathers the statistics */
    kv_storage ext;  /* ext.copy NULL: the blocks' contents are in groups[].mem */
} kv_cache;

/* A sequence's view of the cache: its length and block tables. */
typedef struct kv_seq {
    int32_t n_pos;     /* positions stored: the next token goes at n_pos */
    int32_t *table[2]; /* block id per 16 positions, -1: none (freed or not yet) */
    /* The tokens at positions [0, n_pos), owned by whoever owns the
     * sequence: set it to have the sequence's full blocks published in
     * the prefix index (NULL: never published). */
    const int32_t *tokens;
    int32_t n_pub; /* leading anchor blocks already indexed */
    /* Windowed-group blocks that leave the window stay in the prefix cache
     * when they lie wholly below n_keep (a request's prompt: what a later
     * request may share); later ones, which only a prefix ending inside
     * the generated text could use, go back empty, so a long generation
     * holds its window and not one block per 16 tokens. kv_seq_init sets
     * it to INT32_MAX (keep all). */
    int32_t n_keep;
    /* Positions a windowed group keeps beyond its window, so that the
     * sequence can be truncated by up to this many (speculative decoding
     * takes back the guesses it rejects). kv_seq_init sets the cache's
     * seq_slack. */
    int32_t slack;
    /* Short-convolution state, conv_floats floats (NULL without): for
     * each conv layer, its last conv_l - 1 inputs, oldest first, each
     * n_embd floats. Consistent with n_pos. */
    float *conv;
    /* A window type's f16 copies (kv_cache.recent): per group and layer,
     * KV_BLOCK_TOKENS + KV_RING slots of tail_row values (kv_tail). */
    uint16_t *tail;
    /* The ring holds every position from tail_lo (and >= 16) to n_pos. */
    int32_t tail_lo;
} kv_seq;

/* Creates a cache for `m` holding up to `budget` bytes of blocks of KV
 * type `type`, sequences of up to `max_ctx` positions. The budget is split
 * between the groups in proportion to what `n_seqs` sequences need in each
 * when forward passes add up to `chunk` positions (kv_cache_bytes).
 * CELLM_ERR_UNSUPPORTED when the model's head sizes do not suit the type
 * (kv_type_check). */
cellm_status kv_cache_create(const model *m, size_t budget, int32_t max_ctx, int32_t n_seqs,
                             int32_t chunk, cellm_kv_type type, kv_cache **out, cellm_error *err);
void kv_cache_free(kv_cache *c);

/* The name of a KV type ("f16", "q4_0h", ...); NULL when it is none. */
const char *kv_type_name(cellm_kv_type type);

/* Whether `type` is a KV type and `m` can store K and V in it: the
 * quantized types need head sizes that are multiples of 32, the rotated
 * one powers of two up to 1024 as well. */
cellm_status kv_type_check(const model *m, cellm_kv_type type, cellm_error *err);

/* Positions of one sequence of up to `n` positions that a group with this
 * window (0: full attention) holds at most, when a forward pass adds up to
 * `chunk` of them at once: the window, the chunk and the rest of a block
 * (blocks that left the window are freed after each pass), or all n. */
int32_t kv_window_positions(int32_t window, int32_t n, int32_t chunk);

/* Bytes of blocks (all groups) that `n_seqs` sequences of up to `ctx`
 * positions hold at most while each decodes and one of them feeds a chunk
 * of up to `chunk` positions in a pass; (ctx, 1, 1) is one decoding
 * sequence. Also the bytes of one position (K and V of every layer). KV
 * type `type` must pass kv_type_check. */
size_t kv_cache_bytes(const model *m, cellm_kv_type type, int32_t ctx, int32_t n_seqs,
                      int32_t chunk);
size_t kv_cache_token_bytes(const model *m, cellm_kv_type type);

cellm_status kv_seq_init(kv_cache *c, kv_seq *s, cellm_error *err);
/* Returns every block of the sequence to the pool and empties it. */
void kv_seq_reset(kv_cache *c, kv_seq *s);
/* Frees the tables too. */
void kv_seq_free(kv_cache *c, kv_seq *s);

/* Makes room for positions [s->n_pos, s->n_pos + n): allocates the blocks
 * they need in every group. CELLM_ERR_NO_MEMORY when the pool is short (the
 * sequence is left as it was) or the context would pass max_ctx. */
cellm_status kv_seq_reserve(kv_cache *c, kv_seq *s, int32_t n, cellm_error *err);

/* Forgets positions >= n (n <= s->n_pos), returning their blocks. False,
 * with the sequence unchanged, when a windowed group has already freed
 * positions the shorter sequence would need again; then reset it instead. */
bool kv_seq_truncate(kv_cache *c, kv_seq *s, int32_t n);

/* After a step has written positions up to s->n_pos - 1: publishes the
 * sequence's new full blocks in the prefix index (when s->tokens is set),
 * then frees the blocks of windowed groups that no later position can see. */
void kv_seq_trim(kv_cache *c, kv_seq *s);

/* Blocks group g must take from the pool for positions [s->n_pos,
 * s->n_pos + n): missing ones, and a copy of the block being filled when
 * it is shared (copy-on-write). kv_seq_reserve takes exactly these. */
int32_t kv_seq_need(const kv_cache *c, const kv_seq *s, int32_t g, int32_t n);

/* 1 when the block at position s->n_pos of group g is shared and must be
 * copied before it is written, else 0. */
int32_t kv_seq_cow(const kv_cache *c, const kv_seq *s, int32_t g);

/* Makes the empty sequence `dst` share every block of `src` (same
 * positions and contents; a later write by either copies the block it
 * writes). dst->tokens is left for its owner to set. */
void kv_seq_fork(kv_cache *c, kv_seq *dst, const kv_seq *src);

/* Finds the longest cached prefix of tokens[0..n) in whole blocks and
 * gives it to the empty sequence `s` (which then holds those blocks and
 * has n_pos at the prefix's end). Returns the positions taken (0: none).
 * Set s->tokens to `tokens` afterwards to keep publishing. */
int32_t kv_seq_lookup(kv_cache *c, kv_seq *s, const int32_t *tokens, int32_t n);

/* First block index a sequence of n_pos positions still needs in a group
 * with this window (0: full attention, and it is 0); it needs every block
 * from there to the one holding position n_pos - 1. */
int32_t kv_first_block(int32_t window, int32_t n_pos);

/* The bytes (the group's block_bytes) of block index b of group g of s, for
 * saving; NULL when the sequence has no block there. Both this and
 * kv_seq_set_block need the contents in host memory (c->ext.copy NULL). */
const uint8_t *kv_seq_block(const kv_cache *c, const kv_seq *s, int32_t g, int32_t b);

/* Gives s a new block at index b of group g (which has none) holding
 * `data` (block_bytes). False when the pool has no free block. */
bool kv_seq_set_block(kv_cache *c, kv_seq *s, int32_t g, int32_t b, const void *data);

/* Turns the prefix cache off (no publishing, no lookups; what is indexed
 * is dropped) or on again. On by default where the model allows it. */
void kv_cache_set_prefix(kv_cache *c, bool on);

/* Drops every idle indexed block from the index (they become empty). */
void kv_cache_drop_idle(kv_cache *c);

/* Idle indexed blocks in a group (part of the free count). */
int32_t kv_cache_idle_blocks(const kv_cache *c, int32_t group);

/* Checks the pool's invariants against the references the caller knows
 * of: refs[g][b] counted from every live sequence (NULL: skip that
 * check). Returns NULL when all hold, else what is wrong. For tests. */
const char *kv_cache_check(const kv_cache *c, const uint32_t *const refs[2]);

/* Where K and V of one position of one layer live (a row of the cache's
 * format, heads one after the other). The block must exist. */
static inline void *kv_k(const kv_cache *c, const kv_seq *s, int32_t group, int32_t layer,
                         int32_t pos) {
    const kv_group *g = &c->groups[group];
    int32_t b = s->table[group][pos / KV_BLOCK_TOKENS];
    return g->mem + (size_t)b * g->block_bytes + (size_t)layer * g->layer_bytes +
           (size_t)(pos % KV_BLOCK_TOKENS) * g->k_row;
}
static inline void *kv_v(const kv_cache *c, const kv_seq *s, int32_t group, int32_t layer,
                         int32_t pos) {
    const kv_group *g = &c->groups[group];
    int32_t b = s->table[group][pos / KV_BLOCK_TOKENS];
    return g->mem + (size_t)b * g->block_bytes + (size_t)layer * g->layer_bytes +
           KV_BLOCK_TOKENS * g->k_row + g->k_meta + (size_t)(pos % KV_BLOCK_TOKENS) * g->v_row;
}
/* kv_k (v false) or kv_v (v true) of positions [p0, p0 + n), each plus
 * `off` bytes, into out[0..n): the layer's offsets looked up once, not
 * once a position. The blocks must exist. */
static inline void kv_rows(const kv_cache *c, const kv_seq *s, int32_t group, int32_t layer, bool v,
                           int32_t p0, int32_t n, size_t off, const void **out) {
    const kv_group *g = &c->groups[group];
    const int32_t *table = s->table[group];
    const uint8_t *base = g->mem + (size_t)layer * g->layer_bytes + off +
                          (v ? KV_BLOCK_TOKENS * g->k_row + g->k_meta : 0);
    const size_t block = g->block_bytes, row = v ? g->v_row : g->k_row;
    for (int32_t i = 0; i < n; i++) {
        int32_t p = p0 + i;
        out[i] =
            base + (size_t)table[p / KV_BLOCK_TOKENS] * block + (size_t)(p % KV_BLOCK_TOKENS) * row;
    }
}
/* Keys per channel (k4cv4hw): the metadata of the block holding pos, one
 * layer, head after head (kv_kc4_meta_bytes(head_dim) each). */
static inline uint8_t *kv_kmeta(const kv_cache *c, const kv_seq *s, int32_t group, int32_t layer,
                                int32_t pos) {
    const kv_group *g = &c->groups[group];
    int32_t b = s->table[group][pos / KV_BLOCK_TOKENS];
    return g->mem + (size_t)b * g->block_bytes + (size_t)layer * g->layer_bytes +
           KV_BLOCK_TOKENS * g->k_row;
}

/* The f16 values of one position's K and V in one layer (kv_cache.tail_row
 * of a window type). */
static inline size_t kv_f16_position_row(const model *m) {
    return (size_t)m->n_head_kv * (size_t)(m->head_dim + m->head_dim_v);
}

/* A window type's f16 copy of K (then V, tail_row - K's width later) of
 * one position of one layer: the sink's slot below KV_BLOCK_TOKENS, the
 * ring's above. Valid for the sink and for the last KV_RING positions
 * written. */
static inline uint16_t *kv_tail(const kv_cache *c, const kv_seq *s, int32_t group, int32_t layer,
                                int32_t pos) {
    int32_t slot = pos < KV_BLOCK_TOKENS ? pos : KV_BLOCK_TOKENS + pos % KV_RING;
    return s->tail + c->tail_off[group] +
           ((size_t)layer * (KV_BLOCK_TOKENS + KV_RING) + (size_t)slot) * c->tail_row;
}

/* The first position above the sink that a window type's query at n reads
 * in f16 (16 when there is none). */
static inline int32_t kv_recent_floor(int32_t n) {
    int32_t lo = (n / KV_BLOCK_TOKENS - 1) * KV_BLOCK_TOKENS;
    return lo > KV_BLOCK_TOKENS ? lo : KV_BLOCK_TOKENS;
}

/* Whether a window type's query at position q reads the key at position
 * p (<= q) in f16: the sink, or q's own block and the one before. */
static inline bool kv_recent(int32_t q, int32_t p) {
    return p < KV_BLOCK_TOKENS || p / KV_BLOCK_TOKENS + 1 >= q / KV_BLOCK_TOKENS;
}

/* Blocks in use in a group (for metrics and tests). */
int32_t kv_cache_used_blocks(const kv_cache *c, int32_t group);

/* Gives the pages of every free block back to the OS (they read as zero
 * when next handed out, and every position is written before it is read).
 * Idle indexed blocks are dropped from the index first.
 * Returns the bytes of resident blocks given back (whole pages: a little
 * less where a run of free blocks does not end on a page boundary). */
size_t kv_cache_release_free(kv_cache *c);

/* Bytes of blocks that hold pages of memory: an estimate of the cache's
 * resident size. */
size_t kv_cache_resident_bytes(const kv_cache *c);

#endif /* CELLM_KV_CACHE_H */

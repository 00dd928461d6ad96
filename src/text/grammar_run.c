/*
 * grammar_run.c — runs a compiled grammar: the per-request state (a set
 * of stacks of grammar positions), the vocabulary's prefix tree, and the
 * token mask found by walking one against the other.
 *
 * A stack is a node (pos, parent): pos is the element on top, parent the
 * rest. Nodes are hash-consed, so equal stacks have equal ids and a state
 * is a sorted list of ids. Every stack in a state has a G_CHAR on top
 * (node 0, "nothing left", marks a finished sentence). What a stack
 * becomes after its character matches is computed once per node and kept
 * (adv), so advancing a state over a character is a few lookups.
 */
#include "text/grammar_internal.h"

#include <stdlib.h>
#include <string.h>

#define NODE_CAP (1 << 20)      /* nodes of one state, at most */
#define NODE_COMPACT (1 << 16)  /* rebuild the store past this many after a token */
#define SETTLE_BUDGET (1 << 12) /* nodes one expansion may visit */
#define CALL_BUDGET (1 << 18)   /* nodes all expansions of one call may visit */
#define WALK_BUDGET (1L << 24)  /* stack ids one call may step (about 50 ms at worst) */
#define N_CACHE 8               /* masks remembered per state */
#define TRIE_MAX_DEPTH 1024     /* longer tokens are never allowed */

typedef struct gnode {
    int32_t pos, parent;
    int32_t adv, n_adv; /* adv < 0: not computed yet */
    int32_t depth;
    uint32_t stamp;
} gnode;

/* ------------------------------------------------------------ the trie */

typedef struct tnode {
    int32_t end;     /* index after this node's subtree (preorder) */
    int32_t tok_off; /* tokens whose bytes end here: order[tok_off .. + tok_n) */
    int32_t tok_n;
    uint16_t depth; /* bytes from the root: 1 for a first byte */
    uint8_t byte;
} tnode;

struct grammar_vocab {
    tnode *nodes;
    int32_t n_nodes;
    int32_t *order; /* token ids sorted by bytes */
    int32_t n_vocab;
    int32_t max_depth;
};

typedef struct vsort {
    const char *const *pieces;
    const size_t *lens;
} vsort;

static _Thread_local const vsort *sort_ctx;

static int cmp_tok(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = sort_ctx->lens[x], ly = sort_ctx->lens[y];
    int c = memcmp(sort_ctx->pieces[x], sort_ctx->pieces[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : 1;
}

cellm_status grammar_vocab_create(const char *const *pieces, const size_t *lens, int32_t n_vocab,
                                  grammar_vocab **out, cellm_error *err) {
    *out = NULL;
    grammar_vocab *v = calloc(1, sizeof(*v));
    int32_t n = 0;
    size_t total = 0;
    if (v) v->order = malloc(sizeof(int32_t) * ((size_t)n_vocab + 1));
    if (!v || !v->order) goto oom;
    for (int32_t t = 0; t < n_vocab; t++) {
        if (lens[t] == 0 || lens[t] > TRIE_MAX_DEPTH || !pieces[t]) continue;
        v->order[n++] = t;
        total += lens[t];
    }
    vsort ctx = {pieces, lens};
    sort_ctx = &ctx;
    qsort(v->order, (size_t)n, sizeof(int32_t), cmp_tok);
    sort_ctx = NULL;
    /* At most one node per byte of all tokens. */
    v->nodes = malloc(sizeof(tnode) * (total + 1));
    if (!v->nodes) goto oom;
    v->n_vocab = n_vocab;
    int32_t path[TRIE_MAX_DEPTH + 1]; /* path[d]: the open node at depth d */
    int32_t open = 0;                 /* depth of the deepest open node */
    for (int32_t k = 0; k < n; k++) {
        int32_t t = v->order[k];
        const unsigned char *b = (const unsigned char *)pieces[t];
        int32_t len = (int32_t)lens[t], lcp = 0;
        if (k > 0) {
            int32_t u = v->order[k - 1];
            const unsigned char *pb = (const unsigned char *)pieces[u];
            int32_t pl = (int32_t)lens[u];
            while (lcp < len && lcp < pl && lcp < open && b[lcp] == pb[lcp]) lcp++;
        }
        for (; open > lcp; open--) v->nodes[path[open]].end = v->n_nodes;
        for (int32_t d = lcp + 1; d <= len; d++) {
            tnode *x = &v->nodes[v->n_nodes];
            x->byte = b[d - 1];
            x->depth = (uint16_t)d;
            x->tok_off = 0;
            x->tok_n = 0;
            x->end = -1;
            path[d] = v->n_nodes++;
        }
        open = len;
        tnode *leaf = &v->nodes[path[len]];
        if (leaf->tok_n == 0) leaf->tok_off = k;
        leaf->tok_n++;
        if (len > v->max_depth) v->max_depth = len;
    }
    for (; open > 0; open--) v->nodes[path[open]].end = v->n_nodes;
    *out = v;
    return CELLM_OK;
oom:
    grammar_vocab_free(v);
    return err_set(err, CELLM_ERR_NO_MEMORY, "grammar: out of memory for the token trie");
}

void grammar_vocab_free(grammar_vocab *v) {
    if (!v) return;
    free(v->nodes);
    free(v->order);
    free(v);
}

int32_t grammar_vocab_n(const grammar_vocab *v) {
    return v->n_vocab;
}

/* ----------------------------------------------------------- the state */

typedef struct mcache {
    uint64_t hash;
    int32_t *key; /* the set, then the partial character's value and count */
    size_t n_key, cap_key;
    uint32_t *bits;
    uint64_t used; /* for replacement: the least recently used goes */
} mcache;

struct grammar_state {
    const grammar *g;
    const grammar_vocab *v;
    gnode *nodes;
    size_t n_nodes, cap_nodes;
    int32_t *ht; /* node ids by (pos, parent); -1 empty */
    size_t ht_cap;
    int32_t *adv; /* adv lists of the nodes */
    size_t n_adv, cap_adv;
    int32_t *work; /* settle's worklist */
    size_t cap_work;
    uint32_t stamp;
    long budget; /* expansion steps left in this call (mask, allows, accept) */
    long walk;   /* stack steps left in this call */

    int32_t *cur; /* the state: sorted stack ids */
    size_t n_cur, cap_cur;
    uint32_t part_val; /* a UTF-8 character begun and not finished */
    int32_t part_rem;  /* continuation bytes it still needs (0: none) */

    int32_t *buf; /* sets of the trie walk */
    size_t cap_buf;
    uint32_t *mask;
    size_t n_words;
    mcache cache[N_CACHE];
    uint64_t tick;
};

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static uint32_t hash2(int32_t a, int32_t b) {
    uint64_t h = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

static bool rehash(grammar_state *s, size_t cap) {
    int32_t *ht = malloc(cap * sizeof(int32_t));
    if (!ht) return false;
    memset(ht, 0xff, cap * sizeof(int32_t));
    for (size_t id = 1; id < s->n_nodes; id++) {
        size_t h = hash2(s->nodes[id].pos, s->nodes[id].parent) & (cap - 1);
        while (ht[h] >= 0) h = (h + 1) & (cap - 1);
        ht[h] = (int32_t)id;
    }
    free(s->ht);
    s->ht = ht;
    s->ht_cap = cap;
    return true;
}

/* The node (pos, parent); -1 when the store is full or the stack too deep. */
static int32_t intern(grammar_state *s, int32_t pos, int32_t parent) {
    size_t h = hash2(pos, parent) & (s->ht_cap - 1);
    for (int32_t id; (id = s->ht[h]) >= 0; h = (h + 1) & (s->ht_cap - 1))
        if (s->nodes[id].pos == pos && s->nodes[id].parent == parent) return id;
    int32_t depth = parent >= 0 ? s->nodes[parent].depth + 1 : 1;
    if (depth > GRAMMAR_MAX_DEPTH || s->n_nodes >= NODE_CAP) return -1;
    if (!grow((void **)&s->nodes, &s->cap_nodes, s->n_nodes + 1, sizeof(gnode))) return -1;
    int32_t id = (int32_t)s->n_nodes++;
    s->nodes[id] = (gnode){pos, parent, -1, 0, depth, 0};
    s->ht[h] = id;
    if (s->n_nodes * 2 > s->ht_cap && !rehash(s, s->ht_cap * 2)) {
        s->n_nodes--;
        s->ht[h] = -1;
        return -1;
    }
    return id;
}

static bool add_work(grammar_state *s, size_t *n, int32_t id) {
    if (id < 0) return true; /* too deep or no room: that path is dropped */
    if (!grow((void **)&s->work, &s->cap_work, *n + 1, sizeof(int32_t))) return false;
    s->work[(*n)++] = id;
    return true;
}

/* Expands stack `id` until every stack has a character on top, appending
 * those stacks (and 0 for "finished") to s->adv. */
static void settle(grammar_state *s, int32_t id) {
    const grammar *g = s->g;
    s->stamp++;
    size_t nw = 0;
    int budget = SETTLE_BUDGET;
    if (!add_work(s, &nw, id)) return;
    /* An ambiguous grammar can make expansions costly: past the budgets
     * the paths not yet expanded are dropped (the same ones on every run
     * of the same text). */
    while (nw > 0 && budget-- > 0 && s->budget-- > 0) {
        int32_t x = s->work[--nw];
        gnode *nd = &s->nodes[x];
        if (nd->stamp == s->stamp) continue;
        nd->stamp = s->stamp;
        int32_t pos = nd->pos, parent = nd->parent, op = g->code[pos];
        if (op == G_CHAR) {
            if (!grow((void **)&s->adv, &s->cap_adv, s->n_adv + 1, sizeof(int32_t))) return;
            s->adv[s->n_adv++] = x;
        } else if (op == G_END) {
            if (parent < 0) {
                if (!grow((void **)&s->adv, &s->cap_adv, s->n_adv + 1, sizeof(int32_t))) return;
                s->adv[s->n_adv++] = 0;
            } else if (!add_work(s, &nw, parent)) {
                return;
            }
        } else {
            int32_t r = g->code[pos + 1], cont = pos + 2;
            /* A call in tail position pushes no frame. */
            int32_t np = g->code[cont] == G_END ? parent : intern(s, cont, parent);
            if (np < 0 && g->code[cont] != G_END) continue;
            for (int32_t a = g->rule_alt[r + 1] - 1; a >= g->rule_alt[r]; a--)
                if (!add_work(s, &nw, intern(s, g->alt_start[a], np))) return;
        }
    }
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v[0..*n), drops repeats, and keeps at most GRAMMAR_MAX_STACKS
 * (the lowest ids: the same ones on every run). */
static void sort_unique(int32_t *v, size_t *n) {
    if (*n > 16) qsort(v, *n, sizeof(int32_t), cmp_i32);
    for (size_t i = 1; *n <= 16 && i < *n; i++) {
        int32_t x = v[i];
        size_t j = i;
        while (j > 0 && v[j - 1] > x) {
            v[j] = v[j - 1];
            j--;
        }
        v[j] = x;
    }
    size_t m = 0;
    for (size_t i = 0; i < *n; i++)
        if (m == 0 || v[m - 1] != v[i]) v[m++] = v[i];
    *n = m > GRAMMAR_MAX_STACKS ? GRAMMAR_MAX_STACKS : m;
}

/* The stacks node `id` (a character on top) becomes once that character
 * is matched: s->adv[*off .. + *n). */
static void advance(grammar_state *s, int32_t id, int32_t *off, int32_t *n) {
    gnode *nd = &s->nodes[id];
    if (nd->adv < 0) {
        size_t start = s->n_adv;
        int32_t pos = nd->pos, parent = nd->parent;
        int32_t next = intern(s, grammar_next(s->g, pos), parent);
        if (next >= 0) settle(s, next);
        size_t m = s->n_adv - start;
        sort_unique(s->adv + start, &m);
        s->n_adv = start + m;
        nd = &s->nodes[id];
        nd->adv = (int32_t)start;
        nd->n_adv = (int32_t)m;
    }
    *off = nd->adv;
    *n = nd->n_adv;
}

static bool char_match(const int32_t *el, int32_t cp) {
    int32_t n = el[1];
    for (int32_t k = 0; k < n; k++) {
        if (cp < el[2 + 2 * k]) return false;
        if (cp <= el[3 + 2 * k]) return true;
    }
    return false;
}

static bool char_overlaps(const int32_t *el, int32_t lo, int32_t hi) {
    int32_t n = el[1];
    for (int32_t k = 0; k < n; k++)
        if (el[2 + 2 * k] <= hi && el[3 + 2 * k] >= lo) return true;
    return false;
}

/* Code points a character begun as `val` with `rem` bytes to come may be. */
static void part_range(uint32_t val, int32_t rem, int32_t *lo, int32_t *hi) {
    *lo = (int32_t)(val << (6 * rem));
    *hi = *lo | ((1 << (6 * rem)) - 1);
    /* Just after a lead byte of 3 or 4: the shortest form's bounds. */
    if (rem == 2 && val < 0x10 && *lo < 0x800) *lo = 0x800;
    if (rem == 3) {
        if (*lo < 0x10000) *lo = 0x10000;
        if (*hi > 0x10FFFF) *hi = 0x10FFFF;
    }
}

/* Steps a set (src[0..n)) over one byte: the next set goes to dst (room
 * for it is made in s->buf at dst_off); returns its length, or -1 when no
 * stack accepts the byte. *val and *rem carry a partial character. */
static long step_byte(grammar_state *s, size_t src_off, size_t n, size_t dst_off, uint8_t b,
                      uint32_t *val, int32_t *rem, bool *shared) {
    int32_t cp = -1;
    *shared = false;
    /* A hostile grammar with hundreds of stacks in every state would make
     * a mask cost seconds: past the budget, nothing more is allowed. */
    s->walk -= (long)n + 1;
    if (s->walk < 0) return -1;
    if (*rem == 0) {
        if (b < 0x80) {
            cp = b;
        } else if ((b & 0xE0) == 0xC0 && b >= 0xC2) {
            *val = b & 0x1F;
            *rem = 1;
        } else if ((b & 0xF0) == 0xE0) {
            *val = b & 0x0F;
            *rem = 2;
        } else if ((b & 0xF8) == 0xF0 && b <= 0xF4) {
            *val = b & 0x07;
            *rem = 3;
        } else {
            return -1;
        }
    } else {
        if ((b & 0xC0) != 0x80) return -1;
        uint32_t was = *val;
        *val = (*val << 6) | (b & 0x3F);
        /* No overlong forms, surrogates or code points past U+10FFFF: a
         * token of stray bytes must not spell an ASCII character. */
        if (*rem == 3 && (*val < 0x10 || *val > 0x10F)) return -1;
        if (*rem == 2 && was < 0x10 && (*val < 0x20 || (*val >= 0x360 && *val <= 0x37F))) return -1;
        if (--*rem == 0) cp = (int32_t)*val;
    }
    const int32_t *code = s->g->code;
    if (cp < 0) { /* a character still unfinished: can any stack take it? */
        int32_t lo, hi;
        part_range(*val, *rem, &lo, &hi);
        for (size_t k = 0; k < n; k++) {
            int32_t id = s->buf[src_off + k];
            if (id > 0 && char_overlaps(code + s->nodes[id].pos, lo, hi)) {
                *shared = true;
                return (long)n;
            }
        }
        return -1;
    }
    size_t m = 0, matched = 0;
    for (size_t k = 0; k < n; k++) {
        int32_t id = s->buf[src_off + k];
        if (id == 0 || !char_match(code + s->nodes[id].pos, cp)) continue;
        matched++;
        int32_t off, na;
        advance(s, id, &off, &na);
        if (!grow((void **)&s->buf, &s->cap_buf, dst_off + m + (size_t)na + 1, sizeof(int32_t)))
            return -1;
        if (na > 0) memcpy(s->buf + dst_off + m, s->adv + off, (size_t)na * sizeof(int32_t));
        m += (size_t)na;
        s->walk -= na;
        if (m > 4 * GRAMMAR_MAX_STACKS)
            sort_unique(s->buf + dst_off, &m); /* an ambiguous grammar */
    }
    if (m == 0) return -1;
    if (matched > 1) sort_unique(s->buf + dst_off, &m); /* one adv list is sorted already */
    return (long)m;
}

static void state_reset_store(grammar_state *s) {
    s->n_nodes = 1; /* node 0: finished */
    s->nodes[0] = (gnode){-1, -1, 0, 0, 0, 0};
    memset(s->ht, 0xff, s->ht_cap * sizeof(int32_t));
    s->n_adv = 0;
    for (int k = 0; k < N_CACHE; k++) s->cache[k].used = 0;
}

cellm_status grammar_state_create(const grammar *g, const grammar_vocab *v, grammar_state **out,
                                  cellm_error *err) {
    *out = NULL;
    grammar_state *s = calloc(1, sizeof(*s));
    if (!s) goto oom;
    s->g = g;
    s->v = v;
    s->n_words = ((size_t)v->n_vocab + 31) / 32;
    s->ht_cap = 1024;
    s->ht = malloc(s->ht_cap * sizeof(int32_t));
    s->mask = malloc(s->n_words * sizeof(uint32_t));
    if (!s->ht || !s->mask || !grow((void **)&s->nodes, &s->cap_nodes, 256, sizeof(gnode)))
        goto oom;
    for (int k = 0; k < N_CACHE; k++) {
        s->cache[k].bits = malloc(s->n_words * sizeof(uint32_t));
        if (!s->cache[k].bits) goto oom;
    }
    state_reset_store(s);
    s->budget = CALL_BUDGET;
    s->walk = WALK_BUDGET;
    /* The start: every alternative of root. */
    for (int32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++) {
        int32_t id = intern(s, g->alt_start[a], -1);
        if (id >= 0) settle(s, id);
    }
    size_t m = s->n_adv;
    sort_unique(s->adv, &m);
    if (!grow((void **)&s->cur, &s->cap_cur, m + 1, sizeof(int32_t))) goto oom;
    if (m > 0) memcpy(s->cur, s->adv, m * sizeof(int32_t));
    s->n_cur = m;
    s->n_adv = 0;
    *out = s;
    return CELLM_OK;
oom:
    grammar_state_free(s);
    return err_set(err, CELLM_ERR_NO_MEMORY, "grammar: out of memory for a state");
}

void grammar_state_free(grammar_state *s) {
    if (!s) return;
    free(s->nodes);
    free(s->ht);
    free(s->adv);
    free(s->work);
    free(s->cur);
    free(s->buf);
    free(s->mask);
    for (int k = 0; k < N_CACHE; k++) {
        free(s->cache[k].key);
        free(s->cache[k].bits);
    }
    free(s);
}

bool grammar_state_complete(const grammar_state *s) {
    return s->part_rem == 0 && s->n_cur > 0 && s->cur[0] == 0;
}

bool grammar_state_dead_end(const grammar_state *s) {
    return s->n_cur == 0 || (s->n_cur == 1 && s->cur[0] == 0);
}

/* Rebuilds the node store with only the current stacks (their tails
 * included), when the store has grown past NODE_COMPACT. */
static int32_t copy_stack(grammar_state *s, const gnode *old, int32_t *map, int32_t id) {
    if (id < 0) return -1;
    if (map[id] >= 0) return map[id];
    int32_t parent = copy_stack(s, old, map, old[id].parent);
    int32_t n = intern(s, old[id].pos, parent);
    map[id] = n;
    return n;
}

static void compact(grammar_state *s) {
    size_t n_old = s->n_nodes;
    gnode *old = malloc(n_old * sizeof(gnode));
    int32_t *map = malloc(n_old * sizeof(int32_t));
    if (!old || !map) {
        free(old);
        free(map);
        return; /* no room to compact: go on with the big store */
    }
    memcpy(old, s->nodes, n_old * sizeof(gnode));
    memset(map, 0xff, n_old * sizeof(int32_t));
    map[0] = 0;
    state_reset_store(s);
    size_t m = 0;
    for (size_t k = 0; k < s->n_cur; k++) {
        int32_t id = copy_stack(s, old, map, s->cur[k]);
        if (id >= 0) s->cur[m++] = id;
    }
    sort_unique(s->cur, &m);
    s->n_cur = m;
    free(old);
    free(map);
}

/* Runs the bytes over the state into s->buf; the resulting set is
 * buf[*off .. + *len), the partial character in *val, *rem. */
static bool run_bytes(grammar_state *s, const char *bytes, size_t n, size_t *off_out,
                      size_t *len_out, uint32_t *val_out, int32_t *rem_out) {
    s->budget = CALL_BUDGET;
    s->walk = WALK_BUDGET;
    if (!grow((void **)&s->buf, &s->cap_buf, s->n_cur * 2 + 2, sizeof(int32_t))) return false;
    memcpy(s->buf, s->cur, s->n_cur * sizeof(int32_t));
    size_t off = 0, len = s->n_cur;
    uint32_t val = s->part_val;
    int32_t rem = s->part_rem;
    for (size_t i = 0; i < n; i++) {
        bool shared;
        long m = step_byte(s, off, len, off + len, (uint8_t)bytes[i], &val, &rem, &shared);
        if (m < 0) return false;
        if (!shared) {
            off += len;
            len = (size_t)m;
        }
    }
    *off_out = off;
    *len_out = len;
    *val_out = val;
    *rem_out = rem;
    return true;
}

bool grammar_state_allows(grammar_state *s, const char *bytes, size_t n) {
    size_t off, len;
    uint32_t val;
    int32_t rem;
    return n > 0 && run_bytes(s, bytes, n, &off, &len, &val, &rem);
}

bool grammar_state_accept(grammar_state *s, const char *bytes, size_t n) {
    size_t off, len;
    uint32_t val;
    int32_t rem;
    if (!run_bytes(s, bytes, n, &off, &len, &val, &rem)) return false;
    if (!grow((void **)&s->cur, &s->cap_cur, len + 1, sizeof(int32_t))) return false;
    memcpy(s->cur, s->buf + off, len * sizeof(int32_t));
    s->n_cur = len;
    s->part_val = val;
    s->part_rem = rem;
    if (s->n_nodes > NODE_COMPACT) compact(s);
    return true;
}

static uint64_t key_hash(const grammar_state *s) {
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < s->n_cur; k++) h = (h ^ (uint32_t)s->cur[k]) * 1099511628211ull;
    h = (h ^ s->part_val) * 1099511628211ull;
    return (h ^ (uint32_t)s->part_rem) * 1099511628211ull;
}

static mcache *cache_find(grammar_state *s, uint64_t h) {
    for (int k = 0; k < N_CACHE; k++) {
        mcache *c = &s->cache[k];
        if (!c->used || c->hash != h || c->n_key != s->n_cur + 2) continue;
        if (memcmp(c->key, s->cur, s->n_cur * sizeof(int32_t)) != 0) continue;
        if (c->key[s->n_cur] != (int32_t)s->part_val || c->key[s->n_cur + 1] != s->part_rem)
            continue;
        return c;
    }
    return NULL;
}

static void cache_put(grammar_state *s, uint64_t h) {
    mcache *c = &s->cache[0];
    for (int k = 1; k < N_CACHE; k++)
        if (s->cache[k].used < c->used) c = &s->cache[k];
    if (!grow((void **)&c->key, &c->cap_key, s->n_cur + 2, sizeof(int32_t))) {
        c->used = 0;
        return;
    }
    memcpy(c->key, s->cur, s->n_cur * sizeof(int32_t));
    c->key[s->n_cur] = (int32_t)s->part_val;
    c->key[s->n_cur + 1] = s->part_rem;
    c->n_key = s->n_cur + 2;
    c->hash = h;
    c->used = ++s->tick;
    memcpy(c->bits, s->mask, s->n_words * sizeof(uint32_t));
}

const uint32_t *grammar_state_mask(grammar_state *s) {
    const grammar_vocab *v = s->v;
    uint64_t h = key_hash(s);
    mcache *c = cache_find(s, h);
    if (c) {
        c->used = ++s->tick;
        return c->bits;
    }
    memset(s->mask, 0, s->n_words * sizeof(uint32_t));
    s->budget = CALL_BUDGET;
    s->walk = WALK_BUDGET;
    /* Per depth of the walk: where its set lies in s->buf, how long it is,
     * and its partial character. Depth 0 is the state itself. */
    int32_t depth_max = v->max_depth + 1;
    size_t *off = malloc(sizeof(size_t) * 2 * (size_t)depth_max);
    uint32_t *val = malloc(sizeof(uint32_t) * (size_t)depth_max);
    int32_t *rem = malloc(sizeof(int32_t) * (size_t)depth_max);
    if (!off || !val || !rem ||
        !grow((void **)&s->buf, &s->cap_buf, s->n_cur + 1, sizeof(int32_t))) {
        free(off);
        free(val);
        free(rem);
        return s->mask; /* nothing allowed */
    }
    size_t *len = off + depth_max;
    memcpy(s->buf, s->cur, s->n_cur * sizeof(int32_t));
    off[0] = 0;
    len[0] = s->n_cur;
    val[0] = s->part_val;
    rem[0] = s->part_rem;
    for (int32_t i = 0; i < v->n_nodes;) {
        const tnode *t = &v->nodes[i];
        int32_t d = t->depth;
        uint32_t cv = val[d - 1];
        int32_t cr = rem[d - 1];
        bool shared;
        size_t dst = off[d - 1] + len[d - 1];
        long m = step_byte(s, off[d - 1], len[d - 1], dst, t->byte, &cv, &cr, &shared);
        if (m < 0) {
            i = t->end;
            continue;
        }
        off[d] = shared ? off[d - 1] : dst;
        len[d] = (size_t)m;
        val[d] = cv;
        rem[d] = cr;
        for (int32_t k = 0; k < t->tok_n; k++) {
            int32_t tok = v->order[t->tok_off + k];
            s->mask[tok >> 5] |= 1u << (tok & 31);
        }
        i++;
    }
    free(off);
    free(val);
    free(rem);
    cache_put(s, h);
    return s->mask;
}

/*
 * session_file.c — saving a chat session (its history and the KV blocks it
 * keeps) to a file and restoring it on a new engine, so that an app killed
 * in the middle of a long conversation resumes it without recomputing it
 * (cellm_session_save / cellm_session_restore in include/cellm.h).
 *
 * The file, all integers little-endian:
 *
 *   "CELLMSES"  u32 version (1)  u32 flags (0)
 *   u8[32]      the model's identity: SHA-256 of its GGUF file's bytes up
 *               to the tensor data (header, metadata, tensor table) and of
 *               the file's size
 *   u32 kv_type  u32 block_tokens  u32 n_groups
 *   per group:  u32 n_layers  i32 window  u64 block_bytes
 *   i32 n_pos   u32 n_msgs
 *   per message: u8 role (0 system, 1 user, 2 assistant)  u32 len  bytes
 *   n_pos x i32 the kept tokens
 *   per group:  i32 first  u32 count, then count blocks of block_bytes: the
 *               blocks [first, first + count) the sequence needs
 *   only for a model with short-convolution layers (lfm2): the sequence's
 *               convolution state (kv_seq.conv, floats as the machine
 *               stores them), as many bytes as the engine's layout says
 *   only for a window KV type (q4_0hw, k5v4hw): the sequence's f16 copies
 *               of its sink and recent positions (kv_seq.tail, as the
 *               machine stores them), as many bytes as the layout says
 *   u8[32]      SHA-256 of every byte before it
 *
 * The file is untrusted on restore: its size is bounded by what the engine
 * could hold before it is read, the checksum is checked before anything is
 * parsed, every length is checked against what is left, and the KV layout
 * must be the engine's, block for block, so that the forward pass finds
 * every block it reads. The engine thread only copies blocks (to a buffer
 * on save, from the parsed file on restore); files are read and written
 * on the caller's thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/engine.h"
#include "format/gguf.h"
#include "runtime/session_file.h"
#include "base/sha256.h"

#define SES_MAGIC "CELLMSES"
#define SES_VERSION 1
#define SES_MAX_TEXT ((size_t)64 << 20) /* all message text together */
#define SES_MAX_MSGS 65536

static const char *const ses_roles[3] = {"system", "user", "assistant"};

/* The model's identity (see the file comment). */
static void model_identity(const cellm_model *cm, uint8_t out[SHA256_DIGEST_SIZE]) {
    const gguf_file *f = cm->m->file;
    sha256_ctx h;
    sha256_init(&h);
    size_t head = f->data_offset < f->size ? (size_t)f->data_offset : f->size;
    sha256_update(&h, f->base, head);
    uint8_t sz[8];
    for (int i = 0; i < 8; i++) sz[i] = (uint8_t)((uint64_t)f->size >> (8 * i));
    sha256_update(&h, sz, sizeof sz);
    sha256_final(&h, out);
}

/* ------------------------------------------------------------------ save */

/* What the engine thread copies out of a session for saving. */
typedef struct snapshot {
    cellm_session *s;
    int32_t n_pos;
    int32_t *tokens;
    int32_t first[2], count[2];
    uint8_t *blocks[2];
    float *conv;
    uint16_t *tail;
    bool no_memory, broken;
} snapshot;

static void snap_kv(cellm_engine *e, void *arg) {
    snapshot *sn = arg;
    const kv_seq *q = &sn->s->seq;
    kv_cache *c = e->kv;
    sn->n_pos = q->n_pos;
    if (q->n_pos == 0) return;
    sn->tokens = malloc((size_t)q->n_pos * sizeof *sn->tokens);
    if (!sn->tokens) {
        sn->no_memory = true;
        return;
    }
    memcpy(sn->tokens, sn->s->kept, (size_t)q->n_pos * sizeof *sn->tokens);
    if (c->conv_floats) {
        if (!(sn->conv = malloc(c->conv_floats * sizeof *sn->conv))) {
            sn->no_memory = true;
            return;
        }
        memcpy(sn->conv, q->conv, c->conv_floats * sizeof *sn->conv);
    }
    if (c->tail_elems) {
        if (!(sn->tail = malloc(c->tail_elems * sizeof *sn->tail))) {
            sn->no_memory = true;
            return;
        }
        memcpy(sn->tail, q->tail, c->tail_elems * sizeof *sn->tail);
    }
    int32_t end = (q->n_pos + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    for (int32_t g = 0; g < c->n_groups; g++) {
        size_t bb = c->groups[g].block_bytes;
        sn->first[g] = kv_first_block(c->groups[g].window, q->n_pos);
        sn->count[g] = end - sn->first[g];
        sn->blocks[g] = malloc((size_t)sn->count[g] * bb);
        if (!sn->blocks[g]) {
            sn->no_memory = true;
            return;
        }
        for (int32_t i = 0; i < sn->count[g]; i++) {
            const uint8_t *src = kv_seq_block(c, q, g, sn->first[g] + i);
            if (!src) {
                sn->broken = true;
                return;
            }
            memcpy(sn->blocks[g] + (size_t)i * bb, src, bb);
        }
    }
    session_keep(e, sn->s); /* used: the most recent */
}

typedef struct writer {
    FILE *f;
    sha256_ctx h;
    bool failed;
} writer;

static void put(writer *w, const void *p, size_t n) {
    if (!n) return;
    sha256_update(&w->h, p, n);
    if (!w->failed && fwrite(p, 1, n, w->f) != n) w->failed = true;
}

static void put_u32(writer *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(w, b, 4);
}

static void put_u64(writer *w, uint64_t v) {
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}

static int role_index(const char *role) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(role, ses_roles[i])) return i;
    return -1;
}

cellm_status cellm_session_save(cellm_session *s, const char *path) {
    if (!s || !path)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_save: a NULL argument");
    cellm_engine *e = s->e;
    pthread_mutex_lock(&e->mu);
    bool busy = s->turn != NULL || s->free_pending;
    pthread_mutex_unlock(&e->mu);
    if (busy) return engine_fail(CELLM_ERR_INVALID_ARG, "the session's turn has not finished");
    if (engine_on_thread(e))
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_save called from a callback");
    if (e->kv->ext.copy)
        return engine_fail(CELLM_ERR_UNSUPPORTED,
                           "session files need the KV cache in host memory, and this engine "
                           "keeps it on its GPU");
    snapshot sn;
    memset(&sn, 0, sizeof sn);
    sn.s = s;
    engine_run_job(e, snap_kv, &sn);
    cellm_status st = CELLM_OK;
    char msg[CELLM_ERR_MSG_MAX] = "";
    char *tmp = NULL;
    FILE *f = NULL;
    if (sn.no_memory) {
        st = CELLM_ERR_NO_MEMORY;
        snprintf(msg, sizeof msg, "out of memory for the session's KV blocks");
        goto done;
    }
    if (sn.broken) {
        st = CELLM_ERR_INTERNAL;
        snprintf(msg, sizeof msg, "the session's KV lacks a block it needs");
        goto done;
    }
    size_t plen = strlen(path);
    tmp = malloc(plen + 5);
    if (!tmp) {
        st = CELLM_ERR_NO_MEMORY;
        snprintf(msg, sizeof msg, "out of memory");
        goto done;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    f = fopen(tmp, "wb");
    if (!f) {
        st = CELLM_ERR_IO;
        snprintf(msg, sizeof msg, "cannot write %s: %s", tmp, strerror(errno));
        goto done;
    }
    writer w;
    memset(&w, 0, sizeof w);
    w.f = f;
    sha256_init(&w.h);
    uint8_t id[SHA256_DIGEST_SIZE];
    model_identity(e->model, id);
    kv_cache *c = e->kv;
    put(&w, SES_MAGIC, 8);
    put_u32(&w, SES_VERSION);
    put_u32(&w, 0);
    put(&w, id, sizeof id);
    put_u32(&w, (uint32_t)e->p.kv_type);
    put_u32(&w, KV_BLOCK_TOKENS);
    put_u32(&w, (uint32_t)c->n_groups);
    for (int32_t g = 0; g < c->n_groups; g++) {
        put_u32(&w, (uint32_t)c->groups[g].n_layers);
        put_u32(&w, (uint32_t)c->groups[g].window);
        put_u64(&w, c->groups[g].block_bytes);
    }
    put_u32(&w, (uint32_t)sn.n_pos);
    put_u32(&w, (uint32_t)s->n_msgs);
    for (int32_t i = 0; i < s->n_msgs; i++) {
        uint8_t r = (uint8_t)role_index(s->msgs[i].role);
        size_t n = strlen(s->msgs[i].content);
        put(&w, &r, 1);
        put_u32(&w, (uint32_t)n);
        put(&w, s->msgs[i].content, n);
    }
    for (int32_t i = 0; i < sn.n_pos; i++) put_u32(&w, (uint32_t)sn.tokens[i]);
    for (int32_t g = 0; g < c->n_groups; g++) {
        put_u32(&w, (uint32_t)sn.first[g]);
        put_u32(&w, (uint32_t)sn.count[g]);
        if (sn.n_pos > 0) put(&w, sn.blocks[g], (size_t)sn.count[g] * c->groups[g].block_bytes);
    }
    if (c->conv_floats) { /* zeros for an empty sequence */
        for (size_t i = 0; i < c->conv_floats; i++) {
            float v = sn.conv ? sn.conv[i] : 0.0f;
            put(&w, &v, sizeof v);
        }
    }
    if (sn.tail)
        put(&w, sn.tail, c->tail_elems * sizeof *sn.tail);
    else
        for (size_t i = 0; i < c->tail_elems; i++) { /* zeros for an empty sequence */
            uint16_t v = 0;
            put(&w, &v, sizeof v);
        }
    uint8_t sum[SHA256_DIGEST_SIZE];
    sha256_final(&w.h, sum);
    if (!w.failed && fwrite(sum, 1, sizeof sum, f) != sizeof sum) w.failed = true;
    int closed = fclose(f);
    f = NULL;
    if (w.failed || closed != 0) {
        st = CELLM_ERR_IO;
        snprintf(msg, sizeof msg, "cannot write %s: %s", tmp, strerror(errno));
        remove(tmp);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = CELLM_ERR_IO;
        snprintf(msg, sizeof msg, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
        remove(tmp);
    }
done:
    if (f) {
        fclose(f);
        remove(tmp);
    }
    free(tmp);
    free(sn.tokens);
    free(sn.blocks[0]);
    free(sn.blocks[1]);
    free(sn.conv);
    free(sn.tail);
    return st ? engine_fail(st, msg) : CELLM_OK;
}

/* --------------------------------------------------------------- restore */

typedef struct reader {
    const uint8_t *p;
    size_t left;
    bool short_read;
} reader;

static const uint8_t *take(reader *r, size_t n) {
    if (r->short_read || n > r->left) {
        r->short_read = true;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    r->left -= n;
    return p;
}

static uint32_t get_u32(reader *r) {
    const uint8_t *b = take(r, 4);
    if (!b) return 0;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static uint64_t get_u64(reader *r) {
    uint64_t lo = get_u32(r);
    return lo | (uint64_t)get_u32(r) << 32;
}

/* What restore hands to the engine thread. */
typedef struct restore_job {
    cellm_session *s;
    const ses_parsed *f;
    bool no_room;
    int32_t need, free_blocks; /* of the group that lacked room */
} restore_job;

static void restore_kv(cellm_engine *e, void *arg) {
    restore_job *j = arg;
    const ses_parsed *f = j->f;
    kv_cache *c = e->kv;
    kv_seq *q = &j->s->seq;
    /* Room first: idle sessions' kept blocks give way, as for a request. */
    for (;;) {
        bool fits = true;
        for (int32_t g = 0; g < c->n_groups && fits; g++) {
            fits = f->count[g] <= c->groups[g].n_free;
            j->need = f->count[g];
            j->free_blocks = c->groups[g].n_free;
        }
        if (fits) break;
        if (!session_drop_lru(e)) {
            j->no_room = true;
            return;
        }
    }
    for (int32_t g = 0; g < c->n_groups; g++)
        for (int32_t i = 0; i < f->count[g]; i++)
            (void)kv_seq_set_block(c, q, g, f->first[g] + i,
                                   f->blocks[g] + (size_t)i * c->groups[g].block_bytes);
    if (f->conv) memcpy(q->conv, f->conv, c->conv_floats * sizeof *q->conv);
    if (f->tail) memcpy(q->tail, f->tail, c->tail_elems * sizeof *q->tail);
    for (int32_t i = 0; i < f->n_pos; i++) {
        const uint8_t *b = f->tokens + 4 * (size_t)i;
        j->s->kept[i] = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                                  (uint32_t)b[3] << 24);
    }
    q->n_pos = f->n_pos;
    q->tail_lo = kv_recent_floor(f->n_pos); /* what a window type's tail surely holds */
    q->tokens = j->s->kept;
    kv_seq_trim(c, q); /* its full blocks go into the prefix cache */
    session_keep(e, j->s);
}

/* Reads the whole file at `path` into *buf, refusing one larger than
 * `limit` bytes. */
static cellm_status read_file(const char *path, size_t limit, uint8_t **buf, size_t *len, char *msg,
                              size_t cap) {
    *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, cap, "cannot open %s: %s", path, strerror(errno));
        return CELLM_ERR_IO;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        snprintf(msg, cap, "%s is not a regular file", path);
        return CELLM_ERR_IO;
    }
    if ((uint64_t)st.st_size > (uint64_t)limit) {
        fclose(f);
        snprintf(msg, cap,
                 "%s has %lld bytes: more than a session of this engine can take (%zu); not a "
                 "session file of this engine",
                 path, (long long)st.st_size, limit);
        return CELLM_ERR_FORMAT;
    }
    size_t n = (size_t)st.st_size;
    uint8_t *b = malloc(n ? n : 1);
    if (!b) {
        fclose(f);
        snprintf(msg, cap, "out of memory for %zu bytes", n);
        return CELLM_ERR_NO_MEMORY;
    }
    size_t got = fread(b, 1, n, f);
    fclose(f);
    if (got != n) {
        free(b);
        snprintf(msg, cap, "cannot read %s", path);
        return CELLM_ERR_IO;
    }
    *buf = b;
    *len = n;
    return CELLM_OK;
}

cellm_status ses_parse(const ses_layout *lay, const uint8_t *buf, size_t len, ses_parsed *out,
                       char *msg, size_t cap) {
    memset(out, 0, sizeof *out);
    if (len < 8 || memcmp(buf, SES_MAGIC, 8) != 0) {
        snprintf(msg, cap, "not a cellm session file (no CELLMSES header)");
        return CELLM_ERR_FORMAT;
    }
    if (len < 8 + SHA256_DIGEST_SIZE) {
        snprintf(msg, cap, "the session file is truncated (%zu bytes)", len);
        return CELLM_ERR_CHECKSUM;
    }
    uint8_t sum[SHA256_DIGEST_SIZE];
    sha256_ctx h;
    sha256_init(&h);
    sha256_update(&h, buf, len - SHA256_DIGEST_SIZE);
    sha256_final(&h, sum);
    if (memcmp(sum, buf + len - SHA256_DIGEST_SIZE, SHA256_DIGEST_SIZE) != 0) {
        snprintf(msg, cap,
                 "the session file is damaged or truncated (its SHA-256 checksum does "
                 "not match)");
        return CELLM_ERR_CHECKSUM;
    }
    reader r = {buf + 8, len - 8 - SHA256_DIGEST_SIZE, false};
    uint32_t version = get_u32(&r);
    (void)get_u32(&r); /* flags */
    if (version != SES_VERSION) {
        snprintf(msg, cap, "session file version %u; this cellm reads version %d", version,
                 SES_VERSION);
        return CELLM_ERR_FORMAT;
    }
    const uint8_t *id = take(&r, SHA256_DIGEST_SIZE);
    if (id && memcmp(id, lay->id, sizeof lay->id) != 0) {
        snprintf(msg, cap, "the session file was saved from another model");
        return CELLM_ERR_FORMAT;
    }
    uint32_t kv_type = get_u32(&r), bt = get_u32(&r), ng = get_u32(&r);
    bool same = kv_type == lay->kv_type && bt == KV_BLOCK_TOKENS && ng == (uint32_t)lay->n_groups;
    for (uint32_t g = 0; g < ng && g < 2 && same; g++) {
        uint32_t nl = get_u32(&r), w = get_u32(&r);
        uint64_t bb = get_u64(&r);
        same = nl == (uint32_t)lay->n_layers[g] && w == (uint32_t)lay->window[g] &&
               bb == lay->block_bytes[g];
    }
    if (!r.short_read && !same) {
        snprintf(msg, cap,
                 "the session file was saved by an engine with another KV cache layout (KV type, "
                 "layers or block size differ)");
        return CELLM_ERR_FORMAT;
    }
    int32_t n_pos = (int32_t)get_u32(&r);
    uint32_t nm = get_u32(&r);
    if (r.short_read) goto truncated;
    if (n_pos < 0 || n_pos > lay->max_ctx) {
        snprintf(msg, cap, "the session holds %d positions; this engine's context is %d", n_pos,
                 lay->max_ctx);
        return CELLM_ERR_FORMAT;
    }
    if (nm > SES_MAX_MSGS) {
        snprintf(msg, cap, "the session file has %u messages (at most %d)", nm, SES_MAX_MSGS);
        return CELLM_ERR_FORMAT;
    }
    cellm_chat_message *msgs = calloc(nm ? nm : 1, sizeof *msgs);
    size_t *lens = calloc(nm ? nm : 1, sizeof *lens);
    out->msgs = msgs;
    out->lens = lens;
    if (!msgs || !lens) {
        snprintf(msg, cap, "out of memory");
        return CELLM_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < nm; i++) {
        const uint8_t *role = take(&r, 1);
        uint32_t n = get_u32(&r);
        const uint8_t *text = take(&r, n);
        if (!text) goto truncated;
        if (*role > 2) {
            snprintf(msg, cap, "message %u has an unknown role (%u)", i, *role);
            return CELLM_ERR_FORMAT;
        }
        if (memchr(text, 0, n)) {
            snprintf(msg, cap, "message %u holds a NUL byte", i);
            return CELLM_ERR_FORMAT;
        }
        msgs[i] = (cellm_chat_message){ses_roles[*role], (const char *)text};
        lens[i] = n;
    }
    out->n_msgs = (int32_t)nm;
    out->n_pos = n_pos;
    out->tokens = take(&r, 4 * (size_t)n_pos);
    if (!out->tokens) goto truncated;
    int32_t n_vocab = lay->n_vocab;
    for (int32_t i = 0; i < n_pos; i++) {
        const uint8_t *b = out->tokens + 4 * (size_t)i;
        int64_t t = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                              (uint32_t)b[3] << 24);
        if (t < 0 || t >= n_vocab) {
            snprintf(msg, cap, "kept token %d is %lld, not in 0..%d", i, (long long)t, n_vocab - 1);
            return CELLM_ERR_FORMAT;
        }
    }
    int32_t end = (n_pos + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    for (int32_t g = 0; g < lay->n_groups; g++) {
        int32_t first = (int32_t)get_u32(&r);
        uint32_t count = get_u32(&r);
        if (r.short_read) goto truncated;
        /* Exactly the blocks the forward pass will read. */
        int32_t want_first = n_pos > 0 ? kv_first_block(lay->window[g], n_pos) : 0;
        if (count != (uint32_t)(end - want_first) || (count > 0 && first != want_first)) {
            snprintf(msg, cap,
                     "the session file's group %d has blocks %d..+%u; %d positions need %d..%d", g,
                     first, count, n_pos, want_first, end - 1);
            return CELLM_ERR_FORMAT;
        }
        out->first[g] = want_first;
        out->count[g] = (int32_t)count;
        if (lay->block_bytes[g] > SIZE_MAX / (count ? count : 1)) goto truncated;
        out->blocks[g] = take(&r, (size_t)count * (size_t)lay->block_bytes[g]);
        if (!out->blocks[g]) goto truncated;
    }
    if (lay->conv_bytes && !(out->conv = take(&r, (size_t)lay->conv_bytes))) goto truncated;
    if (lay->tail_bytes && !(out->tail = take(&r, (size_t)lay->tail_bytes))) goto truncated;
    if (r.left != 0) {
        snprintf(msg, cap, "the session file has %zu bytes after its blocks", r.left);
        return CELLM_ERR_FORMAT;
    }
    return CELLM_OK;
truncated:
    snprintf(msg, cap, "the session file ends too early");
    return CELLM_ERR_FORMAT;
}

void ses_parsed_free(ses_parsed *p) {
    free(p->msgs);
    free(p->lens);
    p->msgs = NULL;
    p->lens = NULL;
}

size_t ses_max_bytes(const ses_layout *lay) {
    size_t n = 256 + SES_MAX_TEXT + (size_t)SES_MAX_MSGS * 5 + 4 * (size_t)lay->max_ctx;
    size_t blocks = ((size_t)lay->max_ctx + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS;
    for (int32_t g = 0; g < lay->n_groups; g++) n += blocks * (size_t)lay->block_bytes[g] + 8;
    return n + (size_t)lay->conv_bytes + (size_t)lay->tail_bytes;
}

/* The layout of an engine. */
static void layout_of(const cellm_engine *e, ses_layout *lay) {
    memset(lay, 0, sizeof *lay);
    model_identity(e->model, lay->id);
    lay->kv_type = (uint32_t)e->p.kv_type;
    lay->n_groups = e->kv->n_groups;
    for (int32_t g = 0; g < lay->n_groups; g++) {
        lay->n_layers[g] = e->kv->groups[g].n_layers;
        lay->window[g] = e->kv->groups[g].window;
        lay->block_bytes[g] = e->kv->groups[g].block_bytes;
    }
    lay->max_ctx = e->kv->max_ctx;
    lay->n_vocab = e->model->m->n_vocab;
    lay->conv_bytes = e->kv->conv_floats * sizeof(float);
    lay->tail_bytes = e->kv->tail_elems * sizeof(uint16_t);
}

cellm_status cellm_session_restore(cellm_engine *e, const char *path,
                                   const cellm_session_params *params, cellm_session **out) {
    if (!out) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_restore: out is NULL");
    *out = NULL;
    if (!e || !path)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_restore: a NULL argument");
    if (engine_on_thread(e))
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_session_restore called from a callback");
    if (e->kv->ext.copy)
        return engine_fail(CELLM_ERR_UNSUPPORTED,
                           "session files need the KV cache in host memory, and this engine "
                           "keeps it on its GPU");
    if (params) {
        cellm_status st = engine_check_sampling(&params->sampling);
        if (st) return st;
    }
    ses_layout lay;
    layout_of(e, &lay);
    char msg[CELLM_ERR_MSG_MAX] = "";
    uint8_t *buf = NULL;
    size_t len = 0;
    ses_parsed f;
    memset(&f, 0, sizeof f);
    cellm_session *s = NULL;
    cellm_status st = read_file(path, ses_max_bytes(&lay), &buf, &len, msg, sizeof msg);
    if (!st) st = ses_parse(&lay, buf, len, &f, msg, sizeof msg);
    if (st) goto fail;
    /* NUL-terminated copies of the message texts for the session. */
    size_t text = 0;
    for (int32_t i = 0; i < f.n_msgs; i++) text += f.lens[i] + 1;
    if (text > SES_MAX_TEXT) {
        st = CELLM_ERR_FORMAT;
        snprintf(msg, sizeof msg, "the session's messages hold %zu bytes (at most %zu)", text,
                 SES_MAX_TEXT);
        goto fail;
    }
    char *texts = malloc(text ? text : 1);
    if (!texts) {
        st = CELLM_ERR_NO_MEMORY;
        snprintf(msg, sizeof msg, "out of memory");
        goto fail;
    }
    size_t at = 0;
    for (int32_t i = 0; i < f.n_msgs; i++) {
        memcpy(texts + at, f.msgs[i].content, f.lens[i]);
        texts[at + f.lens[i]] = '\0';
        f.msgs[i].content = texts + at;
        at += f.lens[i] + 1;
    }
    st = session_new_with(e, params, f.msgs, f.n_msgs, &s);
    free(texts);
    if (st) {
        snprintf(msg, sizeof msg, "%s", cellm_last_error());
        goto fail;
    }
    if (f.n_pos > 0) {
        restore_job j = {s, &f, false, 0, 0};
        engine_run_job(e, restore_kv, &j);
        if (j.no_room) {
            st = CELLM_ERR_NO_MEMORY;
            snprintf(msg, sizeof msg,
                     "the KV cache has no room for the session's %d positions: they take %d "
                     "blocks, %d are free (running requests hold the rest, or the budget is "
                     "smaller than the one that saved it)",
                     f.n_pos, j.need, j.free_blocks);
            goto fail;
        }
    }
    free(buf);
    ses_parsed_free(&f);
    *out = s;
    return CELLM_OK;
fail:
    free(buf);
    ses_parsed_free(&f);
    cellm_session_free(s);
    return engine_fail(st, msg);
}

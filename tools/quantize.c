/*
 * quantize.c — `cellm quantize`: re-quantize a GGUF model (see quantize.h).
 *
 * Which type each tensor gets follows llama.cpp's llama-quant.cpp for the
 * targets we offer, so our files are laid out as llama.cpp's would be:
 * - only tensors whose name ends in "weight", with two or more dimensions,
 *   that are not norms (and not a few small special tensors), are
 *   quantized; the rest are copied as they are;
 * - output.weight, or token_embd.weight when the model ties its output to
 *   the embeddings, gets Q6_K (Q8_0 stays Q8_0; Q8_0 too when its rows are
 *   not a whole number of the target's blocks);
 * - in Q4_K_M and Q5_K_M, attn_v and ffn_down get Q6_K in the layers
 *   use_more_bits() picks (the first and last eighth, and every third layer
 *   between), attn_qkv gets Q5_K (Q4_K_M) or Q6_K (Q5_K_M); 8-expert models
 *   keep attn_v and attn_k at Q8_0 and, in Q4_K_M, attn_output at Q5_K;
 * - a row length the type's blocks do not divide falls back: Q4_K → Q5_0,
 *   Q5_K → Q5_1, Q6_K → Q8_0, then F16 if that still does not divide; the
 *   32-element types have no fallback and the file is refused.
 * The counters use llama.cpp's tensor order (by layer number, then name),
 * so "every third layer" picks the same layers.
 *
 * Quantized data is made in memory (the writer borrows it), with the rows
 * of each tensor split over a few threads; copied tensors are borrowed
 * straight from the input's map.
 */
#include "quantize.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "format/gguf.h"
#include "store.h"

static const quantize_ftype ftypes[] = {
    {"Q4_0", 2, QT_Q4_0, false},   {"Q4_1", 3, QT_Q4_1, false},  {"Q5_0", 8, QT_Q5_0, false},
    {"Q5_1", 9, QT_Q5_1, false},   {"Q8_0", 7, QT_Q8_0, false},  {"Q4_K_M", 15, QT_Q4_K, true},
    {"Q5_K_M", 17, QT_Q5_K, true}, {"Q6_K", 18, QT_Q6_K, false}, {"F16", 1, QT_F16, false},
};

#define N_FTYPES (sizeof ftypes / sizeof ftypes[0])
#define GGML_QNT_VERSION 2 /* general.quantization_version llama.cpp writes */

const quantize_ftype *quantize_ftype_by_name(const char *name) {
    for (size_t i = 0; name && i < N_FTYPES; i++)
        if (!strcasecmp(ftypes[i].name, name)) return &ftypes[i];
    return NULL;
}

/* The tensor types --output-type takes, for messages. */
#define OUTPUT_TYPE_NAMES "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K or F16"

const char *quantize_ftype_names(void) {
    return "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K_M Q5_K_M Q6_K F16";
}

/* ---- choosing each tensor's type ---- */

typedef struct plan_state {
    const quantize_ftype *ft;
    bool has_output;
    int n_attn_v, i_attn_v;
    int n_layer, i_ffn_down;
    int n_expert;
} plan_state;

/* Layer number of "blk.N.…", or -1. */
static int layer_of(const char *name) {
    if (strncmp(name, "blk.", 4) != 0) return -1;
    const char *p = name + 4;
    if (*p < '0' || *p > '9') return -1;
    long v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > 1000000) return -1;
    }
    return *p == '.' ? (int)v : -1;
}

static bool has(const char *s, const char *part) {
    return strstr(s, part) != NULL;
}

static bool ends_with(const char *s, const char *tail) {
    const size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

/* llama.cpp's test for "quantize this tensor at all". */
static bool is_quantizable(const char *name, uint32_t n_dims) {
    static const char *const never[] = {
        "_norm.weight",
        "ffn_gate_inp.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d.weight",
        "shortconv.conv.weight",
        "time_mix_",
        "attn_rel_b.weight",
    };
    if (!ends_with(name, "weight") || n_dims < 2) return false;
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if (has(name, never[i])) return false;
    return strcmp(name, "position_embd.weight") && strcmp(name, "token_types.weight");
}

/* Layers that get more bits in the _M mixes. */
static bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
           (i_layer - n_layers / 8) % 3 == 2;
}

static uint32_t block_of(uint32_t type) {
    return quant_type_get(type)->block_size;
}

/* The type for one quantizable tensor; advances the layer counters. Sets
 * *fallback when the row length forced a fallback type. */
static cellm_status choose_type(plan_state *s, const char *name, uint64_t ne0, uint32_t *out,
                                bool *fallback, cellm_error *err) {
    const quantize_ftype *ft = s->ft;
    uint32_t t = ft->base_type;
    const bool m = ft->mix_m;
    *fallback = false;
    if (t == QT_F16) {
        /* Unquantized: every matrix in F16, as llama.cpp's MOSTLY_F16 (a
         * quantized input is expanded, no precision comes back). */
        *out = t;
        return CELLM_OK;
    }
    if (!strcmp(name, "output.weight") || (!s->has_output && !strcmp(name, "token_embd.weight"))) {
        if (ne0 % block_of(t) != 0)
            t = QT_Q8_0;
        else if (t != QT_Q8_0)
            t = QT_Q6_K;
    } else if (!strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight")) {
        /* no rule for our targets */
    } else if (has(name, "attn_v.weight")) {
        if (m && use_more_bits(s->i_attn_v, s->n_attn_v)) t = QT_Q6_K;
        if (s->n_expert == 8) t = QT_Q8_0;
        s->i_attn_v++;
    } else if (has(name, "attn_k.weight")) {
        if (s->n_expert == 8) t = QT_Q8_0;
    } else if (has(name, "ffn_down")) {
        /* Experts are not stored in layer order: take the layer from the
         * name, as llama.cpp does. */
        const int i_layer = s->n_expert > 1 ? layer_of(name) : s->i_ffn_down;
        if (i_layer < 0 || i_layer >= s->n_layer)
            return err_set(err, CELLM_ERR_FORMAT, "tensor %s: layer out of range 0..%d", name,
                           s->n_layer - 1);
        if (m && use_more_bits(i_layer, s->n_layer)) t = QT_Q6_K;
        s->i_ffn_down++;
    } else if (has(name, "attn_output.weight")) {
        if (s->n_expert == 8 && ft->base_type == QT_Q4_K) t = QT_Q5_K;
    } else if (has(name, "attn_qkv.weight")) {
        if (m) t = ft->base_type == QT_Q4_K ? QT_Q5_K : QT_Q6_K;
    }
    if (ne0 % block_of(t) != 0) {
        switch (t) {
        case QT_Q4_K: t = QT_Q5_0; break;
        case QT_Q5_K: t = QT_Q5_1; break;
        case QT_Q6_K: t = QT_Q8_0; break;
        default:
            return err_set(err, CELLM_ERR_UNSUPPORTED,
                           "tensor %s: rows of %llu elements are not a whole number of %s blocks "
                           "(%u), and %s has no fallback (llama.cpp refuses this too)",
                           name, (unsigned long long)ne0, quant_type_get(t)->name, block_of(t),
                           ft->name);
        }
        if (ne0 % block_of(t) != 0) t = QT_F16;
        *fallback = true;
    }
    *out = t;
    return CELLM_OK;
}

/* llama.cpp's tensor order: tensors outside the layers first, then by
 * layer number, each group by name (bytewise). */
typedef struct tensor_ref {
    const char *name;
    int layer;
    size_t index; /* in the input file */
} tensor_ref;

static int tensor_ref_cmp(const void *a, const void *b) {
    const tensor_ref *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* ---- the conversion ---- */

typedef struct job {
    const gguf_tensor *src;
    uint32_t dst_type;
    void *dst;
    uint64_t row0, row1; /* rows [row0, row1) of the tensor */
    cellm_status status;
} job;

/* Dequantizes and quantizes rows [row0, row1) in chunks of whole rows. */
static void *run_job(void *arg) {
    job *j = arg;
    const quant_type_info *si = quant_type_get(j->src->type), *di = quant_type_get(j->dst_type);
    const uint64_t ne0 = j->src->ne[0];
    const size_t src_row = (size_t)(ne0 / si->block_size * si->type_size);
    const size_t dst_row = (size_t)(ne0 / di->block_size * di->type_size);
    uint64_t chunk = 65536 / ne0 ? 65536 / ne0 : 1; /* about 256 KiB of floats */
    float *buf = malloc((size_t)(chunk * ne0) * sizeof(float));
    if (!buf) {
        j->status = CELLM_ERR_NO_MEMORY;
        return NULL;
    }
    for (uint64_t r = j->row0; r < j->row1; r += chunk) {
        const uint64_t n = j->row1 - r < chunk ? j->row1 - r : chunk;
        si->to_float((const uint8_t *)j->src->data + r * src_row, buf, (size_t)(n * ne0));
        di->from_float(buf, (uint8_t *)j->dst + r * dst_row, (size_t)(n * ne0));
    }
    free(buf);
    j->status = CELLM_OK;
    return NULL;
}

/* Converts one tensor into `dst` with up to n_threads threads. */
static cellm_status convert_tensor(const gguf_tensor *t, uint32_t dst_type, void *dst,
                                   unsigned n_threads, cellm_error *err) {
    enum { MAX_THREADS = 64 };
    job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    const uint64_t rows = t->n_elems / t->ne[0];
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads > rows) n_threads = (unsigned)rows;
    if (n_threads == 0) n_threads = 1;
    unsigned started = 0;
    for (unsigned i = 0; i < n_threads; i++) {
        jobs[i] = (job){
            t, dst_type, dst, rows * i / n_threads, rows * (i + 1) / n_threads, CELLM_ERR_INTERNAL};
    }
    /* Thread 0's share runs here; the others on their own threads, or
     * here too when a thread cannot start. */
    for (unsigned i = 1; i < n_threads; i++) {
        if (pthread_create(&tid[i], NULL, run_job, &jobs[i]) != 0) break;
        started = i;
    }
    run_job(&jobs[0]);
    for (unsigned i = 1; i <= started; i++) pthread_join(tid[i], NULL);
    for (unsigned i = started + 1; i < n_threads; i++) run_job(&jobs[i]);
    for (unsigned i = 0; i < n_threads; i++)
        if (jobs[i].status != CELLM_OK)
            return err_set(err, jobs[i].status, "out of memory converting a tensor");
    return CELLM_OK;
}

/* Tensor t (called `name`) converted to `type` in a new buffer, *out
 * (the caller frees it, also on failure). */
static cellm_status convert_new(const gguf_tensor *t, const char *name, uint32_t type,
                                unsigned n_threads, void **out, cellm_error *err) {
    const quant_type_info *si = quant_type_get(t->type);
    if (!si || !si->to_float)
        return err_set(err, CELLM_ERR_UNSUPPORTED, "tensor %s: cannot dequantize type %s", name,
                       si ? si->name : "?");
    uint64_t bytes;
    if (!quant_nbytes(type, t->n_elems, &bytes) || bytes > SIZE_MAX ||
        !(*out = malloc(bytes ? (size_t)bytes : 1)))
        return err_set(err, CELLM_ERR_NO_MEMORY, "tensor %s: out of memory (%llu bytes)", name,
                       (unsigned long long)bytes);
    return convert_tensor(t, type, *out, n_threads, err);
}

static char *cstr(gguf_str s) {
    char *p = malloc((size_t)s.len + 1);
    if (p) {
        memcpy(p, s.ptr, (size_t)s.len);
        p[s.len] = '\0';
    }
    return p;
}

/* Everything quantize_file allocates, freed in one place. */
typedef struct qctx {
    gguf_file *in;
    gguf_writer *w;
    tensor_ref *refs;
    char **names;
    void **bufs;
    size_t n;
    void *head; /* the output.weight copy of tied embeddings (--output-type) */
} qctx;

static void qctx_free(qctx *c) {
    for (size_t i = 0; i < c->n; i++) {
        if (c->names) free(c->names[i]);
        if (c->bufs) free(c->bufs[i]);
    }
    free(c->names);
    free(c->bufs);
    free(c->head);
    free(c->refs);
    gguf_writer_free(c->w);
    gguf_close(c->in);
}

/* Copies every metadata key and sets the file type. */
static cellm_status copy_metadata(qctx *c, const quantize_ftype *ft, cellm_error *err) {
    for (uint64_t i = 0; i < c->in->n_kv; i++) {
        const gguf_kv *kv = &c->in->kv[i];
        char *key = cstr(kv->key);
        if (!key) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        const cellm_status st = gguf_writer_set(c->w, key, &kv->value, err);
        free(key);
        if (st != CELLM_OK) return st;
    }
    cellm_status st =
        gguf_writer_set_u32(c->w, "general.quantization_version", GGML_QNT_VERSION, err);
    if (st == CELLM_OK) st = gguf_writer_set_u32(c->w, "general.file_type", ft->file_type, err);
    return st;
}

/* The model's layer count: <arch>.block_count, else one past the largest
 * blk.N in the tensor names. */
static int count_layers(const gguf_file *f, const tensor_ref *refs, size_t n, int *n_expert) {
    gguf_str arch;
    uint64_t v;
    char key[160];
    *n_expert = 1;
    if (gguf_get_str(f, "general.architecture", &arch) && arch.len < 64) {
        snprintf(key, sizeof key, "%.*s.expert_count", (int)arch.len, arch.ptr);
        if (gguf_get_uint(f, key, &v) && v > 0 && v < 1u << 20) *n_expert = (int)v;
        snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.ptr);
        if (gguf_get_uint(f, key, &v) && v > 0 && v < 1000000) return (int)v;
    }
    int max = -1;
    for (size_t i = 0; i < n; i++)
        if (refs[i].layer > max) max = refs[i].layer;
    return max + 1;
}

/* On a terminal, one line rewritten per tensor; in a log, a line at each
 * quarter of the tensors. */
static void progress_line(const quantize_params *p, size_t k, size_t n, const char *name,
                          uint32_t from, uint32_t to) {
    if (!p->progress) return;
    if (isatty(STDERR_FILENO)) {
        fprintf(stderr, "\rquantize: [%4zu/%4zu] %-40.40s %6s -> %-6s", k, n, name,
                quant_type_get(from)->name, quant_type_get(to)->name);
        if (k == n) fputc('\n', stderr);
    } else if (k == n || (k * 4 / n) != ((k - 1) * 4 / n)) {
        fprintf(stderr, "quantize: %zu/%zu tensors\n", k, n);
    }
    fflush(stderr);
}

/* Whether output_type can hold t's rows. */
static cellm_status check_output_type(const gguf_tensor *t, uint32_t type, cellm_error *err) {
    const quant_type_info *ti = quant_type_get(type);
    if (!ti || !ti->from_float)
        return err_set(err, CELLM_ERR_UNSUPPORTED, "--output-type: cannot quantize to %s",
                       ti ? ti->name : "an unknown type");
    if (t->ne[0] % ti->block_size != 0)
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "--output-type %s: the output's rows of %llu elements are not a whole "
                       "number of its blocks (%u)",
                       ti->name, (unsigned long long)t->ne[0], (unsigned)ti->block_size);
    return CELLM_OK;
}

/* output.weight as a copy of the tied embeddings `te` in p->output_type. */
static cellm_status add_head_copy(qctx *c, const gguf_tensor *te, const quantize_params *p,
                                  quantize_stats *stats, cellm_error *err) {
    cellm_status st = check_output_type(te, p->output_type, err);
    if (st == CELLM_OK)
        st = convert_new(te, "token_embd.weight", p->output_type, p->n_threads, &c->head, err);
    if (st != CELLM_OK) return st;
    uint64_t bytes = 0;
    (void)quant_nbytes(p->output_type, te->n_elems, &bytes);
    stats->n_tensors++;
    stats->n_quantized++;
    stats->bytes_out += bytes;
    stats->count_by_type[p->output_type]++;
    stats->output_copied = true;
    return gguf_writer_add_tensor(c->w, "output.weight", p->output_type, te->n_dims, te->ne,
                                  c->head, err);
}

cellm_status quantize_file(const char *in_path, const char *out_path, const quantize_ftype *ft,
                           const quantize_params *params, quantize_stats *stats, cellm_error *err) {
    quantize_params p = params ? *params : (quantize_params){0};
    if (p.n_threads == 0) p.n_threads = 2;
    quantize_stats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (!ft) return err_set(err, CELLM_ERR_INVALID_ARG, "no target type");

    qctx c = {0};
    cellm_status st = gguf_open(in_path, &c.in, err);
    if (st != CELLM_OK) return st;
    c.n = (size_t)c.in->n_tensors;
    c.w = gguf_writer_new();
    c.refs = calloc(c.n ? c.n : 1, sizeof *c.refs);
    c.names = calloc(c.n ? c.n : 1, sizeof *c.names);
    c.bufs = calloc(c.n ? c.n : 1, sizeof *c.bufs);
    if (!c.w || !c.refs || !c.names || !c.bufs) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        goto done;
    }
    if ((st = copy_metadata(&c, ft, err)) != CELLM_OK) goto done;

    plan_state ps = {.ft = ft};
    for (size_t i = 0; i < c.n; i++) {
        if (!(c.names[i] = cstr(c.in->tensors[i].name))) {
            st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
            goto done;
        }
        c.refs[i] = (tensor_ref){c.names[i], layer_of(c.names[i]), i};
        if (has(c.names[i], "attn_v.weight") || has(c.names[i], "attn_qkv.weight") ||
            has(c.names[i], "attn_kv_b.weight"))
            ps.n_attn_v++;
        else if (!strcmp(c.names[i], "output.weight"))
            ps.has_output = true;
    }
    qsort(c.refs, c.n, sizeof *c.refs, tensor_ref_cmp);
    ps.n_layer = count_layers(c.in, c.refs, c.n, &ps.n_expert);

    for (size_t k = 0; k < c.n; k++) {
        const size_t i = c.refs[k].index;
        const gguf_tensor *t = &c.in->tensors[i];
        const char *name = c.names[i];
        uint32_t type = t->type;
        bool fallback = false;
        if (is_quantizable(name, t->n_dims)) {
            if ((st = choose_type(&ps, name, t->ne[0], &type, &fallback, err)) != CELLM_OK)
                goto done;
            if (p.output_type_set && !strcmp(name, "output.weight")) {
                if ((st = check_output_type(t, p.output_type, err)) != CELLM_OK) goto done;
                type = p.output_type;
                fallback = false;
            }
        }
        const void *data = t->data;
        if (type != t->type) {
            progress_line(&p, k + 1, c.n, name, t->type, type);
            if ((st = convert_new(t, name, type, p.n_threads, &c.bufs[i], err)) != CELLM_OK)
                goto done;
            data = c.bufs[i];
            stats->n_quantized++;
            stats->n_fallback += fallback;
        } else {
            progress_line(&p, k + 1, c.n, name, t->type, type);
        }
        uint64_t out_bytes = 0;
        (void)quant_nbytes(type, t->n_elems, &out_bytes);
        stats->bytes_in += t->size;
        stats->bytes_out += out_bytes;
        stats->count_by_type[type]++;
        stats->n_tensors++;
        st = gguf_writer_add_tensor(c.w, name, type, t->n_dims, t->ne, data, err);
        if (st != CELLM_OK) goto done;
        if (p.output_type_set && !ps.has_output && !strcmp(name, "token_embd.weight")) {
            if ((st = add_head_copy(&c, t, &p, stats, err)) != CELLM_OK) goto done;
        }
    }
    if (p.progress && c.n == 0) fputc('\n', stderr);
    st = gguf_writer_write(c.w, out_path, err);
done:
    qctx_free(&c);
    return st;
}

/* ---- the command ---- */

static void usage(FILE *out) {
    fprintf(out,
            "usage: cellm quantize IN OUT TYPE [--output-type T] [--threads N]\n\n"
            "Re-quantizes the GGUF model IN (a path or a model store name) into OUT.\n"
            "TYPE is one of: %s.\n"
            "Tensors get the types llama.cpp's rules give them (output and tied\n"
            "embeddings at Q6_K; in the _M mixes, some attn_v and ffn_down layers at\n"
            "Q6_K; fallbacks for rows the blocks do not divide); norms stay as they are.\n"
            "  --output-type T  the output matrix in tensor type T instead of the rules'\n"
            "                (" OUTPUT_TYPE_NAMES ");\n"
            "                a model whose output is tied to its embeddings gets a copy\n"
            "                in T, so the classifier reads fewer bytes a token and the\n"
            "                embeddings keep theirs\n"
            "  --threads N   threads converting each tensor (default 2)\n",
            quantize_ftype_names());
}

/* True when `a` and `b` name the same existing file. */
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

int cmd_quantize(int argc, char **argv) {
    const char *pos[3] = {NULL, NULL, NULL};
    int n_pos = 0;
    quantize_params params = {.n_threads = 2, .progress = true};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        unsigned long long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (i + 1 >= argc || !cli_parse_uint(argv[++i], 64, &v) || v == 0) {
                cli_error("--threads needs a count from 1 to 64");
                return 2;
            }
            params.n_threads = (unsigned)v;
        } else if (!strcmp(a, "--output-type")) {
            uint32_t ty;
            const quant_type_info *ti = i + 1 < argc ? quant_type_by_name(argv[++i], &ty) : NULL;
            if (!ti || !ti->from_float) {
                cli_error("--output-type needs a tensor type: " OUTPUT_TYPE_NAMES);
                return 2;
            }
            params.output_type_set = true;
            params.output_type = ty;
        } else if (a[0] == '-' && a[1] != '\0') {
            cli_error("quantize: unknown option '%s' (see `cellm quantize --help`)", a);
            return 2;
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            cli_error("quantize: too many arguments ('%s')", a);
            return 2;
        }
    }
    if (n_pos != 3) {
        usage(stderr);
        return 2;
    }
    const quantize_ftype *ft = quantize_ftype_by_name(pos[2]);
    if (!ft) {
        cli_error("quantize: unknown type '%s' (one of: %s)", pos[2], quantize_ftype_names());
        return 2;
    }
    char in[4096];
    cellm_error err;
    if (store_resolve(pos[0], true, in, sizeof in, &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        return 1;
    }
    if (same_file(in, pos[1])) {
        cli_error("quantize: OUT is the input file; write to another path");
        return 2;
    }
    quantize_stats s;
    if (quantize_file(in, pos[1], ft, &params, &s, &err) != CELLM_OK) {
        if (params.progress && isatty(STDERR_FILENO)) fputc('\n', stderr);
        cli_error("quantize: %s", err.msg);
        return 1;
    }
    printf("wrote %s (%s): %llu tensors, %llu re-quantized (%llu with a fallback type), "
           "%.1f MiB -> %.1f MiB of tensor data\n",
           pos[1], ft->name, (unsigned long long)s.n_tensors, (unsigned long long)s.n_quantized,
           (unsigned long long)s.n_fallback, (double)s.bytes_in / (1 << 20),
           (double)s.bytes_out / (1 << 20));
    if (s.output_copied)
        printf("output.weight: a %s copy of the tied token_embd.weight\n",
               quant_type_get(params.output_type)->name);
    printf("types:");
    for (uint32_t t = 0; t < QT_COUNT; t++)
        if (s.count_by_type[t])
            printf(" %s %llu", quant_type_get(t)->name, (unsigned long long)s.count_by_type[t]);
    printf("\n");
    return 0;
}

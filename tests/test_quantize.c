/*
 * test_quantize.c — `cellm quantize`: on a small model-shaped GGUF made
 * here, the type each tensor gets (llama.cpp's rules: output at Q6_K, the
 * _M layers, fallbacks, norms untouched), shapes, metadata copied with the
 * new file type, values close to the input, refusals and the command's
 * exit codes; on SmolLM2, a Q8_0 file that loads and whose every tensor
 * dequantizes close to the original, and --output-type's copy of its tied
 * embeddings.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>

#include <cmocka.h>
#include <math.h>

#include "format/gguf.h"
#include "format/quant.h"
#include "quantize.h"
#include "test_common.h"

static char tmpdir[] = "/tmp/cellm-test-quantize-XXXXXX";

static int setup(void **state) {
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s", tmpdir, name);
    return buf;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static float rnd_normal(void) {
    float s = 0;
    for (int i = 0; i < 12; i++) {
        rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
        s += (float)((rng * 0x2545F4914F6CDD1Dull) >> 40) * 0x1p-24f;
    }
    return s - 6.0f;
}

/* The small model: one layer of a llama-shaped file. */
typedef struct small_tensor {
    const char *name;
    uint32_t type; /* stored type; made from random floats */
    uint32_t n_dims;
    uint64_t ne[2];
    uint32_t want_q4km, want_q4_0; /* the types Q4_K_M and Q4_0 must give it */
} small_tensor;

static const small_tensor small[] = {
    {"token_embd.weight", QT_F32, 2, {512, 16}, QT_Q4_K, QT_Q4_0},
    {"output.weight", QT_F16, 2, {512, 16}, QT_Q6_K, QT_Q6_K},
    {"output_norm.weight", QT_F32, 1, {512, 1}, QT_F32, QT_F32},
    {"blk.0.attn_norm.weight", QT_F32, 1, {512, 1}, QT_F32, QT_F32},
    /* One layer: use_more_bits(0, 1) is true, so the _M rules apply. */
    {"blk.0.attn_v.weight", QT_F32, 2, {512, 8}, QT_Q6_K, QT_Q4_0},
    {"blk.0.ffn_down.weight", QT_F32, 2, {512, 8}, QT_Q6_K, QT_Q4_0},
    /* 96 is not a whole number of 256: Q4_K falls back to Q5_0. */
    {"blk.0.attn_q.weight", QT_F32, 2, {96, 4}, QT_Q5_0, QT_Q4_0},
    /* Already quantized: dequantized, then quantized again. */
    {"blk.0.ffn_up.weight", QT_Q8_0, 2, {512, 8}, QT_Q4_K, QT_Q4_0},
    /* Not a tensor llama.cpp quantizes (no "weight" at the end). */
    {"blk.0.rope_freqs", QT_F32, 2, {64, 2}, QT_F32, QT_F32},
};
#define N_SMALL (sizeof small / sizeof small[0])

/* 40 divides by neither 256 nor 32: Q4_K → Q5_0 → F16; Q4_0 refuses. */
static const small_tensor odd = {"blk.0.ffn_gate.weight", QT_F32, 2, {40, 2}, QT_F16, 0};

static float *small_floats[N_SMALL + 1];

/* Writes the small model (with the odd tensor when `with_odd`). */
static void write_small(const char *path, bool with_odd) {
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    cellm_error e;
    assert_int_equal(gguf_writer_set_str(w, "general.architecture", "llama", &e), CELLM_OK);
    assert_int_equal(gguf_writer_set_str(w, "general.name", "tiny test model", &e), CELLM_OK);
    assert_int_equal(gguf_writer_set_u32(w, "general.file_type", 0, &e), CELLM_OK);
    assert_int_equal(gguf_writer_set_u32(w, "llama.block_count", 1, &e), CELLM_OK);
    assert_int_equal(gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f, &e), CELLM_OK);
    gguf_str toks[3] = {{"<s>", 3}, {"hello", 5}, {"\xe2\x96\x81world", 8}};
    gguf_value v = {.type = GGUF_TYPE_ARRAY};
    v.v.arr.type = GGUF_TYPE_STRING;
    v.v.arr.n = 3;
    v.v.arr.strs = toks;
    assert_int_equal(gguf_writer_set(w, "tokenizer.ggml.tokens", &v, &e), CELLM_OK);
    static const float scores[3] = {0.0f, -1.5f, -2.25f};
    memset(&v, 0, sizeof v);
    v.type = GGUF_TYPE_ARRAY;
    v.v.arr.type = GGUF_TYPE_FLOAT32;
    v.v.arr.n = 3;
    v.v.arr.data = scores;
    assert_int_equal(gguf_writer_set(w, "tokenizer.ggml.scores", &v, &e), CELLM_OK);

    void *bufs[N_SMALL + 1] = {0};
    for (size_t i = 0; i < N_SMALL + with_odd; i++) {
        const small_tensor *t = i < N_SMALL ? &small[i] : &odd;
        const size_t n = (size_t)(t->ne[0] * t->ne[1]);
        free(small_floats[i]);
        small_floats[i] = malloc(n * sizeof(float));
        assert_non_null(small_floats[i]);
        for (size_t j = 0; j < n; j++) small_floats[i][j] = rnd_normal() * 0.05f;
        uint64_t bytes;
        assert_true(quant_nbytes(t->type, n, &bytes));
        bufs[i] = malloc((size_t)bytes);
        assert_non_null(bufs[i]);
        quant_type_get(t->type)->from_float(small_floats[i], bufs[i], n);
        /* Compare later against what the file really holds. */
        quant_type_get(t->type)->to_float(bufs[i], small_floats[i], n);
        assert_int_equal(gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, bufs[i], &e),
                         CELLM_OK);
    }
    assert_int_equal(gguf_writer_write(w, path, &e), CELLM_OK);
    gguf_writer_free(w);
    for (size_t i = 0; i < N_SMALL + 1; i++) free(bufs[i]);
}

/* Deep equality of two metadata values. */
static bool value_eq(const gguf_value *a, const gguf_value *b) {
    if (a->type != b->type) return false;
    if (a->type == GGUF_TYPE_STRING)
        return a->v.str.len == b->v.str.len && !memcmp(a->v.str.ptr, b->v.str.ptr, a->v.str.len);
    if (a->type != GGUF_TYPE_ARRAY) return !memcmp(&a->v, &b->v, gguf_type_size(a->type));
    if (a->v.arr.type != b->v.arr.type || a->v.arr.n != b->v.arr.n) return false;
    for (uint64_t i = 0; i < a->v.arr.n; i++) {
        if (a->v.arr.type == GGUF_TYPE_STRING) {
            const gguf_str x = a->v.arr.strs[i], y = b->v.arr.strs[i];
            if (x.len != y.len || memcmp(x.ptr, y.ptr, x.len)) return false;
        } else if (a->v.arr.type == GGUF_TYPE_ARRAY) {
            if (!value_eq(&a->v.arr.items[i], &b->v.arr.items[i])) return false;
        }
    }
    if (a->v.arr.type != GGUF_TYPE_STRING && a->v.arr.type != GGUF_TYPE_ARRAY)
        return !a->v.arr.n ||
               !memcmp(a->v.arr.data, b->v.arr.data, a->v.arr.n * gguf_type_size(a->v.arr.type));
    return true;
}

/* Every input key is in the output with the same value, except the two
 * quantize sets. */
static void check_metadata(const gguf_file *in, const gguf_file *out, uint32_t file_type) {
    for (uint64_t i = 0; i < in->n_kv; i++) {
        const gguf_kv *kv = &in->kv[i];
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        const gguf_kv *o = gguf_find_key(out, key);
        if (!o) fail_msg("key %s was not copied", key);
        if (!strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version"))
            continue;
        if (!value_eq(&kv->value, &o->value)) fail_msg("key %s changed", key);
    }
    uint64_t ft, qv;
    assert_true(gguf_get_uint(out, "general.file_type", &ft));
    assert_int_equal(ft, file_type);
    assert_true(gguf_get_uint(out, "general.quantization_version", &qv));
    assert_int_equal(qv, 2);
}

/* RMS error of the dequantized tensor relative to the RMS of `want`. */
static double rel_rms_error(const gguf_tensor *t, const float *want) {
    float *got = malloc((size_t)t->n_elems * sizeof(float));
    assert_non_null(got);
    quant_type_get(t->type)->to_float(t->data, got, (size_t)t->n_elems);
    double e = 0, s = 0;
    for (uint64_t i = 0; i < t->n_elems; i++) {
        e += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        s += (double)want[i] * want[i];
    }
    free(got);
    return sqrt(e / s);
}

/* Error bounds for normal data, well above what each type gives. */
static double rms_bound(uint32_t type) {
    switch (type) {
    case QT_F32: return 0;
    case QT_F16: return 1e-3;
    case QT_Q8_0: return 0.01;
    case QT_Q6_K: return 0.03;
    case QT_Q5_0: return 0.06;
    default: return 0.12; /* 4-bit */
    }
}

static void check_small(const char *path, uint32_t file_type, bool q4km, bool with_odd) {
    char in_path[512];
    gguf_file *in, *out;
    cellm_error e;
    assert_int_equal(gguf_open(tmp_path("small.gguf", in_path, sizeof in_path), &in, &e), CELLM_OK);
    if (gguf_open(path, &out, &e) != CELLM_OK) fail_msg("%s", e.msg);
    check_metadata(in, out, file_type);
    assert_int_equal(out->n_tensors, N_SMALL + with_odd);
    for (size_t i = 0; i < N_SMALL + with_odd; i++) {
        const small_tensor *s = i < N_SMALL ? &small[i] : &odd;
        const gguf_tensor *t = gguf_find_tensor(out, s->name);
        assert_non_null(t);
        const uint32_t want = q4km ? s->want_q4km : s->want_q4_0;
        if (t->type != want)
            fail_msg("%s: %s, want %s", s->name, quant_type_get(t->type)->name,
                     quant_type_get(want)->name);
        assert_int_equal(t->n_dims, s->n_dims);
        assert_int_equal(t->ne[0], s->ne[0]);
        assert_int_equal(t->ne[1], s->ne[1]);
        const double err = rel_rms_error(t, small_floats[i]);
        if (!(err <= rms_bound(t->type)))
            fail_msg("%s (%s): relative RMS error %.4f > %.4f", s->name,
                     quant_type_get(t->type)->name, err, rms_bound(t->type));
    }
    gguf_close(out);
    gguf_close(in);
}

static void test_small_q4_k_m(void **state) {
    (void)state;
    char in[512], out[512];
    write_small(tmp_path("small.gguf", in, sizeof in), true);
    quantize_stats st;
    cellm_error e;
    const quantize_params p = {.n_threads = 3};
    if (quantize_file(in, tmp_path("q4km.gguf", out, sizeof out), quantize_ftype_by_name("q4_k_m"),
                      &p, &st, &e) != CELLM_OK)
        fail_msg("%s", e.msg);
    check_small(out, 15, true, true);
    assert_int_equal(st.n_tensors, N_SMALL + 1);
    assert_int_equal(st.n_fallback, 2); /* attn_q → Q5_0, the odd one → F16 */
    assert_int_equal(st.count_by_type[QT_Q6_K], 3);
}

static void test_small_q4_0(void **state) {
    (void)state;
    char in[512], out[512];
    cellm_error e;
    /* With a 40-wide tensor, Q4_0 has no fallback: refused, no file left. */
    write_small(tmp_path("small.gguf", in, sizeof in), true);
    tmp_path("q4_0.gguf", out, sizeof out);
    assert_int_equal(quantize_file(in, out, quantize_ftype_by_name("Q4_0"), NULL, NULL, &e),
                     CELLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "blk.0.ffn_gate.weight"));
    assert_int_not_equal(access(out, F_OK), 0);
    write_small(in, false);
    if (quantize_file(in, out, quantize_ftype_by_name("Q4_0"), NULL, NULL, &e) != CELLM_OK)
        fail_msg("%s", e.msg);
    check_small(out, 2, false, false);
}

static int run_status(const char *cmd) {
    const int s = system(cmd);
    return WIFEXITED(s) ? WEXITSTATUS(s) : -1;
}

static void test_command(void **state) {
    (void)state;
    const char *bin = getenv("CELLM_BIN");
    if (!bin || !*bin) fail_msg("CELLM_BIN is not set (ctest sets it)");
    char in[512], out[512], cmd[2048];
    write_small(tmp_path("small.gguf", in, sizeof in), true);
    tmp_path("cmd.gguf", out, sizeof out);
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' '%s' q5_k_m >/dev/null 2>&1", bin, in, out);
    assert_int_equal(run_status(cmd), 0);
    gguf_file *f;
    cellm_error e;
    assert_int_equal(gguf_open(out, &f, &e), CELLM_OK);
    assert_int_equal(gguf_find_tensor(f, "token_embd.weight")->type, QT_Q5_K);
    assert_int_equal(gguf_find_tensor(f, "blk.0.attn_q.weight")->type, QT_Q5_1);
    gguf_close(f);
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' '%s' q3_k >/dev/null 2>&1", bin, in, out);
    assert_int_equal(run_status(cmd), 2); /* unknown type */
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' '%s' q8_0 >/dev/null 2>&1", bin, in, in);
    assert_int_equal(run_status(cmd), 2); /* would overwrite the input */
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' '%s' q8_0 >/dev/null 2>&1", bin, in, out);
    assert_int_equal(run_status(cmd), 1); /* the 40-wide tensor */
}

/* The tensor of f named as t (which must be there); its name in name. */
static const gguf_tensor *tensor_like(const gguf_file *f, const gguf_tensor *t, char *name,
                                      size_t cap) {
    snprintf(name, cap, "%.*s", (int)t->name.len, t->name.ptr);
    const gguf_tensor *found = gguf_find_tensor(f, name);
    if (!found) fail_msg("tensor %s is missing", name);
    return found;
}

/* SmolLM2 (Q4_1, Q8_0 embeddings) to Q8_0: loads, same tensors and
 * shapes, and each element within 0.6 of its block's Q8_0 step of the
 * original (half a step, plus the F16 rounding of the scale). */
static void test_smollm2_q8_0(void **state) {
    (void)state;
    char model[4096], out[512];
    test_model_path("smollm2-135m", model, sizeof model);
    tmp_path("smollm2-q8_0.gguf", out, sizeof out);
    cellm_error e;
    quantize_stats st;
    if (quantize_file(model, out, quantize_ftype_by_name("Q8_0"), NULL, &st, &e) != CELLM_OK)
        fail_msg("%s", e.msg);
    gguf_file *a, *b;
    assert_int_equal(gguf_open(model, &a, &e), CELLM_OK);
    if (gguf_open(out, &b, &e) != CELLM_OK) fail_msg("%s", e.msg);
    check_metadata(a, b, 7);
    assert_int_equal(a->n_tensors, b->n_tensors);
    float *x = NULL, *y = NULL;
    size_t cap = 0;
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const gguf_tensor *ta = &a->tensors[i];
        char name[256];
        const gguf_tensor *tb = tensor_like(b, ta, name, sizeof name);
        assert_int_equal(ta->n_dims, tb->n_dims);
        for (int d = 0; d < GGUF_MAX_DIMS; d++) assert_int_equal(ta->ne[d], tb->ne[d]);
        assert_int_equal(tb->type, ta->n_dims == 1 ? ta->type : QT_Q8_0);
        if (ta->n_elems > cap) {
            cap = (size_t)ta->n_elems;
            x = realloc(x, cap * sizeof *x);
            y = realloc(y, cap * sizeof *y);
            assert_non_null(x);
            assert_non_null(y);
        }
        quant_type_get(ta->type)->to_float(ta->data, x, (size_t)ta->n_elems);
        quant_type_get(tb->type)->to_float(tb->data, y, (size_t)tb->n_elems);
        if (tb->type != QT_Q8_0) {
            assert_memory_equal(ta->data, tb->data, ta->size);
            continue;
        }
        for (uint64_t j = 0; j < ta->n_elems; j += 32) {
            float amax = 0;
            for (int k = 0; k < 32; k++) amax = fmaxf(amax, fabsf(x[j + k]));
            for (int k = 0; k < 32; k++) {
                /* (plus the absolute error of a subnormal F16 scale) */
                if (!(fabsf(y[j + k] - x[j + k]) <= 0.6f * amax / 127.0f + 1e-5f))
                    fail_msg("%s[%llu]: %g, was %g", name, (unsigned long long)(j + k), y[j + k],
                             x[j + k]);
            }
        }
    }
    free(x);
    free(y);
    assert_int_equal(st.n_quantized, 210); /* Q8_0 embeddings are copied */
    gguf_close(b);
    gguf_close(a);
}

/* --output-type on a model whose output is tied (SmolLM2): an
 * output.weight of its own in that type, a copy of token_embd.weight
 * within the type's error, while every tensor of the input is kept byte
 * for byte (Q4_1 to Q4_1 copies); on the small model, which has an
 * output, that tensor takes the type; a type whose blocks do not divide
 * the rows is refused and leaves no file. */
static void test_output_type(void **state) {
    (void)state;
    char model[4096], out[512], in[512];
    test_model_path("smollm2-135m", model, sizeof model);
    tmp_path("smollm2-head.gguf", out, sizeof out);
    cellm_error e;
    quantize_stats st;
    quantize_params p = {.n_threads = 2, .output_type_set = true, .output_type = QT_Q4_0};
    if (quantize_file(model, out, quantize_ftype_by_name("Q4_1"), &p, &st, &e) != CELLM_OK)
        fail_msg("%s", e.msg);
    assert_true(st.output_copied);
    assert_int_equal(st.n_quantized, 1);
    gguf_file *a, *b;
    assert_int_equal(gguf_open(model, &a, &e), CELLM_OK);
    if (gguf_open(out, &b, &e) != CELLM_OK) fail_msg("%s", e.msg);
    assert_null(gguf_find_tensor(a, "output.weight"));
    assert_int_equal(b->n_tensors, a->n_tensors + 1);
    for (uint64_t i = 0; i < a->n_tensors; i++) {
        const gguf_tensor *ta = &a->tensors[i];
        char name[256];
        const gguf_tensor *tb = tensor_like(b, ta, name, sizeof name);
        assert_int_equal(tb->type, ta->type);
        assert_int_equal(tb->size, ta->size);
        assert_memory_equal(ta->data, tb->data, ta->size);
    }
    const gguf_tensor *te = gguf_find_tensor(b, "token_embd.weight");
    const gguf_tensor *to = gguf_find_tensor(b, "output.weight");
    assert_non_null(to);
    assert_int_equal(to->type, QT_Q4_0);
    assert_int_equal(to->n_dims, 2);
    assert_int_equal(to->ne[0], te->ne[0]);
    assert_int_equal(to->ne[1], te->ne[1]);
    float *x = malloc((size_t)te->n_elems * sizeof *x);
    assert_non_null(x);
    quant_type_get(te->type)->to_float(te->data, x, (size_t)te->n_elems);
    const double err = rel_rms_error(to, x);
    if (!(err <= rms_bound(QT_Q4_0)))
        fail_msg("output.weight: relative RMS error %.4f against the embeddings", err);
    free(x);
    gguf_close(b);
    gguf_close(a);

    /* 576-wide rows are not a whole number of Q4_K's 256. */
    tmp_path("smollm2-head-q4k.gguf", out, sizeof out);
    p.output_type = QT_Q4_K;
    assert_int_equal(quantize_file(model, out, quantize_ftype_by_name("Q4_1"), &p, &st, &e),
                     CELLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "--output-type Q4_K"));
    assert_int_not_equal(access(out, F_OK), 0);

    /* A model with an output of its own: it takes the type, nothing added. */
    write_small(tmp_path("small.gguf", in, sizeof in), false);
    tmp_path("small-head.gguf", out, sizeof out);
    p.output_type = QT_Q8_0;
    if (quantize_file(in, out, quantize_ftype_by_name("Q4_0"), &p, &st, &e) != CELLM_OK)
        fail_msg("%s", e.msg);
    assert_false(st.output_copied);
    assert_int_equal(gguf_open(out, &b, &e), CELLM_OK);
    assert_int_equal(b->n_tensors, N_SMALL);
    assert_int_equal(gguf_find_tensor(b, "output.weight")->type, QT_Q8_0);
    assert_int_equal(gguf_find_tensor(b, "token_embd.weight")->type, QT_Q4_0);
    gguf_close(b);

    /* The command: the flag, and a name that is no tensor type. */
    const char *bin = getenv("CELLM_BIN");
    if (!bin || !*bin) fail_msg("CELLM_BIN is not set (ctest sets it)");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' '%s' q4_0 --output-type q5_0 >/dev/null 2>&1",
             bin, in, out);
    assert_int_equal(run_status(cmd), 0);
    assert_int_equal(gguf_open(out, &b, &e), CELLM_OK);
    assert_int_equal(gguf_find_tensor(b, "output.weight")->type, QT_Q5_0);
    gguf_close(b);
    snprintf(cmd, sizeof cmd, "'%s' quantize '%s' '%s' q4_0 --output-type q4_k_m >/dev/null 2>&1",
             bin, in, out);
    assert_int_equal(run_status(cmd), 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_q4_k_m), cmocka_unit_test(test_small_q4_0),
        cmocka_unit_test(test_command),      cmocka_unit_test(test_smollm2_q8_0),
        cmocka_unit_test(test_output_type),
    };
    const int r = cmocka_run_group_tests(tests, setup, teardown);
    for (size_t i = 0; i < N_SMALL + 1; i++) free(small_floats[i]);
    return r;
}

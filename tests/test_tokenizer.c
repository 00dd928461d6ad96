/*
 * test_tokenizer.c — the tokenizer against llama.cpp on the two real models
 * (ids equal on every fixture string, tests/data/tok/NAME.bin, written by
 * scripts/gen_tok_fixtures.py, and on a 1 MB text generated here), the
 * round trip decode(encode(s)) == s, the streaming detokenizer, and bad
 * input: invalid UTF-8, huge input, broken metadata.
 *
 * The models are found through CELLM_TEST_SMOLLM2 and CELLM_TEST_GEMMA3
 * (paths to the GGUF files); a test that needs one fails, saying so, when
 * the variable is unset.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "format/gguf.h"
#include "test_common.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

/* ---- fixtures ---- */

typedef struct fx_case {
    uint8_t flags;
    const char *text;
    uint32_t n_text;
    const int32_t *ids; /* unaligned in the file: copied out */
    uint32_t n_ids;
} fx_case;

typedef struct fixture {
    uint8_t *data;
    size_t n_cases;
    fx_case *cases;
    uint64_t big_len, big_hash;
    uint32_t big_n_ids;
} fixture;

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) {
    return rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static void fixture_load(const char *name, fixture *fx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/tok/%s.bin", CELLM_SOURCE_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open fixture %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    fx->data = malloc((size_t)size);
    assert_non_null(fx->data);
    assert_int_equal(fread(fx->data, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    const uint8_t *p = fx->data, *end = fx->data + size;
    assert_memory_equal(p, "CTOKFIX1", 8);
    p += 8;
    fx->n_cases = rd32(p);
    p += 4;
    fx->cases = calloc(fx->n_cases, sizeof *fx->cases);
    assert_non_null(fx->cases);
    for (size_t i = 0; i < fx->n_cases; i++) {
        fx_case *c = &fx->cases[i];
        assert_true(end - p >= 5);
        c->flags = p[0];
        c->n_text = rd32(p + 1);
        p += 5;
        assert_true((size_t)(end - p) >= (size_t)c->n_text + 4);
        c->text = (const char *)p;
        p += c->n_text;
        c->n_ids = rd32(p);
        p += 4;
        assert_true((size_t)(end - p) >= (size_t)c->n_ids * 4);
        int32_t *ids = malloc((size_t)c->n_ids * 4 + 4);
        assert_non_null(ids);
        for (uint32_t k = 0; k < c->n_ids; k++) ids[k] = (int32_t)rd32(p + 4 * k);
        c->ids = ids;
        p += (size_t)c->n_ids * 4;
    }
    assert_int_equal(end - p, 20);
    fx->big_len = rd64(p);
    fx->big_n_ids = rd32(p + 8);
    fx->big_hash = rd64(p + 12);
}

static void fixture_free(fixture *fx) {
    for (size_t i = 0; i < fx->n_cases; i++) free((void *)fx->cases[i].ids);
    free(fx->cases);
    free(fx->data);
}

/* ---- models ---- */

typedef struct model {
    gguf_file *f;
    tokenizer *t;
} model;

/* `env` names the model's variable; without it the model comes from the
 * store (test_common.h). */
static void model_open(const char *env, model *m) {
    static char buf[1024];
    const char *path =
        test_model_path(strstr(env, "SMOLLM2") ? "smollm2-135m" : "gemma3-270m", buf, sizeof buf);
    cellm_error err;
    err_clear(&err);
    if (gguf_open(path, &m->f, &err) != CELLM_OK) fail_msg("%s=%s: %s", env, path, err.msg);
    if (tokenizer_load(m->f, &m->t, &err) != CELLM_OK) fail_msg("%s: %s", path, err.msg);
}

static void model_close(model *m) {
    tokenizer_free(m->t);
    gguf_close(m->f);
}

static unsigned enc_flags(uint8_t fx_flags) {
    return ((fx_flags & 1) ? TOK_ADD_SPECIAL : 0u) | ((fx_flags & 2) ? TOK_PARSE_SPECIAL : 0u);
}

static void print_case(const char *what, const fx_case *c, const tok_ids *got) {
    fprintf(stderr, "  %s: flags %u, %u bytes: \"", what, c->flags, c->n_text);
    for (uint32_t i = 0; i < c->n_text && i < 80; i++) {
        unsigned char ch = (unsigned char)c->text[i];
        if (ch >= 0x20 && ch < 0x7F)
            fputc(ch, stderr);
        else
            fprintf(stderr, "\\x%02x", ch);
    }
    fprintf(stderr, "\"\n    want");
    for (uint32_t i = 0; i < c->n_ids && i < 24; i++) fprintf(stderr, " %d", c->ids[i]);
    fprintf(stderr, "\n    got ");
    for (size_t i = 0; got && i < got->n && i < 24; i++) fprintf(stderr, " %d", got->ids[i]);
    fputc('\n', stderr);
}

/* The 1 MB text scripts/gen_tok_fixtures.py's big_text() also builds. */
static char *big_text(size_t *len) {
    static const char *words[] = {
        "the",    "of",       "and",    "to",    "in",      "is",     "was",    "for",   "on",
        "that",   "with",     "as",     "by",    "at",      "from",   "this",   "be",    "or",
        "are",    "an",       "it",     "have",  "not",     "but",    "had",    "his",   "they",
        "you",    "were",     "her",    "she",   "which",   "their",  "all",    "one",   "we",
        "there",  "been",     "can",    "has",   "more",    "if",     "will",   "would", "what",
        "about",  "when",     "who",    "up",    "out",     "so",     "said",   "them",  "some",
        "could",  "time",     "into",   "other", "than",    "then",   "now",    "only",  "its",
        "these",  "two",      "first",  "may",   "any",     "new",    "like",   "our",   "over",
        "such",   "after",    "most",   "very",  "through", "just",   "where",  "much",  "because",
        "before", "good",     "well",   "model", "token",   "engine", "memory", "batch", "cache",
        "kernel", "quantize", "stream", "decode"};
    static const char *seps[] = {" ",    " ",  " ",   " ",   ", ", ". ",    "\n",
                                 "\n\n", "  ", "'s ", " 12", "3 ", "日本 ", "😀 "};
    const size_t n = (size_t)1 << 20, nw = sizeof words / sizeof words[0];
    char *s = malloc(n + 64);
    assert_non_null(s);
    uint64_t x = 88172645463325252ull;
    size_t w = 0;
    while (w < n) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const char *a = words[x % nw], *b = seps[(x >> 32) % (sizeof seps / sizeof seps[0])];
        memcpy(s + w, a, strlen(a));
        w += strlen(a);
        memcpy(s + w, b, strlen(b));
        w += strlen(b);
    }
    *len = n;
    return s;
}

static uint64_t ids_hash(const int32_t *ids, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        for (int k = 0; k < 4; k++) h = (h ^ ((v >> (8 * k)) & 0xFF)) * 0x100000001B3ull;
    }
    return h;
}

/* The case llama.cpp's ids stand for: `c` itself, except where cellm and
 * llama.cpp part on purpose. llama.cpp makes any token spelled "</s>" a
 * control token; cellm keeps the file's type, and Gemma 3 types its "</s>"
 * user-defined, which SentencePiece and transformers match in plain text.
 * So a Gemma 3 text holding "</s>" without special parsing must tokenize as
 * llama.cpp does with special parsing (the corpus has both; without the
 * other case the test fails). */
static bool holds(const char *s, size_t n, const char *w) {
    size_t k = strlen(w);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, w, k)) return true;
    return false;
}

static const fx_case *expected_case(const fixture *fx, const char *name, const fx_case *c) {
    if (strcmp(name, "gemma3") || (c->flags & 2) || !holds(c->text, c->n_text, "</s>")) return c;
    for (size_t i = 0; i < fx->n_cases; i++) {
        const fx_case *o = &fx->cases[i];
        if (o->flags == (c->flags | 2) && o->n_text == c->n_text &&
            !memcmp(o->text, c->text, c->n_text))
            return o;
    }
    fail_msg("%s: no special-parsing case for a text holding </s>", name);
    return c;
}

/* Encodes every fixture string with `t` and compares ids with llama.cpp's. */
static void check_parity_tok(const tokenizer *t, const char *name) {
    fixture fx;
    fixture_load(name, &fx);
    size_t bad = 0, user_eos = 0;
    cellm_error err;
    err_clear(&err);
    for (size_t i = 0; i < fx.n_cases; i++) {
        const fx_case *c = expected_case(&fx, name, &fx.cases[i]);
        user_eos += c != &fx.cases[i];
        tok_ids got = {0};
        cellm_status st = tokenizer_encode(t, fx.cases[i].text, fx.cases[i].n_text,
                                           enc_flags(fx.cases[i].flags), &got, &err);
        bool same = st == CELLM_OK && got.n == c->n_ids &&
                    (!got.n || !memcmp(got.ids, c->ids, got.n * sizeof *got.ids));
        if (!same && ++bad <= 10) print_case(name, c, &got);
        tok_ids_free(&got);
    }
    size_t blen;
    char *big = big_text(&blen);
    tok_ids got = {0};
    assert_int_equal(blen, fx.big_len);
    assert_int_equal(tokenizer_encode(t, big, blen, 0, &got, &err), CELLM_OK);
    fprintf(stderr,
            "%s: %zu strings checked (%zu with a user-defined </s>), %zu mismatches; 1 MB text: "
            "%zu ids (want %u)\n",
            name, fx.n_cases, user_eos, bad, got.n, fx.big_n_ids);
    assert_int_equal(got.n, fx.big_n_ids);
    assert_true(ids_hash(got.ids, got.n) == fx.big_hash);
    tok_ids_free(&got);
    free(big);
    assert_int_equal(bad, 0);
    fixture_free(&fx);
}

static void check_parity(const char *env, const char *name) {
    model m;
    model_open(env, &m);
    check_parity_tok(m.t, name);
    model_close(&m);
}

static void test_parity_smollm2(void **state) {
    (void)state;
    check_parity("CELLM_TEST_SMOLLM2", "smollm2");
}

/* The other pre-tokenizers, on SmolLM2's vocabulary: a copy of its
 * tokenizer metadata with another tokenizer.ggml.pre, as the fixture
 * script made for llama.cpp. */
static void test_parity_pre_variants(void **state) {
    (void)state;
    static const char *pres[] = {"llama-bpe", "qwen2", "gpt-2", "default"};
    model m;
    model_open("CELLM_TEST_SMOLLM2", &m);
    for (size_t v = 0; v < sizeof pres / sizeof pres[0]; v++) {
        gguf_writer *w = gguf_writer_new();
        assert_non_null(w);
        for (uint64_t i = 0; i < m.f->n_kv; i++) {
            const gguf_kv *kv = &m.f->kv[i];
            if (kv->key.len < 10 || memcmp(kv->key.ptr, "tokenizer.", 10)) continue;
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
            assert_int_equal(gguf_writer_set(w, key, &kv->value, NULL), CELLM_OK);
        }
        assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.pre", pres[v], NULL), CELLM_OK);
        uint8_t *buf;
        size_t size;
        gguf_file *f;
        tokenizer *t;
        cellm_error err;
        assert_int_equal(gguf_writer_write_mem(w, &buf, &size, NULL), CELLM_OK);
        assert_int_equal(gguf_open_memory(buf, size, &f, NULL), CELLM_OK);
        assert_int_equal(tokenizer_load(f, &t, &err), CELLM_OK);
        assert_string_equal(tokenizer_pre_name(t), pres[v]);
        char name[64];
        snprintf(name, sizeof name, "smollm2-%s", pres[v]);
        check_parity_tok(t, name);
        tokenizer_free(t);
        gguf_close(f);
        free(buf);
        gguf_writer_free(w);
    }
    model_close(&m);
}

static void test_parity_gemma3(void **state) {
    (void)state;
    check_parity("CELLM_TEST_GEMMA3", "gemma3");
}

/* ---- round trip and streaming ---- */

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t len;
        if (utf8_check((const uint8_t *)s + i, n - i, &len) != UTF8_VALID) return false;
        i += len;
    }
    return true;
}

static bool memmem_lower_block(const char *s, size_t n) {
    for (size_t i = 0; i + 3 <= n; i++)
        if (!memcmp(s + i, "\xe2\x96\x81", 3)) return true;
    return false;
}

/* Streams ids one at a time; every chunk must be whole UTF-8 characters
 * and together they must be the decoded text (exactly, when it is valid
 * UTF-8). */
static void check_stream(const tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                         const char *want, size_t want_len) {
    tok_stream s;
    tok_stream_init(&s, t, flags);
    size_t cap = tok_stream_bound(t), total = 0;
    char *chunk = malloc(cap);
    char *all = malloc(3 * want_len + 8);
    assert_non_null(chunk);
    assert_non_null(all);
    cellm_error err;
    for (size_t i = 0; i <= n; i++) {
        size_t got;
        if (i < n)
            assert_int_equal(tok_stream_push(&s, ids[i], chunk, cap, &got, &err), CELLM_OK);
        else
            assert_int_equal(tok_stream_flush(&s, chunk, cap, &got, &err), CELLM_OK);
        assert_true(valid_utf8(chunk, got));
        assert_true(total + got <= 3 * want_len + 8);
        memcpy(all + total, chunk, got);
        total += got;
    }
    if (valid_utf8(want, want_len)) {
        assert_int_equal(total, want_len);
        assert_memory_equal(all, want, want_len);
    }
    free(chunk);
    free(all);
}

/* decode(encode(s)) == s where it must hold: for valid UTF-8, except that
 * SentencePiece gives back a "▁" written in the text as a space. Not for
 * invalid UTF-8: byte-level BPE sees malformed bytes as U+FFFD (as
 * llama.cpp does), and SentencePiece cuts characters by lead byte, so a
 * malformed lead byte can swallow part of an escaped space. Special
 * tokens come back as text when they were parsed as tokens. */
static void check_roundtrip(const char *env, const char *name, bool spm) {
    model m;
    model_open(env, &m);
    fixture fx;
    fixture_load(name, &fx);
    cellm_error err;
    size_t checked = 0;
    for (size_t i = 0; i < fx.n_cases; i++) {
        const fx_case *c = &fx.cases[i];
        tok_ids ids = {0};
        /* No BOS/EOS: they are not part of the text. */
        unsigned eflags = enc_flags(c->flags) & ~(unsigned)TOK_ADD_SPECIAL;
        assert_int_equal(tokenizer_encode(m.t, c->text, c->n_text, eflags, &ids, &err), CELLM_OK);
        unsigned dflags = (c->flags & 2) ? TOK_DECODE_SPECIAL : 0;
        size_t skip = 0;
        char *out;
        size_t out_len;
        assert_int_equal(
            tokenizer_decode(m.t, ids.ids + skip, ids.n - skip, dflags, &out, &out_len, &err),
            CELLM_OK);
        bool escaped = spm && memmem_lower_block(c->text, c->n_text);
        if (!escaped && valid_utf8(c->text, c->n_text)) {
            if (out_len != c->n_text || memcmp(out, c->text, out_len)) {
                print_case("round trip", c, &ids);
                fail_msg("%s: decode(encode(s)) != s for case %zu", name, i);
            }
            checked++;
        }
        check_stream(m.t, ids.ids + skip, ids.n - skip, dflags, out, out_len);
        free(out);
        tok_ids_free(&ids);
    }
    fprintf(stderr, "%s: round trip holds on %zu of %zu strings\n", name, checked, fx.n_cases);
    fixture_free(&fx);
    model_close(&m);
}

static void test_roundtrip_smollm2(void **state) {
    (void)state;
    check_roundtrip("CELLM_TEST_SMOLLM2", "smollm2", false);
}

static void test_roundtrip_gemma3(void **state) {
    (void)state;
    check_roundtrip("CELLM_TEST_GEMMA3", "gemma3", true);
}

/* Byte tokens that spell one emoji arrive one at a time: nothing comes out
 * until the last one, then the whole character. */
static void test_stream_holds_partial(void **state) {
    (void)state;
    model m;
    model_open("CELLM_TEST_GEMMA3", &m);
    cellm_error err;
    tok_ids ids = {0};
    /* "\xF0\x9F\x98\x80" split into byte tokens by encoding a lone lead
     * byte and continuation bytes one by one. */
    static const char *bytes[] = {"\xF0", "\x9F", "\x98", "\x80"};
    for (int i = 0; i < 4; i++)
        assert_int_equal(tokenizer_encode(m.t, bytes[i], 1, 0, &ids, &err), CELLM_OK);
    assert_int_equal(ids.n, 4);
    tok_stream s;
    tok_stream_init(&s, m.t, 0);
    size_t cap = tok_stream_bound(m.t), got;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(tok_stream_push(&s, ids.ids[i], buf, cap, &got, &err), CELLM_OK);
        assert_int_equal(got, 0);
    }
    assert_int_equal(tok_stream_push(&s, ids.ids[3], buf, cap, &got, &err), CELLM_OK);
    assert_int_equal(got, 4);
    assert_memory_equal(buf, "\xF0\x9F\x98\x80", 4);
    /* A cut-off character is flushed as U+FFFD; a broken one too. */
    assert_int_equal(tok_stream_push(&s, ids.ids[0], buf, cap, &got, &err), CELLM_OK);
    assert_int_equal(got, 0);
    assert_int_equal(tok_stream_flush(&s, buf, cap, &got, &err), CELLM_OK);
    assert_int_equal(got, 3);
    assert_memory_equal(buf, "\xEF\xBF\xBD", 3);
    tok_ids word = {0};
    assert_int_equal(tokenizer_encode(m.t, "a", 1, 0, &word, &err), CELLM_OK);
    assert_int_equal(tok_stream_push(&s, ids.ids[0], buf, cap, &got, &err), CELLM_OK);
    assert_int_equal(tok_stream_push(&s, word.ids[0], buf, cap, &got, &err), CELLM_OK);
    assert_int_equal(got, 4);
    assert_memory_equal(buf,
                        "\xEF\xBF\xBD"
                        "a",
                        4);
    /* Errors, not crashes. */
    assert_int_equal(tok_stream_push(&s, -1, buf, cap, &got, &err), CELLM_ERR_INVALID_ARG);
    assert_int_equal(tok_stream_push(&s, word.ids[0], buf, 2, &got, &err), CELLM_ERR_INVALID_ARG);
    free(buf);
    tok_ids_free(&word);
    tok_ids_free(&ids);
    model_close(&m);
}

/* ---- bad input ---- */

static void test_bad_input(void **state) {
    (void)state;
    static const char *envs[] = {"CELLM_TEST_SMOLLM2", "CELLM_TEST_GEMMA3"};
    for (int e = 0; e < 2; e++) {
        model m;
        model_open(envs[e], &m);
        cellm_error err;
        tok_ids ids = {0};
        /* Random bytes: any encoding is fine, a crash is not. */
        uint64_t x = 0x243F6A8885A308D3ull + (uint64_t)e;
        char buf[512];
        for (int round = 0; round < 2000; round++) {
            size_t n = (size_t)(x % sizeof buf);
            for (size_t i = 0; i < n; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                buf[i] = (char)(x >> 24);
            }
            ids.n = 0;
            assert_int_equal(tokenizer_encode(m.t, buf, n, (unsigned)round & 3, &ids, &err),
                             CELLM_OK);
            for (size_t i = 0; i < ids.n; i++)
                assert_true(ids.ids[i] >= 0 && ids.ids[i] < tokenizer_n_vocab(m.t));
        }
        /* Over the limit: refused before anything is read. */
        ids.n = 0;
        assert_int_equal(tokenizer_encode(m.t, buf, TOKENIZER_MAX_INPUT + 1, 0, &ids, &err),
                         CELLM_ERR_INVALID_ARG);
        assert_int_equal(ids.n, 0);
        assert_int_equal(tokenizer_encode(m.t, NULL, 3, 0, &ids, &err), CELLM_ERR_INVALID_ARG);
        assert_int_equal(tokenizer_encode(m.t, NULL, 0, 0, &ids, &err), CELLM_OK);
        /* Long runs of one character: one word of 256 KiB, and spaces. */
        size_t big = (size_t)1 << 18;
        char *s = malloc(big);
        assert_non_null(s);
        memset(s, 'a', big);
        assert_int_equal(tokenizer_encode(m.t, s, big, 0, &ids, &err), CELLM_OK);
        memset(s, ' ', big);
        assert_int_equal(tokenizer_encode(m.t, s, big, TOK_PARSE_SPECIAL, &ids, &err), CELLM_OK);
        free(s);
        int32_t bad_id[] = {0, tokenizer_n_vocab(m.t)};
        char *out;
        size_t out_len;
        assert_int_equal(tokenizer_decode(m.t, bad_id, 2, 0, &out, &out_len, &err),
                         CELLM_ERR_INVALID_ARG);
        tok_ids_free(&ids);
        model_close(&m);
    }
}

/* ---- small vocabularies made in memory ---- */

static void set_strs(gguf_writer *w, const char *key, const char **strs, size_t n) {
    gguf_str *s = calloc(n, sizeof *s);
    assert_non_null(s);
    for (size_t i = 0; i < n; i++) s[i] = (gguf_str){strs[i], strlen(strs[i])};
    gguf_value v = {.type = GGUF_TYPE_ARRAY};
    v.v.arr.type = GGUF_TYPE_STRING;
    v.v.arr.n = n;
    v.v.arr.strs = s;
    assert_int_equal(gguf_writer_set(w, key, &v, NULL), CELLM_OK);
    free(s);
}

/* Sets `key` to an array of n numbers of GGUF type `type` at `vals`. */
static void set_arr(gguf_writer *w, const char *key, gguf_type type, const void *vals, size_t n) {
    gguf_value v = {.type = GGUF_TYPE_ARRAY};
    v.v.arr.type = type;
    v.v.arr.n = n;
    v.v.arr.data = vals;
    assert_int_equal(gguf_writer_set(w, key, &v, NULL), CELLM_OK);
}

static void set_i32s(gguf_writer *w, const char *key, const int32_t *vals, size_t n) {
    set_arr(w, key, GGUF_TYPE_INT32, vals, n);
}

/* Writes `w` to memory and loads a tokenizer from it. */
static cellm_status load_mem(gguf_writer *w, uint8_t **buf, gguf_file **f, tokenizer **t,
                             cellm_error *err) {
    size_t size;
    assert_int_equal(gguf_writer_write_mem(w, buf, &size, NULL), CELLM_OK);
    assert_int_equal(gguf_open_memory(*buf, size, f, NULL), CELLM_OK);
    return tokenizer_load(*f, t, err);
}

static void test_tiny_bpe(void **state) {
    (void)state;
    /* Byte-level: 'Ġ' is the space. */
    const char *toks[] = {"<|end|>", "a", "b", "c", "Ġ", "ab", "abc", "Ġa", "Ġab"};
    const char *merges[] = {"a b", "ab c", "Ġ a", "Ġa b"};
    int32_t types[] = {3, 1, 1, 1, 1, 1, 1, 1, 1};
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", NULL), CELLM_OK);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.pre", "gpt-2", NULL), CELLM_OK);
    set_strs(w, "tokenizer.ggml.tokens", toks, 9);
    set_strs(w, "tokenizer.ggml.merges", merges, 4);
    set_i32s(w, "tokenizer.ggml.token_type", types, 9);
    uint8_t *buf;
    gguf_file *f;
    tokenizer *t;
    cellm_error err;
    assert_int_equal(load_mem(w, &buf, &f, &t, &err), CELLM_OK);
    tok_ids ids = {0};
    assert_int_equal(tokenizer_encode(t, "abc ab<|end|>", 13, TOK_PARSE_SPECIAL, &ids, &err),
                     CELLM_OK);
    /* " ab": "a b" (rank 0) merges before "Ġ a" (rank 2) could, and
     * there is no "Ġ ab", so the space stays alone. */
    int32_t want[] = {6, 4, 5, 0};
    assert_int_equal(ids.n, 4);
    assert_memory_equal(ids.ids, want, sizeof want);
    char *out;
    size_t n;
    assert_int_equal(tokenizer_decode(t, ids.ids, ids.n, 0, &out, &n, &err), CELLM_OK);
    assert_string_equal(out, "abc ab");
    free(out);
    tok_ids_free(&ids);
    tokenizer_free(t);
    gguf_close(f);
    free(buf);

    /* An unknown pre-tokenizer is an error at load. */
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.pre", "no-such-pre", NULL), CELLM_OK);
    assert_int_equal(load_mem(w, &buf, &f, &t, &err), CELLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "no-such-pre"));
    assert_null(t);
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
}

static void test_tiny_spm(void **state) {
    (void)state;
    const char *toks[] = {"<unk>", "<s>", "</s>", "<0x41>", "<0xC3>", "<0xA9>",
                          "▁",     "h",   "i",    "▁h",     "▁hi",    "hi"};
    int32_t types[] = {2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 1};
    float scores[] = {0, 0, 0, 0, 0, 0, -1, -2, -2, -3, -1, -5};
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", NULL), CELLM_OK);
    set_strs(w, "tokenizer.ggml.tokens", toks, 12);
    set_i32s(w, "tokenizer.ggml.token_type", types, 12);
    set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 12);
    uint8_t *buf;
    gguf_file *f;
    tokenizer *t;
    cellm_error err;
    assert_int_equal(load_mem(w, &buf, &f, &t, &err), CELLM_OK);
    tok_ids ids = {0};
    /* BOS, then " hi" (space prefix) as one token, then "A" and "é" as
     * bytes (neither is a token). */
    assert_int_equal(tokenizer_encode(t, "hiAé", 5, TOK_ADD_SPECIAL, &ids, &err), CELLM_OK);
    int32_t want[] = {1, 10, 3, 4, 5};
    assert_int_equal(ids.n, 5);
    assert_memory_equal(ids.ids, want, sizeof want);
    char *out;
    size_t n;
    assert_int_equal(tokenizer_decode(t, ids.ids, ids.n, 0, &out, &n, &err), CELLM_OK);
    assert_string_equal(out, " hiAé");
    free(out);
    tok_ids_free(&ids);
    tokenizer_free(t);
    gguf_close(f);
    free(buf);

    /* Broken metadata: errors with the key's name. */
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "bert", NULL), CELLM_OK);
    assert_int_equal(load_mem(w, &buf, &f, &t, &err), CELLM_ERR_UNSUPPORTED);
    gguf_close(f);
    free(buf);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", NULL), CELLM_OK);
    assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.tokens", "not an array", NULL),
                     CELLM_OK);
    assert_int_equal(load_mem(w, &buf, &f, &t, &err), CELLM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.tokens"));
    gguf_close(f);
    free(buf);
    set_i32s(w, "tokenizer.ggml.tokens", types, 12);
    assert_int_equal(load_mem(w, &buf, &f, &t, &err), CELLM_ERR_FORMAT);
    gguf_close(f);
    free(buf);
    set_strs(w, "tokenizer.ggml.tokens", toks, 12);
    set_i32s(w, "tokenizer.ggml.token_type", types, 5); /* too short */
    assert_int_equal(load_mem(w, &buf, &f, &t, &err), CELLM_ERR_FORMAT);
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
}

/* The vocabulary is read in place from the file where it can be (F32
 * scores, no empty text) and copied where it cannot (F64 scores, an empty
 * text, which becomes "[EMPTY_<id>]"): both give the same tokens. */
static void test_spm_in_place_and_copied(void **state) {
    (void)state;
    const char *toks[] = {"<unk>", "<s>", "</s>", "▁", "h", "i", "▁h", "hi", ""};
    int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 1};
    /* "hi" outscores "▁h", so " hi" is "▁" "hi"; by position alone it
     * would be "▁h" "i". */
    float scores32[] = {0, 0, 0, -1, -2, -2, -3, -0.5f, -9};
    double scores64[] = {0, 0, 0, -1, -2, -2, -3, -0.5, -9};
    for (int copied = 0; copied < 2; copied++) {
        gguf_writer *w = gguf_writer_new();
        assert_non_null(w);
        assert_int_equal(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", NULL), CELLM_OK);
        size_t n = copied ? 9 : 8;
        set_strs(w, "tokenizer.ggml.tokens", toks, n);
        set_i32s(w, "tokenizer.ggml.token_type", types, n);
        set_arr(w, "tokenizer.ggml.scores", copied ? GGUF_TYPE_FLOAT64 : GGUF_TYPE_FLOAT32,
                copied ? (const void *)scores64 : (const void *)scores32, n);
        uint8_t *buf;
        gguf_file *f;
        tokenizer *t;
        cellm_error err;
        assert_int_equal(load_mem(w, &buf, &f, &t, &err), CELLM_OK);
        tok_ids ids = {0};
        assert_int_equal(tokenizer_encode(t, "hi hi", 5, TOK_ADD_SPECIAL, &ids, &err), CELLM_OK);
        int32_t want[] = {1, 3, 7, 3, 7};
        assert_int_equal(ids.n, 5);
        assert_memory_equal(ids.ids, want, sizeof want);
        size_t len;
        const char *p = tokenizer_piece(t, 6, 0, &len);
        assert_int_equal(len, 2);
        assert_memory_equal(p, " h", 2);
        p = tokenizer_piece(t, 7, 0, &len); /* a piece that is its text */
        assert_int_equal(len, 2);
        assert_memory_equal(p, "hi", 2);
        p = tokenizer_token_text(t, 6, &len);
        assert_int_equal(len, 4);
        assert_memory_equal(p, "▁h", 4);
        if (copied) {
            p = tokenizer_token_text(t, 8, &len);
            assert_int_equal(len, 9);
            assert_memory_equal(p, "[EMPTY_8]", 9);
            tok_ids_free(&ids);
            assert_int_equal(tokenizer_encode(t, "[EMPTY_8]", 9, 0, &ids, &err), CELLM_OK);
            assert_true(ids.n > 1); /* not a special token: spelled out */
        }
        tok_ids_free(&ids);
        tokenizer_free(t);
        gguf_close(f);
        free(buf);
        gguf_writer_free(w);
    }
}

static void test_unicode_table(void **state) {
    (void)state;
    assert_true(unicode_class('a') & UCLASS_LETTER);
    assert_true(unicode_class(0x65E5) & UCLASS_LETTER); /* 日 */
    assert_true(unicode_class(0x0663) & UCLASS_NUMBER); /* Arabic-Indic 3 */
    assert_true(unicode_class(0x3000) & UCLASS_SPACE);
    assert_false(unicode_class(0x1C) & UCLASS_SPACE); /* not White_Space */
    assert_true(unicode_class(0x0301) & UCLASS_MARK);
    assert_true(unicode_class(0x300C) & UCLASS_PUNCT); /* 「 */
    assert_int_equal(unicode_class(0x110000), 0);
    for (int b = 0; b < 256; b++)
        assert_int_equal(unicode_cp_to_byte(unicode_byte_to_cp((uint8_t)b)), b);
    assert_int_equal(unicode_byte_to_cp(' '), 0x120); /* 'Ġ' */
    size_t used;
    assert_int_equal(utf8_decode_lenient((const uint8_t *)"\xC0\xAF", 2, &used), '/');
    assert_int_equal(utf8_decode_lenient((const uint8_t *)"\xF4\x90\x80\x80", 4, &used), 0xFFFD);
    assert_int_equal(used, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unicode_table),
        cmocka_unit_test(test_tiny_bpe),
        cmocka_unit_test(test_tiny_spm),
        cmocka_unit_test(test_spm_in_place_and_copied),
        cmocka_unit_test(test_parity_smollm2),
        cmocka_unit_test(test_parity_gemma3),
        cmocka_unit_test(test_parity_pre_variants),
        cmocka_unit_test(test_roundtrip_smollm2),
        cmocka_unit_test(test_roundtrip_gemma3),
        cmocka_unit_test(test_stream_holds_partial),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * fuzz_tokenizer.c — libFuzzer target for the tokenizer: random bytes are
 * encoded (every flag combination), decoded and streamed back.
 *
 * The vocabularies are small ones built in memory as GGUF files (one
 * byte-level BPE, one SentencePiece, with control and user-defined
 * tokens), or, when CELLM_FUZZ_TOKENIZER_MODEL names a GGUF file, that
 * model's tokenizer as well. The first input byte picks the vocabulary and
 * flags; the rest is the text. Any crash, sanitizer report, error status
 * or broken invariant (an id out of range, streamed text that is not
 * valid UTF-8) is a finding.
 *
 *   CC=clang cmake -S . -B build-fuzz -DCELLM_FUZZ=ON -DCELLM_BUILD_TESTS=OFF \
 *       -DCELLM_BUILD_TOOLS=OFF && ninja -C build-fuzz fuzz_tokenizer
 *   ./build-fuzz/fuzz_tokenizer -max_total_time=60
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/gguf.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        if (!(x)) __builtin_trap();                                                                \
    } while (0)

/* The tokenizers, and the files and buffers they read in place: all live
 * until the process ends. */
static tokenizer *toks[3];
static gguf_file *files[3];
static uint8_t *bufs[3];
static int n_toks;

static void set_strs(gguf_writer *w, const char *key, const char **strs, size_t n) {
    gguf_str s[600];
    for (size_t i = 0; i < n; i++) s[i] = (gguf_str){strs[i], strlen(strs[i])};
    gguf_value v = {.type = GGUF_TYPE_ARRAY};
    v.v.arr.type = GGUF_TYPE_STRING;
    v.v.arr.n = n;
    v.v.arr.strs = s;
    CHECK(gguf_writer_set(w, key, &v, NULL) == CELLM_OK);
}

static void set_arr(gguf_writer *w, const char *key, gguf_type type, const void *data, size_t n) {
    gguf_value v = {.type = GGUF_TYPE_ARRAY};
    v.v.arr.type = type;
    v.v.arr.n = n;
    v.v.arr.data = data;
    CHECK(gguf_writer_set(w, key, &v, NULL) == CELLM_OK);
}

static tokenizer *load(gguf_writer *w) {
    uint8_t *buf;
    size_t size;
    gguf_file *f;
    tokenizer *t;
    CHECK(gguf_writer_write_mem(w, &buf, &size, NULL) == CELLM_OK);
    CHECK(gguf_open_memory(buf, size, &f, NULL) == CELLM_OK);
    CHECK(tokenizer_load(f, &t, NULL) == CELLM_OK);
    files[n_toks] = f;
    bufs[n_toks] = buf;
    gguf_writer_free(w);
    return t;
}

/* Byte-level BPE: the 256 byte characters, a few merges, two specials. */
static tokenizer *tiny_bpe(void) {
    static char chars[256][4];
    static const char *extra[] = {"<|end|>", "<u>", "Ġt", "he", "Ġthe", "in", "Ġa", "ĠĠ", "12"};
    static const char *merges[] = {"Ġ t", "h e", "Ġt he", "i n", "Ġ a", "Ġ Ġ", "1 2"};
    const char *all[256 + 9];
    int32_t types[256 + 9];
    for (int b = 0; b < 256; b++) {
        uint8_t u[4] = {0};
        utf8_encode(unicode_byte_to_cp((uint8_t)b), u);
        memcpy(chars[b], u, 4);
        all[b] = chars[b];
        types[b] = TOK_TYPE_NORMAL;
    }
    for (int i = 0; i < 9; i++) {
        all[256 + i] = extra[i];
        types[256 + i] = TOK_TYPE_NORMAL;
    }
    types[256] = TOK_TYPE_CONTROL;
    types[257] = TOK_TYPE_USER_DEFINED;
    gguf_writer *w = gguf_writer_new();
    CHECK(w);
    CHECK(gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2", NULL) == CELLM_OK);
    CHECK(gguf_writer_set_str(w, "tokenizer.ggml.pre", "llama-bpe", NULL) == CELLM_OK);
    set_strs(w, "tokenizer.ggml.tokens", all, 256 + 9);
    set_strs(w, "tokenizer.ggml.merges", merges, 7);
    set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 256 + 9);
    return load(w);
}

/* SentencePiece: byte tokens, a few pieces, control and user-defined. */
static tokenizer *tiny_spm(void) {
    static char hex[256][8];
    static const char *extra[] = {"<unk>", "<s>", "</s>", "▁", "▁t", "he", "▁the", "\n\n", "é"};
    const char *all[9 + 256];
    int32_t types[9 + 256];
    float scores[9 + 256];
    for (int i = 0; i < 9; i++) {
        all[i] = extra[i];
        types[i] = TOK_TYPE_NORMAL;
        scores[i] = -(float)i;
    }
    types[0] = TOK_TYPE_UNKNOWN;
    types[1] = types[2] = TOK_TYPE_CONTROL;
    types[7] = TOK_TYPE_USER_DEFINED;
    for (int b = 0; b < 256; b++) {
        snprintf(hex[b], sizeof hex[b], "<0x%02X>", b);
        all[9 + b] = hex[b];
        types[9 + b] = TOK_TYPE_BYTE;
        scores[9 + b] = 0;
    }
    gguf_writer *w = gguf_writer_new();
    CHECK(w);
    CHECK(gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", NULL) == CELLM_OK);
    set_strs(w, "tokenizer.ggml.tokens", all, 9 + 256);
    set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 9 + 256);
    set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 9 + 256);
    return load(w);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    /* load() files the gguf under n_toks before it is counted. */
    tokenizer *bpe = tiny_bpe();
    toks[n_toks++] = bpe;
    tokenizer *spm = tiny_spm();
    toks[n_toks++] = spm;
    const char *path = getenv("CELLM_FUZZ_TOKENIZER_MODEL");
    if (path && *path) {
        gguf_file *f;
        if (gguf_open(path, &f, NULL) == CELLM_OK) {
            tokenizer *t;
            if (tokenizer_load(f, &t, NULL) == CELLM_OK) {
                files[n_toks] = f;
                toks[n_toks++] = t;
            } else {
                gguf_close(f);
            }
        }
    }
    return 0;
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t len;
        if (utf8_check((const uint8_t *)s + i, n - i, &len) != UTF8_VALID) return false;
        i += len;
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const tokenizer *t = toks[data[0] % n_toks];
    unsigned flags = (data[0] >> 2) & 3u;
    unsigned dflags = (data[0] >> 4) & 1u ? TOK_DECODE_SPECIAL : 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;

    tok_ids ids = {0};
    CHECK(tokenizer_encode(t, text, n, flags, &ids, NULL) == CELLM_OK);
    for (size_t i = 0; i < ids.n; i++) CHECK(ids.ids[i] >= 0 && ids.ids[i] < tokenizer_n_vocab(t));

    char *out;
    size_t out_len;
    CHECK(tokenizer_decode(t, ids.ids, ids.n, dflags, &out, &out_len, NULL) == CELLM_OK);

    tok_stream s;
    tok_stream_init(&s, t, dflags);
    size_t cap = tok_stream_bound(t), total = 0, got;
    char *chunk = malloc(cap);
    CHECK(chunk);
    for (size_t i = 0; i < ids.n; i++) {
        CHECK(tok_stream_push(&s, ids.ids[i], chunk, cap, &got, NULL) == CELLM_OK);
        CHECK(valid_utf8(chunk, got));
        total += got;
    }
    CHECK(tok_stream_flush(&s, chunk, cap, &got, NULL) == CELLM_OK);
    CHECK(valid_utf8(chunk, got));
    total += got;
    /* Valid text streams out unchanged. */
    if (valid_utf8(out, out_len)) CHECK(total == out_len);

    free(chunk);
    free(out);
    tok_ids_free(&ids);
    return 0;
}

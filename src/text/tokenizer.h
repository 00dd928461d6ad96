/*
 * tokenizer.h — text to token ids and back, built from a GGUF file's
 * `tokenizer.ggml.*` metadata. Two kinds of vocabulary:
 *
 *  - SentencePiece-style (`tokenizer.ggml.model` = "llama"): spaces become
 *    U+2581 "▁", characters are merged pairwise by token score, and text no
 *    token covers falls back to byte tokens <0xNN>.
 *  - byte-level BPE ("gpt2"): text is split into words by the pre-tokenizer
 *    that `tokenizer.ggml.pre` names, each word's bytes are shown through
 *    GPT-2's byte-to-unicode map and merged by merge rank.
 *
 * Both follow llama.cpp's tokenizer exactly (tests check this on real
 * models), including its treatment of special tokens: control tokens in the
 * text are recognised only with TOK_PARSE_SPECIAL, user-defined tokens
 * always.
 *
 * A tokenizer is immutable once loaded, so any number of threads may
 * encode and decode with one tokenizer at once. It reads the vocabulary's
 * texts and scores in place from the gguf_file's memory (a big vocabulary's
 * are megabytes, already in the map): the gguf_file, and the buffer it was
 * opened from with gguf_open_memory, must outlive the tokenizer.
 *
 * Decoding streams: tok_stream turns ids into text as they arrive and never
 * hands out part of a UTF-8 character.
 */
#ifndef CELLM_TOKENIZER_H
#define CELLM_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/gguf.h"
#include "base/util.h"

typedef struct tokenizer tokenizer;

/* Token types, with the ids GGUF's tokenizer.ggml.token_type uses. */
typedef enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
} tok_type;

/* Flags for tokenizer_encode. */
enum {
    /* Add the model's BOS/EOS where its metadata asks for them
     * (tokenizer.ggml.add_bos_token / add_eos_token). */
    TOK_ADD_SPECIAL = 1u << 0,
    /* Recognise control and unknown tokens written in the text
     * ("<|im_start|>", "<bos>"). Without it they are plain text. */
    TOK_PARSE_SPECIAL = 1u << 1,
};

/* Flags for decoding. */
enum {
    /* Write control and unknown tokens as their text; by default they
     * decode to nothing. */
    TOK_DECODE_SPECIAL = 1u << 0,
};

/* Longest input tokenizer_encode accepts, in bytes. */
#define TOKENIZER_MAX_INPUT ((size_t)1 << 30)

/* A growable array of token ids; encoding appends to it. Start it zeroed;
 * free it with tok_ids_free(). */
typedef struct tok_ids {
    int32_t *ids;
    size_t n;
    size_t cap;
} tok_ids;

void tok_ids_free(tok_ids *v);

/* Appends one id; false when out of memory (v is unchanged). */
bool tok_ids_push(tok_ids *v, int32_t id);

/* Builds a tokenizer from the metadata of `f`, which must stay open until
 * tokenizer_free. Errors: CELLM_ERR_NOT_FOUND
 * (no vocabulary), CELLM_ERR_FORMAT (a key of the wrong type or size),
 * CELLM_ERR_UNSUPPORTED (a tokenizer model or pre-tokenizer cellm does
 * not know), CELLM_ERR_NO_MEMORY. */
cellm_status tokenizer_load(const gguf_file *f, tokenizer **out, cellm_error *err);

/* Frees a tokenizer. NULL is fine. */
void tokenizer_free(tokenizer *t);

/* Appends the ids of text[0..len) to `out`. Any bytes are accepted:
 * invalid UTF-8 is tokenized as the reference does (byte tokens for
 * SentencePiece, U+FFFD for BPE). Errors: CELLM_ERR_INVALID_ARG (NULL
 * arguments, input over TOKENIZER_MAX_INPUT), CELLM_ERR_NO_MEMORY; on
 * error `out` keeps what it held before the call. */
cellm_status tokenizer_encode(const tokenizer *t, const char *text, size_t len, unsigned flags,
                              tok_ids *out, cellm_error *err);

/* Vocabulary facts. Ids that do not exist are -1. */
int32_t tokenizer_n_vocab(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t);
int32_t tokenizer_eos(const tokenizer *t);
/* Whether TOK_ADD_SPECIAL puts BOS first (tokenizer.ggml.add_bos_token). */
bool tokenizer_adds_bos(const tokenizer *t);
tok_type tokenizer_token_type(const tokenizer *t, int32_t id);
/* "llama" or "gpt2", and the pre-tokenizer name ("" for SentencePiece). */
const char *tokenizer_model_name(const tokenizer *t);
const char *tokenizer_pre_name(const tokenizer *t);

/* The vocabulary entry of `id` as stored ("▁the", "Ġthe", "<0x0A>"), or
 * NULL for an id out of range; *len gets its length. Owned by `t`. */
const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len);

/* The bytes token `id` stands for in text (" the", "\n"), or NULL for an
 * id out of range; *len gets the length, which may be 0 (a control token
 * without TOK_DECODE_SPECIAL). Owned by `t`; not NUL-terminated. */
const char *tokenizer_piece(const tokenizer *t, int32_t id, unsigned flags, size_t *len);

/* Longest piece of any token, in bytes. */
size_t tokenizer_max_piece_len(const tokenizer *t);

/* Decodes ids[0..n) into a new NUL-terminated string (*out, *out_len
 * without the NUL; free it with free()). The bytes are exactly the pieces
 * concatenated: decode(encode(s)) == s for valid UTF-8 text wherever the
 * reference round-trips. Errors: CELLM_ERR_INVALID_ARG (an id out of
 * range), CELLM_ERR_NO_MEMORY. */
cellm_status tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, unsigned flags,
                              char **out, size_t *out_len, cellm_error *err);

/* ---- streaming detokenizer ---- */

/* Holds back the start of a UTF-8 character until its last byte arrives.
 * Output is always valid UTF-8: bytes that cannot start or continue a
 * character (and a character cut off at the end) come out as U+FFFD.
 * Plain data: no allocation, no cleanup; one per sequence, not shared
 * between threads. */
typedef struct tok_stream {
    const tokenizer *t;
    unsigned flags;
    uint8_t held[4];
    size_t n_held;
} tok_stream;

void tok_stream_init(tok_stream *s, const tokenizer *t, unsigned flags);

/* Room tok_stream_push and tok_stream_flush need in `out`, in bytes. */
size_t tok_stream_bound(const tokenizer *t);

/* Feeds token `id`; writes the text it completes to out[0..cap) and sets
 * *n_out (maybe 0). Errors: CELLM_ERR_INVALID_ARG for an id out of range or
 * cap < tok_stream_bound(t). */
cellm_status tok_stream_push(tok_stream *s, int32_t id, char *out, size_t cap, size_t *n_out,
                             cellm_error *err);

/* Ends the stream: writes what is still held back (as U+FFFD, since it is
 * an unfinished character) and resets the stream for reuse. */
cellm_status tok_stream_flush(tok_stream *s, char *out, size_t cap, size_t *n_out,
                              cellm_error *err);

#endif /* CELLM_TOKENIZER_H */

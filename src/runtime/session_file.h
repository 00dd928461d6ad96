/*
 * session_file.h — the parser of session files (session_file.c), apart from
 * any engine so that the fuzzer can drive it: the layout a file must match
 * (model identity, KV layout, limits) in, the checked contents out.
 */
#ifndef CELLM_SESSION_FILE_H
#define CELLM_SESSION_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "cellm.h"

/* What a file must match to be restored on an engine. */
typedef struct ses_layout {
    uint8_t id[32]; /* the model's identity */
    uint32_t kv_type;
    int32_t n_groups; /* 1 or 2 */
    int32_t n_layers[2], window[2];
    uint64_t block_bytes[2];
    int32_t max_ctx, n_vocab;
    uint64_t conv_bytes; /* a sequence's convolution state (lfm2); 0: none */
    uint64_t tail_bytes; /* a window type's f16 copies (kv_seq.tail); 0: none */
} ses_layout;

/* A parsed file: views into its buffer, but the message arrays, which
 * ses_parsed_free frees. Message contents are not NUL-terminated: see
 * lens. */
typedef struct ses_parsed {
    int32_t n_pos;
    const uint8_t *tokens; /* n_pos little-endian int32 ids, all in the vocabulary */
    int32_t first[2], count[2];
    const uint8_t *blocks[2]; /* count[g] blocks of block_bytes[g] */
    const uint8_t *conv;      /* conv_bytes of convolution state, or NULL */
    const uint8_t *tail;      /* tail_bytes of f16 copies, or NULL */
    int32_t n_msgs;
    cellm_chat_message *msgs;
    size_t *lens;
} ses_parsed;

/* Checks and parses the file buf[0..len) against `lay`: checksum first,
 * then header, identity, layout and every length. On failure the message
 * goes to msg[0..cap) and *out holds nothing to free beyond what
 * ses_parsed_free frees. */
cellm_status ses_parse(const ses_layout *lay, const uint8_t *buf, size_t len, ses_parsed *out,
                       char *msg, size_t cap);

void ses_parsed_free(ses_parsed *p);

/* Bytes of the largest file an engine of this layout could write. */
size_t ses_max_bytes(const ses_layout *lay);

#endif /* CELLM_SESSION_FILE_H */

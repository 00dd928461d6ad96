/*
 * fuzz_session.c — libFuzzer target for the session-file parser
 * (src/runtime/session_file.c, ses_parse): any bytes as a file to restore on an
 * engine of a fixed small layout (two KV groups, the second windowed). So
 * that the fuzzer gets past the checksum, the last 32 bytes of its input
 * are replaced by the SHA-256 of the rest, as the writer does; an input of
 * fewer than 40 bytes goes in as it is. The parser must accept or refuse
 * with a message, never crash, leak or read outside the buffer, and what
 * it accepts must hold the ranges it promises. Seeds:
 * fuzz/corpus/session/ (files of this layout written by
 * scripts/session_seeds.py).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/session_file.h"
#include "base/sha256.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    if (size >= 40) {
        sha256_ctx h;
        sha256_init(&h);
        sha256_update(&h, buf, size - SHA256_DIGEST_SIZE);
        sha256_final(&h, buf + size - SHA256_DIGEST_SIZE);
    }
    ses_layout lay;
    memset(&lay, 0, sizeof lay);
    for (int i = 0; i < 32; i++) lay.id[i] = (uint8_t)i;
    lay.n_groups = 2;
    lay.n_layers[0] = 2;
    lay.n_layers[1] = 1;
    lay.window[1] = 40;
    lay.block_bytes[0] = 2 * 16 * 16;
    lay.block_bytes[1] = 16 * 16;
    lay.max_ctx = 256;
    lay.n_vocab = 100;
    ses_parsed f;
    char msg[256];
    if (ses_parse(&lay, buf, size, &f, msg, sizeof msg) == CELLM_OK) {
        if (f.n_pos < 0 || f.n_pos > lay.max_ctx || f.n_msgs < 0) abort();
        for (int32_t i = 0; i < f.n_msgs; i++)
            if (!f.msgs[i].role || (const uint8_t *)f.msgs[i].content < buf ||
                (const uint8_t *)f.msgs[i].content + f.lens[i] > buf + size)
                abort();
        for (int32_t g = 0; g < lay.n_groups; g++) {
            if (f.count[g] < 0 || f.first[g] < 0 || f.first[g] + f.count[g] > 16) abort();
            if (f.count[g] && (f.blocks[g] < buf ||
                               f.blocks[g] + (size_t)f.count[g] * lay.block_bytes[g] > buf + size))
                abort();
        }
        for (int32_t i = 0; i < f.n_pos; i++) {
            const uint8_t *b = f.tokens + 4 * (size_t)i;
            int32_t t = (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                                  (uint32_t)b[3] << 24);
            if (t < 0 || t >= lay.n_vocab) abort();
        }
    } else if (!msg[0]) {
        abort(); /* a refusal says why */
    }
    ses_parsed_free(&f);
    free(buf);
    return 0;
}

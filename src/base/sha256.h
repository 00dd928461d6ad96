/*
 * sha256.h — streaming SHA-256 (FIPS 180-4), with no dependency beyond libc.
 * The model store checks every downloaded model with it, and later features
 * checksum saved session files. Feed data in pieces of any size with
 * sha256_update(); the digest depends only on the bytes, not on how they were
 * split.
 */
#ifndef CELLM_SHA256_H
#define CELLM_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_SIZE 32
#define SHA256_HEX_SIZE 65 /* 64 hex digits and the terminating NUL */

/* The running state of one hash. Plain data: copy it to fork a hash, no
 * cleanup needed. Not thread-safe; use one per thread. */
typedef struct sha256_ctx {
    uint32_t state[8];
    uint64_t nbytes; /* bytes hashed so far */
    uint8_t block[64];
    size_t nblock; /* bytes waiting in block[], always < 64 */
} sha256_ctx;

/* Starts a new hash. */
void sha256_init(sha256_ctx *ctx);

/* Adds `n` bytes at `data` (which may be NULL when n is 0). */
void sha256_update(sha256_ctx *ctx, const void *data, size_t n);

/* Finishes the hash and writes the 32-byte digest. The context must be
 * re-initialised before it is used again. */
void sha256_final(sha256_ctx *ctx, uint8_t digest[SHA256_DIGEST_SIZE]);

/* Writes a digest as 64 lowercase hex digits and a NUL. */
void sha256_to_hex(const uint8_t digest[SHA256_DIGEST_SIZE], char hex[SHA256_HEX_SIZE]);

/* One-shot: hashes `n` bytes and writes the lowercase hex digest. */
void sha256_hex(const void *data, size_t n, char hex[SHA256_HEX_SIZE]);

#endif /* CELLM_SHA256_H */

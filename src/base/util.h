/*
 * util.h — small pieces every module uses: the error record that carries a
 * status and its message up the stack, checked size arithmetic for sizes an
 * input controls, and the library's log entry point.
 */
#ifndef CELLM_UTIL_H
#define CELLM_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cellm.h"

#define CELLM_ERR_MSG_MAX 512

/* An error record: a status and a message. Functions that can fail take a
 * `cellm_error *` (which may be NULL when the caller only wants the status)
 * and fill it through err_set(). */
typedef struct cellm_error {
    cellm_status code;
    char msg[CELLM_ERR_MSG_MAX];
} cellm_error;

#if defined(__GNUC__)
#define CELLM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define CELLM_PRINTF(a, b)
#endif

/* Records `code` and a printf-style message in `err` (if not NULL) and
 * returns `code`, so a failing path reads `return err_set(err, ...);`. */
cellm_status err_set(cellm_error *err, cellm_status code, const char *fmt, ...) CELLM_PRINTF(3, 4);

/* Clears an error record to CELLM_OK and an empty message. */
void err_clear(cellm_error *err);

/* A NUL-terminated malloc'd copy of s[0..n), or NULL when out of memory. */
char *str_dup_n(const char *s, size_t n);

/* Logs through the application's callback, if one is set. */
void cellm_log(cellm_log_level level, const char *fmt, ...) CELLM_PRINTF(2, 3);

/* Checked arithmetic: return false (and leave *out unspecified) on overflow. */
static inline bool size_mul(size_t a, size_t b, size_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool size_add(size_t a, size_t b, size_t *out) {
    return !__builtin_add_overflow(a, b, out);
}
static inline bool u64_mul(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool u64_add(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_add_overflow(a, b, out);
}

#endif /* CELLM_UTIL_H */

/*
 * util.c — error records, status names, version and the log sink.
 */
#include "base/util.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

cellm_status err_set(cellm_error *err, cellm_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

char *str_dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        if (n) memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

void err_clear(cellm_error *err) {
    if (err) {
        err->code = CELLM_OK;
        err->msg[0] = '\0';
    }
}

const char *cellm_status_str(cellm_status status) {
    switch (status) {
    case CELLM_OK: return "ok";
    case CELLM_ERR_INVALID_ARG: return "invalid argument";
    case CELLM_ERR_IO: return "I/O error";
    case CELLM_ERR_FORMAT: return "format error";
    case CELLM_ERR_UNSUPPORTED: return "unsupported";
    case CELLM_ERR_NO_MEMORY: return "out of memory";
    case CELLM_ERR_NOT_FOUND: return "not found";
    case CELLM_ERR_CHECKSUM: return "checksum mismatch";
    case CELLM_ERR_NETWORK: return "network error";
    case CELLM_ERR_NOT_IMPLEMENTED: return "not implemented";
    case CELLM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *cellm_version(void) {
#define CELLM_STR2(x) #x
#define CELLM_STR(x) CELLM_STR2(x)
    return CELLM_STR(CELLM_VERSION_MAJOR) "." CELLM_STR(CELLM_VERSION_MINOR) "." CELLM_STR(
        CELLM_VERSION_PATCH);
}

/* The log sink; guarded by log_lock so a sink can be swapped while other
 * threads log. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static cellm_log_fn log_fn;
static void *log_user;

void cellm_set_log_callback(cellm_log_fn fn, void *user) {
    pthread_mutex_lock(&log_lock);
    log_fn = fn;
    log_user = user;
    pthread_mutex_unlock(&log_lock);
}

void cellm_log(cellm_log_level level, const char *fmt, ...) {
    pthread_mutex_lock(&log_lock);
    cellm_log_fn fn = log_fn;
    void *user = log_user;
    pthread_mutex_unlock(&log_lock);
    if (!fn) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fn(level, buf, user);
}

/*
 * cellm.h — the public C API of cellm, an on-device LLM inference and
 * serving engine. This is the only header an application includes.
 *
 * Conventions (they hold for every function below):
 *  - Handles are opaque. Every function that can fail returns cellm_status;
 *    CELLM_OK is 0. The message for the last failure is read from the handle
 *    (or from cellm_last_error() for calls that had no handle yet).
 *  - Strings returned by the library are owned by the library and stay valid
 *    until the next call on the same handle, unless a comment says otherwise.
 *  - Params structs are filled by their *_default_params() function first, so
 *    fields can be added in later versions without breaking callers.
 *  - The library never prints, never exits and never aborts on bad input.
 *    Diagnostics go through the log callback the application sets.
 */
#ifndef CELLM_H
#define CELLM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CELLM_VERSION_MAJOR 0
#define CELLM_VERSION_MINOR 1
#define CELLM_VERSION_PATCH 0

/* Status codes. Every fallible call returns one. */
typedef enum cellm_status {
    CELLM_OK = 0,
    CELLM_ERR_INVALID_ARG, /* a NULL handle, an out-of-range parameter */
    CELLM_ERR_IO,          /* open, read, write, mmap failed */
    CELLM_ERR_FORMAT,      /* a malformed or truncated file */
    CELLM_ERR_UNSUPPORTED, /* a valid file using a feature cellm lacks */
    CELLM_ERR_NO_MEMORY,   /* an allocation failed or the budget is spent */
    CELLM_ERR_NOT_FOUND,   /* a key, tensor or model name does not exist */
    CELLM_ERR_CHECKSUM,    /* data does not match its recorded checksum */
    CELLM_ERR_NETWORK,     /* a model could not be fetched */
    CELLM_ERR_NOT_IMPLEMENTED,
    CELLM_ERR_INTERNAL
} cellm_status;

/* A short constant name for a status ("format error", ...). Never NULL. */
const char *cellm_status_str(cellm_status status);

/* The library version as "MAJOR.MINOR.PATCH". Static storage. */
const char *cellm_version(void);

/* Log levels for the log callback. */
typedef enum cellm_log_level {
    CELLM_LOG_DEBUG = 0,
    CELLM_LOG_INFO,
    CELLM_LOG_WARN,
    CELLM_LOG_ERROR
} cellm_log_level;

/* The application's log sink. `msg` is valid only during the call and has no
 * trailing newline. The callback may be called from any library thread. */
typedef void (*cellm_log_fn)(cellm_log_level level, const char *msg, void *user);

/* Sets the process-wide log sink (NULL: discard logs, the default).
 * Thread-safe. */
void cellm_set_log_callback(cellm_log_fn fn, void *user);

#ifdef __cplusplus
}
#endif

#endif /* CELLM_H */

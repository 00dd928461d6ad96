/*
 * cli.c — helpers shared by the subcommands: error printing and parsing of
 * numbers and sizes given on the command line, and finding a model file.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "runtime/device.h"
#include "store.h"

void cli_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("cellm: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

bool cli_parse_spec_accept(const char *s, int32_t *out) {
    if (!strcmp(s, "exact"))
        *out = CELLM_SPEC_ACCEPT_EXACT;
    else if (!strcmp(s, "resample"))
        *out = CELLM_SPEC_ACCEPT_RESAMPLE;
    else
        return false;
    return true;
}

bool cli_parse_device(const char *s, int32_t *out) {
    return device_parse(s, out);
}

bool cli_is_gpu_layers(const char *opt) {
    return !strcmp(opt, "--gpu-layers") || !strcmp(opt, "-ngl") || !strcmp(opt, "--n-gpu-layers");
}

bool cli_parse_gpu_layers(const char *s, long *out) {
    unsigned long long u;
    if (!s || !cli_parse_uint(s, 1u << 20, &u)) return false;
    *out = (long)u;
    return true;
}

void cli_apply_gpu_layers(long arg, int32_t *device, int32_t *gpu_layers) {
    if (arg == 0)
        *device = CELLM_DEVICE_CPU;
    else if (arg > 0)
        *gpu_layers = (int32_t)arg;
}

bool cli_parse_kv_type(const char *s, cellm_kv_type *out) {
    static const struct {
        const char *name;
        cellm_kv_type type;
    } names[] = {{"f16", CELLM_KV_F16},       {"q8_0", CELLM_KV_Q8_0},
                 {"q4_0", CELLM_KV_Q4_0},     {"q4_0h", CELLM_KV_Q4_0H},
                 {"k5v4h", CELLM_KV_K5V4H},   {"q4_0hw", CELLM_KV_Q4_0HW},
                 {"k5v4hw", CELLM_KV_K5V4HW}, {"q3_0hw", CELLM_KV_Q3_0HW},
                 {"k4v3hw", CELLM_KV_K4V3HW}, {"k4cv4hw", CELLM_KV_K4CV4HW}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *out = names[i].type;
            return true;
        }
    return false;
}

bool cli_parse_uint(const char *s, unsigned long long max, unsigned long long *out) {
    if (!s || !isdigit((unsigned char)s[0])) return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end != '\0' || v > max) return false;
    *out = v;
    return true;
}

bool cli_parse_size(const char *s, size_t *out) {
    if (!s || !isdigit((unsigned char)s[0])) return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno) return false;
    unsigned long long mult = 1;
    if (*end) {
        switch (toupper((unsigned char)*end)) {
        case 'K':
            mult = 1ull << 10;
            end++;
            break;
        case 'M':
            mult = 1ull << 20;
            end++;
            break;
        case 'G':
            mult = 1ull << 30;
            end++;
            break;
        case 'B': break;
        default: return false;
        }
        if (strcasecmp(end, "") != 0 && strcasecmp(end, "b") != 0 && strcasecmp(end, "ib") != 0)
            return false;
    }
    unsigned long long r;
    if (__builtin_mul_overflow(v, mult, &r) || r > (unsigned long long)SIZE_MAX) return false;
    *out = (size_t)r;
    return true;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *b2 = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
        if (!b2) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = b2;
        cap *= 2;
    }
    if (buf && ferror(f)) {
        free(buf);
        buf = NULL;
    }
    if (f != stdin) fclose(f);
    *len = n;
    return buf;
}

cellm_status cli_resolve_model(const char *name_or_path, char *out, size_t cap, cellm_error *err) {
    cellm_status st = store_resolve(name_or_path, true, out, cap, err);
    if (st != CELLM_ERR_NOT_FOUND || strchr(name_or_path, '/')) return st;
    /* Not a file here nor a known name: a file in the store by its name.
     * The first error is the one to report if that fails too. */
    char dir[4096];
    cellm_error e2;
    if (store_get_dir(false, dir, sizeof dir, &e2) != CELLM_OK) return st;
    size_t n = strlen(name_or_path);
    bool ext = n > 5 && !strcmp(name_or_path + n - 5, ".gguf");
    int k = snprintf(out, cap, "%s/%s%s", dir, name_or_path, ext ? "" : ".gguf");
    if (k > 0 && (size_t)k < cap && access(out, R_OK) == 0) {
        err_clear(err);
        return CELLM_OK;
    }
    return st;
}

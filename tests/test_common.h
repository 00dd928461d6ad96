/*
 * test_common.h — helpers the cmocka tests share: finding the real models
 * and building GGUF bytes by hand for malformed-file tests.
 *
 * Real models are found through $CELLM_TEST_SMOLLM2 / $CELLM_TEST_GEMMA3
 * (paths) or else in the model store (${CELLM_HOME:-~/.cache/cellm}/models);
 * the test scripts pull them first. A missing model fails the test with a
 * message saying how to get it: tests never skip.
 */
#ifndef CELLM_TEST_COMMON_H
#define CELLM_TEST_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* True where the real models run several times slower than in a release
 * build: under a sanitizer (3-5x under ASan, 10-20x under TSan), or where
 * $CELLM_TEST_SMALL is set (test.sh sets it for the aarch64 build under
 * qemu, 30-100x). The real-model cases those runs take (test_tsan_*,
 * test_asan_*) then check the same things on a smaller sample: fewer
 * tokens or prompts. The release build always runs the whole sample. */
static inline int test_small(void) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return 1;
#else
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    return 1;
#endif
#endif
    const char *env = getenv("CELLM_TEST_SMALL");
    return env && *env && strcmp(env, "0") != 0;
#endif
}

/* The whole file at `path` into a new NUL-terminated buffer (*len bytes;
 * len may be NULL), or NULL when it cannot be read. free() it. */
static inline char *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *p = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (p = malloc((size_t)n + 1)) &&
        fread(p, 1, (size_t)n, f) == (size_t)n) {
        p[n] = '\0';
        if (len) *len = (size_t)n;
    } else {
        free(p);
        p = NULL;
    }
    fclose(f);
    return p;
}

/* Path of a real model by store name ("smollm2-135m", "gemma3-270m") into
 * `buf`; calls fail() when it is not there. */
static inline const char *test_model_path(const char *name, char *buf, size_t cap) {
    const char *env = NULL;
    if (!strcmp(name, "smollm2-135m")) env = getenv("CELLM_TEST_SMOLLM2");
    if (!strcmp(name, "gemma3-270m")) env = getenv("CELLM_TEST_GEMMA3");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
    } else {
        const char *home = getenv("CELLM_HOME");
        if (home && *home)
            snprintf(buf, cap, "%s/models/%s.gguf", home, name);
        else
            snprintf(buf, cap, "%s/.cache/cellm/models/%s.gguf",
                     getenv("HOME") ? getenv("HOME") : "", name);
    }
    if (access(buf, R_OK) != 0) {
        print_error("real model %s not found at %s: run `cellm pull %s` (scripts/test.sh does)\n",
                    name, buf, name);
        fail();
    }
    return buf;
}

/* Runs a shell command; returns its exit status and its stdout in a new
 * buffer the caller frees. */
static inline int test_run_cmd(const char *cmd, char **out) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, len = 0, n;
    char *buf = malloc(cap);
    assert_non_null(buf);
    while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += n;
        if (cap - len < 1024) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
    }
    buf[len] = '\0';
    int status = pclose(p);
    *out = buf;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The `cellm` binary under test ($CELLM_BIN, set by ctest). */
static inline const char *test_cellm_bin(void) {
    const char *b = getenv("CELLM_BIN");
    if (!b || !*b) {
        print_error("CELLM_BIN is not set (ctest sets it)\n");
        fail();
    }
    return b;
}

/* A growing byte buffer for hand-made files. */
typedef struct tbuf {
    uint8_t *p;
    size_t len, cap;
} tbuf;

static inline void tb_put(tbuf *b, const void *src, size_t n) {
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static inline void tb_u8(tbuf *b, uint8_t v) {
    tb_put(b, &v, 1);
}
static inline void tb_u32(tbuf *b, uint32_t v) {
    tb_put(b, &v, 4);
}
static inline void tb_u64(tbuf *b, uint64_t v) {
    tb_put(b, &v, 8);
}
static inline void tb_str(tbuf *b, const char *s) {
    tb_u64(b, strlen(s));
    tb_put(b, s, strlen(s));
}
static inline void tb_pad(tbuf *b, size_t align) {
    while (b->len % align) tb_u8(b, 0);
}

#endif /* CELLM_TEST_COMMON_H */

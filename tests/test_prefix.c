/*
 * test_prefix.c — the prefix cache, copy-on-write forks and session files
 * on the real models (include/cellm.h):
 *  - a request whose prompt starts like an earlier one (a shared system
 *    prompt) takes the cached blocks (n_cached_tokens) and replies token
 *    for token as a cold engine without a prefix cache does, although the
 *    cached prefix was computed in other chunks; the same on Gemma 3 with
 *    a prompt longer than its sliding window;
 *  - a new session whose system prompt another request computed starts
 *    from the cache;
 *  - a forked session shares its parent's blocks (no new block at the
 *    fork) and both continue as cold one-shot requests of their histories
 *    would;
 *  - a session saved, everything freed (model and engine too), restored
 *    on a fresh engine: the next turn reuses the restored KV and is token
 *    for token the turn an uninterrupted session gives; the same with the
 *    save done by a child process that then exits; files from another
 *    model, damaged, truncated or forged files are refused with clear
 *    errors;
 *  - concurrent requests sharing a prompt (test_tsan_*: the case test.sh
 *    runs under ThreadSanitizer, through CELLM_TEST_FILTER).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cellm.h"
#include "base/sha256.h"
#include "test_common.h"

#define MAX_OUT 64

static cellm_model *g_model;

typedef struct reply {
    int32_t tok[MAX_OUT];
    int32_t n;
    cellm_result res;
} reply;

static cellm_engine *engine_kv(cellm_model *m, int32_t batch, int prefix, cellm_kv_type kv) {
    cellm_engine_params ep = cellm_engine_default_params();
    ep.kv_type = kv;
    ep.n_threads = 2;
    ep.max_ctx = 2048;
    ep.max_batch_tokens = batch;
    ep.prefix_cache = prefix;
    cellm_engine *e = NULL;
    if (cellm_engine_create(m, &ep, &e) != CELLM_OK) {
        print_error("engine: %s\n", cellm_last_error());
        fail();
    }
    return e;
}

static cellm_engine *engine_on(cellm_model *m, int32_t batch, int prefix) {
    return engine_kv(m, batch, prefix, CELLM_KV_F16);
}

static void finish(cellm_request *r, reply *out) {
    assert_int_equal(cellm_wait(r, &out->res), CELLM_OK);
    assert_int_equal(out->res.status, CELLM_OK);
    const int32_t *t;
    int32_t n;
    assert_int_equal(cellm_request_tokens(r, &t, &n), CELLM_OK);
    assert_true(n <= MAX_OUT);
    memcpy(out->tok, t, (size_t)n * sizeof *t);
    out->n = n;
    cellm_request_free(r);
}

/* Greedy reply to [system, user] (system may be NULL). */
static void ask(cellm_engine *e, const char *system, const char *user, int32_t max_tokens,
                reply *out) {
    cellm_chat_message msgs[2];
    int32_t n = 0;
    if (system) msgs[n++] = (cellm_chat_message){"system", system};
    msgs[n++] = (cellm_chat_message){"user", user};
    cellm_request_params p = cellm_request_default_params();
    p.messages = msgs;
    p.n_messages = n;
    p.max_tokens = max_tokens;
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    finish(r, out);
}

static void assert_same(const reply *a, const reply *b) {
    if (a->n != b->n || memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok)) {
        print_error("replies differ (%d and %d tokens)\n", a->n, b->n);
        for (int32_t i = 0; i < a->n || i < b->n; i++)
            print_error("  %d: %d %d\n", i, i < a->n ? a->tok[i] : -1, i < b->n ? b->tok[i] : -1);
        fail();
    }
}

static cellm_stats stats_of(cellm_engine *e) {
    cellm_stats st;
    assert_int_equal(cellm_engine_stats(e, &st), CELLM_OK);
    return st;
}

/* A system prompt of about `words` words. */
static const char *long_system(int words) {
    static char buf[32768];
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; len + 200 < sizeof buf && i * 12 < words; i++)
        len +=
            (size_t)snprintf(buf + len, sizeof buf - len,
                             "Rule %d: answer in plain words, be kind, and keep it short. ", i + 1);
    return buf;
}

static const char *const questions[] = {
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "And what is the capital of Italy?",
};

/* Reuse across requests, against a cold engine in other chunks. */
static void prefix_reuse(cellm_model *m, int words, int32_t min_cached) {
    const char *sys = long_system(words);
    cellm_engine *e = engine_on(m, 48, 1);
    cellm_engine *cold = engine_on(m, 64, 0);
    reply a, b, a2, ref_a, ref_b;
    ask(e, sys, questions[0], 16, &a);
    assert_int_equal(a.res.n_cached_tokens, 0);
    ask(e, sys, questions[1], 16, &b);
    ask(e, sys, questions[0], 16, &a2);
    print_message("prompt %d tokens: second request %d cached, repeat %d cached\n",
                  a.res.n_prompt_tokens, b.res.n_cached_tokens, a2.res.n_cached_tokens);
    assert_true(a.res.n_prompt_tokens > min_cached);
    assert_true(b.res.n_cached_tokens >= min_cached);
    assert_true(b.res.n_cached_tokens % 16 == 0 && b.res.n_cached_tokens < b.res.n_prompt_tokens);
    /* The repeat finds all but the block holding its last token. */
    assert_int_equal(a2.res.n_cached_tokens, (a.res.n_prompt_tokens - 1) / 16 * 16);
    ask(cold, sys, questions[0], 16, &ref_a);
    ask(cold, sys, questions[1], 16, &ref_b);
    assert_int_equal(ref_b.res.n_cached_tokens, 0);
    assert_same(&a, &ref_a);
    assert_same(&a2, &ref_a);
    assert_same(&b, &ref_b);
    cellm_stats st = stats_of(e);
    assert_int_equal(st.blocks_used, 0);
    assert_true(st.blocks_cached > 0);
    assert_int_equal(st.n_prefix_tokens,
                     (uint64_t)b.res.n_cached_tokens + (uint64_t)a2.res.n_cached_tokens);
    assert_int_equal(stats_of(cold).blocks_cached, 0);
    /* A light trim empties the cache: the next request is cold again. */
    assert_int_equal(cellm_engine_trim(e, CELLM_TRIM_LIGHT, NULL), CELLM_OK);
    assert_int_equal(stats_of(e).blocks_cached, 0);
    reply b2;
    ask(e, sys, questions[1], 16, &b2);
    assert_int_equal(b2.res.n_cached_tokens, 0);
    assert_same(&b2, &ref_b);
    cellm_engine_free(cold);
    cellm_engine_free(e);
}

static void test_prefix_smollm2(void **state) {
    (void)state;
    prefix_reuse(g_model, 300, 300);
}

static void test_prefix_gemma(void **state) {
    (void)state;
    char path[4096];
    cellm_model *gm = NULL;
    assert_int_equal(cellm_model_load(test_model_path("gemma3-270m", path, sizeof path), NULL, &gm),
                     CELLM_OK);
    prefix_reuse(gm, 560, 600); /* past the 512-token window */
    cellm_model_free(gm);
}

/* ---- sessions ---- */

static cellm_session *session_on(cellm_engine *e, const char *system) {
    cellm_session_params sp = cellm_session_default_params();
    sp.system = system;
    sp.max_tokens = 16;
    cellm_session *s = NULL;
    if (cellm_session_create(e, &sp, &s) != CELLM_OK) {
        print_error("session: %s\n", cellm_last_error());
        fail();
    }
    return s;
}

static void turn(cellm_session *s, const char *text, reply *out) {
    cellm_request *r = NULL;
    if (cellm_session_send(s, text, NULL, &r) != CELLM_OK) {
        print_error("send: %s\n", cellm_last_error());
        fail();
    }
    finish(r, out);
}

/* The session's last reply, recomputed cold: its history but the last
 * message as one request on a fresh engine without a prefix cache. */
static void cold_last(cellm_model *m, cellm_session *s, reply *out) {
    const cellm_chat_message *msgs;
    int32_t n;
    assert_int_equal(cellm_session_messages(s, &msgs, &n), CELLM_OK);
    assert_string_equal(msgs[n - 1].role, "assistant");
    cellm_engine *e = engine_on(m, 64, 0);
    cellm_request_params p = cellm_request_default_params();
    p.messages = msgs;
    p.n_messages = n - 1;
    p.max_tokens = 16;
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    finish(r, out);
    cellm_engine_free(e);
}

static void test_session_shares_system_prompt(void **state) {
    (void)state;
    const char *sys = long_system(200);
    cellm_engine *e = engine_on(g_model, 64, 1);
    reply warm, t1, ref;
    ask(e, sys, questions[0], 8, &warm); /* computes the system prompt */
    cellm_session *s = session_on(e, sys);
    turn(s, questions[1], &t1);
    print_message("first turn of a new session: %d of %d tokens cached\n", t1.res.n_cached_tokens,
                  t1.res.n_prompt_tokens);
    assert_true(t1.res.n_cached_tokens >= 200);
    cold_last(g_model, s, &ref);
    assert_same(&t1, &ref);
    cellm_session_free(s);
    cellm_engine_free(e);
}

static void test_asan_session_fork(void **state) {
    (void)state;
    cellm_engine *e = engine_on(g_model, 64, 1);
    cellm_session *s = session_on(e, "You are a helpful assistant.");
    reply t1, a, b, ref;
    turn(s, questions[0], &t1);
    cellm_stats before = stats_of(e);
    cellm_session *f = NULL;
    assert_int_equal(cellm_session_fork(s, &f), CELLM_OK);
    cellm_stats after = stats_of(e);
    /* Shared, not copied. */
    assert_int_equal(after.blocks_used, before.blocks_used);
    assert_int_equal(after.n_sessions_kept, 2);
    const cellm_chat_message *m1, *m2;
    int32_t n1, n2;
    assert_int_equal(cellm_session_messages(s, &m1, &n1), CELLM_OK);
    assert_int_equal(cellm_session_messages(f, &m2, &n2), CELLM_OK);
    assert_int_equal(n1, n2);
    for (int32_t i = 0; i < n1; i++) assert_string_equal(m1[i].content, m2[i].content);
    /* Each goes its own way from the shared blocks (the last one, partly
     * filled, is copied by whichever writes first). */
    turn(f, questions[1], &b);
    turn(s, questions[2], &a);
    assert_true(a.res.n_cached_tokens > t1.res.n_prompt_tokens);
    assert_true(b.res.n_cached_tokens > t1.res.n_prompt_tokens);
    cold_last(g_model, s, &ref);
    assert_same(&a, &ref);
    cold_last(g_model, f, &ref);
    assert_same(&b, &ref);
    cellm_session *none = (cellm_session *)1;
    assert_int_equal(cellm_session_fork(NULL, &none), CELLM_ERR_INVALID_ARG);
    assert_null(none);
    cellm_session_free(f);
    cellm_session_free(s);
    assert_int_equal(stats_of(e).blocks_used, 0);
    cellm_engine_free(e);
}

static const char *tmp_path(const char *name, char *buf, size_t cap) {
    const char *dir = getenv("TMPDIR");
    snprintf(buf, cap, "%s/cellm-test-%d-%s", dir && *dir ? dir : "/tmp", (int)getpid(), name);
    return buf;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)n);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

static void spit(const char *path, const uint8_t *b, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
}

/* Restoring `path` fails with `code` and a message containing `what`. */
static void assert_refused(cellm_engine *e, const char *path, cellm_status code, const char *what) {
    cellm_session *s = (cellm_session *)1;
    cellm_status st = cellm_session_restore(e, path, NULL, &s);
    print_message("refused (%d): %s\n", st, cellm_last_error());
    assert_int_equal(st, code);
    assert_null(s);
    assert_non_null(strstr(cellm_last_error(), what));
}

static void test_asan_session_save_restore(void **state) {
    (void)state;
    char path[4096], file[512], bad[512];
    tmp_path("session.bin", file, sizeof file);
    tmp_path("bad.bin", bad, sizeof bad);
    const char *sys = "You are a helpful assistant who answers briefly.";

    /* Uninterrupted: three turns. */
    cellm_engine *e = engine_on(g_model, 64, 0);
    cellm_session *u = session_on(e, sys);
    reply u1, u2, u3;
    turn(u, questions[0], &u1);
    turn(u, questions[1], &u2);
    turn(u, questions[2], &u3);
    cellm_session_free(u);
    cellm_engine_free(e);

    /* Two turns, saved; then everything goes. */
    cellm_model *m = NULL;
    assert_int_equal(cellm_model_load(test_model_path("smollm2-135m", path, sizeof path), NULL, &m),
                     CELLM_OK);
    e = engine_on(m, 64, 1);
    cellm_session *s = session_on(e, sys);
    reply s1, s2, s3;
    turn(s, questions[0], &s1);
    turn(s, questions[1], &s2);
    assert_same(&s1, &u1);
    assert_same(&s2, &u2);
    assert_int_equal(cellm_session_save(s, file), CELLM_OK);
    assert_int_equal(cellm_session_save(NULL, file), CELLM_ERR_INVALID_ARG);
    cellm_session_free(s);
    cellm_engine_free(e);
    cellm_model_free(m);

    /* A fresh model and engine: the restored session goes on. */
    assert_int_equal(cellm_model_load(path, NULL, &m), CELLM_OK);
    e = engine_on(m, 64, 1);
    s = NULL;
    assert_int_equal(cellm_session_restore(e, file, NULL, &s), CELLM_OK);
    cellm_stats st = stats_of(e);
    assert_true(st.blocks_kept > 0);
    const cellm_chat_message *msgs;
    int32_t n;
    assert_int_equal(cellm_session_messages(s, &msgs, &n), CELLM_OK);
    assert_int_equal(n, 5);
    assert_string_equal(msgs[0].role, "system");
    assert_string_equal(msgs[0].content, sys);
    assert_string_equal(msgs[3].content, questions[1]);
    turn(s, questions[2], &s3);
    print_message("restored turn: %d of %d prompt tokens cached\n", s3.res.n_cached_tokens,
                  s3.res.n_prompt_tokens);
    assert_true(s3.res.n_cached_tokens > s2.res.n_prompt_tokens);
    assert_same(&s3, &u3);
    cellm_session_free(s);

    /* Damaged, truncated, forged and foreign files. */
    size_t len;
    uint8_t *b = slurp(file, &len);
    b[len / 2] ^= 0x40;
    spit(bad, b, len);
    assert_refused(e, bad, CELLM_ERR_CHECKSUM, "damaged");
    b[len / 2] ^= 0x40;
    spit(bad, b, len - 1000);
    assert_refused(e, bad, CELLM_ERR_CHECKSUM, "damaged or truncated");
    spit(bad, b, 20);
    assert_refused(e, bad, CELLM_ERR_CHECKSUM, "truncated");
    spit(bad, (const uint8_t *)"hello, world, this is not a session file at all.....", 50);
    assert_refused(e, bad, CELLM_ERR_FORMAT, "not a cellm session file");
    assert_refused(e, "/nonexistent/dir/x.bin", CELLM_ERR_IO, "cannot open");
    /* A forged file with a valid checksum but 10^6 positions. */
    {
        uint8_t *g = malloc(len);
        assert_non_null(g);
        memcpy(g, b, len);
        /* n_pos follows magic, version, flags, identity, kv_type, block
         * tokens, n_groups and 16 bytes per group. */
        size_t at = 8 + 4 + 4 + 32 + 12;
        uint32_t ng = (uint32_t)g[at - 4] | (uint32_t)g[at - 3] << 8;
        at += 16 * ng;
        g[at] = 0x40;
        g[at + 1] = 0x42;
        g[at + 2] = 0x0f;
        g[at + 3] = 0;
        /* Re-sign it the way the writer does: SHA-256 of all before. */
        sha256_ctx h;
        sha256_init(&h);
        sha256_update(&h, g, len - SHA256_DIGEST_SIZE);
        sha256_final(&h, g + len - SHA256_DIGEST_SIZE);
        spit(bad, g, len);
        assert_refused(e, bad, CELLM_ERR_FORMAT, "positions");
        free(g);
    }
    free(b);
    /* An engine whose KV budget cannot hold the blocks now. */
    cellm_stats probe = stats_of(e);
    size_t block = probe.bytes_kv_total / (size_t)probe.blocks_total;
    cellm_engine_free(e);
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 2;
    ep.max_ctx = 2048;
    ep.max_batch_tokens = 64;
    ep.mem_budget_bytes = probe.bytes_activations + 3 * block + block / 2;
    assert_int_equal(cellm_engine_create(m, &ep, &e), CELLM_OK);
    assert_int_equal(stats_of(e).blocks_total, 3);
    assert_refused(e, file, CELLM_ERR_NO_MEMORY, "no room");
    assert_int_equal(stats_of(e).blocks_used, 0);
    cellm_engine_free(e);
    cellm_model_free(m);

    /* Another model. */
    cellm_model *gm = NULL;
    assert_int_equal(cellm_model_load(test_model_path("gemma3-270m", path, sizeof path), NULL, &gm),
                     CELLM_OK);
    e = engine_on(gm, 64, 1);
    assert_refused(e, file, CELLM_ERR_FORMAT, "another model");
    cellm_engine_free(e);
    cellm_model_free(gm);
    remove(file);
    remove(bad);
}

/* A session of engine e (KV type kv, prefix cache on; e is freed) saved
 * after its first turn, restored into a new engine of that type, and its
 * second turn taken there (*s2) must answer as two uninterrupted turns on
 * `cold` do (*u2); an engine of type `other` then refuses the file. */
static void check_saved_session(cellm_engine *e, cellm_engine *cold, cellm_kv_type kv,
                                cellm_kv_type other, const char *sys, const char *file, reply *u2,
                                reply *s2) {
    cellm_session *u = session_on(cold, sys);
    reply u1, s1;
    turn(u, questions[0], &u1);
    turn(u, questions[1], u2);
    cellm_session_free(u);
    cellm_session *s = session_on(e, sys);
    turn(s, questions[0], &s1);
    assert_same(&s1, &u1);
    assert_int_equal(cellm_session_save(s, file), CELLM_OK);
    cellm_session_free(s);
    cellm_engine_free(e);
    e = engine_kv(g_model, 64, 1, kv);
    s = NULL;
    assert_int_equal(cellm_session_restore(e, file, NULL, &s), CELLM_OK);
    turn(s, questions[1], s2);
    assert_same(s2, u2);
    cellm_session_free(s);
    cellm_engine_free(e);
    e = engine_kv(g_model, 64, 1, other);
    assert_refused(e, file, CELLM_ERR_FORMAT, "KV cache layout");
    cellm_engine_free(e);
}

/* A compressed KV type (k5v4h: 5-bit keys, 4-bit values) through the
 * same paths: the prefix cache shares its blocks (a repeat finds the
 * cached prefix and answers as a cold engine does), and a session saved
 * with it restores into an engine of that type and goes on as one never
 * saved, while an engine of another type refuses the file. */
static void test_asan_compressed_kv_prefix_session(void **state) {
    (void)state;
    char file[512];
    tmp_path("session-k5v4h.bin", file, sizeof file);
    const char *sys = "You are a helpful assistant who answers briefly.";
    cellm_engine *e = engine_kv(g_model, 64, 1, CELLM_KV_K5V4H);
    cellm_engine *cold = engine_kv(g_model, 64, 0, CELLM_KV_K5V4H);
    reply a, b, ref_b;
    ask(e, sys, questions[0], 8, &a);
    ask(e, sys, questions[1], 8, &b);
    ask(cold, sys, questions[1], 8, &ref_b);
    assert_true(b.res.n_cached_tokens >= 16);
    assert_int_equal(ref_b.res.n_cached_tokens, 0);
    assert_same(&b, &ref_b);
    /* Uninterrupted two turns, then one saved after the first. */
    reply u2, s2;
    check_saved_session(e, cold, CELLM_KV_K5V4H, CELLM_KV_Q4_0H, sys, file, &u2, &s2);
    assert_true(s2.res.n_cached_tokens > 0);
    cellm_engine_free(cold);
    remove(file);
}

/* A window KV type (q4_0hw: each sequence keeps f16 copies of its sink
 * and recent positions beside its blocks): the prefix cache shares its
 * blocks where it has f16 copies of a prefix's sink and last block (a
 * prompt that shares the system prompt, a repeat), and answers as a cold
 * engine does; a session keeps its conversation between turns, and one
 * saved with it (the f16 copies with the blocks) restores and goes on as
 * one never saved. The second turn passes the sink, the recent blocks and the
 * ring, so every kind of row is read. */
static void test_asan_window_kv_session(void **state) {
    (void)state;
    char file[512];
    tmp_path("session-q4_0hw.bin", file, sizeof file);
    const char *sys = "You are a helpful assistant who answers briefly.";
    cellm_engine *e = engine_kv(g_model, 64, 1, CELLM_KV_Q4_0HW);
    cellm_engine *cold = engine_kv(g_model, 64, 0, CELLM_KV_Q4_0HW);
    reply a, b, ref_b, a2, ref_a;
    (void)a;
    ask(e, sys, questions[0], 8, &a);
    ask(e, sys, questions[1], 8, &b);
    ask(cold, sys, questions[1], 8, &ref_b);
    print_message("window type: %d of %d prompt tokens cached\n", b.res.n_cached_tokens,
                  b.res.n_prompt_tokens);
    assert_true(b.res.n_cached_tokens >= 16);
    assert_int_equal(ref_b.res.n_cached_tokens, 0);
    assert_same(&b, &ref_b);
    /* A repeat of a longer prompt takes every whole block of it (the
     * last one's f16 copy was made when its pass ended). */
    const char *longer = "You are a helpful assistant who answers briefly. You speak plainly, "
                         "you never make up facts, and when you do not know an answer you say "
                         "so at once, in one short sentence, without apology. You keep every "
                         "answer under twenty words.";
    reply a1;
    ask(e, longer, questions[0], 8, &a1);
    ask(e, longer, questions[0], 8, &a2);
    ask(cold, longer, questions[0], 8, &ref_a);
    print_message("repeat: %d of %d cached\n", a2.res.n_cached_tokens, a2.res.n_prompt_tokens);
    assert_true(a2.res.n_prompt_tokens > 64); /* two passes of 64 */
    assert_int_equal(a2.res.n_cached_tokens, (a2.res.n_prompt_tokens - 1) / 16 * 16);
    assert_same(&a2, &ref_a);
    assert_same(&a1, &ref_a);
    /* The same blocks without the copies (q4_0h) are another layout. */
    reply u2, s2;
    check_saved_session(e, cold, CELLM_KV_Q4_0HW, CELLM_KV_Q4_0H, sys, file, &u2, &s2);
    /* The first turn's 45 positions came back; the second passes 64. */
    assert_true(s2.res.n_cached_tokens >= 32);
    assert_true(s2.res.n_prompt_tokens + u2.n > 64);
    cellm_engine_free(cold);
    remove(file);
}

/* The save in another process that then exits; the restore here. */
static void test_asan_session_restore_across_processes(void **state) {
    (void)state;
    char file[512];
    tmp_path("child-session.bin", file, sizeof file);
    remove(file);
    const char *sys = "You are a helpful assistant who answers briefly.";
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* The child: two turns, a save, and gone (no cmocka here). */
        cellm_engine_params ep = cellm_engine_default_params();
        ep.n_threads = 2;
        ep.max_ctx = 2048;
        ep.max_batch_tokens = 64;
        cellm_engine *e = NULL;
        cellm_session *s = NULL;
        cellm_session_params sp = cellm_session_default_params();
        sp.system = sys;
        sp.max_tokens = 16;
        if (cellm_engine_create(g_model, &ep, &e) || cellm_session_create(e, &sp, &s)) _exit(2);
        for (int i = 0; i < 2; i++) {
            cellm_request *r = NULL;
            cellm_result res;
            if (cellm_session_send(s, questions[i], NULL, &r) || cellm_wait(r, &res) ||
                res.status != CELLM_OK)
                _exit(3);
            cellm_request_free(r);
        }
        _exit(cellm_session_save(s, file) == CELLM_OK ? 0 : 4);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);

    /* The uninterrupted conversation, here. */
    cellm_engine *e = engine_on(g_model, 64, 0);
    cellm_session *u = session_on(e, sys);
    reply u1, u2, u3, r3;
    turn(u, questions[0], &u1);
    turn(u, questions[1], &u2);
    turn(u, questions[2], &u3);
    cellm_session_free(u);
    cellm_engine_free(e);

    e = engine_on(g_model, 64, 1);
    cellm_session *s = NULL;
    assert_int_equal(cellm_session_restore(e, file, NULL, &s), CELLM_OK);
    turn(s, questions[2], &r3);
    print_message("restored from another process: %d of %d prompt tokens cached\n",
                  r3.res.n_cached_tokens, r3.res.n_prompt_tokens);
    assert_true(r3.res.n_cached_tokens > u2.res.n_prompt_tokens);
    assert_same(&r3, &u3);
    cellm_session_free(s);
    cellm_engine_free(e);
    remove(file);
}

/* Requests sharing a prompt at once, with the cache on: the same tokens. */
static void test_tsan_shared_prompt(void **state) {
    (void)state;
    cellm_engine *e = engine_on(g_model, 32, 1);
    const char *sys = long_system(40);
    cellm_chat_message msgs[2] = {{"system", sys}, {"user", questions[0]}};
    cellm_request_params p = cellm_request_default_params();
    p.messages = msgs;
    p.n_messages = 2;
    p.max_tokens = 6;
    cellm_request *r[4];
    reply out[4];
    for (int i = 0; i < 4; i++) assert_int_equal(cellm_submit(e, &p, &r[i]), CELLM_OK);
    for (int i = 0; i < 4; i++) finish(r[i], &out[i]);
    reply again;
    ask(e, sys, questions[0], 6, &again);
    assert_true(again.res.n_cached_tokens > 0);
    for (int i = 0; i < 4; i++) assert_same(&out[i], &again);
    cellm_engine_free(e);
}

static int setup(void **state) {
    (void)state;
    char path[4096];
    return cellm_model_load(test_model_path("smollm2-135m", path, sizeof path), NULL, &g_model) ==
                   CELLM_OK
               ? 0
               : -1;
}

static int teardown(void **state) {
    (void)state;
    cellm_model_free(g_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_smollm2),
        cmocka_unit_test(test_session_shares_system_prompt),
        cmocka_unit_test(test_asan_session_fork),
        cmocka_unit_test(test_asan_session_save_restore),
        cmocka_unit_test(test_asan_compressed_kv_prefix_session),
        cmocka_unit_test(test_asan_window_kv_session),
        cmocka_unit_test(test_asan_session_restore_across_processes),
        cmocka_unit_test(test_tsan_shared_prompt),
        cmocka_unit_test(test_prefix_gemma),
    };
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}

/*
 * test_session.c — chat sessions, memory trimming and the power/QoS policy
 * of the engine (include/cellm.h) on SmolLM2:
 *  - a session's later turns compute only their new tokens (the result's
 *    n_cached_tokens and the engine's prompt-token count say so) and give
 *    the greedy reply that submitting the whole conversation as one request
 *    gives;
 *  - when the kept tokens and the new rendering disagree (a reply cut by a
 *    stop string; a template that changes its first line every turn), the
 *    turn recomputes from the first token that differs and still gives the
 *    one-request reply;
 *  - kept blocks count against the budget and are dropped before anything
 *    is preempted when blocks run short;
 *  - cellm_engine_trim at each level gives back what it says (free pages,
 *    then kept blocks, then running requests' blocks) and requests still
 *    finish with the text they have alone;
 *  - the same on Gemma 3 with a conversation longer than its sliding
 *    window;
 *  - QoS changes while requests run (threads in use, pacing) leave greedy
 *    output unchanged and do not deadlock, and pacing slows steps down;
 *  - argument errors.
 * The test_tsan_* cases are small enough for ThreadSanitizer, where
 * test.sh runs only them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "cellm.h"
#include "test_common.h"

#define MAX_OUT 64

static cellm_model *g_model;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
    nanosleep(&(struct timespec){ms / 1000, (ms % 1000) * 1000000L}, NULL);
}

/* What one request's callbacks collect (engine thread; read after wait). */
typedef struct sink {
    char text[4096];
    size_t len;
    int n_done;
    cellm_result res;
    cellm_engine *trim_engine; /* trim from the first piece callback */
    int trim_status;
    size_t trim_released;
} sink;

static void on_piece(const char *piece, size_t len, void *user) {
    sink *s = user;
    if (s->len + len < sizeof s->text) {
        memcpy(s->text + s->len, piece, len);
        s->len += len;
        s->text[s->len] = '\0';
    }
    if (s->trim_engine) {
        s->trim_status = cellm_engine_trim(s->trim_engine, CELLM_TRIM_LIGHT, &s->trim_released);
        s->trim_engine = NULL;
    }
}

static void on_done(const cellm_result *res, void *user) {
    sink *s = user;
    s->res = *res;
    s->n_done++;
}

/* A finished request's completion tokens and result. */
typedef struct reply {
    int32_t tok[MAX_OUT];
    int32_t n;
    cellm_result res;
    char text[4096];
} reply;

static void collect(cellm_request *r, const sink *s, reply *out) {
    assert_int_equal(cellm_wait(r, &out->res), CELLM_OK);
    assert_int_equal(s->n_done, 1);
    const int32_t *t;
    int32_t n;
    assert_int_equal(cellm_request_tokens(r, &t, &n), CELLM_OK);
    assert_true(n <= MAX_OUT);
    memcpy(out->tok, t, (size_t)n * sizeof *t);
    out->n = n;
    memcpy(out->text, s->text, sizeof out->text);
    cellm_request_free(r);
}

static void assert_same_reply(const reply *a, const reply *b) {
    if (a->n != b->n || memcmp(a->tok, b->tok, (size_t)a->n * sizeof *a->tok)) {
        print_error("replies differ:\n  '%s'\n  '%s'\n", a->text, b->text);
        fail();
    }
    assert_string_equal(a->text, b->text);
    assert_int_equal(a->res.finish_reason, b->res.finish_reason);
}

static cellm_engine *engine_new(int threads, size_t budget) {
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = threads;
    ep.max_ctx = 1024;
    ep.max_batch_tokens = 64;
    if (budget) ep.mem_budget_bytes = budget;
    cellm_engine *e = NULL;
    if (cellm_engine_create(g_model, &ep, &e) != CELLM_OK) {
        print_error("engine: %s\n", cellm_last_error());
        fail();
    }
    return e;
}

static cellm_stats stats_of(cellm_engine *e) {
    cellm_stats st;
    assert_int_equal(cellm_engine_stats(e, &st), CELLM_OK);
    return st;
}

static size_t block_bytes(cellm_engine *e) {
    cellm_stats st = stats_of(e);
    return st.bytes_kv_total / (size_t)st.blocks_total;
}

static void assert_pool_empty(cellm_engine *e) {
    cellm_stats st = stats_of(e);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(st.blocks_kept, 0);
    assert_int_equal(st.n_running, 0);
    assert_int_equal(st.n_waiting, 0);
}

/* One turn of `s` with the session's defaults plus `stop` (may be NULL). */
static void turn(cellm_session *s, const char *text, const char *stop, reply *out) {
    static sink sk;
    memset(&sk, 0, sizeof sk);
    cellm_request_params p = cellm_session_request_params(s);
    const char *stops[1] = {stop};
    if (stop) {
        p.stop = stops;
        p.n_stop = 1;
    }
    p.on_piece = on_piece;
    p.on_done = on_done;
    p.user = &sk;
    cellm_request *r = NULL;
    if (cellm_session_send(s, text, &p, &r) != CELLM_OK) {
        print_error("send: %s\n", cellm_last_error());
        fail();
    }
    collect(r, &sk, out);
}

/* The reply to the session's history but its last answer, submitted as
 * one request of messages (with the same stop string) to a fresh engine
 * on model `m` without a prefix cache: computed from scratch. */
static void one_shot(cellm_model *m, cellm_session *s, const char *stop, int32_t max_tokens,
                     reply *out) {
    static sink sk;
    memset(&sk, 0, sizeof sk);
    const cellm_chat_message *msgs;
    int32_t n;
    assert_int_equal(cellm_session_messages(s, &msgs, &n), CELLM_OK);
    assert_true(n >= 2);
    assert_string_equal(msgs[n - 1].role, "assistant");
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 2;
    ep.max_ctx = 2048;
    ep.max_batch_tokens = 64;
    ep.prefix_cache = 0;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(m, &ep, &e), CELLM_OK);
    cellm_request_params p = cellm_request_default_params();
    p.messages = msgs;
    p.n_messages = n - 1;
    p.max_tokens = max_tokens;
    const char *stops[1] = {stop};
    if (stop) {
        p.stop = stops;
        p.n_stop = 1;
    }
    p.on_piece = on_piece;
    p.on_done = on_done;
    p.user = &sk;
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    collect(r, &sk, out);
    assert_int_equal(out->res.n_cached_tokens, 0);
    cellm_engine_free(e);
}

static const char *last_answer(cellm_session *s) {
    const cellm_chat_message *msgs;
    int32_t n;
    assert_int_equal(cellm_session_messages(s, &msgs, &n), CELLM_OK);
    assert_string_equal(msgs[n - 1].role, "assistant");
    return msgs[n - 1].content;
}

static cellm_session *session_new(cellm_engine *e, const char *system, int32_t max_tokens) {
    cellm_session_params sp = cellm_session_default_params();
    sp.system = system;
    sp.max_tokens = max_tokens;
    cellm_session *s = NULL;
    if (cellm_session_create(e, &sp, &s) != CELLM_OK) {
        print_error("session: %s\n", cellm_last_error());
        fail();
    }
    return s;
}

static const char *const questions[] = {
    "What is the capital of France?",
    "And what is the capital of Italy?",
    "Which of the two cities is larger?",
};

/* Later turns compute only their own tokens and reply as one request of
 * the whole conversation would. */
static void test_session_turns(void **state) {
    (void)state;
    cellm_engine *e = engine_new(2, 0);
    cellm_session *s = session_new(e, "You are a helpful assistant.", 24);
    reply r[3], ref;
    int32_t kept_before = 0;
    for (int t = 0; t < 3; t++) {
        cellm_stats before = stats_of(e);
        turn(s, questions[t], NULL, &r[t]);
        cellm_stats after = stats_of(e);
        int32_t computed = (int32_t)(after.n_prompt_tokens - before.n_prompt_tokens);
        print_message("turn %d: %d prompt tokens, %d cached, %d computed: '%s'\n", t,
                      r[t].res.n_prompt_tokens, r[t].res.n_cached_tokens, computed, r[t].text);
        assert_true(r[t].n > 0);
        assert_string_equal(last_answer(s), r[t].text);
        /* The last prompt row asks for logits and counts as a decode row. */
        assert_int_equal(computed, r[t].res.n_prompt_tokens - r[t].res.n_cached_tokens - 1);
        if (t == 0) {
            assert_int_equal(r[t].res.n_cached_tokens, 0);
        } else {
            /* All of the earlier prompt at least, and most of the reply. */
            assert_true(r[t].res.n_cached_tokens >= kept_before);
            assert_true(r[t].res.n_cached_tokens < r[t].res.n_prompt_tokens);
            one_shot(g_model, s, NULL, 24, &ref);
            assert_same_reply(&r[t], &ref);
        }
        kept_before = r[t].res.n_prompt_tokens;
        cellm_stats idle = stats_of(e);
        assert_int_equal(idle.n_sessions_kept, 1);
        assert_true(idle.blocks_kept > 0);
        assert_int_equal(idle.blocks_kept, idle.blocks_used);
    }
    const cellm_chat_message *msgs;
    int32_t n;
    assert_int_equal(cellm_session_messages(s, &msgs, &n), CELLM_OK);
    assert_int_equal(n, 7);
    assert_string_equal(msgs[0].role, "system");
    assert_string_equal(msgs[5].content, questions[2]);
    cellm_session_free(s);
    assert_pool_empty(e);
    cellm_engine_free(e);
}

/* A stop string cuts the reply, so its tokens and the re-rendered history
 * part ways inside the reply: the next turn recomputes from there. */
static void test_session_divergence(void **state) {
    (void)state;
    cellm_engine *e = engine_new(2, 0);
    /* The stop string: five bytes from the middle of the reply. */
    cellm_session *s = session_new(e, NULL, 32);
    reply r1, r2, ref;
    turn(s, questions[0], NULL, &r1);
    cellm_session_free(s);
    char stop[8] = "";
    const char *sp = r1.text;
    for (int k = 0; k < 3 && sp; k++) sp = strchr(sp + 1, ' ');
    assert_non_null(sp);
    assert_true(strlen(sp) > 5);
    memcpy(stop, sp, 5);
    s = session_new(e, NULL, 32);
    turn(s, questions[0], stop, &r1);
    assert_int_equal(r1.res.finish_reason, CELLM_FINISH_STOP);
    assert_true(r1.res.stop_index == 0);
    print_message("cut reply: '%s'\n", r1.text);
    turn(s, questions[1], NULL, &r2);
    int32_t kept = r1.res.n_prompt_tokens + r1.n;
    print_message("cached %d of %d kept\n", r2.res.n_cached_tokens, kept);
    assert_true(r2.res.n_cached_tokens >= r1.res.n_prompt_tokens);
    assert_true(r2.res.n_cached_tokens < kept - 1);
    one_shot(g_model, s, NULL, 32, &ref);
    assert_same_reply(&r2, &ref);
    cellm_session_free(s);

    /* A template whose first line changes every turn: nothing is reused
     * past it, and the replies still match. */
    static const char tpl[] =
        "Turns: {{ messages|length }}\n{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
        "<|im_start|>assistant\n{% endif %}";
    cellm_model_params mp = cellm_model_default_params();
    mp.chat_template = tpl;
    char path[4096];
    cellm_model *m2 = NULL;
    assert_int_equal(cellm_model_load(test_model_path("smollm2-135m", path, sizeof path), &mp, &m2),
                     CELLM_OK);
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 2;
    ep.max_ctx = 1024;
    ep.max_batch_tokens = 64;
    cellm_engine *e2 = NULL;
    assert_int_equal(cellm_engine_create(m2, &ep, &e2), CELLM_OK);
    s = session_new(e2, NULL, 16);
    turn(s, questions[0], NULL, &r1);
    turn(s, questions[1], NULL, &r2);
    print_message("changing template: cached %d of %d\n", r2.res.n_cached_tokens,
                  r2.res.n_prompt_tokens);
    assert_true(r2.res.n_cached_tokens < 8 && r2.res.n_prompt_tokens > 40);
    one_shot(m2, s, NULL, 16, &ref);
    assert_same_reply(&r2, &ref);
    cellm_session_free(s);
    cellm_engine_free(e2);
    cellm_model_free(m2);
    cellm_engine_free(e);
}

/* Runs one prompt to the end; its reply into *out. */
static void run_prompt(cellm_engine *e, const char *prompt, int32_t max_tokens, reply *out) {
    static sink sk;
    memset(&sk, 0, sizeof sk);
    cellm_request_params p = cellm_request_default_params();
    p.prompt = prompt;
    p.max_tokens = max_tokens;
    p.on_piece = on_piece;
    p.on_done = on_done;
    p.user = &sk;
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    collect(r, &sk, out);
}

/* Kept blocks count against the budget and give way first. */
static void test_asan_session_pressure(void **state) {
    (void)state;
    cellm_engine *probe = engine_new(2, 0);
    cellm_stats st = stats_of(probe);
    size_t block = block_bytes(probe);
    reply alone, squeezed, r1, r2, ref;
    run_prompt(probe, "The history of the Roman empire, told briefly:", 60, &alone);
    cellm_engine_free(probe);

    /* 8 blocks: a session keeps 4, the long prompt needs 5. */
    cellm_engine *e = engine_new(2, st.bytes_activations + 8 * block + block / 2);
    assert_int_equal(stats_of(e).blocks_total, 8);
    cellm_session *s = session_new(e, NULL, 24);
    turn(s, questions[0], NULL, &r1);
    cellm_stats kept = stats_of(e);
    print_message("kept %d blocks\n", kept.blocks_kept);
    assert_true(kept.blocks_kept >= 4);
    assert_int_equal(kept.n_sessions_kept, 1);

    run_prompt(e, "The history of the Roman empire, told briefly:", 60, &squeezed);
    assert_same_reply(&alone, &squeezed);
    cellm_stats after = stats_of(e);
    assert_int_equal(after.blocks_kept, 0); /* dropped for the request */
    assert_int_equal(after.n_sessions_kept, 0);
    assert_int_equal(after.n_preemptions, 0); /* and nothing was preempted */

    turn(s, questions[1], NULL, &r2);
    /* The kept blocks are gone; what the prefix cache still had of them
     * (whole blocks the long prompt did not need) may serve again. */
    print_message("turn 2 after the drop: %d cached tokens\n", r2.res.n_cached_tokens);
    assert_int_equal(r2.res.n_cached_tokens % 16, 0);
    assert_true(r2.res.n_cached_tokens < r1.res.n_prompt_tokens + r1.res.n_completion_tokens);
    one_shot(g_model, s, NULL, 24, &ref);
    assert_same_reply(&r2, &ref);
    cellm_session_free(s);
    assert_pool_empty(e);
    cellm_engine_free(e);
}

#if defined(__linux__)
/* Resident bytes of this process, from /proc. */
static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    unsigned long size = 0, resident = 0;
    assert_int_equal(fscanf(f, "%lu %lu", &size, &resident), 2);
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}
#endif

#define N_TRIM 4
static const char *const trim_prompts[N_TRIM] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The first five prime numbers are",
    "def fibonacci(n):",
};

/* Submits the N_TRIM prompts at once with `max_tokens` each. */
static void submit_all(cellm_engine *e, int32_t max_tokens, sink *sk, cellm_request **req) {
    for (int i = 0; i < N_TRIM; i++) {
        memset(&sk[i], 0, sizeof sk[i]);
        cellm_request_params p = cellm_request_default_params();
        p.prompt = trim_prompts[i];
        p.max_tokens = max_tokens;
        p.on_piece = on_piece;
        p.on_done = on_done;
        p.user = &sk[i];
        assert_int_equal(cellm_submit(e, &p, &req[i]), CELLM_OK);
    }
}

static void test_trim_levels(void **state) {
    (void)state;
    cellm_engine *e = engine_new(2, 0);
    size_t released = 1;
    assert_int_equal(cellm_engine_trim(e, (cellm_trim_level)0, &released), CELLM_ERR_INVALID_ARG);
    assert_int_equal(released, 0);
    assert_int_equal(cellm_engine_trim(e, (cellm_trim_level)4, NULL), CELLM_ERR_INVALID_ARG);

    /* References: each prompt alone. */
    static reply ref[N_TRIM], got[N_TRIM];
    for (int i = 0; i < N_TRIM; i++) run_prompt(e, trim_prompts[i], 40, &ref[i]);
    cellm_stats st = stats_of(e);
    assert_int_equal(st.blocks_used, 0);
    assert_true(st.bytes_kv_resident > 0);
    size_t block = block_bytes(e);

    /* LIGHT: the pages of the free blocks go back to the OS. */
#if defined(__linux__)
    size_t rss0 = rss_bytes();
#endif
    assert_int_equal(cellm_engine_trim(e, CELLM_TRIM_LIGHT, &released), CELLM_OK);
    print_message("light trim: %zu of %zu resident bytes released\n", released,
                  st.bytes_kv_resident);
    assert_true(released + 2 * 65536 >= st.bytes_kv_resident && released > 0);
    assert_true(released <= st.bytes_kv_resident);
#if defined(__linux__)
    size_t rss1 = rss_bytes();
    print_message("rss %zu -> %zu\n", rss0, rss1);
    assert_true(rss0 > rss1 && rss0 - rss1 >= released / 2);
#endif
    cellm_stats st1 = stats_of(e);
    assert_int_equal(st1.bytes_kv_resident, 0);
    assert_int_equal(st1.bytes_released, released);
    assert_int_equal(st1.n_trims, 1);
    /* Released blocks are used again, zeroed, with the same results. */
    run_prompt(e, trim_prompts[1], 40, &got[1]);
    assert_same_reply(&ref[1], &got[1]);

    /* A session's kept blocks survive LIGHT, not MODERATE. */
    cellm_session *s = session_new(e, NULL, 16);
    reply t1, t2, t3, one;
    turn(s, questions[0], NULL, &t1);
    cellm_stats ks = stats_of(e);
    assert_true(ks.blocks_kept > 0);
    assert_int_equal(cellm_engine_trim(e, CELLM_TRIM_LIGHT, &released), CELLM_OK);
    assert_int_equal(stats_of(e).blocks_kept, ks.blocks_kept);
    assert_true(stats_of(e).bytes_kv_resident >= (size_t)ks.blocks_kept * block);
    turn(s, questions[1], NULL, &t2);
    assert_true(t2.res.n_cached_tokens > 0);
    ks = stats_of(e);
    assert_int_equal(cellm_engine_trim(e, CELLM_TRIM_MODERATE, &released), CELLM_OK);
    print_message("moderate trim: %zu bytes for %d kept blocks\n", released, ks.blocks_kept);
    assert_true(released + 65536 >= (size_t)ks.blocks_kept * block);
    cellm_stats st2 = stats_of(e);
    assert_int_equal(st2.blocks_kept, 0);
    assert_int_equal(st2.blocks_used, 0);
    assert_int_equal(st2.bytes_kv_resident, 0);
    turn(s, questions[2], NULL, &t3);
    assert_int_equal(t3.res.n_cached_tokens, 0);
    one_shot(g_model, s, NULL, 16, &one);
    assert_same_reply(&t3, &one);
    cellm_session_free(s);

    /* CRITICAL while four requests run: they are preempted, their blocks
     * released, and they finish with the text they have alone. */
    static sink sk[N_TRIM];
    cellm_request *req[N_TRIM];
    submit_all(e, 40, sk, req);
    double t0 = now_s();
    for (;;) {
        cellm_stats now = stats_of(e);
        if (now.n_running == N_TRIM && now.n_completion_tokens >= st2.n_completion_tokens + 8)
            break;
        assert_true(now_s() - t0 < 60);
        sleep_ms(1);
    }
    uint64_t preempt0 = stats_of(e).n_preemptions;
    assert_int_equal(cellm_engine_trim(e, CELLM_TRIM_CRITICAL, &released), CELLM_OK);
    print_message("critical trim: %zu bytes\n", released);
    assert_true(released > 0);
    int32_t n_preempted = 0;
    for (int i = 0; i < N_TRIM; i++) {
        collect(req[i], &sk[i], &got[i]);
        assert_same_reply(&ref[i], &got[i]);
        n_preempted += got[i].res.n_preemptions;
    }
    assert_true(stats_of(e).n_preemptions > preempt0);
    assert_true(n_preempted > 0);

    /* From a callback the trim is queued, not waited for. */
    sink cb;
    memset(&cb, 0, sizeof cb);
    cb.trim_engine = e;
    cb.trim_released = 1;
    cellm_request_params p = cellm_request_default_params();
    p.prompt = trim_prompts[0];
    p.max_tokens = 8;
    p.on_piece = on_piece;
    p.on_done = on_done;
    p.user = &cb;
    cellm_request *r = NULL;
    uint64_t trims = stats_of(e).n_trims;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    collect(r, &cb, &got[0]);
    assert_int_equal(cb.trim_status, CELLM_OK);
    assert_int_equal(cb.trim_released, 0);
    t0 = now_s();
    while (stats_of(e).n_trims == trims) {
        assert_true(now_s() - t0 < 10);
        sleep_ms(1);
    }
    assert_pool_empty(e);
    /* The request held a block then; now it is free, and goes back too. */
    assert_int_equal(cellm_engine_trim(e, CELLM_TRIM_LIGHT, &released), CELLM_OK);
    assert_int_equal(stats_of(e).bytes_kv_resident, 0);
    cellm_engine_free(e);
}

/* ---- QoS ---- */

typedef struct qos_arg {
    cellm_engine *e;
    atomic_bool stop;
    int changes;
} qos_arg;

/* Cycles the policy while requests run. */
static void *qos_thread(void *p) {
    qos_arg *a = p;
    static const cellm_qos policies[] = {
        {1, 0, 1.0f}, {2, 0, 1.0f}, {1, 2000, 1.0f}, {0, 0, 0.5f}, {2, 1000, 0.8f}, {0, 0, 1.0f},
    };
    int n = (int)(sizeof policies / sizeof *policies);
    for (int i = 0; !atomic_load(&a->stop); i++) {
        if (cellm_engine_set_qos(a->e, &policies[i % n]) != CELLM_OK) return "set_qos failed";
        cellm_qos q;
        if (cellm_engine_get_qos(a->e, &q) != CELLM_OK) return "get_qos failed";
        a->changes++;
        sleep_ms(5);
    }
    return NULL;
}

static void test_tsan_qos_changes(void **state) {
    (void)state;
    cellm_engine *e = engine_new(2, 0);
    static reply ref[N_TRIM], got[N_TRIM];
    static sink sk[N_TRIM];
    cellm_request *req[N_TRIM];
    submit_all(e, 8, sk, req);
    for (int i = 0; i < N_TRIM; i++) collect(req[i], &sk[i], &ref[i]);
    assert_int_equal(stats_of(e).n_threads, 2);

    qos_arg a = {.e = e};
    atomic_init(&a.stop, false);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, qos_thread, &a), 0);
    submit_all(e, 8, sk, req);
    for (int i = 0; i < N_TRIM; i++) {
        collect(req[i], &sk[i], &got[i]);
        assert_same_reply(&ref[i], &got[i]);
    }
    atomic_store(&a.stop, true);
    void *ret = NULL;
    pthread_join(th, &ret);
    assert_null(ret);
    print_message("%d policy changes\n", a.changes);
    assert_true(a.changes > 0);

    /* Pacing by interval: at least 100 ms from step to step on one thread;
     * 3 tokens take 3 steps. */
    cellm_qos q = {1, 100000, 1.0f};
    assert_int_equal(cellm_engine_set_qos(e, &q), CELLM_OK);
    double t0 = now_s();
    reply one;
    run_prompt(e, trim_prompts[0], 3, &one);
    double dt = now_s() - t0;
    cellm_stats st = stats_of(e);
    print_message("3 tokens paced at 100 ms: %.0f ms\n", dt * 1e3);
    assert_true(dt >= 0.2);
    assert_int_equal(st.n_threads, 1);
    assert_int_equal(one.n, ref[0].n > 3 ? 3 : ref[0].n);
    assert_memory_equal(one.tok, ref[0].tok, (size_t)one.n * sizeof *one.tok);

    /* Pacing by duty cycle: half the time at rest (after each step but the
     * last: 3 rests in 4 steps), however long a step takes. */
    q = (cellm_qos){0, 0, 0.5f};
    assert_int_equal(cellm_engine_set_qos(e, &q), CELLM_OK);
    double rested = st.rest_seconds;
    t0 = now_s();
    run_prompt(e, trim_prompts[0], 4, &one);
    dt = now_s() - t0;
    st = stats_of(e);
    print_message("duty cycle 0.5: rested %.0f of %.0f ms\n", (st.rest_seconds - rested) * 1e3,
                  dt * 1e3);
    assert_true(st.rest_seconds - rested >= 0.25 * dt);
    assert_int_equal(st.n_threads, 2);
    assert_memory_equal(one.tok, ref[0].tok, (size_t)one.n * sizeof *one.tok);

    /* A cancel ends a long rest at once. */
    q = (cellm_qos){0, 0, 0.01f};
    assert_int_equal(cellm_engine_set_qos(e, &q), CELLM_OK);
    sink c;
    memset(&c, 0, sizeof c);
    cellm_request_params p = cellm_request_default_params();
    p.prompt = trim_prompts[1];
    p.max_tokens = 200;
    p.on_done = on_done;
    p.user = &c;
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    sleep_ms(50);
    t0 = now_s();
    cellm_cancel(r);
    cellm_result res;
    assert_int_equal(cellm_wait(r, &res), CELLM_OK);
    print_message("cancel during rests: %.0f ms\n", (now_s() - t0) * 1e3);
    assert_int_equal(res.finish_reason, CELLM_FINISH_CANCELLED);
    cellm_request_free(r);
    assert_pool_empty(e);
    cellm_engine_free(e); /* with the policy still resting */
}

/* ---- sessions from several threads, with trims (TSan) ---- */

#define SESS_THREADS 4

typedef struct sess_arg {
    cellm_engine *e;
    int id;
} sess_arg;

static void *session_thread(void *p) {
    sess_arg *a = p;
    cellm_session_params sp = cellm_session_default_params();
    sp.max_tokens = 3;
    sp.sampling.temperature = a->id % 2 ? 0.7f : 0.0f;
    sp.sampling.seed = (uint64_t)a->id;
    cellm_session *s = NULL;
    if (cellm_session_create(a->e, &sp, &s) != CELLM_OK) return "create failed";
    for (int t = 0; t < 3; t++) {
        sink sk;
        memset(&sk, 0, sizeof sk);
        cellm_request_params rp = cellm_session_request_params(s);
        rp.on_piece = on_piece;
        rp.on_done = on_done;
        rp.user = &sk;
        cellm_request *r = NULL;
        if (cellm_session_send(s, questions[(a->id + t) % 3], &rp, &r) != CELLM_OK)
            return "send failed";
        cellm_result res;
        cellm_wait(r, &res);
        cellm_request_free(r);
        if (res.finish_reason != CELLM_FINISH_LENGTH && res.finish_reason != CELLM_FINISH_STOP)
            return "turn did not finish";
        const cellm_chat_message *msgs;
        int32_t n;
        if (cellm_session_messages(s, &msgs, &n) != CELLM_OK || n != 2 * (t + 1)) return "history";
    }
    if (a->id == 0) {
        /* Freed with a turn running: cancelled and waited for. */
        cellm_request *r = NULL;
        if (cellm_session_send(s, "One more thing.", NULL, &r) != CELLM_OK) return "send failed";
        cellm_session_free(s);
        cellm_result res;
        cellm_wait(r, &res);
        cellm_request_free(r);
    } else {
        cellm_session_free(s);
    }
    return NULL;
}

static void test_tsan_sessions(void **state) {
    (void)state;
    cellm_engine *probe = engine_new(2, 0);
    cellm_stats st = stats_of(probe);
    size_t block = block_bytes(probe);
    cellm_engine_free(probe);
    /* Room for about three conversations' blocks at once. */
    cellm_engine *e = engine_new(2, st.bytes_activations + 10 * block);
    pthread_t th[SESS_THREADS];
    sess_arg args[SESS_THREADS];
    for (int i = 0; i < SESS_THREADS; i++) {
        args[i] = (sess_arg){e, i};
        assert_int_equal(pthread_create(&th[i], NULL, session_thread, &args[i]), 0);
    }
    for (int k = 0; k < 6; k++) {
        sleep_ms(20);
        assert_int_equal(cellm_engine_trim(e, (cellm_trim_level)(1 + k % 3), NULL), CELLM_OK);
    }
    for (int i = 0; i < SESS_THREADS; i++) {
        void *ret = NULL;
        pthread_join(th[i], &ret);
        if (ret) {
            print_error("thread %d: %s\n", i, (const char *)ret);
            fail();
        }
    }
    assert_pool_empty(e);
    cellm_engine_free(e);
}

/* Gemma 3: a conversation longer than its 512-position sliding window, so
 * the kept KV of its windowed layers has already let go of its oldest
 * blocks when the next turn takes it. */
static void test_session_gemma(void **state) {
    (void)state;
    char path[4096];
    cellm_model *gm = NULL;
    assert_int_equal(cellm_model_load(test_model_path("gemma3-270m", path, sizeof path), NULL, &gm),
                     CELLM_OK);
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 2;
    ep.max_ctx = 2048;
    ep.max_batch_tokens = 128;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(gm, &ep, &e), CELLM_OK);
    static char system[8192];
    size_t len = 0;
    for (int i = 0; len + 100 < sizeof system && i < 60; i++)
        len += (size_t)snprintf(system + len, sizeof system - len,
                                "Rule %d: answer in plain words, and keep it short. ", i + 1);
    cellm_session *s = session_new(e, system, 12);
    reply r1, r2, ref;
    turn(s, questions[0], NULL, &r1);
    turn(s, questions[1], NULL, &r2);
    print_message("gemma: turn 2 has %d prompt tokens, %d cached: '%s'\n", r2.res.n_prompt_tokens,
                  r2.res.n_cached_tokens, r2.text);
    assert_true(r1.res.n_prompt_tokens > 600);
    assert_true(r2.res.n_cached_tokens >= r1.res.n_prompt_tokens);
    one_shot(gm, s, NULL, 12, &ref);
    assert_same_reply(&r2, &ref);
    cellm_session_free(s);
    assert_pool_empty(e);
    cellm_engine_free(e);
    cellm_model_free(gm);
}

/* ---- errors ---- */

static void free_in_done(const cellm_result *res, void *user) {
    (void)res;
    cellm_session_free(user); /* from a callback: freed after the turn */
}

static void test_asan_session_errors(void **state) {
    (void)state;
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 2;
    ep.qos.n_threads = 3;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(g_model, &ep, &e), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "qos.n_threads"));
    ep.qos.n_threads = 0;
    ep.qos.duty_cycle = 0;
    assert_int_equal(cellm_engine_create(g_model, &ep, &e), CELLM_ERR_INVALID_ARG);

    e = engine_new(2, 0);
    cellm_qos q = {0, -1, 1.0f};
    assert_int_equal(cellm_engine_set_qos(e, &q), CELLM_ERR_INVALID_ARG);
    q = (cellm_qos){0, 0, 1.5f};
    assert_int_equal(cellm_engine_set_qos(e, &q), CELLM_ERR_INVALID_ARG);
    assert_int_equal(cellm_engine_get_qos(e, &q), CELLM_OK);
    assert_int_equal(q.n_threads, 0);
    assert_true(q.duty_cycle == 1.0f);

    cellm_session *s = NULL;
    cellm_session_params sp = cellm_session_default_params();
    sp.sampling.repeat_penalty = 0;
    assert_int_equal(cellm_session_create(e, &sp, &s), CELLM_ERR_INVALID_ARG);
    assert_null(s);
    s = session_new(e, "Be brief.", 8);
    cellm_request *r = NULL;
    cellm_request_params p = cellm_session_request_params(s);
    p.prompt = "no";
    assert_int_equal(cellm_session_send(s, "Hi", &p, &r), CELLM_ERR_INVALID_ARG);
    assert_null(r);
    assert_int_equal(cellm_session_send(s, NULL, NULL, &r), CELLM_ERR_INVALID_ARG);

    /* One turn at a time; the history is not readable while it runs. */
    p = cellm_session_request_params(s);
    p.max_tokens = 200;
    assert_int_equal(cellm_session_send(s, "Tell me a long story.", &p, &r), CELLM_OK);
    cellm_request *r2 = NULL;
    assert_int_equal(cellm_session_send(s, "Hello?", NULL, &r2), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "previous turn"));
    const cellm_chat_message *msgs;
    int32_t n;
    assert_int_equal(cellm_session_messages(s, &msgs, &n), CELLM_ERR_INVALID_ARG);
    /* Cancelled before its first token: the history is as before. */
    cellm_cancel(r);
    cellm_result res;
    cellm_wait(r, &res);
    cellm_request_free(r);
    assert_int_equal(cellm_session_messages(s, &msgs, &n), CELLM_OK);
    if (res.n_completion_tokens == 0)
        assert_int_equal(n, 1);
    else
        assert_int_equal(n, 3);

    /* A conversation longer than the context is refused; history unchanged. */
    static char longm[8192];
    for (size_t i = 0; i + 6 < sizeof longm; i += 6) memcpy(longm + i, "hello ", 6);
    int32_t n_before = n;
    assert_int_equal(cellm_session_send(s, longm, NULL, &r), CELLM_ERR_INVALID_ARG);
    assert_int_equal(cellm_session_messages(s, &msgs, &n), CELLM_OK);
    assert_int_equal(n, n_before);

    /* Freed from its own turn's done callback. */
    p = cellm_session_request_params(s);
    p.on_done = free_in_done;
    p.user = s;
    assert_int_equal(cellm_session_send(s, "Hi!", &p, &r), CELLM_OK);
    assert_int_equal(cellm_wait(r, NULL), CELLM_OK);
    cellm_request_free(r);
    assert_pool_empty(e);
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
        cmocka_unit_test(test_asan_session_errors), cmocka_unit_test(test_session_turns),
        cmocka_unit_test(test_session_divergence),  cmocka_unit_test(test_asan_session_pressure),
        cmocka_unit_test(test_trim_levels),         cmocka_unit_test(test_session_gemma),
        cmocka_unit_test(test_tsan_qos_changes),    cmocka_unit_test(test_tsan_sessions),
    };
    /* test.sh runs only test_tsan_* under ThreadSanitizer. */
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}

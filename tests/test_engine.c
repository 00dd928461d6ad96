/*
 * test_engine.c — the public engine API (include/cellm.h) on SmolLM2:
 *  - batch invariance: greedy completions of 8 prompts (text, chat messages
 *    and token inputs) are token-identical run alone, all 8 at once, and
 *    with 1 or 2 compute threads; seeded sampled ones alone and together;
 *  - a KV budget too small for all requests at once: every one completes
 *    with the text it has alone, through queueing and preemption;
 *  - argument and budget errors come back as status codes with messages;
 *  - stop strings: one that spans two tokens ends the text just before it,
 *    none of its bytes reaches the stream, the finish reason is STOP and
 *    the result names it; bad stop strings are refused;
 *  - seeds: the same seed and prompt give the same text across runs and
 *    with 1 or 2 compute threads, with every sampler step on;
 *  - logit bias and penalties change what the engine picks;
 *  - chat templates: the model's own Jinja template, the built-in format
 *    and a template given as text; errors that name the fault;
 *  - test_tsan_engine_stress: 16 threads submit, stream, cancel (from their
 *    own thread and from a callback) and free requests for a fixed number
 *    of rounds against one engine with a tight budget; afterwards every KV
 *    block is back in the pool. It is small (few tokens) so that it can run
 *    under ThreadSanitizer, where test.sh runs only it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "cellm.h"
#include "test_common.h"

#define N_PROMPTS 8
#define MAX_OUT 64

static cellm_model *g_model;

/* What the callbacks of one request collect. Written on the engine thread,
 * read after cellm_wait (which orders the two). */
typedef struct sink {
    char text[4096];
    size_t len;
    size_t ends[512]; /* where each piece ended in text */
    int n_pieces, n_done;
    cellm_result res;
    _Atomic(cellm_request *) cancel_me; /* cancel this request at its first piece */
} sink;

static void on_piece(const char *piece, size_t len, void *user) {
    sink *s = user;
    if (s->len + len < sizeof s->text) {
        memcpy(s->text + s->len, piece, len);
        s->len += len;
        s->text[s->len] = '\0';
    }
    if (s->n_pieces < 512) s->ends[s->n_pieces] = s->len;
    s->n_pieces++;
    cellm_request *c = atomic_load(&s->cancel_me);
    if (c) cellm_cancel(c);
}

static void on_done(const cellm_result *res, void *user) {
    sink *s = user;
    s->res = *res;
    s->n_done++;
}

/* The 8 inputs: prompts, chat conversations and raw token ids. */
static const char *const prompts[N_PROMPTS] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The first five prime numbers are",
    "List three colours of the rainbow.",
    "def fibonacci(n):",
    "In 1969, the first humans",
    "The three laws of thermodynamics are",
    "Explain why the sky is blue in one sentence.",
};

static float g_temperature; /* 0: greedy; else sampled with seed = prompt index */

static cellm_request_params input(int i, int32_t max_tokens, sink *s, cellm_chat_message *msgs,
                                  int32_t **ids) {
    cellm_request_params p = cellm_request_default_params();
    p.max_tokens = max_tokens;
    p.sampling.temperature = g_temperature;
    p.sampling.top_p = 0.95f;
    p.sampling.seed = 1000u + (uint64_t)i;
    p.on_piece = on_piece;
    p.on_done = on_done;
    p.user = s;
    if (i % 3 == 1) { /* chat messages */
        msgs[0] = (cellm_chat_message){"system", "You are a helpful assistant."};
        msgs[1] = (cellm_chat_message){"user", prompts[i]};
        p.messages = msgs;
        p.n_messages = 2;
    } else if (i % 3 == 2) { /* token ids */
        int32_t n = 0;
        assert_int_equal(cellm_tokenize(g_model, prompts[i], ids, &n), CELLM_OK);
        p.tokens = *ids;
        p.n_tokens = n;
    } else {
        p.prompt = prompts[i];
    }
    return p;
}

typedef struct outputs {
    int32_t tok[N_PROMPTS][MAX_OUT];
    int32_t n[N_PROMPTS];
    char text[N_PROMPTS][4096];
    cellm_finish_reason why[N_PROMPTS];
} outputs;

/* Runs prompts [0, N_PROMPTS) on `e`, `at_once` of them at a time. */
static void run_prompts(cellm_engine *e, int at_once, int32_t max_tokens, outputs *o) {
    static sink sinks[N_PROMPTS];
    cellm_chat_message msgs[N_PROMPTS][2];
    int32_t *ids[N_PROMPTS] = {0};
    cellm_request *req[N_PROMPTS];
    memset(sinks, 0, sizeof sinks);
    for (int first = 0; first < N_PROMPTS; first += at_once) {
        int last = first + at_once < N_PROMPTS ? first + at_once : N_PROMPTS;
        for (int i = first; i < last; i++) {
            cellm_request_params p = input(i, max_tokens, &sinks[i], msgs[i], &ids[i]);
            assert_int_equal(cellm_submit(e, &p, &req[i]), CELLM_OK);
        }
        for (int i = first; i < last; i++) {
            cellm_result res;
            assert_int_equal(cellm_wait(req[i], &res), CELLM_OK);
            assert_int_equal(sinks[i].n_done, 1);
            assert_true(res.finish_reason == CELLM_FINISH_LENGTH ||
                        res.finish_reason == CELLM_FINISH_STOP);
            const int32_t *t;
            int32_t n;
            assert_int_equal(cellm_request_tokens(req[i], &t, &n), CELLM_OK);
            assert_int_equal(n, res.n_completion_tokens);
            assert_true(n <= max_tokens && n <= MAX_OUT);
            if (res.finish_reason == CELLM_FINISH_LENGTH) assert_int_equal(n, max_tokens);
            memcpy(o->tok[i], t, (size_t)n * sizeof *t);
            o->n[i] = n;
            o->why[i] = res.finish_reason;
            memcpy(o->text[i], sinks[i].text, sizeof o->text[i]);
            cellm_request_free(req[i]);
            free(ids[i]);
        }
    }
}

static void assert_same(const outputs *a, const outputs *b) {
    for (int i = 0; i < N_PROMPTS; i++) {
        if (a->n[i] != b->n[i] || memcmp(a->tok[i], b->tok[i], (size_t)a->n[i] * 4)) {
            print_error("prompt %d differs:\n  '%s'\n  '%s'\n", i, a->text[i], b->text[i]);
            fail();
        }
        assert_string_equal(a->text[i], b->text[i]);
        assert_int_equal(a->why[i], b->why[i]);
    }
}

static cellm_engine *engine_new_kv(int threads, size_t budget, cellm_kv_type kv_type) {
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = threads;
    ep.kv_type = kv_type;
    ep.max_ctx = 512;
    ep.max_batch_tokens = 64;
    if (budget) ep.mem_budget_bytes = budget;
    cellm_engine *e = NULL;
    if (cellm_engine_create(g_model, &ep, &e) != CELLM_OK) {
        print_error("engine: %s\n", cellm_last_error());
        fail();
    }
    return e;
}

static cellm_engine *engine_new(int threads, size_t budget) {
    return engine_new_kv(threads, budget, CELLM_KV_F16);
}

static void assert_pool_empty(cellm_engine *e) {
    cellm_stats st;
    assert_int_equal(cellm_engine_stats(e, &st), CELLM_OK);
    assert_int_equal(st.blocks_used, 0);
    assert_int_equal(st.blocks_free, st.blocks_total);
    assert_int_equal(st.n_running, 0);
    assert_int_equal(st.n_waiting, 0);
    assert_int_equal(st.bytes_in_use, st.bytes_activations);
}

/* (a) alone vs together, 1 vs 2 threads. */
static void test_batch_invariance(void **state) {
    (void)state;
    static outputs alone, together, two_threads;
    cellm_engine *e = engine_new(1, 0);
    run_prompts(e, 1, 16, &alone);
    run_prompts(e, N_PROMPTS, 16, &together);
    assert_same(&alone, &together);
    assert_pool_empty(e);
    cellm_stats st;
    cellm_engine_stats(e, &st);
    assert_true(st.n_completion_tokens > 0 && st.n_prompt_tokens > 0);
    cellm_engine_free(e);

    e = engine_new(2, 0);
    run_prompts(e, N_PROMPTS, 16, &two_threads);
    assert_same(&alone, &two_threads);
    for (int i = 0; i < N_PROMPTS; i++) assert_true(alone.n[i] > 0);

    /* Sampled with a seed per request: the same text alone and together. */
    g_temperature = 0.8f;
    run_prompts(e, 1, 16, &alone);
    run_prompts(e, N_PROMPTS, 16, &together);
    g_temperature = 0.0f;
    assert_same(&alone, &together);
    cellm_engine_free(e);
}

/* An engine without its own thread: steps run by the app (explicitly, or
 * inside cellm_wait / cellm_request_free) give the same greedy text as the
 * threaded engine; stepping from a callback and on a threaded engine are
 * refused; freeing the engine cancels what is left. */
static int g_step_from_cb; /* cellm_engine_step's status when called from a callback */
static cellm_engine *g_manual;
static void on_piece_step(const char *piece, size_t len, void *user) {
    on_piece(piece, len, user);
    int more;
    g_step_from_cb = cellm_engine_step(g_manual, &more);
}

static cellm_engine *manual_engine(int threads) {
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = threads;
    ep.max_ctx = 512;
    ep.max_batch_tokens = 64;
    ep.manual_steps = 1;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(g_model, &ep, &e), CELLM_OK);
    return e;
}

static void test_manual_steps(void **state) {
    (void)state;
    static outputs threaded, manual;
    cellm_engine *e = engine_new(2, 0);
    run_prompts(e, N_PROMPTS, 16, &threaded);
    int more = 0;
    assert_int_equal(cellm_engine_step(e, &more), CELLM_ERR_INVALID_ARG);
    cellm_engine_free(e);

    /* cellm_wait drives the steps. */
    e = manual_engine(2);
    run_prompts(e, N_PROMPTS, 16, &manual);
    assert_same(&threaded, &manual);
    assert_pool_empty(e);

    /* Explicit steps until nothing has work; a step from a callback is
     * refused. */
    static sink sinks[3];
    memset(sinks, 0, sizeof sinks);
    cellm_request *req[3];
    g_manual = e;
    g_step_from_cb = CELLM_OK;
    /* Inputs 0 and 3 are plain prompts in run_prompts, 2 the same prompt's
     * token ids: the same text from a prompt here. */
    static const int which[3] = {0, 2, 3};
    for (int i = 0; i < 3; i++) {
        cellm_request_params p = cellm_request_default_params();
        p.prompt = prompts[which[i]];
        p.max_tokens = 16;
        p.on_piece = i == 0 ? on_piece_step : on_piece;
        p.on_done = on_done;
        p.user = &sinks[i];
        assert_int_equal(cellm_submit(e, &p, &req[i]), CELLM_OK);
    }
    int steps = 0;
    do {
        assert_int_equal(cellm_engine_step(e, &more), CELLM_OK);
        steps++;
    } while (more && steps < 1000);
    assert_false(more);
    assert_int_equal(g_step_from_cb, CELLM_ERR_INVALID_ARG);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(sinks[i].n_done, 1);
        assert_string_equal(sinks[i].text, manual.text[which[i]]);
        cellm_request_free(req[i]);
    }
    /* Steps counted: 16 tokens each, all three in the same steps. */
    assert_true(steps >= 16 && steps < 40);
    assert_pool_empty(e);

    /* Freeing an unfinished request steps until its cancel is done;
     * freeing the engine cancels the rest (their done callbacks run). */
    memset(sinks, 0, sizeof sinks);
    for (int i = 0; i < 2; i++) {
        cellm_request_params p = cellm_request_default_params();
        p.prompt = prompts[i];
        p.max_tokens = 64;
        p.on_piece = on_piece;
        p.on_done = on_done;
        p.user = &sinks[i];
        assert_int_equal(cellm_submit(e, &p, &req[i]), CELLM_OK);
    }
    for (int i = 0; i < 3; i++) assert_int_equal(cellm_engine_step(e, &more), CELLM_OK);
    cellm_request_free(req[0]);
    assert_int_equal(sinks[0].n_done, 1);
    assert_int_equal(sinks[0].res.finish_reason, CELLM_FINISH_CANCELLED);
    cellm_result res;
    assert_int_equal(cellm_wait(req[1], &res), CELLM_OK);
    assert_int_equal(res.finish_reason, CELLM_FINISH_LENGTH);
    cellm_request_free(req[1]);
    cellm_engine_free(e);
}

/* Two threads stepping one manual engine while a third submits: steps run
 * one at a time, every request finishes with the threaded engine's text. */
typedef struct stepper_arg {
    cellm_engine *e;
    atomic_int *stop;
} stepper_arg;

static void *stepper(void *p) {
    stepper_arg *a = p;
    while (!atomic_load(a->stop)) {
        int more;
        if (cellm_engine_step(a->e, &more) != CELLM_OK) return (void *)1;
        if (!more) sched_yield();
    }
    return NULL;
}

static void test_tsan_manual_steppers(void **state) {
    (void)state;
    static outputs threaded;
    cellm_engine *e = engine_new(1, 0);
    run_prompts(e, 4, 8, &threaded);
    cellm_engine_free(e);

    e = manual_engine(1);
    atomic_int stop = 0;
    stepper_arg a = {e, &stop};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, stepper, &a), 0);
    static sink sinks[N_PROMPTS];
    memset(sinks, 0, sizeof sinks);
    cellm_request *req[N_PROMPTS];
    cellm_chat_message msgs[N_PROMPTS][2];
    int32_t *ids[N_PROMPTS] = {0};
    for (int i = 0; i < N_PROMPTS; i++) {
        cellm_request_params p = input(i, 8, &sinks[i], msgs[i], &ids[i]);
        assert_int_equal(cellm_submit(e, &p, &req[i]), CELLM_OK);
    }
    for (int i = 0; i < N_PROMPTS; i++) {
        cellm_result res;
        assert_int_equal(cellm_wait(req[i], &res), CELLM_OK);
        assert_string_equal(sinks[i].text, threaded.text[i]);
        cellm_request_free(req[i]);
        free(ids[i]);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        assert_null(ret);
    }
    assert_pool_empty(e);
    cellm_engine_free(e);
}

/* (c) a budget that holds a few of the requests at a time. */
/* Compressed KV types: the same budget holds as many more blocks as the
 * type is smaller (a block's bytes are its rows' real bytes: Q8_0 34,
 * Q5_0 22 and Q4_0 18 per 32 values against f16's 64), and the output of a request is
 * the same alone and beside the others, with 1 and 2 threads. */
static void test_kv_types(void **state) {
    (void)state;
    static outputs alone, together;
    cellm_stats f16, st;
    cellm_engine *e = engine_new(1, 0);
    cellm_engine_stats(e, &f16);
    cellm_engine_free(e);
    static const struct {
        cellm_kv_type type;
        size_t bytes_per_32;
    } types[] = {{CELLM_KV_Q8_0, 34},   {CELLM_KV_Q4_0, 18},
                 {CELLM_KV_Q4_0H, 18},  {CELLM_KV_K5V4H, 20}, /* K 22, V 18: 20 on average */
                 {CELLM_KV_Q4_0HW, 18}, {CELLM_KV_K5V4HW, 20},
                 {CELLM_KV_Q3_0HW, 14}, {CELLM_KV_K4V3HW, 16}}; /* K 18, V 14 */
    const size_t f16_block = f16.bytes_kv_total / (size_t)f16.blocks_total;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        e = engine_new_kv(1, 0, types[i].type);
        cellm_engine_stats(e, &st);
        assert_int_equal(st.bytes_activations, f16.bytes_activations);
        size_t block = st.bytes_kv_total / (size_t)st.blocks_total;
        assert_int_equal(block * 64, f16_block * types[i].bytes_per_32);
        /* Whole blocks of the same budget: each pool is the budget less
         * under one of its blocks; a window type's sequences take their
         * f16 copies out of it first. */
        int window = types[i].type >= CELLM_KV_Q4_0HW; /* the window types */
        assert_true(st.bytes_kv_total <= f16.bytes_kv_total + f16_block + block);
        if (window)
            assert_true(st.bytes_kv_total < f16.bytes_kv_total);
        else
            assert_true(st.bytes_kv_total + f16_block + block >= f16.bytes_kv_total);
        print_message("KV type %d: %d blocks of %zu bytes (f16: %d of %zu)\n", (int)types[i].type,
                      st.blocks_total, block, f16.blocks_total, f16_block);
        run_prompts(e, 1, 16, &alone);
        cellm_engine_free(e);
        e = engine_new_kv(2, 0, types[i].type);
        run_prompts(e, N_PROMPTS, 16, &together);
        assert_same(&alone, &together);
        assert_pool_empty(e);
        cellm_engine_free(e);
    }
}

static void test_small_budget(void **state) {
    (void)state;
    static outputs alone, squeezed;
    cellm_engine *e = engine_new(2, 0);
    run_prompts(e, 1, 40, &alone);
    cellm_stats st;
    cellm_engine_stats(e, &st);
    cellm_engine_free(e);

    /* Activations plus 10 blocks (160 positions) for 8 requests of 20-60
     * positions each. */
    size_t block = st.bytes_kv_total / (size_t)st.blocks_total;
    e = engine_new(2, st.bytes_activations + 10 * block + block / 2);
    cellm_engine_stats(e, &st);
    assert_int_equal(st.blocks_total, 10);
    run_prompts(e, N_PROMPTS, 40, &squeezed);
    assert_same(&alone, &squeezed);
    cellm_engine_stats(e, &st);
    print_message("small budget: %llu steps, %llu preemptions\n", (unsigned long long)st.n_steps,
                  (unsigned long long)st.n_preemptions);
    assert_true(st.n_preemptions > 0);
    assert_pool_empty(e);
    cellm_engine_free(e);
}

static void test_asan_errors(void **state) {
    (void)state;
    cellm_model *m = NULL;
    assert_int_equal(cellm_model_load("/nonexistent.gguf", NULL, &m), CELLM_ERR_IO);
    assert_null(m);
    assert_true(strlen(cellm_last_error()) > 0);

    cellm_engine_params ep = cellm_engine_default_params();
    ep.mem_budget_bytes = 1 << 20;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(g_model, &ep, &e), CELLM_ERR_NO_MEMORY);
    assert_non_null(strstr(cellm_last_error(), "budget"));
    ep = cellm_engine_default_params();
    ep.kv_type = (cellm_kv_type)99;
    assert_int_equal(cellm_engine_create(g_model, &ep, &e), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "KV type"));

    e = engine_new(1, 0);
    cellm_request_params p = cellm_request_default_params();
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG); /* no input */
    assert_null(r);
    assert_non_null(strstr(cellm_last_error(), "exactly one"));
    int32_t bad = 1 << 30;
    p.tokens = &bad;
    p.n_tokens = 1;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    p = cellm_request_default_params();
    p.prompt = "";
    /* An empty prompt is BOS alone where the model adds BOS, else empty. */
    cellm_status st = cellm_submit(e, &p, &r);
    if (st == CELLM_OK) {
        assert_int_equal(cellm_wait(r, NULL), CELLM_OK);
        cellm_request_free(r);
    } else {
        assert_int_equal(st, CELLM_ERR_INVALID_ARG);
    }
    /* A prompt longer than max_ctx (512). */
    static char longp[8192];
    for (size_t i = 0; i + 6 < sizeof longp; i += 6) memcpy(longp + i, "hello ", 6);
    p.prompt = longp;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_pool_empty(e);
    cellm_engine_free(e);
}

/* ---- (b) the stress test ---- */

#define STRESS_THREADS 16
#define STRESS_ROUNDS 2

typedef struct stress_arg {
    cellm_engine *e;
    int id;
} stress_arg;

static void *stress_thread(void *p) {
    stress_arg *a = p;
    for (int k = 0; k < STRESS_ROUNDS; k++) {
        sink s;
        memset(&s, 0, sizeof s);
        cellm_request_params rp = cellm_request_default_params();
        rp.prompt = prompts[(a->id + k) % N_PROMPTS];
        rp.max_tokens = 1 + (a->id + k) % 3;
        rp.priority = a->id % 3;
        rp.sampling.temperature = (a->id % 2) ? 0.8f : 0.0f;
        rp.sampling.seed = (uint64_t)a->id;
        rp.on_piece = on_piece;
        rp.on_done = on_done;
        rp.user = &s;
        cellm_request *r = NULL;
        int mode = (a->id + k) % 4;
        if (cellm_submit(a->e, &rp, &r) != CELLM_OK) return "submit failed";
        if (mode == 3) atomic_store(&s.cancel_me, r); /* pieces may come before or after */
        cellm_result res;
        memset(&res, 0, sizeof res);
        switch (mode) {
        case 0: /* wait for the whole answer */
            cellm_wait(r, &res);
            if (res.finish_reason != CELLM_FINISH_LENGTH && res.finish_reason != CELLM_FINISH_STOP)
                return "not finished";
            if (res.finish_reason == CELLM_FINISH_LENGTH &&
                res.n_completion_tokens != rp.max_tokens)
                return "wrong length";
            break;
        case 1: /* cancel at once */
            cellm_cancel(r);
            cellm_wait(r, &res);
            break;
        case 2: /* free without waiting: cancels and waits inside */ break;
        case 3: /* cancelled from its piece callback */ cellm_wait(r, &res); break;
        }
        cellm_request_free(r);
        if (mode != 2 && s.n_done != 1) return "done callback count";
        if (mode == 2 && s.n_done > 1) return "done callback count";
    }
    return NULL;
}

static void *stats_thread(void *p) {
    cellm_engine *e = p;
    for (int i = 0; i < 200; i++) {
        cellm_stats st;
        cellm_engine_stats(e, &st);
        if (st.blocks_used > st.blocks_total) return "too many blocks";
        if (st.bytes_in_use > st.bytes_activations + st.bytes_kv_total) return "over budget";
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return NULL;
}

static void test_tsan_engine_stress(void **state) {
    (void)state;
    /* Room for about 6 short requests at once, so that some wait and some
     * are preempted. */
    cellm_engine *probe = engine_new(2, 0);
    cellm_stats st;
    cellm_engine_stats(probe, &st);
    cellm_engine_free(probe);
    size_t block = st.bytes_kv_total / (size_t)st.blocks_total;
    cellm_engine *e = engine_new(2, st.bytes_activations + 12 * block);

    pthread_t th[STRESS_THREADS], sth;
    stress_arg args[STRESS_THREADS];
    for (int i = 0; i < STRESS_THREADS; i++) {
        args[i] = (stress_arg){e, i};
        assert_int_equal(pthread_create(&th[i], NULL, stress_thread, &args[i]), 0);
    }
    assert_int_equal(pthread_create(&sth, NULL, stats_thread, e), 0);
    for (int i = 0; i < STRESS_THREADS; i++) {
        void *ret = NULL;
        pthread_join(th[i], &ret);
        if (ret) {
            print_error("thread %d: %s\n", i, (const char *)ret);
            fail();
        }
    }
    void *ret = NULL;
    pthread_join(sth, &ret);
    assert_null(ret);
    assert_pool_empty(e);
    cellm_engine_stats(e, &st);
    assert_true(st.n_steps > 0);
    cellm_engine_free(e);
}

/* Runs one request to the end; its text and tokens go to `s`. */
static void run_one(cellm_engine *e, const cellm_request_params *base, sink *s) {
    memset(s, 0, sizeof *s);
    cellm_request_params p = *base;
    p.on_piece = on_piece;
    p.on_done = on_done;
    p.user = s;
    cellm_request *r = NULL;
    if (cellm_submit(e, &p, &r) != CELLM_OK) {
        print_error("submit: %s\n", cellm_last_error());
        fail();
    }
    assert_int_equal(cellm_wait(r, NULL), CELLM_OK);
    assert_int_equal(s->n_done, 1);
    cellm_request_free(r);
}

static void test_asan_stop_strings(void **state) {
    (void)state;
    cellm_engine *e = engine_new(1, 0);
    cellm_request_params p = cellm_request_default_params();
    p.prompt = "The first five prime numbers are";
    p.max_tokens = 48;
    static sink all, cut;
    run_one(e, &p, &all);
    assert_int_equal(all.res.finish_reason, CELLM_FINISH_LENGTH);
    assert_int_equal(all.res.stop_token, -1);
    assert_int_equal(all.res.stop_index, -1);
    /* A stop string of the last 2 bytes of one piece and the first 2 of
     * the next, at its first occurrence in the text. */
    char stop[8] = "";
    size_t at = 0;
    for (int i = 1; i + 1 < all.n_pieces && !stop[0]; i++) {
        size_t b = all.ends[i], a = all.ends[i - 1], c = all.ends[i + 1];
        if (b - a < 2 || c - b < 2) continue;
        memcpy(stop, all.text + b - 2, 4);
        stop[4] = '\0';
        at = (size_t)(strstr(all.text, stop) - all.text);
        if (at != b - 2) stop[0] = '\0';
    }
    assert_true(stop[0] != '\0');
    print_message("stop string '%s' at byte %zu of '%s'\n", stop, at, all.text);
    const char *stops[] = {"no such text \x01", stop};
    p.stop = stops;
    p.n_stop = 2;
    run_one(e, &p, &cut);
    assert_int_equal(cut.res.finish_reason, CELLM_FINISH_STOP);
    assert_int_equal(cut.res.stop_index, 1);
    assert_int_equal(cut.res.stop_token, -1);
    assert_int_equal(cut.len, at);
    assert_memory_equal(cut.text, all.text, at);
    assert_null(strstr(cut.text, stop));
    /* The tokens that made the stop string count: up to the one that
     * completed it. */
    assert_true(cut.res.n_completion_tokens < all.res.n_completion_tokens);
    /* A stop string at the very start of the output: nothing at all. */
    char first[3] = {all.text[0], all.text[1], 0};
    const char *stops1[] = {first};
    p.stop = stops1;
    p.n_stop = 1;
    run_one(e, &p, &cut);
    assert_int_equal(cut.res.finish_reason, CELLM_FINISH_STOP);
    assert_int_equal(cut.len, 0);
    assert_int_equal(cut.n_pieces, 0);

    /* A chat reply ends on the end-of-turn token, and says which. */
    cellm_chat_message msgs[] = {{"user", "What is 2+2?"}};
    p = cellm_request_default_params();
    p.messages = msgs;
    p.n_messages = 1;
    p.max_tokens = 64;
    run_one(e, &p, &cut);
    assert_int_equal(cut.res.finish_reason, CELLM_FINISH_STOP);
    assert_true(cut.res.stop_token >= 0);
    assert_int_equal(cut.res.stop_index, -1);

    /* Bad stop strings. */
    cellm_request *r = NULL;
    p = cellm_request_default_params();
    p.prompt = "Hello";
    static char longs[CELLM_MAX_STOP_LEN + 2];
    memset(longs, 'a', sizeof longs - 1);
    const char *bad[CELLM_MAX_STOP_STRINGS + 1];
    for (int i = 0; i <= CELLM_MAX_STOP_STRINGS; i++) bad[i] = "x";
    p.stop = bad;
    p.n_stop = CELLM_MAX_STOP_STRINGS + 1;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "n_stop"));
    bad[3] = "";
    p.n_stop = 4;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "stop string 3"));
    bad[3] = longs;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    bad[3] = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    p.stop = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_null(r);
    assert_pool_empty(e);
    cellm_engine_free(e);
}

/* Every sampler step on, seeded. */
static cellm_request_params sampled(const char *prompt, uint64_t seed) {
    cellm_request_params p = cellm_request_default_params();
    p.prompt = prompt;
    p.max_tokens = test_small() ? 16 : 40;
    p.sampling.temperature = 0.9f;
    p.sampling.top_k = 60;
    p.sampling.top_p = 0.95f;
    p.sampling.min_p = 0.02f;
    p.sampling.typical_p = 0.98f;
    p.sampling.repeat_penalty = 1.1f;
    p.sampling.repeat_last_n = 32;
    p.sampling.presence_penalty = 0.1f;
    p.sampling.frequency_penalty = 0.1f;
    p.sampling.ngram_guard = 3;
    p.sampling.seed = seed;
    return p;
}

static void test_tsan_seed_determinism(void **state) {
    (void)state;
    static sink runs[5];
    const char *prompt = "Once upon a time, in a small village by the sea,";
    cellm_engine *e1 = engine_new(1, 0), *e2 = engine_new(2, 0);
    cellm_request_params p = sampled(prompt, 1234);
    run_one(e1, &p, &runs[0]);
    run_one(e1, &p, &runs[1]);
    run_one(e2, &p, &runs[2]);
    run_one(e2, &p, &runs[3]);
    for (int i = 1; i < 4; i++) {
        assert_int_equal(runs[i].len, runs[0].len);
        assert_string_equal(runs[i].text, runs[0].text);
        assert_int_equal(runs[i].res.n_completion_tokens, runs[0].res.n_completion_tokens);
    }
    print_message("seed 1234: '%s'\n", runs[0].text);
    /* Another seed, another text (the prompt leaves room for many). */
    p = sampled(prompt, 99);
    run_one(e2, &p, &runs[4]);
    assert_true(strcmp(runs[4].text, runs[0].text) != 0);
    /* Ten at once, seeds 1234 and 99 by turns: from eight plain rows in a
     * step the samplers draw on both threads (engine.c, presample), each
     * request's text still the one it has alone. */
    enum { N_TOGETHER = 10 };
    static sink together[N_TOGETHER];
    cellm_request *req[N_TOGETHER];
    for (int i = 0; i < N_TOGETHER; i++) {
        memset(&together[i], 0, sizeof together[i]);
        p = sampled(prompt, i % 2 ? 99 : 1234);
        p.on_piece = on_piece;
        p.on_done = on_done;
        p.user = &together[i];
        assert_int_equal(cellm_submit(e2, &p, &req[i]), CELLM_OK);
    }
    for (int i = 0; i < N_TOGETHER; i++) {
        assert_int_equal(cellm_wait(req[i], NULL), CELLM_OK);
        cellm_request_free(req[i]);
        assert_string_equal(together[i].text, runs[i % 2 ? 4 : 0].text);
    }
    cellm_engine_free(e1);
    cellm_engine_free(e2);
}

static void test_asan_bias_and_penalties(void **state) {
    (void)state;
    cellm_engine *e = engine_new(1, 0);
    static sink plain, biased;
    cellm_request_params p = cellm_request_default_params();
    p.prompt = "The capital of France is";
    p.max_tokens = 8;
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    assert_int_equal(cellm_wait(r, NULL), CELLM_OK);
    const int32_t *t;
    int32_t n;
    assert_int_equal(cellm_request_tokens(r, &t, &n), CELLM_OK);
    assert_true(n >= 2);
    int32_t first = t[0], second = t[1];
    cellm_request_free(r);
    run_one(e, &p, &plain);
    /* Banning the greedy first token changes the text; a big bias on
     * another makes it the first token. */
    cellm_logit_bias ban = {first, -INFINITY};
    p.sampling.logit_bias = &ban;
    p.sampling.n_logit_bias = 1;
    run_one(e, &p, &biased);
    assert_true(strcmp(plain.text, biased.text) != 0);
    cellm_logit_bias push = {second, 100.0f};
    p.sampling.logit_bias = &push;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    assert_int_equal(cellm_wait(r, NULL), CELLM_OK);
    assert_int_equal(cellm_request_tokens(r, &t, &n), CELLM_OK);
    for (int32_t i = 0; i < n; i++) assert_int_equal(t[i], second);
    cellm_request_free(r);
    /* A strong frequency penalty keeps that token from repeating. */
    p.sampling.frequency_penalty = 1000.0f;
    p.sampling.repeat_last_n = 64;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_OK);
    assert_int_equal(cellm_wait(r, NULL), CELLM_OK);
    assert_int_equal(cellm_request_tokens(r, &t, &n), CELLM_OK);
    for (int32_t i = 1; i < n; i++) assert_true(t[i] != t[0]);
    cellm_request_free(r);
    /* Out of range. */
    cellm_logit_bias out = {1 << 30, 1.0f};
    p.sampling.logit_bias = &out;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "logit bias"));
    p.sampling.logit_bias = NULL;
    p.sampling.n_logit_bias = 0;
    p.sampling.repeat_penalty = 0;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "repeat_penalty"));
    p.sampling.repeat_penalty = 1;
    p.sampling.ngram_guard = 4;
    p.sampling.repeat_last_n = 2;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "n-gram"));
    p.sampling.ngram_guard = 0;
    p.sampling.top_p = NAN;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    cellm_engine_free(e);
}

/* The prompt tokens and greedy reply of a chat on model `m`. */
static void chat_once(cellm_model *m, const cellm_chat_message *msgs, int n, sink *s) {
    cellm_engine_params ep = cellm_engine_default_params();
    ep.n_threads = 1;
    ep.max_ctx = 512;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(m, &ep, &e), CELLM_OK);
    cellm_request_params p = cellm_request_default_params();
    p.messages = msgs;
    p.n_messages = n;
    p.max_tokens = 16;
    run_one(e, &p, s);
    cellm_engine_free(e);
}

static void test_asan_chat_templates(void **state) {
    (void)state;
    char path[4096];
    test_model_path("smollm2-135m", path, sizeof path);
    static sink own, builtin, given;
    const cellm_chat_message msgs[] = {{"user", "What is 2+2?"}};
    /* SmolLM2's own template writes the same prompt as the built-in
     * ChatML with its default system prompt. */
    chat_once(g_model, msgs, 1, &own);
    cellm_model_params mp = cellm_model_default_params();
    mp.chat_template = "chatml";
    cellm_model *m = NULL;
    assert_int_equal(cellm_model_load(path, &mp, &m), CELLM_OK);
    chat_once(m, msgs, 1, &builtin);
    cellm_model_free(m);
    assert_int_equal(own.res.n_prompt_tokens, builtin.res.n_prompt_tokens);
    assert_string_equal(own.text, builtin.text);
    assert_true(own.res.n_prompt_tokens > 20); /* the default system prompt is in */
    /* A template given as text. */
    mp.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}";
    assert_int_equal(cellm_model_load(path, &mp, &m), CELLM_OK);
    chat_once(m, msgs, 1, &given);
    int32_t *ids = NULL, n = 0;
    assert_int_equal(cellm_tokenize(m, "What is 2+2?", &ids, &n), CELLM_OK);
    assert_int_equal(given.res.n_prompt_tokens, n);
    free(ids);
    cellm_model_free(m);
    /* Errors: an unknown name, a template that does not parse. */
    mp.chat_template = "vicuna";
    assert_int_equal(cellm_model_load(path, &mp, &m), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "chatml"));
    mp.chat_template = "{% for m in messages %}{{ m.content | nope }}{% endfor %}";
    assert_int_equal(cellm_model_load(path, &mp, &m), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "nope"));
    assert_non_null(strstr(cellm_last_error(), "byte"));
    assert_null(m);
    /* A template that raises on some conversations loads, and the request
     * gets the template's message. */
    mp.chat_template = "{% if messages[0].role == 'system' %}{{ raise_exception('no system "
                       "role') }}{% endif %}{{ messages[0].content }}";
    assert_int_equal(cellm_model_load(path, &mp, &m), CELLM_OK);
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(m, NULL, &e), CELLM_OK);
    const cellm_chat_message sys[] = {{"system", "Be brief."}, {"user", "Hi"}};
    cellm_request_params p = cellm_request_default_params();
    p.messages = sys;
    p.n_messages = 2;
    cellm_request *r = NULL;
    assert_int_equal(cellm_submit(e, &p, &r), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "no system role"));
    cellm_engine_free(e);
    cellm_model_free(m);
}

static int setup(void **state) {
    (void)state;
    char path[4096];
    test_model_path("smollm2-135m", path, sizeof path);
    if (cellm_model_load(path, NULL, &g_model) != CELLM_OK) {
        print_error("%s\n", cellm_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cellm_model_free(g_model);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_asan_errors),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_small_budget),
        cmocka_unit_test(test_kv_types),
        cmocka_unit_test(test_manual_steps),
        cmocka_unit_test(test_tsan_manual_steppers),
        cmocka_unit_test(test_asan_stop_strings),
        cmocka_unit_test(test_tsan_seed_determinism),
        cmocka_unit_test(test_asan_bias_and_penalties),
        cmocka_unit_test(test_asan_chat_templates),
        cmocka_unit_test(test_tsan_engine_stress),
    };
    /* test.sh runs only test_tsan_* under ThreadSanitizer. */
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}

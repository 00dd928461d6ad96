/*
 * test_spec.c — speculative decoding (src/runtime/spec.c) is exact by construction:
 *  - prompt lookup proposes the continuation of the latest earlier match
 *    of the longest n-gram (unit cases);
 *  - on the real models (SmolLM2 drafted by its Q4_0 requantization,
 *    Gemma 3 by its own), 50 varied prompts give byte-identical
 *    completions with a draft model, with prompt lookup and with both, as
 *    without: greedy and seeded sampling, one session at a time and 8 at
 *    once; the statistics show guesses were made and kept;
 *  - the same holds with the phone memory mode's 512 MiB process budget,
 *    and a draft that does not fit is refused at creation with the
 *    figures;
 * *  - a draft of another vocabulary (the tiny llama of the architecture
 *    fixtures, converted) or family is refused, naming which.
 * The draft files are made by scripts/test.sh (cellm quantize ... Q4_0);
 * the test says how when they are missing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "cellm.h"
#include "runtime/engine.h"
#include "test_common.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define N_PROMPTS 6 /* sanitizer builds: the same checks on fewer prompts */
#else
#define N_PROMPTS 50
#endif
/* Seeded sampling checks the same on the first N_SAMPLED prompts (CI time:
 * the greedy runs take every prompt). */
#define N_SAMPLED (N_PROMPTS < 24 ? N_PROMPTS : 24)
#define MAX_NEW 16
#define N_BUDGET (N_PROMPTS < 8 ? N_PROMPTS : 8) /* prompts of test_asan_budget */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *const prompts[50] = {
    /* First those whose answers repeat them: the runs one at a time take
     * the first few, and should see guesses kept. */
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "A list of fruits: apple, banana, cherry, apple, banana,",
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The first five prime numbers are 2, 3, 5,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Water boils at 100 degrees Celsius. Water boils at",
    "Q: What is 12 times 12?\nA:",
    "A haiku about autumn leaves:\n",
    "int main(void) {\n    printf(\"hello, world\\n\");\n    return 0;\n}\n\nThe program above",
    "Monday, Tuesday, Wednesday, Thursday,",
    "The mitochondria is the powerhouse of",
    "Translate to French: Good morning, how are you?\nFrench:",
    "Rewrite with the names changed: def add(a, b): return a + b. Rewritten: def sum_two(x, y):",
    "Summarise: The meeting covered the budget, the hiring plan and the new office. In short,",
    "The best way to learn a language is",
    "Dear Sir or Madam,\n\nI am writing to",
    "SELECT name, age FROM users WHERE",
    "In 1969, astronauts first",
    "The recipe needs flour, sugar, eggs and",
    "for (int i = 0; i < n; i++) {\n    sum +=",
    "Photosynthesis is the process by which",
    "She opened the door and saw",
    "The three laws of thermodynamics are",
    "Hello! My name is",
    "To be or not to be, that is",
    "The stock market today",
    "import numpy as np\nx = np.array([1, 2, 3])\nprint(",
    "Why is the sky blue? Because",
    "The cat sat on the mat. The dog sat on the",
    "Step 1: Preheat the oven. Step 2:",
    "The largest planet in our solar system is",
    "Once more, the text: alpha beta gamma delta. Again: alpha beta",
    "<html>\n<head>\n<title>",
    "The weather forecast for tomorrow says",
    "Roses are red, violets are blue,",
    "An apple a day keeps",
    "The theory of relativity states that",
    "My favourite book is",
    "x = 1\ny = 2\nz = x + y\nprint(z)\n# Output:",
    "The Great Wall of China was built",
    "Knock knock. Who's there?",
    "A good password should",
    "The chemical symbol for gold is",
    "Ingredients: 2 cups rice, 1 cup water. Ingredients: 2 cups",
    "The story ends when",
    "git commit -m \"",
    "In the beginning",
    "The answer to life, the universe and everything is",
};

/* ------------------------------------------------------------- lookup */

static void test_asan_lookup(void **state) {
    (void)state;
    int32_t out[8];
    /* "a b c d a b" -> after the earlier "a b": "c d a b" (bounded by k). */
    const int32_t t1[] = {1, 2, 3, 4, 1, 2};
    assert_int_equal(spec_lookup(t1, 6, 2, 3, out), 3);
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 4);
    assert_int_equal(out[2], 1);
    /* The latest occurrence wins: "5 9 ... 5 7 ... 5" -> 7. */
    const int32_t t2[] = {5, 9, 0, 5, 7, 0, 5};
    assert_int_equal(spec_lookup(t2, 7, 1, 1, out), 1);
    assert_int_equal(out[0], 7);
    /* The longest n-gram first: "1 2 8 | 3 2 9 | 1 2" with n=2 finds "1 2" -> 8,
     * though the 1-gram "2" occurs later (-> 9). */
    const int32_t t3[] = {1, 2, 8, 3, 2, 9, 1, 2};
    assert_int_equal(spec_lookup(t3, 8, 2, 1, out), 1);
    assert_int_equal(out[0], 8);
    assert_int_equal(spec_lookup(t3, 8, 1, 1, out), 1);
    assert_int_equal(out[0], 9);
    /* No match, k of 0, one token. */
    const int32_t t4[] = {1, 2, 3};
    assert_int_equal(spec_lookup(t4, 3, 3, 4, out), 0);
    assert_int_equal(spec_lookup(t1, 6, 2, 0, out), 0);
    assert_int_equal(spec_lookup(t1, 1, 2, 4, out), 0);
    /* The continuation stops at the end of the text. */
    const int32_t t5[] = {7, 7, 7};
    assert_int_equal(spec_lookup(t5, 3, 2, 8, out), 1);
    assert_int_equal(out[0], 7);
    /* From 2 tokens up unless ngram_max is 1: "4 1 | 6 1" with n=2 finds
     * no "6 1" before, and does not fall back to the 1-gram "1" (-> 6). */
    const int32_t t6[] = {4, 1, 6, 1};
    assert_int_equal(spec_lookup(t6, 4, 2, 2, out), 0);
    assert_int_equal(spec_lookup(t6, 4, 4, 2, out), 0);
    assert_int_equal(spec_lookup(t6, 4, 1, 2, out), 2);
    assert_int_equal(out[0], 6);
    assert_int_equal(out[1], 1);
}

/* Prompt lookup fills a request's guesses up to the end of the tile that
 * the step's rows fall in, where the matmul fills that tile up anyway, and
 * within its cap. */
static void test_asan_fill_k(void **state) {
    (void)state;
    /* One request alone: 1 pending row + k guesses. */
    assert_int_equal(spec_fill_k(1, 1, 8), 3); /* 2 rows -> 4 */
    assert_int_equal(spec_fill_k(1, 3, 8), 3); /* 4 rows: a tile's end */
    assert_int_equal(spec_fill_k(1, 4, 8), 7); /* 5 rows -> 8 */
    assert_int_equal(spec_fill_k(1, 2, 2), 2); /* the cap */
    assert_int_equal(spec_fill_k(1, 5, 6), 6);
    assert_int_equal(spec_fill_k(1, 8, 8), 8); /* 9 rows: a row alone is not filled */
    /* After other requests' rows. */
    assert_int_equal(spec_fill_k(6, 1, 8), 2);  /* 7 -> 8 */
    assert_int_equal(spec_fill_k(8, 1, 8), 1);  /* 9: alone past the eights */
    assert_int_equal(spec_fill_k(8, 2, 8), 4);  /* 10 -> 12 */
    assert_int_equal(spec_fill_k(8, 2, 3), 3);  /* the cap */
    assert_int_equal(spec_fill_k(3, 6, 8), 6);  /* 9 */
    assert_int_equal(spec_fill_k(8, 5, 8), 8);  /* 13 -> 16 */
    assert_int_equal(spec_fill_k(12, 1, 8), 4); /* 13 = 8 + 5 -> 16 */
}

/* One step through the gate: asks it, and tells it what the step cost,
 * ms a token (drafted steps draft_ms, plain ones plain_ms; a drafted step
 * that guessed nothing also tells its time without the draft). Returns
 * what the gate said. */
static bool gate_step(spec_gate *g, double draft_ms, double plain_ms, bool guessed) {
    bool d = spec_gate_want(g);
    if (d)
        spec_gate_note(g, true, draft_ms, guessed ? -1 : plain_ms, 1);
    else
        spec_gate_note(g, false, plain_ms, -1, 1);
    return d;
}

/* The draft's gate: it drafts first, measures both sides, keeps drafting
 * while drafted tokens cost less, and while they cost more tries the
 * draft again after 16, 32, 64, ... 256 steps; a trial that wins turns it
 * back on. The first drafted step after plain ones is not counted (its
 * draft catches up). */
static void test_asan_gate(void **state) {
    (void)state;
    spec_gate g = {0};
    /* A draft that pays, guessing every step: WARM + 1 drafted steps (the
     * first is cold), WARM plain ones to know what those cost, then on. */
    int i = 0;
    for (; i < SPEC_GATE_WARM + 1; i++) assert_true(gate_step(&g, 3, 5, true));
    for (; i < 2 * SPEC_GATE_WARM + 1; i++) assert_false(gate_step(&g, 3, 5, true));
    for (; i < 100; i++) assert_true(gate_step(&g, 3, 5, true));
    /* One that does not: off after the same. */
    g = (spec_gate){0};
    i = 0;
    for (; i < SPEC_GATE_WARM + 1; i++) assert_true(gate_step(&g, 10, 5, true));
    for (; i < 2 * SPEC_GATE_WARM + 1; i++) assert_false(gate_step(&g, 10, 5, true));
    int wait = SPEC_GATE_WAIT;
    for (int trial = 0; trial < 6; trial++) {
        for (int j = 0; j < wait + 1; j++) assert_false(gate_step(&g, 10, 5, true));
        for (int j = 0; j < SPEC_GATE_WARM + 1; j++) assert_true(gate_step(&g, 10, 5, true));
        wait = wait * 2 < SPEC_GATE_WAIT_MAX ? wait * 2 : SPEC_GATE_WAIT_MAX;
    }
    /* The text turns predictable: the next trial wins, and it stays on. */
    for (int j = 0; j < wait + 1; j++) assert_false(gate_step(&g, 2, 5, true));
    for (int j = 0; j < 50; j++) assert_true(gate_step(&g, 2, 5, true));
    /* A cold step's cost (here huge) is not held against the draft. */
    g = (spec_gate){0};
    assert_true(gate_step(&g, 1000, 5, false));
    for (int j = 0; j < 50; j++) assert_true(gate_step(&g, 3, 5, false));
    /* Drafted steps that guessed nothing tell the plain side's cost: no
     * plain step is needed to find the draft loses. */
    g = (spec_gate){0};
    for (int j = 0; j < SPEC_GATE_WARM + 1; j++) assert_true(gate_step(&g, 7, 5, false));
    assert_false(gate_step(&g, 7, 5, false));
    /* Steps that generated nothing tell nothing. */
    g = (spec_gate){0};
    for (int j = 0; j < 20; j++) {
        assert_true(spec_gate_want(&g));
        spec_gate_note(&g, true, 10, 5, 0);
    }
}

/* --------------------------------------------------------- real models */

typedef struct run_out {
    int32_t ids[N_PROMPTS][MAX_NEW];
    int32_t n[N_PROMPTS];
} run_out;

static const char *store_path(const char *file, char *buf, size_t cap) {
    const char *home = getenv("CELLM_HOME");
    if (home && *home)
        snprintf(buf, cap, "%s/models/%s", home, file);
    else
        snprintf(buf, cap, "%s/.cache/cellm/models/%s", getenv("HOME") ? getenv("HOME") : "", file);
    if (access(buf, R_OK) != 0) {
        print_error("draft model %s not found: scripts/test.sh makes it (cellm quantize MODEL "
                    "%s Q4_0)\n",
                    buf, buf);
        fail();
    }
    return buf;
}

static cellm_model *load(const char *path) {
    cellm_model *m = NULL;
    cellm_status st = cellm_model_load(path, NULL, &m);
    if (st != CELLM_OK) print_error("%s: %s\n", path, cellm_last_error());
    assert_int_equal(st, CELLM_OK);
    return m;
}

/* Completes prompts [0, n) on an engine with `p`, `conc` at a time (the
 * engine's max_seqs), with `sampled` seeded sampling; fills *o. */
static int32_t g_max_new = MAX_NEW; /* tokens a prompt */
static int g_threads = 2;           /* the engine's threads */

static void complete(const cellm_model *m, cellm_engine_params p, int conc, bool sampled, int n,
                     run_out *o, cellm_stats *st) {
    assert_true(n <= N_PROMPTS);
    p.max_seqs = conc;
    p.n_threads = g_threads;
    cellm_engine *e = NULL;
    if (cellm_engine_create(m, &p, &e) != CELLM_OK) print_error("%s\n", cellm_last_error());
    assert_non_null(e);
    cellm_request *req[N_PROMPTS];
    for (int base = 0; base < n; base += conc) {
        int k = n - base < conc ? n - base : conc;
        for (int i = 0; i < k; i++) {
            cellm_request_params rp = cellm_request_default_params();
            rp.prompt = prompts[base + i];
            rp.max_tokens = g_max_new;
            if (sampled) {
                rp.sampling.temperature = 0.8f;
                rp.sampling.top_k = 40;
                rp.sampling.top_p = 0.95f;
                rp.sampling.min_p = 0.05f;
                rp.sampling.repeat_penalty = 1.1f;
                rp.sampling.seed = 1000 + (uint64_t)(base + i);
            }
            assert_int_equal(cellm_submit(e, &rp, &req[base + i]), CELLM_OK);
        }
        for (int i = base; i < base + k; i++) {
            cellm_result res;
            assert_int_equal(cellm_wait(req[i], &res), CELLM_OK);
            assert_int_equal(res.status, CELLM_OK);
            const int32_t *ids;
            int32_t len;
            assert_int_equal(cellm_request_tokens(req[i], &ids, &len), CELLM_OK);
            assert_true(len <= MAX_NEW);
            memcpy(o->ids[i], ids, (size_t)len * sizeof *ids);
            o->n[i] = len;
            cellm_request_free(req[i]);
        }
    }
    assert_int_equal(cellm_engine_stats(e, st), CELLM_OK);
    cellm_engine_free(e);
}

static void assert_same(const run_out *a, const run_out *b, int n, const char *what) {
    for (int i = 0; i < n; i++) {
        bool same = a->n[i] == b->n[i] &&
                    memcmp(a->ids[i], b->ids[i], (size_t)a->n[i] * sizeof(int32_t)) == 0;
        if (!same) {
            print_error("%s: prompt %d (\"%s\") differs from the plain run (%d vs %d tokens)\n",
                        what, i, prompts[i], b->n[i], a->n[i]);
            for (int j = 0; j < a->n[i] || j < b->n[i]; j++)
                print_error("  %d: plain %d, here %d%s\n", j, j < a->n[i] ? a->ids[i][j] : -1,
                            j < b->n[i] ? b->ids[i][j] : -1,
                            j < a->n[i] && j < b->n[i] && a->ids[i][j] == b->ids[i][j] ? "" : " *");
            fail();
        }
    }
}

/* Plain, then draft / lookup / both, greedy and sampled, 1 and 8 at once. */
static void exact_pair(const char *target, const char *draft_file) {
    char buf[1024], dbuf[1024];
    cellm_model *m = load(test_model_path(target, buf, sizeof buf));
    cellm_model *d = load(store_path(draft_file, dbuf, sizeof dbuf));
    static run_out plain, spec;
    cellm_stats st;
    for (int sampled = 0; sampled < 2; sampled++) {
        cellm_engine_params p = cellm_engine_default_params();
        int n_all = sampled ? N_SAMPLED : N_PROMPTS;
        double tp = now_s();
        complete(m, p, 8, sampled, n_all, &plain, &st);
        print_message("%s, plain, %s: %.1f s\n", target, sampled ? "sampled" : "greedy",
                      now_s() - tp);
        assert_int_equal(st.n_spec_passes, 0);
        /* Every prompt with the draft and with lookup, 8 at once; fewer
         * with both, and one at a time (slow). */
        /* The draft runs in every step it can (draft_always), so which
         * steps it drafts in does not go by the clock; "gated" leaves the
         * gate on, as by default. */
        struct {
            const char *name;
            bool draft;
            int lookup;
            int conc, n;
            bool gated;
        } modes[] = {{"draft, 8 at once", true, 0, 8, n_all, false},
                     {"lookup, 8 at once", false, 3, 8, n_all, false},
                     {"draft + lookup, 8 at once", true, 2, 8, N_PROMPTS / 6, false},
                     {"draft, alone", true, 0, 1, N_PROMPTS / 12 + 1, false},
                     {"draft, gated, alone", true, 0, 1, N_PROMPTS / 12 + 1, true},
                     {"lookup, alone", false, 3, 1, N_PROMPTS / 12 + 1, false}};
        for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
            cellm_engine_params q = cellm_engine_default_params();
            q.draft_model = modes[k].draft ? d : NULL;
            q.draft_always = !modes[k].gated;
            /* Sampled text at 0.8 seldom repeats two tokens of the short
             * prompts (SmolLM2 kept none of lookup 3's guesses there), so
             * the sampled rounds look up single tokens (lookup 1), which
             * guess most often: kept guesses under sampling are checked. */
            q.lookup_ngram = modes[k].lookup > 0 && sampled ? 1 : modes[k].lookup;
            /* Every session guesses in every step (the default would leave
             * 8 decoding sessions a row for guesses between them): many
             * requests' guesses checked in one pass. */
            q.spec_step_rows = 8 * (1 + q.draft_max);
            int n = modes[k].n;
            double t0 = now_s();
            complete(m, q, modes[k].conc, sampled, n, &spec, &st);
            char what[128];
            snprintf(what, sizeof what, "%s, %s, %s", target, modes[k].name,
                     sampled ? "sampled" : "greedy");
            assert_same(&plain, &spec, n, what);
            print_message(
                "%s (%d prompts, %.1f s): %llu guesses, %llu kept, %llu checking passes, %llu "
                "draft passes\n",
                what, n, now_s() - t0, (unsigned long long)st.n_draft_tokens,
                (unsigned long long)st.n_draft_accepted, (unsigned long long)st.n_spec_passes,
                (unsigned long long)st.n_draft_steps);
            /* Guesses were made and (but where a sampled run of a prompt or
             * two may keep none) some kept: speculation really ran. */
            assert_true(st.n_spec_passes > 0);
            if (!sampled || n >= 16) assert_true(st.n_draft_accepted > 0);
            assert_true(st.n_draft_accepted <= st.n_draft_tokens);
            if (modes[k].draft) assert_true(st.n_draft_steps > 0);
        }
    }
    cellm_model_free(d);
    cellm_model_free(m);
}

/* Eight requests decoding at once under the default spec_step_rows (one
 * row left for guesses): the draft model does not run, since a draft pass
 * would cost a good part of the step for at most one token; one request
 * alone drafts. The same prompt eight times, submitted before the first
 * (manual) step, so all eight decode in the same steps; the text is the
 * plain run's either way. */
static void test_draft_many(void **state) {
    (void)state;
    char buf[1024], dbuf[1024];
    cellm_model *m = load(test_model_path("smollm2-135m", buf, sizeof buf));
    cellm_model *d = load(store_path("smollm2-135m-q4_0.gguf", dbuf, sizeof dbuf));
    int32_t first[24] = {0}, n_first = -1;
    for (int conc = 8; conc >= 1; conc -= 7) {
        for (int spec = 0; spec < 2; spec++) {
            cellm_engine_params p = cellm_engine_default_params();
            p.max_seqs = 8;
            p.n_threads = 2;
            p.draft_model = spec ? d : NULL;
            p.draft_always = 1;
            p.manual_steps = 1; /* all eight submitted before the first step */
            cellm_engine *e = NULL;
            assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_OK);
            cellm_request *req[8];
            for (int i = 0; i < conc; i++) {
                cellm_request_params rp = cellm_request_default_params();
                rp.prompt = prompts[1];
                rp.max_tokens = 24;
                assert_int_equal(cellm_submit(e, &rp, &req[i]), CELLM_OK);
            }
            for (int more = 1; more;) assert_int_equal(cellm_engine_step(e, &more), CELLM_OK);
            for (int i = 0; i < conc; i++) {
                cellm_result res;
                assert_int_equal(cellm_wait(req[i], &res), CELLM_OK);
                const int32_t *ids;
                int32_t len;
                assert_int_equal(cellm_request_tokens(req[i], &ids, &len), CELLM_OK);
                assert_true(len <= 24);
                if (n_first < 0) {
                    n_first = len;
                    memcpy(first, ids, (size_t)len * sizeof *ids);
                }
                assert_int_equal(len, n_first);
                assert_memory_equal(ids, first, (size_t)len * sizeof *ids);
                cellm_request_free(req[i]);
            }
            cellm_stats st;
            assert_int_equal(cellm_engine_stats(e, &st), CELLM_OK);
            print_message("%d at once, %s: %llu draft passes, %llu guesses\n", conc,
                          spec ? "draft" : "plain", (unsigned long long)st.n_draft_steps,
                          (unsigned long long)st.n_draft_tokens);
            if (spec && conc == 8) assert_int_equal(st.n_draft_steps, 0);
            if (spec && conc == 1) assert_true(st.n_draft_steps > 0 && st.n_draft_accepted > 0);
            cellm_engine_free(e);
        }
    }
    cellm_model_free(d);
    cellm_model_free(m);
}

static void test_exact_smollm2(void **state) {
    (void)state;
    exact_pair("smollm2-135m", "smollm2-135m-q4_0.gguf");
}

static void test_exact_gemma3(void **state) {
    (void)state;
    exact_pair("gemma3-270m", "gemma3-270m-q4_0.gguf");
}

/* The resample rule (CELLM_SPEC_ACCEPT_RESAMPLE): a seed gives the same
 * sampled text 4 sessions at once on 2 threads (where the default row cap
 * would leave the others no guesses) and alone on 1, with the draft and
 * with draft and lookup; guesses are kept; the text is not the plain
 * run's (the option took effect); greedy requests keep the exact rule and
 * the plain run's text. (That the tokens follow the model's distribution
 * is test_sampler's test_stat_spec.) */
static void test_resample_smollm2(void **state) {
    (void)state;
    enum { N = 4 };
    char buf[1024], dbuf[1024];
    cellm_model *m = load(test_model_path("smollm2-135m", buf, sizeof buf));
    cellm_model *d = load(store_path("smollm2-135m-q4_0.gguf", dbuf, sizeof dbuf));
    static run_out plain, many, alone;
    cellm_stats st;
    complete(m, cellm_engine_default_params(), 8, true, N, &plain, &st);
    for (int lookup = 0; lookup <= 2; lookup += 2) {
        if (lookup && N_PROMPTS < 50) break; /* sanitizer builds: the draft alone */
        cellm_engine_params p = cellm_engine_default_params();
        p.draft_model = d;
        p.draft_always = 1;
        p.lookup_ngram = lookup;
        p.spec_accept = CELLM_SPEC_ACCEPT_RESAMPLE;
        p.draft_p_min = 0.2f;
        g_threads = 2;
        complete(m, p, 4, true, N, &many, &st);
        assert_true(st.n_draft_accepted > 0);
        print_message("resample, lookup %d, 4 at once: %llu guesses, %llu kept\n", lookup,
                      (unsigned long long)st.n_draft_tokens,
                      (unsigned long long)st.n_draft_accepted);
        g_threads = 1;
        complete(m, p, 1, true, N, &alone, &st);
        g_threads = 2;
        assert_true(st.n_draft_accepted > 0);
        assert_same(&many, &alone, N, "resample: alone on 1 thread against 4 at once on 2");
        int differ = 0;
        for (int i = 0; i < N; i++)
            differ += many.n[i] != plain.n[i] ||
                      memcmp(many.ids[i], plain.ids[i], (size_t)many.n[i] * sizeof(int32_t)) != 0;
        print_message("resample, lookup %d: %d of %d texts differ from the plain run's\n", lookup,
                      differ, N);
        assert_true(differ > 0);
    }
    cellm_engine_params p = cellm_engine_default_params();
    complete(m, p, 4, false, N / 2, &plain, &st);
    p.draft_model = d;
    p.draft_always = 1;
    p.spec_accept = CELLM_SPEC_ACCEPT_RESAMPLE;
    complete(m, p, 4, false, N / 2, &many, &st);
    assert_same(&plain, &many, N / 2, "resample rule, greedy");
    assert_true(st.n_draft_accepted > 0);
    cellm_model_free(d);
    cellm_model_free(m);
}

/* The phone mode: a 512 MiB process budget holds SmolLM2 with its draft,
 * and the text is still the plain run's; a budget too small for the draft
 * is refused with the figures. */
static void test_asan_budget(void **state) {
    (void)state;
    char buf[1024], dbuf[1024];
    cellm_model *m = load(test_model_path("smollm2-135m", buf, sizeof buf));
    cellm_model *d = load(store_path("smollm2-135m-q4_0.gguf", dbuf, sizeof dbuf));
    static run_out plain, spec;
    cellm_stats st;
    cellm_engine_params p = cellm_engine_default_params();
    p.process_budget_bytes = (size_t)512 << 20;
    p.max_ctx = 1024;
    complete(m, p, 4, false, N_BUDGET, &plain, &st);
    p.draft_model = d;
    p.draft_always = 1;
    complete(m, p, 4, false, N_BUDGET, &spec, &st);
    assert_same(&plain, &spec, N_BUDGET, "512 MiB process budget, draft");
    assert_true(st.n_draft_accepted > 0);
    /* Without the draft, 230 MiB holds SmolLM2 (file 94 MiB); with it
     * (86 MiB more) it does not. */
    p.process_budget_bytes = (size_t)230 << 20;
    p.draft_model = NULL;
    p.max_seqs = 1;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_OK);
    cellm_engine_free(e);
    p.draft_model = d;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_ERR_NO_MEMORY);
    assert_null(e);
    assert_non_null(strstr(cellm_last_error(), "draft"));
    cellm_model_free(d);
    cellm_model_free(m);
}

/* Drafts that cannot serve are refused, saying why. */
static void test_asan_refused(void **state) {
    (void)state;
    char buf[1024], gbuf[1024];
    cellm_model *m = load(test_model_path("smollm2-135m", buf, sizeof buf));
    cellm_model *g = load(test_model_path("gemma3-270m", gbuf, sizeof gbuf));
    cellm_engine *e = NULL;
    cellm_engine_params p = cellm_engine_default_params();
    p.draft_model = g;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "family"));
    p.draft_model = m;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "itself"));
    /* Same family (llama), another vocabulary: the tiny llama of the
     * architecture fixtures, converted. */
    char tiny[256], cmd[1024];
    snprintf(tiny, sizeof tiny, "/tmp/cellm-test-spec-%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "'%s' convert '%s/tests/data/arch/llama' '%s' --type f16 2>&1",
             test_cellm_bin(), CELLM_SOURCE_DIR, tiny);
    char *out = NULL;
    int rc = test_run_cmd(cmd, &out);
    if (rc != 0) print_error("%s\n", out);
    free(out);
    assert_int_equal(rc, 0);
    cellm_model *t = load(tiny);
    unlink(tiny);
    p.draft_model = t;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "vocabulary"));
    cellm_model_free(t);
    p.draft_model = NULL;
    p.lookup_ngram = 2;
    p.draft_max = 0;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "draft_max"));
    p.draft_max = 4;
    p.draft_min = 5;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_ERR_INVALID_ARG);
    p.draft_min = 1;
    p.spec_step_rows = -1;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "spec_step_rows"));
    p.spec_step_rows = 0;
    p.spec_accept = 2;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(cellm_last_error(), "spec_accept"));
    p.spec_accept = CELLM_SPEC_ACCEPT_EXACT;
    p.lookup_ngram = -1;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_ERR_INVALID_ARG);
    assert_null(e);
    cellm_model_free(g);
    cellm_model_free(m);
}

/* Under ThreadSanitizer (test.sh runs only test_tsan_* there): requests
 * from 4 threads at once on an engine with a draft and lookup, whose draft
 * passes run on the engine thread and the shared pool; the text is still
 * the plain run's. */
typedef struct tsan_job {
    cellm_engine *e;
    int i;
    const int32_t *ids;
    int32_t n;
    bool ok;
} tsan_job;

static void *tsan_submit(void *arg) {
    tsan_job *j = arg;
    cellm_request_params rp = cellm_request_default_params();
    rp.prompt = prompts[j->i];
    rp.max_tokens = 6;
    rp.sampling.temperature = 0.8f;
    rp.sampling.top_k = 40;
    rp.sampling.top_p = 0.95f;
    rp.sampling.min_p = 0.05f;
    rp.sampling.repeat_penalty = 1.1f;
    rp.sampling.seed = 1000 + (uint64_t)j->i;
    cellm_request *r = NULL;
    cellm_result res;
    const int32_t *ids;
    int32_t n;
    j->ok = cellm_submit(j->e, &rp, &r) == CELLM_OK && cellm_wait(r, &res) == CELLM_OK &&
            cellm_request_tokens(r, &ids, &n) == CELLM_OK && n == j->n &&
            memcmp(ids, j->ids, (size_t)n * sizeof *ids) == 0;
    cellm_request_free(r);
    return NULL;
}

static void test_tsan_spec(void **state) {
    (void)state;
    char buf[1024], dbuf[1024];
    cellm_model *m = load(test_model_path("smollm2-135m", buf, sizeof buf));
    cellm_model *d = load(store_path("smollm2-135m-q4_0.gguf", dbuf, sizeof dbuf));
    static run_out plain;
    cellm_stats st;
    g_max_new = 6;
    cellm_engine_params p = cellm_engine_default_params();
    complete(m, p, 4, true, 4, &plain, &st);
    g_max_new = MAX_NEW;
    p.max_seqs = 4;
    p.n_threads = 2;
    p.draft_model = d;
    p.lookup_ngram = 2;
    p.spec_step_rows = 64;
    cellm_engine *e = NULL;
    assert_int_equal(cellm_engine_create(m, &p, &e), CELLM_OK);
    pthread_t th[4];
    tsan_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (tsan_job){e, i, plain.ids[i], plain.n[i], false};
        assert_int_equal(pthread_create(&th[i], NULL, tsan_submit, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(jobs[i].ok);
    }
    assert_int_equal(cellm_engine_stats(e, &st), CELLM_OK);
    assert_true(st.n_spec_passes > 0);
    cellm_engine_free(e);
    cellm_model_free(d);
    cellm_model_free(m);
}

int main(void) {
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_asan_lookup), cmocka_unit_test(test_asan_fill_k),
        cmocka_unit_test(test_asan_gate),   cmocka_unit_test(test_asan_refused),
        cmocka_unit_test(test_draft_many),  cmocka_unit_test(test_exact_smollm2),
        cmocka_unit_test(test_asan_budget), cmocka_unit_test(test_exact_gemma3),
        cmocka_unit_test(test_tsan_spec),   cmocka_unit_test(test_resample_smollm2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

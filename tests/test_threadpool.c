/* test_threadpool.c — the persistent thread pool: every thread runs every
 * task exactly once, tasks see the caller's writes and the caller sees
 * theirs, tp_set_threads changes which threads run tasks between runs, and
 * tp_split covers a range exactly. Also run under TSan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "base/threadpool.h"

typedef struct job {
    long n;
    const int *in;
    long long *partial; /* one slot per thread */
    int *hits;          /* one slot per thread */
} job;

static void sum_task(void *arg, int ith, int nth) {
    job *j = arg;
    long b, e;
    tp_split(j->n, ith, nth, &b, &e);
    long long s = 0;
    for (long i = b; i < e; i++) s += j->in[i];
    j->partial[ith] = s;
    j->hits[ith]++;
}

static void test_pool_runs_every_share(void **st) {
    (void)st;
    enum { N = 10007, ROUNDS = 3000 };
    static int in[N];
    for (int i = 0; i < N; i++) in[i] = i % 97;
    long long want = 0;
    for (int i = 0; i < N; i++) want += in[i];
    for (int threads = 1; threads <= 4; threads++) {
        threadpool *tp;
        assert_int_equal(tp_create(threads, &tp, NULL), CELLM_OK);
        assert_int_equal(tp_size(tp), threads);
        long long partial[4];
        int hits[4] = {0};
        job j = {N, in, partial, hits};
        for (int r = 0; r < ROUNDS; r++) {
            in[r % N] += 1; /* a write before the task that every share must see */
            want += 1;
            tp_run(tp, sum_task, &j);
            long long s = 0;
            for (int t = 0; t < threads; t++) s += partial[t];
            assert_true(s == want);
        }
        for (int t = 0; t < threads; t++) assert_int_equal(hits[t], ROUNDS);
        tp_destroy(tp);
    }
    assert_int_not_equal(tp_create(0, &(threadpool *){NULL}, NULL), CELLM_OK);
}

/* The threads in use change between tasks, down and up again: each task
 * runs on exactly the first k threads, parked workers come back, and the
 * sums stay right. */
static void test_threads_in_use(void **st) {
    (void)st;
    enum { N = 4099, ROUNDS = 400 };
    static int in[N];
    for (int i = 0; i < N; i++) in[i] = i % 13;
    long long want = 0;
    for (int i = 0; i < N; i++) want += in[i];
    threadpool *tp;
    assert_int_equal(tp_create(4, &tp, NULL), CELLM_OK);
    assert_int_equal(tp_threads(tp), 4);
    static const int ks[] = {4, 1, 2, 3, 1, 4, 2, 1, 3};
    int nk = (int)(sizeof ks / sizeof *ks);
    long long partial[4];
    int hits[4] = {0}, want_hits[4] = {0};
    job j = {N, in, partial, hits};
    for (int r = 0; r < ROUNDS; r++) {
        int k = ks[r % nk];
        tp_set_threads(tp, k);
        assert_int_equal(tp_threads(tp), k);
        memset(partial, 0, sizeof partial);
        tp_run(tp, sum_task, &j);
        long long s = 0;
        for (int t = 0; t < 4; t++) s += partial[t];
        assert_true(s == want);
        for (int t = 0; t < k; t++) want_hits[t]++;
        if (r % 50 == 0) /* let the unused workers park */
            nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    for (int t = 0; t < 4; t++) assert_int_equal(hits[t], want_hits[t]);
    tp_set_threads(tp, 0); /* clamped */
    assert_int_equal(tp_threads(tp), 1);
    tp_set_threads(tp, 99);
    assert_int_equal(tp_threads(tp), 4);
    tp_set_threads(tp, 2);
    tp_destroy(tp); /* with parked workers */
}

static void test_split(void **st) {
    (void)st;
    for (long n = 0; n < 50; n++)
        for (int nth = 1; nth <= 7; nth++) {
            long next = 0;
            for (int i = 0; i < nth; i++) {
                long b, e;
                tp_split(n, i, nth, &b, &e);
                assert_int_equal(b, next);
                assert_true(e - b == n / nth || e - b == n / nth + 1);
                next = e;
            }
            assert_int_equal(next, n);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_runs_every_share),
        cmocka_unit_test(test_threads_in_use),
        cmocka_unit_test(test_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

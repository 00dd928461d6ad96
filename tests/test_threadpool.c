/* test_threadpool.c — the persistent thread pool: every thread runs every
 * task exactly once, tasks see the caller's writes and the caller sees
 * theirs, tp_set_threads changes which threads run tasks between runs, and
 * tp_split covers a range exactly. Also run under TSan. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdatomic.h>
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

/* Spans (tp_span_next): each thread takes its own span's items from the
 * front (runs of half or one at a time), then the others' from their
 * back; thread `slow` starts only once another has taken from its span
 * (or after 20 s, and the test fails). */
typedef struct span_job {
    tp_span span[TP_SPAN_MAX];
    _Atomic int *taken; /* per item: the times taken */
    int *by;            /* per item: the thread that took it */
    bool half;
    int slow;
    long own[TP_SPAN_MAX]; /* items a thread took from its own span */
    long first[TP_SPAN_MAX], last[TP_SPAN_MAX];
    /* runs outside their span, or (own span) not in ascending order, per
     * thread: counted in the task, asserted on the caller's thread */
    int bad[TP_SPAN_MAX];
} span_job;

static void span_task(void *arg, int ith, int nth) {
    span_job *j = arg;
    if (ith == j->slow && nth > 1) {
        uint64_t start = (uint64_t)j->first[ith] << 32 | (uint64_t)j->last[ith];
        for (int k = 0; k < 20000 && atomic_load(&j->span[ith].fb) == start; k++)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    long lo, hi, prev = -1, back = 0;
    int victim = -1;
    j->own[ith] = 0;
    j->bad[ith] = 0;
    for (int from = 0; tp_span_next(j->span, ith, nth, j->half, j->half, &from, &lo, &hi);) {
        int v = (ith + from) % nth;
        j->bad[ith] += !(lo >= j->first[v] && hi <= j->last[v] && lo < hi);
        if (from == 0) { /* its own span: in ascending order */
            j->bad[ith] += !(lo > prev);
            prev = hi - 1;
            j->own[ith] += hi - lo;
        } else { /* another's: from its back, so descending */
            if (v != victim) back = j->last[v], victim = v;
            j->bad[ith] += !(hi <= back);
            back = lo;
        }
        for (long i = lo; i < hi; i++) {
            atomic_fetch_add(&j->taken[i], 1);
            j->by[i] = ith;
        }
    }
}

static void test_spans(void **st) {
    (void)st;
    enum { N = 3001 };
    static _Atomic int taken[N];
    static int by[N];
    for (int threads = 1; threads <= 4; threads++) {
        threadpool *tp;
        assert_int_equal(tp_create(threads, &tp, NULL), CELLM_OK);
        for (int round = 0; round < 8; round++) {
            span_job j = {.taken = taken, .by = by, .half = round % 2, .slow = -1};
            if (round >= 4) j.slow = round % threads;
            /* uneven spans: thread i gets a share growing with i, the
             * last thread what is left (round 2: all in thread 0's) */
            long at = 0;
            for (int i = 0; i < threads; i++) {
                long len = round == 2 ? (i == 0 ? N : 0) : N * (i + 1) / (threads * threads);
                if (i == threads - 1 || at + len > N) len = N - at;
                j.first[i] = at;
                j.last[i] = at + len;
                tp_span_set(&j.span[i], at, at + len);
                at += len;
            }
            for (long i = 0; i < N; i++) atomic_store(&taken[i], 0);
            tp_run(tp, span_task, &j);
            for (int i = 0; i < threads; i++) assert_int_equal(j.bad[i], 0);
            for (long i = 0; i < N; i++) assert_int_equal(atomic_load(&taken[i]), 1);
            if (j.slow >= 0 && threads > 1) {
                /* the late thread's span went partly to the others */
                long others = 0;
                for (long i = j.first[j.slow]; i < j.last[j.slow]; i++) others += by[i] != j.slow;
                assert_true(others > 0);
                assert_int_equal(others + j.own[j.slow], j.last[j.slow] - j.first[j.slow]);
            }
        }
        tp_destroy(tp);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_runs_every_share),
        cmocka_unit_test(test_threads_in_use),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_spans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

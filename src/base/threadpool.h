/*
 * threadpool.h — the engine's persistent worker threads. A pool of n
 * threads (the caller plus n-1 workers created once) runs one task at a
 * time: tp_run() calls fn(arg, i, k) on the first k threads (k: the threads
 * in use, n unless tp_set_threads lowered it) and returns when all have
 * finished. Nothing is allocated per task. Workers spin briefly after a
 * task (the next one usually follows within microseconds during a forward
 * pass), then sleep; workers beyond the k in use sleep until they are
 * needed again, so a lower k saves power, not just time.
 *
 * Not reentrant: one tp_run() at a time per pool, and tp_set_threads()
 * from the same thread between runs (the engine's step thread owns the
 * pool).
 */
#ifndef CELLM_THREADPOOL_H
#define CELLM_THREADPOOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/util.h"

typedef struct threadpool threadpool;
typedef void (*tp_task_fn)(void *arg, int ith, int nth);

/* A pool of `n_threads` (>= 1; the calling thread counts as one). */
cellm_status tp_create(int n_threads, threadpool **out, cellm_error *err);
void tp_destroy(threadpool *tp);
int tp_size(const threadpool *tp);

/* Threads that tasks run on from now on: k clamped to 1..tp_size(). Call
 * from the thread that calls tp_run, never during a run. */
void tp_set_threads(threadpool *tp, int k);
int tp_threads(const threadpool *tp);

/* Runs fn(arg, i, k) for i in [0, k) across the k threads in use; i = 0 on
 * the caller. */
void tp_run(threadpool *tp, tp_task_fn fn, void *arg);

/* The half-open range [*begin, *end) of `n` items that thread `ith` of `nth`
 * takes: contiguous, in order, sizes differing by at most one. */
static inline void tp_split(long n, int ith, int nth, long *begin, long *end) {
    long base = n / nth, extra = n % nth;
    *begin = ith * base + (ith < extra ? ith : extra);
    *end = *begin + base + (ith < extra ? 1 : 0);
}

/* Spans: a task's items split into one contiguous share per thread, which
 * its thread takes from the front and the others, once out of their own,
 * from the back, so the threads finish together whichever ran slower (a
 * thread woken late, a core the host lent elsewhere for a while) while
 * each keeps to its own items where it can (the memory it streams in
 * order, or what it prefetched). Items must give the same results
 * whichever thread takes them. For pools of up to TP_SPAN_MAX threads. */
#define TP_SPAN_MAX 16

typedef struct tp_span {
    _Alignas(64) _Atomic uint64_t fb; /* [front, back): front in the high half */
} tp_span;

/* Sets span s to items [lo, hi) (before tp_run publishes the task). */
static inline void tp_span_set(tp_span *s, long lo, long hi) {
    atomic_store_explicit(&s->fb, (uint64_t)lo << 32 | (uint64_t)hi, memory_order_relaxed);
}

/* Takes items [*lo, *hi) of span s, from its back or front: half of those
 * left (at least one) with `half`, else one. False when none is left. */
static inline bool tp_span_take(tp_span *s, bool back, bool half, long *lo, long *hi) {
    uint64_t v = atomic_load_explicit(&s->fb, memory_order_relaxed);
    for (;;) {
        uint32_t f = (uint32_t)(v >> 32), b = (uint32_t)v;
        if (f >= b) return false;
        uint32_t c = half ? (b - f + 1) / 2 : 1;
        uint64_t nv = back ? v - c : v + ((uint64_t)c << 32);
        if (atomic_compare_exchange_weak_explicit(&s->fb, &v, nv, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *lo = back ? (long)(b - c) : (long)f;
            *hi = back ? (long)b : (long)(f + c);
            return true;
        }
    }
}

/* Sets spans s[0..nth) to the even split of n items (tp_split) where
 * nth threads can share them (2..TP_SPAN_MAX) and returns nth; else sets
 * none and returns 0 (each thread then takes its even split as it is). */
static inline int tp_spans_split(tp_span *s, long n, int nth) {
    if (nth < 2 || nth > TP_SPAN_MAX) return 0;
    for (int i = 0; i < nth; i++) {
        long lo, hi;
        tp_split(n, i, nth, &lo, &hi);
        tp_span_set(&s[i], lo, hi);
    }
    return nth;
}

/* The next items [*lo, *hi) that thread ith of nth takes from spans
 * s[0..nth): its own span's from the front (half of those left at a time
 * with own_half, else one), then each other span in turn, thread ith +
 * 1's first, from its back (half with steal_half, else one). *from starts
 * at 0 and says whose span the items came from: thread (ith + *from) %
 * nth's. False once every span is empty. */
static inline bool tp_span_next(tp_span *s, int ith, int nth, bool own_half, bool steal_half,
                                int *from, long *lo, long *hi) {
    for (; *from < nth; (*from)++)
        if (tp_span_take(&s[(ith + *from) % nth], *from > 0, *from == 0 ? own_half : steal_half, lo,
                         hi))
            return true;
    return false;
}

#endif /* CELLM_THREADPOOL_H */

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

#endif /* CELLM_THREADPOOL_H */

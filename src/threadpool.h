/*
 * threadpool.h — the engine's persistent worker threads. A pool of n
 * threads (the caller plus n-1 workers created once) runs one task at a
 * time: tp_run() calls fn(arg, i, n) on every thread i and returns when all
 * have finished. Nothing is allocated per task. Workers spin briefly after
 * a task (the next one usually follows within microseconds during a forward
 * pass), then sleep.
 *
 * Not reentrant: one tp_run() at a time per pool (the engine's step thread
 * owns the pool).
 */
#ifndef CELLM_THREADPOOL_H
#define CELLM_THREADPOOL_H

#include "util.h"

typedef struct threadpool threadpool;
typedef void (*tp_task_fn)(void *arg, int ith, int nth);

/* A pool of `n_threads` (>= 1; the calling thread counts as one). */
cellm_status tp_create(int n_threads, threadpool **out, cellm_error *err);
void tp_destroy(threadpool *tp);
int tp_size(const threadpool *tp);

/* Runs fn(arg, i, n) for i in [0, n) across the pool; i = 0 on the caller. */
void tp_run(threadpool *tp, tp_task_fn fn, void *arg);

/* The half-open range [*begin, *end) of `n` items that thread `ith` of `nth`
 * takes: contiguous, in order, sizes differing by at most one. */
static inline void tp_split(long n, int ith, int nth, long *begin, long *end) {
    long base = n / nth, extra = n % nth;
    *begin = ith * base + (ith < extra ? ith : extra);
    *end = *begin + base + (ith < extra ? 1 : 0);
}

#endif /* CELLM_THREADPOOL_H */

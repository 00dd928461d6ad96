/*
 * threadpool.c — persistent workers for the forward pass (see
 * threadpool.h). A task is published by bumping `generation`; workers that
 * see the new generation run their share and decrement `pending`; the
 * caller runs share 0 and waits for `pending` to reach zero. Workers spin on
 * the generation for a while before sleeping on a condition variable, so
 * the hundreds of small tasks of one token cost no system calls.
 */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ROUNDS 50000 /* tens of microseconds to a millisecond of polling */

typedef struct worker {
    threadpool *tp;
    int ith;
    pthread_t thread;
} worker;

struct threadpool {
    int n;
    worker *workers;
    /* The current task: written before `generation` is bumped (release),
     * read after it is seen (acquire). */
    tp_task_fn fn;
    void *arg;
    _Atomic unsigned generation;
    _Atomic int pending;
    _Atomic int stop;
    _Atomic int sleepers;
    pthread_mutex_t lock; /* guards sleeping on `wake` */
    pthread_cond_t wake;
};

static void *worker_main(void *p) {
    worker *w = p;
    threadpool *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&tp->stop, memory_order_acquire)) {
            if (++spins < SPIN_ROUNDS) {
                if (spins % 1024 == 0)
                    sched_yield(); /* let a waiting thread run on a busy machine */
                else
                    cpu_relax();
                continue;
            }
            pthread_mutex_lock(&tp->lock);
            atomic_fetch_add(&tp->sleepers, 1);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->wake, &tp->lock);
            atomic_fetch_sub(&tp->sleepers, 1);
            pthread_mutex_unlock(&tp->lock);
            spins = 0;
        }
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) return NULL;
        seen = gen;
        tp->fn(tp->arg, w->ith, tp->n);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel);
    }
}

cellm_status tp_create(int n_threads, threadpool **out, cellm_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return err_set(err, CELLM_ERR_INVALID_ARG, "thread count %d is not 1..1024", n_threads);
    threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for the thread pool");
    tp->n = n_threads;
    pthread_mutex_init(&tp->lock, NULL);
    pthread_cond_init(&tp->wake, NULL);
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads, sizeof *tp->workers);
        if (!tp->workers) {
            tp_destroy(tp);
            return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for the thread pool");
        }
        for (int i = 1; i < n_threads; i++) {
            tp->workers[i].tp = tp;
            tp->workers[i].ith = i;
            if (pthread_create(&tp->workers[i].thread, NULL, worker_main, &tp->workers[i]) != 0) {
                tp->n = i; /* join only those that started */
                tp_destroy(tp);
                return err_set(err, CELLM_ERR_NO_MEMORY, "cannot start worker thread %d", i);
            }
        }
    }
    *out = tp;
    return CELLM_OK;
}

void tp_destroy(threadpool *tp) {
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    pthread_mutex_lock(&tp->lock);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->lock);
    for (int i = 1; i < tp->n && tp->workers; i++) pthread_join(tp->workers[i].thread, NULL);
    pthread_cond_destroy(&tp->wake);
    pthread_mutex_destroy(&tp->lock);
    free(tp->workers);
    free(tp);
}

int tp_size(const threadpool *tp) {
    return tp->n;
}

void tp_run(threadpool *tp, tp_task_fn fn, void *arg) {
    if (tp->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->pending, tp->n - 1, memory_order_relaxed);
    atomic_fetch_add(&tp->generation, 1); /* seq_cst: pairs with `sleepers` */
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->lock);
        pthread_cond_broadcast(&tp->wake);
        pthread_mutex_unlock(&tp->lock);
    }
    fn(arg, 0, tp->n);
    /* Spin while the others finish; yield once it takes long, which it
     * does when the machine has more runnable threads than cores. */
    for (int spins = 0; atomic_load_explicit(&tp->pending, memory_order_acquire) > 0; spins++) {
        if (spins < 2000)
            cpu_relax();
        else
            sched_yield();
    }
}

/*
 * threadpool.c — persistent workers for the forward pass (see
 * threadpool.h). A task is published by storing a new `task` word, which
 * holds the task's number and how many threads run it; workers that see a
 * new word run their share (if their index is below that count) and
 * decrement `pending`; the caller runs share 0 and waits for `pending` to
 * reach zero. Workers spin on the word for a while before sleeping on a
 * condition variable, so the hundreds of small tasks of one token cost no
 * system calls. Workers beyond the threads in use (tp_set_threads) park on
 * `idle` instead, and are not woken by tasks.
 */
#include "base/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
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

/* The task word: the task's number above, its thread count in the low
 * bits. One word, so a worker reads both at once; 48 bits of numbers never
 * wrap, so a parked worker cannot mistake a new task for one it saw. */
#define TASK_NTH_BITS 16
#define TASK_NTH_MASK ((1u << TASK_NTH_BITS) - 1)

struct threadpool {
    int n;
    worker *workers;
    /* The current task: written before `task` is stored (release), read
     * after it is seen (acquire), only by the threads that run it. */
    tp_task_fn fn;
    void *arg;
    uint64_t n_tasks; /* the caller's count, for the next task word */
    _Atomic uint64_t task;
    _Atomic int pending;
    _Atomic int stop;
    _Atomic int sleepers;
    _Atomic int active;   /* threads in use (written under `lock`) */
    pthread_mutex_t lock; /* guards sleeping on `wake` and `idle` */
    pthread_cond_t wake;  /* a new task */
    pthread_cond_t idle;  /* `active` changed */
};

/* Sleeps while worker `ith` is not in use. */
static void park(threadpool *tp, int ith) {
    pthread_mutex_lock(&tp->lock);
    while (ith >= atomic_load(&tp->active) && !atomic_load(&tp->stop))
        pthread_cond_wait(&tp->idle, &tp->lock);
    pthread_mutex_unlock(&tp->lock);
}

static void *worker_main(void *p) {
    worker *w = p;
    threadpool *tp = w->tp;
    uint64_t seen = 0;
    for (;;) {
        uint64_t task;
        int spins = 0;
        while ((task = atomic_load_explicit(&tp->task, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&tp->stop, memory_order_acquire)) {
            if (w->ith >= atomic_load_explicit(&tp->active, memory_order_relaxed)) {
                park(tp, w->ith);
                spins = 0;
                continue;
            }
            if (++spins < SPIN_ROUNDS) {
                if (spins % 1024 == 0)
                    sched_yield(); /* let a waiting thread run on a busy machine */
                else
                    cpu_relax();
                continue;
            }
            pthread_mutex_lock(&tp->lock);
            atomic_fetch_add(&tp->sleepers, 1);
            while (atomic_load(&tp->task) == seen && !atomic_load(&tp->stop) &&
                   w->ith < atomic_load(&tp->active))
                pthread_cond_wait(&tp->wake, &tp->lock);
            atomic_fetch_sub(&tp->sleepers, 1);
            pthread_mutex_unlock(&tp->lock);
            spins = 0;
        }
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) return NULL;
        seen = task;
        int nth = (int)(task & TASK_NTH_MASK);
        /* A task without this worker can finish and be followed by another
         * without it noticing: it must not touch fn or arg. */
        if (w->ith >= nth) continue;
        tp->fn(tp->arg, w->ith, nth);
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
    atomic_init(&tp->active, n_threads);
    pthread_mutex_init(&tp->lock, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->idle, NULL);
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
    pthread_cond_broadcast(&tp->idle);
    pthread_mutex_unlock(&tp->lock);
    for (int i = 1; i < tp->n && tp->workers; i++) pthread_join(tp->workers[i].thread, NULL);
    pthread_cond_destroy(&tp->idle);
    pthread_cond_destroy(&tp->wake);
    pthread_mutex_destroy(&tp->lock);
    free(tp->workers);
    free(tp);
}

int tp_size(const threadpool *tp) {
    return tp->n;
}

void tp_set_threads(threadpool *tp, int k) {
    if (k < 1) k = 1;
    if (k > tp->n) k = tp->n;
    if (k == atomic_load_explicit(&tp->active, memory_order_relaxed)) return;
    pthread_mutex_lock(&tp->lock);
    atomic_store(&tp->active, k);
    pthread_cond_broadcast(&tp->idle);
    pthread_mutex_unlock(&tp->lock);
}

int tp_threads(const threadpool *tp) {
    return atomic_load_explicit(&((threadpool *)tp)->active, memory_order_relaxed);
}

void tp_run(threadpool *tp, tp_task_fn fn, void *arg) {
    /* Only this thread changes `active`. */
    int nth = atomic_load_explicit(&tp->active, memory_order_relaxed);
    if (nth == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->pending, nth - 1, memory_order_relaxed);
    tp->n_tasks++;
    /* Published before `sleepers` is read, and a sleeper counts itself
     * before it reads `task` (seq_cst on both sides), so either it sees
     * the task or it is woken. The publication is an exchange, not a
     * store: a store-release followed by a load-acquire is ordered on
     * ARM, but qemu-user runs them as a plain store and load on an x86
     * host, which may pass each other (a sleeping worker left asleep with
     * the task pending: a hang); a read-modify-write orders both. */
    atomic_exchange(&tp->task, tp->n_tasks << TASK_NTH_BITS | (uint64_t)nth);
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->lock);
        pthread_cond_broadcast(&tp->wake);
        pthread_mutex_unlock(&tp->lock);
    }
    fn(arg, 0, nth);
    /* Spin while the others finish; yield once it takes long, which it
     * does when the machine has more runnable threads than cores. */
    for (int spins = 0; atomic_load_explicit(&tp->pending, memory_order_acquire) > 0; spins++) {
        if (spins < 2000)
            cpu_relax();
        else
            sched_yield();
    }
}

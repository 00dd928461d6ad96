/*
 * engine.h — the insides of the public engine API, shared by engine.c (the
 * handles, submission, the engine thread and its step loop) and
 * scheduler.c (the queues and the plan of each step's flat batch).
 *
 * Threads and locks. Application threads call the public functions; one
 * engine thread per engine runs steps (and every callback); the thread
 * pool's workers only ever run forward-pass tasks for the engine thread.
 * `cellm_engine.mu` guards what application threads and the engine thread
 * share: the incoming list, the stop flag, the published stats, and in each
 * request the `cancel`, `done`, `refs` and `result` fields. Everything else
 * the engine thread owns alone (the KV cache, the forward context, the
 * running and waiting queues and each request's sequence state), or is
 * written once before the engine thread can see it (a request's fixed
 * parameters, set before it is put on the incoming list under `mu`).
 */
#ifndef CELLM_ENGINE_H
#define CELLM_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cellm.h"
#include "chat.h"
#include "forward.h"
#include "sampler.h"
#include "stop.h"
#include "tokenizer.h"

struct cellm_model {
    model *m;
    tokenizer *tok;
    bool has_chat; /* false: chat_err says why messages cannot be served */
    chat_tpl chat; /* owned; valid when has_chat */
    char chat_err[CELLM_ERR_MSG_MAX];
};

#define REQ_MAX_STOP 16

struct cellm_request {
    cellm_engine *e;

    /* Fixed at submit, before the engine thread sees the request. */
    uint64_t arrival; /* submission order; ties between equal priorities */
    int32_t priority;
    int32_t max_tokens;                             /* < 0: no limit but the context */
    int32_t stop[1 + REQ_MAX_STOP + CHAT_MAX_STOP]; /* EOS, the caller's, end of turn */
    int32_t n_stop;
    cellm_piece_fn on_piece;
    cellm_done_fn on_done;
    void *user;
    double t_submit;
    int32_t n_prompt;

    /* Engine thread only (and the owner after `done`, read-only). */
    cellm_request *next; /* incoming list (under mu) or waiting queue */
    int32_t *tokens;     /* prompt, then completion; capacity cap */
    int32_t n_tokens, cap;
    kv_seq seq; /* seq.n_pos tokens of `tokens` are in the KV cache */
    sampler *smp;
    stop_matcher *stops; /* NULL without stop strings */
    int32_t stop_token;  /* what ended it, for the result (-1: none) */
    int32_t stop_index;
    tok_stream ts;
    char *piece; /* tok_stream output, piece_cap bytes */
    size_t piece_cap;
    int32_t plan_n;   /* rows planned for this step */
    bool detached;    /* freed by the owner from a callback: no more callbacks */
    bool cancel_seen; /* the engine's copy of `cancel` for this step */
    double t_first_step, t_first_token;
    int32_t n_preempt;
    char err[CELLM_ERR_MSG_MAX];

    /* Guarded by e->mu. */
    bool cancel;
    bool done; /* finished and the done callback has returned */
    int refs;  /* the owner's handle + the engine's, until done */
    cellm_result result;
};

struct cellm_engine {
    const cellm_model *model;
    cellm_engine_params p;
    int32_t logit_rows;
    size_t act_bytes;

    /* Engine thread only (after creation). */
    kv_cache *kv;
    threadpool *tp;
    forward_ctx *fwd;
    fwd_row *rows;           /* [p.max_batch_tokens] */
    cellm_request **running; /* [p.max_seqs], priority high to low, then oldest first */
    int32_t n_running;
    cellm_request *waiting; /* queue in the same order */
    int32_t n_waiting;
    cellm_request **fed; /* [p.max_seqs] the requests in this step's batch */
    int32_t n_fed;
    uint64_t n_steps, n_preempt, n_prompt_tok, n_gen_tok;
    uint64_t n_sampled;
    double t_sample; /* seconds in sampler_sample */
    double win_t0;   /* tokens/s window */
    uint64_t win_prompt, win_gen;
    double rate_prompt, rate_gen;

    /* Guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* the engine thread waits here for requests */
    pthread_cond_t cv_done; /* cellm_wait and cellm_request_free wait here */
    cellm_request *incoming;
    int32_t n_incoming;
    uint64_t next_arrival;
    bool stop;
    cellm_stats stats; /* published by the engine thread */

    pthread_t thread;
    atomic_bool failed; /* set once, after `error` is written */
    char error[CELLM_ERR_MSG_MAX];
};

/* ---- scheduler.c (engine thread only) ---- */

/* Puts `r` in the waiting queue at its place (priority, then arrival). */
void sched_enqueue(cellm_engine *e, cellm_request *r);

/* Takes `r` out of the running or waiting queue, wherever it is. */
void sched_remove(cellm_engine *e, cellm_request *r);

/* Plans one step: sets plan_n of running requests (preempting and
 * admitting as blocks allow), then fills e->rows and e->fed. Returns the
 * number of rows. May finish requests that can never fit. */
int32_t sched_plan_step(cellm_engine *e);

/* ---- engine.c ---- */

/* Ends a request on the engine thread: frees its KV blocks, flushes its
 * text, runs its done callback and wakes its waiters. */
void engine_finish(cellm_engine *e, cellm_request *r, cellm_finish_reason why, cellm_status st,
                   const char *msg);

/* ---- engine.c, for the public functions in other files (model_info.c) */

/* Records `msg` as the calling thread's cellm_last_error(); returns code. */
cellm_status engine_fail(cellm_status code, const char *msg);

#endif /* CELLM_ENGINE_H */

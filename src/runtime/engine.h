/*
 * engine.h — the insides of the public engine API, shared by engine.c (the
 * handles, submission, the engine thread and its step loop, the QoS policy
 * and trimming), session.c (chat sessions and the KV they keep) and spec.c
 * (speculative decoding). The scheduler (scheduler.h: the queues and the
 * plan of each step's flat batch) sees none of this: a request embeds its
 * sched_item, and the engine gives the scheduler hooks back to itself.
 *
 * Threads and locks. Application threads call the public functions; one
 * engine thread per engine runs steps (and every callback); the thread
 * pool's workers only ever run forward-pass tasks for the engine thread.
 * `cellm_engine.mu` guards what application threads and the engine thread
 * share: the incoming list, the stop flag, the published stats, the QoS
 * policy, pending trims and session frees, in each request the `cancel`,
 * `done`, `refs` and `result` fields, and in each session `turn` and the
 * free handshake. Everything else the engine thread owns alone (the KV
 * cache, the forward context, the running and waiting queues, each
 * request's sequence state, each session's kept KV), or is written once
 * before the engine thread can see it (a request's fixed parameters, set
 * before it is put on the incoming list under `mu`).
 */
#ifndef CELLM_ENGINE_H
#define CELLM_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cellm.h"
#include "model/chat.h"
#include "cpu/forward.h"
#include "text/grammar.h"
#include "runtime/device.h"
#include "runtime/sampler.h"
#include "runtime/scheduler.h"
#include "text/stop.h"
#include "text/tokenizer.h"

struct cellm_model {
    model *m;
    tokenizer *tok;
    bool has_chat; /* false: chat_err says why messages cannot be served */
    chat_tpl chat; /* owned; valid when has_chat */
    char chat_err[CELLM_ERR_MSG_MAX];
    /* The prefix tree of the token bytes, for grammars: built by the
     * first request with a grammar (engine_grammar.c), under gv_mu. */
    pthread_mutex_t gv_mu;
    grammar_vocab *gv;
};

/* A grammar handle: the compiled grammar and its references. */
struct cellm_grammar {
    grammar *g;
    atomic_int refs;
};

#define REQ_MAX_STOP 16

/* Work an application thread hands to the engine thread (engine_run_job):
 * fn(e, arg) runs between two steps, where the engine thread owns the KV
 * cache. */
typedef struct engine_job {
    void (*fn)(cellm_engine *e, void *arg);
    void *arg;
    bool done; /* guarded by mu */
    struct engine_job *next;
} engine_job;

/* A chat session (session.c). */
struct cellm_session {
    cellm_engine *e;

    /* Fixed at creation. */
    cellm_sampling sampling; /* logit_bias points to `bias` */
    cellm_logit_bias *bias;
    int32_t max_tokens;

    /* The conversation: contents owned (roles are static strings). The
     * owner's while no turn runs; the engine thread's while one does (it
     * appends the reply, or takes back the user message, before clearing
     * `turn` under mu). Capacity for two more is reserved at each send, so
     * the engine thread never allocates. */
    cellm_chat_message *msgs;
    int32_t n_msgs, cap_msgs;

    /* Engine thread only: the kept KV. seq.n_pos positions hold the K/V
     * of kept[0 .. seq.n_pos). While a turn runs, its request holds the
     * blocks (the two swap block tables at admission and at the end). */
    kv_seq seq;
    int32_t *kept; /* [engine max_ctx] */
    int32_t n_kept_blocks;
    cellm_session *lru_prev, *lru_next; /* idle with kept blocks: e->lru list */
    bool in_lru;

    /* Guarded by e->mu. */
    cellm_request *turn;      /* the turn in flight, NULL when idle */
    bool free_pending;        /* freed from a callback mid-turn: freed when it ends */
    bool dropped;             /* the engine thread has let go of it (after a free) */
    cellm_session *next_free; /* e->session_frees */
};

struct cellm_request {
    cellm_engine *e;

    /* Fixed at submit, before the engine thread sees the request. */
    int32_t max_tokens;                             /* < 0: no limit but the context */
    int32_t stop[1 + REQ_MAX_STOP + CHAT_MAX_STOP]; /* EOS, the caller's, end of turn */
    int32_t n_stop;
    cellm_piece_fn on_piece;
    cellm_done_fn on_done;
    void *user;
    double t_submit;
    int32_t n_prompt;
    /* Log-probabilities (cellm_token_logprob): of completion tokens, of
     * prompt tokens, and how many alternatives. */
    bool lp_gen, lp_prompt;
    int32_t lp_top;
    cellm_logprob_fn on_logprob;
    /* Structured output: the grammar (a reference of the request's own),
     * its state (engine thread only) and the masked logits, n_vocab. */
    cellm_grammar *grammar;
    grammar_state *gst;
    float *grammar_row;

    /* Engine thread only (and the owner after `done`, read-only). */
    /* What the scheduler knows of it (scheduler.h): its priority and
     * arrival (submission order), set at submit; how many of `tokens`
     * there are (sched.n_tokens); this step's rows, its guesses, the prompt
     * tokens whose log-probabilities were reported, its preemptions and
     * the prompt tokens it found cached. */
    sched_item sched;
    cellm_request *next; /* incoming list (under mu) */
    int32_t *tokens;     /* prompt, then completion; capacity cap */
    int32_t cap;
    kv_seq seq; /* seq.n_pos tokens of `tokens` are in the KV cache */
    sampler *smp;
    stop_matcher *stops; /* NULL without stop strings */
    int32_t stop_token;  /* what ended it, for the result (-1: none) */
    int32_t stop_index;
    tok_stream ts;
    char *piece; /* tok_stream output, piece_cap bytes */
    size_t piece_cap;
    bool detached;    /* freed by the owner from a callback: no more callbacks */
    bool cancel_seen; /* the engine's copy of `cancel` for this step */
    double t_first_step, t_first_token;
    /* This step's logits row and the token its sampler drew from it on the
     * pool (step_outputs' first pass); NULL: not drawn ahead. */
    const float *pre_row;
    int32_t pre_tok;
    /* Fixed at submit: its next token is a greedy pick from a row's best
     * FWD_TOP_K logits (sampler_top_ok), and nothing else reads its rows
     * (no log-probabilities, grammar or resample rule). */
    bool top_ok;
    char err[CELLM_ERR_MSG_MAX];
    cellm_top_logprob lp_top_buf[CELLM_MAX_TOP_LOGPROBS];

    /* Speculative decoding (spec.c), engine thread only. The guesses of
     * this step (sched.n_draft) sit past the pending token, and the step
     * feeds them after it. */
    int32_t spec_k;    /* guesses to try next: adapts to how many were kept */
    int32_t spec_room; /* guesses it may make this step */
    kv_seq dseq;       /* the draft model's KV of tokens[0 .. dseq.n_pos) */
    bool has_dseq;     /* dseq's tables exist */
    /* CELLM_SPEC_ACCEPT_RESAMPLE on a sampled request without a grammar:
     * the distribution each guess was drawn from, [p.draft_max]. NULL:
     * the exact rule. */
    sampler_dist *spec_q;

    /* Pictures (engine_image.c), fixed at submit; NULL without. For each
     * prompt position, the row of img_embd that is its input (-1: its
     * token's); such positions hold a pseudo token in `tokens` (negative,
     * from the picture's content: what the prefix cache keys them by),
     * never fed as a token: the row is fed as image_token with its
     * embedding. */
    int32_t *img_at;  /* [n_prompt] */
    float *img_embd;  /* [rows][model n_embd], copied from the caller's; freed at the end */
    size_t img_bytes; /* img_embd's size, counted in the engine's img_held */
    int32_t image_token;

    /* A turn of a session (fixed at submit), and what the engine thread
     * does with it. */
    cellm_session *session;
    bool adopted; /* took the session's kept KV at admission (sched.n_cached: how much) */
    char *reply;  /* the text streamed, for the history; reply_cap bytes */
    size_t reply_len, reply_cap;

    /* Guarded by e->mu. */
    bool cancel;
    bool done; /* finished and the done callback has returned */
    int refs;  /* the owner's handle + the engine's, until done */
    cellm_result result;
};

/* The draft's gate (cellm_engine_params.draft_always): whether a step
 * runs the draft model, from the cost of a generated token lately in steps
 * with the draft's passes and in steps without guesses. */
#define SPEC_GATE_WARM 4  /* samples of each before they are compared; a trial's length */
#define SPEC_GATE_WAIT 16 /* steps without the draft before the first trial */
#define SPEC_GATE_WAIT_MAX 256
#define SPEC_GATE_N 8 /* gates: one per count of decoding requests, 1 .. 8 and more */
typedef struct spec_gate {
    double ms[2];   /* ms a generated token (moving averages): [0] without the draft, [1] with */
    int32_t n[2];   /* samples of each */
    int32_t wait;   /* steps without the draft before the next trial */
    int32_t period; /* the wait after the next trial that loses */
    bool off;       /* waiting for the next trial */
    bool last;      /* what the last decision was */
    bool cold;      /* this step drafts after steps that did not: its draft catches up */
} spec_gate;

struct cellm_engine {
    const cellm_model *model;
    cellm_engine_params p;
    int32_t logit_rows;
    size_t act_bytes;
    /* Pictures: the model's image token (-1: it takes none), the room
     * kept for requests' rows (0 without pictures) and the bytes they
     * hold now (engine_image.c). */
    int32_t image_token;
    size_t img_cap;
    atomic_size_t img_held;

    /* Engine thread only (after creation). */
    kv_cache *kv;
    threadpool *tp;
    backend fwd;             /* runs the forward pass (runtime/device.h) */
    sched sched;             /* the queues of requests (their sched items) and each step's batch */
    const float **embd_rows; /* [p.max_batch_tokens] a step's image rows (engine_image.c) */
    /* Where the requests' samplers draw (sampler_create_shared): one for
     * each of the pool's threads, [0] for draws on the engine thread. */
    sampler_scratch **smp_scr;
    uint64_t n_steps, n_prompt_tok, n_gen_tok;
    uint64_t n_sampled;
    double t_sample;  /* seconds in sampler_sample */
    double t_grammar; /* seconds masking and advancing grammars (part of t_sample) */
    uint64_t n_grammar, n_grammar_mask;
    double t_grammar_mask;
    double win_t0; /* tokens/s window */
    uint64_t win_prompt, win_gen;
    double rate_prompt, rate_gen;
    cellm_qos qos_now;                  /* the policy of this step */
    double step_t0, step_t1;            /* when the last step started and ended (0: none) */
    double rest_s;                      /* seconds rested */
    cellm_session *lru_head, *lru_tail; /* idle sessions with kept KV, least recent first */
    int32_t n_lru, blocks_kept;

    /* Speculative decoding (spec.c): on with a draft model or lookup. The
     * draft model has its own KV pool and forward context; drows and dreq
     * are its batch and the requests drafting in it. */
    bool spec_on;
    /* CELLM_TOP=0: every step reads whole logit rows (comparisons). */
    bool top_off;
    kv_cache *dkv;
    backend dfwd;
    fwd_row *drows;       /* [p.max_batch_tokens] */
    cellm_request **dreq; /* [p.max_seqs] */
    int32_t *dfirst;      /* [p.max_seqs] row of each drafting request's logits */
    uint64_t n_draft_tok, n_draft_acc, n_spec_pass, n_draft_steps;
    /* The draft's gates, one per count of decoding requests (1 ..
     * SPEC_GATE_N, the last for more), and this step's: which, whether
     * it was asked, whether the draft ran and for how long, the rows and
     * guesses the decoding requests planned. */
    spec_gate gate[SPEC_GATE_N];
    int32_t gate_at, gate_rows, gate_guesses;
    bool gate_asked, gate_drafted;
    double gate_draft_ms;

    /* Guarded by mu. */
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* the engine thread waits here for requests */
    pthread_cond_t cv_done; /* cellm_wait and cellm_request_free wait here */
    cellm_request *incoming;
    int32_t n_incoming;
    uint64_t next_arrival;
    bool stop;
    cellm_stats stats;              /* published by the engine thread */
    cellm_qos qos;                  /* the policy set by cellm_engine_set_qos */
    uint64_t events;                /* bumped by what must end a rest early: see engine_rest */
    int trim_level;                 /* pending trim, 0: none */
    uint64_t trim_asked, trim_done; /* tickets: a trim covers every one asked before it */
    size_t trim_released;           /* by the last trim */
    size_t bytes_released;
    uint64_t n_trims;
    cellm_session *session_frees; /* sessions whose KV the engine thread must drop */
    engine_job *jobs;             /* engine_run_job's, to run at the next intake */

    pthread_t thread;        /* the engine thread, unless manual */
    bool manual;             /* manual_steps: no engine thread; see cellm_engine_step */
    pthread_mutex_t step_mu; /* manual: one stepping thread at a time */
    atomic_bool failed;      /* set once, after `error` is written */
    char error[CELLM_ERR_MSG_MAX];
};

/* The request whose scheduler item `it` is. */
static inline cellm_request *req_of(sched_item *it) {
    return (cellm_request *)((char *)it - offsetof(cellm_request, sched));
}

/* ---- spec.c: speculative decoding ---- */

/* After a step: its rows (n_prompt_rows of them prompt rows), the ms its
 * pass took and the tokens it generated, for the gate. */
void spec_step_done(cellm_engine *e, int32_t n_rows, int32_t n_prompt_rows, double target_ms,
                    int32_t tokens);

/* Seconds of a monotonic clock (engine.c). */
double engine_now_s(void);

/* Whether this step runs the draft; its side effects are the gate's
 * count of steps, so call it once a step that would draft. */
bool spec_gate_want(spec_gate *g);

/* What a step cost: ms for `tokens` generated tokens; drafted: the draft
 * ran (ms includes its passes); a step without guesses and without the
 * draft's passes counts for the plain side (a drafted step that guessed
 * nothing gives both: pass plain_ms, its time without the draft's
 * passes, or a negative number). */
void spec_gate_note(spec_gate *g, bool drafted, double ms, double plain_ms, int32_t tokens);

/* Checks the speculation parameters and the draft model against the
 * engine's model (same family, same vocabulary); NULL when they suit,
 * else what is wrong (written into msg). */
const char *spec_check(const cellm_model *cm, const cellm_engine_params *p, char *msg, size_t cap);

/* Rows of logits a step may ask for: every sequence's pending token and
 * its guesses, within the batch. */
int32_t spec_logit_rows(const cellm_engine_params *p);

/* Bytes the draft model takes from the budget: its activations, and its
 * KV for max_seqs sequences (0 without a draft model). */
size_t spec_draft_act_bytes(const cellm_engine_params *p);
size_t spec_draft_kv_bytes(const cellm_engine_params *p);

/* Makes the draft model's pool (kv_bytes) and forward context. */
cellm_status spec_create(cellm_engine *e, size_t kv_bytes, cellm_error *err);
void spec_destroy(cellm_engine *e);

/* Before a step is planned: the guesses of every running request that
 * decodes (r->n_draft, written after its pending token), from prompt
 * lookup or the draft model's passes. */
void spec_propose(cellm_engine *e);

/* Up to k guesses for what follows tok[0..n_tok): the tokens after the
 * latest earlier occurrence of its last n tokens, n = ngram_max .. 2
 * (down to 1 only for an ngram_max of 1), written to out. Returns how
 * many (0: no match). */
int32_t spec_lookup(const int32_t *tok, int32_t n_tok, int32_t ngram_max, int32_t k, int32_t *out);

/* A draft's greedy guess in a row of logits (the lowest id on ties) and,
 * when p_min > 0 asks for it, the probability it gives it (*prob = 1
 * otherwise). Shared by the engine and cellm run (tools/rt.c). */
int32_t spec_draft_pick(const float *row, int32_t n, float p_min, float *prob);

/* The next guess count after n_guess guesses of an allowed k, of which
 * `kept` were kept: 2 more (up to draft_max) when every guess of a full k
 * was kept, else one more than were kept. */
int32_t spec_next_k(int32_t k, int32_t n_guess, int32_t kept, int32_t draft_max);
/* The guesses prompt lookup may give a request this step, given `used`
 * rows of the step already taken (pending tokens, earlier requests'
 * guesses), its k and at most `cap`: k grown to the end of the CPU
 * matmul's tile that the step's rows fall in where the matmul would fill
 * that tile up anyway (2-3 rows past the fours, 5-7 past the eights),
 * since those rows cost no more and a guess from the text costs no pass. */
int32_t spec_fill_k(int32_t used, int32_t k, int32_t cap);

/* The token at position pos of a sequence under the resample rule, from
 * its logits row and its sampler: the standard rule against the guess
 * made there, drawn from q (q NULL: no guess, a draw from the sampler's
 * distribution); the random numbers are keyed by the sampler's seed and
 * pos, and its PRNG is not used. */
int32_t spec_sample(sampler *smp, const float *row, int32_t pos, int32_t guess,
                    const sampler_dist *q);

/* The draft's guess at position pos under the resample rule: drawn from
 * spec_draft_sample's distribution (into *q) with the number keyed by
 * the seed in sp and pos. */
int32_t spec_draft_guess(const float *row, int32_t n, const sampler_params *sp, int32_t pos,
                         sampler_dist *q, float *prob);

/* A uniform number in [0, 1) keyed by (seed, pos, stream): the resample
 * rule's random numbers, the same whatever else the engine runs. */
double spec_uniform(uint64_t seed, int32_t pos, int32_t stream);

/* The draft's distribution for the resample rule from a row of its
 * logits, under the request's sampling parameters, into *q (best first),
 * and the guess drawn from it at u (*prob: its probability). */
int32_t spec_draft_sample(const float *row, int32_t n, const sampler_params *sp, double u,
                          sampler_dist *q, float *prob);

/* After a request's guesses were checked: the draft's KV beyond what was
 * kept goes (engine thread). */
void spec_after(cellm_engine *e, cellm_request *r);

/* Drops a request's draft KV (preempted, finished, or memory is short). */
void spec_drop(cellm_engine *e, cellm_request *r);

/* Drops the draft KV of every running request and gives the draft pool's
 * free pages back; returns the bytes given back. */
size_t spec_trim(cellm_engine *e);

/* ---- engine_image.c: pictures in requests ---- */

/* At submit, after r's prompt is in r->tokens (n_prompt): takes the
 * pictures of `p` (none: nothing to do): checks that the prompt's image
 * tokens are as many as their rows, copies the rows, and puts each image
 * position's pseudo token in r->tokens. */
cellm_status engine_image_attach(cellm_engine *e, cellm_request *r, const cellm_request_params *p,
                                 cellm_error *err);

/* The model's image token, -1 when it has none (it takes no pictures). */
int32_t engine_image_token(const cellm_model *cm);

/* Frees r's picture rows and gives their bytes back to the engine (at
 * its end: only a running request may need them again). */
void engine_image_drop(cellm_engine *e, cellm_request *r);

/* Renders and tokenizes chat messages with pictures (p->images, each
 * marked by "<image>" in a message's content) into *ids: the template
 * lays the pictures out and each becomes cellm_image_prompt's expansion. */
cellm_status engine_image_chat(const cellm_engine *e, const cellm_request_params *p,
                               const chat_msg *msgs, tok_ids *ids, cellm_error *err);

/* The token at prompt or completion position pos of r as the model knows
 * it (the image token for a picture's row). */
static inline int32_t engine_real_token(const cellm_request *r, int32_t pos) {
    if (r->img_at && pos < r->n_prompt && r->img_at[pos] >= 0) return r->image_token;
    return r->tokens[pos];
}

/* After a step is planned: points e->embd_rows at the picture rows of the
 * batch (and gives those rows the image token). False when the batch has
 * none. */
bool engine_image_rows(cellm_engine *e);

/* ---- session.c (engine thread only) ---- */

/* At admission of a session's turn: takes the session's kept KV as far as
 * it agrees with the turn's prompt (always leaving its last token to
 * compute), and sets r->n_cached. */
void session_adopt(cellm_engine *e, cellm_request *r);

/* Undoes session_adopt for a turn that could not be admitted after all:
 * the KV it took goes back to the session, kept. */
void session_unadopt(cellm_engine *e, cellm_request *r);

/* At the end of a session's turn, before its done callback: the reply goes
 * into the history (or the user message comes out again), the turn's KV
 * becomes the session's kept KV. */
void session_turn_end(cellm_engine *e, cellm_request *r, cellm_finish_reason why);

/* Drops the kept KV of the least recently used idle session; false when
 * no session keeps any. */
bool session_drop_lru(cellm_engine *e);

/* Drops the kept KV of every idle session. Returns the blocks freed. */
int32_t session_drop_all(cellm_engine *e);

/* Lets go of a session being freed: drops its kept KV and block tables. */
void session_release_kv(cellm_engine *e, cellm_session *s);

/* Puts an idle session with kept blocks at the recent end of the list of
 * sessions whose blocks may be dropped (recounting its blocks). */
void session_keep(cellm_engine *e, cellm_session *s);

/* A new session on e with the sampling and max_tokens of `params` (NULL:
 * defaults; the system message is ignored) and the messages msgs[0..n)
 * (roles "system", "user" or "assistant"; contents copied). Sets the
 * thread's last error on failure. Caller's thread. */
cellm_status session_new_with(cellm_engine *e, const cellm_session_params *params,
                              const cellm_chat_message *msgs, int32_t n, cellm_session **out);

/* Frees what the session owns apart from its KV, and the session. */
void session_destroy(cellm_session *s);

/* ---- engine.c ---- */

/* Ends a request on the engine thread: frees its KV blocks, flushes its
 * text, runs its done callback and wakes its waiters. */
void engine_finish(cellm_engine *e, cellm_request *r, cellm_finish_reason why, cellm_status st,
                   const char *msg);

/* cellm_submit, with `s` the session whose turn this is (or NULL); for a
 * turn, `s->turn` is set under mu as the request is queued, and it fails
 * with CELLM_ERR_INVALID_ARG when a turn is already in flight. Sets the
 * thread's last error on failure. */
cellm_status engine_submit(cellm_engine *e, const cellm_request_params *p, cellm_session *s,
                           cellm_request **out);

/* Checks sampling parameters as cellm_submit does (the sampler checks the
 * rest when a request is made); sets the thread's last error. */
cellm_status engine_check_sampling(const cellm_sampling *sampling);

/* True on the engine thread (in a callback), or, for a manual engine, on
 * the thread running its step. */
bool engine_on_thread(const cellm_engine *e);

/* Waits, with e->mu held, for the engine to make progress (then the caller
 * checks its condition again): on cv_done for an engine with its own
 * thread; for a manual engine by running one step on this thread (mu is
 * released meanwhile). */
void engine_wait_locked(cellm_engine *e);

/* Runs fn(e, arg) on the engine thread between two steps and waits for it
 * (on the engine thread itself, or from a callback, it runs at once). Not
 * after cellm_engine_free has begun. */
void engine_run_job(cellm_engine *e, void (*fn)(cellm_engine *e, void *arg), void *arg);

/* Records a message as the calling thread's last error; returns `code`. */
cellm_status engine_fail(cellm_status code, const char *msg);

/* Structured output (engine_grammar.c). At submit: gives r its own
 * reference to g, a state, and the masked-row buffer (the model's token
 * trie is built by the first such request). */
cellm_status engine_grammar_attach(cellm_engine *e, cellm_request *r, const cellm_grammar *g,
                                   cellm_error *err);
/* Engine thread: the logits of `row` with every token the grammar does not
 * allow at -inf (the stop tokens allowed only where the text is whole). */
const float *engine_grammar_mask(cellm_engine *e, cellm_request *r, const float *row);
/* Engine thread: whether the grammar allows token t now (a stop token
 * where the text is whole; another token whose bytes continue it). */
bool engine_grammar_allows(cellm_engine *e, cellm_request *r, int32_t t);
/* Engine thread: advances r's grammar over token t (not a stop token);
 * false when t cannot continue the text. */
bool engine_grammar_take(cellm_engine *e, cellm_request *r, int32_t t);
/* Frees what attach made. */
void engine_grammar_release(cellm_request *r);
/* Frees the model's token trie (cellm_model_free). */
void engine_grammar_model_free(cellm_model *cm);

#endif /* CELLM_ENGINE_H */

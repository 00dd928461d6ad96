/*
 * engine.c — the public API of include/cellm.h: models, engines, requests,
 * and the engine thread that serves them (see engine.h for who owns what
 * and which lock guards it; scheduler.c plans each step; session.c keeps
 * chat sessions).
 *
 * The engine thread loops: take new requests, cancellations, trims and
 * session frees (under the engine's mutex), rest if the QoS policy's pacing
 * says so, plan a step, run it as one forward pass, then sample the next
 * token of every request whose row asked for logits, stream its text and
 * finish it on a stop token or string or a length limit. Callbacks run on this
 * thread, outside the mutex. Everything a request needs on the way (token
 * array, sampler, stop-string matcher, block table, text buffer) is allocated when it is
 * submitted, so a step allocates nothing.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime/engine.h"
#include "model/kv_calib.h"
#include "text/json.h"

#define DEFAULT_BUDGET ((size_t)256 << 20)
#define DEFAULT_IMAGE_BUDGET ((size_t)16 << 20)

double engine_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ last error */

static _Thread_local char tl_error[CELLM_ERR_MSG_MAX];

const char *cellm_last_error(void) {
    return tl_error;
}

/* Records err's message as this thread's last error; returns its code. */
static cellm_status fail(const cellm_error *err) {
    snprintf(tl_error, sizeof tl_error, "%s", err->msg);
    return err->code;
}

static cellm_status fail_msg(cellm_status code, const char *msg) {
    snprintf(tl_error, sizeof tl_error, "%s", msg);
    return code;
}

cellm_status engine_fail(cellm_status code, const char *msg) {
    return fail_msg(code, msg);
}

/* The manual engine whose step this thread is running, if any. */
static _Thread_local const cellm_engine *tl_stepping;

bool engine_on_thread(const cellm_engine *e) {
    if (e->manual) return tl_stepping == e;
    return pthread_equal(pthread_self(), e->thread) != 0;
}

/* ------------------------------------------------------------------ models */

cellm_model_params cellm_model_default_params(void) {
    cellm_model_params p;
    memset(&p, 0, sizeof p);
    return p;
}

cellm_status cellm_model_load(const char *path, const cellm_model_params *params,
                              cellm_model **out) {
    if (!out) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_model_load: out is NULL");
    *out = NULL;
    if (!path) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_model_load: path is NULL");
    cellm_model_params p = params ? *params : cellm_model_default_params();
    cellm_error err;
    err_clear(&err);
    cellm_model *cm = calloc(1, sizeof *cm);
    if (!cm) return fail_msg(CELLM_ERR_NO_MEMORY, "out of memory");
    pthread_mutex_init(&cm->gv_mu, NULL);
    if (model_load(path, &cm->m, &err) || tokenizer_load(cm->m->file, &cm->tok, &err)) {
        cellm_model_free(cm);
        return fail(&err);
    }
    /* A model without a usable chat template still serves prompts and
     * tokens; only chat-message requests need it, and they get this
     * message. */
    cellm_error cerr;
    err_clear(&cerr);
    cm->has_chat = chat_tpl_init(cm->m, cm->tok, p.chat_template, &cm->chat, &cerr) == CELLM_OK;
    if (!cm->has_chat) {
        /* A bad name or template of the caller's, or no memory, is an error. */
        if (cerr.code == CELLM_ERR_INVALID_ARG || cerr.code == CELLM_ERR_NO_MEMORY) {
            cellm_model_free(cm);
            return fail(&cerr);
        }
        snprintf(cm->chat_err, sizeof cm->chat_err, "%s", cerr.msg);
    }
    *out = cm;
    return CELLM_OK;
}

void cellm_model_free(cellm_model *cm) {
    if (!cm) return;
    if (cm->has_chat) chat_tpl_free(&cm->chat);
    engine_grammar_model_free(cm);
    pthread_mutex_destroy(&cm->gv_mu);
    tokenizer_free(cm->tok);
    model_free(cm->m);
    free(cm);
}

cellm_status cellm_tokenize(const cellm_model *cm, const char *text, int32_t **ids, int32_t *n) {
    if (!cm || !text || !ids || !n)
        return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_tokenize: a NULL argument");
    cellm_error err;
    err_clear(&err);
    tok_ids v = {0};
    if (tokenizer_encode(cm->tok, text, strlen(text), TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL, &v,
                         &err))
        return fail(&err);
    *ids = v.ids;
    *n = (int32_t)v.n;
    return CELLM_OK;
}

/* ------------------------------------------------------------ the thread */

/* Publishes counts for cellm_engine_stats. Engine thread, e->mu held. */
static void publish_locked(cellm_engine *e) {
    cellm_stats *s = &e->stats;
    size_t kv_used = 0;
    s->blocks_total = s->blocks_used = 0;
    for (int32_t g = 0; g < e->kv->n_groups; g++) {
        const kv_group *kg = &e->kv->groups[g];
        int32_t used = kv_cache_used_blocks(e->kv, g);
        s->blocks_total += kg->n_blocks;
        s->blocks_used += used;
        kv_used += (size_t)used * kg->block_bytes;
    }
    s->blocks_free = s->blocks_total - s->blocks_used;
    s->bytes_in_use = e->act_bytes + kv_used; /* + pictures at cellm_engine_stats */
    s->n_running = e->sched.n_running;
    s->n_waiting = e->sched.n_waiting;
    s->n_steps = e->n_steps;
    s->n_preemptions = e->sched.n_preempt;
    s->n_prompt_tokens = e->n_prompt_tok;
    s->n_completion_tokens = e->n_gen_tok;
    s->prompt_tokens_per_s = e->rate_prompt;
    s->completion_tokens_per_s = e->rate_gen;
    s->n_sampled = e->n_sampled;
    s->sample_seconds = e->t_sample;
    s->grammar_seconds = e->t_grammar;
    s->n_grammar_tokens = e->n_grammar;
    s->n_grammar_masks = e->n_grammar_mask;
    s->grammar_mask_seconds = e->t_grammar_mask;
    s->bytes_kv_resident = kv_cache_resident_bytes(e->kv);
    s->bytes_released = e->bytes_released;
    s->n_trims = e->n_trims;
    s->blocks_kept = e->blocks_kept;
    s->blocks_cached = 0;
    for (int32_t g = 0; g < e->kv->n_groups; g++)
        s->blocks_cached += kv_cache_idle_blocks(e->kv, g);
    s->n_prefix_tokens = e->sched.n_prefix_tok;
    s->n_draft_tokens = e->n_draft_tok;
    s->n_draft_accepted = e->n_draft_acc;
    s->n_spec_passes = e->n_spec_pass;
    s->n_draft_steps = e->n_draft_steps;
    s->n_sessions_kept = e->n_lru;
    s->n_threads = tp_threads(e->tp);
    s->rest_seconds = e->rest_s;
}

/* Calls the piece callback unless the owner has let go of the request;
 * a session's turn also keeps the text for the history. */
static void emit(cellm_request *r, const char *piece, size_t n) {
    if (!n) return;
    if (r->reply && r->reply_len + n < r->reply_cap) {
        memcpy(r->reply + r->reply_len, piece, n);
        r->reply_len += n;
        r->reply[r->reply_len] = '\0';
    }
    if (r->on_piece && !r->detached) r->on_piece(piece, n, r->user);
}

/* Passes decoded text on through the request's stop strings; returns true
 * when one has matched (nothing of it was emitted). */
static bool deliver(cellm_request *r, const char *piece, size_t n) {
    if (!r->stops) {
        emit(r, piece, n);
        return false;
    }
    const char *out;
    size_t out_n = 0;
    bool stopped = false;
    /* The buffers were sized at submit, so this cannot fail. */
    if (stop_feed(r->stops, piece, n, &out, &out_n, &stopped, NULL) == CELLM_OK)
        emit(r, out, out_n);
    if (stopped && r->stop_index < 0) r->stop_index = stop_matched(r->stops);
    return stopped;
}

static void request_release(cellm_request *r) {
    sampler_free(r->smp);
    free(r->spec_q);
    engine_grammar_release(r);
    stop_free(r->stops);
    free(r->tokens);
    free(r->img_at);
    engine_image_drop(r->e, r);
    free(r->piece);
    free(r->reply);
    free(r);
}

void engine_finish(cellm_engine *e, cellm_request *r, cellm_finish_reason why, cellm_status st,
                   const char *msg) {
    sched_remove(&e->sched, &r->sched);
    size_t n = 0;
    if (tok_stream_flush(&r->ts, r->piece, r->piece_cap, &n, NULL) == CELLM_OK)
        deliver(r, r->piece, n);
    if (r->stops) {
        /* The held tail is not a stop string after all (nothing after a
         * match). */
        const char *tail;
        stop_flush(r->stops, &tail, &n);
        emit(r, tail, n);
    }
    /* A session's turn hands its KV to the session (and its text to the
     * history); anything else's blocks go back to the pool now. */
    if (r->session) session_turn_end(e, r, why);
    kv_seq_free(e->kv, &r->seq);
    spec_drop(e, r);
    engine_image_drop(e, r);
    double t = engine_now_s();
    cellm_result res;
    memset(&res, 0, sizeof res);
    res.finish_reason = why;
    res.status = st;
    res.n_prompt_tokens = r->n_prompt;
    res.n_completion_tokens = r->sched.n_tokens - r->n_prompt;
    res.n_preemptions = r->sched.n_preempt;
    res.n_cached_tokens = r->sched.n_cached;
    res.queue_ms = ((r->t_first_step > 0 ? r->t_first_step : t) - r->t_submit) * 1e3;
    res.first_token_ms = r->t_first_token > 0 ? (r->t_first_token - r->t_submit) * 1e3 : 0;
    res.total_ms = (t - r->t_submit) * 1e3;
    res.stop_token = why == CELLM_FINISH_STOP ? r->stop_token : -1;
    res.stop_index = why == CELLM_FINISH_STOP ? r->stop_index : -1;
    if (msg) snprintf(r->err, sizeof r->err, "%s", msg);
    if (r->on_done && !r->detached) r->on_done(&res, r->user);
    cellm_session *orphan = NULL;
    pthread_mutex_lock(&e->mu);
    r->result = res;
    r->done = true;
    bool last = --r->refs == 0;
    if (r->session) {
        r->session->turn = NULL;
        if (r->session->free_pending) {
            /* Freed from a callback while this turn ran: its blocks go
             * back before the stats are published. */
            orphan = r->session;
            session_release_kv(e, orphan);
        }
    }
    publish_locked(e);
    pthread_cond_broadcast(&e->cv_done);
    pthread_mutex_unlock(&e->mu);
    session_destroy(orphan);
    if (last) request_release(r);
}

/* Everything fed in the step is lost: fail those requests. The first such
 * error is kept for cellm_engine_error. */
static void fail_fed(cellm_engine *e, const cellm_error *err) {
    if (!atomic_load_explicit(&e->failed, memory_order_relaxed)) {
        snprintf(e->error, sizeof e->error, "%s", err->msg);
        atomic_store_explicit(&e->failed, true, memory_order_release);
    }
    for (int32_t i = 0; i < e->sched.n_fed; i++)
        engine_finish(e, req_of(e->sched.fed[i]), CELLM_FINISH_ERROR, err->code, err->msg);
}

static bool is_stop(const cellm_request *r, int32_t t) {
    for (int32_t i = 0; i < r->n_stop; i++)
        if (r->stop[i] == t) return true;
    return false;
}

/* Passes token `token` at `pos` and its log-probability in `row` (the
 * logits of the position before it; NULL: none, the first prompt token)
 * to r's on_logprob. Only for requests that asked: the one pass over the
 * vocabulary is theirs alone. */
static void report_logprob(cellm_engine *e, cellm_request *r, const float *row, int32_t token,
                           int32_t pos, bool prompt) {
    if (r->detached) return;
    int32_t n_vocab = e->model->m->n_vocab;
    cellm_token_logprob lp = {token, pos, prompt, NAN, 0, r->lp_top_buf};
    if (row) {
        double norm = sampler_log_norm(row, n_vocab);
        lp.logprob = sampler_token_logprob(row, norm, token);
        _Static_assert(sizeof(cellm_top_logprob) == sizeof(sampler_logprob), "logprob layout");
        lp.n_top =
            sampler_top_logprobs(row, n_vocab, norm, r->lp_top, (sampler_logprob *)r->lp_top_buf);
    }
    r->on_logprob(&lp, r->user);
}

/* Takes token t, chosen from the logits `row`, as r's next: appends it
 * and streams its text. Returns the reason r must finish now, or -1 to go
 * on. */
static int take_token(cellm_engine *e, cellm_request *r, int32_t t, const float *row,
                      double t_now) {
    if (r->t_first_token == 0) r->t_first_token = t_now;
    if (is_stop(r, t)) {
        r->stop_token = t;
        /* With the prompt's log-probabilities (echo) the stop token gets its
         * own too, last: harnesses take the final item as the generated one. */
        if (r->lp_gen && r->lp_prompt) report_logprob(e, r, row, t, r->sched.n_tokens, false);
        return CELLM_FINISH_STOP;
    }
    if (r->gst && !engine_grammar_take(e, r, t)) return CELLM_FINISH_ERROR;
    if (r->lp_gen) report_logprob(e, r, row, t, r->sched.n_tokens, false);
    r->tokens[r->sched.n_tokens++] = t;
    sampler_accept(r->smp, t, NULL); /* t is in the vocabulary: cannot fail */
    e->n_gen_tok++;
    e->win_gen++;
    size_t n = 0;
    if (tok_stream_push(&r->ts, t, r->piece, r->piece_cap, &n, NULL) == CELLM_OK &&
        deliver(r, r->piece, n))
        return CELLM_FINISH_STOP;
    int32_t n_gen = r->sched.n_tokens - r->n_prompt;
    if ((r->max_tokens >= 0 && n_gen >= r->max_tokens) || r->sched.n_tokens >= r->cap)
        return CELLM_FINISH_LENGTH;
    return -1;
}

/* Finishes r for the reason take_token gave. */
static void finish_taken(cellm_engine *e, cellm_request *r, int why) {
    if (why == CELLM_FINISH_ERROR)
        engine_finish(e, r, CELLM_FINISH_ERROR, CELLM_ERR_FORMAT,
                      "grammar: no token can continue the text (a grammar limit was reached)");
    else
        engine_finish(e, r, (cellm_finish_reason)why, CELLM_OK, NULL);
}

/* r's next token (at tokens[n_tokens]) from its logits row; j: the guess
 * made there (-1: none), which only the resample rule looks at. */
static int32_t sample_timed(cellm_engine *e, cellm_request *r, const float *row, int32_t j) {
    double t0 = engine_now_s();
    int32_t pos = r->sched.n_tokens;
    sampler_bind(r->smp, e->smp_scr[0]);
    int32_t t = r->pre_row == row ? r->pre_tok
                : !r->spec_q      ? sampler_sample(r->smp, row)
                : j < 0           ? spec_sample(r->smp, row, pos, -1, NULL)
                                  : spec_sample(r->smp, row, pos, r->tokens[pos], &r->spec_q[j]);
    r->pre_row = NULL;
    /* With a grammar: the token drawn from the whole distribution stands
     * when the grammar allows it; only otherwise is the vocabulary masked
     * and the token drawn again from what the grammar allows. (As
     * rejection sampling this draws from the masked distribution; with
     * truncation the pool of the first draw is the unmasked one.) The
     * draws use only the request's own generator and state. */
    if (r->gst && !engine_grammar_allows(e, r, t))
        t = sampler_sample(r->smp, engine_grammar_mask(e, r, row));
    e->t_sample += engine_now_s() - t0;
    e->n_sampled++;
    return t;
}

/* Checks r's guesses against its logits rows[0 .. n_draft]: samples each
 * position in turn, as a plain run would, while the guesses before it
 * were kept; then takes the KV of rejected guesses back (spec.c). */
static void verify(cellm_engine *e, cellm_request *r, const float *rows, int32_t n_vocab,
                   double t_now) {
    int32_t nd = r->sched.n_draft, first = r->sched.n_tokens; /* guesses at tokens[first ..] */
    int why = -1, kept = 0;
    for (int32_t j = 0; j <= nd; j++) {
        int32_t guess = j < nd ? r->tokens[first + j] : -1;
        const float *row = rows + (size_t)j * (size_t)n_vocab;
        int32_t t = sample_timed(e, r, row, j < nd ? j : -1);
        why = take_token(e, r, t, row, t_now);
        if (why >= 0 || t != guess) break;
        kept++;
    }
    e->n_draft_tok += (uint64_t)nd;
    e->n_draft_acc += (uint64_t)kept;
    e->n_spec_pass++;
    /* The KV holds the pending token and the kept guesses; what the
     * rejected ones wrote goes. A stop token is not appended, so then the
     * KV already ends at n_tokens. */
    int32_t valid = first + kept;
    if (r->seq.n_pos > valid && !kv_seq_truncate(e->kv, &r->seq, valid)) {
        /* The slack keeps what a truncation needs; should it not, the
         * request recomputes its KV (preempted), its text unchanged. */
        kv_seq_reset(e->kv, &r->seq);
    }
    int32_t k = r->spec_k > 0 ? r->spec_k : e->p.draft_max;
    r->spec_k = spec_next_k(k, nd, kept, e->p.draft_max);
    if (why >= 0) {
        finish_taken(e, r, why);
        return;
    }
    spec_after(e, r);
}

/* With prompt_logprobs: reports the prompt tokens whose logits this step
 * computed, rows [from, to) of r, the first at logits row *li (advanced
 * past them). */
static void report_prompt(cellm_engine *e, cellm_request *r, int32_t from, int32_t to,
                          const float *logits, int32_t *li) {
    size_t n_vocab = (size_t)e->model->m->n_vocab;
    if (from == 0 && r->sched.lp_done == 0) {
        report_logprob(e, r, NULL, engine_real_token(r, 0), 0, true);
        r->sched.lp_done = 1;
    }
    for (int32_t pos = from; pos < to && pos + 1 < r->sched.n_tokens; pos++) {
        if (!sched_row_logits(&r->sched, pos)) continue;
        const float *row = logits + (size_t)(*li)++ * n_vocab;
        report_logprob(e, r, row, engine_real_token(r, pos + 1), pos + 1, true);
        r->sched.lp_done = pos + 2;
    }
}

/* The rows of this step's logits that are r's (its pending token's and its
 * guesses'); 0 or less mid-prompt. */
static int32_t logit_rows(const cellm_request *r) {
    return r->seq.n_pos - r->sched.n_tokens + 1;
}

/* Draws the pending token of the requests step_outputs marked (pre_row),
 * the fed requests split over the pool's threads. Each sampler is its
 * request's alone and draws what it would on the engine thread: its own
 * generator, in the request's own order. */
static void presample_task(void *arg, int ith, int nth) {
    cellm_engine *e = arg;
    long b, end;
    tp_split(e->sched.n_fed, ith, nth, &b, &end);
    for (long i = b; i < end; i++) {
        cellm_request *r = req_of(e->sched.fed[i]);
        if (!r->pre_row) continue;
        sampler_bind(r->smp, e->smp_scr[ith]);
        r->pre_tok = sampler_sample(r->smp, r->pre_row);
    }
}

/* With many requests sampling plain rows this step (no guesses to check,
 * no prompt log-probabilities), their first draws run on the pool first;
 * the grammar check, the tokens' delivery and everything else stay on the
 * engine thread, in order. Each row marked here goes through sample_timed
 * in step_outputs, which takes the token and clears the mark. */
static void presample(cellm_engine *e, const float *logits) {
    enum { PRESAMPLE_MIN = 8 }; /* fewer are not worth waking the pool */
    if (tp_threads(e->tp) < 2 || e->sched.n_fed < PRESAMPLE_MIN) return;
    size_t n_vocab = (size_t)e->model->m->n_vocab;
    for (int32_t i = 0; i < e->sched.n_fed; i++) {
        const cellm_request *r = req_of(e->sched.fed[i]);
        if (r->lp_prompt && r->sched.lp_done < r->n_prompt) return; /* rows of its own */
    }
    int32_t li = 0, n = 0;
    for (int32_t i = 0; i < e->sched.n_fed; i++) {
        cellm_request *r = req_of(e->sched.fed[i]);
        int32_t n_rows = logit_rows(r);
        if (n_rows <= 0) continue;
        if (n_rows == 1 && r->sched.n_draft == 0 && !r->spec_q && r->max_tokens != 0) {
            r->pre_row = logits + (size_t)li * n_vocab;
            n++;
        }
        li += n_rows;
    }
    if (n < PRESAMPLE_MIN) {
        for (int32_t i = 0; i < e->sched.n_fed; i++) req_of(e->sched.fed[i])->pre_row = NULL;
        return;
    }
    double t0 = engine_now_s();
    tp_run(e->tp, presample_task, e);
    e->t_sample += engine_now_s() - t0;
}

/* After a forward pass: the prompt tokens' log-probabilities of requests
 * that report them, and the next token of every request that asked (and
 * the check of its guesses, if it made any). */
static void step_outputs(cellm_engine *e, const float *logits, double t_now) {
    int32_t n_vocab = e->model->m->n_vocab, li = 0;
    presample(e, logits);
    for (int32_t i = 0; i < e->sched.n_fed; i++) {
        cellm_request *r = req_of(e->sched.fed[i]);
        if (r->lp_prompt && r->sched.lp_done < r->n_prompt)
            report_prompt(e, r, r->seq.n_pos - r->sched.plan_n, r->seq.n_pos, logits, &li);
        int32_t n_rows = logit_rows(r);
        if (n_rows <= 0) continue; /* mid-prompt: no logits */
        const float *row = logits + (size_t)li * (size_t)n_vocab;
        li += n_rows;
        if (r->max_tokens == 0) { /* the prompt alone was asked for */
            engine_finish(e, r, CELLM_FINISH_LENGTH, CELLM_OK, NULL);
            continue;
        }
        if (r->sched.n_draft > 0) {
            verify(e, r, row, n_vocab, t_now);
            continue;
        }
        int why = take_token(e, r, sample_timed(e, r, row, -1), row, t_now);
        if (why >= 0) finish_taken(e, r, why);
    }
}

/* Whether this step's logit rows come back as their best FWD_TOP_K
 * (backend.h's fwd_top) instead of whole rows: the backend can, every
 * request with a logit row this step has exactly one, its pending token's
 * (no guesses), whose pick those decide (top_ok), and there are enough of
 * them. On a GPU that spares the copy of the rows to the host and the
 * host's pass over them: at 64 rows of SmolLM2's vocabulary, 12 MiB a
 * step (64 sessions: 15,400-15,700 -> 17,800-18,300 tokens/s on the
 * H100). A row or two come back faster whole than picked in the top
 * kernel's two stages (tg128 818-821 tokens/s whole, 797-816 picked). */
static bool step_top(const cellm_engine *e, int32_t n_rows) {
    enum { TOP_MIN_ROWS = 4 };
    if (e->top_off || !backend_has_top(&e->fwd)) return false;
    int32_t n = 0, asked = 0;
    for (int32_t i = 0; i < e->sched.n_fed; i++) {
        const cellm_request *r = req_of(e->sched.fed[i]);
        /* logit_rows once the step has advanced the sequence */
        int32_t n_out = r->seq.n_pos + r->sched.plan_n - r->sched.n_tokens + 1;
        if (n_out <= 0) continue;
        if (!r->top_ok || n_out != 1 || r->sched.n_draft > 0) return false;
        n++;
    }
    /* No other row asks (a prompt's log-probabilities, mid-prompt). */
    for (int32_t i = 0; i < n_rows; i++) asked += e->sched.rows[i].logits;
    return n == asked && n >= TOP_MIN_ROWS;
}

/* step_outputs for a step whose logit rows came back as fwd_top: each
 * request's greedy pick (the token sampler_sample would draw from the
 * whole row). */
static void step_outputs_top(cellm_engine *e, const fwd_top *top, double t_now) {
    int32_t li = 0;
    for (int32_t i = 0; i < e->sched.n_fed; i++) {
        cellm_request *r = req_of(e->sched.fed[i]);
        if (logit_rows(r) <= 0) continue;
        const fwd_top *tp = &top[li++];
        double t0 = engine_now_s();
        int32_t t = sampler_pick_top(r->smp, tp->logit, tp->token, FWD_TOP_K);
        e->t_sample += engine_now_s() - t0;
        e->n_sampled++;
        int why = take_token(e, r, t, NULL, t_now);
        if (why >= 0) finish_taken(e, r, why);
    }
}

/* Gives memory back at `level` (cellm_trim_level); returns the bytes the
 * OS got back. */
static size_t trim_now(cellm_engine *e, int level) {
    if (level >= CELLM_TRIM_CRITICAL) sched_preempt_all(&e->sched);
    if (level >= CELLM_TRIM_MODERATE) session_drop_all(e);
    size_t draft = spec_trim(e); /* the draft's KV goes first, at every level */
    return draft + kv_cache_release_free(e->kv);
}

/* Takes new requests in, finishes the cancelled ones (all of them when the
 * engine stops), lets go of freed sessions, trims, and takes up the QoS
 * policy. Returns false when the thread should end. */
static bool step_intake(cellm_engine *e, bool block) {
    pthread_mutex_lock(&e->mu);
    while (block && !e->stop && !e->incoming && e->sched.n_running == 0 && !e->sched.waiting &&
           !e->trim_level && !e->session_frees && !e->jobs) {
        e->win_t0 = 0; /* idle time is not in the rates */
        pthread_cond_wait(&e->cv_work, &e->mu);
    }
    bool stopping = e->stop;
    while (e->incoming) {
        cellm_request *r = e->incoming;
        e->incoming = r->next;
        e->n_incoming--;
        sched_enqueue(&e->sched, &r->sched);
    }
    for (int32_t i = 0; i < e->sched.n_running; i++) {
        cellm_request *r = req_of(e->sched.running[i]);
        r->cancel_seen = r->cancel || stopping;
    }
    for (sched_item *it = e->sched.waiting; it; it = it->next) {
        cellm_request *r = req_of(it);
        r->cancel_seen = r->cancel || stopping;
    }
    e->qos_now = e->qos;
    int trim = e->trim_level;
    uint64_t trim_ticket = e->trim_asked;
    e->trim_level = 0;
    cellm_session *frees = e->session_frees;
    e->session_frees = NULL;
    engine_job *jobs = e->jobs;
    e->jobs = NULL;
    pthread_mutex_unlock(&e->mu);

    tp_set_threads(e->tp, e->qos_now.n_threads > 0 ? e->qos_now.n_threads : tp_size(e->tp));
    for (int32_t i = e->sched.n_running - 1; i >= 0; i--) {
        cellm_request *r = req_of(e->sched.running[i]);
        if (r->cancel_seen) engine_finish(e, r, CELLM_FINISH_CANCELLED, CELLM_OK, NULL);
    }
    for (sched_item *it = e->sched.waiting, *next; it; it = next) {
        next = it->next;
        cellm_request *r = req_of(it);
        if (r->cancel_seen) engine_finish(e, r, CELLM_FINISH_CANCELLED, CELLM_OK, NULL);
    }
    while (frees) {
        cellm_session *sn = frees;
        frees = sn->next_free;
        session_release_kv(e, sn);
        pthread_mutex_lock(&e->mu);
        sn->dropped = true; /* the freeing thread may free it from here on */
        publish_locked(e);
        pthread_cond_broadcast(&e->cv_done);
        pthread_mutex_unlock(&e->mu);
    }
    while (jobs) {
        engine_job *j = jobs;
        jobs = j->next;
        j->fn(e, j->arg);
        pthread_mutex_lock(&e->mu);
        j->done = true; /* the waiting thread may free it from here on */
        publish_locked(e);
        pthread_cond_broadcast(&e->cv_done);
        pthread_mutex_unlock(&e->mu);
    }
    if (trim) {
        size_t released = trim_now(e, trim);
        pthread_mutex_lock(&e->mu);
        e->trim_released = released;
        e->trim_done = trim_ticket;
        e->bytes_released += released;
        e->n_trims++;
        publish_locked(e);
        pthread_cond_broadcast(&e->cv_done);
        pthread_mutex_unlock(&e->mu);
    }
    return !stopping;
}

/* When the QoS policy lets the next step start (0: now), from the last
 * step's times. */
static double next_step_at(const cellm_engine *e) {
    if (e->step_t1 <= 0) return 0;
    const cellm_qos *q = &e->qos_now;
    double at = e->step_t0 + (double)q->min_step_us * 1e-6;
    if (q->duty_cycle < 1) {
        double rest = (e->step_t1 - e->step_t0) * (1 - (double)q->duty_cycle) / q->duty_cycle;
        if (e->step_t1 + rest > at) at = e->step_t1 + rest;
    }
    return at;
}

/* Rests until `until` (now_s time) or something needs the engine thread
 * sooner: a cancel, a trim, a session free, a new policy or the stop (they
 * bump e->events; new requests do not, they wait for the next step). */
static void engine_rest(cellm_engine *e, double until) {
    double t0 = engine_now_s(), t = t0;
    pthread_mutex_lock(&e->mu);
    uint64_t events = e->events;
    while (!e->stop && e->events == events && t < until) {
        /* Condition variables wait on the real-time clock wherever
         * pthread_condattr_setclock is missing (Darwin): aim by it. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double left = until - t;
        long sec = (long)left;
        long nsec = ts.tv_nsec + (long)((left - (double)sec) * 1e9);
        ts.tv_sec += sec + nsec / 1000000000L;
        ts.tv_nsec = nsec % 1000000000L;
        pthread_cond_timedwait(&e->cv_work, &e->mu, &ts);
        t = engine_now_s();
    }
    pthread_mutex_unlock(&e->mu);
    e->rest_s += t - t0;
}

/* One step: intake, then (unless the QoS policy says rest, or nothing has
 * work) one forward pass and its outputs. `block`: the engine thread's
 * way, waiting for work and resting as the policy says; a manual step does
 * neither. Returns -1 when the engine is stopping, 0 when no forward pass
 * ran, 1 when one did. */
static int engine_step_once(cellm_engine *e, bool block) {
    cellm_error err;
    if (!step_intake(e, block)) return -1;
    double at = block ? next_step_at(e) : 0;
    if (at > 0 && (e->sched.n_running > 0 || e->sched.waiting) && engine_now_s() < at) {
        engine_rest(e, at); /* then take in what came meanwhile */
        return 0;
    }
    spec_propose(e);
    int32_t n_rows = sched_plan_step(&e->sched);
    if (n_rows == 0) return 0;
    double t0 = engine_now_s();
    if (e->win_t0 == 0) e->win_t0 = t0;
    for (int32_t i = 0; i < e->sched.n_fed; i++) {
        cellm_request *r = req_of(e->sched.fed[i]);
        if (r->t_first_step == 0) r->t_first_step = t0;
    }
    /* Rows before each request's last token: prompt (or recomputed) rows,
     * whether or not they ask for logits (prompt_logprobs). */
    int32_t n_prompt_rows = 0;
    for (int32_t i = 0; i < e->sched.n_fed; i++) {
        const sched_item *it = e->sched.fed[i];
        int32_t before_last = it->n_tokens - 1 - it->seq->n_pos;
        n_prompt_rows += before_last < 0 ? 0 : before_last < it->plan_n ? before_last : it->plan_n;
    }
    const float *logits = NULL;
    const fwd_top *top = NULL;
    err_clear(&err);
    const float *const *embd = engine_image_rows(e) ? e->embd_rows : NULL;
    bool use_top = step_top(e, n_rows);
    cellm_status st = use_top
                          ? backend_run_top(&e->fwd, e->sched.rows, embd, n_rows, &top, &err)
                          : backend_run_embd(&e->fwd, e->sched.rows, embd, n_rows, &logits, &err);
    if (st != CELLM_OK) {
        /* The scheduler counted the blocks, so this is a bug or a bad
         * input we did not catch at submit: fail the step's requests,
         * keep serving the others. */
        fail_fed(e, &err);
        return 1;
    }
    e->n_prompt_tok += (uint64_t)n_prompt_rows;
    e->win_prompt += (uint64_t)n_prompt_rows;
    double t1 = engine_now_s();
    uint64_t n_gen = e->n_gen_tok;
    if (use_top)
        step_outputs_top(e, top, t1);
    else
        step_outputs(e, logits, t1);
    if (e->dkv)
        spec_step_done(e, n_rows, n_prompt_rows, (t1 - t0) * 1e3, (int32_t)(e->n_gen_tok - n_gen));
    e->n_steps++;
    e->step_t0 = t0;
    e->step_t1 = engine_now_s();
    if (t1 - e->win_t0 >= 1.0) {
        e->rate_prompt = (double)e->win_prompt / (t1 - e->win_t0);
        e->rate_gen = (double)e->win_gen / (t1 - e->win_t0);
        e->win_prompt = e->win_gen = 0;
        e->win_t0 = t1;
    }
    pthread_mutex_lock(&e->mu);
    publish_locked(e);
    pthread_mutex_unlock(&e->mu);
    return 1;
}

static void *engine_main(void *arg) {
    cellm_engine *e = arg;
    while (engine_step_once(e, true) >= 0) {
    }
    return NULL;
}

/* A manual engine's step on this thread; *more as cellm_engine_step. */
static int manual_step(cellm_engine *e, int *more) {
    pthread_mutex_lock(&e->step_mu);
    tl_stepping = e;
    int r = engine_step_once(e, false);
    if (more) {
        pthread_mutex_lock(&e->mu);
        *more = e->sched.n_running > 0 || e->sched.waiting || e->incoming || e->trim_level ||
                e->session_frees || e->jobs;
        pthread_mutex_unlock(&e->mu);
    }
    tl_stepping = NULL;
    pthread_mutex_unlock(&e->step_mu);
    return r;
}

cellm_status cellm_engine_step(cellm_engine *e, int *more) {
    if (more) *more = 0;
    if (!e) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_engine_step: engine is NULL");
    if (!e->manual)
        return fail_msg(CELLM_ERR_INVALID_ARG,
                        "cellm_engine_step: the engine runs its own thread (manual_steps is 0)");
    if (engine_on_thread(e))
        return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_engine_step called from a callback");
    manual_step(e, more);
    return CELLM_OK;
}

void engine_wait_locked(cellm_engine *e) {
    if (!e->manual) {
        pthread_cond_wait(&e->cv_done, &e->mu);
        return;
    }
    pthread_mutex_unlock(&e->mu);
    manual_step(e, NULL);
    pthread_mutex_lock(&e->mu);
}

void engine_run_job(cellm_engine *e, void (*fn)(cellm_engine *e, void *arg), void *arg) {
    if (engine_on_thread(e)) {
        fn(e, arg);
        return;
    }
    engine_job j = {fn, arg, false, NULL};
    pthread_mutex_lock(&e->mu);
    j.next = e->jobs;
    e->jobs = &j;
    e->events++;
    pthread_cond_signal(&e->cv_work);
    while (!j.done) engine_wait_locked(e);
    pthread_mutex_unlock(&e->mu);
}

/* ------------------------------------------------------ the scheduler's hooks */

/* A request that has outgrown the whole KV cache. */
static void hook_finish(void *e, sched_item *it) {
    engine_finish(e, req_of(it), CELLM_FINISH_LENGTH, CELLM_OK, NULL);
}

/* A preempted request's draft KV goes with its blocks. */
static void hook_preempted(void *e, sched_item *it) {
    spec_drop(e, req_of(it));
}

/* Idle sessions' kept blocks go before anything is preempted. */
static bool hook_reclaim(void *e) {
    return session_drop_lru(e);
}

/* A session's turn takes its session's kept KV at admission. */
static bool hook_adopt(void *e, sched_item *it) {
    cellm_request *r = req_of(it);
    if (!r->session || r->adopted) return false;
    session_adopt(e, r);
    return true;
}

static void hook_unadopt(void *e, sched_item *it) {
    session_unadopt(e, req_of(it));
}

/* ----------------------------------------------------------------- engines */

cellm_engine_params cellm_engine_default_params(void) {
    cellm_engine_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 0;
    p.mem_budget_bytes = DEFAULT_BUDGET;
    p.max_batch_tokens = 256;
    p.max_seqs = 16;
    p.max_ctx = 0;
    p.kv_type = CELLM_KV_F16;
    p.prefix_cache = 1;
    p.qos.n_threads = 0;
    p.qos.min_step_us = 0;
    p.qos.duty_cycle = 1.0f;
    p.draft_max = 8;
    p.draft_min = 1;
    p.draft_p_min = 0.5f;
    p.device = CELLM_DEVICE_AUTO;
    return p;
}

/* Checks a policy against a pool of `pool` threads; NULL when it is good,
 * else what is wrong. */
static const char *qos_check(const cellm_qos *q, int pool) {
    if (q->n_threads < 0 || q->n_threads > pool)
        return "qos.n_threads must be 0 (all) up to the engine's n_threads";
    if (q->min_step_us < 0 || q->min_step_us > 10000000)
        return "qos.min_step_us must be 0..10000000";
    if (!(q->duty_cycle >= 0.01f && q->duty_cycle <= 1.0f)) return "qos.duty_cycle must be 0.01..1";
    return NULL;
}

/* The phone memory mode's accounting (cellm_engine_params.process_budget_bytes).
 * Beyond the model's file, the process holds: the model's tables, at most
 * 96 bytes per vocabulary entry (measured with bench/heap_after_load.c:
 * 3.9 MiB of heap after loading SmolLM2's 49,152 tokens and merges, 83
 * bytes a token; 9.2 MiB for Gemma 3's 262,144, 37 bytes a token); code,
 * the C library, stdio and the stacks the threads touch; what the GPU's
 * drivers leave resident once listed (device_driver_bytes: none for the
 * CPU device); the samplers' scratch, one a thread (sampler_scratch_bytes: 5 arrays of the
 * vocabulary's size and a table of a window); and per request what a
 * grammar holds by the vocabulary (a masked row of floats and 9 masks of
 * a bit a token: 6 bytes a token), its token array and a session's history,
 * penalty window and kept tokens (16 bytes per position of max_ctx).
 * test_memory measures the peak resident size of real runs against this
 * sum. */
#define PROC_TABLE_BYTES_PER_TOKEN 96
#define PROC_RUNTIME_BYTES ((size_t)8 << 20)
#define PROC_THREAD_BYTES ((size_t)256 << 10)
#define PROC_REQUEST_BYTES_PER_TOKEN 6
#define PROC_SEQ_BYTES_PER_POS 16

/* The smallest step process_budget_fit's caller lowers max_batch_tokens
 * to (SmolLM2's prompt in chunks of 64 rows runs at 98% of the speed of
 * 256: docs/benchmarks.md). */
#define PROC_MIN_BATCH 64

/* The activations of an engine with params p: the forward pass's, its row
 * tables and the draft's. */
static size_t act_bytes_for(const model *m, const cellm_engine_params *p, int32_t logit_rows) {
    return forward_bytes(m, p->max_batch_tokens, logit_rows, p->n_threads, p->max_ctx) +
           (size_t)p->max_batch_tokens * (sizeof(fwd_row) + sizeof(float *)) +
           2 * (size_t)p->max_seqs * sizeof(cellm_request *) + spec_draft_act_bytes(p);
}

/* Fits the engine into p->process_budget_bytes: sets p->mem_budget_bytes
 * to what the process leaves for activations and KV, or fails with the
 * figures when max_seqs sequences of max_ctx positions do not fit. */
static cellm_status process_budget_fit(const cellm_model *cm, cellm_engine_params *p,
                                       size_t act_bytes, size_t img_bytes, cellm_error *err) {
    const model *m = cm->m, *dm = p->draft_model ? p->draft_model->m : NULL;
    const size_t mib = (size_t)1 << 20;
    /* A draft model's file and tables count like the model's. */
    const size_t weights = m->file->size + (dm ? dm->file->size : 0);
    const size_t tables =
        ((size_t)m->n_vocab + (dm ? (size_t)dm->n_vocab : 0)) * PROC_TABLE_BYTES_PER_TOKEN;
    const bool spec = dm || p->lookup_ngram > 0;
    const int32_t chunk = p->max_batch_tokens + (spec ? p->draft_max + 1 : 0);
    const size_t driver = device_driver_bytes(p->device);
    const size_t runtime =
        PROC_RUNTIME_BYTES + driver +
        (size_t)p->n_threads * (PROC_THREAD_BYTES + sampler_scratch_bytes(m->n_vocab, p->max_ctx));
    const size_t per_seq = (size_t)m->n_vocab * PROC_REQUEST_BYTES_PER_TOKEN +
                           (size_t)p->max_ctx * PROC_SEQ_BYTES_PER_POS;
    const size_t fixed =
        weights + tables + runtime + (size_t)p->max_seqs * per_seq + act_bytes + img_bytes;
    /* Every sequence decoding, one taking a whole chunk (windowed layers
     * hold the chunk on top of their window). */
    const size_t seq_kv = kv_cache_bytes(m, p->kv_type, p->max_ctx, 1, 1);
    const size_t kv_need =
        kv_cache_bytes(m, p->kv_type, p->max_ctx, p->max_seqs, chunk) + spec_draft_kv_bytes(p);
    const size_t budget = p->process_budget_bytes;
    if (fixed >= budget || kv_need > budget - fixed) {
        /* How many sequences of max_ctx would fit, each with its own
         * request memory. */
        size_t base = fixed - (size_t)p->max_seqs * per_seq +
                      (kv_need - (size_t)p->max_seqs * seq_kv); /* + the one chunk */
        size_t fit = base < budget ? (budget - base) / (per_seq + seq_kv) : 0;
        return err_set(
            err, CELLM_ERR_NO_MEMORY,
            "a process budget of %zu MiB cannot hold %d sequences of %d positions: model "
            "file%s %zu MiB, its tables %zu MiB, code, threads, samplers and GPU driver %zu MiB, "
            "%d "
            "requests' tokens %zu MiB, activations %zu MiB (steps of %d rows), pictures %zu "
            "MiB, KV cache "
            "%zu MiB (%zu MiB a sequence); %zu sequence%s of %d positions would fit: lower "
            "the context or the sessions, or raise the budget%s",
            budget / mib, p->max_seqs, p->max_ctx, dm ? "s (and the draft's)" : "", weights / mib,
            tables / mib, runtime / mib, p->max_seqs, (size_t)p->max_seqs * per_seq / mib,
            act_bytes / mib, (int)p->max_batch_tokens, img_bytes / mib, kv_need / mib, seq_kv / mib,
            fit, fit == 1 ? "" : "s", p->max_ctx,
            driver ? " (the GPU driver's share: the CPU device, CELLM_DEVICE_CPU, loads none)"
                   : "");
    }
    /* What the engine's own budget covers: activations, pictures, KV. */
    p->mem_budget_bytes = budget - (fixed - act_bytes - img_bytes);
    return CELLM_OK;
}

/* Frees what engine_create made, in reverse; the thread is not running. */
/* The samplers' scratch, one for each of the pool's threads. */
static cellm_status scratch_create(cellm_engine *e, cellm_error *err) {
    const int n = e->p.n_threads;
    if (!(e->smp_scr = calloc((size_t)n, sizeof *e->smp_scr)))
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    for (int i = 0; i < n; i++) {
        cellm_status st =
            sampler_scratch_create(e->model->m->n_vocab, e->p.max_ctx, &e->smp_scr[i], err);
        if (st) return st;
    }
    return CELLM_OK;
}

static void engine_destroy(cellm_engine *e) {
    for (int i = 0; e->smp_scr && i < e->p.n_threads; i++) sampler_scratch_free(e->smp_scr[i]);
    free(e->smp_scr);
    spec_destroy(e);
    backend_free(&e->fwd);
    tp_destroy(e->tp);
    sched_free(&e->sched);
    free(e->embd_rows);
    kv_cache_free(e->kv);
    free(e);
}

cellm_status cellm_engine_create(const cellm_model *cm, const cellm_engine_params *params,
                                 cellm_engine **out) {
    if (!out) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_engine_create: out is NULL");
    *out = NULL;
    if (!cm) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_engine_create: model is NULL");
    cellm_error err;
    err_clear(&err);
    cellm_engine_params p = params ? *params : cellm_engine_default_params();
    const model *m = cm->m;
    if (p.n_threads < 0 || p.n_threads > 256)
        return fail_msg(CELLM_ERR_INVALID_ARG, "n_threads must be 0..256");
    if (p.n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        p.n_threads = n < 1 ? 1 : n > 4 ? 4 : (int)n;
    }
    if (p.max_batch_tokens < 1 || p.max_batch_tokens > 65536)
        return fail_msg(CELLM_ERR_INVALID_ARG, "max_batch_tokens must be 1..65536");
    if (p.max_seqs < 1 || p.max_seqs > 4096)
        return fail_msg(CELLM_ERR_INVALID_ARG, "max_seqs must be 1..4096");
    if (p.max_ctx < 0 || p.max_ctx > (1 << 24))
        return fail_msg(CELLM_ERR_INVALID_ARG, "max_ctx must be 0..16777216");
    if (p.max_ctx == 0)
        p.max_ctx = m->n_ctx_train > 0 && m->n_ctx_train < 4096 ? m->n_ctx_train : 4096;
    if (kv_type_check(m, p.kv_type, &err)) return fail(&err);
    if (!device_name(p.device))
        return fail_msg(CELLM_ERR_INVALID_ARG, "device must be CELLM_DEVICE_AUTO, _CPU or _VULKAN");
    if (p.gpu_layers < 0)
        return fail_msg(CELLM_ERR_INVALID_ARG, "gpu_layers must be 0 (every layer) or more");
    const char *bad_qos = qos_check(&p.qos, p.n_threads);
    if (bad_qos) return fail_msg(CELLM_ERR_INVALID_ARG, bad_qos);
    char spec_msg[CELLM_ERR_MSG_MAX];
    const char *bad_spec = spec_check(cm, &p, spec_msg, sizeof spec_msg);
    if (bad_spec) return fail_msg(CELLM_ERR_INVALID_ARG, bad_spec);
    /* With speculation a step feeds guesses after each pending token, and
     * takes back the rejected ones: windowed layers keep that many
     * positions more (kv_seq.slack), and the cache is sized for chunks
     * that much longer. */
    bool spec = p.draft_model || p.lookup_ngram > 0;
    int32_t slack = spec ? p.draft_max + 1 : 0;
    int32_t kv_chunk = p.max_batch_tokens + slack;

    cellm_engine *e = calloc(1, sizeof *e);
    if (!e) return fail_msg(CELLM_ERR_NO_MEMORY, "out of memory");
    e->model = cm;
    e->p = p;
    e->logit_rows = spec_logit_rows(&p);
    e->act_bytes = act_bytes_for(m, &p, e->logit_rows);
    /* Pictures' rows, for a model that takes them, come out of the budget
     * before the KV cache. */
    e->image_token = engine_image_token(cm);
    e->img_cap = e->image_token < 0     ? 0
                 : p.image_budget_bytes ? p.image_budget_bytes
                                        : DEFAULT_IMAGE_BUDGET;
    atomic_init(&e->img_held, 0);
    if (p.process_budget_bytes) {
        /* Under a cap, max_batch_tokens is the most a step takes: where
         * the sequences do not fit, steps of half as many rows (smaller
         * activations) are tried, down to PROC_MIN_BATCH or one step's
         * decode rows for every sequence. The output does not change (the
         * engine is batch-invariant); prompts are computed in smaller
         * chunks. */
        const int32_t asked = p.max_batch_tokens;
        const int64_t decode_rows = (int64_t)p.max_seqs * (1 + slack);
        const int32_t floor_rows = decode_rows > asked            ? asked
                                   : decode_rows > PROC_MIN_BATCH ? (int32_t)decode_rows
                                                                  : PROC_MIN_BATCH;
        while (process_budget_fit(cm, &p, e->act_bytes, e->img_cap, &err) != CELLM_OK) {
            if (p.max_batch_tokens <= floor_rows) {
                free(e);
                return fail(&err);
            }
            p.max_batch_tokens =
                p.max_batch_tokens / 2 > floor_rows ? p.max_batch_tokens / 2 : floor_rows;
            e->logit_rows = spec_logit_rows(&p);
            e->act_bytes = act_bytes_for(m, &p, e->logit_rows);
            err_clear(&err);
        }
        if (p.max_batch_tokens != asked)
            cellm_log(CELLM_LOG_INFO,
                      "memory cap: steps of up to %d rows, not %d, so that %d sequences of %d "
                      "positions fit in %zu MiB",
                      p.max_batch_tokens, asked, p.max_seqs, p.max_ctx,
                      p.process_budget_bytes >> 20);
        kv_chunk = p.max_batch_tokens + slack;
        e->p.max_batch_tokens = p.max_batch_tokens;
    }
    if (p.mem_budget_bytes <= e->act_bytes || p.mem_budget_bytes - e->act_bytes <= e->img_cap) {
        err_set(&err, CELLM_ERR_NO_MEMORY,
                "a memory budget of %zu bytes does not cover the %zu bytes of activations for "
                "batches of %d tokens%s and a KV cache; raise it or lower max_batch_tokens / "
                "max_seqs%s",
                p.mem_budget_bytes, e->act_bytes, p.max_batch_tokens,
                e->img_cap ? ", the room kept for pictures (image_budget_bytes)" : "",
                e->img_cap ? " / image_budget_bytes" : "");
        free(e);
        return fail(&err);
    }
    /* A draft model's pool gets its share of the KV budget in proportion
     * to what max_seqs sequences need in each. */
    size_t kv_budget = p.mem_budget_bytes - e->act_bytes - e->img_cap, draft_kv = 0;
    if (p.draft_model) {
        double need = (double)kv_cache_bytes(m, p.kv_type, p.max_ctx, p.max_seqs, kv_chunk);
        double dneed = (double)spec_draft_kv_bytes(&p);
        draft_kv = (size_t)((double)kv_budget * (dneed / (need + dneed)));
        kv_budget -= draft_kv;
    }
    const char *top_env = getenv("CELLM_TOP");
    e->top_off = top_env && !strcmp(top_env, "0");
    if (kv_cache_create(m, kv_budget, p.max_ctx, p.max_seqs, kv_chunk, p.kv_type, &e->kv, &err) ||
        tp_create(p.n_threads, &e->tp, &err) || scratch_create(e, &err) ||
        device_backend(p.device, p.gpu_layers, m, e->kv, e->tp, p.max_batch_tokens, e->logit_rows,
                       &e->fwd, &err) ||
        kv_calibrate(e->kv, m, cm->tok, &e->fwd, p.max_batch_tokens, &err) ||
        spec_create(e, draft_kv, &err)) {
        engine_destroy(e);
        return fail(&err);
    }
    e->kv->seq_slack = slack;
    kv_cache_set_prefix(e->kv, p.prefix_cache != 0);
    sched_limits lim = {p.max_seqs, p.max_batch_tokens, e->logit_rows};
    sched_hooks hooks = {e, hook_finish, hook_preempted, hook_reclaim, hook_adopt, hook_unadopt};
    e->embd_rows = malloc((size_t)p.max_batch_tokens * sizeof *e->embd_rows);
    if (!e->embd_rows) err_set(&err, CELLM_ERR_NO_MEMORY, "out of memory");
    if (!e->embd_rows || sched_init(&e->sched, e->kv, &lim, &hooks, &err)) {
        engine_destroy(e);
        return fail(&err);
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv_work, NULL);
    pthread_cond_init(&e->cv_done, NULL);
    atomic_init(&e->failed, false);
    e->qos = e->qos_now = p.qos;
    tp_set_threads(e->tp, p.qos.n_threads > 0 ? p.qos.n_threads : p.n_threads);
    e->stats.bytes_activations = e->act_bytes;
    e->stats.bytes_images_total = e->img_cap;
    for (int32_t g = 0; g < e->kv->n_groups; g++)
        e->stats.bytes_kv_total += (size_t)e->kv->groups[g].n_blocks * e->kv->groups[g].block_bytes;
    for (int32_t g = 0; e->dkv && g < e->dkv->n_groups; g++)
        e->stats.bytes_kv_total +=
            (size_t)e->dkv->groups[g].n_blocks * e->dkv->groups[g].block_bytes;
    publish_locked(e); /* no other thread yet */
    e->manual = p.manual_steps != 0;
    pthread_mutex_init(&e->step_mu, NULL);
    if (!e->manual && pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        pthread_mutex_destroy(&e->step_mu);
        pthread_cond_destroy(&e->cv_done);
        pthread_cond_destroy(&e->cv_work);
        pthread_mutex_destroy(&e->mu);
        engine_destroy(e);
        return fail_msg(CELLM_ERR_INTERNAL, "cannot start the engine thread");
    }
    *out = e;
    return CELLM_OK;
}

void cellm_engine_free(cellm_engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    e->events++;
    pthread_cond_signal(&e->cv_work);
    pthread_mutex_unlock(&e->mu);
    if (e->manual) {
        /* This thread does what the engine thread does on the way out:
         * finish every request as cancelled, give sessions' blocks back. */
        (void)manual_step(e, NULL);
    } else {
        pthread_join(e->thread, NULL);
    }
    pthread_mutex_destroy(&e->step_mu);
    pthread_cond_destroy(&e->cv_done);
    pthread_cond_destroy(&e->cv_work);
    pthread_mutex_destroy(&e->mu);
    engine_destroy(e);
}

cellm_status cellm_engine_stats(cellm_engine *e, cellm_stats *out) {
    if (!e || !out) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_engine_stats: a NULL argument");
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    out->n_waiting += e->n_incoming;
    pthread_mutex_unlock(&e->mu);
    out->bytes_images_in_use = atomic_load(&e->img_held);
    out->bytes_in_use += out->bytes_images_in_use;
    return CELLM_OK;
}

cellm_status cellm_engine_set_qos(cellm_engine *e, const cellm_qos *qos) {
    if (!e || !qos) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_engine_set_qos: a NULL argument");
    const char *bad = qos_check(qos, e->p.n_threads);
    if (bad) return fail_msg(CELLM_ERR_INVALID_ARG, bad);
    pthread_mutex_lock(&e->mu);
    e->qos = *qos;
    e->events++;
    pthread_cond_signal(&e->cv_work);
    pthread_mutex_unlock(&e->mu);
    return CELLM_OK;
}

cellm_status cellm_engine_get_qos(cellm_engine *e, cellm_qos *out) {
    if (!e || !out) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_engine_get_qos: a NULL argument");
    pthread_mutex_lock(&e->mu);
    *out = e->qos;
    pthread_mutex_unlock(&e->mu);
    return CELLM_OK;
}

cellm_status cellm_engine_trim(cellm_engine *e, cellm_trim_level level, size_t *released) {
    if (released) *released = 0;
    if (!e) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_engine_trim: engine is NULL");
    if (level < CELLM_TRIM_LIGHT || level > CELLM_TRIM_CRITICAL)
        return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_engine_trim: the level must be 1..3");
    pthread_mutex_lock(&e->mu);
    if (e->trim_level < (int)level) e->trim_level = (int)level;
    uint64_t ticket = ++e->trim_asked;
    e->events++;
    pthread_cond_signal(&e->cv_work);
    if (!engine_on_thread(e)) {
        while (e->trim_done < ticket && !e->stop) engine_wait_locked(e);
        if (released && e->trim_done >= ticket) *released = e->trim_released;
    }
    pthread_mutex_unlock(&e->mu);
    return CELLM_OK;
}

const char *cellm_engine_error(const cellm_engine *e) {
    if (!e) return "";
    return atomic_load_explicit(&e->failed, memory_order_acquire) ? e->error : "";
}

/* ---------------------------------------------------------------- requests */

cellm_request_params cellm_request_default_params(void) {
    cellm_request_params p;
    memset(&p, 0, sizeof p);
    sampler_params sp = sampler_default_params();
    p.sampling.temperature = sp.temperature;
    p.sampling.top_k = sp.top_k;
    p.sampling.top_p = sp.top_p;
    p.sampling.min_p = sp.min_p;
    p.sampling.seed = sp.seed;
    p.sampling.typical_p = sp.typical_p;
    p.sampling.repeat_penalty = sp.repeat_penalty;
    p.sampling.repeat_last_n = sp.penalty_last_n;
    p.sampling.presence_penalty = sp.presence_penalty;
    p.sampling.frequency_penalty = sp.frequency_penalty;
    p.sampling.ngram_guard = sp.ngram_size;
    p.sampling.ngram_guard_repeats = sp.ngram_max_repeats;
    p.max_tokens = 256;
    return p;
}

/* The prompt's token ids into *ids, from whichever input the params have. */
static cellm_status request_input(const cellm_engine *e, const cellm_request_params *p,
                                  tok_ids *ids, cellm_error *err) {
    const cellm_model *cm = e->model;
    int n_inputs = (p->prompt != NULL) + (p->messages != NULL) + (p->tokens != NULL) +
                   (p->messages_json != NULL);
    if (n_inputs != 1)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "a request needs exactly one of prompt, messages, messages_json and tokens "
                       "(it has %d)",
                       n_inputs);
    if (p->tools_json && !p->messages && !p->messages_json)
        return err_set(err, CELLM_ERR_INVALID_ARG, "tools_json needs messages or messages_json");
    unsigned flags = TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL;
    if (p->prompt) return tokenizer_encode(cm->tok, p->prompt, strlen(p->prompt), flags, ids, err);
    if ((p->messages || p->messages_json) && !cm->has_chat)
        return err_set(err, CELLM_ERR_UNSUPPORTED, "%s", cm->chat_err);
    if (p->messages_json && p->n_images > 0)
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "images go with messages, prompt or tokens, not with messages_json");
    if (p->messages_json)
        return chat_encode_json(&cm->chat, cm->tok, p->messages_json, p->tools_json, true, ids,
                                err);
    if (p->messages && (p->n_messages < 1 || p->n_messages > 65536))
        return err_set(err, CELLM_ERR_INVALID_ARG, "n_messages must be 1..65536");
    if (p->messages && p->tools_json && p->n_images > 0)
        return err_set(err, CELLM_ERR_UNSUPPORTED, "images and tools_json do not go together yet");
    if (p->messages && p->tools_json) {
        json_buf b = {0};
        json_buf_str(&b, "[");
        for (int32_t i = 0; i < p->n_messages; i++) {
            const cellm_chat_message *m = &p->messages[i];
            if (!m->role || !m->content) {
                free(b.s);
                return err_set(err, CELLM_ERR_INVALID_ARG, "message %d has no role or content", i);
            }
            json_buf_str(&b, i ? ",{\"role\":" : "{\"role\":");
            json_buf_quote(&b, m->role, strlen(m->role));
            json_buf_str(&b, ",\"content\":");
            json_buf_quote(&b, m->content, strlen(m->content));
            json_buf_str(&b, "}");
        }
        json_buf_str(&b, "]");
        cellm_status st =
            b.full ? err_set(err, CELLM_ERR_NO_MEMORY, "out of memory")
                   : chat_encode_json(&cm->chat, cm->tok, b.s, p->tools_json, true, ids, err);
        free(b.s);
        return st;
    }
    if (p->messages) {
        chat_msg *msgs = malloc((size_t)p->n_messages * sizeof *msgs);
        if (!msgs) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        for (int32_t i = 0; i < p->n_messages; i++) {
            if (!p->messages[i].role || !p->messages[i].content) {
                free(msgs);
                return err_set(err, CELLM_ERR_INVALID_ARG, "message %d has no role or content", i);
            }
            msgs[i] = (chat_msg){p->messages[i].role, p->messages[i].content};
        }
        cellm_status st =
            p->n_images > 0 ? engine_image_chat(e, p, msgs, ids, err)
                            : chat_encode(&cm->chat, cm->tok, msgs, p->n_messages, true, ids, err);
        free(msgs);
        return st;
    }
    if (p->n_tokens < 1) return err_set(err, CELLM_ERR_INVALID_ARG, "n_tokens must be >= 1");
    ids->ids = malloc((size_t)p->n_tokens * sizeof(int32_t));
    if (!ids->ids) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    ids->cap = ids->n = (size_t)p->n_tokens;
    for (int32_t i = 0; i < p->n_tokens; i++) {
        if (p->tokens[i] < 0 || p->tokens[i] >= cm->m->n_vocab)
            return err_set(err, CELLM_ERR_INVALID_ARG, "token %d (at %d) is not in 0..%d",
                           p->tokens[i], i, cm->m->n_vocab - 1);
        ids->ids[i] = p->tokens[i];
    }
    return CELLM_OK;
}

/* The checks of the sampling and stop parameters that name the public
 * fields (the sampler checks the rest). */
static cellm_status check_params(const cellm_request_params *p, cellm_error *err) {
    const cellm_sampling *s = &p->sampling;
    if (isnan(s->temperature) || isnan(s->top_p) || isnan(s->min_p) || isnan(s->typical_p))
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "temperature, top_p, min_p and typical_p must be numbers");
    if (s->min_p > 1) return err_set(err, CELLM_ERR_INVALID_ARG, "min_p must be at most 1");
    if (!isfinite(s->repeat_penalty) || s->repeat_penalty <= 0)
        return err_set(err, CELLM_ERR_INVALID_ARG, "repeat_penalty must be a positive number");
    if (!isfinite(s->presence_penalty) || !isfinite(s->frequency_penalty))
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "presence_penalty and frequency_penalty must be finite numbers");
    if (s->repeat_last_n < -1)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "repeat_last_n must be -1 (the whole context), 0 or a window length");
    if (s->n_logit_bias < 0 || s->n_logit_bias > CELLM_MAX_LOGIT_BIAS ||
        (s->n_logit_bias > 0 && !s->logit_bias))
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "n_logit_bias must be 0..%d, with logit_bias when not 0",
                       CELLM_MAX_LOGIT_BIAS);
    if (s->ngram_guard < 0 || s->ngram_guard > 64 ||
        (s->ngram_guard > 0 && s->ngram_guard_repeats < 1))
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "ngram_guard must be 0..64 and ngram_guard_repeats at least 1");
    if (s->ngram_guard > 0 && s->repeat_last_n >= 0 && s->repeat_last_n < s->ngram_guard)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "the n-gram guard of %d tokens needs repeat_last_n of at least %d",
                       (int)s->ngram_guard, (int)s->ngram_guard);
    if (p->n_stop_tokens < 0 || p->n_stop_tokens > REQ_MAX_STOP ||
        (p->n_stop_tokens && !p->stop_tokens))
        return err_set(err, CELLM_ERR_INVALID_ARG, "n_stop_tokens must be 0..%d, with stop_tokens",
                       REQ_MAX_STOP);
    if (p->top_logprobs < 0 || p->top_logprobs > CELLM_MAX_TOP_LOGPROBS)
        return err_set(err, CELLM_ERR_INVALID_ARG, "top_logprobs must be 0..%d",
                       CELLM_MAX_TOP_LOGPROBS);
    if ((p->logprobs || p->prompt_logprobs) && !p->on_logprob)
        return err_set(err, CELLM_ERR_INVALID_ARG,
                       "logprobs and prompt_logprobs need the on_logprob callback");
    if (p->n_stop < 0 || p->n_stop > CELLM_MAX_STOP_STRINGS || (p->n_stop && !p->stop))
        return err_set(err, CELLM_ERR_INVALID_ARG, "n_stop must be 0..%d, with stop",
                       CELLM_MAX_STOP_STRINGS);
    for (int32_t i = 0; i < p->n_stop; i++) {
        size_t n = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (n < 1 || n > CELLM_MAX_STOP_LEN)
            return err_set(err, CELLM_ERR_INVALID_ARG,
                           "stop string %d has %zu bytes; it must have 1..%d", (int)i, n,
                           CELLM_MAX_STOP_LEN);
    }
    return CELLM_OK;
}

cellm_status engine_check_sampling(const cellm_sampling *sampling) {
    cellm_request_params p = cellm_request_default_params();
    p.sampling = *sampling;
    cellm_error err;
    err_clear(&err);
    return check_params(&p, &err) ? fail(&err) : CELLM_OK;
}

/* The request's sampler, with the last tokens of its prompt in the
 * penalty window. */
static cellm_status request_sampler(cellm_engine *e, cellm_request *r, const cellm_sampling *s,
                                    cellm_error *err) {
    sampler_params sp = sampler_default_params();
    sp.temperature = s->temperature;
    sp.top_k = s->top_k;
    sp.top_p = s->top_p;
    sp.min_p = s->min_p;
    sp.seed = s->seed;
    sp.typical_p = s->typical_p;
    sp.repeat_penalty = s->repeat_penalty;
    int32_t max_ctx = e->kv->max_ctx;
    sp.penalty_last_n =
        s->repeat_last_n < 0 || s->repeat_last_n > max_ctx ? max_ctx : s->repeat_last_n;
    sp.presence_penalty = s->presence_penalty;
    sp.frequency_penalty = s->frequency_penalty;
    sp.ngram_size = s->ngram_guard;
    sp.ngram_max_repeats = s->ngram_guard_repeats;
    /* Same layout: the sampler copies the array. */
    _Static_assert(sizeof(cellm_logit_bias) == sizeof(sampler_logit_bias), "logit bias layout");
    sp.logit_bias = (const sampler_logit_bias *)s->logit_bias;
    sp.n_logit_bias = s->n_logit_bias;
    cellm_status st = sampler_create_shared(&sp, e->model->m->n_vocab, &r->smp, err);
    if (st) return st;
    int32_t from = r->n_prompt > sp.penalty_last_n ? r->n_prompt - sp.penalty_last_n : 0;
    for (int32_t i = from; i < r->n_prompt && st == CELLM_OK; i++)
        st = sampler_accept(r->smp, engine_real_token(r, i), err);
    return st;
}

/* Frees a request the engine never saw. */
static void request_discard(cellm_engine *e, cellm_request *r) {
    if (r->seq.table[0]) kv_seq_free(e->kv, &r->seq);
    request_release(r);
}

cellm_status cellm_submit(cellm_engine *e, const cellm_request_params *p, cellm_request **out) {
    if (!out) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_submit: out is NULL");
    *out = NULL;
    if (!e || !p) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_submit: a NULL argument");
    return engine_submit(e, p, NULL, out);
}

cellm_status engine_submit(cellm_engine *e, const cellm_request_params *p, cellm_session *session,
                           cellm_request **out) {
    cellm_error err;
    err_clear(&err);
    const cellm_model *cm = e->model;
    if (check_params(p, &err)) return fail(&err);
    if (session && p->prompt_logprobs)
        return fail_msg(CELLM_ERR_INVALID_ARG,
                        "prompt_logprobs is not available for a session's turn");
    if (session && p->n_images)
        return fail_msg(CELLM_ERR_INVALID_ARG, "images are not available for a session's turn");
    tok_ids ids = {0};
    if (request_input(e, p, &ids, &err)) {
        tok_ids_free(&ids);
        return fail(&err);
    }
    int32_t max_ctx = e->kv->max_ctx;
    if (ids.n == 0 || ids.n > (size_t)max_ctx) {
        err_set(&err, CELLM_ERR_INVALID_ARG, "the prompt has %zu tokens; it must have 1..%d", ids.n,
                max_ctx);
        tok_ids_free(&ids);
        return fail(&err);
    }
    cellm_request *r = calloc(1, sizeof *r);
    if (!r) {
        tok_ids_free(&ids);
        return fail_msg(CELLM_ERR_NO_MEMORY, "out of memory");
    }
    r->e = e;
    r->stop_token = r->stop_index = -1;
    r->n_prompt = r->sched.n_tokens = (int32_t)ids.n;
    /* Room for the whole completion, so the engine never grows it. */
    int64_t cap = p->max_tokens < 0 ? max_ctx : (int64_t)r->n_prompt + p->max_tokens;
    r->cap = (int32_t)(cap > max_ctx ? max_ctx : cap);
    if (r->cap < r->n_prompt + 1) r->cap = r->n_prompt + 1; /* one token even at max_ctx */
    r->tokens = malloc((size_t)r->cap * sizeof(int32_t));
    r->piece_cap = tok_stream_bound(cm->tok) + 1;
    r->piece = malloc(r->piece_cap);
    if (session) {
        /* Every token's text and the final flush, so the reply is kept
         * whole without growing the buffer on the engine thread. */
        r->reply_cap = ((size_t)(r->cap - r->n_prompt) + 1) * r->piece_cap + 1;
        r->reply = malloc(r->reply_cap);
        if (r->reply) r->reply[0] = '\0';
    }
    if (!r->tokens || !r->piece || (session && !r->reply)) {
        tok_ids_free(&ids);
        request_discard(e, r);
        return fail_msg(CELLM_ERR_NO_MEMORY, "out of memory");
    }
    memcpy(r->tokens, ids.ids, ids.n * sizeof(int32_t));
    tok_ids_free(&ids);
    if (engine_image_attach(e, r, p, &err)) {
        request_discard(e, r);
        return fail(&err);
    }
    /* The whole prompt must fit an empty cache. */
    for (int32_t g = 0; g < e->kv->n_groups; g++) {
        const kv_group *kg = &e->kv->groups[g];
        int32_t pos = r->n_prompt;
        if (kg->window > 0 && pos > kg->window + KV_BLOCK_TOKENS + e->p.max_batch_tokens)
            pos = kg->window + KV_BLOCK_TOKENS + e->p.max_batch_tokens;
        if ((pos + KV_BLOCK_TOKENS - 1) / KV_BLOCK_TOKENS > kg->n_blocks) {
            err_set(&err, CELLM_ERR_NO_MEMORY,
                    "the prompt (%d tokens) needs more KV blocks than the engine's budget holds "
                    "(%d blocks of %d tokens)",
                    r->n_prompt, kg->n_blocks, KV_BLOCK_TOKENS);
            request_discard(e, r);
            return fail(&err);
        }
    }
    r->max_tokens = p->max_tokens;
    r->sched.priority = p->priority;
    r->on_piece = p->on_piece;
    r->on_done = p->on_done;
    r->user = p->user;
    r->lp_gen = p->logprobs != 0;
    r->lp_prompt = p->prompt_logprobs != 0;
    r->lp_top = p->top_logprobs;
    r->on_logprob = p->on_logprob;
    r->stop[r->n_stop++] = tokenizer_eos(cm->tok);
    for (int32_t i = 0; i < p->n_stop_tokens; i++) r->stop[r->n_stop++] = p->stop_tokens[i];
    if (p->messages || p->messages_json)
        for (int i = 0; i < CHAT_MAX_STOP; i++)
            if (cm->chat.stop[i] >= 0) r->stop[r->n_stop++] = cm->chat.stop[i];
    if (p->n_stop > 0 && (stop_create(p->stop, (size_t)p->n_stop, &r->stops, &err) ||
                          stop_reserve(r->stops, r->piece_cap, &err))) {
        request_discard(e, r);
        return fail(&err);
    }
    if (request_sampler(e, r, &p->sampling, &err) || kv_seq_init(e->kv, &r->seq, &err) ||
        (p->grammar && engine_grammar_attach(e, r, p->grammar, &err))) {
        request_discard(e, r);
        return fail(&err);
    }
    /* The resample rule: for a sampled request without a grammar, room
     * for the distribution of each guess. */
    const cellm_sampling *sm = &p->sampling;
    if (e->spec_on && e->p.spec_accept == CELLM_SPEC_ACCEPT_RESAMPLE && sm->temperature > 0 &&
        sm->top_k != 1 && !p->grammar &&
        !(r->spec_q = malloc((size_t)e->p.draft_max * sizeof *r->spec_q))) {
        request_discard(e, r);
        return fail_msg(CELLM_ERR_NO_MEMORY, "out of memory for the request's guesses");
    }
    r->top_ok = sampler_top_ok(r->smp, FWD_TOP_K) && !r->lp_gen && !r->lp_prompt && !r->gst &&
                !r->spec_q && r->max_tokens != 0;
    r->seq.tokens = r->tokens; /* its full blocks go into the prefix cache */
    r->sched.seq = &r->seq;
    r->sched.tokens = r->tokens;
    r->sched.lp_end = r->lp_prompt ? r->n_prompt : 0;
    r->seq.n_keep = r->n_prompt;
    tok_stream_init(&r->ts, cm->tok, 0);
    r->refs = 2;
    r->t_submit = engine_now_s();

    pthread_mutex_lock(&e->mu);
    if (e->stop) {
        pthread_mutex_unlock(&e->mu);
        request_discard(e, r);
        return fail_msg(CELLM_ERR_INVALID_ARG, "the engine is shutting down");
    }
    if (session) {
        if (session->turn) {
            pthread_mutex_unlock(&e->mu);
            request_discard(e, r);
            return fail_msg(CELLM_ERR_INVALID_ARG, "the session's previous turn has not finished");
        }
        session->turn = r;
        r->session = session;
    }
    r->sched.arrival = e->next_arrival++;
    r->next = e->incoming;
    e->incoming = r;
    e->n_incoming++;
    pthread_cond_signal(&e->cv_work);
    pthread_mutex_unlock(&e->mu);
    *out = r;
    return CELLM_OK;
}

cellm_status cellm_cancel(cellm_request *r) {
    if (!r) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_cancel: request is NULL");
    cellm_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    if (!r->done) {
        r->cancel = true;
        e->events++;
        pthread_cond_signal(&e->cv_work);
    }
    pthread_mutex_unlock(&e->mu);
    return CELLM_OK;
}

cellm_status cellm_wait(cellm_request *r, cellm_result *result) {
    if (!r) return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_wait: request is NULL");
    cellm_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    if (!r->done && engine_on_thread(e)) {
        pthread_mutex_unlock(&e->mu);
        return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_wait called from a callback would deadlock");
    }
    while (!r->done) engine_wait_locked(e);
    if (result) *result = r->result;
    pthread_mutex_unlock(&e->mu);
    return CELLM_OK;
}

cellm_status cellm_request_tokens(cellm_request *r, const int32_t **ids, int32_t *n) {
    if (!r || !ids || !n)
        return fail_msg(CELLM_ERR_INVALID_ARG, "cellm_request_tokens: a NULL argument");
    *ids = r->tokens + r->n_prompt;
    *n = r->sched.n_tokens - r->n_prompt;
    return CELLM_OK;
}

const char *cellm_request_error(const cellm_request *r) {
    return r ? r->err : "";
}

void cellm_request_free(cellm_request *r) {
    if (!r) return;
    cellm_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    if (!r->done) {
        r->cancel = true;
        e->events++;
        pthread_cond_signal(&e->cv_work);
        if (engine_on_thread(e)) {
            /* From a callback: the engine finishes it later and frees it
             * then; no callback of it runs again. */
            r->detached = true;
            r->refs--;
            pthread_mutex_unlock(&e->mu);
            return;
        }
        while (!r->done) engine_wait_locked(e);
    }
    bool last = --r->refs == 0;
    pthread_mutex_unlock(&e->mu);
    if (last) request_release(r);
}

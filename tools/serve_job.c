/*
 * serve_job.c — a completion request of `cellm serve` at work: a job holds
 * one engine request per choice (n per prompt), each with its text, and
 * turns their output into OpenAI's reply, whole or streamed as server-sent
 * events. Stop strings, penalties and logit bias are the engine's.
 *
 * The engine thread's callbacks only append text to their choice under the
 * job's lock and wake the connection's thread, which formats the JSON. That
 * thread waits for the job in short slices, checking between them whether
 * the client has gone (a zero-byte peek at the socket) or the request's
 * time is up; either cancels every request of the job, which frees their KV
 * blocks at the engine's next step.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "serve.h"

#define WAIT_SLICE_MS 100

typedef struct job job;

/* One token's log-probability, as the engine reported it. */
typedef struct lp_entry {
    int32_t token;
    float logprob; /* NAN: the first prompt token */
    int32_t n_top;
    cellm_top_logprob top[CELLM_MAX_TOP_LOGPROBS];
} lp_entry;

typedef struct choice {
    job *j;
    int index;  /* in the reply */
    int prompt; /* which prompt of the request */
    cellm_request *req;
    char *text; /* the whole text (whole reply) or what is not yet sent (stream) */
    size_t len, cap;
    bool done, role_sent, final_sent;
    bool called; /* the reply was tool calls */
    size_t sent; /* with tools, streaming: bytes of text sent (text is kept whole) */
    cellm_result res;
    lp_entry *lp; /* with logprobs: every token's, in order; lp_sent of them streamed */
    int n_lp, cap_lp, lp_sent;
    size_t lp_off; /* completions: text_offset of the next token */
} choice;

struct job {
    server *s;
    struct MHD_Connection *conn;
    serve_req rq;
    pthread_mutex_t mu; /* guards the choices' text and flags, and the stream state */
    pthread_cond_t cv;  /* a callback added text or finished a choice */
    choice *ch;
    int n_ch, n_submitted, n_done;
    int fd;
    double deadline; /* monotonic seconds; 0: none */
    char id[40];
    long created;
    bool oom, timed_out;
    bool tools; /* the model may call tools: replies are parsed for calls */
    cellm_logit_bias bias[SERVE_MAX_BIAS]; /* the request's logit_bias, as the engine takes it */
    char **echo; /* completions with echo: each prompt's text (token prompts decoded) */
    size_t *echo_len;
    bool echo_drop_bos; /* the model puts a BOS before a text prompt: echo leaves it out */
    /* streaming */
    char *out; /* SSE bytes not yet handed to libmicrohttpd */
    size_t out_len, out_off, out_cap;
    bool ended; /* [DONE] is in `out` */
    double last_send;
};

/* ------------------------------------------------------------ callbacks */

/* Engine thread, j->mu held. */
static void choice_append(choice *c, const char *s, size_t n) {
    if (!n) return;
    if (!serve_grow(&c->text, &c->cap, c->len + n + 1)) {
        c->j->oom = true;
        return;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = '\0';
}

static void on_piece(const char *piece, size_t len, void *user) {
    choice *c = user;
    job *j = c->j;
    pthread_mutex_lock(&j->mu);
    choice_append(c, piece, len);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void on_logprob(const cellm_token_logprob *lp, void *user) {
    choice *c = user;
    job *j = c->j;
    /* The BOS the model adds before a text prompt is not in its text: the
     * echoed tokens are the text's own (as lm-eval counts them), the first
     * with its log-probability after the BOS. */
    if (lp->is_prompt && lp->pos == 0 && j->echo_drop_bos && j->rq.prompts[c->prompt].text) return;
    pthread_mutex_lock(&j->mu);
    if (c->n_lp == c->cap_lp) {
        int cap = c->cap_lp ? c->cap_lp * 2 : 64;
        lp_entry *v = realloc(c->lp, (size_t)cap * sizeof *v);
        if (!v) {
            j->oom = true;
            pthread_mutex_unlock(&j->mu);
            return;
        }
        c->lp = v;
        c->cap_lp = cap;
    }
    lp_entry *x = &c->lp[c->n_lp++];
    x->token = lp->token;
    x->logprob = lp->logprob;
    x->n_top = lp->n_top;
    memcpy(x->top, lp->top, (size_t)lp->n_top * sizeof x->top[0]);
    pthread_mutex_unlock(&j->mu);
}

static void on_done(const cellm_result *res, void *user) {
    choice *c = user;
    job *j = c->j;
    pthread_mutex_lock(&j->mu);
    c->res = *res;
    c->done = true;
    j->n_done++;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* ------------------------------------------------------------ jobs */

static void job_free(job *j) {
    if (!j) return;
    for (int i = 0; i < j->n_ch; i++) {
        cellm_request_free(j->ch[i].req); /* cancels and waits: no callback after */
        free(j->ch[i].text);
        free(j->ch[i].lp);
    }
    int n_prompts = j->rq.kind == SERVE_CHAT ? 1 : j->rq.n_prompts;
    for (int i = 0; j->echo && i < n_prompts; i++) free(j->echo[i]);
    free(j->echo);
    free(j->echo_len);
    atomic_fetch_sub_explicit(&j->s->c.in_flight, j->n_submitted, memory_order_relaxed);
    free(j->ch);
    free(j->out);
    serve_req_free(&j->rq);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* Cancels every request of the job. j->mu held. */
static void job_cancel(job *j) {
    for (int i = 0; i < j->n_ch; i++)
        if (j->ch[i].req && !j->ch[i].done) cellm_cancel(j->ch[i].req);
}

/* True when the client has closed its end (or the socket failed). */
static bool client_gone(int fd) {
    if (fd < 0) return false;
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0) return true;
    return r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

/* Waits up to one slice for a callback, then checks the client, the server
 * and the deadline. False when the client is gone or the server stops
 * (the job is then cancelled). j->mu held. */
static bool job_wait_slice(job *j, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    if (client_gone(j->fd) || atomic_load(&j->s->stopping)) {
        atomic_fetch_add_explicit(&j->s->c.disconnects, 1, memory_order_relaxed);
        job_cancel(j);
        return false;
    }
    if (j->deadline > 0 && serve_now() > j->deadline && !j->timed_out) {
        j->timed_out = true;
        atomic_fetch_add_explicit(&j->s->c.timeouts, 1, memory_order_relaxed);
        job_cancel(j);
    }
    return true;
}

/* Maps a cellm_submit failure to the client's error. */
static void submit_error(serve_kind kind, cellm_status st, serve_err *e) {
    const char *msg = cellm_last_error();
    const char *param = kind == SERVE_CHAT ? "messages" : "prompt";
    if (strstr(msg, "has 0 tokens"))
        serr(e, 400, "invalid_value", param, "the %s is empty", param);
    else if (strstr(msg, "prompt has") || strstr(msg, "KV blocks"))
        serr(e, 400, "context_length_exceeded", param, "%s", msg);
    else if (st == CELLM_ERR_NO_MEMORY && strstr(msg, "other requests' pictures"))
        serr(e, 503, "server_busy", NULL, "%s", msg); /* room again once one ends */
    else if (st == CELLM_ERR_NO_MEMORY && strstr(msg, "keeps for pictures"))
        serr(e, 400, "invalid_value", param, "%s", msg);
    else if (st == CELLM_ERR_INVALID_ARG || st == CELLM_ERR_UNSUPPORTED || st == CELLM_ERR_FORMAT)
        serr(e, 400, "invalid_value", param, "%s", msg);
    else
        serr(e, 500, NULL, NULL, "the engine refused the request: %s", msg);
}

/* Submits one engine request per choice. False with *e set. */
static bool job_submit(job *j, serve_err *e) {
    server *s = j->s;
    const serve_req *rq = &j->rq;
    for (int i = 0; i < j->n_ch; i++) {
        choice *c = &j->ch[i];
        cellm_request_params p = cellm_request_default_params();
        if (rq->kind == SERVE_CHAT && rq->messages_json) {
            p.messages_json = rq->messages_json;
            p.tools_json = rq->tools_json; /* also with tool_choice none: the same prefix */
            p.images = (const cellm_image_embed *const *)rq->images; /* the engine refuses them */
            p.n_images = rq->n_images;
        } else if (rq->kind == SERVE_CHAT) {
            p.messages = rq->messages;
            p.n_messages = rq->n_messages;
            p.images = (const cellm_image_embed *const *)rq->images;
            p.n_images = rq->n_images; /* copied by the engine */
        } else if (rq->prompts[c->prompt].text) {
            p.prompt = rq->prompts[c->prompt].text;
        } else {
            p.tokens = rq->prompts[c->prompt].tokens;
            p.n_tokens = rq->prompts[c->prompt].n_tokens;
        }
        p.sampling.temperature = rq->temperature;
        p.sampling.top_k = rq->top_k;
        p.sampling.top_p = rq->top_p;
        p.sampling.min_p = rq->min_p;
        p.sampling.typical_p = rq->typical_p;
        p.sampling.repeat_penalty = rq->repeat_penalty;
        p.sampling.repeat_last_n = rq->repeat_last_n;
        p.sampling.presence_penalty = rq->presence_penalty;
        p.sampling.frequency_penalty = rq->frequency_penalty;
        p.sampling.logit_bias = j->bias;
        p.sampling.n_logit_bias = rq->n_bias;
        p.stop = (const char *const *)rq->stop;
        p.n_stop = rq->n_stop;
        p.sampling.seed = rq->has_seed ? rq->seed + (uint64_t)c->index : serve_random(s);
        p.max_tokens = rq->max_tokens;
        p.grammar = rq->grammar;
        if (rq->logprobs) {
            p.logprobs = 1;
            p.top_logprobs = rq->top_logprobs;
            p.prompt_logprobs = rq->echo;
            p.on_logprob = on_logprob;
        }
        p.on_piece = on_piece;
        p.on_done = on_done;
        p.user = c;
        pthread_mutex_lock(&j->mu);
        cellm_status st = cellm_submit(s->engine, &p, &c->req);
        pthread_mutex_unlock(&j->mu);
        if (st != CELLM_OK) {
            submit_error(rq->kind, st, e);
            return false;
        }
        j->n_submitted++;
    }
    return true;
}

/* ------------------------------------------------------------ JSON */

static const char *finish_str(const choice *c) {
    if (c->called) return "tool_calls";
    switch (c->res.finish_reason) {
    case CELLM_FINISH_STOP: return "stop";
    case CELLM_FINISH_LENGTH: return "length";
    default: return "length"; /* cancelled: only by the deadline, which is reported */
    }
}

static cJSON *usage_json(const job *j) {
    long prompt = 0, completion = 0;
    for (int i = 0; i < j->n_ch; i++) {
        const choice *c = &j->ch[i];
        if (i % j->rq.n == 0) prompt += c->res.n_prompt_tokens; /* once per prompt */
        completion += c->res.n_completion_tokens;
    }
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)completion);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(prompt + completion));
    return u;
}

static cJSON *reply_base(const job *j, const char *object) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", j->id);
    cJSON_AddStringToObject(r, "object", object);
    cJSON_AddNumberToObject(r, "created", (double)j->created);
    cJSON_AddStringToObject(r, "model", j->s->model_id);
    char fp[48];
    snprintf(fp, sizeof fp, "cellm-%s", cellm_version());
    cJSON_AddStringToObject(r, "system_fingerprint", fp);
    return r;
}

/* The first error among the choices (engine failures), or NULL. */
static const choice *failed_choice(const job *j) {
    for (int i = 0; i < j->n_ch; i++)
        if (j->ch[i].res.finish_reason == CELLM_FINISH_ERROR) return &j->ch[i];
    return NULL;
}

static void count_finished(job *j) {
    serve_counters *k = &j->s->c;
    for (int i = 0; i < j->n_ch; i++) {
        const choice *c = &j->ch[i];
        atomic_fetch_add_explicit(&k->prompt_tokens, (unsigned long long)c->res.n_prompt_tokens,
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&k->completion_tokens,
                                  (unsigned long long)c->res.n_completion_tokens,
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&k->cached_tokens, (unsigned long long)c->res.n_cached_tokens,
                                  memory_order_relaxed);
        if (c->res.n_prompt_tokens > 0)
            atomic_fetch_add_explicit(c->res.n_cached_tokens > 0 ? &k->prefix_hits
                                                                 : &k->prefix_misses,
                                      1, memory_order_relaxed);
        atomic_ullong *n = c->res.finish_reason == CELLM_FINISH_STOP        ? &k->finished_stop
                           : c->res.finish_reason == CELLM_FINISH_LENGTH    ? &k->finished_length
                           : c->res.finish_reason == CELLM_FINISH_CANCELLED ? &k->cancelled
                                                                            : &k->errors;
        atomic_fetch_add_explicit(n, 1, memory_order_relaxed);
        /* Times in microseconds, summed for the Prometheus summaries. */
        atomic_fetch_add_explicit(&k->n_timed, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&k->queue_us, (unsigned long long)(c->res.queue_ms * 1e3),
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&k->total_us, (unsigned long long)(c->res.total_ms * 1e3),
                                  memory_order_relaxed);
        if (c->res.first_token_ms > 0) {
            atomic_fetch_add_explicit(&k->n_first, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&k->first_token_us,
                                      (unsigned long long)(c->res.first_token_ms * 1e3),
                                      memory_order_relaxed);
        }
    }
}

/* ------------------------------------------------------------ logprobs */

/* A log-probability as a JSON number, or null (the first prompt token). */
static void add_logprob(cJSON *o, const char *name, float lp) {
    if (isnan(lp))
        cJSON_AddNullToObject(o, name);
    else
        cJSON_AddNumberToObject(o, name, (double)lp);
}

/* The bytes of token `tok` (control tokens as their text) into a new
 * string, *n bytes; NULL when out of memory. */
static char *token_bytes(const job *j, int32_t tok, size_t *n) {
    char *t = NULL;
    *n = 0;
    if (cellm_detokenize(j->s->model, &tok, 1, 1, &t, n) != CELLM_OK) return NULL;
    return t;
}

/* {"token", "logprob", "bytes"} of chat's content[] and top_logprobs[]. */
static cJSON *chat_lp_item(const job *j, int32_t tok, float lp) {
    size_t n;
    char *t = token_bytes(j, tok, &n);
    cJSON *o = cJSON_CreateObject();
    serve_json_add_text(o, "token", t ? t : "", t ? n : 0);
    add_logprob(o, "logprob", lp);
    cJSON *b = cJSON_AddArrayToObject(o, "bytes");
    for (size_t i = 0; t && i < n; i++)
        cJSON_AddItemToArray(b, cJSON_CreateNumber((double)(unsigned char)t[i]));
    free(t);
    return o;
}

/* Chat's choices[].logprobs for entries v[0..n). */
static cJSON *chat_logprobs(const job *j, const lp_entry *v, int n) {
    cJSON *o = cJSON_CreateObject();
    cJSON *content = cJSON_AddArrayToObject(o, "content");
    for (int i = 0; i < n; i++) {
        cJSON *it = chat_lp_item(j, v[i].token, v[i].logprob);
        cJSON *top = cJSON_AddArrayToObject(it, "top_logprobs");
        for (int k = 0; k < v[i].n_top; k++)
            cJSON_AddItemToArray(top, chat_lp_item(j, v[i].top[k].token, v[i].top[k].logprob));
        cJSON_AddItemToArray(content, it);
    }
    cJSON_AddNullToObject(o, "refusal");
    return o;
}

/* The token's text for JSON (invalid UTF-8 as U+FFFD): a new string, or
 * NULL when out of memory; *n gets the token's length in bytes. */
static char *token_text(const job *j, int32_t tok, size_t *n) {
    char *t = token_bytes(j, tok, n);
    char *c = t ? serve_utf8_clean(t, *n) : NULL;
    free(t);
    return c;
}

/* The completions' (legacy) choices[].logprobs for entries v[0..n):
 * tokens, token_logprobs, top_logprobs (a dict of token text ->
 * logprob per token) and text_offset (bytes into the choice's text, from
 * *off, which moves past them). The first prompt token has null for its
 * logprob and its dict. */
static cJSON *legacy_logprobs(const job *j, const lp_entry *v, int n, size_t *off) {
    cJSON *o = cJSON_CreateObject();
    cJSON *toks = cJSON_AddArrayToObject(o, "tokens");
    cJSON *lps = cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON *offs = cJSON_AddArrayToObject(o, "text_offset");
    for (int i = 0; i < n; i++) {
        size_t len;
        char *t = token_text(j, v[i].token, &len);
        cJSON_AddItemToArray(toks, cJSON_CreateString(t ? t : ""));
        free(t);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*off));
        *off += len;
        if (isnan(v[i].logprob)) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber((double)v[i].logprob));
        cJSON *d = cJSON_CreateObject();
        for (int k = 0; k < v[i].n_top; k++) {
            size_t tl;
            char *tt = token_text(j, v[i].top[k].token, &tl);
            cJSON_AddNumberToObject(d, tt ? tt : "", (double)v[i].top[k].logprob);
            free(tt);
        }
        cJSON_AddItemToArray(tops, d);
    }
    return o;
}

/* ------------------------------------------------------------ whole replies */

static int reply_whole(job *j) {
    server *s = j->s;
    serve_err e;
    const choice *bad = failed_choice(j);
    if (bad) {
        serr(&e, 500, NULL, NULL, "generation failed: %s", cellm_request_error(bad->req));
        return http_reply_error(s, j->conn, &e);
    }
    if (j->timed_out) {
        serr(&e, 504, "timeout", NULL, "the request took longer than the server's --timeout (%us)",
             s->o.timeout_s);
        return http_reply_error(s, j->conn, &e);
    }
    if (j->oom) {
        serr(&e, 500, NULL, NULL, "out of memory");
        return http_reply_error(s, j->conn, &e);
    }
    if (j->rq.api) { /* another API's shape, of the one choice */
        serve_out o = {j->ch[0].text, j->ch[0].len, true, j->ch[0].res, NULL};
        return http_reply_json(s, j->conn, 200, j->rq.api->whole(j->rq.api_ctx, &o));
    }
    bool chat = j->rq.kind == SERVE_CHAT;
    cJSON *r = reply_base(j, chat ? "chat.completion" : "text_completion");
    cJSON *arr = cJSON_AddArrayToObject(r, "choices");
    for (int i = 0; i < j->n_ch; i++) {
        const choice *c = &j->ch[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", c->index);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(o, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            char *content = NULL;
            cJSON *calls = j->tools ? serve_tool_calls(c->text, c->len, j->rq.tools_json,
                                                       serve_random(s), &content)
                                    : NULL;
            if (calls) {
                j->ch[i].called = true;
                if (content)
                    serve_json_add_text(m, "content", content, strlen(content));
                else
                    cJSON_AddNullToObject(m, "content");
                cJSON_AddItemToObject(m, "tool_calls", calls);
                free(content);
            } else {
                serve_json_add_text(m, "content", c->text, c->len);
            }
        } else if (j->rq.echo) {
            const char *pt = j->echo[c->prompt];
            size_t pn = j->echo_len[c->prompt];
            char *both = malloc(pn + c->len + 1);
            if (both) {
                memcpy(both, pt, pn);
                if (c->len) memcpy(both + pn, c->text, c->len);
                serve_json_add_text(o, "text", both, pn + c->len);
            }
            free(both);
        } else {
            serve_json_add_text(o, "text", c->text, c->len);
        }
        if (!j->rq.logprobs) {
            cJSON_AddNullToObject(o, "logprobs");
        } else if (chat) {
            cJSON_AddItemToObject(o, "logprobs", chat_logprobs(j, c->lp, c->n_lp));
        } else {
            size_t off = 0;
            cJSON_AddItemToObject(o, "logprobs", legacy_logprobs(j, c->lp, c->n_lp, &off));
        }
        cJSON_AddStringToObject(o, "finish_reason", finish_str(c));
        cJSON_AddItemToArray(arr, o);
    }
    cJSON_AddItemToObject(r, "usage", usage_json(j));
    return http_reply_json(s, j->conn, 200, r);
}

/* ------------------------------------------------------------ streams */

/* Appends "data: JSON\n\n" and frees obj. j->mu held. */
static void sse_put(job *j, cJSON *obj) {
    char *t = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!t) {
        j->oom = true;
        return;
    }
    size_t n = strlen(t);
    if (serve_grow(&j->out, &j->out_cap, j->out_len + n + 9)) {
        memcpy(j->out + j->out_len, "data: ", 6);
        memcpy(j->out + j->out_len + 6, t, n);
        memcpy(j->out + j->out_len + 6 + n, "\n\n", 2);
        j->out_len += n + 8;
    } else {
        j->oom = true;
    }
    free(t);
}

static void sse_raw(job *j, const char *s) {
    size_t n = strlen(s);
    if (serve_grow(&j->out, &j->out_cap, j->out_len + n + 1)) {
        memcpy(j->out + j->out_len, s, n);
        j->out_len += n;
    }
}

/* One chunk for one choice: text (and with logprobs, those of the tokens
 * reported since the last chunk), or the final one with finish_reason. */
static cJSON *chunk(job *j, choice *c, const char *text, size_t n, bool role, const char *finish) {
    bool chat = j->rq.kind == SERVE_CHAT;
    cJSON *r = reply_base(j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *arr = cJSON_AddArrayToObject(r, "choices");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", c->index);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(o, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) serve_json_add_text(d, "content", text, n);
    } else {
        serve_json_add_text(o, "text", text, text ? n : 0);
    }
    if (j->rq.logprobs && !finish && c->n_lp > c->lp_sent) {
        const lp_entry *v = c->lp + c->lp_sent;
        int k = c->n_lp - c->lp_sent;
        c->lp_sent = c->n_lp;
        cJSON_AddItemToObject(o, "logprobs",
                              chat ? chat_logprobs(j, v, k) : legacy_logprobs(j, v, k, &c->lp_off));
    } else {
        cJSON_AddNullToObject(o, "logprobs");
    }
    if (finish)
        cJSON_AddStringToObject(o, "finish_reason", finish);
    else
        cJSON_AddNullToObject(o, "finish_reason");
    cJSON_AddItemToArray(arr, o);
    if (j->rq.include_usage) cJSON_AddNullToObject(r, "usage");
    return r;
}

/* The error that ends a finished stream (an engine failure or the
 * deadline) into *e; e->status 0 when there is none. */
static void stream_end_error(const job *j, serve_err *e) {
    const choice *bad = failed_choice(j);
    memset(e, 0, sizeof *e);
    if (bad)
        serr(e, 500, NULL, NULL, "generation failed: %s", cellm_request_error(bad->req));
    else if (j->timed_out)
        serr(e, 504, "timeout", NULL, "the request took longer than the server's --timeout (%us)",
             j->s->o.timeout_s);
}

/* stream_fill for another API's shape (serve_api): its events for the one
 * choice's new text, the last once it is done. j->mu held. */
static void api_stream_fill(job *j) {
    choice *c = &j->ch[0];
    if (j->ended || (c->role_sent && !c->len && !c->done)) return;
    c->role_sent = true; /* the first call opens the stream, text or not */
    serve_err e;
    e.status = 0;
    if (c->done) stream_end_error(j, &e);
    serve_out o = {c->text, c->len, c->done, c->res, e.status ? &e : NULL};
    char *t = j->rq.api->stream(j->rq.api_ctx, &o);
    c->len = 0;
    if (!t) {
        j->oom = true;
        return;
    }
    sse_raw(j, t);
    free(t);
    if (c->done) {
        j->ended = true;
        count_finished(j);
    }
}

/* A chunk whose delta holds one tool call's piece: the first has its
 * index, id, type and name with empty arguments, the next ones pieces of
 * the arguments, as OpenAI streams them. */
static cJSON *tool_chunk(job *j, choice *c, int index, const cJSON *call, const char *args,
                         size_t n) {
    cJSON *r = chunk(j, c, NULL, 0, false, NULL);
    cJSON *d =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "delta");
    cJSON *t = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(d, "tool_calls"), t);
    cJSON_AddNumberToObject(t, "index", index);
    if (call) {
        cJSON_AddStringToObject(t, "id", cJSON_GetObjectItem(call, "id")->valuestring);
        cJSON_AddStringToObject(t, "type", "function");
    }
    cJSON *f = cJSON_AddObjectToObject(t, "function");
    if (call)
        cJSON_AddStringToObject(
            f, "name",
            cJSON_GetObjectItem(cJSON_GetObjectItem(call, "function"), "name")->valuestring);
    serve_json_add_text(f, "arguments", args, n);
    return r;
}

/* Streaming while tools may be called: text goes out as content up to
 * where a call may begin (serve_tool_hold); the rest waits for the end,
 * when it is parsed and sent as tool_calls deltas, or as content when it
 * holds no call. j->mu held. */
static void stream_tools(job *j, choice *c) {
    size_t hold = c->done ? c->sent : serve_tool_hold(c->text ? c->text : "", c->len);
    if (hold > c->sent) {
        sse_put(j, chunk(j, c, c->text + c->sent, hold - c->sent, false, NULL));
        c->sent = hold;
    } else if (!c->done && c->n_lp > c->lp_sent) {
        sse_put(j, chunk(j, c, "", 0, false, NULL));
    }
    if (!c->done || c->final_sent || c->res.finish_reason == CELLM_FINISH_ERROR) return;
    char *content = NULL;
    cJSON *calls = serve_tool_calls(c->text ? c->text : "", c->len, j->rq.tools_json,
                                    serve_random(j->s), &content);
    free(content); /* the text before the calls went out already */
    if (!calls) {
        if (c->len > c->sent)
            sse_put(j, chunk(j, c, c->text + c->sent, c->len - c->sent, false, NULL));
        c->sent = c->len;
        return;
    }
    c->called = true;
    int index = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        const char *args =
            cJSON_GetObjectItem(cJSON_GetObjectItem(call, "function"), "arguments")->valuestring;
        size_t n = strlen(args);
        sse_put(j, tool_chunk(j, c, index, call, "", 0));
        for (size_t at = 0, k; at < n; at += k) {
            k = serve_tool_args_piece(args, n, at);
            sse_put(j, tool_chunk(j, c, index, NULL, args + at, k));
        }
        index++;
    }
    cJSON_Delete(calls);
    c->sent = c->len;
}

/* Turns what the callbacks left into SSE events. j->mu held. */
static void stream_fill(job *j) {
    if (j->rq.api) {
        api_stream_fill(j);
        return;
    }
    bool chat = j->rq.kind == SERVE_CHAT, all_final = true;
    for (int i = 0; i < j->n_ch; i++) {
        choice *c = &j->ch[i];
        if (!c->role_sent) {
            c->role_sent = true;
            if (chat) sse_put(j, chunk(j, c, "", 0, true, NULL));
            if (!chat && j->rq.echo)
                sse_put(j, chunk(j, c, j->echo[c->prompt], j->echo_len[c->prompt], false, NULL));
        }
        if (j->tools) {
            stream_tools(j, c);
        } else if (c->len || c->n_lp > c->lp_sent) {
            sse_put(j, chunk(j, c, c->text, c->len, false, NULL));
            c->len = 0;
        }
        if (c->done && !c->final_sent) {
            c->final_sent = true;
            if (c->res.finish_reason != CELLM_FINISH_ERROR && !j->timed_out)
                sse_put(j, chunk(j, c, NULL, 0, false, finish_str(c)));
        }
        all_final &= c->final_sent;
    }
    if (!all_final || j->ended) return;
    serve_err e;
    stream_end_error(j, &e);
    if (e.status) {
        cJSON *r = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(r, "error");
        cJSON_AddStringToObject(err, "message", e.msg);
        cJSON_AddStringToObject(err, "type", e.type);
        cJSON_AddNullToObject(err, "param");
        if (e.code)
            cJSON_AddStringToObject(err, "code", e.code);
        else
            cJSON_AddNullToObject(err, "code");
        sse_put(j, r);
    }
    if (j->rq.include_usage) {
        cJSON *r = reply_base(j, chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(r, "choices");
        cJSON_AddItemToObject(r, "usage", usage_json(j));
        sse_put(j, r);
    }
    sse_raw(j, "data: [DONE]\n\n");
    j->ended = true;
    count_finished(j);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    job *j = cls;
    server *s = j->s;
    /* Comments keep the connection's idle timer fresh while a request
     * waits, and find out early when a reader has stopped reading. */
    double keepalive = s->o.idle_s ? s->o.idle_s / 3.0 : 15.0;
    if (keepalive > 15.0) keepalive = 15.0;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out_off < j->out_len) {
            size_t n = j->out_len - j->out_off;
            if (n > max) n = max;
            memcpy(buf, j->out + j->out_off, n);
            j->out_off += n;
            if (j->out_off == j->out_len) j->out_off = j->out_len = 0;
            j->last_send = serve_now();
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->ended) {
            pthread_mutex_unlock(&j->mu);
            MHD_set_connection_option(j->conn, MHD_CONNECTION_OPTION_TIMEOUT, s->o.idle_s);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        if (j->oom) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        stream_fill(j);
        if (j->out_len) continue;
        if (!job_wait_slice(j, WAIT_SLICE_MS)) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (serve_now() - j->last_send > keepalive) sse_raw(j, ": keep-alive\n\n");
    }
}

static void stream_free(void *cls) {
    job *j = cls;
    atomic_fetch_sub_explicit(&j->s->c.streams, 1, memory_order_relaxed);
    if (!j->ended) { /* the client went away, or the server stops */
        pthread_mutex_lock(&j->mu);
        job_cancel(j);
        pthread_mutex_unlock(&j->mu);
        for (int i = 0; i < j->n_ch; i++) cellm_wait(j->ch[i].req, NULL);
        count_finished(j);
    }
    job_free(j);
}

static int reply_stream(job *j) {
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, j, stream_free);
    if (!r) {
        job_free(j);
        return MHD_NO;
    }
    atomic_fetch_add_explicit(&j->s->c.streams, 1, memory_order_relaxed);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    http_add_headers(j->s, j->conn, r);
    j->last_send = serve_now();
    enum MHD_Result ret = MHD_queue_response(j->conn, 200, r);
    MHD_destroy_response(r); /* the job now lives as long as the response */
    if (ret == MHD_YES) http_count_status(j->s, 200);
    return ret;
}

/* ------------------------------------------------------------ starting */

/* Tools: checks them by compiling the grammar of a call (a bad schema is
 * a 400 naming the tool), which constrains the reply when tool_choice is
 * required or names a function. With tool_choice none the template still
 * shows the tools (the prompt keeps its prefix, and its cache), but the
 * reply is not parsed for calls. */
static bool job_tool_grammar(job *j, serve_err *e) {
    serve_req *rq = &j->rq;
    if (rq->kind != SERVE_CHAT || !rq->tools_json) return true;
    j->tools = rq->tool_choice != SERVE_TOOLS_NONE;
    bool force = rq->tool_choice == SERVE_TOOLS_REQUIRED || rq->tool_choice == SERVE_TOOLS_NAMED;
    if (force && rq->grammar)
        return serr(e, 400, "invalid_value", "tool_choice",
                    "a required or named tool_choice cannot go with response_format or grammar");
    cellm_grammar *g = NULL;
    if (cellm_grammar_tool_calls(j->s->model, rq->tools_json,
                                 rq->tool_choice == SERVE_TOOLS_NAMED ? rq->tool_name : NULL,
                                 rq->parallel_tool_calls, &g) != CELLM_OK)
        return serr(e, 400, "invalid_value",
                    rq->tool_choice == SERVE_TOOLS_NAMED &&
                            strstr(cellm_last_error(), "tool_choice")
                        ? "tool_choice"
                        : "tools",
                    "%s", cellm_last_error());
    if (force)
        rq->grammar = g;
    else
        cellm_grammar_free(g);
    return true;
}

/* With echo: the text each prompt shows, its own for a text prompt, the
 * decoded tokens (control tokens as their text) for a token prompt. */
static bool job_echo_texts(job *j, serve_err *e) {
    if (j->rq.kind == SERVE_CHAT || !j->rq.echo) return true;
    int n = j->rq.n_prompts;
    j->echo = calloc((size_t)n, sizeof *j->echo);
    j->echo_len = calloc((size_t)n, sizeof *j->echo_len);
    if (!j->echo || !j->echo_len) return serr(e, 500, NULL, NULL, "out of memory");
    int32_t *bos = NULL, n_bos = 0;
    if (cellm_tokenize_ex(j->s->model, "", 0, CELLM_TOKENIZE_ADD_SPECIAL, &bos, &n_bos) == CELLM_OK)
        j->echo_drop_bos = n_bos > 0 && j->s->info.bos >= 0 && bos[0] == j->s->info.bos;
    free(bos);
    for (int i = 0; i < n; i++) {
        const serve_prompt *p = &j->rq.prompts[i];
        if (p->text) {
            j->echo_len[i] = strlen(p->text);
            j->echo[i] = malloc(j->echo_len[i] + 1);
            if (j->echo[i]) memcpy(j->echo[i], p->text, j->echo_len[i] + 1);
        } else if (cellm_detokenize(j->s->model, p->tokens, p->n_tokens, 1, &j->echo[i],
                                    &j->echo_len[i]) != CELLM_OK) {
            return serr(e, 400, "invalid_value", "prompt", "%s", cellm_last_error());
        }
        if (!j->echo[i]) return serr(e, 500, NULL, NULL, "out of memory");
    }
    return true;
}

job *job_start(server *s, struct MHD_Connection *conn, serve_req *rq, serve_err *e) {
    job *j = calloc(1, sizeof *j);
    if (!j) {
        serve_req_free(rq);
        serr(e, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    j->rq = *rq; /* the job owns the request now */
    memset(rq, 0, sizeof *rq);
    j->s = s;
    j->conn = conn;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    int n_prompts = j->rq.kind == SERVE_CHAT ? 1 : j->rq.n_prompts;
    j->n_ch = n_prompts * j->rq.n;
    j->ch = calloc((size_t)j->n_ch, sizeof *j->ch);
    if (!j->ch) {
        job_free(j);
        serr(e, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    for (int i = 0; i < j->n_ch; i++) {
        j->ch[i].j = j;
        j->ch[i].index = i;
        j->ch[i].prompt = i / j->rq.n;
    }
    snprintf(j->id, sizeof j->id, "%s-%016llx", j->rq.kind == SERVE_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)serve_random(s));
    j->created = (long)time(NULL);
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    if (s->o.timeout_s) j->deadline = serve_now() + s->o.timeout_s;

    int before = atomic_fetch_add(&s->c.in_flight, j->n_ch);
    if (before + j->n_ch > s->o.max_queue) {
        atomic_fetch_sub(&s->c.in_flight, j->n_ch);
        atomic_fetch_add_explicit(&s->c.rejected_busy, 1, memory_order_relaxed);
        serr(e, 503, "server_busy", NULL,
             "the server is busy: %d of its %d request slots are taken and this request needs %d; "
             "retry later",
             before, s->o.max_queue, j->n_ch);
        job_free(j);
        return NULL;
    }
    for (int i = 0; i < j->rq.n_bias; i++)
        j->bias[i] = (cellm_logit_bias){j->rq.bias_tok[i], j->rq.bias_val[i]};
    if (!job_tool_grammar(j, e)) {
        atomic_fetch_sub(&s->c.in_flight, j->n_ch);
        job_free(j);
        return NULL;
    }
    if (!job_echo_texts(j, e)) {
        atomic_fetch_sub(&s->c.in_flight, j->n_ch);
        job_free(j);
        return NULL;
    }
    /* in_flight now counts all n_ch; job_free gives back n_submitted. */
    bool ok = job_submit(j, e);
    atomic_fetch_sub(&s->c.in_flight, j->n_ch - j->n_submitted);
    if (!ok) {
        job_free(j);
        return NULL;
    }
    return j;
}

int job_reply(job *j) {
    if (j->rq.stream) return reply_stream(j);
    /* Whole reply: the connection's idle timer is off while we wait. */
    server *s = j->s;
    MHD_set_connection_option(j->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    pthread_mutex_lock(&j->mu);
    bool alive = true;
    while (j->n_done < j->n_ch && alive) alive = job_wait_slice(j, WAIT_SLICE_MS);
    pthread_mutex_unlock(&j->mu);
    /* Wait for the cancelled ones too, so the counts are final. */
    for (int i = 0; i < j->n_ch; i++) cellm_wait(j->ch[i].req, NULL);
    count_finished(j);
    int ret = MHD_NO; /* a client that left gets no reply: the connection closes */
    if (alive) {
        MHD_set_connection_option(j->conn, MHD_CONNECTION_OPTION_TIMEOUT, s->o.idle_s);
        ret = reply_whole(j);
    }
    job_free(j);
    return ret;
}

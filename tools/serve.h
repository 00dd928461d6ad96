/*
 * serve.h — `cellm serve`: an OpenAI-compatible HTTP server on one engine.
 *
 * The server is split by subject:
 *   serve.c          the command: flags, loading the model, starting and
 *                    stopping the engine and the HTTP daemon
 *   serve_http.c     the HTTP layer on libmicrohttpd: bodies, limits,
 *                    API key, CORS, routing, JSON replies and errors
 *   serve_req.c      parsing and validating request JSON (no engine: the
 *                    fuzz target drives it alone)
 *   serve_oai.c      the endpoints: completions (checked, then run as a
 *                    job), models, tokenize, detokenize
 *   serve_tools.c    tool calls: tools and tool_choice checked, tool
 *                    turns kept as JSON, replies turned into tool_calls
 *   serve_job.c      a job: the engine requests of one completion request
 *                    and their reply, whole or streamed as server-sent events
 *   serve_responses.c  the Responses API (/v1/responses): its body turned
 *                    into a chat request, its reply shaped by a serve_api
 *   serve_metrics.c  counters and the Prometheus text of /metrics
 *   serve_page.c     the web chat page served at /
 *
 * Threads: libmicrohttpd runs one thread per connection; each handles its
 * requests one after another and may block (waiting for the engine) without
 * holding up the others. The engine thread runs the request callbacks,
 * which only copy text into their job under the job's lock.
 */
#ifndef CELLM_SERVE_H
#define CELLM_SERVE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cellm.h"

/* ------------------------------------------------------------ options */

#define SERVE_MAX_CORS 8

typedef struct serve_opts {
    const char *model;          /* path or store name */
    const char *host;           /* default 127.0.0.1 */
    int port;                   /* 0: any free port */
    const char *alias;          /* model id in the API; default: store name or file stem */
    const char *api_key;        /* NULL: no check */
    const char *chat_template;  /* NULL: the model's */
    const char *draft;          /* speculative decoding's draft model, path or name; NULL: none */
    const char *mmproj;         /* the vision projector (image_url parts); NULL: none */
    cellm_engine_params engine; /* also the speculation flags (lookup_ngram, draft_max, ...) */
    int32_t n_predict;          /* max_tokens when a request gives none; -1: the context */
    float temperature;          /* when a request gives none */
    size_t max_body;            /* bytes of a request body */
    int max_queue;              /* engine requests running or waiting; more get 503 */
    int max_conns;              /* connections at once */
    int max_n;                  /* choices per request (n x prompts) */
    unsigned timeout_s;         /* one request, submit to last byte; 0: none */
    unsigned idle_s;            /* a connection that sends nothing this long is closed */
    unsigned drain_s;           /* SIGTERM: seconds to finish running requests; 0: stop at once */
    int affinity_tokens;        /* the prompt tokens the default affinity key hashes */
    bool log_requests;          /* one line per API request on stderr */
    const char *cors[SERVE_MAX_CORS];
    int n_cors;
    bool verbose;
} serve_opts;

serve_opts serve_default_opts(void);

/* ------------------------------------------------------------ metrics */

/* Counters the HTTP threads bump (relaxed atomics: they are statistics). */
typedef struct serve_counters {
    atomic_ullong http_2xx, http_4xx, http_5xx, http_other;
    atomic_ullong chat, completions, other_routes;
    atomic_ullong responses;
    atomic_ullong prompt_tokens, completion_tokens;
    atomic_ullong cached_tokens;              /* prompt tokens the prefix cache gave */
    atomic_ullong prefix_hits, prefix_misses; /* finished choices with / without any */
    atomic_ullong finished_stop, finished_length, cancelled, errors;
    atomic_ullong disconnects, timeouts, rejected_busy;
    atomic_ullong n_timed, queue_us, total_us; /* over finished choices */
    atomic_ullong n_first, first_token_us;     /* over those that made a token */
    atomic_int in_flight;                      /* engine requests submitted and not yet freed */
    atomic_int streams;                        /* streaming responses open */
} serve_counters;

/* ------------------------------------------------------------ the server */

/* Where an instance is in its life, as a load balancer sees it through
 * /health: 503 while loading the model and while draining. */
typedef enum serve_state { SERVE_LOADING, SERVE_READY, SERVE_DRAINING } serve_state;

typedef struct server {
    serve_opts o;
    char model_id[256];
    char model_path[4096];
    cellm_model *model;
    char draft_path[4096];
    cellm_model *draft;          /* NULL: no draft model */
    cellm_mmproj *mmproj;        /* NULL: no projector, no pictures */
    struct serve_images *images; /* pictures' decoding and cache (with mmproj) */
    cellm_engine *engine;
    cellm_model_info info;
    int32_t n_ctx;
    struct MHD_Daemon *daemon;
    int port;       /* the port bound */
    double t_start; /* monotonic seconds */
    long created;   /* wall-clock seconds, for the model list */
    atomic_bool stopping;
    atomic_int state;      /* serve_state: what /health says and who is admitted */
    atomic_int active;     /* API requests admitted and not yet completed (draining waits) */
    atomic_ullong rng_ctr; /* ids and seeds: splitmix64 of rng_seed + counter */
    uint64_t rng_seed;
    serve_counters c;
} server;

/* Loads the model, creates the engine and starts listening. On failure
 * writes a message to err (cap bytes) and returns NULL. */
server *serve_start(const serve_opts *o, char *err, size_t cap);

/* Stops listening, ends every connection (cancelling their requests) and
 * frees everything. NULL is fine. */
void serve_stop(server *s);

/* SIGTERM's drain: new requests get 503 and /health turns 503 while the
 * running ones finish; returns when none is left, after s->o.drain_s
 * seconds, or when a signal of `sigs` (blocked by the caller) comes.
 * Returns how many requests were still running. Then call serve_stop. */
int serve_drain(server *s, const void *sigs);

/* Monotonic seconds (request times, deadlines, uptime, the drain). */
double serve_now(void);

/* A random 64-bit number (thread-safe). */
uint64_t serve_random(server *s);

/* `cellm serve [MODEL] [options]`. */
int cmd_serve(int argc, char **argv);

/* ------------------------------------------------------------ serve_http.c */

/* Starts the HTTP daemon on s->o.host:s->o.port; sets s->port. */
bool http_start(server *s, char *err, size_t cap);
void http_stop(server *s);

/* ------------------------------------------------------------ serve_req.c */

/* An error for the client, OpenAI style. */
typedef struct serve_err {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "server_error", ... */
    const char *code; /* "invalid_value", ... or NULL */
    char param[64];   /* the offending field, or "" */
    char msg[512];
} serve_err;

/* Sets *e and returns false, so a failing check reads `return serr(...)`. */
bool serr(serve_err *e, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

typedef enum serve_kind { SERVE_CHAT, SERVE_COMPLETION } serve_kind;

/* OpenAI's tool_choice (NONE also when there are no tools). */
typedef enum serve_tool_choice {
    SERVE_TOOLS_NONE,
    SERVE_TOOLS_AUTO,
    SERVE_TOOLS_REQUIRED,
    SERVE_TOOLS_NAMED,
} serve_tool_choice;

#define SERVE_MAX_STOP 4
#define SERVE_MAX_BIAS 300

/* One completion prompt: text, or token ids. */
typedef struct serve_prompt {
    char *text;
    int32_t *tokens;
    int32_t n_tokens;
} serve_prompt;

/* What the parser needs to know about the server to check ranges. */
typedef struct serve_limits {
    int32_t n_vocab;
    int32_t n_ctx;
    int max_n;
    int32_t n_predict;
    float temperature;
    /* The pictures of image_url parts (serve_image_from_url), NULL: this
     * server takes none (no --mmproj). */
    struct serve_images *images;
} serve_limits;

/* A validated request to /v1/chat/completions or /v1/completions. Every
 * string is owned by the request (freed by serve_req_free). */
typedef struct serve_req {
    serve_kind kind;
    char *model; /* NULL: not given */
    cellm_chat_message *messages;
    int32_t n_messages;
    serve_prompt *prompts;
    int32_t n_prompts;
    int32_t max_tokens; /* -1: until the context is full */
    float temperature, top_p, min_p, typical_p;
    int32_t top_k;
    bool has_seed;
    uint64_t seed;
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    float presence_penalty, frequency_penalty, repeat_penalty;
    int32_t repeat_last_n; /* the penalties' window; -1: the whole context */
    int32_t bias_tok[SERVE_MAX_BIAS];
    float bias_val[SERVE_MAX_BIAS];
    int n_bias;
    int n;
    bool stream, include_usage, echo;
    /* Log-probabilities: chat's `logprobs: true` with `top_logprobs`, or
     * the completions' `logprobs: N` (N alternatives); with echo, the
     * prompt's too. */
    bool logprobs;
    int32_t top_logprobs; /* 0..CELLM_MAX_TOP_LOGPROBS */
    /* Structured output (response_format json_object or json_schema, or
     * `grammar`): the compiled grammar, NULL for text. */
    cellm_grammar *grammar;
    /* Another API's reply shape for a chat request (the Responses API),
     * NULL for chat's and completions' own; api_ctx is its state, owned
     * by the request (freed by serve_req_free through api->free). */
    const struct serve_api *api;
    void *api_ctx;
    /* Tool calls (chat): the tools as JSON text (NULL: none), the
     * conversation as JSON when it has tools or tool turns (then used
     * instead of `messages`), tool_choice, its function's name when
     * NAMED, and parallel_tool_calls (default true). */
    char *tools_json;
    char *messages_json;
    serve_tool_choice tool_choice;
    char *tool_name;
    bool parallel_tool_calls;
    char *user; /* the `user` field, NULL when not given (an affinity key) */
    /* Pictures of image_url parts, in order; each marked by "<image>" in
     * its message's content (cellm_request_params.images). Owned. */
    cellm_image_embed *images[CELLM_MAX_IMAGES];
    int32_t n_images;
} serve_req;

/* ------------------------------------------------------------ pictures */

/* serve_image.c: image_url data: URLs into pictures' embeddings, with a
 * cache of encoded pictures by the content hash of their files. */
#define SERVE_IMAGE_MAX_PIXELS ((uint64_t)4096 * 4096) /* a decoded picture at most */
#define SERVE_IMAGE_CACHE_BYTES ((size_t)64 << 20)     /* embeddings kept for reuse */

typedef struct serve_images serve_images;

/* Pictures encoded with `mm` (not owned). False: out of memory. */
bool serve_images_create(cellm_mmproj *mm, serve_images **out);
void serve_images_free(serve_images *im);

/* Pictures the cache gave and those it had to encode. */
void serve_images_stats(serve_images *im, uint64_t *hits, uint64_t *misses);

/* The picture of an image_url part's url: a data: URL of base64 PNG or
 * JPEG (remote URLs are refused, never fetched). A new embedding the
 * caller frees (cellm_image_embed_free), or NULL with *e set (400 naming
 * `param`, 500 when memory is short). Thread-safe. */
cellm_image_embed *serve_image_from_url(serve_images *im, const char *url, const char *param,
                                        serve_err *e);

/* Parses and validates body[0..len) (any bytes). True with *r filled, or
 * false with *e set (and nothing left to free). */
bool serve_req_parse(const char *body, size_t len, serve_kind kind, const serve_limits *lim,
                     serve_req *r, serve_err *e);
void serve_req_free(serve_req *r);

/* Parses body[0..len) (followed by nothing but white space) into a new
 * cJSON tree (a cJSON *; free with cJSON_Delete), or NULL with *err_at
 * (may be NULL) near the error. Thread-safe. */
void *serve_json_parse(const char *body, size_t len, size_t *err_at);

/* True when s[0..len) is valid UTF-8 (no overlongs, surrogates or code
 * points past U+10FFFF). */
bool serve_utf8_valid(const char *s, size_t len);

/* A new NUL-terminated copy of s[0..n) with every invalid UTF-8 sequence
 * replaced by U+FFFD (NULL when out of memory); free it with free(). */
char *serve_utf8_clean(const char *s, size_t n);

/* Adds s[0..n) to the cJSON object `obj` as the string field `name`, any
 * invalid UTF-8 replaced by U+FFFD (JSON text must be UTF-8). */
void *serve_json_add_text(void *obj, const char *name, const char *s, size_t n);

/* Makes *p (a malloc'd buffer of *cap bytes, or NULL and 0) hold at least
 * `need` bytes, reallocating; false when out of memory (*p unchanged). */
bool serve_grow(char **p, size_t *cap, size_t need);

/* ------------------------------------------------------------ serve_tools.c */

/* Reads `tools`, `tool_choice` and `parallel_tool_calls` of a chat body
 * (a cJSON object whose messages parse_messages has read into r), and
 * keeps the conversation as JSON when tools or tool turns need it. */
bool serve_tools_parse(const void *root, serve_req *r, serve_err *e);
void serve_tools_free(serve_req *r);

/* The tool calls in a reply text[0..len) as OpenAI's `tool_calls` array
 * (a cJSON *: [{"id", "type": "function", "function": {"name",
 * "arguments"}}], ids made from id_seed), or NULL when it holds none (the
 * text is then plain content). *content gets the text outside the calls
 * (a new string, or NULL when there is none). Calls of functions not in
 * tools_json do not count. */
void *serve_tool_calls(const char *text, size_t len, const char *tools_json, uint64_t id_seed,
                       char **content);

/* How much of a reply streamed so far (text[0..len)) may go out as
 * content while tools may be called: the bytes before anything that is,
 * or may grow into, a tool call. */
size_t serve_tool_hold(const char *text, size_t len);

#define SERVE_ARGS_PIECE 48 /* bytes of a call's arguments per streamed piece */

/* The length of the streamed piece of a call's arguments args[0..n) that
 * starts at `at` (< n): about SERVE_ARGS_PIECE bytes, ending on a whole
 * UTF-8 character. */
size_t serve_tool_args_piece(const char *args, size_t n, size_t at);

/* ------------------------------------------------------------ serve_job.c */

struct MHD_Connection;
typedef struct job job;

/* Makes a job of the validated request *rq (which it takes over: *rq is
 * emptied) and submits its engine requests. NULL with *e set when it
 * cannot: 503 when the queue is full, 400 for a prompt the engine refuses
 * (too long for the context, ...). */
job *job_start(server *s, struct MHD_Connection *conn, serve_req *rq, serve_err *e);

/* Replies with the job's result, whole (waiting for it here) or streamed
 * (the job then lives as long as the response), and frees the job.
 * libmicrohttpd's MHD_YES / MHD_NO. */
int job_reply(job *j);

/* ------------------------------------------------------------ serve_oai.c */

/* Each handles one complete request (body[0..len)) and queues the reply on
 * `conn`; the return value is libmicrohttpd's (MHD_YES / MHD_NO). */
int oai_completions(server *s, struct MHD_Connection *conn, serve_kind kind, const char *body,
                    size_t len);
int oai_models(server *s, struct MHD_Connection *conn, const char *id);
int oai_tokenize(server *s, struct MHD_Connection *conn, const char *body, size_t len);
int oai_detokenize(server *s, struct MHD_Connection *conn, const char *body, size_t len);
/* POST /v1/responses: parsed by serve_responses.c, run as a chat job. */
int oai_responses(server *s, struct MHD_Connection *conn, const char *body, size_t len);

/* ------------------------------------------------------------ serve_responses.c */

/* What a job tells another API's reply (serve_api) about its one choice. */
typedef struct serve_out {
    const char *text; /* whole reply: all the text; stream: the text new since the last call */
    size_t len;
    bool done;            /* the choice has finished and res is set */
    cellm_result res;     /* when done */
    const serve_err *err; /* stream, when done: the error that ends it (engine, timeout), or NULL */
} serve_out;

/* A reply shape besides chat's and completions', for a request the job
 * runs as a chat (one choice). Called on the connection's thread. */
typedef struct serve_api {
    /* The whole reply: a new cJSON * (NULL when out of memory). */
    void *(*whole)(void *ctx, const serve_out *o);
    /* A stream's server-sent events for what `o` brings: called first
     * with no text, then with each new text, last once with o->done. A
     * new string, "" when there is nothing to send yet (NULL when out of
     * memory). */
    char *(*stream)(void *ctx, const serve_out *o);
    void (*free)(void *ctx);
} serve_api;

/* Parses and validates a /v1/responses body (any bytes) into a chat
 * request *r whose api is the Responses API's, with `model_id` and `id`
 * (random, for the response's ids) in its state. True with *r filled, or
 * false with *e set (params named as the Responses API names them). */
bool responses_parse(const char *body, size_t len, const serve_limits *lim, const char *model_id,
                     uint64_t id, serve_req *r, serve_err *e);

/* Renames the field of an error about the chat request a Responses body
 * became (messages, response_format) as the Responses API names it. */
void responses_err_param(serve_err *e);

/* ------------------------------------------------------------ affinity */

#define SERVE_AFFINITY_MAX 160 /* bytes of an affinity key, with its NUL */

/* The key a load balancer may hash to send requests that share a prefix to
 * one instance (docs/deploy.md): "session:ID" from the X-Session-Id header,
 * else "user:NAME" from the body's `user`, else "prefix:HEX", a hash of the
 * first s->o.affinity_tokens tokens of the prompt's text. Into out. */
void serve_affinity(server *s, struct MHD_Connection *conn, const serve_req *rq,
                    char out[SERVE_AFFINITY_MAX]);

#define SERVE_ID_MAX 128 /* bytes of a client's id (request, session, user) kept as is */

/* Whether v is 1..SERVE_ID_MAX bytes of printable ASCII without spaces:
 * safe to echo in a header and a log line as it is. */
bool serve_plain_id(const char *v);

/* Gives the request being handled on this thread its affinity key, sent
 * back in the X-Cellm-Affinity header and logged. */
void http_set_affinity(const char *key);

/* ------------------------------------------------------------ replies */

/* Queue a reply on `conn` with the server's common headers (CORS) and count
 * its status. `body` is copied. retry_after > 0 adds Retry-After. */
int http_reply(server *s, struct MHD_Connection *conn, int status, const char *ctype,
               const char *body, size_t len, int retry_after);
int http_reply_error(server *s, struct MHD_Connection *conn, const serve_err *e);
/* Replies with the JSON text of `json` (a cJSON *) and frees it. */
int http_reply_json(server *s, struct MHD_Connection *conn, int status, void *json);
/* Adds the common headers to a response made elsewhere (streams). */
void http_add_headers(server *s, struct MHD_Connection *conn, void *response);
void http_count_status(server *s, int status);

/* ------------------------------------------------------------ the rest */

/* The Prometheus text of /metrics, a new string the caller frees. */
char *metrics_text(server *s);

/* The web chat page: static HTML. */
extern const char serve_page_html[];

#endif /* CELLM_SERVE_H */

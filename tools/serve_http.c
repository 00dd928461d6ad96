/*
 * serve_http.c — the HTTP layer of `cellm serve`, on libmicrohttpd (one
 * thread per connection, which may block while the engine works).
 *
 * What happens before a handler runs: the route and method are looked up,
 * the API key checked (constant-time), and a declared Content-Length over
 * the body limit refused, all as soon as the headers are in, so a client
 * that will be refused need not send its body; then the body is gathered
 * up to the limit. Replies go through http_reply*, which add the CORS
 * headers for the origins the operator named and count the status for
 * /metrics. Slow or idle clients are cut off by libmicrohttpd's connection
 * timeout (--idle-timeout); the timeout is lifted while a request waits
 * for the engine, which has its own (--timeout).
 *
 * For a load balancer (docs/deploy.md): while the model loads and while
 * the server drains (SIGTERM) every route but /health (and /metrics while
 * draining) gets 503, and /health says which; each request has an id, the
 * client's X-Request-Id or a new one, sent back and logged with
 * --log-requests, as is the affinity key (X-Cellm-Affinity).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "serve.h"

typedef enum route_id {
    R_PAGE,
    R_HEALTH,
    R_MODELS,
    R_MODEL,
    R_CHAT,
    R_COMPLETIONS,
    R_METRICS,
    R_TOKENIZE,
    R_DETOKENIZE,
    R_RESPONSES
} route_id;

typedef struct route {
    const char *path; /* ends in '/' for a prefix */
    const char *method;
    route_id id;
    bool open; /* needs no API key */
} route;

static const route routes[] = {
    {"/", "GET", R_PAGE, true},
    {"/health", "GET", R_HEALTH, true},
    {"/v1/health", "GET", R_HEALTH, true},
    {"/v1/models", "GET", R_MODELS, false},
    {"/models", "GET", R_MODELS, false},
    {"/v1/models/", "GET", R_MODEL, false},
    {"/v1/chat/completions", "POST", R_CHAT, false},
    {"/chat/completions", "POST", R_CHAT, false},
    {"/v1/completions", "POST", R_COMPLETIONS, false},
    {"/completions", "POST", R_COMPLETIONS, false},
    {"/metrics", "GET", R_METRICS, false},
    {"/tokenize", "POST", R_TOKENIZE, false},
    {"/detokenize", "POST", R_DETOKENIZE, false},
    {"/v1/responses", "POST", R_RESPONSES, false},
    {"/responses", "POST", R_RESPONSES, false},
};

/* Per request: the body as it arrives, and what the log line needs. */
typedef struct conn_ctx {
    const route *rt;
    char *body;
    size_t len, cap;
    bool replied; /* a reply was queued before the body was read */
    bool too_big; /* the body passed the limit: skipped, then refused */
    bool counted; /* counts in s->active */
    size_t skipped;
    int status; /* of the reply queued, 0 before */
    double t0;  /* monotonic seconds at the headers */
    char method[8];
    char path[96];
    char id[SERVE_ID_MAX + 1];
    char affinity[SERVE_AFFINITY_MAX];
} conn_ctx;

/* The request this connection's thread is handling (libmicrohttpd runs each
 * connection on its own thread, and a reply is queued on that thread while
 * the request's callback runs), so replies made deep in a handler get its
 * id and affinity headers. NULL outside a callback. */
static _Thread_local conn_ctx *current;

void http_set_affinity(const char *key) {
    if (current) snprintf(current->affinity, sizeof current->affinity, "%s", key);
}

/* ------------------------------------------------------------- replies */

void http_count_status(server *s, int status) {
    if (current) current->status = status;
    atomic_ullong *c = status >= 200 && status < 300   ? &s->c.http_2xx
                       : status >= 400 && status < 500 ? &s->c.http_4xx
                       : status >= 500                 ? &s->c.http_5xx
                                                       : &s->c.http_other;
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* The request's Origin when the operator allowed it, else NULL. */
static const char *allowed_origin(server *s, struct MHD_Connection *conn) {
    const char *origin = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin");
    if (!origin) return NULL;
    for (int i = 0; i < s->o.n_cors; i++)
        if (!strcmp(s->o.cors[i], "*") || !strcmp(s->o.cors[i], origin)) return origin;
    return NULL;
}

void http_add_headers(server *s, struct MHD_Connection *conn, void *response) {
    struct MHD_Response *r = response;
    const char *origin = allowed_origin(s, conn);
    if (origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (current && current->id[0]) MHD_add_response_header(r, "X-Request-Id", current->id);
    if (current && current->affinity[0])
        MHD_add_response_header(r, "X-Cellm-Affinity", current->affinity);
    /* A draining server wants no more requests on this connection. */
    if (atomic_load(&s->state) == SERVE_DRAINING)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
}

int http_reply(server *s, struct MHD_Connection *conn, int status, const char *ctype,
               const char *body, size_t len, int retry_after) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    if (ctype) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", retry_after);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    http_add_headers(s, conn, r);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES) http_count_status(s, status);
    return ret;
}

int http_reply_json(server *s, struct MHD_Connection *conn, int status, void *json) {
    char *text = json ? cJSON_PrintUnformatted(json) : NULL;
    cJSON_Delete(json);
    if (!text) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}";
        return http_reply(s, conn, 500, "application/json", oom, sizeof oom - 1, 0);
    }
    int ret = http_reply(s, conn, status, "application/json", text, strlen(text), 0);
    free(text);
    return ret;
}

/* {"error": {"message", "type", "param", "code"}} as OpenAI sends it. */
static cJSON *error_json(const serve_err *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->msg);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code)
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    return root;
}

int http_reply_error(server *s, struct MHD_Connection *conn, const serve_err *e) {
    if (s->o.verbose) fprintf(stderr, "cellm serve: %d %s\n", e->status, e->msg);
    cJSON *j = error_json(e);
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!text) return http_reply_json(s, conn, 500, NULL);
    int ret = http_reply(s, conn, e->status, "application/json", text, strlen(text),
                         e->status == 503 ? 1 : 0);
    free(text);
    return ret;
}

/* ------------------------------------------------------------- checks */

/* Compares in time that depends only on the lengths, not on where the
 * strings differ, so the key cannot be guessed byte by byte. */
static bool same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = la != lb;
    for (size_t i = 0; i < lb; i++) diff |= (unsigned char)(b[i] ^ (i < la ? a[i] : 0));
    return diff == 0;
}

static bool authorized(server *s, struct MHD_Connection *conn) {
    if (!s->o.api_key) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return false;
    h += 7;
    while (*h == ' ') h++;
    return same_secret(h, s->o.api_key);
}

static const route *find_route(const char *url, const char *method, bool *path_known) {
    *path_known = false;
    if (!strcmp(method, "HEAD")) method = "GET";
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        const route *r = &routes[i];
        size_t n = strlen(r->path);
        bool match = r->path[n - 1] == '/' && n > 1
                         ? !strncmp(url, r->path, n) && url[n] && !strchr(url + n, '/')
                         : !strcmp(url, r->path);
        if (!match) continue;
        *path_known = true;
        if (!strcmp(method, r->method)) return r;
    }
    return NULL;
}

/* Replies to a CORS preflight. */
static int preflight(server *s, struct MHD_Connection *conn) {
    serve_err e;
    if (!allowed_origin(s, conn)) {
        serr(&e, 403, "cors_forbidden", NULL, "this origin is not allowed (see --cors-origin)");
        return http_reply_error(s, conn, &e);
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    http_add_headers(s, conn, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(conn, 204, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES) http_count_status(s, 204);
    return ret;
}

/* The client's X-Request-Id when it is short printable ASCII, else a new
 * random one, into cx->id. */
static void request_id(server *s, struct MHD_Connection *conn, conn_ctx *cx) {
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
    if (v && serve_plain_id(v))
        memcpy(cx->id, v, strlen(v) + 1);
    else
        snprintf(cx->id, sizeof cx->id, "%016llx%016llx", (unsigned long long)serve_random(s),
                 (unsigned long long)serve_random(s));
}

/* Whether the server's state lets this route in: while loading only
 * /health, while draining /health and /metrics. A request let in counts in
 * s->active until it completes; it is counted before the state is read, so
 * the drain, which sets the state before it reads the count, cannot miss
 * it. */
static bool state_admits(server *s, conn_ctx *cx, serve_err *e) {
    if (cx->rt->id == R_HEALTH) return true;
    bool api = cx->rt->id != R_METRICS;
    if (api) {
        atomic_fetch_add(&s->active, 1);
        cx->counted = true;
    }
    int st = atomic_load(&s->state);
    if (st == SERVE_READY || (st == SERVE_DRAINING && !api)) return true;
    if (api) {
        atomic_fetch_sub(&s->active, 1);
        cx->counted = false;
    }
    if (st == SERVE_LOADING)
        return serr(e, 503, "loading", NULL, "the server is loading its model; retry shortly");
    return serr(e, 503, "draining", NULL,
                "the server is shutting down and takes no new requests; retry on another");
}

/* The checks that need only the headers. Returns true when the request
 * may go on; otherwise a reply is queued (*ret says how that went). */
static bool admit(server *s, struct MHD_Connection *conn, const char *url, const char *method,
                  conn_ctx *cx, int *ret) {
    serve_err e;
    bool known;
    cx->t0 = serve_now();
    snprintf(cx->method, sizeof cx->method, "%s", method);
    snprintf(cx->path, sizeof cx->path, "%s", url);
    request_id(s, conn, cx);
    cx->rt = find_route(url, method, &known);
    if (!cx->rt) {
        if (known && !strcmp(method, "OPTIONS")) {
            *ret = preflight(s, conn);
        } else if (known) {
            serr(&e, 405, "method_not_allowed", NULL, "%s is not allowed on %s", method, url);
            *ret = http_reply_error(s, conn, &e);
        } else {
            serr(&e, 404, "not_found", NULL, "no such endpoint: %s %s", method, url);
            *ret = http_reply_error(s, conn, &e);
        }
        return false;
    }
    if (!cx->rt->open && !authorized(s, conn)) {
        serr(&e, 401, "invalid_api_key", NULL,
             "a valid API key is needed: send the header 'Authorization: Bearer KEY'");
        e.type = "authentication_error";
        *ret = http_reply_error(s, conn, &e);
        return false;
    }
    if (!state_admits(s, cx, &e)) {
        *ret = http_reply_error(s, conn, &e);
        return false;
    }
    const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
    if (cl) {
        char *end;
        unsigned long long n = strtoull(cl, &end, 10);
        if (*end || n > s->o.max_body) {
            serr(&e, 413, "request_too_large", NULL,
                 "the request body is over the limit of %zu bytes", s->o.max_body);
            *ret = http_reply_error(s, conn, &e);
            return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------- dispatch */

static int dispatch(server *s, struct MHD_Connection *conn, const char *url, conn_ctx *cx) {
    switch (cx->rt->id) {
    case R_PAGE:
        atomic_fetch_add_explicit(&s->c.other_routes, 1, memory_order_relaxed);
        return http_reply(s, conn, 200, "text/html; charset=utf-8", serve_page_html,
                          strlen(serve_page_html), 0);
    case R_HEALTH: {
        atomic_fetch_add_explicit(&s->c.other_routes, 1, memory_order_relaxed);
        int st = atomic_load(&s->state);
        const char *text = st == SERVE_READY     ? "{\"status\":\"ok\"}"
                           : st == SERVE_LOADING ? "{\"status\":\"loading\"}"
                                                 : "{\"status\":\"draining\"}";
        return http_reply(s, conn, st == SERVE_READY ? 200 : 503, "application/json", text,
                          strlen(text), st == SERVE_READY ? 0 : 1);
    }
    case R_MODELS: return oai_models(s, conn, NULL);
    case R_MODEL: return oai_models(s, conn, url + strlen("/v1/models/"));
    case R_CHAT:
        atomic_fetch_add_explicit(&s->c.chat, 1, memory_order_relaxed);
        return oai_completions(s, conn, SERVE_CHAT, cx->body, cx->len);
    case R_COMPLETIONS:
        atomic_fetch_add_explicit(&s->c.completions, 1, memory_order_relaxed);
        return oai_completions(s, conn, SERVE_COMPLETION, cx->body, cx->len);
    case R_METRICS: {
        atomic_fetch_add_explicit(&s->c.other_routes, 1, memory_order_relaxed);
        char *text = metrics_text(s);
        if (!text) return http_reply_json(s, conn, 500, NULL);
        int ret = http_reply(s, conn, 200, "text/plain; version=0.0.4", text, strlen(text), 0);
        free(text);
        return ret;
    }
    case R_TOKENIZE: return oai_tokenize(s, conn, cx->body, cx->len);
    case R_DETOKENIZE: return oai_detokenize(s, conn, cx->body, cx->len);
    case R_RESPONSES:
        atomic_fetch_add_explicit(&s->c.responses, 1, memory_order_relaxed);
        return oai_responses(s, conn, cx->body, cx->len);
    }
    return MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_size, void **req_cls) {
    (void)version;
    server *s = cls;
    conn_ctx *cx = *req_cls;
    if (!cx) {
        cx = calloc(1, sizeof *cx);
        if (!cx) return MHD_NO;
        *req_cls = cx;
        int ret = MHD_YES;
        current = cx;
        if (!admit(s, conn, url, method, cx, &ret)) cx->replied = true;
        current = NULL;
        return (enum MHD_Result)ret;
    }
    if (cx->replied) { /* refused early: drop whatever body still comes */
        *upload_size = 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cx->too_big || n > s->o.max_body - cx->len) {
            /* libmicrohttpd can reply only once the body is in: skip the
             * rest, unless there is far too much of it to wait for. */
            cx->too_big = true;
            cx->skipped += n;
            return cx->skipped > 4 * s->o.max_body + (1u << 20) ? MHD_NO : MHD_YES;
        }
        if (cx->len + n + 1 > cx->cap) {
            size_t cap = (cx->len + n + 1) * 2;
            if (cap > s->o.max_body + 1) cap = s->o.max_body + 1;
            char *p = realloc(cx->body, cap);
            if (!p) return MHD_NO;
            cx->body = p;
            cx->cap = cap;
        }
        memcpy(cx->body + cx->len, upload, n);
        cx->len += n;
        cx->body[cx->len] = '\0';
        return MHD_YES;
    }
    current = cx;
    int ret;
    if (cx->too_big) {
        serve_err e;
        serr(&e, 413, "request_too_large", NULL, "the request body is over the limit of %zu bytes",
             s->o.max_body);
        ret = http_reply_error(s, conn, &e);
    } else {
        ret = dispatch(s, conn, url, cx);
    }
    cx->replied = true;
    current = NULL;
    return (enum MHD_Result)ret;
}

/* One line per API request (not /health, /metrics): its id, method, path,
 * status (0: no reply, the client left), time and affinity key. */
static void log_request(server *s, const conn_ctx *cx, enum MHD_RequestTerminationCode toe) {
    if (!(s->o.log_requests || s->o.verbose) || !cx->rt || cx->rt->id == R_HEALTH ||
        cx->rt->id == R_METRICS)
        return;
    fprintf(stderr, "cellm serve: request %s %s %s %d %.1f ms%s%s%s\n", cx->id, cx->method,
            cx->path, cx->status, (serve_now() - cx->t0) * 1e3,
            toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (cut off)",
            cx->affinity[0] ? " affinity=" : "", cx->affinity);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                         enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    (void)conn;
    conn_ctx *cx = *req_cls;
    if (!cx) return;
    log_request(s, cx, toe);
    if (cx->counted) atomic_fetch_sub(&s->active, 1);
    free(cx->body);
    free(cx);
    *req_cls = NULL;
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    server *s = cls;
    if (!s->o.verbose) return;
    fputs("cellm serve (http): ", stderr);
    vfprintf(stderr, fmt, ap);
}

/* ------------------------------------------------------------- daemon */

bool http_start(server *s, char *err, size_t cap) {
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", s->o.port);
    int rc = getaddrinfo(s->o.host, port, &hints, &ai);
    if (rc != 0 || !ai) {
        snprintf(err, cap, "cannot resolve host '%s': %s", s->o.host, gai_strerror(rc));
        return false;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(flags, (uint16_t)s->o.port, NULL, NULL, on_request, s,
                                 MHD_OPTION_EXTERNAL_LOGGER, on_log, s, MHD_OPTION_SOCK_ADDR,
                                 ai->ai_addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_conns,
                                 MHD_OPTION_CONNECTION_TIMEOUT, s->o.idle_s,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        snprintf(err, cap, "cannot listen on %s:%d (in use? run with -v for details)", s->o.host,
                 s->o.port);
        return false;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->o.port;
    return true;
}

void http_stop(server *s) {
    if (!s->daemon) return;
    MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}

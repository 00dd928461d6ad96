/*
 * test_serve.c — `cellm serve` in process, on an ephemeral loopback port,
 * with the real SmolLM2 model, driven through raw sockets so that any bytes
 * can be sent:
 *  - the endpoints answer in OpenAI's shapes (health, models, chat and
 *    completions whole and streamed, tokenize, detokenize, metrics);
 *  - more than 40 malformed or hostile requests each get their status
 *    (broken JSON, wrong types, huge bodies, missing fields, bad ranges,
 *    invalid UTF-8, unknown routes, wrong API key, slow-loris) while
 *    another client keeps being served;
 *  - a client that goes away mid-request has its KV blocks freed;
 *  - 32 concurrent streaming clients all complete, after which /metrics
 *    shows every KV block free and the process's memory back at its level.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include <cmocka.h>
#include <math.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cjson/cJSON.h>

#include "serve.h"
#include "test_common.h"

#define KEY "test-key-123"
#define IDLE_S 2

static server *srv;

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ a raw client */

static int connect_srv(double timeout_s) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct timeval tv = {(time_t)timeout_s, (suseconds_t)((timeout_s - (time_t)timeout_s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)srv->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return; /* the server may close early (413): fine */
        p += k;
        n -= (size_t)k;
    }
}

/* Reads until the server closes (or the timeout); a new buffer. */
static char *recv_all(int fd, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        if (cap - n < 4096) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
        ssize_t k = recv(fd, buf + n, cap - n - 1, 0);
        if (k <= 0) break;
        n += (size_t)k;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Undoes chunked transfer coding in place. */
static void dechunk(char *body) {
    char *in = body, *out = body;
    for (;;) {
        char *end;
        unsigned long n = strtoul(in, &end, 16);
        char *data = strstr(end, "\r\n");
        if (!data || n == 0) break;
        data += 2;
        memmove(out, data, n);
        out += n;
        in = data + n + 2;
    }
    *out = '\0';
}

typedef struct reply {
    int status; /* 0: the server closed without a reply */
    char *raw;  /* the whole response */
    char *body; /* into raw, dechunked */
} reply;

/* Sends raw bytes on a new connection and reads the reply. */
static reply http_raw(const char *req, size_t len, double timeout_s) {
    int fd = connect_srv(timeout_s);
    send_all(fd, req, len);
    reply r = {0, NULL, NULL};
    size_t n;
    r.raw = recv_all(fd, &n);
    close(fd);
    sscanf(r.raw, "HTTP/1.%*d %d", &r.status);
    char *b = strstr(r.raw, "\r\n\r\n");
    r.body = b ? b + 4 : r.raw + n;
    if (b && strstr(r.raw, "Transfer-Encoding: chunked") &&
        strstr(r.raw, "Transfer-Encoding: chunked") < b)
        dechunk(r.body);
    return r;
}

/* A request with a body (NULL: none), extra header lines (NULL: none) and
 * the API key unless `key` says otherwise ("" for none). */
static reply http_ex(const char *method, const char *path, const char *key, const char *extra,
                     const char *body) {
    size_t blen = body ? strlen(body) : 0;
    size_t cap = blen + 2048;
    char *req = malloc(cap);
    assert_non_null(req);
    if (!key) key = KEY;
    char auth[256] = "";
    if (*key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", key);
    int n = snprintf(req, cap,
                     "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s%s"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     method, path, auth, extra ? extra : "", blen);
    if (body) memcpy(req + n, body, blen);
    reply r = http_raw(req, (size_t)n + blen, 120);
    free(req);
    return r;
}

static reply http(const char *method, const char *path, const char *key, const char *body) {
    return http_ex(method, path, key, NULL, body);
}

static void reply_free(reply *r) {
    free(r->raw);
}

/* The value of metric `name` in /metrics. */
static double metric(const char *name) {
    reply r = http("GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    char pat[128];
    snprintf(pat, sizeof pat, "\n%s ", name);
    const char *p = strstr(r.body, pat);
    if (!p) print_error("no metric %s in:\n%s\n", name, r.body);
    assert_non_null(p);
    double v = strtod(p + strlen(pat), NULL);
    reply_free(&r);
    return v;
}

/* Waits up to `s` seconds for every KV block to be free again. */
static void wait_idle(double s) {
    double t0 = now_s();
    while (metric("cellm_kv_blocks_used") != 0 || metric("cellm_requests_in_flight") != 0) {
        if (now_s() - t0 > s) fail_msg("the server did not return to idle in %.0f s", s);
        sleep_ms(50);
    }
}

/* ------------------------------------------------------------ setup */

static int setup(void **st) {
    (void)st;
    static char path[1024];
    test_model_path("smollm2-135m", path, sizeof path);
    serve_opts o = serve_default_opts();
    o.model = path;
    o.alias = "smollm2";
    o.port = 0;
    o.api_key = KEY;
    o.max_body = 64 * 1024;
    o.idle_s = IDLE_S;
    o.timeout_s = 300;
    o.max_queue = 64;
    o.max_conns = 128;
    o.temperature = 0;
    o.engine.max_ctx = 512;
    o.engine.max_seqs = 16;
    o.engine.n_threads = 2;
    o.cors[o.n_cors++] = "http://allowed.example";
    char err[1024];
    srv = serve_start(&o, err, sizeof err);
    if (!srv) print_error("serve_start: %s\n", err);
    return srv ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    serve_stop(srv);
    srv = NULL;
    return 0;
}

/* ------------------------------------------------------------ endpoints */

static void test_asan_endpoints(void **st) {
    (void)st;
    reply r = http("GET", "/health", "", NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"ok\""));
    reply_free(&r);

    r = http("GET", "/v1/models", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"id\":\"smollm2\""));
    reply_free(&r);
    r = http("GET", "/v1/models/smollm2", NULL, NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);

    r = http("POST", "/v1/chat/completions", NULL,
             "{\"model\":\"smollm2\",\"messages\":[{\"role\":\"user\",\"content\":\"What is "
             "2+2?\"}],\"max_tokens\":24}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "\"object\":\"chat.completion\""));
    assert_non_null(strstr(r.body, "\"role\":\"assistant\""));
    assert_non_null(strstr(r.body, "4"));
    assert_non_null(strstr(r.body, "\"finish_reason\":\"stop\""));
    assert_non_null(strstr(r.body, "\"prompt_tokens\":"));
    reply_free(&r);

    r = http("POST", "/v1/completions", NULL,
             "{\"prompt\":\"The capital of France is\",\"max_tokens\":3,\"stream\":true,"
             "\"stream_options\":{\"include_usage\":true}}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.raw, "Content-Type: text/event-stream"));
    assert_non_null(strstr(r.body, "Paris"));
    assert_non_null(strstr(r.body, "\"finish_reason\":\"length\""));
    assert_non_null(strstr(r.body, "\"completion_tokens\":3"));
    const char *done = strstr(r.body, "data: [DONE]\n\n");
    assert_non_null(done);
    assert_string_equal(done, "data: [DONE]\n\n");
    reply_free(&r);

    r = http("POST", "/tokenize", NULL, "{\"content\":\"Hello world\"}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "{\"tokens\":[19556,905]}"));
    reply_free(&r);
    r = http("POST", "/detokenize", NULL, "{\"tokens\":[19556,905]}");
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "{\"content\":\"Hello world\"}"));
    reply_free(&r);

    r = http("GET", "/metrics", NULL, NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.body, "# TYPE cellm_kv_blocks_free gauge\n"));
    assert_non_null(strstr(r.body, "# TYPE cellm_kv_blocks_cached gauge\n"));
    assert_non_null(strstr(r.body, "# TYPE cellm_prefix_cache_tokens_total counter\n"));
    assert_non_null(strstr(r.body, "cellm_requests_total{endpoint=\"chat_completions\"}"));
    reply_free(&r);

    r = http("GET", "/", "", NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.raw, "text/html"));
    assert_non_null(strstr(r.body, "/v1/chat/completions"));
    reply_free(&r);
}

/* The draft model's file in the store (scripts/test.sh makes it with
 * `cellm quantize smollm2-135m ... Q4_0`). */
static const char *draft_path(char *buf, size_t cap) {
    const char *home = getenv("CELLM_HOME");
    if (home && *home)
        snprintf(buf, cap, "%s/models/smollm2-135m-q4_0.gguf", home);
    else
        snprintf(buf, cap, "%s/.cache/cellm/models/smollm2-135m-q4_0.gguf",
                 getenv("HOME") ? getenv("HOME") : "");
    if (access(buf, R_OK) != 0) {
        print_error("draft model %s not found: scripts/test.sh makes it (cellm quantize "
                    "smollm2-135m %s Q4_0)\n",
                    buf, buf);
        fail();
    }
    return buf;
}

/* The command line refuses bad flags before loading anything. */
static void test_asan_cli(void **st) {
    (void)st;
    static const struct {
        const char *args;
        int rc;
        const char *msg;
    } cases[] = {
        {"--bogus", 2, "unknown option '--bogus'"},
        {"--port", 2, "--port needs a value"},
        {"--port 70000", 2, "--port needs a whole number"},
        {"--mem-budget lots", 2, "--mem-budget needs a size"},
        {"--temp 3", 2, "--temp needs a number from 0 to 2"},
        {"--api-key ''", 2, "must not be empty"},
        {"a.gguf b.gguf", 2, "more than one model"},
        {"/nonexistent/model.gguf --port 0", 1, "model"},
        {"--model-draft", 2, "--model-draft needs a value"},
        {"--draft-max 0", 2, "--draft-max needs a whole number from 1 to 64"},
        {"--draft-max 4", 2, "needs --model-draft or --lookup"},
        {"--lookup 2 --draft-min 5 --draft-max 4", 2, "must not exceed --draft-max"},
        {"--lookup 2 --draft-p-min 1.5", 2, "--draft-p-min needs a number from 0 to 1"},
        {"-md /nonexistent/draft.gguf --port 0", 1, "draft model: no such model file"},
        {"-md smollm2-135m --port 0", 1, "the draft model is the model's own file"},
        /* The engine's reasons, at start: another family; over the budget. */
        {"-md %G --port 0", 1, "a draft must be of the same family"},
        {"-md %D -c 512 -np 2 --mem-budget 160M --port 0", 1,
         "a process budget of 160 MiB cannot hold 2 sequences"},
    };
    char gemma[1024], draft[1024];
    test_model_path("gemma3-270m", gemma, sizeof gemma);
    draft_path(draft, sizeof draft);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char cmd[4096], args[3072], *out;
        /* %G and %D: the Gemma 3 model and the SmolLM2 draft's paths. */
        const char *a = cases[i].args, *mark = strchr(a, '%');
        if (mark)
            snprintf(args, sizeof args, "%.*s'%s'%s", (int)(mark - a), a,
                     mark[1] == 'G' ? gemma : draft, mark + 2);
        else
            snprintf(args, sizeof args, "%s", a);
        snprintf(cmd, sizeof cmd, "'%s' serve %s 2>&1", test_cellm_bin(), args);
        int rc = test_run_cmd(cmd, &out);
        if (rc != cases[i].rc || !strstr(out, cases[i].msg))
            fail_msg("cellm serve %s: want %d and '%s', got %d: %s", cases[i].args, cases[i].rc,
                     cases[i].msg, rc, out);
        free(out);
    }
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "'%s' serve --help", test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "--api-key"));
    free(out);
}

/* CORS headers only for the origins the operator named. */
static void test_asan_cors(void **st) {
    (void)st;
    const char *pre = "Origin: http://allowed.example\r\nAccess-Control-Request-Method: POST\r\n"
                      "Access-Control-Request-Headers: authorization, content-type\r\n";
    reply r = http_ex("OPTIONS", "/v1/chat/completions", "", pre, NULL);
    assert_int_equal(r.status, 204);
    assert_non_null(strstr(r.raw, "Access-Control-Allow-Origin: http://allowed.example\r\n"));
    assert_non_null(strstr(r.raw, "Access-Control-Allow-Headers: Authorization, Content-Type"));
    reply_free(&r);
    r = http_ex("OPTIONS", "/v1/chat/completions", "", "Origin: http://evil.example\r\n", NULL);
    assert_int_equal(r.status, 403);
    assert_null(strstr(r.raw, "Access-Control-Allow-Origin"));
    reply_free(&r);
    r = http_ex("GET", "/v1/models", NULL, "Origin: http://allowed.example\r\n", NULL);
    assert_int_equal(r.status, 200);
    assert_non_null(strstr(r.raw, "Access-Control-Allow-Origin: http://allowed.example\r\n"));
    reply_free(&r);
    r = http_ex("GET", "/v1/models", NULL, "Origin: http://evil.example\r\n", NULL);
    assert_int_equal(r.status, 200);
    assert_null(strstr(r.raw, "Access-Control-Allow-Origin"));
    reply_free(&r);
    /* Errors carry the header too, so a page can read them. */
    r = http_ex("GET", "/v1/models", "wrong", "Origin: http://allowed.example\r\n", NULL);
    assert_int_equal(r.status, 401);
    assert_non_null(strstr(r.raw, "Access-Control-Allow-Origin: http://allowed.example\r\n"));
    reply_free(&r);
}

/* ------------------------------------------------------------ hostile input */

typedef struct bad_case {
    const char *name;
    const char *method, *path, *key, *body;
    int status;
    const char *expect; /* in the body, or NULL */
} bad_case;

#define CHAT "/v1/chat/completions"
#define CMPL "/v1/completions"
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static const bad_case bad_cases[] = {
    {"broken JSON", "POST", CHAT, NULL, "{\"messages\":", 400, "invalid_json"},
    {"trailing junk", "POST", CHAT, NULL, "{" MSG "} xyz", 400, "invalid_json"},
    {"not an object", "POST", CHAT, NULL, "[1,2,3]", 400, "JSON object"},
    {"empty body", "POST", CHAT, NULL, "", 400, "no body"},
    {"JSON null", "POST", CHAT, NULL, "null", 400, "invalid_json"},
    {"messages missing", "POST", CHAT, NULL, "{\"model\":\"smollm2\"}", 400, "'messages'"},
    {"messages a string", "POST", CHAT, NULL, "{\"messages\":\"hi\"}", 400, "invalid_type"},
    {"messages empty", "POST", CHAT, NULL, "{\"messages\":[]}", 400, "invalid_value"},
    {"message not an object", "POST", CHAT, NULL, "{\"messages\":[42]}", 400, "messages[0]"},
    {"role missing", "POST", CHAT, NULL, "{\"messages\":[{\"content\":\"hi\"}]}", 400,
     "messages[0].role"},
    {"role unknown", "POST", CHAT, NULL, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}",
     400, "messages[0].role"},
    {"content a number", "POST", CHAT, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":7}]}",
     400, "messages[0].content"},
    {"content missing", "POST", CHAT, NULL, "{\"messages\":[{\"role\":\"user\"}]}", 400,
     "messages[0].content"},
    {"image part", "POST", CHAT, NULL,
     "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{}}]}]}",
     400, "--mmproj"},
    {"max_tokens negative", "POST", CHAT, NULL, "{" MSG ",\"max_tokens\":-1}", 400, "max_tokens"},
    {"max_tokens zero", "POST", CHAT, NULL, "{" MSG ",\"max_tokens\":0}", 400, "max_tokens"},
    {"max_tokens huge", "POST", CHAT, NULL, "{" MSG ",\"max_tokens\":1e300}", 400, "max_tokens"},
    {"max_tokens fraction", "POST", CHAT, NULL, "{" MSG ",\"max_tokens\":1.5}", 400, "integer"},
    {"max_tokens a string", "POST", CHAT, NULL, "{" MSG ",\"max_tokens\":\"10\"}", 400, "integer"},
    {"max_completion_tokens huge", "POST", CHAT, NULL, "{" MSG ",\"max_completion_tokens\":99999}",
     400, "max_completion_tokens"},
    {"temperature a string", "POST", CHAT, NULL, "{" MSG ",\"temperature\":\"hot\"}", 400,
     "temperature"},
    {"temperature too high", "POST", CHAT, NULL, "{" MSG ",\"temperature\":5}", 400, "temperature"},
    {"top_p negative", "POST", CHAT, NULL, "{" MSG ",\"top_p\":-0.5}", 400, "top_p"},
    {"top_k fraction", "POST", CHAT, NULL, "{" MSG ",\"top_k\":2.5}", 400, "top_k"},
    {"n zero", "POST", CHAT, NULL, "{" MSG ",\"n\":0}", 400, "'n'"},
    {"n huge", "POST", CHAT, NULL, "{" MSG ",\"n\":100000}", 400, "'n'"},
    {"seed a string", "POST", CHAT, NULL, "{" MSG ",\"seed\":\"abc\"}", 400, "seed"},
    {"stream a string", "POST", CHAT, NULL, "{" MSG ",\"stream\":\"yes\"}", 400, "stream"},
    {"stream_options without stream", "POST", CHAT, NULL,
     "{" MSG ",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options"},
    {"five stop strings", "POST", CHAT, NULL, "{" MSG ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}",
     400, "stop"},
    {"stop a number", "POST", CHAT, NULL, "{" MSG ",\"stop\":[1]}", 400, "stop"},
    {"empty stop string", "POST", CHAT, NULL, "{" MSG ",\"stop\":\"\"}", 400, "stop"},
    {"logit_bias bad key", "POST", CHAT, NULL, "{" MSG ",\"logit_bias\":{\"x\":1}}", 400,
     "logit_bias"},
    {"logit_bias id too big", "POST", CHAT, NULL, "{" MSG ",\"logit_bias\":{\"99999999\":1}}", 400,
     "logit_bias"},
    {"logprobs a string", "POST", CHAT, NULL, "{" MSG ",\"logprobs\":\"yes\"}", 400, "logprobs"},
    {"top_logprobs too high", "POST", CHAT, NULL, "{" MSG ",\"logprobs\":true,\"top_logprobs\":21}",
     400, "top_logprobs"},
    {"top_logprobs negative", "POST", CHAT, NULL, "{" MSG ",\"logprobs\":true,\"top_logprobs\":-1}",
     400, "top_logprobs"},
    {"top_logprobs without logprobs", "POST", CHAT, NULL, "{" MSG ",\"top_logprobs\":2}", 400,
     "top_logprobs"},
    {"completions logprobs too high", "POST", CMPL, NULL, "{\"prompt\":\"a\",\"logprobs\":21}", 400,
     "logprobs"},
    {"completions logprobs a boolean", "POST", CMPL, NULL, "{\"prompt\":\"a\",\"logprobs\":true}",
     400, "logprobs"},
    {"tool without function", "POST", CHAT, NULL, "{" MSG ",\"tools\":[{\"type\":\"function\"}]}",
     400, "tools[0]"},
    {"tools on completions", "POST", CMPL, NULL,
     "{\"prompt\":\"a\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", 400,
     "chat"},
    {"tool_choice without tools", "POST", CHAT, NULL, "{" MSG ",\"tool_choice\":\"required\"}", 400,
     "tool_choice"},
    {"tool_calls on a user turn", "POST", CHAT, NULL,
     "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"tool_calls\":[]}]}", 400, "tool_calls"},
    {"tool schema bad", "POST", CHAT, NULL,
     "{" MSG ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
     "{\"type\":\"nope\"}}}]}",
     400, "parameters"},
    {"user a number", "POST", CHAT, NULL, "{" MSG ",\"user\":5}", 400, "user"},
    {"unknown model", "POST", CHAT, NULL, "{" MSG ",\"model\":\"gpt-4\"}", 404, "model_not_found"},
    {"model a number", "POST", CHAT, NULL, "{" MSG ",\"model\":4}", 400, "model"},
    {"prompt missing", "POST", CMPL, NULL, "{\"max_tokens\":3}", 400, "prompt"},
    {"prompt an object", "POST", CMPL, NULL, "{\"prompt\":{}}", 400, "prompt"},
    {"prompt mixed array", "POST", CMPL, NULL, "{\"prompt\":[\"a\",[1,2]]}", 400, "prompt"},
    {"prompt token out of range", "POST", CMPL, NULL, "{\"prompt\":[1,2,999999]}", 400, "0..49151"},
    {"prompt token negative", "POST", CMPL, NULL, "{\"prompt\":[-3]}", 400, "prompt"},
    {"prompt empty", "POST", CMPL, NULL, "{\"prompt\":\"\"}", 400, "prompt"},
    {"echo a number", "POST", CMPL, NULL, "{\"prompt\":[1,2],\"echo\":1}", 400, "echo"},
    {"completions max_tokens negative", "POST", CMPL, NULL, "{\"prompt\":\"a\",\"max_tokens\":-1}",
     400, "max_tokens"},
    {"suffix", "POST", CMPL, NULL, "{\"prompt\":\"a\",\"suffix\":\"b\"}", 400, "suffix"},
    {"unknown route", "GET", "/v2/nothing", NULL, NULL, 404, "not_found"},
    {"path traversal", "GET", "/../../etc/passwd", NULL, NULL, 404, NULL},
    {"model id with slash", "GET", "/v1/models/a/b", NULL, NULL, 404, NULL},
    {"unknown model id", "GET", "/v1/models/nope", NULL, NULL, 404, "model_not_found"},
    {"wrong method", "DELETE", CHAT, NULL, NULL, 405, "not allowed"},
    {"GET on a POST route", "GET", CHAT, NULL, NULL, 405, "not allowed"},
    {"no API key", "POST", CHAT, "", "{" MSG "}", 401, "invalid_api_key"},
    {"wrong API key", "POST", CHAT, "test-key-124", "{" MSG "}", 401, "invalid_api_key"},
    {"API key prefix", "POST", CHAT, "test-key-12", "{" MSG "}", 401, "invalid_api_key"},
    {"API key longer", "POST", CHAT, "test-key-1234", "{" MSG "}", 401, "invalid_api_key"},
    {"metrics without key", "GET", "/metrics", "", NULL, 401, NULL},
    {"tokenize a number", "POST", "/tokenize", NULL, "{\"content\":5}", 400, "content"},
    {"tokenize not JSON", "POST", "/tokenize", NULL, "hello", 400, "JSON"},
    {"detokenize bad id", "POST", "/detokenize", NULL, "{\"tokens\":[1,-1]}", 400, "tokens"},
    {"detokenize a string", "POST", "/detokenize", NULL, "{\"tokens\":\"1 2\"}", 400, "tokens"},
};

/* A body that is valid JSON nested far deeper than cJSON allows. */
static char *deep_json(size_t depth) {
    char *b = malloc(2 * depth + 64);
    assert_non_null(b);
    size_t n = (size_t)sprintf(b, "{\"messages\":");
    for (size_t i = 0; i < depth; i++) b[n++] = '[';
    for (size_t i = 0; i < depth; i++) b[n++] = ']';
    b[n++] = '}';
    b[n] = '\0';
    return b;
}

/* A prompt longer than the test server's context of 512 positions. */
static char *long_prompt(void) {
    char *b = malloc(20000);
    assert_non_null(b);
    size_t n = (size_t)sprintf(b, "{\"prompt\":\"");
    for (int i = 0; i < 1500; i++) n += (size_t)sprintf(b + n, "word ");
    sprintf(b + n, "\",\"max_tokens\":4}");
    return b;
}

/* The bystander: keeps sending small valid requests while the hostile
 * ones run; every one of them must succeed. */
typedef struct bystander {
    atomic_bool stop;
    int ok, failed;
} bystander;

static void *bystander_main(void *arg) {
    bystander *b = arg;
    while (!atomic_load(&b->stop)) {
        reply r = http("POST", CHAT, NULL,
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"Say hi\"}],"
                       "\"max_tokens\":4}");
        if (r.status == 200 && strstr(r.body, "\"chat.completion\""))
            b->ok++;
        else
            b->failed++;
        reply_free(&r);
    }
    return NULL;
}

static int n_failed;

/* Checks a reply; a failure is counted (so the bystander is always
 * stopped before the test fails). Every error is OpenAI's JSON error. */
static void expect(const char *name, reply r, int status, const char *text) {
    bool ok = r.status == status && (!text || strstr(r.body, text)) &&
              (status < 400 || strstr(r.body, "{\"error\":{\"message\":"));
    if (!ok) {
        print_error("%s: want %d with '%s', got %d: %.300s\n", name, status, text ? text : "",
                    r.status, r.raw);
        n_failed++;
    }
}

static void expect_true(const char *name, bool ok) {
    if (!ok) {
        print_error("%s: failed\n", name);
        n_failed++;
    }
}

/* Raw requests no JSON client would send. */
static void hostile_raw(void) {
    char req[512];
    /* A body declared far over the limit: refused before it is sent. */
    snprintf(req, sizeof req,
             "POST " CHAT " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " KEY
             "\r\nContent-Length: 100000000\r\n\r\n{");
    reply r = http_raw(req, strlen(req), 10);
    expect("huge Content-Length", r, 413, "request_too_large");
    reply_free(&r);

    /* A chunked body that grows past the limit. */
    size_t big = 256 * 1024; /* 50 chunks of 4 KiB and their framing */
    char *b = malloc(big + 512);
    assert_non_null(b);
    int n = snprintf(b, 512,
                     "POST " CHAT " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " KEY
                     "\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n");
    size_t len = (size_t)n;
    for (int i = 0; i < 50; i++) {
        len += (size_t)sprintf(b + len, "1000\r\n");
        memset(b + len, 'a', 4096);
        len += 4096;
        len += (size_t)sprintf(b + len, "\r\n");
    }
    len += (size_t)sprintf(b + len, "0\r\n\r\n");
    r = http_raw(b, len, 10);
    expect("huge chunked body", r, 413, "request_too_large");
    reply_free(&r);
    free(b);

    /* Deep nesting within the size limit. */
    char *deep = deep_json(20000);
    r = http("POST", CHAT, NULL, deep);
    expect("deep nesting", r, 400, "invalid_json");
    reply_free(&r);
    free(deep);

    /* A prompt longer than the context. */
    char *lp = long_prompt();
    r = http("POST", CMPL, NULL, lp);
    expect("prompt over the context", r, 400, "context_length_exceeded");
    reply_free(&r);
    free(lp);

    /* Invalid UTF-8 (a lone continuation byte, an overlong, a surrogate). */
    static const char *const bad_utf8[] = {
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\x80\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\xC0\xAF\"}]}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\xED\xA0\x80\"}]}",
        "{\"prompt\":\"abc\xF5\x80\x80\x80\"}",
    };
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof *bad_utf8; i++) {
        r = http("POST", i == 3 ? CMPL : CHAT, NULL, bad_utf8[i]);
        expect("invalid UTF-8", r, 400, "UTF-8");
        reply_free(&r);
    }

    /* A NUL byte inside the body. */
    static const char nul_body[] = "{\"messages\":[{\"role\":\"user\",\0\"content\":\"hi\"}]}";
    n = snprintf(req, sizeof req,
                 "POST " CHAT " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " KEY
                 "\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n",
                 sizeof nul_body - 1);
    memcpy(req + n, nul_body, sizeof nul_body - 1);
    r = http_raw(req, (size_t)n + sizeof nul_body - 1, 10);
    expect("NUL in the body", r, 400, "invalid_json");
    reply_free(&r);

    /* Not HTTP at all: libmicrohttpd answers or hangs up; nothing breaks. */
    static const char junk[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS hello?\r\n\r\n";
    r = http_raw(junk, sizeof junk - 1, 10);
    expect_true("TLS hello", r.status == 0 || (r.status >= 400 && r.status < 500));
    reply_free(&r);
    r = http_raw("GET\r\n\r\n", 7, 10);
    expect_true("bare GET", r.status == 0 || (r.status >= 400 && r.status < 500));
    reply_free(&r);

    /* A header far over libmicrohttpd's memory for one request. */
    size_t hl = 100 * 1024;
    char *h = malloc(hl + 256);
    assert_non_null(h);
    n = sprintf(h, "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ");
    memset(h + n, 'b', hl);
    strcpy(h + n + hl, "\r\n\r\n");
    r = http_raw(h, strlen(h), 10);
    expect_true("huge header", r.status == 0 || r.status == 413 || r.status == 431);
    reply_free(&r);
    free(h);
}

/* Slow-loris: connections that send part of a request and stall are cut
 * off after the idle timeout; others are served meanwhile. */
static void slow_loris(void) {
    int fds[8];
    for (int i = 0; i < 8; i++) {
        fds[i] = connect_srv(IDLE_S + 5);
        const char *part = i % 2 ? "POST " CHAT " HTTP/1.1\r\nHost: x\r\nContent-Le"
                                 : "POST " CHAT " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " KEY
                                   "\r\nContent-Length: 50\r\n\r\n{\"messages\":";
        send_all(fds[i], part, strlen(part));
    }
    reply r = http("GET", "/health", "", NULL);
    expect("health during slow-loris", r, 200, "ok"); /* served while they stall */
    reply_free(&r);
    double t0 = now_s();
    for (int i = 0; i < 8; i++) {
        char c;
        ssize_t k = recv(fds[i], &c, 1, 0);
        expect_true("slow-loris closed by the server", k == 0); /* not by our timeout */
        close(fds[i]);
    }
    double waited = now_s() - t0;
    print_message("slow-loris connections closed after %.1f s (idle timeout %d s)\n", waited,
                  IDLE_S);
    expect_true("slow-loris closed in time", waited < IDLE_S + 3);
}

static void test_asan_hostile(void **st) {
    (void)st;
    bystander by = {0};
    atomic_init(&by.stop, false);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, bystander_main, &by), 0);

    size_t n = sizeof bad_cases / sizeof *bad_cases;
    for (size_t i = 0; i < n; i++) {
        const bad_case *c = &bad_cases[i];
        reply r = http(c->method, c->path, c->key, c->body);
        expect(c->name, r, c->status, c->expect);
        reply_free(&r);
    }
    hostile_raw();
    slow_loris();

    atomic_store(&by.stop, true);
    pthread_join(th, NULL);
    assert_int_equal(n_failed, 0);
    print_message("%zu table cases and 16 raw ones refused; the bystander got %d answers, %d "
                  "failures\n",
                  n, by.ok, by.failed);
    assert_int_equal(by.failed, 0);
    assert_true(by.ok >= 1);
    wait_idle(10);
}

/* ------------------------------------------------------------ disconnects */

/* Starts a long request, reads a little, hangs up; the engine must free
 * its blocks. */
static void hang_up(bool stream) {
    double before = metric("cellm_client_disconnects_total");
    char body[256], req[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"temperature\":1,"
             "\"stream\":%s}",
             stream ? "true" : "false");
    int n = snprintf(req, sizeof req,
                     "POST " CMPL " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " KEY
                     "\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(body), body);
    int fd = connect_srv(30);
    send_all(fd, req, (size_t)n);
    double t0 = now_s();
    while (metric("cellm_kv_blocks_used") == 0) { /* the request is running */
        if (now_s() - t0 > 10) fail_msg("the request did not start");
        sleep_ms(20);
    }
    if (stream) {
        char buf[4096];
        assert_true(recv(fd, buf, sizeof buf, 0) > 0); /* the stream has begun */
    }
    close(fd);
    t0 = now_s();
    wait_idle(5);
    print_message("%s: blocks free %.2f s after the client hung up\n",
                  stream ? "stream" : "whole reply", now_s() - t0);
    assert_true(metric("cellm_client_disconnects_total") >= before + 1);
}

static void test_asan_disconnect(void **st) {
    (void)st;
    hang_up(true);
    hang_up(false);
}

/* ------------------------------------------------------------ load */

#define N_CLIENTS 32
#define PER_CLIENT 2

typedef struct client {
    int id, ok, n_requests, max_tokens;
    char err[256];
} client;

static void *client_main(void *arg) {
    client *c = arg;
    for (int k = 0; k < c->n_requests; k++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Count from %d to %d.\"}],"
                 "\"max_tokens\":%d,\"temperature\":0.7,\"seed\":%d,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}}",
                 c->id, c->id + 5, c->max_tokens, c->id * 10 + k);
        reply r = http("POST", CHAT, NULL, body);
        const char *done = strstr(r.body, "data: [DONE]\n\n");
        if (r.status != 200 || !done || !strstr(r.body, "\"finish_reason\":\"") ||
            !strstr(r.body, "\"usage\":{\"prompt_tokens\"") || strstr(r.body, "\"error\""))
            snprintf(c->err, sizeof c->err, "client %d: %d %.200s", c->id, r.status, r.raw);
        else
            c->ok++;
        reply_free(&r);
    }
    return NULL;
}

/* n clients at once, each sending `per` streamed requests one after
 * another; all must complete, and the server must return to idle. */
static void load_round(const char *what, int n, int per, int max_tokens) {
    pthread_t th[N_CLIENTS];
    client cl[N_CLIENTS];
    assert_true(n <= N_CLIENTS);
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        cl[i] = (client){i, 0, per, max_tokens, ""};
        assert_int_equal(pthread_create(&th[i], NULL, client_main, &cl[i]), 0);
    }
    int ok = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (cl[i].err[0]) print_error("%s\n", cl[i].err);
        ok += cl[i].ok;
    }
    print_message("%s: %d of %d streamed requests from %d clients complete in %.1f s\n", what, ok,
                  n * per, n, now_s() - t0);
    assert_int_equal(ok, n * per);
    wait_idle(10);
    assert_int_equal((int)metric("cellm_kv_blocks_free"), (int)metric("cellm_kv_blocks_total"));
    assert_int_equal((int)metric("cellm_streams_open"), 0);
}

/* Bytes the process holds from malloc (every arena, mmapped chunks too);
 * -1 where the C library does not say. */
static double heap_in_use(void) {
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
    struct mallinfo2 mi = mallinfo2();
    return (double)mi.uordblks + (double)mi.hblkhd;
#else
    return -1;
#endif
}

static void test_load(void **st) {
    (void)st;
    load_round("warm-up", N_CLIENTS, PER_CLIENT, 16);
    double rss0 = metric("process_resident_memory_bytes"), heap0 = heap_in_use();
    load_round("load", N_CLIENTS, PER_CLIENT, 16);
    double rss1 = metric("process_resident_memory_bytes"), heap1 = heap_in_use();
    print_message("resident memory after warm-up %.1f MiB, after load %.1f MiB; "
                  "heap in use %.2f MiB, then %.2f MiB\n",
                  rss0 / 1048576, rss1 / 1048576, heap0 / 1048576, heap1 / 1048576);
#if !defined(__SANITIZE_ADDRESS__)
    /* (ASan's quarantine holds freed memory on purpose; LSan checks leaks
     * there.) What malloc hands out must not grow from one round to the
     * next; the resident size moves by several MiB on its own (arenas of
     * the new client threads keep freed pages: 8.8 MiB in one CI run while
     * the heap in use stayed flat), so it has only a loose bound for what
     * malloc does not count. */
    if (heap0 >= 0) assert_true(heap1 <= heap0 + 1.0 * 1048576);
    assert_true(rss1 <= rss0 + 32.0 * 1048576);
#endif
    assert_int_equal((int)metric("cellm_choices_finished_total{reason=\"error\"}"), 0);
}

/* The server's threads under ThreadSanitizer: a few concurrent streams,
 * a whole reply and a stream whose clients hang up, and bad input. */
static void test_tsan_serve(void **st) {
    (void)st;
    load_round("tsan", 3, 1, 2);
    hang_up(true);
    hang_up(false);
    reply r = http("POST", CHAT, NULL, "{\"messages\":[}");
    assert_int_equal(r.status, 400);
    reply_free(&r);
}

/* ------------------------------------------------------------ speculation */

/* The text of every choice of a completion reply, in index order, as one
 * string with the choices separated by "\x1e" (a new buffer). */
static char *choice_texts(const char *body) {
    cJSON *j = cJSON_Parse(body);
    assert_non_null(j);
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    assert_true(cJSON_IsArray(ch));
    int n = cJSON_GetArraySize(ch);
    size_t cap = 1, len = 0;
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(ch, i), "text");
        if (!t)
            t = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, i), "message"),
                                    "content");
        assert_true(cJSON_IsString(t));
        cap += strlen(t->valuestring) + 1;
    }
    char *out = calloc(cap, 1);
    assert_non_null(out);
    for (int i = 0; i < n; i++) { /* choices come in index order */
        cJSON *c = cJSON_GetArrayItem(ch, i), *t = cJSON_GetObjectItem(c, "text");
        if (!t) t = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content");
        assert_int_equal((int)cJSON_GetNumberValue(cJSON_GetObjectItem(c, "index")), i);
        len += (size_t)sprintf(out + len, "%s\x1e", t->valuestring);
    }
    cJSON_Delete(j);
    return out;
}

/* The choices' texts of one request to the server s. */
static char *ask(server *s, const char *path, const char *body) {
    server *keep = srv;
    srv = s;
    reply r = http("POST", path, NULL, body);
    srv = keep;
    if (r.status != 200) fail_msg("%s: %d %.300s", path, r.status, r.raw);
    char *t = choice_texts(r.body);
    reply_free(&r);
    return t;
}

/* A server with a draft model and prompt lookup answers with the plain
 * server's text, greedy and seeded, several requests at once; its
 * /metrics shows guesses made and kept. */
static void test_spec(void **st) {
    (void)st;
    static char model[1024], draft[1024];
    serve_opts o = serve_default_opts();
    o.model = test_model_path("smollm2-135m", model, sizeof model);
    o.draft = draft_path(draft, sizeof draft);
    o.alias = "smollm2";
    o.port = 0;
    o.api_key = KEY;
    o.temperature = 0;
    o.engine.max_ctx = 512;
    o.engine.max_seqs = 4;
    o.engine.n_threads = 2;
    o.engine.lookup_ngram = 2;
    char err[1024];
    server *spec = serve_start(&o, err, sizeof err);
    if (!spec) fail_msg("serve_start with a draft: %s", err);
    /* Four prompts in one request run as four engine requests at once. */
    static const char prompts[] =
        "\"prompt\":[\"The capital of France is\","
        "\"Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown\","
        "\"def fibonacci(n):\\n    if n < 2:\\n        return n\\n    return\","
        "\"Once upon a time, in a small village by the sea,\"]";
    /* Completions of the four prompts, greedy then seeded; a chat. */
    const char *const cases[] = {
        "\"max_tokens\":24,\"temperature\":0",
        "\"max_tokens\":24,\"temperature\":0.8,\"top_p\":0.95,\"seed\":7",
        NULL,
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char body[1024];
        if (cases[i])
            snprintf(body, sizeof body, "{%s,%s}", prompts, cases[i]);
        else
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":"
                     "\"Write the word cat five times.\"}],"
                     "\"max_tokens\":24,\"temperature\":0}");
        const char *path = cases[i] ? CMPL : CHAT;
        char *plain = ask(srv, path, body), *fast = ask(spec, path, body);
        if (strcmp(plain, fast))
            fail_msg("case %zu: speculative text differs:\n%s\nplain:\n%s", i, fast, plain);
        free(plain);
        free(fast);
    }
    server *keep = srv;
    srv = spec;
    double drafted = metric("cellm_draft_tokens_total"),
           kept = metric("cellm_draft_accepted_total"), passes = metric("cellm_spec_passes_total"),
           steps = metric("cellm_draft_steps_total"), rate = metric("cellm_draft_acceptance_ratio"),
           per_pass = metric("cellm_spec_tokens_per_pass");
    wait_idle(10);
    srv = keep;
    print_message("speculation: %.0f guesses, %.0f kept (%.2f), %.0f passes (%.2f tokens each), "
                  "%.0f draft steps\n",
                  drafted, kept, rate, passes, per_pass, steps);
    serve_stop(spec);
    assert_true(kept > 0 && kept <= drafted && passes > 0 && steps > 0);
    assert_true(rate > 0 && rate <= 1 && per_pass > 1);
    assert_int_equal((int)metric("cellm_draft_tokens_total"), 0); /* the plain server */
}

/* ------------------------------------------------------------ logprobs */

/* The JSON of a whole reply's body, or of each "data: " event of a stream
 * gathered: the choices' logprobs.content items of every chunk in one
 * array (chat), or tokens / token_logprobs appended (completions). */
static cJSON *body_json(const reply *r) {
    cJSON *j = cJSON_Parse(r->body);
    if (!j) fail_msg("not JSON: %s", r->body);
    return j;
}

/* Checks one chat content[] item: logprob <= 0, `top` alternatives in
 * order, the token's own value equal to its entry there, bytes = token. */
static void check_chat_item(const cJSON *it, int top) {
    const cJSON *tok = cJSON_GetObjectItem(it, "token"), *lp = cJSON_GetObjectItem(it, "logprob");
    const cJSON *bytes = cJSON_GetObjectItem(it, "bytes"),
                *tl = cJSON_GetObjectItem(it, "top_logprobs");
    assert_true(cJSON_IsString(tok) && cJSON_IsNumber(lp) && cJSON_IsArray(bytes));
    assert_true(lp->valuedouble <= 0 && isfinite(lp->valuedouble));
    size_t n = strlen(tok->valuestring);
    assert_int_equal(cJSON_GetArraySize(bytes), (int)n);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(cJSON_GetArrayItem(bytes, (int)i)->valueint,
                         (unsigned char)tok->valuestring[i]);
    assert_int_equal(cJSON_GetArraySize(tl), top);
    double prev = 0;
    for (int k = 0; k < top; k++) {
        const cJSON *a = cJSON_GetArrayItem(tl, k);
        double v = cJSON_GetObjectItem(a, "logprob")->valuedouble;
        assert_true(v <= prev);
        prev = v;
        if (!strcmp(cJSON_GetObjectItem(a, "token")->valuestring, tok->valuestring))
            assert_true(v == lp->valuedouble);
    }
}

static void test_asan_logprobs(void **st) {
    (void)st;
    /* Chat, whole: one item per completion token, their text the reply. */
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Name three colours.\"}],"
                       "\"max_tokens\":8,\"logprobs\":true,\"top_logprobs\":3%s}";
    char body[512];
    snprintf(body, sizeof body, chat, "");
    reply r = http("POST", CHAT, NULL, body);
    assert_int_equal(r.status, 200);
    cJSON *j = body_json(&r);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    const cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content");
    const char *text =
        cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content")->valuestring;
    int n = cJSON_GetArraySize(content);
    assert_int_equal(
        n, cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint);
    char joined[512] = "";
    double whole[64];
    for (int i = 0; i < n && i < 64; i++) {
        const cJSON *it = cJSON_GetArrayItem(content, i);
        check_chat_item(it, 3);
        strncat(joined, cJSON_GetObjectItem(it, "token")->valuestring,
                sizeof joined - strlen(joined) - 1);
        whole[i] = cJSON_GetObjectItem(it, "logprob")->valuedouble;
    }
    assert_string_equal(joined, text);
    cJSON_Delete(j);
    reply_free(&r);

    /* Streamed: the same items, spread over the chunks. */
    snprintf(body, sizeof body, chat, ",\"stream\":true");
    r = http("POST", CHAT, NULL, body);
    assert_int_equal(r.status, 200);
    int got = 0;
    for (char *ev = strstr(r.body, "data: {"); ev; ev = strstr(ev + 1, "data: {")) {
        char *end = strstr(ev, "\n\n");
        assert_non_null(end);
        *end = '\0';
        cJSON *cj = cJSON_Parse(ev + 6);
        *end = '\n';
        assert_non_null(cj);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(cj, "choices"), 0);
        const cJSON *lp = cJSON_GetObjectItem(ch, "logprobs");
        const cJSON *items = cJSON_IsObject(lp) ? cJSON_GetObjectItem(lp, "content") : NULL;
        for (int i = 0; i < cJSON_GetArraySize(items); i++) {
            const cJSON *it = cJSON_GetArrayItem(items, i);
            check_chat_item(it, 3);
            assert_true(got < n);
            assert_true(cJSON_GetObjectItem(it, "logprob")->valuedouble == whole[got]);
            got++;
        }
        cJSON_Delete(cj);
    }
    assert_int_equal(got, n);
    reply_free(&r);

    /* Completions with echo, as lm-evaluation-harness asks: the prompt's
     * tokens (the first without a value) and, with max_tokens 1, one
     * more; the same prompt as text and as token ids scores the same. */
    const char *bodies[2] = {
        "{\"prompt\":\"The capital of France is Paris\",\"max_tokens\":1,\"echo\":true,"
        "\"logprobs\":1,\"temperature\":0}",
        "{\"prompt\":[504,3575,282,4649,314,7042],\"max_tokens\":0,\"echo\":true,\"logprobs\":2}",
    };
    double lps[2][8];
    for (int b = 0; b < 2; b++) {
        r = http("POST", CMPL, NULL, bodies[b]);
        assert_int_equal(r.status, 200);
        j = body_json(&r);
        c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
        const cJSON *lp = cJSON_GetObjectItem(c0, "logprobs");
        const cJSON *toks = cJSON_GetObjectItem(lp, "tokens"),
                    *vals = cJSON_GetObjectItem(lp, "token_logprobs");
        const cJSON *tops = cJSON_GetObjectItem(lp, "top_logprobs"),
                    *offs = cJSON_GetObjectItem(lp, "text_offset");
        int nt = cJSON_GetArraySize(toks);
        assert_int_equal(nt, 6 + (b == 0));
        assert_int_equal(cJSON_GetArraySize(vals), nt);
        assert_int_equal(cJSON_GetArraySize(tops), nt);
        assert_int_equal(cJSON_GetArraySize(offs), nt);
        assert_string_equal(cJSON_GetArrayItem(toks, 5)->valuestring, " Paris");
        assert_true(cJSON_IsNull(cJSON_GetArrayItem(vals, 0)));
        assert_true(cJSON_IsNull(cJSON_GetArrayItem(tops, 0)));
        size_t off = 0;
        for (int i = 0; i < nt; i++) {
            assert_int_equal(cJSON_GetArrayItem(offs, i)->valueint, (int)off);
            off += strlen(cJSON_GetArrayItem(toks, i)->valuestring);
            if (i == 0) continue;
            double v = cJSON_GetArrayItem(vals, i)->valuedouble;
            assert_true(v <= 0 && isfinite(v));
            if (i < 6) lps[b][i] = v;
            const cJSON *d = cJSON_GetArrayItem(tops, i);
            assert_int_equal(cJSON_GetArraySize(d), b == 0 ? 1 : 2);
            /* lm-eval's greedy test: the token's value against the dict's best. */
            assert_true(v <= d->child->valuedouble);
        }
        const char *t = cJSON_GetObjectItem(c0, "text")->valuestring;
        assert_true(!strncmp(t, "The capital of France is Paris", 30));
        assert_int_equal(
            cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "completion_tokens")->valueint,
            b == 0 ? 1 : 0);
        cJSON_Delete(j);
        reply_free(&r);
    }
    for (int i = 1; i < 6; i++) assert_true(lps[0][i] == lps[1][i]);
}

/* ------------------------------------------------------------ /v1/responses */

/* A string field of a cJSON object ("" when absent). */
static const char *jstr(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItem(o, name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* The events of a Responses stream: checks "event: T" names the data's
 * type and that sequence numbers count from 0; returns their count and
 * writes their types (up to cap) into types[]. */
static int responses_events(const char *sse, char types[][48], int cap) {
    int n = 0;
    for (const char *p = strstr(sse, "event: "); p; p = strstr(p + 1, "event: ")) {
        const char *nl = strchr(p, '\n'), *end = strstr(p, "\n\n");
        assert_non_null(nl);
        assert_non_null(end);
        assert_true(!strncmp(nl, "\ndata: ", 7));
        cJSON *ev = cJSON_ParseWithLength(nl + 7, (size_t)(end - nl - 7));
        assert_non_null(ev);
        const char *type = jstr(ev, "type");
        assert_int_equal((size_t)(nl - p - 7), strlen(type));
        assert_true(!strncmp(p + 7, type, strlen(type)));
        assert_int_equal(cJSON_GetObjectItem(ev, "sequence_number")->valueint, n);
        if (n < cap) snprintf(types[n], sizeof types[n], "%s", type);
        n++;
        cJSON_Delete(ev);
    }
    return n;
}

/* Function tools on /v1/responses: the body as chat's tools and tool
 * turns; a reply with text and a call as a message and a function_call
 * item, whole and streamed (the text before the call streams, the call's
 * markup never does); tool_choice none leaves the text alone. */
static void responses_tools(const serve_limits *lim) {
    serve_req r;
    serve_err e;
    const char *body =
        "{\"input\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"type\":\"message\","
        "\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Looking.\"}]},"
        "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_1\",\"name\":\"f\","
        "\"arguments\":\"{\\\"a\\\":1}\",\"status\":\"completed\"},{\"type\":\"function_call\","
        "\"call_id\":\"call_2\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
        "\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"18 C\"},{\"type\":"
        "\"function_call_output\",\"call_id\":\"call_2\",\"output\":\"ok\"}],\"tools\":[{\"type\":"
        "\"function\",\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"},"
        "\"strict\":true}],\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},"
        "\"parallel_tool_calls\":false,\"stream\":true}";
    if (!responses_parse(body, strlen(body), lim, "m", 0xabc, &r, &e)) fail_msg("%s", e.msg);
    assert_int_equal(r.tool_choice, SERVE_TOOLS_NAMED);
    assert_string_equal(r.tool_name, "f");
    assert_false(r.parallel_tool_calls);
    assert_string_equal(r.tools_json,
                        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":"
                        "\"d\",\"parameters\":{\"type\":\"object\"},\"strict\":true}}]");
    /* The calls join the assistant's text as one turn; outputs are tool
     * messages. */
    assert_string_equal(
        r.messages_json,
        "[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":"
        "\"Looking.\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{"
        "\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}},{\"id\":\"call_2\",\"type\":"
        "\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
        "\"content\":\"18 C\",\"tool_call_id\":\"call_1\"},{\"role\":\"tool\",\"content\":\"ok\","
        "\"tool_call_id\":\"call_2\"}]");

    const char *text = "Sure. <tool_call>{\"name\":\"f\",\"arguments\":{\"a\":2}}</tool_call>";
    serve_out o = {text, strlen(text), true, {0}, NULL};
    o.res.finish_reason = CELLM_FINISH_STOP;
    cJSON *w = r.api->whole(r.api_ctx, &o);
    const cJSON *out = cJSON_GetObjectItem(w, "output");
    assert_int_equal(cJSON_GetArraySize(out), 2);
    const cJSON *msg = cJSON_GetArrayItem(out, 0), *fc = cJSON_GetArrayItem(out, 1);
    assert_string_equal(jstr(msg, "type"), "message");
    assert_string_equal(jstr(cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "content"), 0), "text"),
                        "Sure.");
    assert_string_equal(jstr(fc, "type"), "function_call");
    assert_string_equal(jstr(fc, "name"), "f");
    assert_string_equal(jstr(fc, "arguments"), "{\"a\":2}");
    assert_string_equal(jstr(fc, "status"), "completed");
    const char *call_id = jstr(fc, "call_id");
    assert_true(!strncmp(call_id, "call_", 5) && strlen(call_id) == 21);
    assert_true(!strncmp(jstr(fc, "id"), "fc_", 3) && !strcmp(jstr(fc, "id") + 3, call_id + 5));
    const cJSON *echo = cJSON_GetArrayItem(cJSON_GetObjectItem(w, "tools"), 0);
    assert_string_equal(jstr(echo, "name"), "f");
    assert_true(cJSON_IsTrue(cJSON_GetObjectItem(echo, "strict")));
    assert_string_equal(jstr(cJSON_GetObjectItem(w, "tool_choice"), "name"), "f");
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(w, "parallel_tool_calls")));

    /* Streamed in pieces that split the call's mark. */
    serve_out s[4] = {{"", 0, false, {0}, NULL},
                      {text, 8, false, {0}, NULL},
                      {text + 8, 6, false, {0}, NULL},
                      {text + 14, strlen(text) - 14, true, o.res, NULL}};
    char all[8192] = "";
    for (int i = 0; i < 4; i++) {
        char *t = r.api->stream(r.api_ctx, &s[i]);
        assert_non_null(t);
        assert_true(strlen(all) + strlen(t) < sizeof all);
        strcat(all, t);
        free(t);
    }
    char types[16][48];
    static const char *const order[] = {
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    };
    int n = responses_events(all, types, 16);
    assert_int_equal(n, 13);
    for (int i = 0; i < n; i++) assert_string_equal(types[i], order[i]);
    assert_null(strstr(all, "tool_call>")); /* the mark never went out as text */
    assert_non_null(strstr(all, "\"delta\":\"Sure. \""));
    char want[160];
    snprintf(want, sizeof want,
             "\"output_index\":1,\"item\":{\"id\":\"fc_%s\",\"type\":\"function_call\","
             "\"status\":\"in_progress\",\"arguments\":\"\",\"call_id\":\"%s\",\"name\":\"f\"}",
             call_id + 5, call_id);
    assert_non_null(strstr(all, want)); /* the same ids as the whole text's */
    assert_non_null(strstr(all, "\"name\":\"f\",\"arguments\":\"{\\\"a\\\":2}\"}"));
    const char *last = strstr(all, "event: response.completed");
    assert_non_null(last);
    assert_non_null(strstr(last, "\"type\":\"function_call\",\"status\":\"completed\""));
    cJSON_Delete(w);
    serve_req_free(&r);

    /* tool_choice none: the tools are shown, the text is text. */
    const char *none = "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
                       "\"tool_choice\":\"none\"}";
    assert_true(responses_parse(none, strlen(none), lim, "m", 1, &r, &e));
    assert_non_null(r.tools_json);
    w = r.api->whole(r.api_ctx, &o);
    out = cJSON_GetObjectItem(w, "output");
    assert_int_equal(cJSON_GetArraySize(out), 1);
    assert_string_equal(
        jstr(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(out, 0), "content"), 0),
             "text"),
        text);
    cJSON_Delete(w);
    serve_req_free(&r);
}

static void test_asan_responses(void **st) {
    (void)st;
    serve_limits lim = {srv->info.n_vocab, srv->n_ctx, 4, -1, 0, NULL};
    serve_req r;
    serve_err e;
    /* The body as a chat request: instructions first, items in order. */
    const char *ok = "{\"instructions\":\"Be brief.\",\"input\":[{\"role\":\"developer\","
                     "\"content\":\"A\"},{\"type\":\"message\",\"role\":\"user\",\"content\":["
                     "{\"type\":\"input_text\",\"text\":\"B\"},{\"type\":\"input_text\","
                     "\"text\":\"C\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":"
                     "\"output_text\",\"text\":\"D\"}]}],\"max_output_tokens\":7,\"stream\":true,"
                     "\"store\":true,\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"n\","
                     "\"schema\":{\"type\":\"object\"},\"strict\":true}}}";
    assert_true(responses_parse(ok, strlen(ok), &lim, "m", 0xabc, &r, &e));
    assert_int_equal(r.kind, SERVE_CHAT);
    assert_int_equal(r.n_messages, 4);
    const char *want[4][2] = {
        {"system", "Be brief."}, {"system", "A"}, {"user", "BC"}, {"assistant", "D"}};
    for (int i = 0; i < 4; i++) {
        assert_string_equal(r.messages[i].role, want[i][0]);
        assert_string_equal(r.messages[i].content, want[i][1]);
    }
    assert_int_equal(r.max_tokens, 7);
    assert_true(r.stream && r.grammar && r.api);

    /* The whole reply of a choice cut at its limit. */
    serve_out o = {"Hi!", 3, true, {0}, NULL};
    o.res.finish_reason = CELLM_FINISH_LENGTH;
    o.res.n_prompt_tokens = 11;
    o.res.n_completion_tokens = 7;
    o.res.n_cached_tokens = 2;
    cJSON *w = r.api->whole(r.api_ctx, &o);
    assert_string_equal(jstr(w, "id"), "resp_0000000000000abc");
    assert_string_equal(jstr(w, "object"), "response");
    assert_string_equal(jstr(w, "status"), "incomplete");
    assert_string_equal(jstr(cJSON_GetObjectItem(w, "incomplete_details"), "reason"),
                        "max_output_tokens");
    assert_string_equal(jstr(w, "instructions"), "Be brief.");
    const cJSON *item = cJSON_GetArrayItem(cJSON_GetObjectItem(w, "output"), 0);
    assert_string_equal(jstr(item, "type"), "message");
    assert_string_equal(jstr(item, "id"), "msg_0000000000000abc");
    const cJSON *part = cJSON_GetArrayItem(cJSON_GetObjectItem(item, "content"), 0);
    assert_string_equal(jstr(part, "type"), "output_text");
    assert_string_equal(jstr(part, "text"), "Hi!");
    const cJSON *u = cJSON_GetObjectItem(w, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "input_tokens")->valueint, 11);
    assert_int_equal(cJSON_GetObjectItem(u, "output_tokens")->valueint, 7);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 18);
    assert_int_equal(
        cJSON_GetObjectItem(cJSON_GetObjectItem(u, "input_tokens_details"), "cached_tokens")
            ->valueint,
        2);
    cJSON_Delete(w);

    /* A stream: opening events, a delta per piece, closing events; a
     * failure ends it with response.failed. */
    char *sse[4];
    serve_out s0 = {"", 0, false, {0}, NULL}, s1 = {"Hel", 3, false, {0}, NULL},
              s2 = {"lo", 2, true, {0}, NULL};
    s2.res.finish_reason = CELLM_FINISH_STOP;
    sse[0] = r.api->stream(r.api_ctx, &s0);
    sse[1] = r.api->stream(r.api_ctx, &s1);
    sse[2] = r.api->stream(r.api_ctx, &s2);
    size_t total = 1;
    for (int i = 0; i < 3; i++) total += strlen(sse[i]);
    char *all = malloc(total);
    assert_non_null(all);
    all[0] = '\0';
    for (int i = 0; i < 3; i++) strcat(all, sse[i]), free(sse[i]);
    char types[16][48];
    static const char *const order[] = {"response.created",           "response.in_progress",
                                        "response.output_item.added", "response.content_part.added",
                                        "response.output_text.delta", "response.output_text.delta",
                                        "response.output_text.done",  "response.content_part.done",
                                        "response.output_item.done",  "response.completed"};
    assert_int_equal(responses_events(all, types, 16), 10);
    for (int i = 0; i < 10; i++) assert_string_equal(types[i], order[i]);
    assert_non_null(strstr(all, "\"text\":\"Hello\""));
    free(all);
    serve_req_free(&r);

    const char *one = "{\"input\":\"x\",\"stream\":true}";
    assert_true(responses_parse(one, strlen(one), &lim, "m", 1, &r, &e));
    serve_err fail;
    serr(&fail, 504, "timeout", NULL, "too slow");
    serve_out sf = {"", 0, true, {0}, &fail};
    sse[3] = r.api->stream(r.api_ctx, &sf);
    assert_int_equal(responses_events(sse[3], types, 16), 5);
    assert_string_equal(types[4], "response.failed");
    assert_non_null(strstr(sse[3], "\"code\":\"timeout\""));
    free(sse[3]);
    serve_req_free(&r);
    /* An empty reply still ends with its (empty) text part. */
    assert_true(responses_parse(one, strlen(one), &lim, "m", 1, &r, &e));
    serve_out se = {NULL, 0, true, {0}, NULL};
    se.res.finish_reason = CELLM_FINISH_STOP;
    sse[3] = r.api->stream(r.api_ctx, &se);
    assert_int_equal(responses_events(sse[3], types, 16), 8);
    assert_string_equal(types[7], "response.completed");
    assert_non_null(strstr(sse[3], "\"content\":[{\"type\":\"output_text\",\"text\":\"\""));
    free(sse[3]);
    serve_req_free(&r);

    responses_tools(&lim);

    /* Hostile or refused bodies: a 400 naming the field, nothing to free. */
    static const struct {
        const char *body, *param;
    } bad[] = {
        {"", ""},
        {"{\"input\":\"x\"", ""},
        {"[\"input\"]", ""},
        {"{\"input\":\"\xc3\x28\"}", ""},
        {"{}", "input"},
        {"{\"input\":null}", "input"},
        {"{\"input\":{}}", "input"},
        {"{\"input\":[]}", "input"},
        {"{\"input\":[1]}", "input[0]"},
        {"{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "input[0].role"},
        {"{\"input\":[{\"role\":\"user\"}]}", "input[0].content"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]}",
         "input[0].content[0]"},
        {"{\"input\":[{\"type\":\"reasoning\",\"summary\":[]}]}", "input[0]"},
        {"{\"input\":\"x\",\"instructions\":5}", "instructions"},
        {"{\"input\":\"x\",\"max_output_tokens\":1.5}", "max_output_tokens"},
        {"{\"input\":\"x\",\"max_output_tokens\":1e300}", "max_output_tokens"},
        {"{\"input\":\"x\",\"top_p\":2}", "top_p"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0]"},
        {"{\"input\":\"x\",\"tools\":{}}", "tools"},
        {"{\"input\":\"x\",\"tools\":[1]}", "tools[0]"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "tools[0].name"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
         "tools[0].name"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":[]}]}",
         "tools[0].parameters"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"strict\":1}]}",
         "tools[0].strict"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":[]}]}",
         "tools[0].description"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":"
         "{\"type\":\"function\"}}",
         "tool_choice"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":"
         "{\"type\":\"web_search_preview\"}}",
         "tool_choice"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":"
         "\"sometimes\"}",
         "tool_choice"},
        {"{\"input\":\"x\",\"tool_choice\":\"required\"}", "tool_choice"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
         "\"parallel_tool_calls\":1}",
         "parallel_tool_calls"},
        {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}",
         "input[0].call_id"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"arguments\":\"{}\"}]}",
         "input[0].name"},
        {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":{}"
         "}]}",
         "input[0].arguments"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}", "input[0].output"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":5,\"output\":\"x\"}]}",
         "input[0].call_id"},
        {"{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", "previous_response_id"},
        {"{\"input\":\"x\",\"background\":true}", "background"},
        {"{\"input\":\"x\",\"truncation\":\"auto\"}", "truncation"},
        {"{\"input\":\"x\",\"top_logprobs\":3}", "top_logprobs"},
        {"{\"input\":\"x\",\"metadata\":{\"a\":1}}", "metadata"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format.type"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}",
         "text.format.schema"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"schema\":{\"$ref\":"
         "\"#\"}}}}",
         "text.format"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&e, 0, sizeof e);
        bool got = responses_parse(bad[i].body, strlen(bad[i].body), &lim, "m", 1, &r, &e);
        if (got || e.status != 400 || strcmp(e.param, bad[i].param))
            fail_msg("%s: %s %d param '%s' (%s)", bad[i].body, got ? "accepted" : "refused",
                     e.status, e.param, e.msg);
        assert_true(e.msg[0]);
    }

    /* Over HTTP, whole and streamed. */
    reply h = http("POST", "/v1/responses", NULL, "{\"input\":\"Hi\",\"max_output_tokens\":3}");
    assert_int_equal(h.status, 200);
    w = body_json(&h);
    assert_string_equal(jstr(w, "object"), "response");
    assert_string_equal(jstr(w, "model"), "smollm2");
    cJSON_Delete(w);
    reply_free(&h);
    h = http("POST", "/v1/responses", NULL,
             "{\"input\":\"Hi\",\"max_output_tokens\":3,\"stream\":true}");
    assert_int_equal(h.status, 200);
    assert_non_null(strstr(h.raw, "text/event-stream"));
    int n = responses_events(h.body, types, 16);
    assert_true(n >= 9 && n <= 16);
    assert_string_equal(types[n - 1], "response.incomplete");
    reply_free(&h);
    h = http("POST", "/v1/responses", NULL, "{\"input\":\"Hi\",\"model\":\"other\"}");
    assert_int_equal(h.status, 404);
    reply_free(&h);
    assert_true(metric("cellm_requests_total{endpoint=\"responses\"}") >= 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_asan_cli),        cmocka_unit_test(test_asan_endpoints),
        cmocka_unit_test(test_asan_cors),       cmocka_unit_test(test_asan_hostile),
        cmocka_unit_test(test_asan_disconnect), cmocka_unit_test(test_load),
        cmocka_unit_test(test_tsan_serve),      cmocka_unit_test(test_spec),
        cmocka_unit_test(test_asan_logprobs),   cmocka_unit_test(test_asan_responses),
    };
    /* test.sh runs only test_tsan_* under ThreadSanitizer. */
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}

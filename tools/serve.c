/*
 * serve.c — `cellm serve [MODEL]`: the command line (llama-server's flag
 * names where they exist), loading the model and creating the engine,
 * starting the HTTP daemon (serve_http.c), and the stop: on SIGINT at
 * once (the daemon ends every connection, which cancels its requests, then
 * the engine and the model are freed); on SIGTERM after a drain (new
 * requests get 503 while the running ones finish, for --drain-timeout
 * seconds at most, or until a second signal), as a load balancer needs.
 *
 * The daemon listens before the model loads, so that /health can say
 * "loading" (503) rather than a balancer seeing a closed port.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "serve.h"
#include "store.h"

#define SERVE_DEFAULT_MODEL "smollm2-135m"

serve_opts serve_default_opts(void) {
    serve_opts o;
    memset(&o, 0, sizeof o);
    o.model = SERVE_DEFAULT_MODEL;
    o.host = "127.0.0.1";
    o.port = 8080;
    o.engine = cellm_engine_default_params();
    o.n_predict = -1;
    o.temperature = 1.0f; /* OpenAI's default */
    o.max_body = (size_t)4 << 20;
    o.max_queue = 64;
    o.max_conns = 256;
    o.max_n = 16;
    o.timeout_s = 600;
    o.idle_s = 30;
    o.drain_s = 30;
    o.affinity_tokens = 64;
    return o;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t serve_random(server *s) {
    uint64_t k = atomic_fetch_add_explicit(&s->rng_ctr, 1, memory_order_relaxed);
    return splitmix64(s->rng_seed ^ splitmix64(k));
}

static uint64_t entropy(void) {
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v) v = 0;
        close(fd);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return v ^ splitmix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid());
}

/* The model's id in the API: the alias, the store name, or the file name
 * without its directory and ".gguf". */
static void model_id(const serve_opts *o, const char *path, char *out, size_t cap) {
    if (o->alias) {
        snprintf(out, cap, "%s", o->alias);
    } else if (store_find_model(o->model)) {
        snprintf(out, cap, "%s", o->model);
    } else {
        const char *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        size_t n = strlen(base);
        if (n > 5 && !strcmp(base + n - 5, ".gguf")) n -= 5;
        snprintf(out, cap, "%.*s", (int)n, base);
    }
}

/* Whether two paths name one file (the engine can only see that a draft
 * is the model itself when both are one handle). */
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

server *serve_start(const serve_opts *o, char *err, size_t cap) {
    server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    s->o = *o;
    atomic_store(&s->state, SERVE_LOADING);
    s->rng_seed = entropy();
    s->t_start = serve_now();
    s->created = (long)time(NULL);
    if (!http_start(s, err, cap)) {
        free(s);
        return NULL;
    }
    cellm_error cerr;
    err_clear(&cerr);
    bool draft_bad = false;
    if (cli_resolve_model(o->model, s->model_path, sizeof s->model_path, &cerr) ||
        (o->draft && (draft_bad = cli_resolve_model(o->draft, s->draft_path, sizeof s->draft_path,
                                                    &cerr) != CELLM_OK))) {
        snprintf(err, cap, "%s%s", draft_bad ? "draft model: " : "", cerr.msg);
        serve_stop(s);
        return NULL;
    }
    if (o->draft && same_file(s->model_path, s->draft_path)) {
        snprintf(err, cap,
                 "the draft model is the model's own file (%s): it would guess right every "
                 "time and save nothing; give a smaller file of the same family",
                 s->draft_path);
        serve_stop(s);
        return NULL;
    }
    model_id(o, s->model_path, s->model_id, sizeof s->model_id);
    cellm_model_params mp = cellm_model_default_params();
    mp.chat_template = o->chat_template;
    if (cellm_model_load(s->model_path, &mp, &s->model) ||
        cellm_model_get_info(s->model, &s->info)) {
        snprintf(err, cap, "%s", cellm_last_error());
        serve_stop(s);
        return NULL;
    }
    /* The draft's own chat template is never used: requests are rendered
     * with the model's, and the draft only sees the tokens. */
    if (o->draft && cellm_model_load(s->draft_path, NULL, &s->draft)) {
        snprintf(err, cap, "draft model: %s", cellm_last_error());
        serve_stop(s);
        return NULL;
    }
    if (o->mmproj) {
        /* The projector must make embeddings of the model's width. */
        if (cellm_mmproj_load(o->mmproj, s->model, NULL, &s->mmproj)) {
            snprintf(err, cap, "--mmproj: %s", cellm_last_error());
            serve_stop(s);
            return NULL;
        }
        if (!serve_images_create(s->mmproj, &s->images)) {
            snprintf(err, cap, "out of memory");
            serve_stop(s);
            return NULL;
        }
    }
    s->o.engine.draft_model = s->draft;
    /* A draft of another family or vocabulary, or one the memory budget
     * cannot hold, is refused here with the engine's reason. */
    if (cellm_engine_create(s->model, &s->o.engine, &s->engine)) {
        snprintf(err, cap, "%s", cellm_last_error());
        serve_stop(s);
        return NULL;
    }
    s->n_ctx = cellm_engine_n_ctx(s->engine);
    atomic_store(&s->state, SERVE_READY); /* publishes the fields above to the HTTP threads */
    return s;
}

double serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int serve_drain(server *s, const void *sigs) {
    atomic_store(&s->state, SERVE_DRAINING);
    double deadline = serve_now() + s->o.drain_s;
    for (;;) {
        int left = atomic_load(&s->active);
        if (left == 0 || serve_now() >= deadline) return left;
        struct timespec slice = {0, 50 * 1000000L};
        if (sigtimedwait(sigs, NULL, &slice) > 0) return atomic_load(&s->active);
    }
}

void serve_stop(server *s) {
    if (!s) return;
    atomic_store(&s->stopping, true);
    http_stop(s);
    cellm_engine_free(s->engine);
    serve_images_free(s->images);
    cellm_mmproj_free(s->mmproj); /* before the model */
    cellm_model_free(s->draft);   /* after the engine, which uses it */
    cellm_model_free(s->model);
    free(s);
}

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: cellm serve [MODEL] [options]\n\n"
        "Serves MODEL (a GGUF path or a model store name; default %s) over an\n"
        "OpenAI-compatible HTTP API: /v1/chat/completions, /v1/completions, /v1/responses,\n"
        "/v1/models, /health, /metrics, /tokenize, /detokenize, and a chat page at /.\n\n"
        "  --host H              address to listen on (default 127.0.0.1)\n"
        "  --port N              port (default 8080; 0: any free port)\n"
        "  --alias NAME          the model's id in the API (default: its store or file name)\n"
        "  --api-key KEY         require 'Authorization: Bearer KEY' (or $CELLM_API_KEY)\n"
        "  --cors-origin ORIGIN  allow browser requests from ORIGIN ('*': any); repeatable\n"
        "  -c, --ctx-size N      positions per request (default: the model's, at most 4096)\n"
        "  -np, --parallel N     requests running at once (default 16)\n"
        "  -b, --batch-size N    tokens per engine step (default 256)\n"
        "  -t, --threads N       compute threads (default: cores, at most 4)\n"
        "  --mem-budget SIZE     cap on the whole process (weights, engine, KV), e.g. 512M;\n"
        "                        refused at start when -np requests of -c positions cannot fit\n"
        "                        (default: none, and a 256M KV + activations budget)\n"
        "  --kv-type T           KV cache type: " CLI_KV_TYPES " (default f16)\n" CLI_DEVICE_USAGE
        "  --chat-template F     chatml, gemma or llama3 instead of the model's own\n"
        "  -n, --n-predict N     max_tokens when a request gives none (default -1: the context)\n"
        "  --temp T              temperature when a request gives none (default 1, as OpenAI)\n"
        "  --max-queue N         requests running or waiting before 503 (default 64)\n"
        "  --max-choices N       choices per request, n x prompts (default 16)\n"
        "  --max-conns N         connections at once (default 256)\n"
        "  --max-body SIZE       request body limit (default 4M)\n"
        "  --timeout S           seconds one request may take (default 600; 0: none)\n"
        "  --idle-timeout S      close a connection silent this long (default 30)\n"
        "  --drain-timeout S     on SIGTERM, refuse new requests (503) and give running ones\n"
        "                        S seconds to finish before exiting (default 30; 0: at once;\n"
        "                        a second SIGTERM or SIGINT ends the drain)\n"
        "  --affinity-tokens N   the default affinity key hashes the prompt's first N tokens\n"
        "                        (default 64; X-Session-Id or `user` take precedence)\n"
        "  --log-requests        one line per request on stderr: X-Request-Id, status, time,\n"
        "                        affinity key\n"
        "  -v, --verbose         log refused requests and HTTP errors to stderr (and requests)\n\n"
        "Speculative decoding (by default the same text, token for token; only the speed\n"
        "changes):\n"
        "  --mmproj FILE         vision projector (cellm convert's mmproj-*.gguf): chat messages\n"
        "                        may then hold image_url parts with data: URLs (PNG, JPEG)\n"
        "  --image-budget SIZE   memory the running requests' pictures may hold at once, inside\n"
        "                        the budget (default 16M; a request over it alone gets 400,\n"
        "                        one over it with the others' gets 503)\n"
        "  -md, --model-draft M  draft model guessing ahead: a smaller GGUF of the same family\n"
        "                        and vocabulary (path, store name or file in the store)\n"
        "  --lookup N            guess from earlier text (prompt lookup) with n-grams of up\n"
        "                        to N tokens, 1..64 (default 0: off); strong when answers\n"
        "                        copy their input; with -md, the draft fills in\n"
        "  --draft-max K         guesses per request and step at most, 1..64 (default 8)\n"
        "  --draft-min K         fewer guesses than K are not checked (default 1)\n"
        "  --draft-p-min P       the draft stops at a guess below probability P (default 0.5)\n"
        "  --draft-always        run the draft every step (default: only while it has paid\n"
        "                        lately, measured; tried again now and then)\n"
        "  --spec-accept RULE    exact (default: the plain run's text) or resample (sampled\n"
        "                        requests: the draft samples, a guess is kept with probability\n"
        "                        min(1, p/q): the model's distribution, not the plain text)\n",
        SERVE_DEFAULT_MODEL);
}

static bool uint_in(const char *v, unsigned long long lo, unsigned long long hi,
                    unsigned long long *u) {
    return cli_parse_uint(v, hi, u) && *u >= lo;
}

/* The flags that take a value. */
static const char *const valued[] = {"--host",
                                     "--port",
                                     "--alias",
                                     "--api-key",
                                     "--cors-origin",
                                     "-c",
                                     "--ctx-size",
                                     "-np",
                                     "--parallel",
                                     "-b",
                                     "--batch-size",
                                     "-t",
                                     "--threads",
                                     "--mem-budget",
                                     "--image-budget",
                                     "--max-body",
                                     "--chat-template",
                                     "-n",
                                     "--n-predict",
                                     "--temp",
                                     "--max-queue",
                                     "--max-choices",
                                     "--max-conns",
                                     "--timeout",
                                     "--idle-timeout",
                                     "--drain-timeout",
                                     "--affinity-tokens",
                                     "--kv-type",
                                     "--device",
                                     "--gpu-layers",
                                     "-ngl",
                                     "--n-gpu-layers",
                                     "-md",
                                     "--model-draft",
                                     "--mmproj",
                                     "--lookup",
                                     "--draft-max",
                                     "--draft-min",
                                     "--draft-p-min",
                                     "--spec-accept"};

/* Parses the flags into *o; returns -1 to go on, else an exit status. */
static int parse_flags(int argc, char **argv, serve_opts *o) {
    bool have_model = false;
    long gpu_layers = -1;
    const char *spec_tuned = NULL; /* the last --draft-* flag given */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        unsigned long long u = 0;
        size_t sz = 0;
        char *end;
        bool takes = false;
        for (size_t k = 0; k < sizeof valued / sizeof *valued; k++) takes |= !strcmp(a, valued[k]);
        if (takes && !v) {
            cli_error("serve: %s needs a value", a);
            return 2;
        }
#define UINT_FLAG(dst, lo, hi)                                                                     \
    do {                                                                                           \
        if (!uint_in(v, (lo), (hi), &u)) {                                                         \
            cli_error("serve: %s needs a whole number from %llu to %llu", a,                       \
                      (unsigned long long)(lo), (unsigned long long)(hi));                         \
            return 2;                                                                              \
        }                                                                                          \
        dst = u;                                                                                   \
        i++;                                                                                       \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            o->verbose = true;
        } else if (!strcmp(a, "--log-requests")) {
            o->log_requests = true;
        } else if (!strcmp(a, "--drain-timeout")) {
            UINT_FLAG(o->drain_s, 0, 1u << 20);
        } else if (!strcmp(a, "--affinity-tokens")) {
            UINT_FLAG(o->affinity_tokens, 1, 1u << 16);
        } else if (!strcmp(a, "--host")) {
            o->host = v, i++;
        } else if (!strcmp(a, "--port")) {
            UINT_FLAG(o->port, 0, 65535);
        } else if (!strcmp(a, "--alias")) {
            o->alias = v, i++;
        } else if (!strcmp(a, "--api-key")) {
            o->api_key = v, i++;
        } else if (!strcmp(a, "--cors-origin")) {
            if (o->n_cors == SERVE_MAX_CORS) {
                cli_error("serve: at most %d --cors-origin", SERVE_MAX_CORS);
                return 2;
            }
            o->cors[o->n_cors++] = v, i++;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            UINT_FLAG(o->engine.max_ctx, 0, 1u << 24);
        } else if (!strcmp(a, "-np") || !strcmp(a, "--parallel")) {
            UINT_FLAG(o->engine.max_seqs, 1, 4096);
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            UINT_FLAG(o->engine.max_batch_tokens, 1, 65536);
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            UINT_FLAG(o->engine.n_threads, 0, 256);
        } else if (!strcmp(a, "--mem-budget") || !strcmp(a, "--max-body") ||
                   !strcmp(a, "--image-budget")) {
            if (!cli_parse_size(v, &sz) || sz == 0) {
                cli_error("serve: %s needs a size such as 512M", a);
                return 2;
            }
            if (!strcmp(a, "--mem-budget"))
                o->engine.process_budget_bytes = sz;
            else if (!strcmp(a, "--image-budget"))
                o->engine.image_budget_bytes = sz;
            else
                o->max_body = sz;
            i++;
        } else if (!strcmp(a, "--kv-type")) {
            if (!cli_parse_kv_type(v, &o->engine.kv_type)) {
                cli_error("serve: --kv-type needs one of " CLI_KV_TYPES);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--device")) {
            if (!cli_parse_device(v, &o->engine.device)) {
                cli_error("serve: --device needs one of " CLI_DEVICES);
                return 2;
            }
            i++;
        } else if (cli_is_gpu_layers(a)) {
            if (!cli_parse_gpu_layers(v, &gpu_layers)) {
                cli_error("serve: %s needs a count of layers", a);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--mmproj")) {
            o->mmproj = v, i++;
        } else if (!strcmp(a, "-md") || !strcmp(a, "--model-draft")) {
            o->draft = v, i++;
        } else if (!strcmp(a, "--lookup")) {
            UINT_FLAG(o->engine.lookup_ngram, 0, 64);
        } else if (!strcmp(a, "--draft-max")) {
            UINT_FLAG(o->engine.draft_max, 1, 64);
            spec_tuned = a;
        } else if (!strcmp(a, "--draft-min")) {
            UINT_FLAG(o->engine.draft_min, 0, 64);
            spec_tuned = a;
        } else if (!strcmp(a, "--draft-p-min")) {
            double d = strtod(v, &end);
            if (*end || !(d >= 0 && d <= 1)) {
                cli_error("serve: --draft-p-min needs a number from 0 to 1");
                return 2;
            }
            o->engine.draft_p_min = (float)d, i++;
            spec_tuned = a;
        } else if (!strcmp(a, "--draft-always")) {
            o->engine.draft_always = 1;
            spec_tuned = a;
        } else if (!strcmp(a, "--spec-accept")) {
            if (!cli_parse_spec_accept(v, &o->engine.spec_accept)) {
                cli_error("serve: --spec-accept takes exact or resample (not '%s')", v);
                return 2;
            }
            i++;
            spec_tuned = a;
        } else if (!strcmp(a, "--chat-template")) {
            o->chat_template = v, i++;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (!strcmp(v, "-1")) {
                o->n_predict = -1, i++;
            } else {
                UINT_FLAG(o->n_predict, 1, 1u << 24);
            }
        } else if (!strcmp(a, "--temp")) {
            double d = strtod(v, &end);
            if (*end || !(d >= 0 && d <= 2)) {
                cli_error("serve: --temp needs a number from 0 to 2");
                return 2;
            }
            o->temperature = (float)d, i++;
        } else if (!strcmp(a, "--max-queue")) {
            UINT_FLAG(o->max_queue, 1, 1u << 20);
        } else if (!strcmp(a, "--max-choices")) {
            UINT_FLAG(o->max_n, 1, 128);
        } else if (!strcmp(a, "--max-conns")) {
            UINT_FLAG(o->max_conns, 1, 1u << 16);
        } else if (!strcmp(a, "--timeout")) {
            UINT_FLAG(o->timeout_s, 0, 1u << 24);
        } else if (!strcmp(a, "--idle-timeout")) {
            UINT_FLAG(o->idle_s, 1, 1u << 24);
        } else if (a[0] == '-') {
            cli_error("serve: unknown option '%s' (see `cellm serve --help`)", a);
            return 2;
        } else if (!have_model) {
            o->model = a;
            have_model = true;
        } else {
            cli_error("serve: more than one model given ('%s', '%s')", o->model, a);
            return 2;
        }
#undef UINT_FLAG
    }
    /* A tuning flag without a source of guesses would be ignored: say so
     * rather than let the operator believe speculation is on. */
    if (spec_tuned && !o->draft && o->engine.lookup_ngram == 0) {
        cli_error("serve: %s tunes speculative decoding, which needs --model-draft or --lookup",
                  spec_tuned);
        return 2;
    }
    if (o->engine.draft_min > o->engine.draft_max) {
        cli_error("serve: --draft-min (%d) must not exceed --draft-max (%d)", o->engine.draft_min,
                  o->engine.draft_max);
        return 2;
    }
    if (!o->api_key) {
        const char *k = getenv("CELLM_API_KEY");
        if (k && *k) o->api_key = k;
    }
    if (o->api_key && !*o->api_key) {
        cli_error("serve: the API key must not be empty");
        return 2;
    }
    cli_apply_gpu_layers(gpu_layers, &o->engine.device, &o->engine.gpu_layers);
    return -1;
}

int cmd_serve(int argc, char **argv) {
    serve_opts o = serve_default_opts();
    int rc = parse_flags(argc, argv, &o);
    if (rc >= 0) return rc;
    /* Signals go to this thread's sigwait, not to the server's threads,
     * which inherit the mask. A client closing early must not kill us. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    char err[1024];
    server *s = serve_start(&o, err, sizeof err);
    if (!s) {
        cli_error("serve: %s", err);
        return 1;
    }
    fprintf(stderr, "cellm serve: %s (%s, context %d, %d running at once)%s\n", s->model_id,
            s->info.arch, s->n_ctx, o.engine.max_seqs, o.api_key ? ", API key required" : "");
    if (s->draft || o.engine.lookup_ngram > 0) {
        char lookup[64] = "no prompt lookup";
        if (o.engine.lookup_ngram > 0)
            snprintf(lookup, sizeof lookup, "prompt lookup of up to %d-grams",
                     o.engine.lookup_ngram);
        fprintf(stderr,
                "cellm serve: speculative decoding: draft %s, %s, up to %d guesses a step\n",
                s->draft ? s->draft_path : "none", lookup, o.engine.draft_max);
    }
    printf("listening on http://%s%s%s:%d\n", strchr(o.host, ':') ? "[" : "", o.host,
           strchr(o.host, ':') ? "]" : "", s->port);
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    if (sig == SIGTERM && o.drain_s > 0) {
        int running = atomic_load(&s->active);
        if (running > 0)
            fprintf(stderr, "cellm serve: draining (SIGTERM): %d requests running, up to %us\n",
                    running, o.drain_s);
        int left = serve_drain(s, &set);
        if (left > 0)
            fprintf(stderr, "cellm serve: drain ended with %d requests still running\n", left);
        else if (running > 0)
            fprintf(stderr, "cellm serve: drained\n");
    }
    fprintf(stderr, "cellm serve: stopping (%s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    serve_stop(s);
    return 0;
}

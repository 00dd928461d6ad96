/*
 * serve_metrics.c — the text of GET /metrics in Prometheus' exposition
 * format (version 0.0.4): the server's counters (HTTP statuses, requests,
 * tokens, how requests finished, disconnects, timeouts, refusals), the
 * engine's snapshot (queue, KV blocks, memory, speed, speculative
 * decoding's guesses) and the process's
 * resident memory, so a load test can see the server return to idle.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "serve.h"

typedef struct mbuf {
    char *p;
    size_t n, cap;
    bool oom;
} mbuf;

static void put(mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(mbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->n + (size_t)k + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* One metric without labels. */
static void metric(mbuf *b, const char *name, const char *type, const char *help, double v) {
    put(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

/* A summary without quantiles: its sum and count. */
static void summary(mbuf *b, const char *name, const char *help, double sum, double count) {
    put(b, "# HELP %s %s\n# TYPE %s summary\n%s_sum %.17g\n%s_count %.0f\n", name, help, name, name,
        sum, name, count);
}

static double load(atomic_ullong *c) {
    return (double)atomic_load_explicit(c, memory_order_relaxed);
}

/* Resident memory of this process in bytes (0 when /proc is missing). */
static double rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long size = 0, resident = 0;
    int n = fscanf(f, "%lu %lu", &size, &resident);
    fclose(f);
    return n == 2 ? (double)resident * (double)sysconf(_SC_PAGESIZE) : 0;
}

/* Speculative decoding (--model-draft, --lookup): the engine's counters
 * and two ratios over the server's life, so a dashboard sees whether the
 * guesses pay (zeros when speculation is off). */
static void spec_metrics(mbuf *b, const cellm_stats *st) {
    double drafted = (double)st->n_draft_tokens, kept = (double)st->n_draft_accepted;
    double passes = (double)st->n_spec_passes;
    metric(b, "cellm_draft_tokens_total", "counter", "Tokens guessed ahead (draft or lookup).",
           drafted);
    metric(b, "cellm_draft_accepted_total", "counter",
           "Guessed tokens the model kept (they equal what it chose itself).", kept);
    metric(b, "cellm_spec_passes_total", "counter",
           "Checking passes: a request's rows in one step that carried guesses.", passes);
    metric(b, "cellm_draft_steps_total", "counter", "Forward passes of the draft model.",
           (double)st->n_draft_steps);
    metric(b, "cellm_draft_acceptance_ratio", "gauge",
           "Guesses kept over guesses made, since the start (0 before any).",
           drafted > 0 ? kept / drafted : 0);
    metric(b, "cellm_spec_tokens_per_pass", "gauge",
           "Tokens a checking pass produced on average, kept guesses plus the model's own "
           "(1 before any).",
           passes > 0 ? (kept + passes) / passes : 1);
}

char *metrics_text(server *s) {
    mbuf b = {0};
    serve_counters *c = &s->c;
    put(&b, "# HELP cellm_http_responses_total HTTP responses sent, by status class.\n"
            "# TYPE cellm_http_responses_total counter\n");
    put(&b, "cellm_http_responses_total{class=\"2xx\"} %.0f\n", load(&c->http_2xx));
    put(&b, "cellm_http_responses_total{class=\"4xx\"} %.0f\n", load(&c->http_4xx));
    put(&b, "cellm_http_responses_total{class=\"5xx\"} %.0f\n", load(&c->http_5xx));
    put(&b, "cellm_http_responses_total{class=\"other\"} %.0f\n", load(&c->http_other));
    put(&b, "# HELP cellm_requests_total HTTP requests, by endpoint.\n"
            "# TYPE cellm_requests_total counter\n");
    put(&b, "cellm_requests_total{endpoint=\"chat_completions\"} %.0f\n", load(&c->chat));
    put(&b, "cellm_requests_total{endpoint=\"completions\"} %.0f\n", load(&c->completions));
    put(&b, "cellm_requests_total{endpoint=\"responses\"} %.0f\n", load(&c->responses));
    put(&b, "cellm_requests_total{endpoint=\"other\"} %.0f\n", load(&c->other_routes));
    put(&b, "# HELP cellm_choices_finished_total Generations (choices), by how they ended.\n"
            "# TYPE cellm_choices_finished_total counter\n");
    put(&b, "cellm_choices_finished_total{reason=\"stop\"} %.0f\n", load(&c->finished_stop));
    put(&b, "cellm_choices_finished_total{reason=\"length\"} %.0f\n", load(&c->finished_length));
    put(&b, "cellm_choices_finished_total{reason=\"cancelled\"} %.0f\n", load(&c->cancelled));
    put(&b, "cellm_choices_finished_total{reason=\"error\"} %.0f\n", load(&c->errors));
    metric(&b, "cellm_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
           load(&c->prompt_tokens));
    metric(&b, "cellm_completion_tokens_total", "counter",
           "Completion tokens of finished requests.", load(&c->completion_tokens));
    /* The prefix-cache hit rate over a window is
     * rate(cellm_prompt_cached_tokens_total) / rate(cellm_prompt_tokens_total);
     * behind a balancer, summed over the instances (docs/deploy.md). */
    metric(&b, "cellm_prompt_cached_tokens_total", "counter",
           "Prompt tokens of finished requests the prefix cache gave (not computed).",
           load(&c->cached_tokens));
    put(&b, "# HELP cellm_prefix_cache_requests_total Finished choices whose prompt did or did "
            "not start in the prefix cache.\n"
            "# TYPE cellm_prefix_cache_requests_total counter\n");
    put(&b, "cellm_prefix_cache_requests_total{result=\"hit\"} %.0f\n", load(&c->prefix_hits));
    put(&b, "cellm_prefix_cache_requests_total{result=\"miss\"} %.0f\n", load(&c->prefix_misses));
    if (s->images) {
        uint64_t hits, misses;
        serve_images_stats(s->images, &hits, &misses);
        put(&b, "# HELP cellm_image_cache_total Pictures (image_url parts) found encoded in the "
                "cache or encoded.\n"
                "# TYPE cellm_image_cache_total counter\n");
        put(&b, "cellm_image_cache_total{result=\"hit\"} %.0f\n", (double)hits);
        put(&b, "cellm_image_cache_total{result=\"miss\"} %.0f\n", (double)misses);
    }
    metric(&b, "cellm_ready", "gauge", "1 when serving, 0 while loading or draining (/health).",
           atomic_load(&s->state) == SERVE_READY);
    metric(&b, "cellm_max_queue", "gauge", "--max-queue: engine requests before 503.",
           (double)s->o.max_queue);
    metric(&b, "cellm_client_disconnects_total", "counter",
           "Requests cancelled because the client went away.", load(&c->disconnects));
    metric(&b, "cellm_request_timeouts_total", "counter", "Requests cancelled by --timeout.",
           load(&c->timeouts));
    metric(&b, "cellm_rejected_busy_total", "counter", "Requests refused with 503: queue full.",
           load(&c->rejected_busy));
    summary(&b, "cellm_queue_seconds", "Submit to the first engine step, per choice.",
            load(&c->queue_us) * 1e-6, load(&c->n_timed));
    summary(&b, "cellm_time_to_first_token_seconds", "Submit to the first token, per choice.",
            load(&c->first_token_us) * 1e-6, load(&c->n_first));
    summary(&b, "cellm_generation_seconds", "Submit to finish, per choice.",
            load(&c->total_us) * 1e-6, load(&c->n_timed));
    metric(&b, "cellm_requests_in_flight", "gauge", "Engine requests submitted and not yet freed.",
           atomic_load(&c->in_flight));
    metric(&b, "cellm_streams_open", "gauge", "Streaming responses in progress.",
           atomic_load(&c->streams));

    cellm_stats st;
    if (cellm_engine_stats(s->engine, &st) == CELLM_OK) {
        metric(&b, "cellm_requests_running", "gauge", "Requests the engine is running.",
               st.n_running);
        metric(&b, "cellm_queue_length", "gauge", "Requests waiting for the engine.", st.n_waiting);
        metric(&b, "cellm_kv_blocks_total", "gauge", "KV cache blocks (16 positions each).",
               st.blocks_total);
        metric(&b, "cellm_kv_blocks_used", "gauge", "KV cache blocks in use.", st.blocks_used);
        metric(&b, "cellm_kv_blocks_free", "gauge", "KV cache blocks free.", st.blocks_free);
        metric(&b, "cellm_kv_blocks_cached", "gauge",
               "Free KV blocks the prefix cache still indexes (part of free).", st.blocks_cached);
        metric(&b, "cellm_prefix_cache_tokens_total", "counter",
               "Prompt positions taken from the prefix cache instead of computed.",
               (double)st.n_prefix_tokens);
        metric(&b, "cellm_memory_in_use_bytes", "gauge", "Activations plus KV blocks in use.",
               (double)st.bytes_in_use);
        metric(&b, "cellm_kv_cache_bytes", "gauge", "The KV cache pool.",
               (double)st.bytes_kv_total);
        metric(&b, "cellm_engine_steps_total", "counter", "Forward passes run.",
               (double)st.n_steps);
        metric(&b, "cellm_engine_preemptions_total", "counter", "Requests preempted.",
               (double)st.n_preemptions);
        metric(&b, "cellm_engine_prompt_tokens_total", "counter", "Prompt tokens computed.",
               (double)st.n_prompt_tokens);
        metric(&b, "cellm_engine_completion_tokens_total", "counter", "Completion tokens computed.",
               (double)st.n_completion_tokens);
        metric(&b, "cellm_prompt_tokens_per_second", "gauge", "Prompt speed, last second or so.",
               st.prompt_tokens_per_s);
        metric(&b, "cellm_completion_tokens_per_second", "gauge",
               "Generation speed, last second or so.", st.completion_tokens_per_s);
        spec_metrics(&b, &st);
    }
    metric(&b, "cellm_uptime_seconds", "gauge", "Seconds since the server started.",
           serve_now() - s->t_start);
    metric(&b, "process_resident_memory_bytes", "gauge", "Resident memory of the server.",
           rss_bytes());
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/*
 * kv_calib.c — the statistics that centre and balance a window KV type's
 * keys (kv_cache.kmean, kscale; see kv_calib.h).
 */
#include "model/kv_calib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A short text in the register of documentation: explanations, a little
 * code and numbers, a few sentences of German, French and Spanish. What
 * matters is that the keys and queries it makes look like those of
 * ordinary use; a page of documentation did better over the three scored
 * texts (prose, code, German) than a mix of stories, a recipe and a
 * letter (docs/benchmarks.md). */
const char kv_calib_text[] =
    "# How the pieces fit together\n\n"
    "This page explains how a request travels through the system, what each part is "
    "responsible for, and why the parts are split the way they are. Read it before you change "
    "the code: most mistakes come from a part doing work that belongs to another one.\n\n"
    "A request arrives as text. The reader checks that it is well formed, turns it into a list "
    "of numbers, and hands that list to the scheduler, which decides when the request runs. "
    "The scheduler never waits for one request to finish before starting the next: every step "
    "it takes a little work from each running request, so that a long document does not block "
    "a short question. When memory runs low, it pauses the newest request, frees what that "
    "request held, and starts it again later from the beginning. Nothing is lost, and the "
    "answer is the same as if it had never been paused.\n\n"
    "## Errors\n\n"
    "Every function that can fail returns a status and fills in a message that names the "
    "problem: the file, the field, the value that was wrong and what was expected instead. "
    "The library never prints and never exits; the program that calls it decides what the user "
    "sees. Input from outside (files, network requests, arguments) is checked before it is "
    "used, and a check that fails is an error, not a crash.\n\n"
    "## Example\n\n"
    "```c\n"
    "int sum(const int *a, size_t n) {\n"
    "    int total = 0;\n"
    "    for (size_t i = 0; i < n; i++) total += a[i];\n"
    "    return total;\n"
    "}\n"
    "```\n\n"
    "Run the tests with `make test`; a run takes about two minutes on a laptop and prints one "
    "line for each of the 48 suites, then a summary such as \"47 passed, 1 failed\".\n\n"
    "## Other languages\n\n"
    "Die Anleitung gibt es auch auf Deutsch: Sie erkl\u00e4rt, wie man das Programm installiert "
    "und wie man Fehler meldet. La documentation existe aussi en fran\u00e7ais, et les "
    "traductions sont les bienvenues. Tambi\u00e9n hay una gu\u00eda en espa\u00f1ol para "
    "empezar.\n\n"
    "## History\n\n"
    "The first version was written in a single week to answer one question: could a small "
    "computer do this at all? It could, slowly. Over the following years the design was "
    "rewritten twice, first to handle many users at once and then to use less memory, and each "
    "rewrite kept the old tests so that behaviour did not change by accident. The notes from "
    "those years are still in the repository, and they explain many choices that look strange "
    "today.\n";

cellm_status kv_calibrate(kv_cache *kv, const model *m, const tokenizer *tok, backend *fwd,
                          int32_t max_rows, cellm_error *err) {
    if (!kv->recent) return CELLM_OK;
    tok_ids ids = {0};
    cellm_status st =
        tokenizer_encode(tok, kv_calib_text, strlen(kv_calib_text), TOK_ADD_SPECIAL, &ids, err);
    if (st) return st;
    const int32_t *tokens = ids.ids;
    int32_t L = m->n_layer, kd = m->n_head_kv * m->head_dim, n = (int32_t)ids.n;
    if (n > KV_CALIB_TOKENS) n = KV_CALIB_TOKENS;
    if (n > kv->max_ctx) n = kv->max_ctx;
    kv_calib cb = {L, kd, NULL, NULL, NULL, NULL};
    size_t cells = (size_t)L * (size_t)kd;
    cb.sk = calloc(cells, sizeof *cb.sk);
    cb.sk2 = calloc(cells, sizeof *cb.sk2);
    cb.sq2 = calloc(cells, sizeof *cb.sq2);
    cb.n = calloc((size_t)L, sizeof *cb.n);
    float *mean = malloc(cells * sizeof *mean), *scale = malloc(cells * sizeof *scale);
    fwd_row *rows = malloc((size_t)max_rows * sizeof *rows);
    kv_seq s;
    if (!cb.sk || !cb.sk2 || !cb.sq2 || !cb.n || !mean || !scale || !rows) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory for the KV statistics");
        goto done;
    }
    if ((st = kv_seq_init(kv, &s, err))) goto done;
    /* The text through the model, uncalibrated, in passes of max_rows; a
     * pool too small for all of it gives the statistics of what fit. */
    kv->calib = &cb;
    for (int32_t i = 0; i < n && st == CELLM_OK; i += max_rows) {
        int32_t c = n - i < max_rows ? n - i : max_rows;
        for (int32_t j = 0; j < c; j++) rows[j] = (fwd_row){&s, tokens[i + j], i + j, false};
        const float *lg;
        cellm_error e2;
        if (backend_run(fwd, rows, c, &lg, &e2)) {
            if (e2.code != CELLM_ERR_NO_MEMORY || i == 0) st = err_set(err, e2.code, "%s", e2.msg);
            break;
        }
    }
    kv->calib = NULL;
    kv_seq_free(kv, &s);
    if (st) goto done;
    /* Per channel: the mean taken off (not where a soft cap makes scores
     * depend on more than their differences), and the balance a = (E q^2 /
     * E (k - mean)^2)^(1/4), each head's scaled to a mean square of 1 (the
     * codes' scales absorb any common factor; this keeps f16 copies in
     * range). sqrt only, which every C library rounds the same way. */
    bool centre = m->attn_softcap <= 0;
    for (int32_t l = 0; l < L; l++) {
        double cnt = cb.n[l];
        for (int32_t h = 0; h < m->n_head_kv; h++) {
            double ss = 0;
            for (int32_t c = 0; c < m->head_dim; c++) {
                size_t i = (size_t)l * kd + (size_t)h * m->head_dim + (size_t)c;
                double mu = cnt > 0 && centre ? cb.sk[i] / cnt : 0;
                double k2 = cnt > 0 ? cb.sk2[i] / cnt - mu * mu : 1,
                       q2 = cnt > 0 ? cb.sq2[i] / cnt : 1;
                double a = sqrt(sqrt((q2 + 1e-12) / (k2 > 0 ? k2 + 1e-12 : 1e-12)));
                mean[i] = (float)mu;
                scale[i] = (float)a;
                ss += a * a;
            }
            double norm = sqrt(ss / m->head_dim);
            for (int32_t c = 0; c < m->head_dim; c++) {
                size_t i = (size_t)l * kd + (size_t)h * m->head_dim + (size_t)c;
                scale[i] = (float)(scale[i] / norm);
            }
        }
    }
    free(kv->kmean);
    free(kv->kscale);
    kv->kmean = mean;
    kv->kscale = scale;
    mean = scale = NULL;
done:
    free(cb.sk);
    free(cb.sk2);
    free(cb.sq2);
    free(cb.n);
    free(mean);
    free(scale);
    free(rows);
    tok_ids_free(&ids);
    return st;
}

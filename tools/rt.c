/*
 * rt.c — model runtime and chat formats for the generating commands (see
 * rt.h).
 */
#include "rt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store.h"

cellm_status rt_open(const char *name_or_path, const rt_opts *o, rt *r, cellm_error *err) {
    memset(r, 0, sizeof *r);
    char path[4096];
    cellm_status st = store_resolve(name_or_path, true, path, sizeof path, err);
    if (st) return st;
    if ((st = model_load(path, &r->m, err))) return st;
    if ((st = tokenizer_load(r->m->file, &r->tok, err))) goto fail;
    int threads = o->threads;
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n < 1 ? 1 : n > 4 ? 4 : (int)n;
    }
    r->ctx = o->ctx > 0 ? o->ctx : (r->m->n_ctx_train < 4096 ? r->m->n_ctx_train : 4096);
    r->batch = o->batch > 0 ? o->batch : 256;
    int32_t logit_rows = o->logit_rows > 0 ? o->logit_rows : 1;
    if (logit_rows > r->batch) logit_rows = r->batch;
    size_t kv_bytes = kv_cache_seq_bytes(r->m, r->ctx);
    if ((st = kv_cache_create(r->m, kv_bytes, r->ctx, &r->kv, err))) goto fail;
    if ((st = tp_create(threads, &r->tp, err))) goto fail;
    if ((st = forward_create(r->m, r->kv, r->tp, r->batch, logit_rows, &r->fwd, err))) goto fail;
    return CELLM_OK;
fail:
    rt_close(r);
    return st;
}

void rt_close(rt *r) {
    forward_free(r->fwd);
    tp_destroy(r->tp);
    kv_cache_free(r->kv);
    tokenizer_free(r->tok);
    model_free(r->m);
    memset(r, 0, sizeof *r);
}

cellm_status rt_feed(rt *r, kv_seq *s, const int32_t *tok, int32_t n, float *logits,
                     cellm_error *err) {
    fwd_row rows[512];
    int32_t chunk = r->batch < 512 ? r->batch : 512;
    for (int32_t i = 0; i < n; i += chunk) {
        int32_t c = n - i < chunk ? n - i : chunk;
        for (int32_t j = 0; j < c; j++)
            rows[j] = (fwd_row){s, tok[i + j], s->n_pos + j, logits && i + j == n - 1};
        const float *lg;
        cellm_status st = forward_run(r->fwd, rows, c, &lg, err);
        if (st) return st;
        if (logits && i + c == n) memcpy(logits, lg, sizeof(float) * (size_t)r->m->n_vocab);
    }
    return CELLM_OK;
}

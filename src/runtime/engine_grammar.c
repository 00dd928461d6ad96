/*
 * engine_grammar.c — structured output in the engine: the cellm_grammar
 * handles of cellm.h, the model's token trie (built once, by the first
 * request that needs it), and the two calls the engine thread makes per
 * token of a constrained request: mask the logits before sampling, advance
 * the grammar after. The mask depends only on the request's own grammar
 * state, so a request's tokens stay the same whatever else is in the batch.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"
#include "text/schema.h"
#include "text/toolcall.h"

static cellm_status wrap(grammar *g, cellm_status st, const cellm_error *err, cellm_grammar **out) {
    if (st != CELLM_OK) return engine_fail(st, err->msg);
    cellm_grammar *h = calloc(1, sizeof(*h));
    if (!h) {
        grammar_free(g);
        return engine_fail(CELLM_ERR_NO_MEMORY, "out of memory");
    }
    h->g = g;
    atomic_init(&h->refs, 1);
    *out = h;
    return CELLM_OK;
}

cellm_status cellm_grammar_from_gbnf(const char *text, size_t len, cellm_grammar **out) {
    if (!out || !text) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_grammar_from_gbnf: NULL");
    *out = NULL;
    cellm_error err;
    err_clear(&err);
    grammar *g = NULL;
    cellm_status st = grammar_parse(text, len, &g, &err);
    return wrap(g, st, &err, out);
}

cellm_status cellm_grammar_json_object(cellm_grammar **out) {
    return cellm_grammar_from_gbnf(grammar_json_object_gbnf, strlen(grammar_json_object_gbnf), out);
}

cellm_status cellm_grammar_from_json_schema(const char *schema, size_t len, cellm_grammar **out) {
    if (!out || !schema)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_grammar_from_json_schema: NULL");
    *out = NULL;
    cellm_error err;
    err_clear(&err);
    char *gbnf = NULL;
    size_t n = 0;
    cellm_status st = schema_to_gbnf(schema, len, &gbnf, &n, &err);
    if (st != CELLM_OK) return engine_fail(st, err.msg);
    grammar *g = NULL;
    st = grammar_parse(gbnf, n, &g, &err);
    free(gbnf);
    return wrap(g, st, &err, out);
}

cellm_status cellm_grammar_tool_calls(const cellm_model *cm, const char *tools_json,
                                      const char *name, int parallel, cellm_grammar **out) {
    if (!out || !cm || !tools_json)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_grammar_tool_calls: NULL");
    *out = NULL;
    cellm_error err;
    err_clear(&err);
    char *gbnf = NULL;
    size_t n = 0;
    tool_format fmt = cm->has_chat ? (tool_format)cm->chat.tool_fmt : TOOL_FMT_HERMES;
    cellm_status st = tool_grammar_gbnf(tools_json, name, fmt, parallel != 0, &gbnf, &n, &err);
    if (st != CELLM_OK) return engine_fail(st, err.msg);
    grammar *g = NULL;
    st = grammar_parse(gbnf, n, &g, &err);
    free(gbnf);
    return wrap(g, st, &err, out);
}

cellm_status cellm_tool_calls_parse(const char *text, size_t len, const char *tools_json,
                                    char **out) {
    if (!out || (!text && len))
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_tool_calls_parse: NULL");
    cellm_error err;
    err_clear(&err);
    cellm_status st = tool_calls_parse(text ? text : "", len, tools_json, out, &err);
    return st == CELLM_OK ? CELLM_OK : engine_fail(st, err.msg);
}

void cellm_grammar_free(cellm_grammar *h) {
    if (!h) return;
    if (atomic_fetch_sub(&h->refs, 1) == 1) {
        grammar_free(h->g);
        free(h);
    }
}

/* The model's trie, built on first use. */
static cellm_status model_vocab(cellm_model *cm, grammar_vocab **out, cellm_error *err) {
    pthread_mutex_lock(&cm->gv_mu);
    cellm_status st = CELLM_OK;
    if (!cm->gv) {
        int32_t n = tokenizer_n_vocab(cm->tok);
        const char **pieces = malloc(sizeof(char *) * (size_t)n);
        size_t *lens = malloc(sizeof(size_t) * (size_t)n);
        if (!pieces || !lens) {
            st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        } else {
            for (int32_t t = 0; t < n; t++) {
                pieces[t] = tokenizer_piece(cm->tok, t, 0, &lens[t]);
                if (!pieces[t]) lens[t] = 0;
            }
            st = grammar_vocab_create(pieces, lens, n, &cm->gv, err);
        }
        free(pieces);
        free(lens);
    }
    *out = cm->gv;
    pthread_mutex_unlock(&cm->gv_mu);
    return st;
}

cellm_status engine_grammar_attach(cellm_engine *e, cellm_request *r, const cellm_grammar *g,
                                   cellm_error *err) {
    /* The trie is the model's cache; building it changes no result. */
    cellm_model *cm = (cellm_model *)e->model;
    grammar_vocab *v = NULL;
    cellm_status st = model_vocab(cm, &v, err);
    if (st) return st;
    r->grammar = (cellm_grammar *)g;
    atomic_fetch_add(&r->grammar->refs, 1);
    r->grammar_row = malloc(sizeof(float) * (size_t)e->model->m->n_vocab);
    if (!r->grammar_row) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    return grammar_state_create(g->g, v, &r->gst, err);
}

const float *engine_grammar_mask(cellm_engine *e, cellm_request *r, const float *row) {
    double t0 = engine_now_s();
    int32_t n = e->model->m->n_vocab;
    const uint32_t *bits = grammar_state_mask(r->gst);
    float *out = r->grammar_row;
    for (int32_t w = 0; w * 32 < n; w++) {
        int32_t base = w * 32, m = n - base < 32 ? n - base : 32;
        uint32_t b = bits[w];
        if (b == 0) {
            for (int32_t k = 0; k < m; k++) out[base + k] = -INFINITY;
        } else if (b == 0xFFFFFFFFu) {
            memcpy(out + base, row + base, (size_t)m * sizeof(float));
        } else {
            for (int32_t k = 0; k < m; k++)
                out[base + k] = (b >> k) & 1 ? row[base + k] : -INFINITY;
        }
    }
    bool whole = grammar_state_complete(r->gst);
    for (int32_t i = 0; i < r->n_stop; i++) {
        int32_t t = r->stop[i];
        if (t >= 0 && t < n) out[t] = whole ? row[t] : -INFINITY;
    }
    double dt = engine_now_s() - t0;
    e->t_grammar += dt;
    e->t_grammar_mask += dt;
    e->n_grammar_mask++;
    return out;
}

bool engine_grammar_allows(cellm_engine *e, cellm_request *r, int32_t t) {
    double t0 = engine_now_s();
    bool ok;
    bool stop = false;
    for (int32_t i = 0; i < r->n_stop; i++) stop = stop || r->stop[i] == t;
    if (stop) {
        ok = grammar_state_complete(r->gst);
    } else {
        size_t len = 0;
        const char *p = tokenizer_piece(e->model->tok, t, 0, &len);
        ok = p && len > 0 && grammar_state_allows(r->gst, p, len);
    }
    e->t_grammar += engine_now_s() - t0;
    return ok;
}

bool engine_grammar_take(cellm_engine *e, cellm_request *r, int32_t t) {
    double t0 = engine_now_s();
    size_t len = 0;
    const char *p = tokenizer_piece(e->model->tok, t, 0, &len);
    bool ok = p && len > 0 && grammar_state_accept(r->gst, p, len);
    e->t_grammar += engine_now_s() - t0;
    e->n_grammar++;
    return ok;
}

void engine_grammar_release(cellm_request *r) {
    grammar_state_free(r->gst);
    free(r->grammar_row);
    cellm_grammar_free(r->grammar);
    r->gst = NULL;
    r->grammar_row = NULL;
    r->grammar = NULL;
}

void engine_grammar_model_free(cellm_model *cm) {
    grammar_vocab_free(cm->gv);
    cm->gv = NULL;
}

/*
 * model_info.c — the public calls a server needs besides generation (see
 * the "model facts and text" block of cellm.h): what a model is, tokenizing
 * with explicit flags, turning ids back into text, and an engine's context
 * length. Thin wrappers over the tokenizer and the model description.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/engine.h"
#include "format/gguf.h"

cellm_status cellm_model_get_info(const cellm_model *cm, cellm_model_info *out) {
    if (!cm || !out) return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_model_get_info: NULL");
    memset(out, 0, sizeof *out);
    gguf_str s;
    if (gguf_get_str(cm->m->file, "general.name", &s)) {
        size_t n = s.len < sizeof out->name ? (size_t)s.len : sizeof out->name - 1;
        memcpy(out->name, s.ptr, n);
        out->name[n] = '\0';
    }
    snprintf(out->arch, sizeof out->arch, "%s", cm->m->arch);
    out->n_vocab = cm->m->n_vocab;
    out->n_ctx_train = cm->m->n_ctx_train;
    out->bos = tokenizer_bos(cm->tok);
    out->eos = tokenizer_eos(cm->tok);
    return CELLM_OK;
}

cellm_status cellm_tokenize_ex(const cellm_model *cm, const char *text, size_t len, unsigned flags,
                               int32_t **ids, int32_t *n) {
    if (!cm || (!text && len) || !ids || !n)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_tokenize_ex: a NULL argument");
    *ids = NULL;
    *n = 0;
    unsigned tf = 0;
    if (flags & CELLM_TOKENIZE_ADD_SPECIAL) tf |= TOK_ADD_SPECIAL;
    if (flags & CELLM_TOKENIZE_PARSE_SPECIAL) tf |= TOK_PARSE_SPECIAL;
    cellm_error err;
    err_clear(&err);
    tok_ids v = {0};
    if (tokenizer_encode(cm->tok, text ? text : "", len, tf, &v, &err)) {
        tok_ids_free(&v);
        return engine_fail(err.code, err.msg);
    }
    if (v.n > INT32_MAX) {
        tok_ids_free(&v);
        return engine_fail(CELLM_ERR_INVALID_ARG, "the text has too many tokens");
    }
    *ids = v.ids;
    *n = (int32_t)v.n;
    return CELLM_OK;
}

cellm_status cellm_detokenize(const cellm_model *cm, const int32_t *ids, int32_t n, int special,
                              char **text, size_t *len) {
    if (!cm || (!ids && n) || n < 0 || !text || !len)
        return engine_fail(CELLM_ERR_INVALID_ARG, "cellm_detokenize: a bad argument");
    *text = NULL;
    *len = 0;
    cellm_error err;
    err_clear(&err);
    if (tokenizer_decode(cm->tok, ids, (size_t)n, special ? TOK_DECODE_SPECIAL : 0, text, len,
                         &err))
        return engine_fail(err.code, err.msg);
    return CELLM_OK;
}

int32_t cellm_engine_n_ctx(const cellm_engine *e) {
    return e ? e->kv->max_ctx : 0;
}

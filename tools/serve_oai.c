/*
 * serve_oai.c — the endpoints of `cellm serve` besides the page and the
 * health check: chat completions and completions (checked here, run by a
 * job, serve_job.c), the Responses API (parsed by serve_responses.c, run
 * as a chat job), the model list, and llama-server's /tokenize and
 * /detokenize.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "serve.h"

static serve_limits limits(const server *s) {
    serve_limits l;
    l.n_vocab = s->info.n_vocab;
    l.n_ctx = s->n_ctx;
    l.max_n = s->o.max_n;
    l.n_predict = s->o.n_predict;
    l.temperature = s->o.temperature;
    l.images = s->images;
    return l;
}

/* A parsed request (ok) for another model is a 404; then *rq is freed. */
static bool model_known(const server *s, bool ok, serve_req *rq, serve_err *e) {
    if (!ok || !rq->model || !strcmp(rq->model, s->model_id)) return ok;
    serr(e, 404, "model_not_found", "model", "the model '%s' does not exist; this server has '%s'",
         rq->model, s->model_id);
    serve_req_free(rq);
    return false;
}

/* The request's affinity key goes back in its reply's headers and log. */
static void note_affinity(server *s, struct MHD_Connection *conn, const serve_req *rq) {
    char key[SERVE_AFFINITY_MAX];
    serve_affinity(s, conn, rq, key);
    http_set_affinity(key);
}

int oai_completions(server *s, struct MHD_Connection *conn, serve_kind kind, const char *body,
                    size_t len) {
    serve_err e;
    serve_limits lim = limits(s);
    serve_req rq;
    bool ok = model_known(s, serve_req_parse(body, len, kind, &lim, &rq, &e), &rq, &e);
    if (ok) note_affinity(s, conn, &rq);
    job *j = ok ? job_start(s, conn, &rq, &e) : NULL;
    if (!j) return http_reply_error(s, conn, &e);
    return job_reply(j);
}

int oai_responses(server *s, struct MHD_Connection *conn, const char *body, size_t len) {
    serve_err e;
    serve_limits lim = limits(s);
    serve_req rq;
    bool ok = model_known(
        s, responses_parse(body, len, &lim, s->model_id, serve_random(s), &rq, &e), &rq, &e);
    if (ok) note_affinity(s, conn, &rq);
    job *j = ok ? job_start(s, conn, &rq, &e) : NULL;
    if (!j) {
        responses_err_param(&e); /* the engine's refusals name chat's messages */
        return http_reply_error(s, conn, &e);
    }
    return job_reply(j);
}

static cJSON *model_json(const server *s) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "cellm");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddStringToObject(meta, "name", s->info.name);
    cJSON_AddStringToObject(meta, "arch", s->info.arch);
    cJSON_AddNumberToObject(meta, "n_vocab", s->info.n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", s->info.n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_ctx", s->n_ctx);
    /* What the model takes in: text, and with a projector pictures. */
    cJSON *in = cJSON_AddArrayToObject(meta, "input_modalities");
    cJSON_AddItemToArray(in, cJSON_CreateString("text"));
    if (s->images) cJSON_AddItemToArray(in, cJSON_CreateString("image"));
    return m;
}

int oai_models(server *s, struct MHD_Connection *conn, const char *id) {
    atomic_fetch_add_explicit(&s->c.other_routes, 1, memory_order_relaxed);
    if (id) {
        if (strcmp(id, s->model_id)) {
            serve_err e;
            serr(&e, 404, "model_not_found", "model", "the model '%s' does not exist", id);
            return http_reply_error(s, conn, &e);
        }
        return http_reply_json(s, conn, 200, model_json(s));
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "object", "list");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(r, "data"), model_json(s));
    return http_reply_json(s, conn, 200, r);
}

/* Parses a small JSON object body for /tokenize and /detokenize. */
static cJSON *parse_object(const char *body, size_t len, serve_err *e) {
    if (!len || memchr(body, '\0', len) || !serve_utf8_valid(body, len)) {
        serr(e, 400, "invalid_json", NULL, "the request body must be a UTF-8 JSON object");
        return NULL;
    }
    cJSON *root = serve_json_parse(body, len, NULL);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        serr(e, 400, "invalid_json", NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

static bool opt_bool(const cJSON *root, const char *name, bool dflt, bool *out, serve_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    *out = dflt;
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) return serr(e, 400, "invalid_type", name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return true;
}

int oai_tokenize(server *s, struct MHD_Connection *conn, const char *body, size_t len) {
    atomic_fetch_add_explicit(&s->c.other_routes, 1, memory_order_relaxed);
    serve_err e;
    cJSON *root = parse_object(body, len, &e);
    if (!root) return http_reply_error(s, conn, &e);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(root, "content");
    bool add_special, parse_special, pieces;
    if (!cJSON_IsString(content)) {
        serr(&e, 400, content ? "invalid_type" : "missing_required_parameter", "content",
             "'content' must be a string");
    } else if (opt_bool(root, "add_special", false, &add_special, &e) &&
               opt_bool(root, "parse_special", true, &parse_special, &e) &&
               opt_bool(root, "with_pieces", false, &pieces, &e)) {
        int32_t *ids = NULL, n = 0;
        unsigned fl = (add_special ? CELLM_TOKENIZE_ADD_SPECIAL : 0) |
                      (parse_special ? CELLM_TOKENIZE_PARSE_SPECIAL : 0);
        if (cellm_tokenize_ex(s->model, content->valuestring, strlen(content->valuestring), fl,
                              &ids, &n)) {
            serr(&e, 400, "invalid_value", "content", "%s", cellm_last_error());
        } else {
            cJSON *r = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(r, "tokens");
            for (int32_t i = 0; i < n; i++) {
                if (!pieces) {
                    cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
                    continue;
                }
                cJSON *t = cJSON_CreateObject();
                cJSON_AddNumberToObject(t, "id", ids[i]);
                char *text = NULL;
                size_t tn = 0;
                if (cellm_detokenize(s->model, &ids[i], 1, 1, &text, &tn) == CELLM_OK)
                    serve_json_add_text(t, "piece", text, tn);
                free(text);
                cJSON_AddItemToArray(arr, t);
            }
            free(ids);
            cJSON_Delete(root);
            return http_reply_json(s, conn, 200, r);
        }
    }
    cJSON_Delete(root);
    return http_reply_error(s, conn, &e);
}

int oai_detokenize(server *s, struct MHD_Connection *conn, const char *body, size_t len) {
    atomic_fetch_add_explicit(&s->c.other_routes, 1, memory_order_relaxed);
    serve_err e;
    cJSON *root = parse_object(body, len, &e);
    if (!root) return http_reply_error(s, conn, &e);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(root, "tokens"), *t;
    int n = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks) : -1;
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    int k = 0;
    bool ok = n >= 0 && (n == 0 || ids);
    if (ok) cJSON_ArrayForEach(t, toks) {
            if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) ||
                t->valuedouble < 0 || t->valuedouble >= s->info.n_vocab) {
                ok = false;
                break;
            }
            ids[k++] = (int32_t)t->valuedouble;
        }
    cJSON_Delete(root);
    if (!ok) {
        free(ids);
        serr(&e, 400, "invalid_value", "tokens", "'tokens' must be an array of token ids in 0..%d",
             s->info.n_vocab - 1);
        return http_reply_error(s, conn, &e);
    }
    char *text = NULL;
    size_t tn = 0;
    cellm_status st = cellm_detokenize(s->model, ids, k, 1, &text, &tn);
    free(ids);
    if (st) {
        serr(&e, 400, "invalid_value", "tokens", "%s", cellm_last_error());
        return http_reply_error(s, conn, &e);
    }
    cJSON *r = cJSON_CreateObject();
    serve_json_add_text(r, "content", text, tn);
    free(text);
    return http_reply_json(s, conn, 200, r);
}

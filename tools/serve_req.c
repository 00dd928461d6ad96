/*
 * serve_req.c — the request JSON of /v1/chat/completions and
 * /v1/completions, parsed with cJSON and checked field by field into a
 * serve_req, or refused with an OpenAI-style error naming the field.
 *
 * Nothing here touches the engine: it needs only the limits (vocabulary,
 * context, choices), so the fuzz target runs it on its own. Every input is
 * hostile: any bytes, any types, any sizes. Absent and null fields take
 * their defaults, as in OpenAI's API; unknown fields are ignored, so that
 * clients sending extra options still work; known options cellm cannot
 * honour (tools on text completions, suffix) are refused rather than
 * silently dropped. Tools on chat are read by serve_tools.c.
 */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "serve.h"
#include "serve_json.h"

#define MAX_MESSAGES 4096
#define MAX_PROMPTS 64
#define MAX_STOP_LEN 256

bool serr(serve_err *e, int status, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = status >= 500 ? "server_error" : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

bool serve_utf8_valid(const char *str, size_t len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned cp, min;
        if ((c & 0xE0) == 0xC0) {
            n = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            n = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            n = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (len - i < n) return false;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += n;
    }
    return true;
}

char *serve_utf8_clean(const char *s, size_t n) {
    char *out = malloc(n * 3 + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = 1;
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) k = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        if (k > n - i || !serve_utf8_valid(s + i, k)) {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
            continue;
        }
        memcpy(out + o, s + i, k);
        o += k;
        i += k;
    }
    out[o] = '\0';
    return out;
}

void *serve_json_add_text(void *obj, const char *name, const char *s, size_t n) {
    char *t = serve_utf8_clean(s ? s : "", s ? n : 0);
    cJSON *v = cJSON_AddStringToObject((cJSON *)obj, name, t ? t : "");
    free(t);
    return v;
}

bool serve_grow(char **p, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = need * 2 < 256 ? 256 : need * 2;
    char *q = realloc(*p, c);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

static const char *type_name(const cJSON *v) {
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

const cJSON *serve_field(const cJSON *obj, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

/* A number field in [lo, hi]; *out keeps its default when absent. */
static bool get_num(const cJSON *obj, const char *name, double lo, double hi, float *out,
                    serve_err *e) {
    const cJSON *v = serve_field(obj, name);
    if (!v) return true;
    if (!cJSON_IsNumber(v))
        return serr(e, 400, "invalid_type", name, "'%s' must be a number, not %s", name,
                    type_name(v));
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return serr(e, 400, "invalid_value", name, "'%s' must be between %g and %g (got %g)", name,
                    lo, hi, v->valuedouble);
    *out = (float)v->valuedouble;
    return true;
}

/* An integer field in [lo, hi]; *out keeps its default when absent. */
static bool get_int(const cJSON *obj, const char *name, double lo, double hi, int64_t *out,
                    serve_err *e) {
    const cJSON *v = serve_field(obj, name);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return serr(e, 400, "invalid_type", name, "'%s' must be an integer, not %s", name,
                    cJSON_IsNumber(v) ? "a fraction" : type_name(v));
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return serr(e, 400, "invalid_value", name, "'%s' must be between %.0f and %.0f (got %.0f)",
                    name, lo, hi, v->valuedouble);
    *out = (int64_t)v->valuedouble;
    return true;
}

static bool get_bool(const cJSON *obj, const char *name, bool *out, serve_err *e) {
    const cJSON *v = serve_field(obj, name);
    if (!v) return true;
    if (!cJSON_IsBool(v))
        return serr(e, 400, "invalid_type", name, "'%s' must be a boolean, not %s", name,
                    type_name(v));
    *out = cJSON_IsTrue(v);
    return true;
}

/* The URL of an image_url part: {"url": "..."} or, as some clients send
 * it, the string itself; NULL when neither. */
static const char *image_url_of(const cJSON *part) {
    const cJSON *iu = serve_field(part, "image_url");
    if (cJSON_IsString(iu)) return iu->valuestring;
    const cJSON *url = cJSON_IsObject(iu) ? serve_field(iu, "url") : NULL;
    return cJSON_IsString(url) ? url->valuestring : NULL;
}

/* The text of a message's content: a string, or an array of parts joined:
 * text parts as they are, each image_url part (with a projector: lim's
 * images) as "<image>", its picture appended to r->images. A new string,
 * or NULL with *e set. */
static char *content_text(const cJSON *c, const char *role, int i, const serve_limits *lim,
                          serve_req *r, serve_err *e) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", i);
    if (!c) {
        if (!strcmp(role, "assistant")) return dup_str(""); /* e.g. a tool-call turn */
        serr(e, 400, "missing_required_parameter", param, "'%s' is missing", param);
        return NULL;
    }
    if (cJSON_IsString(c)) return dup_str(c->valuestring);
    if (!cJSON_IsArray(c)) {
        serr(e, 400, "invalid_type", param, "'%s' must be a string or an array of parts, not %s",
             param, type_name(c));
        return NULL;
    }
    static const char mark[] = "<image>";
    size_t n = 0;
    int k = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *type = serve_field(part, "type"), *text = serve_field(part, "text");
        bool is_image =
            cJSON_IsObject(part) && cJSON_IsString(type) && !strcmp(type->valuestring, "image_url");
        if (is_image) {
            char pp[96];
            snprintf(pp, sizeof pp, "messages[%d].content[%d].image_url", i, k);
            if (!lim->images) {
                serr(e, 400, "invalid_value", pp,
                     "this model takes no pictures: the server runs without a vision projector "
                     "(cellm serve --mmproj FILE)");
                return NULL;
            }
            const char *url = image_url_of(part);
            if (!url) {
                serr(e, 400, "invalid_value", pp, "'%s' must be {\"url\": string}", pp);
                return NULL;
            }
            if (r->n_images == CELLM_MAX_IMAGES) {
                serr(e, 400, "invalid_value", pp, "a request takes at most %d pictures",
                     CELLM_MAX_IMAGES);
                return NULL;
            }
            cellm_image_embed *im = serve_image_from_url(lim->images, url, pp, e);
            if (!im) return NULL;
            r->images[r->n_images++] = im;
            n += sizeof mark - 1;
        } else if (!cJSON_IsObject(part) || !cJSON_IsString(type) ||
                   strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            serr(e, 400, "invalid_value", param,
                 "the parts of '%s' must be objects {\"type\": \"text\", \"text\": string}%s",
                 param,
                 lim->images ? " or {\"type\": \"image_url\", \"image_url\": {\"url\": string}}"
                             : "; cellm reads text only (pictures need --mmproj)");
            return NULL;
        } else {
            n += strlen(text->valuestring);
        }
        k++;
    }
    char *out = malloc(n + 1);
    if (!out) {
        serr(e, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    n = 0;
    cJSON_ArrayForEach(part, c) { /* each checked above: text or image_url */
        const char *t = !strcmp(serve_field(part, "type")->valuestring, "image_url")
                            ? mark
                            : serve_field(part, "text")->valuestring;
        size_t len = strlen(t);
        memcpy(out + n, t, len);
        n += len;
    }
    out[n] = '\0';
    return out;
}

static bool parse_messages(const cJSON *root, const serve_limits *lim, serve_req *r, serve_err *e) {
    const cJSON *msgs = serve_field(root, "messages");
    if (!msgs)
        return serr(e, 400, "missing_required_parameter", "messages", "'messages' is missing");
    if (!cJSON_IsArray(msgs))
        return serr(e, 400, "invalid_type", "messages", "'messages' must be an array, not %s",
                    type_name(msgs));
    int n = cJSON_GetArraySize(msgs);
    if (n < 1 || n > MAX_MESSAGES)
        return serr(e, 400, "invalid_value", "messages", "'messages' must hold 1..%d messages",
                    MAX_MESSAGES);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) return serr(e, 500, NULL, NULL, "out of memory");
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool"};
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        char param[64];
        snprintf(param, sizeof param, "messages[%d]", i);
        if (!cJSON_IsObject(m))
            return serr(e, 400, "invalid_type", param, "'%s' must be an object, not %s", param,
                        type_name(m));
        const cJSON *role = serve_field(m, "role");
        snprintf(param, sizeof param, "messages[%d].role", i);
        if (!cJSON_IsString(role))
            return serr(e, 400, role ? "invalid_type" : "missing_required_parameter", param,
                        "'%s' must be a string", param);
        const char *rl = NULL;
        for (size_t k = 0; k < sizeof roles / sizeof *roles; k++)
            if (!strcmp(role->valuestring, roles[k])) rl = roles[k];
        if (!rl)
            return serr(e, 400, "invalid_value", param,
                        "'%s' must be system, developer, user, assistant or tool", param);
        if (!strcmp(rl, "developer")) rl = "system";
        char *text = content_text(serve_field(m, "content"), rl, i, lim, r, e);
        if (!text) return false;
        r->messages[i].role = rl; /* static storage */
        r->messages[i].content = text;
        r->n_messages = ++i;
    }
    return true;
}

/* Token ids of a JSON array (all integers in the vocabulary). */
static bool token_array(const cJSON *a, const serve_limits *lim, serve_prompt *p, serve_err *e) {
    int n = cJSON_GetArraySize(a);
    if (n < 1) return serr(e, 400, "invalid_value", "prompt", "a token prompt must not be empty");
    p->tokens = malloc((size_t)n * sizeof *p->tokens);
    if (!p->tokens) return serr(e, 500, NULL, NULL, "out of memory");
    const cJSON *t;
    cJSON_ArrayForEach(t, a) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble >= lim->n_vocab)
            return serr(e, 400, "invalid_value", "prompt",
                        "token ids in 'prompt' must be integers in 0..%d", lim->n_vocab - 1);
        p->tokens[p->n_tokens++] = (int32_t)t->valuedouble;
    }
    return true;
}

static bool parse_prompt(const cJSON *root, const serve_limits *lim, serve_req *r, serve_err *e) {
    const cJSON *p = serve_field(root, "prompt");
    if (!p) return serr(e, 400, "missing_required_parameter", "prompt", "'prompt' is missing");
    if (cJSON_IsString(p)) {
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts || !(r->prompts[0].text = dup_str(p->valuestring)))
            return serr(e, 500, NULL, NULL, "out of memory");
        r->n_prompts = 1;
        return true;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) < 1)
        return serr(e, 400, "invalid_type", "prompt",
                    "'prompt' must be a string, an array of strings, an array of token ids or an "
                    "array of those");
    const cJSON *first = p->child;
    if (cJSON_IsNumber(first)) { /* one prompt of token ids */
        r->prompts = calloc(1, sizeof *r->prompts);
        if (!r->prompts) return serr(e, 500, NULL, NULL, "out of memory");
        r->n_prompts = 1;
        return token_array(p, lim, &r->prompts[0], e);
    }
    int n = cJSON_GetArraySize(p);
    if (n > MAX_PROMPTS)
        return serr(e, 400, "invalid_value", "prompt", "at most %d prompts per request",
                    MAX_PROMPTS);
    r->prompts = calloc((size_t)n, sizeof *r->prompts);
    if (!r->prompts) return serr(e, 500, NULL, NULL, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, p) {
        serve_prompt *sp = &r->prompts[r->n_prompts++];
        if (cJSON_IsString(it) && cJSON_IsString(first)) {
            if (!(sp->text = dup_str(it->valuestring)))
                return serr(e, 500, NULL, NULL, "out of memory");
        } else if (cJSON_IsArray(it) && cJSON_IsArray(first)) {
            if (!token_array(it, lim, sp, e)) return false;
        } else {
            return serr(e, 400, "invalid_type", "prompt",
                        "the elements of 'prompt' must be all strings or all token arrays");
        }
    }
    return true;
}

static bool parse_stop(const cJSON *root, serve_req *r, serve_err *e) {
    const cJSON *s = serve_field(root, "stop");
    if (!s) return true;
    const cJSON *one = cJSON_IsString(s) ? s : NULL;
    if (!one && !cJSON_IsArray(s))
        return serr(e, 400, "invalid_type", "stop",
                    "'stop' must be a string or an array of strings, not %s", type_name(s));
    if (!one && cJSON_GetArraySize(s) > SERVE_MAX_STOP)
        return serr(e, 400, "invalid_value", "stop", "at most %d stop strings", SERVE_MAX_STOP);
    const cJSON *it = one ? one : s->child;
    for (; it; it = one ? NULL : it->next) {
        if (!cJSON_IsString(it))
            return serr(e, 400, "invalid_type", "stop", "'stop' must hold strings only");
        size_t n = strlen(it->valuestring);
        if (n == 0 || n > MAX_STOP_LEN)
            return serr(e, 400, "invalid_value", "stop", "stop strings must have 1..%d bytes",
                        MAX_STOP_LEN);
        if (!(r->stop[r->n_stop] = dup_str(it->valuestring)))
            return serr(e, 500, NULL, NULL, "out of memory");
        r->n_stop++;
    }
    return true;
}

static bool parse_bias(const cJSON *root, const serve_limits *lim, serve_req *r, serve_err *e) {
    const cJSON *b = serve_field(root, "logit_bias");
    if (!b) return true;
    if (!cJSON_IsObject(b))
        return serr(e, 400, "invalid_type", "logit_bias",
                    "'logit_bias' must be an object of token id -> bias, not %s", type_name(b));
    if (cJSON_GetArraySize(b) > SERVE_MAX_BIAS)
        return serr(e, 400, "invalid_value", "logit_bias", "at most %d entries in 'logit_bias'",
                    SERVE_MAX_BIAS);
    const cJSON *it;
    cJSON_ArrayForEach(it, b) {
        char *end = NULL;
        long id = it->string ? strtol(it->string, &end, 10) : -1;
        if (!it->string || !it->string[0] || *end || id < 0 || id >= lim->n_vocab)
            return serr(e, 400, "invalid_value", "logit_bias",
                        "the keys of 'logit_bias' must be token ids in 0..%d", lim->n_vocab - 1);
        if (!cJSON_IsNumber(it) || !(it->valuedouble >= -100 && it->valuedouble <= 100))
            return serr(e, 400, "invalid_value", "logit_bias",
                        "the values of 'logit_bias' must be numbers in -100..100");
        r->bias_tok[r->n_bias] = (int32_t)id;
        r->bias_val[r->n_bias++] = (float)it->valuedouble;
    }
    return true;
}

/* Options cellm does not have: refused when asked for, so a client never
 * believes it got them. */
static bool refuse_unsupported(const cJSON *root, serve_kind kind, serve_err *e) {
    const cJSON *v = serve_field(root, "tools");
    if (kind != SERVE_CHAT && v && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 0))
        return serr(e, 400, "unsupported_parameter", "tools",
                    "tools are for /v1/chat/completions, not text completions");
    v = serve_field(root, "suffix");
    if (v && !(cJSON_IsString(v) && !v->valuestring[0]))
        return serr(e, 400, "unsupported_parameter", "suffix", "cellm does not support 'suffix'");
    return true;
}

/* Structured output: OpenAI's response_format (text, json_object,
 * json_schema with its schema) and llama-server's `grammar` (GBNF text),
 * compiled here so that a bad schema or grammar is a 400 that names the
 * problem. */
static bool parse_format(const cJSON *root, serve_req *r, serve_err *e) {
    const cJSON *rf = serve_field(root, "response_format"), *gr = serve_field(root, "grammar");
    if (gr && !cJSON_IsNull(gr)) {
        if (!cJSON_IsString(gr))
            return serr(e, 400, "invalid_type", "grammar", "'grammar' must be a string of GBNF");
        if (gr->valuestring[0]) {
            if (cellm_grammar_from_gbnf(gr->valuestring, strlen(gr->valuestring), &r->grammar))
                return serr(e, 400, "invalid_value", "grammar", "%s", cellm_last_error());
        }
    }
    if (!rf || cJSON_IsNull(rf)) return true;
    const cJSON *t = cJSON_IsObject(rf) ? serve_field(rf, "type") : NULL;
    if (!cJSON_IsString(t))
        return serr(e, 400, "invalid_type", "response_format",
                    "'response_format' must be an object with a string 'type'");
    const char *type = t->valuestring;
    if (!strcmp(type, "text")) return true;
    if (r->grammar)
        return serr(e, 400, "invalid_value", "response_format",
                    "give 'grammar' or a JSON 'response_format', not both");
    if (!strcmp(type, "json_object")) {
        if (cellm_grammar_json_object(&r->grammar))
            return serr(e, 500, NULL, NULL, "%s", cellm_last_error());
        return true;
    }
    if (strcmp(type, "json_schema") != 0)
        return serr(e, 400, "invalid_value", "response_format",
                    "response_format type '%s' is not one of text, json_object, json_schema", type);
    const cJSON *js = serve_field(rf, "json_schema");
    const cJSON *schema = cJSON_IsObject(js) ? serve_field(js, "schema") : NULL;
    if (!schema)
        return serr(e, 400, "invalid_value", "response_format",
                    "response_format json_schema needs 'json_schema': {'schema': ...}");
    char *text = cJSON_PrintUnformatted(schema);
    if (!text) return serr(e, 500, NULL, NULL, "out of memory");
    cellm_status st = cellm_grammar_from_json_schema(text, strlen(text), &r->grammar);
    cJSON_free(text);
    if (st != CELLM_OK)
        return serr(e, 400, "invalid_value", "response_format", "%s", cellm_last_error());
    return true;
}

/* Chat: `logprobs` (boolean) and `top_logprobs` (0..20, with logprobs
 * only). Completions: `logprobs` as the number of alternatives (0..20), as
 * OpenAI's legacy API has it. */
static bool parse_logprobs(const cJSON *root, serve_kind kind, serve_req *r, serve_err *e) {
    int64_t v = -1;
    if (kind == SERVE_CHAT) {
        if (!get_bool(root, "logprobs", &r->logprobs, e) ||
            !get_int(root, "top_logprobs", 0, CELLM_MAX_TOP_LOGPROBS, &v, e))
            return false;
        if (v > 0 && !r->logprobs)
            return serr(e, 400, "invalid_value", "top_logprobs",
                        "'top_logprobs' needs 'logprobs' to be true");
    } else {
        if (!get_int(root, "logprobs", 0, CELLM_MAX_TOP_LOGPROBS, &v, e)) return false;
        r->logprobs = v >= 0;
    }
    r->top_logprobs = v > 0 ? (int32_t)v : 0;
    return true;
}

static bool parse_fields(const cJSON *root, serve_kind kind, const serve_limits *lim, serve_req *r,
                         serve_err *e) {
    if (!refuse_unsupported(root, kind, e)) return false;
    const cJSON *model = serve_field(root, "model");
    if (model && !cJSON_IsString(model))
        return serr(e, 400, "invalid_type", "model", "'model' must be a string, not %s",
                    type_name(model));
    if (model && !(r->model = dup_str(model->valuestring)))
        return serr(e, 500, NULL, NULL, "out of memory");
    const cJSON *user = serve_field(root, "user");
    if (user && !cJSON_IsString(user))
        return serr(e, 400, "invalid_type", "user", "'user' must be a string");
    if (user && !(r->user = dup_str(user->valuestring)))
        return serr(e, 500, NULL, NULL, "out of memory");
    if (kind == SERVE_CHAT ? !parse_messages(root, lim, r, e) || !serve_tools_parse(root, r, e)
                           : !parse_prompt(root, lim, r, e))
        return false;

    int64_t v = lim->n_predict;
    const char *mt = kind == SERVE_CHAT && serve_field(root, "max_completion_tokens")
                         ? "max_completion_tokens"
                         : "max_tokens";
    /* 0 on completions: the prompt alone (echo with logprobs scores it). */
    if (!get_int(root, mt, kind == SERVE_CHAT ? 1 : 0, lim->n_ctx, &v, e)) return false;
    r->max_tokens = (int32_t)v;
    v = 1;
    if (!get_int(root, "n", 1, lim->max_n, &v, e)) return false;
    r->n = (int)v;
    if ((int64_t)r->n * (r->n_prompts ? r->n_prompts : 1) > lim->max_n)
        return serr(e, 400, "invalid_value", "n",
                    "n x prompts must be at most %d (the server's --max-choices)", lim->max_n);
    if (!get_num(root, "temperature", 0, 2, &r->temperature, e) ||
        !get_num(root, "top_p", 0, 1, &r->top_p, e) ||
        !get_num(root, "min_p", 0, 1, &r->min_p, e) ||
        !get_num(root, "typical_p", 0, 1, &r->typical_p, e) ||
        !get_num(root, "presence_penalty", -2, 2, &r->presence_penalty, e) ||
        !get_num(root, "frequency_penalty", -2, 2, &r->frequency_penalty, e) ||
        !get_num(root, "repeat_penalty", 0, 10, &r->repeat_penalty, e))
        return false;
    v = 0;
    if (!get_int(root, "top_k", 0, lim->n_vocab, &v, e)) return false;
    r->top_k = (int32_t)v;
    v = r->repeat_last_n;
    if (!get_int(root, "repeat_last_n", -1, lim->n_ctx, &v, e)) return false;
    r->repeat_last_n = (int32_t)v;
    const cJSON *seed = serve_field(root, "seed");
    if (seed) {
        if (!cJSON_IsNumber(seed) || seed->valuedouble != floor(seed->valuedouble) ||
            !(seed->valuedouble >= -9223372036854775808.0 &&
              seed->valuedouble < 18446744073709551616.0))
            return serr(e, 400, "invalid_type", "seed", "'seed' must be a 64-bit integer");
        r->has_seed = true;
        r->seed = seed->valuedouble < 0 ? (uint64_t)(int64_t)seed->valuedouble
                                        : (uint64_t)seed->valuedouble;
    }
    if (!parse_stop(root, r, e) || !parse_bias(root, lim, r, e)) return false;
    if (!get_bool(root, "stream", &r->stream, e)) return false;
    const cJSON *so = serve_field(root, "stream_options");
    if (so) {
        if (!r->stream)
            return serr(e, 400, "invalid_value", "stream_options",
                        "'stream_options' is only allowed when 'stream' is true");
        if (!cJSON_IsObject(so))
            return serr(e, 400, "invalid_type", "stream_options",
                        "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &r->include_usage, e)) return false;
    }
    if (kind == SERVE_COMPLETION && !get_bool(root, "echo", &r->echo, e)) return false;
    return parse_logprobs(root, kind, r, e) && parse_format(root, r, e);
}

/* cJSON's parser records where the last parse failed in a static, written
 * on every call: parses run one at a time so that threads do not race on
 * it. A parse takes microseconds (milliseconds for the largest bodies). */
static pthread_mutex_t parse_mu = PTHREAD_MUTEX_INITIALIZER;

void *serve_json_parse(const char *body, size_t len, size_t *err_at) {
    const char *end = NULL;
    pthread_mutex_lock(&parse_mu);
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    pthread_mutex_unlock(&parse_mu);
    if (root && end)
        for (; end < body + len; end++)
            if (!strchr(" \t\r\n", *end)) { /* only white space may follow */
                cJSON_Delete(root);
                root = NULL;
                break;
            }
    if (!root && err_at)
        *err_at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
    return root;
}

bool serve_req_parse(const char *body, size_t len, serve_kind kind, const serve_limits *lim,
                     serve_req *r, serve_err *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->temperature = lim->temperature;
    r->top_p = 1.0f;
    r->repeat_penalty = 1.0f;
    r->typical_p = 1.0f;
    r->repeat_last_n = 64;
    if (len == 0) return serr(e, 400, "invalid_json", NULL, "the request has no body");
    if (memchr(body, '\0', len)) /* cJSON would take it for white space */
        return serr(e, 400, "invalid_json", NULL, "the request body holds a NUL byte");
    if (!serve_utf8_valid(body, len))
        return serr(e, 400, "invalid_json", NULL, "the request body is not valid UTF-8");
    size_t at = 0;
    cJSON *root = serve_json_parse(body, len, &at);
    if (!root)
        return serr(e, 400, "invalid_json", NULL,
                    "the request body is not valid JSON (error near byte %zu)", at);
    bool ok = cJSON_IsObject(root)
                  ? parse_fields(root, kind, lim, r, e)
                  : serr(e, 400, "invalid_json", NULL, "the request body must be a JSON object");
    cJSON_Delete(root);
    if (!ok) serve_req_free(r);
    return ok;
}

void serve_req_free(serve_req *r) {
    if (!r) return;
    free(r->model);
    free(r->user);
    for (int32_t i = 0; i < r->n_messages; i++) free((char *)r->messages[i].content);
    free(r->messages);
    for (int32_t i = 0; i < r->n_prompts; i++) {
        free(r->prompts[i].text);
        free(r->prompts[i].tokens);
    }
    free(r->prompts);
    for (int32_t i = 0; i < r->n_images; i++) cellm_image_embed_free(r->images[i]);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    cellm_grammar_free(r->grammar);
    if (r->api) r->api->free(r->api_ctx);
    serve_tools_free(r);
    memset(r, 0, sizeof *r);
}

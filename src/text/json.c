/*
 * json.c — the JSON tree reader and the compact writer (see json.h).
 */
#include "text/json.h"

#include "text/unicode.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct jreader {
    const char *s;
    size_t n, i;
    cellm_error *err;
    const char *what; /* names the text in messages */
    int max_depth;
    bool failed;
} jreader;

void json_free(json_node *j) {
    if (!j) return;
    for (size_t k = 0; k < j->n; k++) {
        json_free(j->kids[k]);
        if (j->keys) free(j->keys[k]);
    }
    free(j->kids);
    free(j->keys);
    free(j->str);
    free(j);
}

static json_node *jerr(jreader *r, const char *what) {
    if (!r->failed) err_set(r->err, CELLM_ERR_FORMAT, "%s: %s at byte %zu", r->what, what, r->i);
    r->failed = true;
    return NULL;
}

static void jspace(jreader *r) {
    while (r->i < r->n &&
           (r->s[r->i] == ' ' || r->s[r->i] == '\t' || r->s[r->i] == '\n' || r->s[r->i] == '\r'))
        r->i++;
}

static int hex4(const char *s) {
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        int h = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* A JSON string at r->i (the opening quote) into a new buffer. */
static char *jstring(jreader *r, size_t *len) {
    r->i++;
    /* Room for the raw text up to the closing quote: escapes only shrink. */
    size_t end = r->i;
    while (end < r->n && r->s[end] != '"') end += r->s[end] == '\\' ? 2 : 1;
    char *o = malloc((end < r->n ? end : r->n) - r->i + 1);
    if (!o) return jerr(r, "out of memory"), NULL;
    size_t m = 0;
    while (r->i < r->n && r->s[r->i] != '"') {
        unsigned char c = (unsigned char)r->s[r->i];
        if (c < 0x20) {
            free(o);
            return jerr(r, "control character in a string"), NULL;
        }
        if (c != '\\') {
            o[m++] = (char)c;
            r->i++;
            continue;
        }
        if (r->i + 1 >= r->n) break;
        char e = r->s[r->i + 1];
        r->i += 2;
        const char *simple = "\"\\/bfnrt", *val = "\"\\/\b\f\n\r\t";
        const char *at = strchr(simple, e);
        if (e && at) {
            o[m++] = val[at - simple];
            continue;
        }
        if (e != 'u' || r->i + 4 > r->n || hex4(r->s + r->i) < 0) {
            free(o);
            return jerr(r, "bad escape in a string"), NULL;
        }
        uint32_t cp = (uint32_t)hex4(r->s + r->i);
        r->i += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && r->i + 6 <= r->n && r->s[r->i] == '\\' &&
            r->s[r->i + 1] == 'u' && hex4(r->s + r->i + 2) >= 0xDC00 &&
            hex4(r->s + r->i + 2) < 0xE000) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)hex4(r->s + r->i + 2) - 0xDC00);
            r->i += 6;
        } else if (cp >= 0xD800 && cp < 0xE000) {
            cp = 0xFFFD;
        }
        m += utf8_encode(cp, (uint8_t *)o + m); /* \uXXXX is 6 bytes: never more out than in */
    }
    if (r->i >= r->n) {
        free(o);
        return jerr(r, "unterminated string"), NULL;
    }
    r->i++;
    o[m] = '\0';
    *len = m;
    return o;
}

static bool jpush(jreader *r, json_node *j, json_node *kid, char *key) {
    if (j->n == j->cap) {
        size_t c = j->cap ? j->cap * 2 : 4;
        json_node **k = realloc(j->kids, c * sizeof(*k));
        if (k) j->kids = k;
        char **ks = k && j->type == JSON_OBJ ? realloc(j->keys, c * sizeof(*ks)) : NULL;
        if (ks) j->keys = ks;
        if (!k || (j->type == JSON_OBJ && !ks)) {
            json_free(kid);
            free(key);
            jerr(r, "out of memory");
            return false;
        }
        j->cap = c;
    }
    j->kids[j->n] = kid;
    if (j->type == JSON_OBJ) j->keys[j->n] = key;
    j->n++;
    return true;
}

static json_node *jvalue(jreader *r, int depth) {
    if (depth > r->max_depth) return jerr(r, "nested too deep");
    jspace(r);
    if (r->i >= r->n) return jerr(r, "unexpected end");
    json_node *j = calloc(1, sizeof(*j));
    if (!j) return jerr(r, "out of memory");
    char c = r->s[r->i];
    if (c == '{' || c == '[') {
        j->type = c == '{' ? JSON_OBJ : JSON_ARR;
        char close = c == '{' ? '}' : ']';
        r->i++;
        jspace(r);
        if (r->i < r->n && r->s[r->i] == close) {
            r->i++;
            return j;
        }
        for (;;) {
            char *key = NULL;
            if (j->type == JSON_OBJ) {
                jspace(r);
                size_t kl;
                if (r->i >= r->n || r->s[r->i] != '"' || !(key = jstring(r, &kl))) {
                    json_free(j);
                    return jerr(r, "expected a key");
                }
                jspace(r);
                if (r->i >= r->n || r->s[r->i] != ':') {
                    free(key);
                    json_free(j);
                    return jerr(r, "expected ':'");
                }
                r->i++;
            }
            json_node *kid = jvalue(r, depth + 1);
            if (!kid) {
                free(key);
                json_free(j);
                return NULL;
            }
            if (!jpush(r, j, kid, key)) {
                json_free(j);
                return NULL;
            }
            jspace(r);
            if (r->i < r->n && r->s[r->i] == ',') {
                r->i++;
                continue;
            }
            if (r->i < r->n && r->s[r->i] == close) {
                r->i++;
                return j;
            }
            json_free(j);
            return jerr(r, "expected ',' or a closing bracket");
        }
    }
    if (c == '"') {
        j->type = JSON_STR;
        j->str = jstring(r, &j->str_len);
        if (!j->str) {
            json_free(j);
            return NULL;
        }
        return j;
    }
    const char *words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t wl = strlen(words[k]);
        if (r->n - r->i >= wl && memcmp(r->s + r->i, words[k], wl) == 0) {
            r->i += wl;
            j->type = k == 2 ? JSON_NULL : JSON_BOOL;
            j->b = k == 0;
            return j;
        }
    }
    size_t b = r->i;
    if (r->i < r->n && r->s[r->i] == '-') r->i++;
    while (r->i < r->n && strchr("0123456789.eE+-", r->s[r->i]) && r->s[r->i]) r->i++;
    if (r->i == b || r->i - b > 64) {
        json_free(j);
        return jerr(r, "unexpected character");
    }
    char tmp[72];
    memcpy(tmp, r->s + b, r->i - b);
    tmp[r->i - b] = '\0';
    char *end;
    j->num = strtod(tmp, &end);
    if (*end || !isfinite(j->num)) {
        json_free(j);
        return jerr(r, "bad number");
    }
    j->type = JSON_NUM;
    j->raw = r->s + b;
    j->raw_len = r->i - b;
    return j;
}

const json_node *json_get(const json_node *o, const char *key) {
    if (!o || o->type != JSON_OBJ) return NULL;
    for (size_t k = 0; k < o->n; k++)
        if (!strcmp(o->keys[k], key)) return o->kids[k];
    return NULL;
}

json_node *json_parse(const char *s, size_t n, size_t *end, int max_depth, const char *what,
                      cellm_error *err) {
    jreader r = {.s = s, .n = n, .err = err, .what = what, .max_depth = max_depth};
    json_node *j = jvalue(&r, 0);
    if (j) jspace(&r);
    if (end) *end = r.i;
    return j;
}

/* ------------------------------------------------------------- output */

void json_buf_add(json_buf *b, const char *p, size_t n) {
    if (b->full) return;
    if (b->max && b->n + n + 1 > b->max) {
        b->full = true;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 1024;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->s, c);
        if (!q) {
            b->full = true;
            return;
        }
        b->s = q;
        b->cap = c;
    }
    memcpy(b->s + b->n, p, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void json_buf_str(json_buf *b, const char *s) {
    json_buf_add(b, s, strlen(s));
}

void json_buf_quote(json_buf *b, const char *s, size_t n) {
    json_buf_str(b, "\"");
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)s[k];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            json_buf_add(b, e, 2);
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            json_buf_add(b, e, 6);
        } else {
            json_buf_add(b, (const char *)&c, 1);
        }
    }
    json_buf_str(b, "\"");
}

void json_write(json_buf *b, const json_node *j) {
    switch (j->type) {
    case JSON_NULL: json_buf_str(b, "null"); break;
    case JSON_BOOL: json_buf_add(b, j->b ? "true" : "false", j->b ? 4 : 5); break;
    case JSON_NUM: json_buf_add(b, j->raw, j->raw_len); break;
    case JSON_STR: json_buf_quote(b, j->str, j->str_len); break;
    case JSON_ARR:
    case JSON_OBJ:
        json_buf_add(b, j->type == JSON_ARR ? "[" : "{", 1);
        for (size_t k = 0; k < j->n; k++) {
            if (k) json_buf_str(b, ",");
            if (j->type == JSON_OBJ) {
                json_node key = {
                    .type = JSON_STR, .str = j->keys[k], .str_len = strlen(j->keys[k])};
                json_write(b, &key);
                json_buf_str(b, ":");
            }
            json_write(b, j->kids[k]);
        }
        json_buf_add(b, j->type == JSON_ARR ? "]" : "}", 1);
        break;
    }
}

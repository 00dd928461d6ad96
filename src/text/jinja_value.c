/*
 * jinja_value.c — the render's memory and the values templates compute
 * with: an arena with a byte budget, string buffers, lists and ordered
 * dicts, and Python's semantics for them (truth, str(), repr(), ==, <),
 * since chat templates are written against Jinja2 running on Python. Also
 * JSON: parsing the caller's variables and json.dumps for `tojson`.
 */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"
#include "text/unicode.h"

struct jchunk {
    jchunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *jalloc(jinja *j, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    jchunk *c = j->chunks;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536, total;
        if (!size_add(j->mem_used, cap, &total) || total > j->lim.max_memory)
            jfail(j, CELLM_ERR_NO_MEMORY, JPOS_NONE,
                  "the template needs more than %zu bytes of working memory", j->lim.max_memory);
        c = malloc(sizeof *c + cap);
        if (!c) jfail(j, CELLM_ERR_NO_MEMORY, JPOS_NONE, "out of memory");
        c->used = 0;
        c->cap = cap;
        c->next = j->chunks;
        j->chunks = c;
        j->mem_used = total;
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

void jarena_free(jinja *j) {
    while (j->chunks) {
        jchunk *c = j->chunks;
        j->chunks = c->next;
        free(c);
    }
    j->mem_used = 0;
}

void *jalloc_array(jinja *j, size_t n, size_t size) {
    size_t b;
    if (!size_mul(n, size, &b))
        jfail(j, CELLM_ERR_NO_MEMORY, JPOS_NONE, "the template needs too much memory");
    return jalloc(j, b);
}

jstr jstr_dup(jinja *j, const char *s, size_t n) {
    char *p = jalloc(j, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = '\0';
    return jstr_c(p, n);
}

bool jstr_eq(jstr a, const char *lit) {
    size_t n = strlen(lit);
    return a.n == n && memcmp(a.s, lit, n) == 0;
}

void jbuf_put(jinja *j, jbuf *b, const char *s, size_t n) {
    if (!n) return;
    if (b == &j->main_out && b->n + n > j->lim.max_output)
        jfail(j, CELLM_ERR_NO_MEMORY, JPOS_NONE, "the rendered text exceeds %zu bytes",
              j->lim.max_output);
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 64, need;
        if (!size_add(b->n, n, &need))
            jfail(j, CELLM_ERR_NO_MEMORY, JPOS_NONE, "the template needs too much memory");
        while (cap < need) {
            if (cap > SIZE_MAX / 2)
                jfail(j, CELLM_ERR_NO_MEMORY, JPOS_NONE, "the template needs too much memory");
            cap *= 2;
        }
        char *p = jalloc(j, cap);
        if (b->n) memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void jbuf_putc(jinja *j, jbuf *b, char c) {
    jbuf_put(j, b, &c, 1);
}

jstr jbuf_str(const jbuf *b) {
    return jstr_c(b->n ? b->p : "", b->n);
}

static void jbuf_printf(jinja *j, jbuf *b, const char *fmt, ...) CELLM_PRINTF(3, 4);
static void jbuf_printf(jinja *j, jbuf *b, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) jbuf_put(j, b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* ---- UTF-8 ---- */

size_t ju8_next(const char *s, size_t n, size_t i) {
    size_t k = utf8_seq_len((uint8_t)s[i]);
    if (i + k > n) k = n - i;
    for (size_t q = 1; q < k; q++)
        if (((uint8_t)s[i + q] & 0xC0) != 0x80) return i + q;
    return i + k;
}

size_t ju8_len(jstr s) {
    size_t c = 0;
    for (size_t i = 0; i < s.n; i = ju8_next(s.s, s.n, i)) c++;
    return c;
}

/* Python's str.isspace(): Unicode White_Space plus the separators
 * U+001C..U+001F. */
static bool is_space_cp(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
    return (unicode_class(cp) & UCLASS_SPACE) != 0;
}

size_t ju8_space_at(const char *s, size_t n, size_t i) {
    size_t e = ju8_next(s, n, i), used;
    uint32_t cp = utf8_decode_lenient((const uint8_t *)s + i, e - i, &used);
    return is_space_cp(cp) && used == e - i ? e - i : 0;
}

size_t ju8_space_before(const char *s, size_t i) {
    if (!i) return 0;
    size_t st = i - 1;
    while (st > 0 && i - st < 4 && ((uint8_t)s[st] & 0xC0) == 0x80) st--;
    size_t k = ju8_space_at(s, i, st);
    return k == i - st ? k : 0;
}

static bool in_chars(const jstr *chars, const char *s, size_t len) {
    for (size_t i = 0; i < chars->n; i = ju8_next(chars->s, chars->n, i)) {
        size_t e = ju8_next(chars->s, chars->n, i);
        if (e - i == len && memcmp(chars->s + i, s, len) == 0) return true;
    }
    return false;
}

jstr ju8_strip(jstr s, bool left, bool right, const jstr *chars) {
    size_t a = 0, b = s.n;
    while (left && a < b) {
        size_t e = ju8_next(s.s, b, a);
        bool strip = chars ? in_chars(chars, s.s + a, e - a) : ju8_space_at(s.s, b, a) != 0;
        if (!strip) break;
        a = e;
    }
    while (right && b > a) {
        size_t st = b - 1;
        while (st > a && b - st < 4 && ((uint8_t)s.s[st] & 0xC0) == 0x80) st--;
        if (ju8_next(s.s, b, st) != b) st = b - 1;
        bool strip = chars ? in_chars(chars, s.s + st, b - st) : ju8_space_at(s.s, b, st) == b - st;
        if (!strip) break;
        b = st;
    }
    return jstr_c(s.s + a, b - a);
}

/* ---- values ---- */

jvalue jv_strdup(jinja *j, const char *s, size_t n) {
    return jv_str(jstr_dup(j, s, n));
}

jvalue jv_list(jinja *j, size_t n, bool tuple) {
    jlist *l = jalloc(j, sizeof *l);
    l->items = n ? jalloc_array(j, n, sizeof(jvalue)) : NULL;
    l->n = n;
    l->tuple = tuple;
    return (jvalue){.kind = JV_LIST, .u.l = l};
}

jvalue jv_dict(jinja *j) {
    jdict *d = jalloc(j, sizeof *d);
    memset(d, 0, sizeof *d);
    return (jvalue){.kind = JV_DICT, .u.d = d};
}

static bool key_eq(jvalue a, jvalue b) {
    if (a.kind == JV_STR && b.kind == JV_STR)
        return a.u.s.n == b.u.s.n && memcmp(a.u.s.s, b.u.s.s, a.u.s.n) == 0;
    if (jv_is_number(a) && jv_is_number(b)) return jv_num(a) == jv_num(b);
    return a.kind == b.kind && a.kind == JV_NONE;
}

jvalue *jdict_get(const jdict *d, jvalue key) {
    for (size_t i = 0; i < d->n; i++)
        if (key_eq(d->keys[i], key)) return &d->vals[i];
    return NULL;
}

jvalue *jdict_get_str(const jdict *d, const char *key) {
    return jdict_get(d, jv_str(jstr_c(key, strlen(key))));
}

void jdict_set(jinja *j, jdict *d, jvalue key, jvalue val) {
    jvalue *v = jdict_get(d, key);
    if (v) {
        *v = val;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jvalue *k = jalloc_array(j, cap, sizeof *k), *w = jalloc_array(j, cap, sizeof *w);
        if (d->n) {
            memcpy(k, d->keys, d->n * sizeof *k);
            memcpy(w, d->vals, d->n * sizeof *w);
        }
        d->keys = k;
        d->vals = w;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n++] = val;
}

const char *jv_typename(jvalue v) {
    switch (v.kind) {
    case JV_UNDEF: return "undefined";
    case JV_NONE: return "none";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.u.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "namespace";
    case JV_LOOP: return "loop";
    case JV_MACRO: return "macro";
    case JV_ITER: return "generator";
    default: return "function";
    }
}

bool jv_truthy(jvalue v) {
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s.n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

bool jv_is_number(jvalue v) {
    return v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL;
}

double jv_num(jvalue v) {
    return v.kind == JV_INT ? (double)v.u.i : v.kind == JV_FLOAT ? v.u.f : v.u.b ? 1.0 : 0.0;
}

/* Python's repr(float): the shortest digits that read back the same,
 * positional for exponents -4..15, else d.ddde+XX. */
void jwrite_float(jbuf *b, jinja *j, double f) {
    if (f != f) return jbuf_put(j, b, "nan", 3);
    if (f == INFINITY) return jbuf_put(j, b, "inf", 3);
    if (f == -INFINITY) return jbuf_put(j, b, "-inf", 4);
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    const char *s = e;
    bool neg = *s == '-';
    if (neg) s++;
    char dig[20];
    int nd = 0;
    for (; *s != 'e'; s++)
        if (*s != '.') dig[nd++] = *s;
    int exp = atoi(s + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    char o[48];
    int k = 0;
    if (neg) o[k++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            o[k++] = '0';
            o[k++] = '.';
            for (int z = 0; z < -exp - 1; z++) o[k++] = '0';
            for (int d = 0; d < nd; d++) o[k++] = dig[d];
        } else {
            for (int d = 0; d <= exp; d++) o[k++] = d < nd ? dig[d] : '0';
            o[k++] = '.';
            if (nd > exp + 1)
                for (int d = exp + 1; d < nd; d++) o[k++] = dig[d];
            else
                o[k++] = '0';
        }
    } else {
        o[k++] = dig[0];
        if (nd > 1) {
            o[k++] = '.';
            for (int d = 1; d < nd; d++) o[k++] = dig[d];
        }
        k += snprintf(o + k, sizeof o - (size_t)k, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
    }
    jbuf_put(j, b, o, (size_t)k);
}

static void check_depth(jinja *j, int depth, size_t pos) {
    if (depth > j->lim.max_depth)
        jfail(j, CELLM_ERR_NO_MEMORY, pos, "value nested deeper than %d", j->lim.max_depth);
}

/* Python's repr(str): quotes, escapes, and \x/\u/\U for characters
 * str.isprintable() rejects (controls, format characters, separators other
 * than the space, unassigned code points). */
static void write_str_repr(jinja *j, jbuf *b, jstr s) {
    bool sq = memchr(s.s, '\'', s.n) != NULL, dq = memchr(s.s, '"', s.n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    jbuf_putc(j, b, q);
    for (size_t i = 0; i < s.n;) {
        unsigned char c = (unsigned char)s.s[i];
        size_t e = ju8_next(s.s, s.n, i), used;
        uint32_t cp = utf8_decode_lenient((const uint8_t *)s.s + i, e - i, &used);
        if (c == '\\' || c == (unsigned char)q) {
            jbuf_putc(j, b, '\\');
            jbuf_putc(j, b, (char)c);
        } else if (c == '\n') {
            jbuf_put(j, b, "\\n", 2);
        } else if (c == '\r') {
            jbuf_put(j, b, "\\r", 2);
        } else if (c == '\t') {
            jbuf_put(j, b, "\\t", 2);
        } else if (cp != ' ' && (unicode_class(cp) & (UCLASS_OTHER | UCLASS_SEP))) {
            if (cp < 0x100)
                jbuf_printf(j, b, "\\x%02x", (unsigned)cp);
            else if (cp < 0x10000)
                jbuf_printf(j, b, "\\u%04x", (unsigned)cp);
            else
                jbuf_printf(j, b, "\\U%08x", (unsigned)cp);
        } else {
            jbuf_put(j, b, s.s + i, e - i);
        }
        i = e;
    }
    jbuf_putc(j, b, q);
}

void jv_write_repr(jinja *j, jbuf *b, jvalue v, size_t pos, int depth) {
    check_depth(j, depth, pos);
    switch (v.kind) {
    case JV_STR: write_str_repr(j, b, v.u.s); return;
    case JV_UNDEF: return;
    case JV_LIST: {
        jbuf_putc(j, b, v.u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jbuf_put(j, b, ", ", 2);
            jv_write_repr(j, b, v.u.l->items[i], pos, depth + 1);
        }
        if (v.u.l->tuple && v.u.l->n == 1) jbuf_putc(j, b, ',');
        jbuf_putc(j, b, v.u.l->tuple ? ')' : ']');
        return;
    }
    case JV_NS:
    case JV_DICT: {
        if (v.kind == JV_NS) jbuf_put(j, b, "<Namespace ", 11);
        jbuf_putc(j, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) jbuf_put(j, b, ", ", 2);
            jv_write_repr(j, b, v.u.d->keys[i], pos, depth + 1);
            jbuf_put(j, b, ": ", 2);
            jv_write_repr(j, b, v.u.d->vals[i], pos, depth + 1);
        }
        jbuf_putc(j, b, '}');
        if (v.kind == JV_NS) jbuf_putc(j, b, '>');
        return;
    }
    default: jv_write_str(j, b, v, pos);
    }
}

void jv_write_str(jinja *j, jbuf *b, jvalue v, size_t pos) {
    switch (v.kind) {
    case JV_UNDEF: return;
    case JV_NONE: jbuf_put(j, b, "None", 4); return;
    case JV_BOOL: v.u.b ? jbuf_put(j, b, "True", 4) : jbuf_put(j, b, "False", 5); return;
    case JV_INT: jbuf_printf(j, b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT: jwrite_float(b, j, v.u.f); return;
    case JV_STR: jbuf_puts(j, b, v.u.s); return;
    case JV_LIST:
    case JV_DICT:
    case JV_NS: jv_write_repr(j, b, v, pos, 0); return;
    case JV_LOOP: jbuf_put(j, b, "<LoopContext>", 13); return;
    case JV_MACRO: jbuf_put(j, b, "<Macro>", 7); return;
    case JV_ITER:
        /* Python prints "<generator object ... at 0x...>": no text to match. */
        jfail(j, CELLM_ERR_UNSUPPORTED, pos,
              "printing a generator (what map, select, reverse... return) is not supported; "
              "add '| list'");
    default: jbuf_put(j, b, "<function>", 10); return;
    }
}

jstr jv_to_str(jinja *j, jvalue v, size_t pos) {
    if (v.kind == JV_STR) return v.u.s;
    jbuf b = {0};
    jv_write_str(j, &b, v, pos);
    return jbuf_str(&b);
}

bool jv_eq(jinja *j, jvalue a, jvalue b, int depth) {
    check_depth(j, depth, JPOS_NONE);
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) return jv_ival(a) == jv_ival(b);
        return jv_num(a) == jv_num(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.s, b.u.s.s, a.u.s.n) == 0;
    case JV_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_eq(j, a.u.l->items[i], b.u.l->items[i], depth + 1)) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jvalue *w = jdict_get(b.u.d, a.u.d->keys[i]);
            if (!w || !jv_eq(j, a.u.d->vals[i], *w, depth + 1)) return false;
        }
        return true;
    case JV_NS: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.macro == b.u.macro;
    case JV_FUNC: return a.u.func == b.u.func;
    case JV_ITER: return a.u.l == b.u.l;
    default: return false;
    }
}

int jv_cmp(jinja *j, jvalue a, jvalue b, size_t pos, int depth) {
    check_depth(j, depth, pos);
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) {
            int64_t x = jv_ival(a), y = jv_ival(b);
            return x < y ? -1 : x > y;
        }
        double x = jv_num(a), y = jv_num(b);
        return x < y ? -1 : x > y;
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = n ? memcmp(a.u.s.s, b.u.s.s, n) : 0;
        if (c) return c < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.kind == JV_LIST && b.kind == JV_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (jv_eq(j, a.u.l->items[i], b.u.l->items[i], depth + 1)) continue;
            return jv_cmp(j, a.u.l->items[i], b.u.l->items[i], pos, depth + 1);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    jfail(j, CELLM_ERR_FORMAT, pos, "cannot order %s and %s", jv_typename(a), jv_typename(b));
}

/* ---- JSON out (Python's json.dumps) ---- */

static void json_str(jinja *j, jbuf *b, jstr s, bool ascii) {
    jbuf_putc(j, b, '"');
    for (size_t i = 0; i < s.n;) {
        unsigned char c = (unsigned char)s.s[i];
        if (c == '"' || c == '\\') {
            jbuf_putc(j, b, '\\');
            jbuf_putc(j, b, (char)c);
        } else if (c == '\n') {
            jbuf_put(j, b, "\\n", 2);
        } else if (c == '\r') {
            jbuf_put(j, b, "\\r", 2);
        } else if (c == '\t') {
            jbuf_put(j, b, "\\t", 2);
        } else if (c == '\b') {
            jbuf_put(j, b, "\\b", 2);
        } else if (c == '\f') {
            jbuf_put(j, b, "\\f", 2);
        } else if (c < 0x20 || (ascii && c == 0x7f)) {
            jbuf_printf(j, b, "\\u%04x", c);
        } else if (c >= 0x80 && ascii) {
            size_t e = ju8_next(s.s, s.n, i), used;
            uint32_t cp = utf8_decode_lenient((const uint8_t *)s.s + i, e - i, &used);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                jbuf_printf(j, b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                jbuf_printf(j, b, "\\u%04x", cp);
            }
            i = e;
            continue;
        } else {
            jbuf_putc(j, b, (char)c);
        }
        i++;
    }
    jbuf_putc(j, b, '"');
}

static void newline_indent(jinja *j, jbuf *b, int indent, int level) {
    jbuf_putc(j, b, '\n');
    for (int i = 0; i < indent * level; i++) jbuf_putc(j, b, ' ');
}

static void json_value(jinja *j, jbuf *b, jvalue v, size_t pos, bool ascii, int indent,
                       bool sort_keys, int level);

static void json_dict(jinja *j, jbuf *b, const jdict *d, size_t pos, bool ascii, int indent,
                      bool sort_keys, int level) {
    if (!d->n) return jbuf_put(j, b, "{}", 2);
    size_t *order = jalloc_array(j, d->n, sizeof *order);
    for (size_t i = 0; i < d->n; i++) {
        order[i] = i;
        if (d->keys[i].kind != JV_STR)
            jfail(j, CELLM_ERR_UNSUPPORTED, pos, "tojson of a dict with %s keys is not supported",
                  jv_typename(d->keys[i]));
    }
    if (sort_keys) /* insertion sort: dicts in templates are small */
        for (size_t i = 1; i < d->n; i++)
            for (size_t k = i;
                 k > 0 && jv_cmp(j, d->keys[order[k]], d->keys[order[k - 1]], pos, 0) < 0; k--) {
                size_t t = order[k];
                order[k] = order[k - 1];
                order[k - 1] = t;
            }
    jbuf_putc(j, b, '{');
    for (size_t i = 0; i < d->n; i++) {
        if (i) jbuf_put(j, b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
        if (indent >= 0) newline_indent(j, b, indent, level + 1);
        json_str(j, b, d->keys[order[i]].u.s, ascii);
        jbuf_put(j, b, ": ", 2);
        json_value(j, b, d->vals[order[i]], pos, ascii, indent, sort_keys, level + 1);
    }
    if (indent >= 0) newline_indent(j, b, indent, level);
    jbuf_putc(j, b, '}');
}

static void json_value(jinja *j, jbuf *b, jvalue v, size_t pos, bool ascii, int indent,
                       bool sort_keys, int level) {
    check_depth(j, level, pos);
    switch (v.kind) {
    case JV_NONE: jbuf_put(j, b, "null", 4); return;
    case JV_BOOL: v.u.b ? jbuf_put(j, b, "true", 4) : jbuf_put(j, b, "false", 5); return;
    case JV_INT: jbuf_printf(j, b, "%lld", (long long)v.u.i); return;
    case JV_FLOAT:
        if (v.u.f != v.u.f) return jbuf_put(j, b, "NaN", 3);
        if (v.u.f == INFINITY) return jbuf_put(j, b, "Infinity", 8);
        if (v.u.f == -INFINITY) return jbuf_put(j, b, "-Infinity", 9);
        jwrite_float(b, j, v.u.f);
        return;
    case JV_STR: json_str(j, b, v.u.s, ascii); return;
    case JV_LIST:
        if (!v.u.l->n) return jbuf_put(j, b, "[]", 2);
        jbuf_putc(j, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jbuf_put(j, b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
            if (indent >= 0) newline_indent(j, b, indent, level + 1);
            json_value(j, b, v.u.l->items[i], pos, ascii, indent, sort_keys, level + 1);
        }
        if (indent >= 0) newline_indent(j, b, indent, level);
        jbuf_putc(j, b, ']');
        return;
    case JV_DICT: json_dict(j, b, v.u.d, pos, ascii, indent, sort_keys, level); return;
    default: jfail(j, CELLM_ERR_FORMAT, pos, "a %s value is not JSON serializable", jv_typename(v));
    }
}

void jv_write_json(jinja *j, jbuf *b, jvalue v, size_t pos, bool ascii, int indent, bool sort_keys,
                   int depth) {
    json_value(j, b, v, pos, ascii, indent, sort_keys, depth);
}

/* ---- JSON in ---- */

typedef struct jp {
    jinja *j;
    const char *s;
    size_t n, i;
} jp;

_Noreturn static void jp_fail(jp *p, const char *what) {
    jfail(p->j, CELLM_ERR_FORMAT, JPOS_NONE, "vars_json: %s at byte %zu", what, p->i);
}

static void jp_ws(jp *p) {
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static uint32_t jp_hex4(jp *p) {
    uint32_t v = 0;
    for (int k = 0; k < 4; k++) {
        if (p->i >= p->n) jp_fail(p, "truncated \\u escape");
        char c = p->s[p->i++];
        int h = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (h < 0) jp_fail(p, "bad \\u escape");
        v = v * 16 + (uint32_t)h;
    }
    return v;
}

static jstr jp_string(jp *p) {
    p->i++; /* the quote */
    jbuf b = {0};
    for (;;) {
        if (p->i >= p->n) jp_fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->i++];
        if (c == '"') break;
        if (c < 0x20) jp_fail(p, "control character in a string");
        if (c != '\\') {
            jbuf_putc(p->j, &b, (char)c);
            continue;
        }
        if (p->i >= p->n) jp_fail(p, "truncated escape");
        char e = p->s[p->i++];
        const char *map = "\"\"\\\\//b\bf\fn\nr\rt\t";
        const char *m = e ? strchr(map, e) : NULL;
        if (m && ((m - map) % 2) == 0) {
            jbuf_putc(p->j, &b, m[1]);
            continue;
        }
        if (e != 'u') jp_fail(p, "unknown escape");
        uint32_t cp = jp_hex4(p);
        if (cp >= 0xD800 && cp < 0xDC00 && p->i + 1 < p->n && p->s[p->i] == '\\' &&
            p->s[p->i + 1] == 'u') {
            size_t save = p->i;
            p->i += 2;
            uint32_t lo = jp_hex4(p);
            if (lo >= 0xDC00 && lo < 0xE000)
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            else
                p->i = save;
        }
        uint8_t u[4];
        size_t k = utf8_encode(cp, u);
        jbuf_put(p->j, &b, (const char *)u, k);
    }
    return jbuf_str(&b);
}

static jvalue jp_value(jp *p, int depth) {
    if (depth > p->j->lim.max_depth) jp_fail(p, "nesting too deep");
    jp_ws(p);
    if (p->i >= p->n) jp_fail(p, "unexpected end");
    char c = p->s[p->i];
    if (c == '"') return jv_str(jp_string(p));
    if (c == '{') {
        jvalue d = jv_dict(p->j);
        p->i++;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == '}') {
            p->i++;
            return d;
        }
        for (;;) {
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != '"') jp_fail(p, "expected a key");
            jvalue k = jv_str(jp_string(p));
            jp_ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') jp_fail(p, "expected ':'");
            p->i++;
            jvalue v = jp_value(p, depth + 1);
            jdict_set(p->j, d.u.d, k, v);
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == '}') {
                p->i++;
                return d;
            }
            jp_fail(p, "expected ',' or '}'");
        }
    }
    if (c == '[') {
        p->i++;
        jvalue *items = NULL;
        size_t n = 0, cap = 0;
        jp_ws(p);
        if (p->i < p->n && p->s[p->i] == ']') {
            p->i++;
            return jv_list(p->j, 0, false);
        }
        for (;;) {
            jvalue v = jp_value(p, depth + 1);
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                jvalue *w = jalloc_array(p->j, cap, sizeof *w);
                if (n) memcpy(w, items, n * sizeof *w);
                items = w;
            }
            items[n++] = v;
            jp_ws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == ']') {
                p->i++;
                jvalue l = jv_list(p->j, n, false);
                memcpy(l.u.l->items, items, n * sizeof *items);
                return l;
            }
            jp_fail(p, "expected ',' or ']'");
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int w = 0; w < 3; w++) {
        size_t L = strlen(words[w]);
        if (p->n - p->i >= L && memcmp(p->s + p->i, words[w], L) == 0) {
            p->i += L;
            return w == 2 ? jv_none() : jv_bool(w == 0);
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        size_t st = p->i;
        bool flt = false;
        if (p->s[p->i] == '-') p->i++;
        while (p->i < p->n && strchr("0123456789.eE+-", p->s[p->i]) && p->s[p->i]) {
            if (strchr(".eE", p->s[p->i])) flt = true;
            p->i++;
        }
        char buf[64];
        if (p->i - st >= sizeof buf) jp_fail(p, "number too long");
        memcpy(buf, p->s + st, p->i - st);
        buf[p->i - st] = '\0';
        char *end;
        if (!flt) {
            long long v = strtoll(buf, &end, 10);
            if (*end == '\0' && !(v == LLONG_MAX || v == LLONG_MIN)) return jv_int(v);
        }
        double f = strtod(buf, &end);
        if (*end != '\0') jp_fail(p, "bad number");
        return jv_float(f);
    }
    jp_fail(p, "unexpected character");
}

jvalue jv_parse_json(jinja *j, const char *s, size_t n) {
    jp p = {j, s, n, 0};
    jvalue v = jp_value(&p, 0);
    jp_ws(&p);
    if (p.i != n) jp_fail(&p, "trailing characters");
    return v;
}

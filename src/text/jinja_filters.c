/*
 * jinja_filters.c — the library a chat template calls into: Jinja2's
 * filters (x | name(args)) and tests (x is name args), the str and dict
 * methods templates use (message.content.strip(), message.get('x')), and the
 * global functions range(), namespace(), dict(), raise_exception() and
 * strftime_now(). Each behaves as its Python counterpart does for the values
 * chat templates pass; an unknown name is a CELLM_ERR_UNSUPPORTED error.
 *
 * Case mapping covers ASCII, Latin-1, Greek and Cyrillic letters; other
 * scripts pass through unchanged (Python would map a few more).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja_internal.h"
#include "text/unicode.h"

/* The argument at position i or named `name`, or NULL. */
static const jvalue *arg(const jargs *a, size_t i, const char *name) {
    if (i < a->n) return &a->pos[i];
    for (size_t k = 0; k < a->n_kw; k++)
        if (name && jstr_eq(a->kwn[k], name)) return &a->kw[k];
    return NULL;
}

static void max_args(jinja *j, const jargs *a, size_t max, const char *what, jstr name) {
    if (a->n > max)
        jfail(j, CELLM_ERR_FORMAT, a->at, "%s '%.*s' takes at most %zu arguments, got %zu", what,
              (int)name.n, name.s, max, a->n);
}

static jstr arg_str(jinja *j, const jargs *a, size_t i, const char *name, const char *dflt) {
    const jvalue *v = arg(a, i, name);
    if (!v || v->kind == JV_NONE) return jstr_c(dflt, dflt ? strlen(dflt) : 0);
    return jv_to_str(j, *v, a->at);
}

static int64_t arg_int(jinja *j, const jargs *a, size_t i, const char *name, int64_t dflt) {
    const jvalue *v = arg(a, i, name);
    if (!v || v->kind == JV_NONE) return dflt;
    if (v->kind == JV_INT) return v->u.i;
    if (v->kind == JV_BOOL) return v->u.b;
    jfail(j, CELLM_ERR_FORMAT, a->at, "argument '%s' must be an integer, not %s", name ? name : "?",
          jv_typename(*v));
}

static bool arg_bool(const jargs *a, size_t i, const char *name, bool dflt) {
    const jvalue *v = arg(a, i, name);
    return v ? jv_truthy(*v) : dflt;
}

/* ---- case mapping ---- */

static uint32_t cp_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z') return c - 32;
    if (c < 0x80) return c;
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
        c != 0x17F) {
        bool odd_lower = (c < 0x138) || (c >= 0x14A && c < 0x178);
        if (odd_lower ? (c & 1) : !(c & 1)) return c - 1;
    }
    return c;
}

static uint32_t cp_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z') return c + 32;
    if (c < 0x80) return c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
        c != 0x17F) {
        bool odd_lower = (c < 0x138) || (c >= 0x14A && c < 0x178);
        if (odd_lower ? !(c & 1) : (c & 1)) return c + 1;
    }
    return c;
}

static bool cp_cased(uint32_t c) {
    return cp_upper(c) != c || cp_lower(c) != c;
}

enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE };

static jstr map_case(jinja *j, jstr s, int mode) {
    jbuf b = {0};
    bool prev_cased = false;
    for (size_t i = 0, k = 0; i < s.n; k++) {
        size_t e = ju8_next(s.s, s.n, i), used;
        uint32_t c = utf8_decode_lenient((const uint8_t *)s.s + i, e - i, &used);
        if (used != e - i) {
            jbuf_put(j, &b, s.s + i, e - i); /* malformed: keep the bytes */
            i = e;
            continue;
        }
        bool first_of_word = mode == CASE_CAPITALIZE ? k == 0 : mode == CASE_TITLE && !prev_cased;
        if (c == 0xDF && (mode == CASE_UPPER || first_of_word)) {
            /* Python upper-cases German sharp s to "SS" (title case "Ss") */
            jbuf_put(j, &b, mode == CASE_UPPER ? "SS" : "Ss", 2);
            prev_cased = true;
            i = e;
            continue;
        }
        uint32_t o = c;
        switch (mode) {
        case CASE_UPPER: o = cp_upper(c); break;
        case CASE_LOWER: o = cp_lower(c); break;
        case CASE_CAPITALIZE: o = k == 0 ? cp_upper(c) : cp_lower(c); break;
        default: o = prev_cased ? cp_lower(c) : cp_upper(c); break;
        }
        prev_cased = cp_cased(c);
        uint8_t u[4];
        jbuf_put(j, &b, (const char *)u, utf8_encode(o, u));
        i = e;
    }
    return jbuf_str(&b);
}

/* Jinja2's title filter: each piece after a run of -, white space or an
 * opening bracket gets its first character upper-cased, the rest lower. */
static jstr title_filter(jinja *j, jstr s) {
    jbuf b = {0};
    size_t i = 0;
    while (i < s.n) {
        size_t st = i;
        while (i < s.n && (strchr("-({[<", s.s[i]) || ju8_space_at(s.s, s.n, i)))
            i += ju8_space_at(s.s, s.n, i) ? ju8_space_at(s.s, s.n, i) : 1;
        jbuf_put(j, &b, s.s + st, i - st);
        st = i;
        while (i < s.n && !(strchr("-({[<", s.s[i]) || ju8_space_at(s.s, s.n, i)))
            i = ju8_next(s.s, s.n, i);
        jbuf_puts(j, &b, map_case(j, jstr_c(s.s + st, i - st), CASE_CAPITALIZE));
    }
    return jbuf_str(&b);
}

/* ---- string helpers ---- */

static bool str_find(jstr hay, jstr needle, size_t from, size_t *at) {
    if (needle.n > hay.n) return false;
    for (size_t i = from; i + needle.n <= hay.n; i++)
        if (memcmp(hay.s + i, needle.s, needle.n) == 0) {
            *at = i;
            return true;
        }
    return false;
}

static jstr str_replace(jinja *j, jstr s, jstr old, jstr rep, int64_t count) {
    jbuf b = {0};
    if (old.n == 0) {
        /* Python inserts `rep` before every character and at the end. */
        size_t i = 0;
        int64_t done = 0;
        for (; i < s.n && (count < 0 || done < count); done++) {
            jbuf_puts(j, &b, rep);
            size_t e = ju8_next(s.s, s.n, i);
            jbuf_put(j, &b, s.s + i, e - i);
            i = e;
        }
        if (i == s.n && (count < 0 || done < count)) jbuf_puts(j, &b, rep);
        jbuf_put(j, &b, s.s + i, s.n - i);
        return jbuf_str(&b);
    }
    size_t i = 0, at;
    int64_t done = 0;
    while ((count < 0 || done < count) && str_find(s, old, i, &at)) {
        jbuf_put(j, &b, s.s + i, at - i);
        jbuf_puts(j, &b, rep);
        i = at + old.n;
        done++;
    }
    jbuf_put(j, &b, s.s + i, s.n - i);
    return jbuf_str(&b);
}

typedef struct vvec {
    jvalue *p;
    size_t n, cap;
} vvec;

static void vv_push(jinja *j, vvec *v, jvalue x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        jvalue *p = jalloc_array(j, cap, sizeof *p);
        if (v->n) memcpy(p, v->p, v->n * sizeof *p);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
}

static jvalue vv_list(jinja *j, vvec *v) {
    jvalue l = jv_list(j, v->n, false);
    if (v->n) memcpy(l.u.l->items, v->p, v->n * sizeof *v->p);
    return l;
}

/* The filters Jinja2 writes as generators return one. */
static jvalue vv_iter(jinja *j, vvec *v) {
    jvalue l = vv_list(j, v);
    l.kind = JV_ITER;
    return l;
}

/* Python's str.split(sep, maxsplit). */
static jvalue str_split(jinja *j, jstr s, const jstr *sep, int64_t maxsplit, size_t at) {
    vvec out = {0};
    if (sep) {
        if (!sep->n) jfail(j, CELLM_ERR_FORMAT, at, "split: empty separator");
        size_t i = 0, f;
        while ((maxsplit < 0 || (int64_t)out.n < maxsplit) && str_find(s, *sep, i, &f)) {
            vv_push(j, &out, jv_str(jstr_c(s.s + i, f - i)));
            i = f + sep->n;
        }
        vv_push(j, &out, jv_str(jstr_c(s.s + i, s.n - i)));
        return vv_list(j, &out);
    }
    size_t i = 0, k;
    for (;;) {
        while (i < s.n && (k = ju8_space_at(s.s, s.n, i))) i += k;
        if (i >= s.n) break;
        if (maxsplit >= 0 && (int64_t)out.n >= maxsplit) {
            vv_push(j, &out, jv_str(jstr_c(s.s + i, s.n - i))); /* kept as it is */
            break;
        }
        size_t st = i;
        while (i < s.n && !ju8_space_at(s.s, s.n, i)) i = ju8_next(s.s, s.n, i);
        vv_push(j, &out, jv_str(jstr_c(s.s + st, i - st)));
    }
    return vv_list(j, &out);
}

static bool affix(jinja *j, jstr s, jvalue what, bool end, size_t at) {
    if (what.kind == JV_LIST && what.u.l->tuple) {
        for (size_t i = 0; i < what.u.l->n; i++)
            if (affix(j, s, what.u.l->items[i], end, at)) return true;
        return false;
    }
    if (what.kind != JV_STR)
        jfail(j, CELLM_ERR_FORMAT, at, "%s takes a string or a tuple of strings, not %s",
              end ? "endswith" : "startswith", jv_typename(what));
    jstr w = what.u.s;
    if (w.n > s.n) return false;
    return memcmp(s.s + (end ? s.n - w.n : 0), w.s, w.n) == 0;
}

/* len() as Python counts: characters of a string. */
static int64_t length(jinja *j, jvalue v, size_t at) {
    switch (v.kind) {
    case JV_UNDEF: return 0;
    case JV_STR: return (int64_t)ju8_len(v.u.s);
    case JV_LIST: return (int64_t)v.u.l->n;
    case JV_DICT: return (int64_t)v.u.d->n;
    default: jfail(j, CELLM_ERR_FORMAT, at, "a %s value has no length", jv_typename(v));
    }
}

/* Python's int(str): optional sign and white space around digits (with _). */
static bool parse_int(jstr s, int64_t base, int64_t *out) {
    s = ju8_strip(s, true, true, NULL);
    size_t i = 0;
    bool neg = false;
    if (i < s.n && (s.s[i] == '-' || s.s[i] == '+')) neg = s.s[i++] == '-';
    /* int('0x1A', 16): the prefix that names the base may be there */
    if (i + 1 < s.n && s.s[i] == '0') {
        char p = (char)(s.s[i + 1] | 0x20);
        if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2)) i += 2;
    }
    if (i >= s.n) return false;
    uint64_t v = 0;
    for (; i < s.n; i++) {
        char c = s.s[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'z' ? c - 'a' + 10
                : c >= 'A' && c <= 'Z' ? c - 'A' + 10
                                       : -1;
        if (c == '_' && i > 0 && i + 1 < s.n) continue;
        if (d < 0 || d >= base) return false;
        if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
    }
    if (v > (uint64_t)INT64_MAX + neg) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool parse_float(jinja *j, jstr s, double *out) {
    s = ju8_strip(s, true, true, NULL);
    if (!s.n || s.n > 300) return false;
    jstr c = jstr_dup(j, s.s, s.n);
    char *end;
    *out = strtod(c.s, &end);
    return end == c.s + c.n;
}

static jvalue attr_of(jinja *j, jvalue v, jstr attr, size_t at) {
    /* "a.b" walks nested attributes, as Jinja2's attribute= arguments do. */
    size_t st = 0;
    for (size_t i = 0; i <= attr.n; i++) {
        if (i == attr.n || attr.s[i] == '.') {
            jstr part = jstr_c(attr.s + st, i - st);
            int64_t idx;
            if (parse_int(part, 10, &idx))
                v = jinja_getitem(j, v, jv_int(idx), at);
            else
                v = jinja_getitem(j, v, jv_str(part), at);
            st = i + 1;
        }
    }
    return v;
}

/* Merge sort, stable, by key (attribute, lower-cased unless case_sensitive). */
static void sort_values(jinja *j, jvalue *v, size_t n, const jstr *attr, bool cs, bool rev,
                        size_t at) {
    if (n < 2) return;
    jvalue *keys = jalloc_array(j, n, sizeof *keys), *tmp = jalloc_array(j, n, sizeof *tmp),
           *tk = jalloc_array(j, n, sizeof *tk);
    for (size_t i = 0; i < n; i++) {
        jvalue k = attr ? attr_of(j, v[i], *attr, at) : v[i];
        if (!cs && k.kind == JV_STR) k = jv_str(map_case(j, k.u.s, CASE_LOWER));
        keys[i] = k;
    }
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t a = lo, b = mid, o = lo;
            while (a < mid || b < hi) {
                bool take_b =
                    a >= mid || (b < hi && (rev ? jv_cmp(j, keys[b], keys[a], at, 0) > 0
                                                : jv_cmp(j, keys[b], keys[a], at, 0) < 0));
                tmp[o] = take_b ? v[b] : v[a];
                tk[o++] = take_b ? keys[b++] : keys[a++];
            }
        }
        memcpy(v, tmp, n * sizeof *v);
        memcpy(keys, tk, n * sizeof *keys);
    }
}

/* select/reject/selectattr/rejectattr and map share this: apply a test or
 * filter named by args[first] with the remaining arguments. */
static jargs rest_args(const jargs *a, size_t first) {
    jargs r = *a;
    r.pos = a->n > first ? a->pos + first : NULL;
    r.n = a->n > first ? a->n - first : 0;
    return r;
}

static jvalue select_items(jinja *j, jvalue v, const jargs *a, bool attr, bool keep) {
    vvec out = {0};
    if (!jv_truthy(v)) return vv_iter(j, &out); /* Jinja2: `if value:` around the loop */
    jlist *items = jinja_iter(j, v, a->at);
    size_t first = attr ? 1 : 0;
    jstr attr_name = {0};
    if (attr) {
        if (a->n < 1 || a->pos[0].kind != JV_STR)
            jfail(j, CELLM_ERR_FORMAT, a->at, "selectattr/rejectattr need an attribute name");
        attr_name = a->pos[0].u.s;
    }
    bool has_test = a->n > first;
    jstr test = {0};
    if (has_test) test = jv_to_str(j, a->pos[first], a->at);
    jargs targs = rest_args(a, first + 1);
    targs.n_kw = 0;
    for (size_t i = 0; i < items->n; i++) {
        jvalue x = attr ? attr_of(j, items->items[i], attr_name, a->at) : items->items[i];
        bool r = has_test ? jinja_test(j, test, x, &targs) : jv_truthy(x);
        if (r == keep) vv_push(j, &out, items->items[i]);
    }
    return vv_iter(j, &out);
}

jstr jhtml_escape(jinja *j, jstr s) {
    jbuf b = {0};
    for (size_t i = 0; i < s.n; i++) {
        switch (s.s[i]) {
        case '&': jbuf_put(j, &b, "&amp;", 5); break;
        case '<': jbuf_put(j, &b, "&lt;", 4); break;
        case '>': jbuf_put(j, &b, "&gt;", 4); break;
        case '"': jbuf_put(j, &b, "&#34;", 5); break;
        case '\'': jbuf_put(j, &b, "&#39;", 5); break;
        default: jbuf_putc(j, &b, s.s[i]);
        }
    }
    return jbuf_str(&b);
}

jvalue jinja_filter(jinja *j, jstr name, jvalue v, const jargs *a) {
#define IS(x) jstr_eq(name, x)
    size_t at = a->at;
    if (IS("trim")) {
        max_args(j, a, 1, "filter", name);
        const jvalue *c = arg(a, 0, "chars");
        jstr chars = c && c->kind != JV_NONE ? jv_to_str(j, *c, at) : jstr_c("", 0);
        jvalue r = jv_str(
            ju8_strip(jv_to_str(j, v, at), true, true, c && c->kind != JV_NONE ? &chars : NULL));
        r.safe = v.safe; /* Markup.strip() is Markup */
        return r;
    }
    if (IS("length") || IS("count")) return jv_int(length(j, v, at));
    if (IS("tojson")) {
        const jvalue *ind = arg(a, 1, "indent");
        int indent = -1;
        if (ind && ind->kind == JV_INT)
            indent = ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : (int)ind->u.i;
        else if (ind && ind->kind == JV_STR)
            jfail(j, CELLM_ERR_UNSUPPORTED, at, "tojson with a string indent is not supported");
        jbuf b = {0};
        jv_write_json(j, &b, v, at, arg_bool(a, 0, "ensure_ascii", false), indent,
                      arg_bool(a, 3, "sort_keys", false), 0);
        return jv_str(jbuf_str(&b));
    }
    if (IS("upper")) return jv_str(map_case(j, jv_to_str(j, v, at), CASE_UPPER));
    if (IS("lower")) return jv_str(map_case(j, jv_to_str(j, v, at), CASE_LOWER));
    if (IS("capitalize")) return jv_str(map_case(j, jv_to_str(j, v, at), CASE_CAPITALIZE));
    if (IS("title")) return jv_str(title_filter(j, jv_to_str(j, v, at)));
    if (IS("default") || IS("d")) {
        const jvalue *dv = arg(a, 0, "default_value");
        bool boolean = arg_bool(a, 1, "boolean", false);
        if (v.kind == JV_UNDEF || (boolean && !jv_truthy(v)))
            return dv ? *dv : jv_str(jstr_c("", 0));
        return v;
    }
    if (IS("first")) {
        if (v.kind == JV_ITER) { /* takes one item out of the generator */
            if (!v.u.l->n) return jv_undef();
            v.u.l->n--;
            return *v.u.l->items++;
        }
        jlist *l = jinja_iter(j, v, at);
        return l->n ? l->items[0] : jv_undef();
    }
    if (IS("last")) {
        if (v.kind == JV_ITER)
            jfail(j, CELLM_ERR_FORMAT, at, "last: a generator is not reversible");
        jlist *l = jinja_iter(j, v, at);
        return l->n ? l->items[l->n - 1] : jv_undef();
    }
    if (IS("join")) {
        jstr sep = arg_str(j, a, 0, "d", "");
        const jvalue *attr = arg(a, 1, "attribute");
        jlist *l = jinja_iter(j, v, at);
        jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) jbuf_puts(j, &b, sep);
            jvalue x = attr ? attr_of(j, l->items[i], jv_to_str(j, *attr, at), at) : l->items[i];
            jv_write_str(j, &b, x, at);
        }
        return jv_str(jbuf_str(&b));
    }
    if (IS("replace")) {
        if (!arg(a, 0, "old") || !arg(a, 1, "new"))
            jfail(j, CELLM_ERR_FORMAT, at, "replace needs the old and new strings");
        return jv_str(str_replace(j, jv_to_str(j, v, at), arg_str(j, a, 0, "old", ""),
                                  arg_str(j, a, 1, "new", ""), arg_int(j, a, 2, "count", -1)));
    }
    if (IS("items")) { /* a generator in Jinja2 */
        if (v.kind == JV_UNDEF) return (jvalue){.kind = JV_ITER, .u.l = jv_list(j, 0, false).u.l};
        if (v.kind != JV_DICT)
            jfail(j, CELLM_ERR_FORMAT, at, "items needs a mapping, not %s", jv_typename(v));
        jvalue l = jv_list(j, v.u.d->n, false);
        for (size_t i = 0; i < v.u.d->n; i++) {
            jvalue t = jv_list(j, 2, true);
            t.u.l->items[0] = v.u.d->keys[i];
            t.u.l->items[1] = v.u.d->vals[i];
            l.u.l->items[i] = t;
        }
        l.kind = JV_ITER;
        return l;
    }
    if (IS("string") || IS("safe")) {
        jvalue r = jv_str(jv_to_str(j, v, at));
        r.safe = v.safe || IS("safe");
        return r;
    }
    if (IS("int")) {
        const jvalue *dv = arg(a, 0, "default");
        jvalue fallback = dv ? *dv : jv_int(0);
        int64_t base = arg_int(j, a, 1, "base", 10), r;
        double f;
        if (base < 2 || base > 36) jfail(j, CELLM_ERR_FORMAT, at, "int: base must be 2..36");
        if (v.kind == JV_INT) return v;
        if (v.kind == JV_BOOL) return jv_int(v.u.b);
        if (v.kind == JV_FLOAT)
            return v.u.f == v.u.f && fabs(v.u.f) < 9.2e18 ? jv_int((int64_t)v.u.f) : fallback;
        if (v.kind == JV_STR) {
            if (parse_int(v.u.s, base, &r)) return jv_int(r);
            if (base == 10 && parse_float(j, v.u.s, &f) && f == f && fabs(f) < 9.2e18)
                return jv_int((int64_t)f);
        }
        return fallback;
    }
    if (IS("float")) {
        const jvalue *dv = arg(a, 0, "default");
        double f;
        if (jv_is_number(v)) return jv_float(jv_num(v));
        if (v.kind == JV_STR && parse_float(j, v.u.s, &f)) return jv_float(f);
        return dv ? *dv : jv_float(0);
    }
    if (IS("abs")) {
        if (v.kind == JV_FLOAT) return jv_float(fabs(v.u.f));
        if (v.kind == JV_INT && v.u.i != INT64_MIN) return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.kind == JV_BOOL) return jv_int(v.u.b);
        jfail(j, CELLM_ERR_FORMAT, at, "abs needs a number, not %s", jv_typename(v));
    }
    if (IS("round")) {
        if (!jv_is_number(v))
            jfail(j, CELLM_ERR_FORMAT, at, "round needs a number, not %s", jv_typename(v));
        int64_t prec = arg_int(j, a, 0, "precision", 0);
        jstr method = arg_str(j, a, 1, "method", "common");
        double m = pow(10.0, (double)(prec < -300  ? -300
                                      : prec > 300 ? 300
                                                   : prec)),
               x = jv_num(v) * m;
        if (jstr_eq(method, "ceil"))
            x = ceil(x);
        else if (jstr_eq(method, "floor"))
            x = floor(x);
        else if (prec >= 0 && prec <= 20 && fabs(jv_num(v)) < 1e300) {
            /* Python rounds the exact binary value, halves to even; so does
             * printf. */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, jv_num(v));
            x = strtod(buf, NULL) * m;
        } else
            x = rint(x);
        x /= m;
        /* round() of an int stays an int in Python (the common method) */
        if (v.kind != JV_FLOAT && jstr_eq(method, "common") && fabs(x) < 9.2e18)
            return jv_int((int64_t)x);
        return jv_float(x);
    }
    if (IS("list")) {
        jlist *l = jinja_iter(j, v, at);
        jvalue r = jv_list(j, l->n, false);
        if (l->n) memcpy(r.u.l->items, l->items, l->n * sizeof(jvalue));
        return r;
    }
    if (IS("reverse")) {
        /* Python's reversed(): an iterator, except of a generator (not
         * reversible), which Jinja2 turns into a reversed list instead. */
        if (v.kind != JV_STR && v.kind != JV_LIST && v.kind != JV_DICT && v.kind != JV_UNDEF &&
            v.kind != JV_ITER)
            jfail(j, CELLM_ERR_FORMAT, at, "reverse: a %s value is not iterable", jv_typename(v));
        jlist *l = jinja_iter(j, v, at);
        if (v.kind == JV_STR) {
            jbuf b = {0};
            for (size_t i = l->n; i-- > 0;) jbuf_puts(j, &b, l->items[i].u.s);
            return jv_str(jbuf_str(&b));
        }
        jvalue r = jv_list(j, l->n, false);
        for (size_t i = 0; i < l->n; i++) r.u.l->items[i] = l->items[l->n - 1 - i];
        if (v.kind != JV_ITER) r.kind = JV_ITER;
        return r;
    }
    if (IS("sort")) {
        jlist *l = jinja_iter(j, v, at);
        jvalue r = jv_list(j, l->n, false);
        if (l->n) memcpy(r.u.l->items, l->items, l->n * sizeof(jvalue));
        const jvalue *attr = arg(a, 2, "attribute");
        jstr an = attr ? jv_to_str(j, *attr, at) : jstr_c("", 0);
        sort_values(j, r.u.l->items, l->n, attr ? &an : NULL,
                    arg_bool(a, 1, "case_sensitive", false), arg_bool(a, 0, "reverse", false), at);
        return r;
    }
    if (IS("unique")) {
        jlist *l = jinja_iter(j, v, at);
        bool cs = arg_bool(a, 0, "case_sensitive", false);
        const jvalue *attr = arg(a, 1, "attribute");
        vvec out = {0}, seen = {0};
        for (size_t i = 0; i < l->n; i++) {
            jvalue k = attr ? attr_of(j, l->items[i], jv_to_str(j, *attr, at), at) : l->items[i];
            if (!cs && k.kind == JV_STR) k = jv_str(map_case(j, k.u.s, CASE_LOWER));
            bool dup = false;
            for (size_t q = 0; q < seen.n && !dup; q++) dup = jv_eq(j, seen.p[q], k, 0);
            if (dup) continue;
            vv_push(j, &seen, k);
            vv_push(j, &out, l->items[i]);
        }
        return vv_iter(j, &out);
    }
    if (IS("map")) {
        vvec out = {0};
        if (!jv_truthy(v)) return vv_iter(j, &out); /* Jinja2: `if value:` around the loop */
        jlist *l = jinja_iter(j, v, at);
        const jvalue *attr = arg(a, SIZE_MAX, "attribute");
        if (attr) {
            const jvalue *dflt = arg(a, SIZE_MAX, "default");
            jstr an = jv_to_str(j, *attr, at);
            for (size_t i = 0; i < l->n; i++) {
                jvalue x = attr_of(j, l->items[i], an, at);
                vv_push(j, &out, x.kind == JV_UNDEF && dflt ? *dflt : x);
            }
            return vv_iter(j, &out);
        }
        if (a->n < 1) jfail(j, CELLM_ERR_FORMAT, at, "map needs a filter name or attribute=");
        jstr f = jv_to_str(j, a->pos[0], at);
        jargs fa = rest_args(a, 1);
        for (size_t i = 0; i < l->n; i++) vv_push(j, &out, jinja_filter(j, f, l->items[i], &fa));
        return vv_iter(j, &out);
    }
    if (IS("select")) return select_items(j, v, a, false, true);
    if (IS("reject")) return select_items(j, v, a, false, false);
    if (IS("selectattr")) return select_items(j, v, a, true, true);
    if (IS("rejectattr")) return select_items(j, v, a, true, false);
    if (IS("attr")) return jinja_getattr(j, v, arg_str(j, a, 0, "name", ""), at);
    if (IS("indent")) {
        int64_t width = 4;
        const jvalue *w = arg(a, 0, "width");
        jstr pad;
        if (w && w->kind == JV_STR)
            pad = w->u.s;
        else {
            width = arg_int(j, a, 0, "width", 4);
            if (width < 0 || width > 256)
                jfail(j, CELLM_ERR_FORMAT, at, "indent width out of range");
            char *p = jalloc(j, (size_t)width + 1);
            memset(p, ' ', (size_t)width);
            pad = jstr_c(p, (size_t)width);
        }
        bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
        jstr s = jv_to_str(j, v, at);
        jbuf b = {0};
        size_t i = 0;
        bool line_start = true, first_line = true;
        while (i <= s.n) {
            size_t e = i;
            while (e < s.n && s.s[e] != '\n') e++;
            bool empty = e == i;
            if (line_start && (!first_line || first) && (blank || !empty) &&
                !(e == s.n && empty && !first_line))
                jbuf_puts(j, &b, pad);
            jbuf_put(j, &b, s.s + i, e - i);
            if (e < s.n) jbuf_putc(j, &b, '\n');
            first_line = false;
            i = e + 1;
        }
        return jv_str(jbuf_str(&b));
    }
    if (IS("wordcount"))
        return jv_int((int64_t)str_split(j, jv_to_str(j, v, at), NULL, -1, at).u.l->n);
    if (IS("escape") || IS("e") || IS("forceescape")) {
        if (v.safe && !IS("forceescape")) return v; /* Markup is escaped already */
        jvalue r = jv_str(jhtml_escape(j, jv_to_str(j, v, at)));
        r.safe = true;
        return r;
    }
    if (IS("dictsort")) {
        if (v.kind != JV_DICT) jfail(j, CELLM_ERR_FORMAT, at, "dictsort needs a mapping");
        jvalue items = jinja_filter(j, jstr_c("items", 5), v, &(jargs){.at = at});
        bool by_value = jstr_eq(arg_str(j, a, 1, "by", "key"), "value");
        jstr an = jstr_c(by_value ? "1" : "0", 1);
        sort_values(j, items.u.l->items, items.u.l->n, &an, arg_bool(a, 0, "case_sensitive", false),
                    arg_bool(a, 2, "reverse", false), at);
        items.kind = JV_LIST; /* dictsort returns a list */
        return items;
    }
    if (IS("max") || IS("min")) {
        jlist *l = jinja_iter(j, v, at);
        if (!l->n) return jv_undef();
        jvalue best = l->items[0];
        for (size_t i = 1; i < l->n; i++) {
            int c = jv_cmp(j, l->items[i], best, at, 0);
            if (IS("max") ? c > 0 : c < 0) best = l->items[i];
        }
        return best;
    }
    if (IS("sum")) {
        jlist *l = jinja_iter(j, v, at);
        const jvalue *st = arg(a, 1, "start");
        int64_t si = 0;
        double sf = 0;
        bool flt = st && st->kind == JV_FLOAT;
        if (st && jv_is_number(*st)) {
            si = st->kind == JV_INT ? st->u.i : (int64_t)jv_num(*st);
            sf = jv_num(*st);
        }
        for (size_t i = 0; i < l->n; i++) {
            jvalue x = l->items[i];
            if (!jv_is_number(x))
                jfail(j, CELLM_ERR_FORMAT, at, "sum of a %s value", jv_typename(x));
            if (x.kind == JV_FLOAT) flt = true;
            sf += jv_num(x);
            if (!flt && __builtin_add_overflow(si, jv_ival(x), &si))
                jfail(j, CELLM_ERR_UNSUPPORTED, at, "integer overflow");
        }
        return flt ? jv_float(sf) : jv_int(si);
    }
    jfail(j, CELLM_ERR_UNSUPPORTED, at, "unknown filter '%.*s'", (int)name.n, name.s);
#undef IS
}

bool jinja_test(jinja *j, jstr name, jvalue v, const jargs *a) {
#define IS(x) jstr_eq(name, x)
    size_t at = a->at;
    const jvalue *x = arg(a, 0, NULL);
    if (IS("defined")) return v.kind != JV_UNDEF;
    if (IS("undefined")) return v.kind == JV_UNDEF;
    if (IS("none")) return v.kind == JV_NONE;
    if (IS("string")) return v.kind == JV_STR;
    if (IS("number")) return jv_is_number(v);
    if (IS("integer")) return v.kind == JV_INT;
    if (IS("float")) return v.kind == JV_FLOAT;
    if (IS("boolean")) return v.kind == JV_BOOL;
    if (IS("true")) return v.kind == JV_BOOL && v.u.b;
    if (IS("false")) return v.kind == JV_BOOL && !v.u.b;
    if (IS("mapping")) return v.kind == JV_DICT;
    if (IS("iterable"))
        return v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_UNDEF ||
               v.kind == JV_ITER;
    if (IS("sequence"))
        return v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_DICT || v.kind == JV_UNDEF;
    if (IS("callable")) return v.kind == JV_MACRO || v.kind == JV_FUNC || v.kind == JV_METHOD;
    if (IS("escaped")) return v.safe;
    if (IS("lower") || IS("upper")) {
        jstr s = jv_to_str(j, v, at);
        return jv_eq(j, jv_str(s), jv_str(map_case(j, s, IS("lower") ? CASE_LOWER : CASE_UPPER)),
                     0);
    }
    if (IS("even") || IS("odd") || IS("divisibleby")) {
        if (v.kind != JV_INT && v.kind != JV_BOOL)
            jfail(j, CELLM_ERR_FORMAT, at, "test '%.*s' needs an integer, not %s", (int)name.n,
                  name.s, jv_typename(v));
        int64_t i = jv_ival(v);
        if (IS("even")) return i % 2 == 0;
        if (IS("odd")) return i % 2 != 0;
        int64_t d = arg_int(j, a, 0, "num", 0);
        if (d == 0) jfail(j, CELLM_ERR_FORMAT, at, "divisibleby 0");
        return d == -1 || i % d == 0;
    }
    if (IS("eq") || IS("equalto") || IS("==") || IS("sameas") || IS("ne") || IS("!=") || IS("lt") ||
        IS("lessthan") || IS("<") || IS("le") || IS("<=") || IS("gt") || IS("greaterthan") ||
        IS(">") || IS("ge") || IS(">=") || IS("in")) {
        if (!x)
            jfail(j, CELLM_ERR_FORMAT, at, "test '%.*s' needs an argument", (int)name.n, name.s);
        if (IS("eq") || IS("equalto") || IS("==")) return jv_eq(j, v, *x, 0);
        if (IS("sameas")) return v.kind == x->kind && jv_eq(j, v, *x, 0);
        if (IS("ne") || IS("!=")) return !jv_eq(j, v, *x, 0);
        if (IS("in")) {
            jargs none = {.at = at};
            (void)none;
            if (x->kind == JV_STR) {
                if (v.kind != JV_STR)
                    jfail(j, CELLM_ERR_FORMAT, at, "'in <string>' needs a string");
                size_t f;
                return v.u.s.n == 0 || str_find(x->u.s, v.u.s, 0, &f);
            }
            if (x->kind == JV_DICT) return jdict_get(x->u.d, v) != NULL;
            jlist *l = jinja_iter(j, *x, at);
            for (size_t i = 0; i < l->n; i++)
                if (jv_eq(j, v, l->items[i], 0)) return true;
            return false;
        }
        int c = jv_cmp(j, v, *x, at, 0);
        if (IS("lt") || IS("lessthan") || IS("<")) return c < 0;
        if (IS("le") || IS("<=")) return c <= 0;
        if (IS("gt") || IS("greaterthan") || IS(">")) return c > 0;
        return c >= 0;
    }
    jfail(j, CELLM_ERR_UNSUPPORTED, at, "unknown test '%.*s'", (int)name.n, name.s);
#undef IS
}

bool jinja_has_method(jvalue obj, jstr name) {
    static const char *const str_methods[] = {
        "strip",   "lstrip",  "rstrip",     "startswith", "endswith", "split",   "rsplit",
        "lower",   "upper",   "title",      "capitalize", "replace",  "find",    "rfind",
        "count",   "join",    "splitlines", "isdigit",    "isspace",  "isalpha", "isalnum",
        "islower", "isupper", "format",     NULL};
    static const char *const dict_methods[] = {"items", "keys", "values", "get", NULL};
    const char *const *m = obj.kind == JV_STR    ? str_methods
                           : obj.kind == JV_DICT ? dict_methods
                                                 : NULL;
    for (; m && *m; m++)
        if (jstr_eq(name, *m)) return true;
    return false;
}

/* Python's str.format with plain fields: {} {0} {name}, {{ and }}, the
 * conversions !s and !r. A format spec ({:>8}) or field access ({0.x},
 * {0[1]}) is outside the subset. Fields print as str(), which is what
 * format(v, '') gives for the values templates have. */
static jstr str_format(jinja *j, jstr s, const jargs *a, size_t at) {
    jbuf b = {0};
    int numbering = 0; /* 1 automatic ({}), 2 manual ({0}) */
    size_t next = 0;
    for (size_t i = 0; i < s.n; i++) {
        char c = s.s[i];
        if ((c == '{' || c == '}') && i + 1 < s.n && s.s[i + 1] == c) {
            jbuf_putc(j, &b, c);
            i++;
            continue;
        }
        if (c == '}') jfail(j, CELLM_ERR_FORMAT, at, "format: single '}' in the format string");
        if (c != '{') {
            jbuf_putc(j, &b, c);
            continue;
        }
        size_t e = i + 1;
        while (e < s.n && s.s[e] != '}' && s.s[e] != '{') e++;
        if (e == s.n || s.s[e] == '{')
            jfail(j, CELLM_ERR_FORMAT, at, "format: single '{' in the format string");
        jstr f = jstr_c(s.s + i + 1, e - i - 1);
        size_t k = 0;
        while (k < f.n && f.s[k] != '!' && f.s[k] != ':') k++;
        jstr field = jstr_c(f.s, k);
        char conv = 's';
        if (k < f.n && f.s[k] == '!') {
            if (k + 1 >= f.n || (f.s[k + 1] != 's' && f.s[k + 1] != 'r') ||
                (k + 2 < f.n && f.s[k + 2] != ':'))
                jfail(j, CELLM_ERR_FORMAT, at, "format: bad conversion in '{%.*s}'", (int)f.n, f.s);
            conv = f.s[k + 1];
            k += 2;
        }
        if (k + 1 < f.n)
            jfail(j, CELLM_ERR_UNSUPPORTED, at, "format: format specs ('{%.*s}') are not supported",
                  (int)f.n, f.s);
        bool digits = field.n > 0;
        for (size_t q = 0; q < field.n; q++) digits &= field.s[q] >= '0' && field.s[q] <= '9';
        const jvalue *v;
        if (field.n == 0 || digits) {
            int mode = field.n == 0 ? 1 : 2;
            if (numbering && numbering != mode)
                jfail(j, CELLM_ERR_FORMAT, at,
                      "format: cannot mix automatic ({}) and manual ({0}) field numbering");
            numbering = mode;
            size_t idx = 0;
            if (mode == 1) idx = next++;
            for (size_t q = 0; q < field.n; q++) {
                if (idx > a->n) break;
                idx = idx * 10 + (size_t)(field.s[q] - '0');
            }
            if (idx >= a->n)
                jfail(j, CELLM_ERR_FORMAT, at, "format: replacement index %zu out of range", idx);
            v = &a->pos[idx];
        } else {
            for (size_t q = 0; q < field.n; q++)
                if (field.s[q] == '.' || field.s[q] == '[')
                    jfail(j, CELLM_ERR_UNSUPPORTED, at,
                          "format: field access ('{%.*s}') is not supported", (int)f.n, f.s);
            v = NULL;
            for (size_t q = 0; q < a->n_kw && !v; q++)
                if (a->kwn[q].n == field.n && memcmp(a->kwn[q].s, field.s, field.n) == 0)
                    v = &a->kw[q];
            if (!v)
                jfail(j, CELLM_ERR_FORMAT, at, "format: no argument named '%.*s'", (int)field.n,
                      field.s);
        }
        if (conv == 'r')
            jv_write_repr(j, &b, *v, at, 0);
        else
            jv_write_str(j, &b, *v, at);
        i = e;
    }
    return jbuf_str(&b);
}

static jvalue str_method(jinja *j, jstr s, jstr name, const jargs *a) {
#define IS(x) jstr_eq(name, x)
    size_t at = a->at;
    if (IS("strip") || IS("lstrip") || IS("rstrip")) {
        const jvalue *c = arg(a, 0, "chars");
        jstr chars = c && c->kind != JV_NONE ? jv_to_str(j, *c, at) : jstr_c("", 0);
        return jv_str(
            ju8_strip(s, !IS("rstrip"), !IS("lstrip"), c && c->kind != JV_NONE ? &chars : NULL));
    }
    if (IS("startswith") || IS("endswith")) {
        const jvalue *p = arg(a, 0, NULL);
        if (!p) jfail(j, CELLM_ERR_FORMAT, at, "%.*s needs an argument", (int)name.n, name.s);
        return jv_bool(affix(j, s, *p, IS("endswith"), at));
    }
    if (IS("split") || IS("rsplit")) {
        const jvalue *sep = arg(a, 0, "sep");
        int64_t maxsplit = arg_int(j, a, 1, "maxsplit", -1);
        if (IS("rsplit") && maxsplit >= 0)
            jfail(j, CELLM_ERR_UNSUPPORTED, at, "rsplit with maxsplit is not supported");
        jstr sp = sep && sep->kind != JV_NONE ? jv_to_str(j, *sep, at) : jstr_c("", 0);
        return str_split(j, s, sep && sep->kind != JV_NONE ? &sp : NULL, maxsplit, at);
    }
    if (IS("lower")) return jv_str(map_case(j, s, CASE_LOWER));
    if (IS("upper")) return jv_str(map_case(j, s, CASE_UPPER));
    if (IS("title")) return jv_str(map_case(j, s, CASE_TITLE));
    if (IS("capitalize")) return jv_str(map_case(j, s, CASE_CAPITALIZE));
    if (IS("replace")) {
        if (!arg(a, 0, NULL) || !arg(a, 1, NULL))
            jfail(j, CELLM_ERR_FORMAT, at, "replace needs the old and new strings");
        return jv_str(str_replace(j, s, arg_str(j, a, 0, NULL, ""), arg_str(j, a, 1, NULL, ""),
                                  arg_int(j, a, 2, "count", -1)));
    }
    if (IS("find") || IS("rfind") || IS("count")) {
        const jvalue *sub = arg(a, 0, NULL);
        if (!sub || sub->kind != JV_STR)
            jfail(j, CELLM_ERR_FORMAT, at, "%.*s needs a string", (int)name.n, name.s);
        size_t i = 0, f, hits = 0;
        int64_t first = -1, last = -1;
        while (i <= s.n && str_find(s, sub->u.s, i, &f)) {
            if (first < 0) first = (int64_t)f;
            last = (int64_t)f;
            hits++;
            i = f + (sub->u.s.n ? sub->u.s.n : 1);
        }
        /* find returns a character index, not a byte offset */
        int64_t pos = IS("find") ? first : last;
        if (pos > 0) pos = (int64_t)ju8_len(jstr_c(s.s, (size_t)pos));
        return IS("count") ? jv_int((int64_t)hits) : jv_int(pos);
    }
    if (IS("join")) {
        const jvalue *it = arg(a, 0, NULL);
        if (!it) jfail(j, CELLM_ERR_FORMAT, at, "join needs an iterable");
        jlist *l = jinja_iter(j, *it, at);
        jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (l->items[i].kind != JV_STR)
                jfail(j, CELLM_ERR_FORMAT, at, "join: item %zu is %s, not a string", i,
                      jv_typename(l->items[i]));
            if (i) jbuf_puts(j, &b, s);
            jbuf_puts(j, &b, l->items[i].u.s);
        }
        return jv_str(jbuf_str(&b));
    }
    if (IS("splitlines")) {
        vvec out = {0};
        size_t i = 0;
        while (i < s.n) {
            size_t e = i;
            while (e < s.n && s.s[e] != '\n' && s.s[e] != '\r') e++;
            vv_push(j, &out, jv_str(jstr_c(s.s + i, e - i)));
            if (e < s.n && s.s[e] == '\r' && e + 1 < s.n && s.s[e + 1] == '\n') e++;
            i = e + 1;
        }
        return vv_list(j, &out);
    }
    if (IS("isdigit") || IS("isspace") || IS("isalpha") || IS("isalnum") || IS("islower") ||
        IS("isupper")) {
        if (!s.n) return jv_bool(false);
        bool cased = false;
        for (size_t i = 0; i < s.n; i = ju8_next(s.s, s.n, i)) {
            size_t e = ju8_next(s.s, s.n, i), used;
            uint32_t c = utf8_decode_lenient((const uint8_t *)s.s + i, e - i, &used);
            unsigned cls = unicode_class(c);
            if (IS("isdigit") && !(c >= '0' && c <= '9')) return jv_bool(false);
            if (IS("isspace") && !ju8_space_at(s.s, s.n, i)) return jv_bool(false);
            if (IS("isalpha") && !(cls & UCLASS_LETTER)) return jv_bool(false);
            if (IS("isalnum") && !(cls & (UCLASS_LETTER | UCLASS_NUMBER))) return jv_bool(false);
            if (IS("islower") && cp_lower(c) != c) return jv_bool(false);
            if (IS("isupper") && cp_upper(c) != c) return jv_bool(false);
            cased |= cp_cased(c);
        }
        if (IS("islower") || IS("isupper")) return jv_bool(cased);
        return jv_bool(true);
    }
    if (IS("format")) return jv_str(str_format(j, s, a, at));
    jfail(j, CELLM_ERR_UNSUPPORTED, at, "the str method '%.*s' is not supported", (int)name.n,
          name.s);
#undef IS
}

jvalue jinja_method(jinja *j, jmethod *m, const jargs *a) {
    jstr name = m->name;
    if (m->obj.kind == JV_LOOP) { /* loop.cycle(a, b, ...) */
        if (!a->n) jfail(j, CELLM_ERR_FORMAT, a->at, "loop.cycle needs arguments");
        return a->pos[m->obj.u.loop->index0 % a->n];
    }
    if (m->obj.kind == JV_STR) return str_method(j, m->obj.u.s, name, a);
    jdict *d = m->obj.u.d;
    if (jstr_eq(name, "get")) {
        const jvalue *k = arg(a, 0, NULL), *dv = arg(a, 1, "default");
        if (!k) jfail(j, CELLM_ERR_FORMAT, a->at, "get needs a key");
        jvalue *v = jdict_get(d, *k);
        return v ? *v : dv ? *dv : jv_none();
    }
    if (jstr_eq(name, "items")) { /* dict.items(): a view, reusable and with a length */
        jvalue l = jinja_filter(j, name, m->obj, &(jargs){.at = a->at});
        l.kind = JV_LIST;
        return l;
    }
    jvalue l = jv_list(j, d->n, false);
    for (size_t i = 0; i < d->n; i++)
        l.u.l->items[i] = jstr_eq(name, "keys") ? d->keys[i] : d->vals[i];
    return l;
}

jvalue jinja_func(jinja *j, int func, const jargs *a) {
    size_t at = a->at;
    switch (func) {
    case JF_RANGE: {
        if (a->n < 1 || a->n > 3) jfail(j, CELLM_ERR_FORMAT, at, "range takes 1 to 3 arguments");
        int64_t v[3];
        for (size_t i = 0; i < a->n; i++) {
            if (a->pos[i].kind != JV_INT && a->pos[i].kind != JV_BOOL)
                jfail(j, CELLM_ERR_FORMAT, at, "range needs integers, not %s",
                      jv_typename(a->pos[i]));
            v[i] = jv_ival(a->pos[i]);
        }
        int64_t start = a->n > 1 ? v[0] : 0, stop = a->n > 1 ? v[1] : v[0],
                step = a->n > 2 ? v[2] : 1;
        if (step == 0) jfail(j, CELLM_ERR_FORMAT, at, "range step cannot be zero");
        double count = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                                : ceil(((double)start - (double)stop) / (double)-step);
        if (count < 0) count = 0;
        if (count > (double)j->lim.max_steps)
            jfail(j, CELLM_ERR_NO_MEMORY, at, "range of %.0f items is too long", count);
        jvalue l = jv_list(j, (size_t)count, false);
        for (size_t i = 0; i < (size_t)count; i++)
            l.u.l->items[i] = jv_int(start + (int64_t)i * step);
        return l;
    }
    case JF_NAMESPACE:
    case JF_DICT: {
        jvalue d = jv_dict(j);
        if (a->n > 1 || (a->n == 1 && a->pos[0].kind != JV_DICT))
            jfail(j, CELLM_ERR_FORMAT, at, "%s takes a mapping and keyword arguments",
                  func == JF_DICT ? "dict" : "namespace");
        if (a->n)
            for (size_t i = 0; i < a->pos[0].u.d->n; i++)
                jdict_set(j, d.u.d, a->pos[0].u.d->keys[i], a->pos[0].u.d->vals[i]);
        for (size_t i = 0; i < a->n_kw; i++) jdict_set(j, d.u.d, jv_str(a->kwn[i]), a->kw[i]);
        if (func == JF_NAMESPACE) d.kind = JV_NS;
        return d;
    }
    case JF_RAISE: {
        jstr msg = a->n ? jv_to_str(j, a->pos[0], at) : jstr_c("", 0);
        jfail(j, CELLM_ERR_INVALID_ARG, at, "raise_exception: %.*s",
              (int)(msg.n > 400 ? 400 : msg.n), msg.s);
    }
    default: { /* strftime_now(format) */
        jstr fmt = arg_str(j, a, 0, "format", "");
        jstr f = jstr_dup(j, fmt.s, fmt.n);
        time_t now = time(NULL);
        struct tm tm;
        if (!localtime_r(&now, &tm))
            jfail(j, CELLM_ERR_INTERNAL, at, "strftime_now: no local time");
        char buf[256];
        size_t n = f.n ? strftime(buf, sizeof buf, f.s, &tm) : 0;
        return jv_strdup(j, buf, n);
    }
    }
}

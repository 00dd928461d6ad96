/*
 * schema.c — JSON Schema to GBNF. A small JSON reader builds a tree of the
 * schema; each subschema then becomes a rule of the grammar, written as
 * GBNF text that grammar.c compiles like any other grammar. The grammar
 * generates only valid instances, not all of them: an object's properties
 * come in the order the schema lists them, additional properties are never
 * generated, and whitespace is bounded. docs/grammar.md lists the keywords.
 */
#include "schema.h"

#include "grammar_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA_MAX_DEPTH 64      /* nesting of the schema's JSON */
#define SCHEMA_MAX_OUT (1 << 20) /* bytes of GBNF */
#define SCHEMA_MAX_REF_DEPTH 32  /* $ref chains followed while compiling */

/* ------------------------------------------------------------ JSON tree */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jnode {
    jtype type;
    bool b;
    double num;
    const char *raw; /* a number's text in the schema */
    size_t raw_len;
    char *str; /* a string's value (NUL-terminated; may hold NULs: str_len) */
    size_t str_len;
    struct jnode **kids; /* array items or object values */
    char **keys;         /* object keys */
    size_t n, cap;
} jnode;

typedef struct jreader {
    const char *s;
    size_t n, i;
    cellm_error *err;
    bool failed;
} jreader;

static void jfree(jnode *j) {
    if (!j) return;
    for (size_t k = 0; k < j->n; k++) {
        jfree(j->kids[k]);
        if (j->keys) free(j->keys[k]);
    }
    free(j->kids);
    free(j->keys);
    free(j->str);
    free(j);
}

static jnode *jerr(jreader *r, const char *what) {
    if (!r->failed) err_set(r->err, CELLM_ERR_FORMAT, "json schema: %s at byte %zu", what, r->i);
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

static size_t put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
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
        m += put_utf8(o + m, cp); /* \uXXXX is 6 bytes: never more out than in */
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

static bool jpush(jreader *r, jnode *j, jnode *kid, char *key) {
    if (j->n == j->cap) {
        size_t c = j->cap ? j->cap * 2 : 4;
        jnode **k = realloc(j->kids, c * sizeof(*k));
        if (k) j->kids = k;
        char **ks = k && j->type == J_OBJ ? realloc(j->keys, c * sizeof(*ks)) : NULL;
        if (ks) j->keys = ks;
        if (!k || (j->type == J_OBJ && !ks)) {
            jfree(kid);
            free(key);
            jerr(r, "out of memory");
            return false;
        }
        j->cap = c;
    }
    j->kids[j->n] = kid;
    if (j->type == J_OBJ) j->keys[j->n] = key;
    j->n++;
    return true;
}

static jnode *jvalue(jreader *r, int depth) {
    if (depth > SCHEMA_MAX_DEPTH) return jerr(r, "nested too deep");
    jspace(r);
    if (r->i >= r->n) return jerr(r, "unexpected end");
    jnode *j = calloc(1, sizeof(*j));
    if (!j) return jerr(r, "out of memory");
    char c = r->s[r->i];
    if (c == '{' || c == '[') {
        j->type = c == '{' ? J_OBJ : J_ARR;
        char close = c == '{' ? '}' : ']';
        r->i++;
        jspace(r);
        if (r->i < r->n && r->s[r->i] == close) {
            r->i++;
            return j;
        }
        for (;;) {
            char *key = NULL;
            if (j->type == J_OBJ) {
                jspace(r);
                size_t kl;
                if (r->i >= r->n || r->s[r->i] != '"' || !(key = jstring(r, &kl))) {
                    jfree(j);
                    return jerr(r, "expected a key");
                }
                jspace(r);
                if (r->i >= r->n || r->s[r->i] != ':') {
                    free(key);
                    jfree(j);
                    return jerr(r, "expected ':'");
                }
                r->i++;
            }
            jnode *kid = jvalue(r, depth + 1);
            if (!kid) {
                free(key);
                jfree(j);
                return NULL;
            }
            if (!jpush(r, j, kid, key)) {
                jfree(j);
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
            jfree(j);
            return jerr(r, "expected ',' or a closing bracket");
        }
    }
    if (c == '"') {
        j->type = J_STR;
        j->str = jstring(r, &j->str_len);
        if (!j->str) {
            jfree(j);
            return NULL;
        }
        return j;
    }
    const char *words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t wl = strlen(words[k]);
        if (r->n - r->i >= wl && memcmp(r->s + r->i, words[k], wl) == 0) {
            r->i += wl;
            j->type = k == 2 ? J_NULL : J_BOOL;
            j->b = k == 0;
            return j;
        }
    }
    size_t b = r->i;
    if (r->i < r->n && r->s[r->i] == '-') r->i++;
    while (r->i < r->n && strchr("0123456789.eE+-", r->s[r->i]) && r->s[r->i]) r->i++;
    if (r->i == b || r->i - b > 64) {
        jfree(j);
        return jerr(r, "unexpected character");
    }
    char tmp[72];
    memcpy(tmp, r->s + b, r->i - b);
    tmp[r->i - b] = '\0';
    char *end;
    j->num = strtod(tmp, &end);
    if (*end || !isfinite(j->num)) {
        jfree(j);
        return jerr(r, "bad number");
    }
    j->type = J_NUM;
    j->raw = r->s + b;
    j->raw_len = r->i - b;
    return j;
}

static const jnode *jget(const jnode *o, const char *key) {
    if (!o || o->type != J_OBJ) return NULL;
    for (size_t k = 0; k < o->n; k++)
        if (!strcmp(o->keys[k], key)) return o->kids[k];
    return NULL;
}

/* ------------------------------------------------------------- output */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool full;
} sbuf;

static void sb_add(sbuf *b, const char *p, size_t n) {
    if (b->full) return;
    if (b->n + n + 1 > SCHEMA_MAX_OUT) {
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

static void sb_str(sbuf *b, const char *s) {
    sb_add(b, s, strlen(s));
}

static void sb_printf(sbuf *b, const char *fmt, ...) CELLM_PRINTF(2, 3);
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Bytes as the inside of a GBNF string literal. */
static void sb_lit(sbuf *b, const char *p, size_t n) {
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)p[k];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_add(b, e, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\x%02x", c);
        } else {
            sb_add(b, (const char *)&c, 1);
        }
    }
}

/* A JSON value as its compact JSON text (for enum and const). */
static void json_write(sbuf *b, const jnode *j) {
    switch (j->type) {
    case J_NULL: sb_str(b, "null"); break;
    case J_BOOL: sb_add(b, j->b ? "true" : "false", j->b ? 4 : 5); break;
    case J_NUM: sb_add(b, j->raw, j->raw_len); break;
    case J_STR:
        sb_str(b, "\"");
        for (size_t k = 0; k < j->str_len; k++) {
            unsigned char c = (unsigned char)j->str[k];
            if (c == '"' || c == '\\') {
                char e[2] = {'\\', (char)c};
                sb_add(b, e, 2);
            } else if (c < 0x20) {
                sb_printf(b, "\\u%04x", c);
            } else {
                sb_add(b, (const char *)&c, 1);
            }
        }
        sb_str(b, "\"");
        break;
    case J_ARR:
    case J_OBJ:
        sb_add(b, j->type == J_ARR ? "[" : "{", 1);
        for (size_t k = 0; k < j->n; k++) {
            if (k) sb_str(b, ",");
            if (j->type == J_OBJ) {
                jnode key = {.type = J_STR, .str = j->keys[k], .str_len = strlen(j->keys[k])};
                json_write(b, &key);
                sb_str(b, ":");
            }
            json_write(b, j->kids[k]);
        }
        sb_add(b, j->type == J_ARR ? "]" : "}", 1);
        break;
    }
}

/* ----------------------------------------------------------- compiler */

typedef struct sdef {
    const char *name; /* the $ref text */
    int rule;
} sdef;

typedef struct sc {
    const jnode *root;
    sbuf out;
    int n_rules;
    sdef *defs;
    size_t n_defs, cap_defs;
    int ref_depth;
    cellm_error *err;
    bool failed;
} sc;

static int fail_s(sc *c, const char *fmt, const char *what) {
    if (!c->failed) {
        char msg[256];
        snprintf(msg, sizeof msg, fmt, what);
        err_set(c->err, CELLM_ERR_FORMAT, "json schema: %s", msg);
    }
    c->failed = true;
    return -1;
}

static int compile(sc *c, const jnode *s, int depth);

/* Starts rule r<id>'s definition. */
static int rule_open(sc *c) {
    int id = c->n_rules++;
    sb_printf(&c->out, "r%d ::= ", id);
    return id;
}

#define INT_LIMIT 999999999999999.0 /* integers beyond 15 digits are not generated */

/* Same-length decimal strings x..y (x <= y, n digits each) as GBNF. */
static void same_len(sbuf *b, const char *x, const char *y, int n) {
    if (n == 0) return;
    if (!memcmp(x, y, (size_t)n)) {
        sb_printf(b, " \"%.*s\"", n, x);
        return;
    }
    if (x[0] == y[0]) {
        sb_printf(b, " \"%c\"", x[0]);
        same_len(b, x + 1, y + 1, n - 1);
        return;
    }
    char nines[20], zeros[20];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    /* A rest of all zeros (nines) needs no branch of its own: it joins the
     * middle, so the text grows with n squared, not 2^n. */
    bool low_full = !memcmp(x + 1, zeros, (size_t)n - 1);
    bool high_full = !memcmp(y + 1, nines, (size_t)n - 1);
    char from = low_full ? x[0] : (char)(x[0] + 1), to = high_full ? y[0] : (char)(y[0] - 1);
    const char *sep = " (";
    if (!low_full) {
        sb_printf(b, "%s \"%c\"", sep, x[0]);
        same_len(b, x + 1, nines, n - 1);
        sep = " |";
    }
    if (from <= to) {
        sb_printf(b, "%s [%c-%c]", sep, from, to);
        if (n > 1) sb_printf(b, " [0-9]{%d}", n - 1);
        sep = " |";
    }
    if (!high_full) {
        sb_printf(b, "%s \"%c\"", sep, y[0]);
        same_len(b, zeros, y + 1, n - 1);
    }
    sb_str(b, " )");
}

/* The decimal integers a..b (0 <= a <= b <= INT_LIMIT), no leading zeros. */
static void uint_range(sbuf *b, double a, double hi) {
    char xs[24], ys[24];
    int la = snprintf(xs, sizeof xs, "%.0f", a), lb = snprintf(ys, sizeof ys, "%.0f", hi);
    sb_str(b, " (");
    for (int len = la; len <= lb; len++) {
        double from = len == 1 ? 0 : pow(10, len - 1), to = pow(10, len) - 1;
        if (from < a) from = a;
        if (to > hi) to = hi;
        snprintf(xs, sizeof xs, "%.0f", from);
        snprintf(ys, sizeof ys, "%.0f", to);
        if (len > la) sb_str(b, " |");
        same_len(b, xs, ys, len);
    }
    sb_str(b, " )");
}

/* The integers lo..hi exactly (bounds clamped to 15 digits). */
static void int_range(sbuf *b, double lo, double hi) {
    if (lo < -INT_LIMIT) lo = -INT_LIMIT;
    if (hi > INT_LIMIT) hi = INT_LIMIT;
    sb_str(b, "(");
    bool any = false;
    if (hi >= 0) {
        uint_range(b, lo > 0 ? lo : 0, hi);
        any = true;
    }
    if (lo < 0) {
        if (any) sb_str(b, " |");
        sb_str(b, " \"-\"");
        uint_range(b, hi < 0 ? -hi : 1, -lo);
    }
    sb_str(b, " )");
}

/* An integer rule for the bounds given (either may be absent): exact. */
static bool emit_integer(sc *c, sbuf *b, const jnode *min, const jnode *max, const jnode *xmin,
                         const jnode *xmax) {
    double lo = -INFINITY, hi = INFINITY;
    if (min && min->type == J_NUM) lo = ceil(min->num);
    if (xmin && xmin->type == J_NUM) lo = fmax(lo, floor(xmin->num) + 1);
    if (max && max->type == J_NUM) hi = floor(max->num);
    if (xmax && xmax->type == J_NUM) hi = fmin(hi, ceil(xmax->num) - 1);
    if (lo > INT_LIMIT || hi < -INT_LIMIT || hi < lo) {
        fail_s(c, "%s", "integer bounds that no 15-digit integer meets");
        return false;
    }
    if (lo <= -INT_LIMIT && hi >= INT_LIMIT)
        sb_str(b, "( \"-\"? ( \"0\" | [1-9] [0-9]{0,14} ) )");
    else if (lo == 0 && hi >= INT_LIMIT)
        sb_str(b, "( \"0\" | [1-9] [0-9]{0,14} )");
    else
        int_range(b, lo, hi);
    return true;
}

/* A regular expression (a subset: literals, escapes \d \w \s and escaped
 * punctuation, classes, ., groups, |, ? * + {m,n}; anchored at both ends)
 * as GBNF whose characters stay valid inside a JSON string. */
static bool emit_pattern(sc *c, sbuf *b, const char *p) {
    size_t n = strlen(p), i = 0;
    if (n && p[0] == '^') i++;
    if (n > i && p[n - 1] == '$' && (n < 2 || p[n - 2] != '\\')) n--;
    int depth = 0;
    sb_str(b, "(");
    while (i < n) {
        char ch = p[i];
        if (ch == '(') {
            if (i + 2 < n && p[i + 1] == '?' && p[i + 2] == ':') i += 2;
            depth++;
            sb_str(b, " (");
            i++;
        } else if (ch == ')') {
            if (--depth < 0) return fail_s(c, "pattern '%s': unbalanced ')'", p), false;
            sb_str(b, " )");
            i++;
        } else if (ch == '|' || ch == '?' || ch == '*' || ch == '+') {
            sb_printf(b, " %c", ch);
            i++;
        } else if (ch == '{') {
            size_t e = i + 1;
            while (e < n && strchr("0123456789,", p[e]) && p[e]) e++;
            if (e >= n || p[e] != '}') return fail_s(c, "pattern '%s': bad {m,n}", p), false;
            sb_add(b, p + i, e - i + 1);
            i = e + 1;
        } else if (ch == '.') {
            sb_str(b, " [^\"\\\\\\x00-\\x1f]");
            i++;
        } else if (ch == '[') {
            size_t e = i + 1;
            if (e < n && p[e] == '^') e++;
            if (e < n && p[e] == ']') e++;
            while (e < n && p[e] != ']') e += p[e] == '\\' ? 2 : 1;
            if (e >= n) return fail_s(c, "pattern '%s': unterminated class", p), false;
            bool neg = p[i + 1] == '^';
            sb_str(b, " [");
            if (neg) sb_str(b, "^\"\\\\\\x00-\\x1f");
            for (size_t k = i + 1 + (neg ? 1 : 0); k < e; k++) {
                if (p[k] == '\\' && k + 1 < e) {
                    char x = p[++k];
                    if (x == 'd')
                        sb_str(b, "0-9");
                    else if (x == 'w')
                        sb_str(b, "a-zA-Z0-9_");
                    else if (x == 's')
                        sb_str(b, " \\t");
                    else if (x == '"' || x == '\\')
                        return fail_s(c, "pattern '%s': quote or backslash", p), false;
                    else
                        sb_printf(b, "\\x%02x", (unsigned char)x);
                } else if (p[k] == '"' || (unsigned char)p[k] < 0x20) {
                    return fail_s(c, "pattern '%s': a quote or control character", p), false;
                } else {
                    sb_add(b, p + k, 1);
                }
            }
            sb_str(b, "]");
            i = e + 1;
        } else if (ch == '\\' && i + 1 < n) {
            char x = p[i + 1];
            if (x == 'd')
                sb_str(b, " [0-9]");
            else if (x == 'w')
                sb_str(b, " [a-zA-Z0-9_]");
            else if (x == 's')
                sb_str(b, " [ \\t]");
            else if (x == 'D' || x == 'W' || x == 'S' || x == 'b' || x == 'B' ||
                     (x >= '1' && x <= '9'))
                return fail_s(c, "pattern '%s': escape not supported", p), false;
            else if (x == '"' || x == '\\' || x == 'n' || x == 't' || x == 'r')
                return fail_s(c, "pattern '%s': quote, backslash or control escape", p), false;
            else
                sb_printf(b, " \"\\x%02x\"", (unsigned char)x);
            i += 2;
        } else if (ch == '"' || ch == '\\' || (unsigned char)ch < 0x20 || ch == '^' || ch == '$') {
            return fail_s(c, "pattern '%s': a quote, control character or inner anchor", p), false;
        } else {
            sb_str(b, " \"");
            size_t len = 1;
            while (i + len < n && ((unsigned char)p[i + len] & 0xC0) == 0x80) len++;
            sb_add(b, p + i, len);
            sb_str(b, "\"");
            i += len;
        }
    }
    if (depth != 0) return fail_s(c, "pattern '%s': unbalanced '('", p), false;
    sb_str(b, " )");
    return true;
}

/* A $ref: "#" or "#/$defs/NAME" or "#/definitions/NAME". */
static int compile_ref(sc *c, const char *ref, int depth) {
    for (size_t k = 0; k < c->n_defs; k++)
        if (!strcmp(c->defs[k].name, ref)) return c->defs[k].rule;
    const jnode *target = NULL;
    if (!strcmp(ref, "#")) {
        target = c->root;
    } else if (!strncmp(ref, "#/$defs/", 8)) {
        target = jget(jget(c->root, "$defs"), ref + 8);
    } else if (!strncmp(ref, "#/definitions/", 14)) {
        target = jget(jget(c->root, "definitions"), ref + 14);
    }
    if (!target) return fail_s(c, "$ref '%s' does not resolve (only #/$defs/NAME and #)", ref);
    if (++c->ref_depth > SCHEMA_MAX_REF_DEPTH)
        return fail_s(c, "$ref '%s': references nested too deep", ref);
    if (c->n_defs == c->cap_defs) {
        size_t cap = c->cap_defs ? c->cap_defs * 2 : 8;
        sdef *d = realloc(c->defs, cap * sizeof(*d));
        if (!d) return fail_s(c, "%s", "out of memory");
        c->defs = d;
        c->cap_defs = cap;
    }
    /* The rule's id is known before its body, so recursion refers to it. */
    int id = c->n_rules++;
    c->defs[c->n_defs++] = (sdef){ref, id};
    int body = compile(c, target, depth + 1);
    c->ref_depth--;
    if (body < 0) return -1;
    sb_printf(&c->out, "r%d ::= r%d\n", id, body);
    return id;
}

/* An object with `props` (in order) of which those in `required` must be. */
static int compile_object(sc *c, const jnode *s, int depth) {
    const jnode *props = jget(s, "properties"), *req = jget(s, "required");
    const jnode *extra = jget(s, "additionalProperties");
    if (req && req->type != J_ARR) return fail_s(c, "%s must be an array", "required");
    size_t np = props && props->type == J_OBJ ? props->n : 0;
    if (req)
        for (size_t k = 0; k < req->n; k++) {
            if (req->kids[k]->type != J_STR) return fail_s(c, "%s must hold strings", "required");
            if (!jget(props, req->kids[k]->str))
                return fail_s(c, "required property '%s' is not in properties", req->kids[k]->str);
        }
    if (np == 0) {
        /* Any members, or members of the additionalProperties schema. */
        int v = -1;
        if (extra && extra->type == J_OBJ) v = compile(c, extra, depth + 1);
        if (c->failed) return -1;
        int id = rule_open(c);
        if (v < 0)
            sb_str(&c->out, "object\n");
        else
            sb_printf(
                &c->out,
                "\"{\" ws ( string ws \":\" ws r%d ws ( \",\" ws string ws \":\" ws r%d ws )* "
                ")? \"}\"\n",
                v, v);
        return id;
    }
    int *val = malloc(np * sizeof(int));
    if (!val) return fail_s(c, "%s", "out of memory");
    for (size_t k = 0; k < np && !c->failed; k++) val[k] = compile(c, props->kids[k], depth + 1);
    if (c->failed) {
        free(val);
        return -1;
    }
    /* a<k>: properties k.. with none written yet; b<k>: after one. */
    int base = c->n_rules;
    c->n_rules += (int)(2 * np + 1);
    for (size_t k = 0; k < np; k++) {
        bool must = false;
        for (size_t q = 0; req && q < req->n; q++)
            if (!strcmp(req->kids[q]->str, props->keys[k])) must = true;
        int a = base + (int)(2 * k), b = a + 1, an = a + 2, bn = a + 3;
        sbuf kv = {0};
        sb_str(&kv, "\"\\\"");
        jnode key = {.type = J_STR, .str = props->keys[k], .str_len = strlen(props->keys[k])};
        sbuf js = {0};
        json_write(&js, &key);
        if (js.full || !js.s) {
            free(js.s);
            free(kv.s);
            free(val);
            return fail_s(c, "%s", "out of memory");
        }
        sb_lit(&kv, js.s + 1, js.n - 2);
        free(js.s);
        sb_printf(&kv, "\\\"\" ws \":\" ws r%d ws", val[k]);
        const char *kvs = kv.s ? kv.s : "";
        if (k + 1 == np) an = bn = -1;
        if (must) {
            sb_printf(&c->out, "r%d ::= ", a);
            sb_str(&c->out, kvs);
            if (bn >= 0) sb_printf(&c->out, " r%d", bn);
            sb_printf(&c->out, "\nr%d ::= \",\" ws ", b);
            sb_str(&c->out, kvs);
            if (bn >= 0) sb_printf(&c->out, " r%d", bn);
            sb_str(&c->out, "\n");
        } else {
            sb_printf(&c->out, "r%d ::= ", a);
            sb_str(&c->out, kvs);
            if (bn >= 0)
                sb_printf(&c->out, " r%d | r%d\n", bn, an);
            else
                sb_str(&c->out, " | \"\"\n");
            sb_printf(&c->out, "r%d ::= \",\" ws ", b);
            sb_str(&c->out, kvs);
            if (bn >= 0)
                sb_printf(&c->out, " r%d | r%d\n", bn, bn);
            else
                sb_str(&c->out, " | \"\"\n");
        }
        free(kv.s);
    }
    free(val);
    int id = base + (int)(2 * np);
    sb_printf(&c->out, "r%d ::= \"{\" ws r%d \"}\"\n", id, base);
    return id;
}

static int compile_type(sc *c, const jnode *s, const char *type, int depth) {
    if (!strcmp(type, "object")) return compile_object(c, s, depth);
    if (!strcmp(type, "array")) {
        const jnode *items = jget(s, "items"), *mn = jget(s, "minItems"), *mx = jget(s, "maxItems");
        int it = -1;
        if (items && items->type == J_OBJ) it = compile(c, items, depth + 1);
        if (c->failed) return -1;
        double lo = mn && mn->type == J_NUM ? mn->num : 0,
               hi = mx && mx->type == J_NUM ? mx->num : -1;
        if (lo < 0 || lo > GRAMMAR_MAX_REPEAT || hi > GRAMMAR_MAX_REPEAT || (hi >= 0 && hi < lo))
            return fail_s(c, "%s out of range (0..1000, minItems <= maxItems)",
                          "minItems/maxItems");
        char item[32];
        if (it >= 0)
            snprintf(item, sizeof item, "r%d", it);
        else
            snprintf(item, sizeof item, "value");
        int id = rule_open(c);
        if (hi == 0) {
            sb_str(&c->out, "\"[\" ws \"]\"\n");
            return id;
        }
        char rep[48];
        int rlo = lo > 1 ? (int)lo - 1 : 0;
        if (hi < 0)
            snprintf(rep, sizeof rep, "{%d,}", rlo);
        else
            snprintf(rep, sizeof rep, "{%d,%d}", rlo, (int)hi - 1);
        sb_printf(&c->out, "\"[\" ws %s%s ws ( \",\" ws %s ws )%s %s\"]\"\n", lo > 0 ? "" : "( ",
                  item, item, rep, lo > 0 ? "" : ")? ");
        return id;
    }
    if (!strcmp(type, "string")) {
        const jnode *pat = jget(s, "pattern"), *mn = jget(s, "minLength"),
                    *mx = jget(s, "maxLength");
        int id = rule_open(c);
        if (pat && pat->type == J_STR) {
            sb_str(&c->out, "\"\\\"\" ");
            if (!emit_pattern(c, &c->out, pat->str)) return -1;
            sb_str(&c->out, " \"\\\"\"\n");
            return id;
        }
        double lo = mn && mn->type == J_NUM ? mn->num : 0,
               hi = mx && mx->type == J_NUM ? mx->num : -1;
        if (lo < 0 || lo > GRAMMAR_MAX_REPEAT || hi > GRAMMAR_MAX_REPEAT || (hi >= 0 && hi < lo))
            return fail_s(c, "%s out of range (0..1000, minLength <= maxLength)",
                          "minLength/maxLength");
        if (hi < 0)
            sb_printf(&c->out, "\"\\\"\" char{%d,} \"\\\"\"\n", (int)lo);
        else
            sb_printf(&c->out, "\"\\\"\" char{%d,%d} \"\\\"\"\n", (int)lo, (int)hi);
        return id;
    }
    if (!strcmp(type, "integer")) {
        int id = rule_open(c);
        if (!emit_integer(c, &c->out, jget(s, "minimum"), jget(s, "maximum"),
                          jget(s, "exclusiveMinimum"), jget(s, "exclusiveMaximum")))
            return -1;
        sb_str(&c->out, "\n");
        return id;
    }
    if (!strcmp(type, "number")) {
        int id = rule_open(c);
        const jnode *mn = jget(s, "minimum"), *mx = jget(s, "maximum");
        if ((mn && mn->type == J_NUM) || (mx && mx->type == J_NUM)) {
            /* Integers within the bounds, or a decimal whose integer part
             * keeps it within them whatever its fraction: exact for
             * integral bounds; a value between a fractional bound and the
             * nearest integer inside is never made. */
            double lo = mn && mn->type == J_NUM ? ceil(mn->num) : -INT_LIMIT;
            double hi = mx && mx->type == J_NUM ? floor(mx->num) : INT_LIMIT;
            if (!emit_integer(c, &c->out, &(jnode){.type = J_NUM, .num = lo},
                              &(jnode){.type = J_NUM, .num = hi}, NULL, NULL))
                return -1;
            if (lo < -INT_LIMIT) lo = -INT_LIMIT;
            if (hi > INT_LIMIT) hi = INT_LIMIT;
            double p0 = lo > 0 ? lo : 0; /* i.f with p0 <= i <= hi - 1 */
            if (hi - 1 >= p0) {
                sb_str(&c->out, " |");
                uint_range(&c->out, p0, hi - 1);
                sb_str(&c->out, " \".\" [0-9]{1,6}");
            }
            double n0 = hi < 0 ? -hi : 0; /* -i.f with n0 <= i <= -lo - 1 */
            if (lo <= -1 && -lo - 1 >= n0) {
                sb_str(&c->out, " | \"-\"");
                uint_range(&c->out, n0, -lo - 1);
                sb_str(&c->out, " \".\" [0-9]{1,6}");
            }
            sb_str(&c->out, "\n");
        } else {
            sb_str(&c->out, "number\n");
        }
        return id;
    }
    if (!strcmp(type, "boolean")) {
        int id = rule_open(c);
        sb_str(&c->out, "( \"true\" | \"false\" )\n");
        return id;
    }
    if (!strcmp(type, "null")) {
        int id = rule_open(c);
        sb_str(&c->out, "\"null\"\n");
        return id;
    }
    return fail_s(c, "unknown type '%s'", type);
}

static int compile_alts(sc *c, const jnode *list, const char *what, int depth) {
    if (list->type != J_ARR || list->n == 0) return fail_s(c, "%s must be a non-empty array", what);
    int *ids = malloc(list->n * sizeof(int));
    if (!ids) return fail_s(c, "%s", "out of memory");
    for (size_t k = 0; k < list->n && !c->failed; k++)
        ids[k] = compile(c, list->kids[k], depth + 1);
    if (c->failed) {
        free(ids);
        return -1;
    }
    int id = rule_open(c);
    for (size_t k = 0; k < list->n; k++) sb_printf(&c->out, "%sr%d", k ? " | " : "", ids[k]);
    sb_str(&c->out, "\n");
    free(ids);
    return id;
}

static int compile(sc *c, const jnode *s, int depth) {
    if (c->failed) return -1;
    if (depth > SCHEMA_MAX_DEPTH) return fail_s(c, "%s", "schema nested too deep");
    if (c->out.full) return fail_s(c, "%s", "schema too large (its grammar passes 1 MiB)");
    if (s->type == J_BOOL) {
        if (!s->b) return fail_s(c, "%s", "the schema 'false' matches nothing");
        int id = rule_open(c);
        sb_str(&c->out, "value\n");
        return id;
    }
    if (s->type != J_OBJ) return fail_s(c, "%s", "a schema must be an object or a boolean");
    const jnode *x;
    if ((x = jget(s, "$ref"))) {
        if (x->type != J_STR) return fail_s(c, "%s must be a string", "$ref");
        return compile_ref(c, x->str, depth);
    }
    if ((x = jget(s, "const"))) {
        int id = rule_open(c);
        sbuf js = {0};
        json_write(&js, x);
        sb_str(&c->out, "\"");
        sb_lit(&c->out, js.s ? js.s : "", js.n);
        sb_str(&c->out, "\"\n");
        free(js.s);
        return id;
    }
    if ((x = jget(s, "enum"))) {
        if (x->type != J_ARR || x->n == 0) return fail_s(c, "%s must be a non-empty array", "enum");
        int id = rule_open(c);
        for (size_t k = 0; k < x->n; k++) {
            sbuf js = {0};
            json_write(&js, x->kids[k]);
            sb_add(&c->out, k ? " | \"" : "\"", k ? 4 : 1);
            sb_lit(&c->out, js.s ? js.s : "", js.n);
            sb_str(&c->out, "\"");
            free(js.s);
        }
        sb_str(&c->out, "\n");
        return id;
    }
    if ((x = jget(s, "anyOf"))) return compile_alts(c, x, "anyOf", depth);
    if ((x = jget(s, "oneOf"))) return compile_alts(c, x, "oneOf", depth);
    if ((x = jget(s, "allOf"))) {
        if (x->type == J_ARR && x->n == 1) return compile(c, x->kids[0], depth + 1);
        return fail_s(c, "%s is supported with one schema only", "allOf");
    }
    const jnode *type = jget(s, "type");
    if (!type) {
        if (jget(s, "properties")) return compile_type(c, s, "object", depth);
        if (jget(s, "items")) return compile_type(c, s, "array", depth);
        int id = rule_open(c);
        sb_str(&c->out, "value\n");
        return id;
    }
    if (type->type == J_STR) return compile_type(c, s, type->str, depth);
    if (type->type == J_ARR && type->n > 0) {
        int *ids = malloc(type->n * sizeof(int));
        if (!ids) return fail_s(c, "%s", "out of memory");
        for (size_t k = 0; k < type->n && !c->failed; k++) {
            if (type->kids[k]->type != J_STR) {
                free(ids);
                return fail_s(c, "%s must hold strings", "type");
            }
            ids[k] = compile_type(c, s, type->kids[k]->str, depth);
        }
        if (c->failed) {
            free(ids);
            return -1;
        }
        int id = rule_open(c);
        for (size_t k = 0; k < type->n; k++) sb_printf(&c->out, "%sr%d", k ? " | " : "", ids[k]);
        sb_str(&c->out, "\n");
        free(ids);
        return id;
    }
    return fail_s(c, "%s must be a string or an array of strings", "type");
}

cellm_status schema_to_gbnf(const char *schema, size_t len, char **out, size_t *out_len,
                            cellm_error *err) {
    *out = NULL;
    *out_len = 0;
    for (size_t i = 0; i < len;) {
        size_t at = i;
        if (grammar_utf8_next(schema, len, &i) < 0)
            return err_set(err, CELLM_ERR_FORMAT, "json schema: invalid UTF-8 at byte %zu", at);
    }
    jreader r = {.s = schema, .n = len, .err = err};
    jnode *root = jvalue(&r, 0);
    if (!root) return err ? err->code : CELLM_ERR_FORMAT;
    jspace(&r);
    if (r.i != r.n) {
        jfree(root);
        jerr(&r, "text after the schema");
        return CELLM_ERR_FORMAT;
    }
    sc c = {.root = root, .err = err};
    int top = compile(&c, root, 0);
    if (top >= 0 && c.out.full) fail_s(&c, "%s", "schema too large (its grammar passes 1 MiB)");
    if (top >= 0 && !c.failed) {
        sb_printf(&c.out, "root ::= r%d\n", top);
        sb_add(&c.out, grammar_json_object_gbnf + strlen("root ::= object\n"),
               strlen(grammar_json_object_gbnf) - strlen("root ::= object\n"));
        if (c.out.full) fail_s(&c, "%s", "schema too large (its grammar passes 1 MiB)");
    }
    free(c.defs);
    jfree(root);
    if (c.failed || top < 0) {
        free(c.out.s);
        return CELLM_ERR_FORMAT;
    }
    *out = c.out.s;
    *out_len = c.out.n;
    return CELLM_OK;
}

/*
 * schema.c — JSON Schema to GBNF. A small JSON reader builds a tree of the
 * schema; each subschema then becomes a rule of the grammar, written as
 * GBNF text that grammar.c compiles like any other grammar. The grammar
 * generates only valid instances, not all of them: an object's properties
 * come in the order the schema lists them, additional properties are never
 * generated, and whitespace is bounded. docs/grammar.md lists the keywords.
 */
#include "text/schema.h"

#include "text/grammar_internal.h"
#include "text/json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCHEMA_MAX_DEPTH 64      /* nesting of the schema's JSON */
#define SCHEMA_MAX_OUT (1 << 20) /* bytes of GBNF */
#define SCHEMA_MAX_REF_DEPTH 32  /* $ref chains followed while compiling */

static void sb_printf(json_buf *b, const char *fmt, ...) CELLM_PRINTF(2, 3);
static void sb_printf(json_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) json_buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* Bytes as the inside of a GBNF string literal. */
static void sb_lit(json_buf *b, const char *p, size_t n) {
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)p[k];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            json_buf_add(b, e, 2);
        } else if (c < 0x20) {
            sb_printf(b, "\\x%02x", c);
        } else {
            json_buf_add(b, (const char *)&c, 1);
        }
    }
}

/* ----------------------------------------------------------- compiler */

typedef struct sdef {
    const char *name; /* the $ref text */
    int rule;
} sdef;

typedef struct sc {
    const json_node *root;
    json_buf out;
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

static int compile(sc *c, const json_node *s, int depth);

/* Starts rule r<id>'s definition. */
static int rule_open(sc *c) {
    int id = c->n_rules++;
    sb_printf(&c->out, "r%d ::= ", id);
    return id;
}

#define INT_LIMIT 999999999999999.0 /* integers beyond 15 digits are not generated */

/* Same-length decimal strings x..y (x <= y, n digits each) as GBNF. */
static void same_len(json_buf *b, const char *x, const char *y, int n) {
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
    json_buf_str(b, " )");
}

/* The decimal integers a..b (0 <= a <= b <= INT_LIMIT), no leading zeros. */
static void uint_range(json_buf *b, double a, double hi) {
    char xs[24], ys[24];
    int la = snprintf(xs, sizeof xs, "%.0f", a), lb = snprintf(ys, sizeof ys, "%.0f", hi);
    json_buf_str(b, " (");
    for (int len = la; len <= lb; len++) {
        double from = len == 1 ? 0 : pow(10, len - 1), to = pow(10, len) - 1;
        if (from < a) from = a;
        if (to > hi) to = hi;
        snprintf(xs, sizeof xs, "%.0f", from);
        snprintf(ys, sizeof ys, "%.0f", to);
        if (len > la) json_buf_str(b, " |");
        same_len(b, xs, ys, len);
    }
    json_buf_str(b, " )");
}

/* The integers lo..hi exactly (bounds clamped to 15 digits). */
static void int_range(json_buf *b, double lo, double hi) {
    if (lo < -INT_LIMIT) lo = -INT_LIMIT;
    if (hi > INT_LIMIT) hi = INT_LIMIT;
    json_buf_str(b, "(");
    bool any = false;
    if (hi >= 0) {
        uint_range(b, lo > 0 ? lo : 0, hi);
        any = true;
    }
    if (lo < 0) {
        if (any) json_buf_str(b, " |");
        json_buf_str(b, " \"-\"");
        uint_range(b, hi < 0 ? -hi : 1, -lo);
    }
    json_buf_str(b, " )");
}

/* An integer rule for the bounds given (either may be absent): exact. */
static bool emit_integer(sc *c, json_buf *b, const json_node *min, const json_node *max,
                         const json_node *xmin, const json_node *xmax) {
    double lo = -INFINITY, hi = INFINITY;
    if (min && min->type == JSON_NUM) lo = ceil(min->num);
    if (xmin && xmin->type == JSON_NUM) lo = fmax(lo, floor(xmin->num) + 1);
    if (max && max->type == JSON_NUM) hi = floor(max->num);
    if (xmax && xmax->type == JSON_NUM) hi = fmin(hi, ceil(xmax->num) - 1);
    if (lo > INT_LIMIT || hi < -INT_LIMIT || hi < lo) {
        fail_s(c, "%s", "integer bounds that no 15-digit integer meets");
        return false;
    }
    if (lo <= -INT_LIMIT && hi >= INT_LIMIT)
        json_buf_str(b, "( \"-\"? ( \"0\" | [1-9] [0-9]{0,14} ) )");
    else if (lo == 0 && hi >= INT_LIMIT)
        json_buf_str(b, "( \"0\" | [1-9] [0-9]{0,14} )");
    else
        int_range(b, lo, hi);
    return true;
}

/* A regular expression (a subset: literals, escapes \d \w \s and escaped
 * punctuation, classes, ., groups, |, ? * + {m,n}; anchored at both ends)
 * as GBNF whose characters stay valid inside a JSON string. */
static bool emit_pattern(sc *c, json_buf *b, const char *p) {
    size_t n = strlen(p), i = 0;
    if (n && p[0] == '^') i++;
    if (n > i && p[n - 1] == '$' && (n < 2 || p[n - 2] != '\\')) n--;
    int depth = 0;
    json_buf_str(b, "(");
    while (i < n) {
        char ch = p[i];
        if (ch == '(') {
            if (i + 2 < n && p[i + 1] == '?' && p[i + 2] == ':') i += 2;
            depth++;
            json_buf_str(b, " (");
            i++;
        } else if (ch == ')') {
            if (--depth < 0) return fail_s(c, "pattern '%s': unbalanced ')'", p), false;
            json_buf_str(b, " )");
            i++;
        } else if (ch == '|' || ch == '?' || ch == '*' || ch == '+') {
            sb_printf(b, " %c", ch);
            i++;
        } else if (ch == '{') {
            size_t e = i + 1;
            while (e < n && strchr("0123456789,", p[e]) && p[e]) e++;
            if (e >= n || p[e] != '}') return fail_s(c, "pattern '%s': bad {m,n}", p), false;
            json_buf_add(b, p + i, e - i + 1);
            i = e + 1;
        } else if (ch == '.') {
            json_buf_str(b, " [^\"\\\\\\x00-\\x1f]");
            i++;
        } else if (ch == '[') {
            size_t e = i + 1;
            if (e < n && p[e] == '^') e++;
            if (e < n && p[e] == ']') e++;
            while (e < n && p[e] != ']') e += p[e] == '\\' ? 2 : 1;
            if (e >= n) return fail_s(c, "pattern '%s': unterminated class", p), false;
            bool neg = p[i + 1] == '^';
            json_buf_str(b, " [");
            if (neg) json_buf_str(b, "^\"\\\\\\x00-\\x1f");
            for (size_t k = i + 1 + (neg ? 1 : 0); k < e; k++) {
                if (p[k] == '\\' && k + 1 < e) {
                    char x = p[++k];
                    if (x == 'd')
                        json_buf_str(b, "0-9");
                    else if (x == 'w')
                        json_buf_str(b, "a-zA-Z0-9_");
                    else if (x == 's')
                        json_buf_str(b, " \\t");
                    else if (x == '"' || x == '\\')
                        return fail_s(c, "pattern '%s': quote or backslash", p), false;
                    else
                        sb_printf(b, "\\x%02x", (unsigned char)x);
                } else if (p[k] == '"' || (unsigned char)p[k] < 0x20) {
                    return fail_s(c, "pattern '%s': a quote or control character", p), false;
                } else {
                    json_buf_add(b, p + k, 1);
                }
            }
            json_buf_str(b, "]");
            i = e + 1;
        } else if (ch == '\\' && i + 1 < n) {
            char x = p[i + 1];
            if (x == 'd')
                json_buf_str(b, " [0-9]");
            else if (x == 'w')
                json_buf_str(b, " [a-zA-Z0-9_]");
            else if (x == 's')
                json_buf_str(b, " [ \\t]");
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
            json_buf_str(b, " \"");
            size_t len = 1;
            while (i + len < n && ((unsigned char)p[i + len] & 0xC0) == 0x80) len++;
            json_buf_add(b, p + i, len);
            json_buf_str(b, "\"");
            i += len;
        }
    }
    if (depth != 0) return fail_s(c, "pattern '%s': unbalanced '('", p), false;
    json_buf_str(b, " )");
    return true;
}

/* A $ref: "#" or "#/$defs/NAME" or "#/definitions/NAME". */
static int compile_ref(sc *c, const char *ref, int depth) {
    for (size_t k = 0; k < c->n_defs; k++)
        if (!strcmp(c->defs[k].name, ref)) return c->defs[k].rule;
    const json_node *target = NULL;
    if (!strcmp(ref, "#")) {
        target = c->root;
    } else if (!strncmp(ref, "#/$defs/", 8)) {
        target = json_get(json_get(c->root, "$defs"), ref + 8);
    } else if (!strncmp(ref, "#/definitions/", 14)) {
        target = json_get(json_get(c->root, "definitions"), ref + 14);
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
static int compile_object(sc *c, const json_node *s, int depth) {
    const json_node *props = json_get(s, "properties"), *req = json_get(s, "required");
    const json_node *extra = json_get(s, "additionalProperties");
    if (req && req->type != JSON_ARR) return fail_s(c, "%s must be an array", "required");
    size_t np = props && props->type == JSON_OBJ ? props->n : 0;
    if (req)
        for (size_t k = 0; k < req->n; k++) {
            if (req->kids[k]->type != JSON_STR)
                return fail_s(c, "%s must hold strings", "required");
            if (!json_get(props, req->kids[k]->str))
                return fail_s(c, "required property '%s' is not in properties", req->kids[k]->str);
        }
    if (np == 0) {
        /* Any members, or members of the additionalProperties schema. */
        int v = -1;
        if (extra && extra->type == JSON_OBJ) v = compile(c, extra, depth + 1);
        if (c->failed) return -1;
        int id = rule_open(c);
        if (v < 0)
            json_buf_str(&c->out, "object\n");
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
        json_buf kv = {0};
        json_buf_str(&kv, "\"\\\"");
        json_node key = {
            .type = JSON_STR, .str = props->keys[k], .str_len = strlen(props->keys[k])};
        json_buf js = {0};
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
            json_buf_str(&c->out, kvs);
            if (bn >= 0) sb_printf(&c->out, " r%d", bn);
            sb_printf(&c->out, "\nr%d ::= \",\" ws ", b);
            json_buf_str(&c->out, kvs);
            if (bn >= 0) sb_printf(&c->out, " r%d", bn);
            json_buf_str(&c->out, "\n");
        } else {
            sb_printf(&c->out, "r%d ::= ", a);
            json_buf_str(&c->out, kvs);
            if (bn >= 0)
                sb_printf(&c->out, " r%d | r%d\n", bn, an);
            else
                json_buf_str(&c->out, " | \"\"\n");
            sb_printf(&c->out, "r%d ::= \",\" ws ", b);
            json_buf_str(&c->out, kvs);
            if (bn >= 0)
                sb_printf(&c->out, " r%d | r%d\n", bn, bn);
            else
                json_buf_str(&c->out, " | \"\"\n");
        }
        free(kv.s);
    }
    free(val);
    int id = base + (int)(2 * np);
    sb_printf(&c->out, "r%d ::= \"{\" ws r%d \"}\"\n", id, base);
    return id;
}

static int compile_type(sc *c, const json_node *s, const char *type, int depth) {
    if (!strcmp(type, "object")) return compile_object(c, s, depth);
    if (!strcmp(type, "array")) {
        const json_node *items = json_get(s, "items"), *mn = json_get(s, "minItems"),
                        *mx = json_get(s, "maxItems");
        int it = -1;
        if (items && items->type == JSON_OBJ) it = compile(c, items, depth + 1);
        if (c->failed) return -1;
        double lo = mn && mn->type == JSON_NUM ? mn->num : 0,
               hi = mx && mx->type == JSON_NUM ? mx->num : -1;
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
            json_buf_str(&c->out, "\"[\" ws \"]\"\n");
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
        const json_node *pat = json_get(s, "pattern"), *mn = json_get(s, "minLength"),
                        *mx = json_get(s, "maxLength");
        int id = rule_open(c);
        if (pat && pat->type == JSON_STR) {
            json_buf_str(&c->out, "\"\\\"\" ");
            if (!emit_pattern(c, &c->out, pat->str)) return -1;
            json_buf_str(&c->out, " \"\\\"\"\n");
            return id;
        }
        double lo = mn && mn->type == JSON_NUM ? mn->num : 0,
               hi = mx && mx->type == JSON_NUM ? mx->num : -1;
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
        if (!emit_integer(c, &c->out, json_get(s, "minimum"), json_get(s, "maximum"),
                          json_get(s, "exclusiveMinimum"), json_get(s, "exclusiveMaximum")))
            return -1;
        json_buf_str(&c->out, "\n");
        return id;
    }
    if (!strcmp(type, "number")) {
        int id = rule_open(c);
        const json_node *mn = json_get(s, "minimum"), *mx = json_get(s, "maximum");
        if ((mn && mn->type == JSON_NUM) || (mx && mx->type == JSON_NUM)) {
            /* Integers within the bounds, or a decimal whose integer part
             * keeps it within them whatever its fraction: exact for
             * integral bounds; a value between a fractional bound and the
             * nearest integer inside is never made. */
            double lo = mn && mn->type == JSON_NUM ? ceil(mn->num) : -INT_LIMIT;
            double hi = mx && mx->type == JSON_NUM ? floor(mx->num) : INT_LIMIT;
            if (!emit_integer(c, &c->out, &(json_node){.type = JSON_NUM, .num = lo},
                              &(json_node){.type = JSON_NUM, .num = hi}, NULL, NULL))
                return -1;
            if (lo < -INT_LIMIT) lo = -INT_LIMIT;
            if (hi > INT_LIMIT) hi = INT_LIMIT;
            double p0 = lo > 0 ? lo : 0; /* i.f with p0 <= i <= hi - 1 */
            if (hi - 1 >= p0) {
                json_buf_str(&c->out, " |");
                uint_range(&c->out, p0, hi - 1);
                json_buf_str(&c->out, " \".\" [0-9]{1,6}");
            }
            double n0 = hi < 0 ? -hi : 0; /* -i.f with n0 <= i <= -lo - 1 */
            if (lo <= -1 && -lo - 1 >= n0) {
                json_buf_str(&c->out, " | \"-\"");
                uint_range(&c->out, n0, -lo - 1);
                json_buf_str(&c->out, " \".\" [0-9]{1,6}");
            }
            json_buf_str(&c->out, "\n");
        } else {
            json_buf_str(&c->out, "number\n");
        }
        return id;
    }
    if (!strcmp(type, "boolean")) {
        int id = rule_open(c);
        json_buf_str(&c->out, "( \"true\" | \"false\" )\n");
        return id;
    }
    if (!strcmp(type, "null")) {
        int id = rule_open(c);
        json_buf_str(&c->out, "\"null\"\n");
        return id;
    }
    return fail_s(c, "unknown type '%s'", type);
}

static int compile_alts(sc *c, const json_node *list, const char *what, int depth) {
    if (list->type != JSON_ARR || list->n == 0)
        return fail_s(c, "%s must be a non-empty array", what);
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
    json_buf_str(&c->out, "\n");
    free(ids);
    return id;
}

static int compile(sc *c, const json_node *s, int depth) {
    if (c->failed) return -1;
    if (depth > SCHEMA_MAX_DEPTH) return fail_s(c, "%s", "schema nested too deep");
    if (c->out.full) return fail_s(c, "%s", "schema too large (its grammar passes 1 MiB)");
    if (s->type == JSON_BOOL) {
        if (!s->b) return fail_s(c, "%s", "the schema 'false' matches nothing");
        int id = rule_open(c);
        json_buf_str(&c->out, "value\n");
        return id;
    }
    if (s->type != JSON_OBJ) return fail_s(c, "%s", "a schema must be an object or a boolean");
    const json_node *x;
    if ((x = json_get(s, "$ref"))) {
        if (x->type != JSON_STR) return fail_s(c, "%s must be a string", "$ref");
        return compile_ref(c, x->str, depth);
    }
    if ((x = json_get(s, "const"))) {
        int id = rule_open(c);
        json_buf js = {0};
        json_write(&js, x);
        json_buf_str(&c->out, "\"");
        sb_lit(&c->out, js.s ? js.s : "", js.n);
        json_buf_str(&c->out, "\"\n");
        free(js.s);
        return id;
    }
    if ((x = json_get(s, "enum"))) {
        if (x->type != JSON_ARR || x->n == 0)
            return fail_s(c, "%s must be a non-empty array", "enum");
        int id = rule_open(c);
        for (size_t k = 0; k < x->n; k++) {
            json_buf js = {0};
            json_write(&js, x->kids[k]);
            json_buf_add(&c->out, k ? " | \"" : "\"", k ? 4 : 1);
            sb_lit(&c->out, js.s ? js.s : "", js.n);
            json_buf_str(&c->out, "\"");
            free(js.s);
        }
        json_buf_str(&c->out, "\n");
        return id;
    }
    if ((x = json_get(s, "anyOf"))) return compile_alts(c, x, "anyOf", depth);
    if ((x = json_get(s, "oneOf"))) return compile_alts(c, x, "oneOf", depth);
    if ((x = json_get(s, "allOf"))) {
        if (x->type == JSON_ARR && x->n == 1) return compile(c, x->kids[0], depth + 1);
        return fail_s(c, "%s is supported with one schema only", "allOf");
    }
    const json_node *type = json_get(s, "type");
    if (!type) {
        if (json_get(s, "properties")) return compile_type(c, s, "object", depth);
        if (json_get(s, "items")) return compile_type(c, s, "array", depth);
        int id = rule_open(c);
        json_buf_str(&c->out, "value\n");
        return id;
    }
    if (type->type == JSON_STR) return compile_type(c, s, type->str, depth);
    if (type->type == JSON_ARR && type->n > 0) {
        int *ids = malloc(type->n * sizeof(int));
        if (!ids) return fail_s(c, "%s", "out of memory");
        for (size_t k = 0; k < type->n && !c->failed; k++) {
            if (type->kids[k]->type != JSON_STR) {
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
        json_buf_str(&c->out, "\n");
        free(ids);
        return id;
    }
    return fail_s(c, "%s must be a string or an array of strings", "type");
}

/* Reads one schema: valid UTF-8 and one JSON value. */
static json_node *read_schema(const char *schema, size_t len, cellm_error *err) {
    for (size_t i = 0; i < len;) {
        size_t at = i;
        if (grammar_utf8_next(schema, len, &i) < 0) {
            err_set(err, CELLM_ERR_FORMAT, "json schema: invalid UTF-8 at byte %zu", at);
            return NULL;
        }
    }
    size_t end = 0;
    json_node *root = json_parse(schema, len, &end, SCHEMA_MAX_DEPTH, "json schema", err);
    if (root && end != len) {
        json_free(root);
        err_set(err, CELLM_ERR_FORMAT, "json schema: text after the schema at byte %zu", end);
        return NULL;
    }
    return root;
}

cellm_status schema_to_gbnf_rules(const char *const *schemas, const size_t *lens, int n, int *tops,
                                  char **out, size_t *out_len, cellm_error *err) {
    *out = NULL;
    *out_len = 0;
    sc c = {.err = err, .out = {.max = SCHEMA_MAX_OUT}};
    for (int k = 0; k < n && !c.failed; k++) {
        json_node *root = read_schema(schemas[k], lens[k], err);
        if (!root) {
            free(c.out.s);
            return CELLM_ERR_FORMAT;
        }
        /* $refs resolve within each schema. */
        c.root = root;
        c.n_defs = 0;
        tops[k] = compile(&c, root, 0);
        if (tops[k] < 0) c.failed = true;
        json_free(root);
    }
    if (!c.failed)
        json_buf_add(&c.out, grammar_json_object_gbnf + strlen("root ::= object\n"),
                     strlen(grammar_json_object_gbnf) - strlen("root ::= object\n"));
    if (!c.failed && c.out.full) fail_s(&c, "%s", "schema too large (its grammar passes 1 MiB)");
    free(c.defs);
    if (c.failed) {
        free(c.out.s);
        return CELLM_ERR_FORMAT;
    }
    *out = c.out.s;
    *out_len = c.out.n;
    return CELLM_OK;
}

cellm_status schema_to_gbnf(const char *schema, size_t len, char **out, size_t *out_len,
                            cellm_error *err) {
    int top = -1;
    char *rules = NULL;
    size_t n = 0;
    cellm_status st = schema_to_gbnf_rules(&schema, &len, 1, &top, &rules, &n, err);
    if (st) return st;
    json_buf b = {0};
    char head[32];
    snprintf(head, sizeof head, "root ::= r%d\n", top);
    json_buf_str(&b, head);
    json_buf_add(&b, rules, n);
    free(rules);
    if (b.full) {
        free(b.s);
        return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    }
    *out = b.s;
    *out_len = b.n;
    return CELLM_OK;
}

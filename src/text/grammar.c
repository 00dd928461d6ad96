/*
 * grammar.c — the GBNF parser and compiler (text to a flat program), the
 * checks that refuse grammars no run could use, and the program's layout.
 * grammar_run.c runs the program against text and vocabularies.
 *
 * The program: every rule is a list of alternatives; an alternative is a
 * sequence of elements ending in G_END: G_CHAR (a count of code-point
 * ranges, then the sorted, disjoint ranges) or G_REF (a rule id). Groups
 * and repetitions become rules of their own: x* is R ::= x R | "",
 * x? is R ::= x | "", x{m,n} is m copies of x and a chain of n - m nested
 * optionals.
 */
#include "text/grammar_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ivec {
    int32_t *v;
    size_t n, cap;
} ivec;

typedef struct prule {
    const char *name; /* into the text; NULL for a rule made from a group */
    size_t name_len;
    int32_t origin; /* the named rule a made one came from */
    bool defined;
    ivec *alts;
    size_t n_alts, cap_alts;
} prule;

typedef struct gparser {
    const char *s;
    size_t n, i;
    prule *rules;
    int32_t n_rules, cap_rules;
    size_t total; /* elements so far, against GRAMMAR_MAX_CODE */
    int nest;
    cellm_error *err;
    bool failed;
} gparser;

static bool grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static void where(const gparser *p, size_t at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t k = 0; k < at && k < p->n; k++) {
        if (p->s[k] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

static bool perr(gparser *p, const char *what) {
    if (p->failed) return false;
    int line, col;
    where(p, p->i, &line, &col);
    err_set(p->err, CELLM_ERR_FORMAT, "grammar: %s at line %d, column %d", what, line, col);
    p->failed = true;
    return false;
}

static bool push(gparser *p, ivec *a, int32_t x) {
    if (++p->total > GRAMMAR_MAX_CODE) return perr(p, "grammar too large");
    if (!grow((void **)&a->v, &a->cap, a->n + 1, sizeof(int32_t))) return perr(p, "out of memory");
    a->v[a->n++] = x;
    return true;
}

static bool push_all(gparser *p, ivec *a, const int32_t *x, size_t n) {
    for (size_t k = 0; k < n; k++)
        if (!push(p, a, x[k])) return false;
    return true;
}

static int32_t rule_new(gparser *p, const char *name, size_t len, int32_t origin) {
    if (p->n_rules >= GRAMMAR_MAX_RULES) {
        perr(p, "too many rules");
        return -1;
    }
    size_t cap = (size_t)p->cap_rules;
    if (!grow((void **)&p->rules, &cap, (size_t)p->n_rules + 1, sizeof(prule))) {
        perr(p, "out of memory");
        return -1;
    }
    p->cap_rules = (int32_t)cap;
    prule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof(*r));
    r->name = name;
    r->name_len = len;
    r->origin = name ? p->n_rules : origin;
    return p->n_rules++;
}

static int32_t rule_find(gparser *p, const char *name, size_t len) {
    for (int32_t k = 0; k < p->n_rules; k++) {
        const prule *r = &p->rules[k];
        if (r->name && r->name_len == len && memcmp(r->name, name, len) == 0) return k;
    }
    return rule_new(p, name, len, -1);
}

static ivec *alt_new(gparser *p, int32_t rule) {
    prule *r = &p->rules[rule];
    if (!grow((void **)&r->alts, &r->cap_alts, r->n_alts + 1, sizeof(ivec))) {
        perr(p, "out of memory");
        return NULL;
    }
    ivec *a = &r->alts[r->n_alts++];
    memset(a, 0, sizeof(*a));
    return a;
}

static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
}

/* Skips blanks and comments; newlines too when `newlines`. */
static void skip_space(gparser *p, bool newlines) {
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\r') {
            p->i++;
        } else if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else if (c == '\n' && newlines) {
            p->i++;
        } else {
            break;
        }
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 character at s[*i] (n bytes in all); -1 if invalid. */
int32_t grammar_utf8_next(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned char c = u[*i];
    int len = c < 0x80             ? 1
              : (c & 0xE0) == 0xC0 ? 2
              : (c & 0xF0) == 0xE0 ? 3
              : (c & 0xF8) == 0xF0 ? 4
                                   : 0;
    if (!len || *i + (size_t)len > n) return -1;
    int32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; k++) {
        if ((u[*i + (size_t)k] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (u[*i + (size_t)k] & 0x3F);
    }
    *i += (size_t)len;
    return cp;
}

/* One character of a literal or a class: an escape or a UTF-8 character. */
static int32_t parse_char(gparser *p) {
    if (p->i >= p->n) return perr(p, "unexpected end of grammar"), -1;
    if (p->s[p->i] != '\\') {
        int32_t cp = grammar_utf8_next(p->s, p->n, &p->i);
        if (cp < 0) perr(p, "invalid UTF-8");
        return cp;
    }
    p->i++;
    if (p->i >= p->n) return perr(p, "unexpected end of grammar"), -1;
    char c = p->s[p->i++];
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        int32_t cp = 0;
        for (int k = 0; k < digits; k++) {
            int h = p->i < p->n ? hexval(p->s[p->i]) : -1;
            if (h < 0) return perr(p, "bad hex escape"), -1;
            cp = cp * 16 + h;
            p->i++;
            if (cp > 0x10FFFF) return perr(p, "code point out of range"), -1;
        }
        return cp;
    }
    switch (c) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '0': return 0;
    case '\\':
    case '"':
    case '\'':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/': return c;
    default: return perr(p, "unknown escape"), -1;
    }
}

static int cmp_range(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : 0;
}

/* Appends a G_CHAR element for the ranges r[0..2n) (sorted and merged
 * here; complemented over all code points when `neg`). */
static bool emit_class(gparser *p, ivec *a, int32_t *r, size_t n, bool neg) {
    qsort(r, n, 2 * sizeof(int32_t), cmp_range);
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        if (m && r[2 * k] <= r[2 * (m - 1) + 1] + 1) {
            if (r[2 * k + 1] > r[2 * (m - 1) + 1]) r[2 * (m - 1) + 1] = r[2 * k + 1];
        } else {
            r[2 * m] = r[2 * k];
            r[2 * m + 1] = r[2 * k + 1];
            m++;
        }
    }
    if (!push(p, a, G_CHAR)) return false;
    if (!neg) {
        if (!push(p, a, (int32_t)m)) return false;
        return push_all(p, a, r, 2 * m);
    }
    /* The gaps between the ranges. */
    int32_t gaps[2 * 1025];
    size_t g = 0;
    int32_t next = 0;
    for (size_t k = 0; k < m; k++) {
        if (r[2 * k] > next) {
            gaps[2 * g] = next;
            gaps[2 * g + 1] = r[2 * k] - 1;
            g++;
        }
        next = r[2 * k + 1] + 1;
    }
    if (next <= 0x10FFFF) {
        gaps[2 * g] = next;
        gaps[2 * g + 1] = 0x10FFFF;
        g++;
    }
    if (!push(p, a, (int32_t)g)) return false;
    return push_all(p, a, gaps, 2 * g);
}

static bool parse_class(gparser *p, ivec *a) {
    bool neg = false;
    if (p->i < p->n && p->s[p->i] == '^') {
        neg = true;
        p->i++;
    }
    int32_t r[2 * 1024];
    size_t n = 0;
    while (p->i < p->n && p->s[p->i] != ']') {
        if (n >= 1024) return perr(p, "too many ranges in a character class");
        int32_t lo = parse_char(p), hi = lo;
        if (lo < 0) return false;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            hi = parse_char(p);
            if (hi < 0) return false;
            if (hi < lo) return perr(p, "character range out of order");
        }
        r[2 * n] = lo;
        r[2 * n + 1] = hi;
        n++;
    }
    if (p->i >= p->n) return perr(p, "unterminated character class");
    p->i++;
    return emit_class(p, a, r, n, neg);
}

static bool parse_alts(gparser *p, int32_t rule, bool nested);

/* A rule R ::= S R | "" (with_self) or R ::= S | "", for repetitions. */
static int32_t rule_repeat(gparser *p, int32_t origin, const int32_t *sub, size_t n, int32_t tail) {
    int32_t r = rule_new(p, NULL, 0, origin);
    if (r < 0) return -1;
    ivec *a = alt_new(p, r);
    if (!a || !push_all(p, a, sub, n)) return -1;
    if (tail >= 0 && (!push(p, a, G_REF) || !push(p, a, tail))) return -1;
    if (tail == -2 && (!push(p, a, G_REF) || !push(p, a, r))) return -1;
    if (!alt_new(p, r)) return -1;
    return r;
}

static bool parse_int(gparser *p, int32_t *out) {
    if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9') return perr(p, "expected a number");
    int64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = v * 10 + (p->s[p->i++] - '0');
        if (v > GRAMMAR_MAX_REPEAT) return perr(p, "repetition count too large");
    }
    *out = (int32_t)v;
    return true;
}

/* A postfix operator on a[start ..]: rewrites those elements. */
static bool parse_postfix(gparser *p, int32_t rule, ivec *a, size_t start) {
    char op = p->s[p->i++];
    int32_t lo = 0, hi = -1; /* -1: no upper bound */
    if (op == '*') {
        lo = 0;
    } else if (op == '+') {
        lo = 1;
    } else if (op == '?') {
        hi = 1;
    } else { /* '{' */
        skip_space(p, true);
        if (!parse_int(p, &lo)) return false;
        skip_space(p, true);
        hi = lo;
        if (p->i < p->n && p->s[p->i] == ',') {
            p->i++;
            skip_space(p, true);
            hi = -1;
            if (p->i < p->n && p->s[p->i] != '}' && !parse_int(p, &hi)) return false;
            skip_space(p, true);
        }
        if (p->i >= p->n || p->s[p->i] != '}') return perr(p, "expected '}'");
        p->i++;
        if (hi >= 0 && hi < lo) return perr(p, "repetition {m,n} with n < m");
    }
    size_t n = a->n - start;
    int32_t *sub = malloc(n * sizeof(int32_t) + 1);
    if (!sub) return perr(p, "out of memory");
    if (n > 0) memcpy(sub, a->v + start, n * sizeof(int32_t));
    a->n = start;
    p->total -= n;
    int32_t origin = p->rules[rule].origin;
    bool ok = true;
    for (int32_t k = 0; k < lo && ok; k++) ok = push_all(p, a, sub, n);
    if (ok && hi < 0) {
        int32_t r = rule_repeat(p, origin, sub, n, -2);
        ok = r >= 0 && push(p, a, G_REF) && push(p, a, r);
    } else if (ok && hi > lo) {
        int32_t prev = -1;
        for (int32_t k = lo; k < hi && ok; k++) {
            prev = rule_repeat(p, origin, sub, n, prev);
            ok = prev >= 0;
        }
        ok = ok && push(p, a, G_REF) && push(p, a, prev);
    }
    free(sub);
    return ok;
}

/* A sequence of items into alternative `a` of `rule`. */
static bool parse_seq(gparser *p, int32_t rule, size_t alt_index, bool nested) {
    long last = -1; /* where the last item starts in the alternative */
    for (;;) {
        skip_space(p, nested);
        if (p->i >= p->n) return true;
        ivec *a = &p->rules[rule].alts[alt_index]; /* the rules array may move */
        char c = p->s[p->i];
        size_t start = a->n;
        if (c == '"') {
            p->i++;
            while (p->i < p->n && p->s[p->i] != '"') {
                int32_t cp = parse_char(p);
                a = &p->rules[rule].alts[alt_index];
                if (cp < 0 || !push(p, a, G_CHAR) || !push(p, a, 1) || !push(p, a, cp) ||
                    !push(p, a, cp))
                    return false;
            }
            if (p->i >= p->n) return perr(p, "unterminated string literal");
            p->i++;
        } else if (c == '[') {
            p->i++;
            if (!parse_class(p, a)) return false;
        } else if (c == '.') {
            p->i++;
            int32_t all[2] = {0, 0x10FFFF};
            if (!emit_class(p, a, all, 1, false)) return false;
        } else if (c == '(') {
            p->i++;
            if (++p->nest > 200) return perr(p, "groups nested too deep");
            int32_t g = rule_new(p, NULL, 0, p->rules[rule].origin);
            if (g < 0 || !parse_alts(p, g, true)) return false;
            p->nest--;
            skip_space(p, true);
            if (p->i >= p->n || p->s[p->i] != ')') return perr(p, "expected ')'");
            p->i++;
            a = &p->rules[rule].alts[alt_index];
            if (!push(p, a, G_REF) || !push(p, a, g)) return false;
        } else if (is_name_char(c)) {
            size_t b = p->i;
            while (p->i < p->n && is_name_char(p->s[p->i])) p->i++;
            int32_t r = rule_find(p, p->s + b, p->i - b);
            a = &p->rules[rule].alts[alt_index];
            if (r < 0 || !push(p, a, G_REF) || !push(p, a, r)) return false;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0) return perr(p, "nothing to repeat");
            if (!parse_postfix(p, rule, a, (size_t)last)) return false;
            continue; /* the item still starts at `last` */
        } else {
            return true; /* '|', ')', a newline or something the caller judges */
        }
        last = (long)start;
    }
}

static bool parse_alts(gparser *p, int32_t rule, bool nested) {
    for (;;) {
        if (!alt_new(p, rule)) return false;
        if (!parse_seq(p, rule, p->rules[rule].n_alts - 1, nested)) return false;
        if (!nested) {
            /* A rule may go on with `|` on the next line. */
            size_t save = p->i;
            skip_space(p, true);
            if (p->i < p->n && p->s[p->i] == '|') {
                p->i++;
                continue;
            }
            p->i = save;
            return true;
        }
        skip_space(p, true);
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        return true;
    }
}

static bool parse_rule(gparser *p) {
    size_t b = p->i;
    while (p->i < p->n && is_name_char(p->s[p->i])) p->i++;
    if (p->i == b) return perr(p, "expected a rule name");
    int32_t r = rule_find(p, p->s + b, p->i - b);
    if (r < 0) return false;
    if (p->rules[r].defined) return perr(p, "rule defined twice");
    p->rules[r].defined = true;
    p->rules[r].origin = r;
    skip_space(p, false);
    if (p->i + 3 > p->n || memcmp(p->s + p->i, "::=", 3) != 0) return perr(p, "expected '::='");
    p->i += 3;
    if (!parse_alts(p, r, false)) return false;
    skip_space(p, false);
    if (p->i < p->n && p->s[p->i] != '\n') return perr(p, "unexpected character");
    return true;
}

static void parser_free(gparser *p) {
    for (int32_t k = 0; k < p->n_rules; k++) {
        for (size_t j = 0; j < p->rules[k].n_alts; j++) free(p->rules[k].alts[j].v);
        free(p->rules[k].alts);
    }
    free(p->rules);
}

void grammar_free(grammar *g) {
    if (!g) return;
    free(g->code);
    free(g->alt_start);
    free(g->rule_alt);
    free(g);
}

/* The name of rule r for messages (a made rule answers for its origin). */
static void rule_name(const gparser *p, int32_t r, char *out, size_t cap) {
    const prule *x = &p->rules[p->rules[r].origin >= 0 ? p->rules[r].origin : r];
    int len = x->name_len > 64 ? 64 : (int)x->name_len;
    snprintf(out, cap, "%.*s", len, x->name ? x->name : "?");
}

static cellm_status refuse(gparser *p, const char *fmt, int32_t r) {
    char name[80];
    rule_name(p, r, name, sizeof(name));
    char msg[200];
    snprintf(msg, sizeof(msg), fmt, name);
    return err_set(p->err, CELLM_ERR_FORMAT, "grammar: %s", msg);
}

/* Nullable and productive rules, by fixpoint; then: every rule reachable
 * from root is productive and none is left-recursive. */
static cellm_status check(gparser *p, grammar *g) {
    int32_t nr = g->n_rules;
    bool *nullable = calloc((size_t)nr, 1), *productive = calloc((size_t)nr, 1);
    uint8_t *color = calloc((size_t)nr, 1);
    int32_t *stk = malloc(sizeof(int32_t) * 2 * ((size_t)nr + 1));
    int32_t *cursor = malloc(sizeof(int32_t) * ((size_t)nr + 1));
    cellm_status st = CELLM_OK;
    if (!nullable || !productive || !color || !stk || !cursor) {
        st = err_set(p->err, CELLM_ERR_NO_MEMORY, "grammar: out of memory");
        goto out;
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < nr; r++) {
            for (int32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
                bool nul = true, prod = true;
                for (int32_t pos = g->alt_start[a]; g->code[pos] != G_END;
                     pos = grammar_next(g, pos)) {
                    if (g->code[pos] == G_CHAR) {
                        nul = false;
                        if (g->code[pos + 1] == 0) prod = false;
                    } else {
                        int32_t s = g->code[pos + 1];
                        if (!nullable[s]) nul = false;
                        if (!productive[s]) prod = false;
                    }
                }
                if (nul && !nullable[r]) nullable[r] = changed = true;
                if (prod && !productive[r]) productive[r] = changed = true;
            }
        }
    }
    /* Depth-first from root over "may start with" edges (left recursion),
     * then over all edges (reachability), iteratively: per depth the rule,
     * its alternative and the element whose edge was taken last; color 1
     * on the path, 2 done. */
    int32_t *cur_alt = stk + nr + 1;
    for (int pass = 0; pass < 2 && st == CELLM_OK; pass++) {
        memset(color, 0, (size_t)nr);
        int32_t top = 0;
        stk[top] = g->root;
        cur_alt[top] = g->rule_alt[g->root];
        cursor[top++] = -1;
        color[g->root] = 1;
        while (top > 0 && st == CELLM_OK) {
            int32_t r = stk[top - 1];
            if (pass == 1 && !productive[r]) {
                st = refuse(p, "rule '%s' can never finish (it matches no text)", r);
                break;
            }
            int32_t a = cur_alt[top - 1], end = g->rule_alt[r + 1], from = cursor[top - 1];
            int32_t pos = a < end ? g->alt_start[a] : -1;
            if (from >= 0) {
                if (pass == 0 && !nullable[g->code[from + 1]])
                    pos = ++a < end ? g->alt_start[a] : -1;
                else
                    pos = grammar_next(g, from);
            }
            int32_t next = -1;
            while (a < end && next < 0) {
                for (; g->code[pos] != G_END; pos = grammar_next(g, pos)) {
                    if (g->code[pos] == G_REF) {
                        next = pos;
                        break;
                    }
                    if (pass == 0) break;
                }
                if (next < 0 && ++a < end) pos = g->alt_start[a];
            }
            if (next < 0) {
                color[r] = 2;
                top--;
                continue;
            }
            cur_alt[top - 1] = a;
            cursor[top - 1] = next;
            int32_t s = g->code[next + 1];
            if (color[s] == 1 && pass == 0) {
                st = refuse(p, "rule '%s' is left-recursive", s);
                break;
            }
            if (color[s] == 0) {
                stk[top] = s;
                cur_alt[top] = g->rule_alt[s];
                cursor[top] = -1;
                color[s] = 1;
                top++;
            }
        }
    }
out:
    free(nullable);
    free(productive);
    free(color);
    free(stk);
    free(cursor);
    return st;
}

int32_t grammar_next(const grammar *g, int32_t pos) {
    return g->code[pos] == G_CHAR ? pos + 2 + 2 * g->code[pos + 1] : pos + 2;
}

cellm_status grammar_parse(const char *text, size_t len, grammar **out, cellm_error *err) {
    *out = NULL;
    if (!text) return err_set(err, CELLM_ERR_INVALID_ARG, "grammar: no text");
    gparser p = {.s = text, .n = len, .err = err};
    cellm_status st = CELLM_OK;
    for (;;) {
        skip_space(&p, true);
        if (p.i >= p.n) break;
        if (!parse_rule(&p)) break;
    }
    grammar *g = NULL;
    if (p.failed) {
        st = err ? err->code : CELLM_ERR_FORMAT;
        goto fail;
    }
    int32_t root = -1;
    for (int32_t k = 0; k < p.n_rules; k++) {
        const prule *r = &p.rules[k];
        if (r->name && !r->defined) {
            st = refuse(&p, "rule '%s' is used but not defined", k);
            goto fail;
        }
        if (r->name && r->name_len == 4 && memcmp(r->name, "root", 4) == 0) root = k;
    }
    if (root < 0) {
        st = err_set(err, CELLM_ERR_FORMAT, "grammar: no rule named 'root'");
        goto fail;
    }
    g = calloc(1, sizeof(*g));
    size_t n_alts = 0, n_code = 0;
    for (int32_t k = 0; k < p.n_rules; k++) {
        n_alts += p.rules[k].n_alts;
        for (size_t j = 0; j < p.rules[k].n_alts; j++) n_code += p.rules[k].alts[j].n + 1;
    }
    if (g) {
        g->code = malloc((n_code + 1) * sizeof(int32_t));
        g->alt_start = malloc((n_alts + 1) * sizeof(int32_t));
        g->rule_alt = malloc(((size_t)p.n_rules + 1) * sizeof(int32_t));
    }
    if (!g || !g->code || !g->alt_start || !g->rule_alt) {
        st = err_set(err, CELLM_ERR_NO_MEMORY, "grammar: out of memory");
        goto fail;
    }
    g->n_rules = p.n_rules;
    g->root = root;
    int32_t c = 0, na = 0;
    for (int32_t k = 0; k < p.n_rules; k++) {
        g->rule_alt[k] = na;
        for (size_t j = 0; j < p.rules[k].n_alts; j++) {
            g->alt_start[na++] = c;
            if (p.rules[k].alts[j].n > 0) /* an empty alternative has no buffer */
                memcpy(g->code + c, p.rules[k].alts[j].v, p.rules[k].alts[j].n * sizeof(int32_t));
            c += (int32_t)p.rules[k].alts[j].n;
            g->code[c++] = G_END;
        }
    }
    g->rule_alt[p.n_rules] = na;
    g->n_code = (size_t)c;
    st = check(&p, g);
    if (st != CELLM_OK) goto fail;
    parser_free(&p);
    *out = g;
    return CELLM_OK;
fail:
    grammar_free(g);
    parser_free(&p);
    return st;
}

/* JSON (RFC 8259) with whitespace bounded, so a model cannot pad forever;
 * nesting is bounded by the state's stack depth. */
const char grammar_json_object_gbnf[] =
    "root ::= object\n"
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* "
    ")? \"}\"\n"
    "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? "
    "[0-9]{1,3} )?\n"
    "ws ::= ( \" \" | \"\\n\" \" \"{0,8} )?\n";

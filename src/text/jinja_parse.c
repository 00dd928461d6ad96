/*
 * jinja_parse.c — builds the syntax tree from the tokens, with Jinja2's
 * grammar and operator precedence (lowest first): `x if c else y`, or, and,
 * not, comparisons and `in` (chained like Python's), + and -, ~, * / // %,
 * **, unary - and +, then a primary with its postfixes (.attr, [item or
 * slice], (call)), filters (| name(args)) and tests (is [not] name args).
 *
 * Node fields by kind:
 *   S_TEXT v; S_OUTPUT a; S_BODY args
 *   S_IF a (condition), args (then), body2 (else; an elif is an S_IF with
 *        neg set, alone in body2)
 *   S_FOR names (targets), a (iterable), b (filter or NULL), args, body2 (else)
 *   S_SET names + a; with name set, the target is names[0].name
 *   S_SETBLOCK names, args; S_FILTER a (an E_FILTER on nothing), args
 *   S_MACRO name, names (parameters), kw (defaults, NULL where none), body2
 *   E_CONST v; E_NAME name; E_ATTR a.name; E_ITEM a[b]; E_SLICE a[args 0:1:2]
 *   E_CALL a(args, kwn=kw); E_FILTER a|name(args, kw); E_TEST a is [neg] name
 *   E_NEG/E_POS/E_NOT a; E_BIN a op b; E_AND/E_OR a b; E_COND b if a else c
 *   E_LIST/E_TUPLE args; E_DICT args (keys) and kw (values)
 *
 * Nesting is bounded by limits.max_depth, so no template recurses the parser
 * (or later the evaluator) without bound.
 */
#include <string.h>

#include "text/jinja_internal.h"

typedef struct nvec {
    jnode **p;
    size_t n, cap;
} nvec;

static void nv_push(jinja *j, nvec *v, jnode *x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jnode **p = jalloc_array(j, cap, sizeof *p);
        if (v->n) memcpy(p, v->p, v->n * sizeof *p);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
}

typedef struct svec {
    jstr *p;
    size_t n, cap;
} svec;

static void sv_push(jinja *j, svec *v, jstr x) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        jstr *p = jalloc_array(j, cap, sizeof *p);
        if (v->n) memcpy(p, v->p, v->n * sizeof *p);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = x;
}

static jtok *cur(jinja *j) {
    return &j->toks[j->tp];
}
static jtok *peek(jinja *j, size_t k) {
    size_t i = j->tp + k;
    return &j->toks[i < j->n_toks ? i : j->n_toks - 1];
}
static void advance(jinja *j) {
    if (j->toks[j->tp].kind != T_EOF) j->tp++;
}
static bool is_op(const jtok *t, const char *op) {
    return t->kind == T_OP && jstr_eq(t->text, op);
}
static bool is_name(const jtok *t, const char *name) {
    return t->kind == T_NAME && jstr_eq(t->text, name);
}

static const char *describe(const jtok *t) {
    switch (t->kind) {
    case T_EOF: return "the end of the template";
    case T_DATA: return "text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_NAME: return "a name";
    case T_STRING: return "a string";
    case T_INT:
    case T_FLOAT: return "a number";
    default: return "an operator";
    }
}

_Noreturn static void unexpected(jinja *j, const char *wanted) {
    jtok *t = cur(j);
    if (t->kind == T_NAME || t->kind == T_OP)
        jfail(j, CELLM_ERR_FORMAT, t->pos, "expected %s, found '%.*s'", wanted, (int)t->text.n,
              t->text.s);
    jfail(j, CELLM_ERR_FORMAT, t->pos, "expected %s, found %s", wanted, describe(t));
}

static void expect_op(jinja *j, const char *op) {
    if (!is_op(cur(j), op)) {
        char w[16];
        w[0] = '\'';
        size_t L = strlen(op);
        memcpy(w + 1, op, L);
        w[L + 1] = '\'';
        w[L + 2] = '\0';
        unexpected(j, w);
    }
    advance(j);
}

static jstr expect_name(jinja *j) {
    if (cur(j)->kind != T_NAME) unexpected(j, "a name");
    jstr s = cur(j)->text;
    advance(j);
    return s;
}

static jnode *node(jinja *j, int kind, size_t pos) {
    jnode *n = jalloc(j, sizeof *n);
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->pos = pos;
    return n;
}

static void enter(jinja *j, size_t pos) {
    if (++j->depth > j->lim.max_depth)
        jfail(j, CELLM_ERR_NO_MEMORY, pos, "template nested deeper than %d", j->lim.max_depth);
}

static jnode *parse_expr(jinja *j, bool condexpr);
static jnode *parse_unary(jinja *j, bool filters);
static jnode *parse_primary(jinja *j);
static jnode *parse_postfix(jinja *j, jnode *n);

/* Arguments of a call, filter or test after '(': positional and name=value. */
static void parse_args(jinja *j, jnode *n) {
    nvec pos = {0}, kw = {0};
    svec kwn = {0};
    expect_op(j, "(");
    while (!is_op(cur(j), ")")) {
        if (pos.n + kw.n) expect_op(j, ",");
        if (is_op(cur(j), ")")) break;
        if (is_op(cur(j), "*"))
            jfail(j, CELLM_ERR_UNSUPPORTED, cur(j)->pos, "*args in a call is not supported");
        if (cur(j)->kind == T_NAME && is_op(peek(j, 1), "=")) {
            sv_push(j, &kwn, cur(j)->text);
            advance(j);
            advance(j);
            nv_push(j, &kw, parse_expr(j, true));
        } else {
            if (kw.n)
                jfail(j, CELLM_ERR_FORMAT, cur(j)->pos,
                      "positional argument after a keyword argument");
            nv_push(j, &pos, parse_expr(j, true));
        }
    }
    advance(j);
    n->args = pos.p;
    n->n_args = pos.n;
    n->kw = kw.p;
    n->kwn = kwn.p;
    n->n_kw = kw.n;
}

static jnode *parse_filter(jinja *j, jnode *operand) {
    jnode *f = node(j, E_FILTER, cur(j)->pos);
    f->a = operand;
    f->name = expect_name(j);
    if (is_op(cur(j), "(")) parse_args(j, f);
    return f;
}

static jnode *parse_filter_expr(jinja *j, jnode *n) {
    for (;;) {
        jtok *t = cur(j);
        if (is_op(t, "|")) {
            advance(j);
            n = parse_filter(j, n);
        } else if (is_name(t, "is")) {
            advance(j);
            jnode *x = node(j, E_TEST, t->pos);
            x->a = n;
            if (is_name(cur(j), "not")) {
                x->neg = true;
                advance(j);
            }
            x->name = expect_name(j);
            jtok *a = cur(j);
            if (is_op(a, "(")) {
                parse_args(j, x);
            } else if ((a->kind == T_NAME || a->kind == T_STRING || a->kind == T_INT ||
                        a->kind == T_FLOAT || is_op(a, "[") || is_op(a, "{")) &&
                       !is_name(a, "else") && !is_name(a, "or") && !is_name(a, "and")) {
                x->args = jalloc(j, sizeof *x->args);
                x->args[0] = parse_postfix(j, parse_primary(j));
                x->n_args = 1;
            }
            n = x;
        } else if (is_op(t, "(")) {
            jnode *c = node(j, E_CALL, n->pos);
            c->a = n;
            parse_args(j, c);
            n = c;
        } else {
            return n;
        }
    }
}

static jnode *parse_postfix(jinja *j, jnode *n) {
    for (;;) {
        jtok *t = cur(j);
        if (is_op(t, ".")) {
            advance(j);
            if (cur(j)->kind == T_INT) {
                jnode *x = node(j, E_ITEM, t->pos);
                x->a = n;
                x->b = node(j, E_CONST, cur(j)->pos);
                x->b->v = jv_int(cur(j)->i);
                advance(j);
                n = x;
                continue;
            }
            jnode *x = node(j, E_ATTR, t->pos);
            x->a = n;
            x->name = expect_name(j);
            n = x;
        } else if (is_op(t, "[")) {
            advance(j);
            jnode *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            for (;;) {
                if (is_op(cur(j), ":")) {
                    if (k == 2) unexpected(j, "']'");
                    slice = true;
                    k++;
                    advance(j);
                    continue;
                }
                if (is_op(cur(j), "]")) break;
                if (parts[k]) unexpected(j, "']'");
                parts[k] = parse_expr(j, true);
            }
            advance(j);
            if (!slice) {
                if (!parts[0]) jfail(j, CELLM_ERR_FORMAT, t->pos, "empty subscript");
                jnode *x = node(j, E_ITEM, t->pos);
                x->a = n;
                x->b = parts[0];
                n = x;
            } else {
                jnode *x = node(j, E_SLICE, t->pos);
                x->a = n;
                x->args = jalloc_array(j, 3, sizeof *x->args);
                memcpy(x->args, parts, sizeof parts);
                x->n_args = 3;
                n = x;
            }
        } else if (is_op(t, "(")) {
            jnode *c = node(j, E_CALL, n->pos);
            c->a = n;
            parse_args(j, c);
            n = c;
        } else {
            return n;
        }
    }
}

/* ( ... ): a parenthesised expression or a tuple. */
static jnode *parse_paren(jinja *j) {
    size_t pos = cur(j)->pos;
    advance(j);
    if (is_op(cur(j), ")")) {
        advance(j);
        return node(j, E_TUPLE, pos);
    }
    jnode *first = parse_expr(j, true);
    if (is_op(cur(j), ")")) {
        advance(j);
        return first;
    }
    nvec items = {0};
    nv_push(j, &items, first);
    while (is_op(cur(j), ",")) {
        advance(j);
        if (is_op(cur(j), ")")) break;
        nv_push(j, &items, parse_expr(j, true));
    }
    expect_op(j, ")");
    jnode *t = node(j, E_TUPLE, pos);
    t->args = items.p;
    t->n_args = items.n;
    return t;
}

static jnode *parse_primary(jinja *j) {
    jtok *t = cur(j);
    enter(j, t->pos);
    jnode *n;
    switch (t->kind) {
    case T_NAME:
        n = node(j, E_CONST, t->pos);
        if (jstr_eq(t->text, "true") || jstr_eq(t->text, "True"))
            n->v = jv_bool(true);
        else if (jstr_eq(t->text, "false") || jstr_eq(t->text, "False"))
            n->v = jv_bool(false);
        else if (jstr_eq(t->text, "none") || jstr_eq(t->text, "None"))
            n->v = jv_none();
        else {
            n->kind = E_NAME;
            n->name = t->text;
        }
        advance(j);
        break;
    case T_STRING: {
        /* Adjacent literals concatenate, as in Python. */
        jstr s = t->text;
        size_t pos = t->pos;
        advance(j);
        if (cur(j)->kind == T_STRING) {
            jbuf b = {0};
            jbuf_puts(j, &b, s);
            while (cur(j)->kind == T_STRING) {
                jbuf_puts(j, &b, cur(j)->text);
                advance(j);
            }
            s = jbuf_str(&b);
        }
        n = node(j, E_CONST, pos);
        n->v = jv_str(s);
        break;
    }
    case T_INT:
        n = node(j, E_CONST, t->pos);
        n->v = jv_int(t->i);
        advance(j);
        break;
    case T_FLOAT:
        n = node(j, E_CONST, t->pos);
        n->v = jv_float(t->f);
        advance(j);
        break;
    default:
        if (is_op(t, "(")) {
            n = parse_paren(j);
        } else if (is_op(t, "[")) {
            n = node(j, E_LIST, t->pos);
            advance(j);
            nvec items = {0};
            while (!is_op(cur(j), "]")) {
                if (items.n) expect_op(j, ",");
                if (is_op(cur(j), "]")) break;
                nv_push(j, &items, parse_expr(j, true));
            }
            advance(j);
            n->args = items.p;
            n->n_args = items.n;
        } else if (is_op(t, "{")) {
            n = node(j, E_DICT, t->pos);
            advance(j);
            nvec keys = {0}, vals = {0};
            while (!is_op(cur(j), "}")) {
                if (keys.n) expect_op(j, ",");
                if (is_op(cur(j), "}")) break;
                nv_push(j, &keys, parse_expr(j, true));
                expect_op(j, ":");
                nv_push(j, &vals, parse_expr(j, true));
            }
            advance(j);
            n->args = keys.p;
            n->n_args = keys.n;
            n->kw = vals.p;
            n->n_kw = vals.n;
        } else {
            unexpected(j, "an expression");
        }
    }
    j->depth--;
    return n;
}

static jnode *parse_unary(jinja *j, bool filters) {
    jtok *t = cur(j);
    enter(j, t->pos);
    jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        advance(j);
        n = node(j, is_op(t, "-") ? E_NEG : E_POS, t->pos);
        n->a = parse_unary(j, false);
    } else {
        n = parse_postfix(j, parse_primary(j));
    }
    if (filters) n = parse_filter_expr(j, n);
    j->depth--;
    return n;
}

static jnode *bin(jinja *j, int op, jnode *a, jnode *b, size_t pos) {
    jnode *n = node(j, E_BIN, pos);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(jinja *j) {
    jnode *n = parse_unary(j, true);
    while (is_op(cur(j), "**")) {
        size_t pos = cur(j)->pos;
        advance(j);
        n = bin(j, OP_POW, n, parse_unary(j, true), pos);
    }
    return n;
}

static jnode *parse_math2(jinja *j) {
    jnode *n = parse_pow(j);
    for (;;) {
        jtok *t = cur(j);
        int op = is_op(t, "*")    ? OP_MUL
                 : is_op(t, "/")  ? OP_DIV
                 : is_op(t, "//") ? OP_FLOORDIV
                 : is_op(t, "%")  ? OP_MOD
                                  : -1;
        if (op < 0) return n;
        advance(j);
        n = bin(j, op, n, parse_pow(j), t->pos);
    }
}

static jnode *parse_concat(jinja *j) {
    jnode *n = parse_math2(j);
    while (is_op(cur(j), "~")) {
        size_t pos = cur(j)->pos;
        advance(j);
        n = bin(j, OP_CONCAT, n, parse_math2(j), pos);
    }
    return n;
}

static jnode *parse_math1(jinja *j) {
    jnode *n = parse_concat(j);
    for (;;) {
        jtok *t = cur(j);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : -1;
        if (op < 0) return n;
        advance(j);
        n = bin(j, op, n, parse_concat(j), t->pos);
    }
}

static jnode *parse_compare(jinja *j) {
    jnode *left = parse_math1(j), *result = NULL;
    for (;;) {
        jtok *t = cur(j);
        int op = -1;
        if (is_op(t, "=="))
            op = OP_EQ;
        else if (is_op(t, "!="))
            op = OP_NE;
        else if (is_op(t, "<"))
            op = OP_LT;
        else if (is_op(t, "<="))
            op = OP_LE;
        else if (is_op(t, ">"))
            op = OP_GT;
        else if (is_op(t, ">="))
            op = OP_GE;
        else if (is_name(t, "in"))
            op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(j, 1), "in"))
            op = OP_NOTIN;
        if (op < 0) return result ? result : left;
        advance(j);
        if (op == OP_NOTIN) advance(j);
        jnode *right = parse_math1(j);
        /* a < b < c is (a < b) and (b < c). */
        jnode *c = bin(j, op, left, right, t->pos);
        if (result) {
            jnode *a = node(j, E_AND, t->pos);
            a->a = result;
            a->b = c;
            result = a;
        } else {
            result = c;
        }
        left = right;
    }
}

static jnode *parse_not(jinja *j) {
    if (is_name(cur(j), "not")) {
        jnode *n = node(j, E_NOT, cur(j)->pos);
        advance(j);
        enter(j, n->pos);
        n->a = parse_not(j);
        j->depth--;
        return n;
    }
    return parse_compare(j);
}

static jnode *parse_and(jinja *j) {
    jnode *n = parse_not(j);
    while (is_name(cur(j), "and")) {
        jnode *x = node(j, E_AND, cur(j)->pos);
        advance(j);
        x->a = n;
        x->b = parse_not(j);
        n = x;
    }
    return n;
}

static jnode *parse_or(jinja *j) {
    jnode *n = parse_and(j);
    while (is_name(cur(j), "or")) {
        jnode *x = node(j, E_OR, cur(j)->pos);
        advance(j);
        x->a = n;
        x->b = parse_and(j);
        n = x;
    }
    return n;
}

static jnode *parse_expr(jinja *j, bool condexpr) {
    enter(j, cur(j)->pos);
    jnode *n = parse_or(j);
    while (condexpr && is_name(cur(j), "if")) {
        jnode *c = node(j, E_COND, cur(j)->pos);
        advance(j);
        c->b = n;
        c->a = parse_or(j);
        if (is_name(cur(j), "else")) {
            advance(j);
            c->c = parse_expr(j, true);
        }
        n = c;
    }
    j->depth--;
    return n;
}

/* An expression, or several separated by commas (a tuple without parens). */
static jnode *parse_tuple(jinja *j, bool condexpr) {
    size_t pos = cur(j)->pos;
    jnode *first = parse_expr(j, condexpr);
    if (!is_op(cur(j), ",")) return first;
    nvec items = {0};
    nv_push(j, &items, first);
    while (is_op(cur(j), ",")) {
        advance(j);
        jtok *t = cur(j);
        if (t->kind == T_BLOCK_END || t->kind == T_VAR_END || is_op(t, "=") || is_name(t, "in"))
            break;
        nv_push(j, &items, parse_expr(j, condexpr));
    }
    jnode *n = node(j, E_TUPLE, pos);
    n->args = items.p;
    n->n_args = items.n;
    return n;
}

static void expect_block_end(jinja *j) {
    if (cur(j)->kind != T_BLOCK_END) unexpected(j, "'%}'");
    advance(j);
}

/* Statements up to one of the `ends` tags (NULL-terminated), which is
 * consumed with its name; returns the index of the one found. */
static int parse_body(jinja *j, nvec *out, const char *const *ends, const char *what, size_t at);

static jnode *parse_statement(jinja *j);

static jnode *body_node(jinja *j, nvec *v, size_t pos) {
    jnode *n = node(j, S_BODY, pos);
    n->args = v->p;
    n->n_args = v->n;
    return n;
}

/* An if with its elif chain, built in a loop (an elif is an S_IF with neg
 * set, alone in its parent's else branch), so a long chain costs neither
 * parser nor evaluator stack. */
static jnode *parse_if(jinja *j, size_t pos) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    jnode *first = node(j, S_IF, pos), *n = first;
    for (;;) {
        n->a = parse_tuple(j, true);
        expect_block_end(j);
        nvec body = {0};
        int e = parse_body(j, &body, ends, "if", pos);
        n->args = body.p;
        n->n_args = body.n;
        if (e == 0) {
            jnode *next = node(j, S_IF, cur(j)->pos);
            next->neg = true;
            n->body2 = jalloc(j, sizeof *n->body2);
            n->body2[0] = next;
            n->n_body2 = 1;
            n = next;
            continue;
        }
        if (e == 1) {
            expect_block_end(j);
            nvec els = {0};
            static const char *const end2[] = {"endif", NULL};
            parse_body(j, &els, end2, "if", pos);
            n->body2 = els.p;
            n->n_body2 = els.n;
        }
        expect_block_end(j);
        return first;
    }
}

static void parse_targets(jinja *j, jnode *n) {
    svec names = {0};
    bool paren = is_op(cur(j), "(");
    if (paren) advance(j);
    sv_push(j, &names, expect_name(j));
    while (is_op(cur(j), ",")) {
        advance(j);
        if (paren && is_op(cur(j), ")")) break;
        sv_push(j, &names, expect_name(j));
    }
    if (paren) expect_op(j, ")");
    n->names = names.p;
    n->n_names = names.n;
}

static jnode *parse_for(jinja *j, size_t pos) {
    jnode *n = node(j, S_FOR, pos);
    parse_targets(j, n);
    if (!is_name(cur(j), "in")) unexpected(j, "'in'");
    advance(j);
    n->a = parse_tuple(j, false);
    if (is_name(cur(j), "if")) {
        advance(j);
        n->b = parse_expr(j, true);
    }
    if (is_name(cur(j), "recursive"))
        jfail(j, CELLM_ERR_UNSUPPORTED, cur(j)->pos, "recursive for loops are not supported");
    expect_block_end(j);
    static const char *const ends[] = {"else", "endfor", NULL};
    nvec body = {0};
    int e = parse_body(j, &body, ends, "for", pos);
    expect_block_end(j);
    n->args = body.p;
    n->n_args = body.n;
    if (e == 0) {
        static const char *const end2[] = {"endfor", NULL};
        nvec els = {0};
        parse_body(j, &els, end2, "for", pos);
        expect_block_end(j);
        n->body2 = els.p;
        n->n_body2 = els.n;
    }
    return n;
}

static jnode *parse_set(jinja *j, size_t pos) {
    jnode *n = node(j, S_SET, pos);
    if (cur(j)->kind == T_NAME && is_op(peek(j, 1), ".")) {
        n->names = jalloc(j, sizeof *n->names);
        n->names[0] = expect_name(j);
        n->n_names = 1;
        advance(j);
        n->name = expect_name(j);
    } else {
        parse_targets(j, n);
    }
    if (is_op(cur(j), "=")) {
        advance(j);
        n->a = parse_tuple(j, true);
        expect_block_end(j);
        return n;
    }
    if (n->name.n || n->n_names != 1) unexpected(j, "'='");
    if (is_op(cur(j), "|"))
        jfail(j, CELLM_ERR_UNSUPPORTED, cur(j)->pos, "a filter on a block set is not supported");
    expect_block_end(j);
    n->kind = S_SETBLOCK;
    static const char *const ends[] = {"endset", NULL};
    nvec body = {0};
    parse_body(j, &body, ends, "set", pos);
    expect_block_end(j);
    n->args = body.p;
    n->n_args = body.n;
    return n;
}

static jnode *parse_macro(jinja *j, size_t pos) {
    jnode *n = node(j, S_MACRO, pos);
    n->name = expect_name(j);
    expect_op(j, "(");
    svec names = {0};
    nvec defs = {0};
    while (!is_op(cur(j), ")")) {
        if (names.n) expect_op(j, ",");
        if (is_op(cur(j), ")")) break;
        sv_push(j, &names, expect_name(j));
        if (is_op(cur(j), "=")) {
            advance(j);
            nv_push(j, &defs, parse_expr(j, true));
        } else {
            if (defs.n && defs.p[defs.n - 1])
                jfail(j, CELLM_ERR_FORMAT, cur(j)->pos,
                      "parameter without a default after one with");
            nv_push(j, &defs, NULL);
        }
    }
    advance(j);
    expect_block_end(j);
    n->names = names.p;
    n->n_names = names.n;
    n->kw = defs.p;
    n->n_kw = defs.n;
    static const char *const ends[] = {"endmacro", NULL};
    nvec body = {0};
    parse_body(j, &body, ends, "macro", pos);
    if (cur(j)->kind == T_NAME) advance(j); /* {% endmacro name %} */
    expect_block_end(j);
    n->body2 = body.p;
    n->n_body2 = body.n;
    return n;
}

static jnode *parse_statement(jinja *j) {
    jtok *t = cur(j);
    switch (t->kind) {
    case T_DATA: {
        jnode *n = node(j, S_TEXT, t->pos);
        n->v = jv_str(t->text);
        advance(j);
        return n;
    }
    case T_VAR_BEGIN: {
        advance(j);
        jnode *n = node(j, S_OUTPUT, t->pos);
        n->a = parse_tuple(j, true);
        if (cur(j)->kind != T_VAR_END) unexpected(j, "'}}'");
        advance(j);
        return n;
    }
    case T_BLOCK_BEGIN: break;
    default: unexpected(j, "text or a tag");
    }
    advance(j);
    jtok *nt = cur(j);
    if (nt->kind != T_NAME) unexpected(j, "a tag name");
    size_t pos = t->pos;
    jstr name = nt->text;
    advance(j);
    enter(j, pos);
    jnode *n;
    if (jstr_eq(name, "if"))
        n = parse_if(j, pos);
    else if (jstr_eq(name, "for"))
        n = parse_for(j, pos);
    else if (jstr_eq(name, "set"))
        n = parse_set(j, pos);
    else if (jstr_eq(name, "macro"))
        n = parse_macro(j, pos);
    else if (jstr_eq(name, "break") || jstr_eq(name, "continue")) {
        n = node(j, jstr_eq(name, "break") ? S_BREAK : S_CONTINUE, pos);
        expect_block_end(j);
    } else if (jstr_eq(name, "filter")) {
        n = node(j, S_FILTER, pos);
        n->a = parse_filter(j, NULL);
        while (is_op(cur(j), "|")) {
            advance(j);
            n->a = parse_filter(j, n->a);
        }
        expect_block_end(j);
        static const char *const ends[] = {"endfilter", NULL};
        nvec body = {0};
        parse_body(j, &body, ends, "filter", pos);
        expect_block_end(j);
        n->args = body.p;
        n->n_args = body.n;
    } else if (jstr_eq(name, "generation")) {
        /* transformers' marker of assistant text: renders its body. */
        expect_block_end(j);
        static const char *const ends[] = {"endgeneration", NULL};
        nvec body = {0};
        parse_body(j, &body, ends, "generation", pos);
        expect_block_end(j);
        n = body_node(j, &body, pos);
    } else {
        static const char *const known[] = {"call",  "include", "import",     "from", "extends",
                                            "block", "with",    "autoescape", "do",   NULL};
        for (int k = 0; known[k]; k++)
            if (jstr_eq(name, known[k]))
                jfail(j, CELLM_ERR_UNSUPPORTED, pos, "the '%s' tag is not supported", known[k]);
        jfail(j, CELLM_ERR_FORMAT, pos, "unknown or misplaced tag '%.*s'", (int)name.n, name.s);
    }
    j->depth--;
    return n;
}

static int parse_body(jinja *j, nvec *out, const char *const *ends, const char *what, size_t at) {
    for (;;) {
        jtok *t = cur(j);
        if (t->kind == T_EOF) {
            if (!ends) return -1;
            int last = 0;
            while (ends[last + 1]) last++;
            jfail(j, CELLM_ERR_FORMAT, at, "'%s' is never closed (expected '%s')", what,
                  ends[last]);
        }
        if (ends && t->kind == T_BLOCK_BEGIN && peek(j, 1)->kind == T_NAME) {
            jstr name = peek(j, 1)->text;
            for (int k = 0; ends[k]; k++) {
                if (jstr_eq(name, ends[k])) {
                    advance(j);
                    advance(j);
                    return k;
                }
            }
        }
        nv_push(j, out, parse_statement(j));
    }
}

jnode *jinja_parse(jinja *j) {
    nvec body = {0};
    j->tp = 0;
    parse_body(j, &body, NULL, NULL, 0);
    return body_node(j, &body, 0);
}

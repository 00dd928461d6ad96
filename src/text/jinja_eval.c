/*
 * jinja_eval.c — runs a parsed chat template: scopes, statements,
 * expressions, attribute and item lookup, macro calls; and jinja_render, the
 * entry point that ties lexing, parsing and running together under the
 * render's limits.
 *
 * Scopes follow Jinja2: the template has one; each iteration of a for loop
 * and each macro call has its own, so `set` inside them does not leak out
 * (namespace() exists for that); if-blocks share their enclosing scope.
 * Names not set anywhere resolve to the caller's variables, then to the
 * global functions, else to undefined.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

/* Byte offset in the caller's template of offset `pos` in the normalised
 * source (each dropped \r before it shifts it by one). */
static size_t orig_pos(const jinja *j, size_t pos) {
    size_t lo = 0, hi = j->n_drops;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (j->drops[mid] <= pos)
            lo = mid + 1;
        else
            hi = mid;
    }
    return pos + lo;
}

_Noreturn void jfail(jinja *j, cellm_status code, size_t pos, const char *fmt, ...) {
    char msg[CELLM_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos != JPOS_NONE && j->src) {
        size_t line = 1;
        for (size_t i = 0; i < pos && i < j->src_len; i++) line += j->src[i] == '\n';
        err_set(j->err, code, "template: %s (byte %zu, line %zu)", msg, orig_pos(j, pos), line);
    } else {
        err_set(j->err, code, "template: %s", msg);
    }
    j->code = code;
    longjmp(j->jb, 1);
}

void jstep(jinja *j, size_t pos) {
    if (++j->steps > j->lim.max_steps)
        jfail(j, CELLM_ERR_NO_MEMORY, pos, "the template ran for more than %llu steps",
              (unsigned long long)j->lim.max_steps);
}

/* ---- scopes ---- */

static jframe *frame_new(jinja *j, jframe *parent) {
    jframe *f = jalloc(j, sizeof *f);
    memset(f, 0, sizeof *f);
    f->parent = parent;
    return f;
}

static void frame_set(jinja *j, jframe *f, jstr name, jvalue v) {
    for (size_t i = 0; i < f->n; i++)
        if (f->names[i].n == name.n && memcmp(f->names[i].s, name.s, name.n) == 0) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        jstr *nn = jalloc_array(j, cap, sizeof *nn);
        jvalue *vv = jalloc_array(j, cap, sizeof *vv);
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(vv, f->vals, f->n * sizeof *vv);
        }
        f->names = nn;
        f->vals = vv;
        f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static jvalue lookup(jinja *j, jstr name) {
    for (jframe *f = j->frame; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (f->names[i].n == name.n && memcmp(f->names[i].s, name.s, name.n) == 0)
                return f->vals[i];
    static const char *const funcs[] = {"range", "namespace", "raise_exception", "dict",
                                        "strftime_now"};
    for (int k = 0; k < 5; k++)
        if (jstr_eq(name, funcs[k])) return (jvalue){.kind = JV_FUNC, .u.func = k};
    return jv_undef();
}

/* ---- lookups shared with the filters ---- */

jlist *jinja_iter(jinja *j, jvalue v, size_t pos) {
    switch (v.kind) {
    case JV_UNDEF: return jv_list(j, 0, false).u.l;
    case JV_LIST: return v.u.l;
    case JV_ITER: {
        /* A generator runs once: what it had is gone after this. */
        jvalue l = jv_list(j, v.u.l->n, false);
        if (v.u.l->n) memcpy(l.u.l->items, v.u.l->items, v.u.l->n * sizeof(jvalue));
        v.u.l->n = 0;
        return l.u.l;
    }
    case JV_DICT: {
        jvalue l = jv_list(j, v.u.d->n, false);
        memcpy(l.u.l->items, v.u.d->keys, v.u.d->n * sizeof(jvalue));
        return l.u.l;
    }
    case JV_STR: {
        size_t n = ju8_len(v.u.s), k = 0;
        jvalue l = jv_list(j, n, false);
        for (size_t i = 0; i < v.u.s.n; k++) {
            size_t e = ju8_next(v.u.s.s, v.u.s.n, i);
            l.u.l->items[k] = jv_str(jstr_c(v.u.s.s + i, e - i));
            i = e;
        }
        return l.u.l;
    }
    default: jfail(j, CELLM_ERR_FORMAT, pos, "a %s value is not iterable", jv_typename(v));
    }
}

static jvalue loop_attr(jinja *j, const jloop *lp, jstr name, size_t pos) {
    size_t n = lp->items->n, i = lp->index0;
    if (jstr_eq(name, "index")) return jv_int((int64_t)i + 1);
    if (jstr_eq(name, "index0")) return jv_int((int64_t)i);
    if (jstr_eq(name, "revindex")) return jv_int((int64_t)(n - i));
    if (jstr_eq(name, "revindex0")) return jv_int((int64_t)(n - i - 1));
    if (jstr_eq(name, "first")) return jv_bool(i == 0);
    if (jstr_eq(name, "last")) return jv_bool(i + 1 == n);
    if (jstr_eq(name, "length")) return jv_int((int64_t)n);
    if (jstr_eq(name, "depth")) return jv_int(1);
    if (jstr_eq(name, "depth0")) return jv_int(0);
    if (jstr_eq(name, "previtem")) return i > 0 ? lp->items->items[i - 1] : jv_undef();
    if (jstr_eq(name, "nextitem")) return i + 1 < n ? lp->items->items[i + 1] : jv_undef();
    if (jstr_eq(name, "cycle")) {
        jmethod *m = jalloc(j, sizeof *m);
        m->obj = (jvalue){.kind = JV_LOOP, .u.loop = (jloop *)lp};
        m->name = name;
        return (jvalue){.kind = JV_METHOD, .u.m = m};
    }
    (void)pos;
    return jv_undef();
}

jvalue jinja_getattr(jinja *j, jvalue obj, jstr name, size_t pos) {
    switch (obj.kind) {
    case JV_UNDEF:
        jfail(j, CELLM_ERR_FORMAT, pos, "undefined value has no attribute '%.*s'", (int)name.n,
              name.s);
    case JV_LOOP: return loop_attr(j, obj.u.loop, name, pos);
    case JV_NS: {
        jvalue *v = jdict_get(obj.u.d, jv_str(name));
        return v ? *v : jv_undef();
    }
    case JV_DICT:
    case JV_STR:
    case JV_LIST:
        if (jinja_has_method(obj, name)) {
            jmethod *m = jalloc(j, sizeof *m);
            m->obj = obj;
            m->name = name;
            return (jvalue){.kind = JV_METHOD, .u.m = m};
        }
        if (obj.kind == JV_DICT) {
            jvalue *v = jdict_get(obj.u.d, jv_str(name));
            return v ? *v : jv_undef();
        }
        return jv_undef();
    default: return jv_undef();
    }
}

/* Python's index normalisation; false when out of range. */
static bool norm_index(int64_t i, size_t n, size_t *out) {
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

jvalue jinja_getitem(jinja *j, jvalue obj, jvalue key, size_t pos) {
    switch (obj.kind) {
    case JV_UNDEF: jfail(j, CELLM_ERR_FORMAT, pos, "cannot subscript an undefined value");
    case JV_DICT: {
        jvalue *v = jdict_get(obj.u.d, key);
        if (v) return *v;
        if (key.kind == JV_STR) return jinja_getattr(j, obj, key.u.s, pos);
        return jv_undef();
    }
    case JV_LIST: {
        size_t i;
        if ((key.kind == JV_INT || key.kind == JV_BOOL) && norm_index(jv_ival(key), obj.u.l->n, &i))
            return obj.u.l->items[i];
        return jv_undef();
    }
    case JV_STR: {
        size_t i;
        if (key.kind == JV_INT && norm_index(key.u.i, ju8_len(obj.u.s), &i)) {
            size_t b = 0;
            for (size_t k = 0; k < i; k++) b = ju8_next(obj.u.s.s, obj.u.s.n, b);
            return jv_str(jstr_c(obj.u.s.s + b, ju8_next(obj.u.s.s, obj.u.s.n, b) - b));
        }
        if (key.kind == JV_STR) return jinja_getattr(j, obj, key.u.s, pos);
        return jv_undef();
    }
    default:
        if (key.kind == JV_STR) return jinja_getattr(j, obj, key.u.s, pos);
        return jv_undef();
    }
}

/* ---- expressions ---- */

static jvalue eval(jinja *j, const jnode *n);

static jvalue slice(jinja *j, jvalue obj, const jnode *n) {
    int64_t b[3];
    bool set[3];
    for (int k = 0; k < 3; k++) {
        set[k] = false;
        if (!n->args[k]) continue;
        jvalue v = eval(j, n->args[k]);
        if (v.kind == JV_NONE) continue;
        if (v.kind != JV_INT)
            jfail(j, CELLM_ERR_FORMAT, n->pos, "slice indices must be integers, not %s",
                  jv_typename(v));
        b[k] = v.u.i;
        set[k] = true;
    }
    int64_t step = set[2] ? b[2] : 1;
    if (step == 0) jfail(j, CELLM_ERR_FORMAT, n->pos, "slice step cannot be zero");
    if (obj.kind == JV_UNDEF) jfail(j, CELLM_ERR_FORMAT, n->pos, "cannot slice an undefined value");
    if (obj.kind == JV_ITER) return jv_undef(); /* Jinja2: a generator has no items to slice */
    if (obj.kind != JV_LIST && obj.kind != JV_STR)
        jfail(j, CELLM_ERR_FORMAT, n->pos, "cannot slice a %s value", jv_typename(obj));
    jlist *items = obj.kind == JV_LIST ? obj.u.l : jinja_iter(j, obj, n->pos);
    int64_t len = (int64_t)items->n, start, stop;
    /* Python's slice.indices(). */
    if (!set[0])
        start = step < 0 ? len - 1 : 0;
    else {
        start = b[0] < 0 ? b[0] + len : b[0];
        if (start < 0) start = step < 0 ? -1 : 0;
        if (start >= len) start = step < 0 ? len - 1 : len;
    }
    if (!set[1])
        stop = step < 0 ? -1 : len;
    else {
        stop = b[1] < 0 ? b[1] + len : b[1];
        if (stop < 0) stop = step < 0 ? -1 : 0;
        if (stop >= len) stop = step < 0 ? len - 1 : len;
    }
    size_t count = 0;
    if (step > 0 && stop > start) count = (size_t)((stop - start + step - 1) / step);
    if (step < 0 && start > stop) count = (size_t)((start - stop - step - 1) / -step);
    if (obj.kind == JV_STR) {
        jbuf out = {0};
        for (size_t k = 0; k < count; k++)
            jbuf_puts(j, &out, items->items[start + (int64_t)k * step].u.s);
        return jv_str(jbuf_str(&out));
    }
    jvalue r = jv_list(j, count, obj.u.l->tuple);
    for (size_t k = 0; k < count; k++) r.u.l->items[k] = items->items[start + (int64_t)k * step];
    return r;
}

static void eval_args(jinja *j, const jnode *n, jargs *a) {
    a->n = n->n_args;
    a->pos = n->n_args ? jalloc_array(j, n->n_args, sizeof(jvalue)) : NULL;
    for (size_t i = 0; i < n->n_args; i++) a->pos[i] = eval(j, n->args[i]);
    a->n_kw = n->n_kw;
    a->kwn = n->kwn;
    a->kw = n->n_kw ? jalloc_array(j, n->n_kw, sizeof(jvalue)) : NULL;
    for (size_t i = 0; i < n->n_kw; i++) a->kw[i] = eval(j, n->kw[i]);
    a->at = n->pos;
}

static bool checked_int(int op, int64_t x, int64_t y, int64_t *r) {
    switch (op) {
    case OP_ADD: return !__builtin_add_overflow(x, y, r);
    case OP_SUB: return !__builtin_sub_overflow(x, y, r);
    default: return !__builtin_mul_overflow(x, y, r);
    }
}

static jvalue repeat(jinja *j, jvalue seq, int64_t times, size_t pos) {
    size_t n = times > 0 ? (size_t)times : 0, total;
    if (seq.kind == JV_STR) {
        if (!size_mul(seq.u.s.n, n, &total) || total > j->lim.max_memory)
            jfail(j, CELLM_ERR_NO_MEMORY, pos, "string repetition too large");
        jbuf b = {0};
        for (size_t i = 0; i < n; i++) jbuf_puts(j, &b, seq.u.s);
        jvalue r = jv_str(jbuf_str(&b));
        r.safe = seq.safe;
        return r;
    }
    if (!size_mul(seq.u.l->n, n, &total) || total > j->lim.max_memory / sizeof(jvalue))
        jfail(j, CELLM_ERR_NO_MEMORY, pos, "list repetition too large");
    jvalue r = jv_list(j, total, seq.u.l->tuple);
    for (size_t i = 0; i < n; i++)
        if (seq.u.l->n)
            memcpy(r.u.l->items + i * seq.u.l->n, seq.u.l->items, seq.u.l->n * sizeof(jvalue));
    return r;
}

static jvalue binop(jinja *j, int op, jvalue a, jvalue b, size_t pos) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (op == OP_CONCAT) {
        jbuf out = {0};
        jv_write_str(j, &out, a, pos);
        jv_write_str(j, &out, b, pos);
        return jv_str(jbuf_str(&out));
    }
    if (op >= OP_EQ) {
        switch (op) {
        case OP_EQ: return jv_bool(jv_eq(j, a, b, 0));
        case OP_NE: return jv_bool(!jv_eq(j, a, b, 0));
        case OP_LT: return jv_bool(jv_cmp(j, a, b, pos, 0) < 0);
        case OP_LE: return jv_bool(jv_cmp(j, a, b, pos, 0) <= 0);
        case OP_GT: return jv_bool(jv_cmp(j, a, b, pos, 0) > 0);
        case OP_GE: return jv_bool(jv_cmp(j, a, b, pos, 0) >= 0);
        default: {
            bool in = false;
            if (b.kind == JV_STR) {
                if (a.kind != JV_STR)
                    jfail(j, CELLM_ERR_FORMAT, pos,
                          "'in <string>' needs a string on the left, not %s", jv_typename(a));
                if (a.u.s.n == 0) in = true;
                for (size_t i = 0; !in && i + a.u.s.n <= b.u.s.n; i++)
                    in = memcmp(b.u.s.s + i, a.u.s.s, a.u.s.n) == 0;
            } else if (b.kind == JV_LIST || b.kind == JV_ITER) {
                jlist *l = jinja_iter(j, b, pos);
                for (size_t i = 0; !in && i < l->n; i++) in = jv_eq(j, a, l->items[i], 0);
            } else if (b.kind == JV_DICT || b.kind == JV_NS) {
                in = jdict_get(b.u.d, a) != NULL;
            } else if (b.kind != JV_UNDEF) {
                jfail(j, CELLM_ERR_FORMAT, pos, "'in' needs a container on the right, not %s",
                      jv_typename(b));
            }
            return jv_bool(op == OP_IN ? in : !in);
        }
        }
    }
    if (op == OP_ADD && a.kind == JV_STR && b.kind == JV_STR) {
        /* Markup + str (either way round) escapes the plain side. */
        bool safe = a.safe || b.safe;
        jbuf out = {0};
        jbuf_puts(j, &out, safe && !a.safe ? jhtml_escape(j, a.u.s) : a.u.s);
        jbuf_puts(j, &out, safe && !b.safe ? jhtml_escape(j, b.u.s) : b.u.s);
        jvalue r = jv_str(jbuf_str(&out));
        r.safe = safe;
        return r;
    }
    if (op == OP_ADD && a.kind == JV_LIST && b.kind == JV_LIST) {
        jvalue r = jv_list(j, a.u.l->n + b.u.l->n, a.u.l->tuple);
        if (a.u.l->n) memcpy(r.u.l->items, a.u.l->items, a.u.l->n * sizeof(jvalue));
        if (b.u.l->n) memcpy(r.u.l->items + a.u.l->n, b.u.l->items, b.u.l->n * sizeof(jvalue));
        return r;
    }
    if (op == OP_MUL && (a.kind == JV_STR || a.kind == JV_LIST) &&
        (b.kind == JV_INT || b.kind == JV_BOOL))
        return repeat(j, a, jv_ival(b), pos);
    if (op == OP_MUL && (b.kind == JV_STR || b.kind == JV_LIST) &&
        (a.kind == JV_INT || a.kind == JV_BOOL))
        return repeat(j, b, jv_ival(a), pos);
    if (!jv_is_number(a) || !jv_is_number(b))
        jfail(j, CELLM_ERR_FORMAT, pos, "unsupported operand types for %s: %s and %s", names[op],
              jv_typename(a), jv_typename(b));
    bool ints = a.kind != JV_FLOAT && b.kind != JV_FLOAT;
    int64_t x = jv_ival(a), y = jv_ival(b);
    double fx = jv_num(a), fy = jv_num(b);
    int64_t r;
    switch (op) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
        if (!ints) return jv_float(op == OP_ADD ? fx + fy : op == OP_SUB ? fx - fy : fx * fy);
        if (!checked_int(op, x, y, &r)) jfail(j, CELLM_ERR_UNSUPPORTED, pos, "integer overflow");
        return jv_int(r);
    case OP_DIV:
        if (fy == 0) jfail(j, CELLM_ERR_FORMAT, pos, "division by zero");
        return jv_float(fx / fy);
    case OP_FLOORDIV:
    case OP_MOD:
        if (fy == 0) jfail(j, CELLM_ERR_FORMAT, pos, "division by zero");
        if (ints) {
            if (x == INT64_MIN && y == -1) jfail(j, CELLM_ERR_UNSUPPORTED, pos, "integer overflow");
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) {
                q--;
                m += y;
            }
            return jv_int(op == OP_MOD ? m : q);
        } else {
            double q = floor(fx / fy), m = fmod(fx, fy);
            if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
            return jv_float(op == OP_MOD ? m : q);
        }
    default: /* OP_POW */
        if (ints && y >= 0) {
            int64_t acc = 1;
            for (int64_t k = 0; k < y; k++) {
                if (__builtin_mul_overflow(acc, x, &acc))
                    jfail(j, CELLM_ERR_UNSUPPORTED, pos, "integer overflow");
                if (acc == 0 || acc == 1) break;
            }
            return jv_int(acc);
        }
        return jv_float(pow(fx, fy));
    }
}

static jvalue call(jinja *j, jvalue f, const jargs *a, size_t pos) {
    switch (f.kind) {
    case JV_MACRO: return jinja_call_macro(j, f.u.macro, a);
    case JV_FUNC: return jinja_func(j, f.u.func, a);
    case JV_METHOD: return jinja_method(j, f.u.m, a);
    case JV_UNDEF: jfail(j, CELLM_ERR_FORMAT, pos, "call of an undefined value");
    default: jfail(j, CELLM_ERR_FORMAT, pos, "a %s value is not callable", jv_typename(f));
    }
}

static jvalue eval_node(jinja *j, const jnode *n);

/* Chains the parser builds in loops (a + b + c ..., x.a.b ..., x|f|g ...)
 * nest to the left, so evaluation depth is bounded here as well. */
static jvalue eval(jinja *j, const jnode *n) {
    if (++j->edepth > 4 * j->lim.max_depth)
        jfail(j, CELLM_ERR_NO_MEMORY, n->pos, "expression nested deeper than %d",
              4 * j->lim.max_depth);
    jvalue v = eval_node(j, n);
    j->edepth--;
    return v;
}

static jvalue eval_node(jinja *j, const jnode *n) {
    jstep(j, n->pos);
    switch (n->kind) {
    case E_CONST: return n->v;
    case E_NAME: return lookup(j, n->name);
    case E_ATTR: return jinja_getattr(j, eval(j, n->a), n->name, n->pos);
    case E_ITEM: {
        jvalue o = eval(j, n->a);
        return jinja_getitem(j, o, eval(j, n->b), n->pos);
    }
    case E_SLICE: return slice(j, eval(j, n->a), n);
    case E_CALL: {
        jvalue f = eval(j, n->a);
        jargs a;
        eval_args(j, n, &a);
        return call(j, f, &a, n->pos);
    }
    case E_FILTER: {
        jvalue v = eval(j, n->a);
        jargs a;
        eval_args(j, n, &a);
        return jinja_filter(j, n->name, v, &a);
    }
    case E_TEST: {
        jvalue v = eval(j, n->a);
        jargs a;
        eval_args(j, n, &a);
        bool r = jinja_test(j, n->name, v, &a);
        return jv_bool(n->neg ? !r : r);
    }
    case E_NEG:
    case E_POS: {
        jvalue v = eval(j, n->a);
        if (!jv_is_number(v))
            jfail(j, CELLM_ERR_FORMAT, n->pos, "bad operand type for unary %c: %s",
                  n->kind == E_NEG ? '-' : '+', jv_typename(v));
        if (n->kind == E_POS) return v.kind == JV_BOOL ? jv_int(v.u.b) : v;
        if (v.kind == JV_FLOAT) return jv_float(-v.u.f);
        int64_t x = jv_ival(v);
        if (x == INT64_MIN) jfail(j, CELLM_ERR_UNSUPPORTED, n->pos, "integer overflow");
        return jv_int(-x);
    }
    case E_NOT: return jv_bool(!jv_truthy(eval(j, n->a)));
    case E_AND: {
        jvalue a = eval(j, n->a);
        return jv_truthy(a) ? eval(j, n->b) : a;
    }
    case E_OR: {
        jvalue a = eval(j, n->a);
        return jv_truthy(a) ? a : eval(j, n->b);
    }
    case E_COND:
        if (jv_truthy(eval(j, n->a))) return eval(j, n->b);
        return n->c ? eval(j, n->c) : jv_undef();
    case E_BIN: {
        jvalue a = eval(j, n->a);
        return binop(j, n->op, a, eval(j, n->b), n->pos);
    }
    case E_LIST:
    case E_TUPLE: {
        jvalue l = jv_list(j, n->n_args, n->kind == E_TUPLE);
        for (size_t i = 0; i < n->n_args; i++) l.u.l->items[i] = eval(j, n->args[i]);
        return l;
    }
    case E_DICT: {
        jvalue d = jv_dict(j);
        for (size_t i = 0; i < n->n_args; i++) {
            jvalue k = eval(j, n->args[i]);
            jdict_set(j, d.u.d, k, eval(j, n->kw[i]));
        }
        return d;
    }
    default: jfail(j, CELLM_ERR_INTERNAL, n->pos, "bad expression node %d", n->kind);
    }
}

/* ---- statements ---- */

static void exec_body(jinja *j, jnode *const *body, size_t n);

static void assign(jinja *j, const jnode *n, jvalue v) {
    if (n->n_names == 1) {
        frame_set(j, j->frame, n->names[0], v);
        return;
    }
    jlist *l = jinja_iter(j, v, n->pos);
    if (l->n != n->n_names)
        jfail(j, CELLM_ERR_FORMAT, n->pos, "cannot unpack %zu values into %zu names", l->n,
              n->n_names);
    for (size_t i = 0; i < l->n; i++) frame_set(j, j->frame, n->names[i], l->items[i]);
}

static jstr capture(jinja *j, jnode *const *body, size_t n) {
    jbuf b = {0}, *saved = j->out;
    j->out = &b;
    exec_body(j, body, n);
    j->out = saved;
    return jbuf_str(&b);
}

static void exec_for(jinja *j, const jnode *n) {
    jvalue it = eval(j, n->a);
    jlist *items = jinja_iter(j, it, n->a->pos);
    if (n->b) {
        /* `for x in xs if cond`: the loop (and loop.length) sees only the kept items. */
        jvalue kept = jv_list(j, items->n, false);
        size_t k = 0;
        jframe *saved = j->frame, *f = frame_new(j, saved);
        for (size_t i = 0; i < items->n; i++) {
            f->n = 0;
            j->frame = f;
            assign(j, n, items->items[i]);
            if (jv_truthy(eval(j, n->b))) kept.u.l->items[k++] = items->items[i];
        }
        j->frame = saved;
        kept.u.l->n = k;
        items = kept.u.l;
    }
    if (items->n == 0) {
        exec_body(j, n->body2, n->n_body2);
        return;
    }
    jloop *lp = jalloc(j, sizeof *lp);
    lp->items = items;
    /* One scope, emptied for each iteration: nothing can keep a reference
     * to it (macros close over the template's scope), so reusing it keeps
     * long loops from growing the arena. */
    jframe *saved = j->frame, *f = frame_new(j, saved);
    j->loops++;
    for (size_t i = 0; i < items->n; i++) {
        jstep(j, n->pos);
        lp->index0 = i;
        f->n = 0;
        j->frame = f;
        frame_set(j, j->frame, jstr_c("loop", 4), (jvalue){.kind = JV_LOOP, .u.loop = lp});
        assign(j, n, items->items[i]);
        exec_body(j, n->args, n->n_args);
        if (j->ctl == 1) {
            j->ctl = 0;
            break;
        }
        j->ctl = 0;
    }
    j->loops--;
    j->frame = saved;
}

static void exec(jinja *j, const jnode *n) {
    jstep(j, n->pos);
    switch (n->kind) {
    case S_TEXT: jbuf_puts(j, j->out, n->v.u.s); return;
    case S_OUTPUT: jv_write_str(j, j->out, eval(j, n->a), n->pos); return;
    case S_BODY: exec_body(j, n->args, n->n_args); return;
    case S_IF:
        for (;;) {
            if (jv_truthy(eval(j, n->a))) {
                exec_body(j, n->args, n->n_args);
                return;
            }
            if (n->n_body2 != 1 || n->body2[0]->kind != S_IF || !n->body2[0]->neg) {
                exec_body(j, n->body2, n->n_body2);
                return;
            }
            n = n->body2[0]; /* an elif: follow the chain without recursing */
            jstep(j, n->pos);
        }
    case S_FOR: exec_for(j, n); return;
    case S_SET: {
        jvalue v = eval(j, n->a);
        if (!n->name.n) {
            assign(j, n, v);
            return;
        }
        jvalue ns = lookup(j, n->names[0]);
        if (ns.kind != JV_NS)
            jfail(j, CELLM_ERR_FORMAT, n->pos,
                  "cannot set an attribute of a %s value (only of a namespace)", jv_typename(ns));
        jdict_set(j, ns.u.d, jv_str(n->name), v);
        return;
    }
    case S_SETBLOCK:
        frame_set(j, j->frame, n->names[0], jv_str(capture(j, n->args, n->n_args)));
        return;
    case S_MACRO: frame_set(j, j->frame, n->name, (jvalue){.kind = JV_MACRO, .u.macro = n}); return;
    case S_BREAK:
    case S_CONTINUE:
        if (!j->loops)
            jfail(j, CELLM_ERR_FORMAT, n->pos, "'%s' outside a for loop",
                  n->kind == S_BREAK ? "break" : "continue");
        j->ctl = n->kind == S_BREAK ? 1 : 2;
        return;
    case S_FILTER: {
        jvalue v = jv_str(capture(j, n->args, n->n_args));
        /* Apply the chain innermost first: n->a is the last filter. */
        const jnode *chain[64];
        int k = 0;
        for (const jnode *f = n->a; f; f = f->a) {
            if (k == 64) jfail(j, CELLM_ERR_UNSUPPORTED, n->pos, "too many filters");
            chain[k++] = f;
        }
        while (k-- > 0) {
            jargs a;
            eval_args(j, chain[k], &a);
            v = jinja_filter(j, chain[k]->name, v, &a);
        }
        jv_write_str(j, j->out, v, n->pos);
        return;
    }
    default: jfail(j, CELLM_ERR_INTERNAL, n->pos, "bad statement node %d", n->kind);
    }
}

static void exec_body(jinja *j, jnode *const *body, size_t n) {
    for (size_t i = 0; i < n && !j->ctl; i++) exec(j, body[i]);
}

jvalue jinja_call_macro(jinja *j, const jnode *m, const jargs *a) {
    if (a->n > m->n_names)
        jfail(j, CELLM_ERR_FORMAT, a->at, "macro '%.*s' takes %zu arguments, got %zu",
              (int)m->name.n, m->name.s, m->n_names, a->n);
    if (++j->calls > j->lim.max_calls)
        jfail(j, CELLM_ERR_NO_MEMORY, a->at, "macro calls nested deeper than %d", j->lim.max_calls);
    jframe *saved = j->frame;
    int saved_loops = j->loops;
    jframe *f = frame_new(j, j->root);
    for (size_t i = 0; i < m->n_names; i++) {
        jvalue v = jv_undef();
        bool have = false;
        if (i < a->n) {
            v = a->pos[i];
            have = true;
        }
        for (size_t k = 0; k < a->n_kw; k++)
            if (a->kwn[k].n == m->names[i].n &&
                memcmp(a->kwn[k].s, m->names[i].s, a->kwn[k].n) == 0) {
                v = a->kw[k];
                have = true;
            }
        if (!have && m->kw[i]) {
            j->frame = f;
            v = eval(j, m->kw[i]);
        }
        frame_set(j, f, m->names[i], v);
    }
    for (size_t k = 0; k < a->n_kw; k++) {
        bool known = false;
        for (size_t i = 0; i < m->n_names && !known; i++)
            known = a->kwn[k].n == m->names[i].n &&
                    memcmp(a->kwn[k].s, m->names[i].s, a->kwn[k].n) == 0;
        if (!known)
            jfail(j, CELLM_ERR_FORMAT, a->at, "macro '%.*s' has no parameter '%.*s'",
                  (int)m->name.n, m->name.s, (int)a->kwn[k].n, a->kwn[k].s);
    }
    j->frame = f;
    j->loops = 0;
    jstr s = capture(j, m->body2, m->n_body2);
    j->loops = saved_loops;
    j->frame = saved;
    j->calls--;
    return jv_str(s);
}

/* ---- entry point ---- */

static jvalue message_list(jinja *j, const jinja_ctx *ctx) {
    jvalue l = jv_list(j, ctx->n_messages, false);
    for (size_t i = 0; i < ctx->n_messages; i++) {
        const jinja_message *m = &ctx->messages[i];
        if (!m->role) jfail(j, CELLM_ERR_INVALID_ARG, JPOS_NONE, "message %zu has no role", i);
        jvalue d = jv_dict(j);
        jdict_set(j, d.u.d, jv_str(jstr_c("role", 4)), jv_str(jstr_c(m->role, strlen(m->role))));
        if (m->content)
            jdict_set(j, d.u.d, jv_str(jstr_c("content", 7)),
                      jv_str(jstr_c(m->content, strlen(m->content))));
        l.u.l->items[i] = d;
    }
    return l;
}

static jvalue *global(jframe *g, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; i < g->n; i++)
        if (g->names[i].n == n && memcmp(g->names[i].s, name, n) == 0) return &g->vals[i];
    return NULL;
}

/* One message as apply_chat_template hands it to the template: keys whose
 * value is None dropped, and its reasoning (the first of reasoning_content,
 * thinking, reasoning that is set) shown both as reasoning_content, which
 * most templates read, and as thinking, which some read; the order of keys
 * is transformers' {"thinking": r, **message, "reasoning_content": r}. */
static jvalue chat_message(jinja *j, jvalue m) {
    if (m.kind != JV_DICT) return m;
    jvalue d = jv_dict(j);
    jvalue reasoning = jv_undef();
    static const char *const fields[] = {"reasoning_content", "thinking", "reasoning"};
    for (int k = 0; k < 3 && reasoning.kind == JV_UNDEF; k++) {
        jvalue *v = jdict_get_str(m.u.d, fields[k]);
        if (v && v->kind != JV_NONE) reasoning = *v;
    }
    if (reasoning.kind != JV_UNDEF) jdict_set(j, d.u.d, jv_str(jstr_c("thinking", 8)), reasoning);
    for (size_t i = 0; i < m.u.d->n; i++)
        if (m.u.d->vals[i].kind != JV_NONE) jdict_set(j, d.u.d, m.u.d->keys[i], m.u.d->vals[i]);
    if (reasoning.kind != JV_UNDEF)
        jdict_set(j, d.u.d, jv_str(jstr_c("reasoning_content", 17)), reasoning);
    return d;
}

/* What transformers' apply_chat_template does around the render, so the
 * template sees what it would see there: `tools` and `documents` are none
 * unless the caller set them, and messages are prepared by chat_message. */
static void prepare_chat(jinja *j, jframe *g) {
    if (!global(g, "tools")) frame_set(j, g, jstr_c("tools", 5), jv_none());
    if (!global(g, "documents")) frame_set(j, g, jstr_c("documents", 9), jv_none());
    jvalue *msgs = global(g, "messages");
    if (!msgs || msgs->kind != JV_LIST) return;
    jvalue l = jv_list(j, msgs->u.l->n, false);
    for (size_t i = 0; i < msgs->u.l->n; i++)
        l.u.l->items[i] = chat_message(j, msgs->u.l->items[i]);
    *msgs = l;
}

static void run(jinja *j, const char *tpl, size_t len, const jinja_ctx *ctx) {
    /* Normalise newlines (\r\n and \r to \n) and drop one trailing newline,
     * as Jinja2 does before lexing. */
    char *src = jalloc(j, len + 1);
    size_t n = 0, nd = 0;
    for (size_t i = 0; i < len; i++) nd += tpl[i] == '\r';
    j->drops = nd ? jalloc_array(j, nd, sizeof(size_t)) : NULL;
    for (size_t i = 0; i < len; i++) {
        if (tpl[i] == '\r') {
            j->drops[j->n_drops++] = n;
            if (i + 1 < len && tpl[i + 1] == '\n') continue;
            src[n++] = '\n';
            continue;
        }
        src[n++] = tpl[i];
    }
    if (n && src[n - 1] == '\n') n--;
    src[n] = '\0';
    j->src = src;
    j->src_len = n;
    jinja_lex(j);
    jnode *root = jinja_parse(j);

    jframe *g = &j->globals;
    g->parent = NULL;
    frame_set(j, g, jstr_c("messages", 8), message_list(j, ctx));
    frame_set(j, g, jstr_c("add_generation_prompt", 21), jv_bool(ctx->add_generation_prompt));
    if (ctx->bos_token)
        frame_set(j, g, jstr_c("bos_token", 9),
                  jv_str(jstr_c(ctx->bos_token, strlen(ctx->bos_token))));
    if (ctx->eos_token)
        frame_set(j, g, jstr_c("eos_token", 9),
                  jv_str(jstr_c(ctx->eos_token, strlen(ctx->eos_token))));
    if (ctx->vars_json) {
        jvalue v = jv_parse_json(j, ctx->vars_json, ctx->vars_json_len);
        if (v.kind != JV_DICT)
            jfail(j, CELLM_ERR_FORMAT, JPOS_NONE, "vars_json is not a JSON object");
        for (size_t i = 0; i < v.u.d->n; i++) frame_set(j, g, v.u.d->keys[i].u.s, v.u.d->vals[i]);
    }
    prepare_chat(j, g);
    j->root = frame_new(j, g);
    j->frame = j->root;
    j->out = &j->main_out;
    exec(j, root);
}

cellm_status jinja_render(const char *tpl, size_t len, const jinja_ctx *ctx, char **out,
                          size_t *out_len, cellm_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if ((!tpl && len) || !ctx || !out || !out_len || (ctx->n_messages && !ctx->messages))
        return err_set(err, CELLM_ERR_INVALID_ARG, "jinja_render: NULL argument");
    jinja *j = calloc(1, sizeof *j);
    if (!j) return err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
    j->err = err;
    j->lim = ctx->limits;
    if (!j->lim.max_output) j->lim.max_output = (size_t)4 << 20;
    if (!j->lim.max_memory) j->lim.max_memory = (size_t)64 << 20;
    if (!j->lim.max_steps) j->lim.max_steps = 10000000;
    if (j->lim.max_depth <= 0) j->lim.max_depth = 128;
    if (j->lim.max_calls <= 0) j->lim.max_calls = 32;
    cellm_status st = CELLM_OK;
    if (setjmp(j->jb) == 0) {
        run(j, tpl ? tpl : "", len, ctx);
        char *s = malloc(j->main_out.n + 1);
        if (!s) {
            st = err_set(err, CELLM_ERR_NO_MEMORY, "out of memory");
        } else {
            if (j->main_out.n) memcpy(s, j->main_out.p, j->main_out.n);
            s[j->main_out.n] = '\0';
            *out = s;
            *out_len = j->main_out.n;
        }
    } else {
        st = j->code;
    }
    jarena_free(j);
    free(j);
    return st;
}

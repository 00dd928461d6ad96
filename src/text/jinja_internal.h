/*
 * jinja_internal.h — what the parts of the template interpreter share: the
 * render state (arena, limits, error exit), values, tokens and the syntax
 * tree. jinja_lex.c turns the source into tokens, jinja_parse.c tokens into
 * a tree, jinja_eval.c runs the tree, jinja_value.c holds value semantics
 * (Python's str/repr/==/<, JSON in and out) and jinja_filters.c the filters,
 * tests, methods and global functions.
 *
 * Errors unwind with longjmp to jinja_render: every allocation of a render
 * comes from its arena, freed as a whole there, so nothing leaks on the way
 * out and the many helpers need no error paths of their own.
 */
#ifndef CELLM_JINJA_INTERNAL_H
#define CELLM_JINJA_INTERNAL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/jinja.h"

#define JPOS_NONE ((size_t)-1)

typedef struct jstr {
    const char *s;
    size_t n;
} jstr;

typedef enum jv_kind {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,   /* also tuples (l->tuple) */
    JV_DICT,   /* keys in insertion order */
    JV_NS,     /* namespace(): a dict whose entries `set ns.x = ...` changes */
    JV_LOOP,   /* the `loop` of a for statement */
    JV_MACRO,  /* a {% macro %} */
    JV_FUNC,   /* a global function (range, namespace, ...) */
    JV_METHOD, /* obj.name of a str/dict method, waiting for its call */
    JV_ITER,   /* a generator (what map, select, reverse... return in Jinja2): u.l
                  holds what is left; true even when empty, has no length, and
                  iterating it uses it up */
} jv_kind;

typedef struct jvalue jvalue;
typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jloop jloop;
typedef struct jnode jnode;
typedef struct jmethod jmethod;

struct jvalue {
    uint8_t kind;
    /* A string marked safe (Jinja2's Markup, from |safe or |escape): adding
     * a plain string to it escapes that string. */
    bool safe;
    union {
        bool b;
        int64_t i;
        double f;
        jstr s;
        jlist *l;
        jdict *d;
        jloop *loop;
        const jnode *macro;
        int func;
        jmethod *m;
    } u;
};

struct jlist {
    jvalue *items;
    size_t n;
    bool tuple;
};

struct jdict {
    jvalue *keys, *vals;
    size_t n, cap;
};

struct jloop {
    const jlist *items;
    size_t index0;
};

struct jmethod {
    jvalue obj;
    jstr name;
};

enum { JF_RANGE, JF_NAMESPACE, JF_RAISE, JF_DICT, JF_STRFTIME };

/* ---- tokens ---- */

typedef enum jtok_kind {
    T_EOF,
    T_DATA,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STRING, /* text: the decoded value */
    T_INT,
    T_FLOAT,
    T_OP, /* text: the operator */
} jtok_kind;

typedef struct jtok {
    uint8_t kind;
    jstr text;
    size_t pos;
    int64_t i;
    double f;
} jtok;

/* ---- syntax tree ---- */

typedef enum jnode_kind {
    /* statements */
    S_TEXT,
    S_OUTPUT,
    S_IF,
    S_FOR,
    S_SET,
    S_SETBLOCK,
    S_MACRO,
    S_BREAK,
    S_CONTINUE,
    S_FILTER,
    S_BODY,
    /* expressions */
    E_CONST,
    E_NAME,
    E_ATTR,
    E_ITEM,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_NEG,
    E_POS,
    E_NOT,
    E_BIN,
    E_AND,
    E_OR,
    E_COND,
    E_LIST,
    E_TUPLE,
    E_DICT,
} jnode_kind;

/* Binary operators (E_BIN's op). */
enum {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_CONCAT,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_IN,
    OP_NOTIN,
};

/* One node; which fields mean what depends on the kind (see jinja_parse.c). */
struct jnode {
    uint8_t kind, op;
    bool neg;
    size_t pos;
    jnode *a, *b, *c;
    jnode **args; /* arguments, items, dict keys, or a statement body */
    size_t n_args;
    jnode **kw; /* keyword argument values, dict values, macro defaults */
    jstr *kwn;  /* keyword argument names */
    size_t n_kw;
    jnode **body2; /* else branch, macro body */
    size_t n_body2;
    jstr name;
    jstr *names; /* assignment targets, macro parameters */
    size_t n_names;
    jvalue v;
};

/* ---- render state ---- */

typedef struct jbuf {
    char *p;
    size_t n, cap;
} jbuf;

typedef struct jframe jframe;
struct jframe {
    jframe *parent;
    jstr *names;
    jvalue *vals;
    size_t n, cap;
};

typedef struct jchunk jchunk;

typedef struct jinja {
    jmp_buf jb;
    cellm_error *err;
    cellm_status code;
    jinja_limits lim;
    /* arena */
    jchunk *chunks;
    size_t mem_used;
    /* source, newlines normalised to \n; drops[] are the offsets (in the
     * normalised text) where a \r was removed, to report original offsets */
    const char *src;
    size_t src_len;
    size_t *drops;
    size_t n_drops;
    /* tokens and the parser's cursor */
    jtok *toks;
    size_t n_toks, cap_toks, tp;
    int depth;
    /* evaluation */
    uint64_t steps;
    jbuf *out;
    jbuf main_out;
    jframe *frame, *root;
    jframe globals;
    int ctl; /* 1 break, 2 continue: unwinding to the innermost loop */
    int calls;
    int edepth; /* eval() recursion */
    int loops;  /* for statements being run (break/continue need one) */
} jinja;

/* Leaves the render with `code` and a message; pos is a byte offset in the
 * normalised source, or JPOS_NONE. */
_Noreturn void jfail(jinja *j, cellm_status code, size_t pos, const char *fmt, ...)
    CELLM_PRINTF(4, 5);
void *jalloc(jinja *j, size_t n);
void jarena_free(jinja *j);
void *jalloc_array(jinja *j, size_t n, size_t size);
jstr jstr_dup(jinja *j, const char *s, size_t n);
static inline jstr jstr_c(const char *s, size_t n) {
    return (jstr){s, n};
}
bool jstr_eq(jstr a, const char *lit);
void jbuf_put(jinja *j, jbuf *b, const char *s, size_t n);
static inline void jbuf_puts(jinja *j, jbuf *b, jstr s) {
    jbuf_put(j, b, s.s, s.n);
}
void jbuf_putc(jinja *j, jbuf *b, char c);
jstr jbuf_str(const jbuf *b);
void jstep(jinja *j, size_t pos);

/* lexer and parser */
void jinja_lex(jinja *j);
jnode *jinja_parse(jinja *j);

/* values */
static inline jvalue jv_undef(void) {
    return (jvalue){.kind = JV_UNDEF};
}
static inline jvalue jv_none(void) {
    return (jvalue){.kind = JV_NONE};
}
static inline jvalue jv_bool(bool b) {
    return (jvalue){.kind = JV_BOOL, .u.b = b};
}
static inline jvalue jv_int(int64_t i) {
    return (jvalue){.kind = JV_INT, .u.i = i};
}
static inline jvalue jv_float(double f) {
    return (jvalue){.kind = JV_FLOAT, .u.f = f};
}
static inline jvalue jv_str(jstr s) {
    return (jvalue){.kind = JV_STR, .u.s = s};
}
jvalue jv_strdup(jinja *j, const char *s, size_t n);
jvalue jv_list(jinja *j, size_t n, bool tuple); /* n items, set by the caller */
jvalue jv_dict(jinja *j);
void jdict_set(jinja *j, jdict *d, jvalue key, jvalue val);
jvalue *jdict_get(const jdict *d, jvalue key);
jvalue *jdict_get_str(const jdict *d, const char *key);
/* The integer value of an int or bool (0 for anything else). */
static inline int64_t jv_ival(jvalue v) {
    return v.kind == JV_INT ? v.u.i : v.kind == JV_BOOL ? (int64_t)v.u.b : 0;
}
const char *jv_typename(jvalue v);
bool jv_truthy(jvalue v);
bool jv_is_number(jvalue v);
double jv_num(jvalue v);
/* Python's str(v) and repr(v), appended to b. */
void jv_write_str(jinja *j, jbuf *b, jvalue v, size_t pos);
void jv_write_repr(jinja *j, jbuf *b, jvalue v, size_t pos, int depth);
jstr jv_to_str(jinja *j, jvalue v, size_t pos);
bool jv_eq(jinja *j, jvalue a, jvalue b, int depth);
/* a < b as Python orders them: -1, 0, 1; fails on types Python can't order. */
int jv_cmp(jinja *j, jvalue a, jvalue b, size_t pos, int depth);
/* json.dumps(v, ensure_ascii, indent (< 0: none), sort_keys) */
void jv_write_json(jinja *j, jbuf *b, jvalue v, size_t pos, bool ascii, int indent, bool sort_keys,
                   int depth);
jvalue jv_parse_json(jinja *j, const char *s, size_t n);
void jwrite_float(jbuf *b, jinja *j, double f);

/* UTF-8 */
size_t ju8_len(jstr s);                                 /* code points */
size_t ju8_next(const char *s, size_t n, size_t i);     /* byte offset after the char at i */
size_t ju8_space_at(const char *s, size_t n, size_t i); /* bytes of a white space char at i, or 0 */
size_t ju8_space_before(const char *s, size_t i); /* bytes of a white space char ending at i */
jstr ju8_strip(jstr s, bool left, bool right, const jstr *chars);

/* filters, tests, methods, functions: args/kwargs already evaluated */
typedef struct jargs {
    jvalue *pos;
    size_t n;
    jstr *kwn;
    jvalue *kw;
    size_t n_kw;
    size_t at; /* source offset of the call, for messages */
} jargs;
jvalue jinja_filter(jinja *j, jstr name, jvalue v, const jargs *a);
/* markupsafe's escape(): & < > " ' as HTML entities. */
jstr jhtml_escape(jinja *j, jstr s);
bool jinja_test(jinja *j, jstr name, jvalue v, const jargs *a);
jvalue jinja_method(jinja *j, jmethod *m, const jargs *a);
jvalue jinja_func(jinja *j, int func, const jargs *a);
bool jinja_has_method(jvalue obj, jstr name);
/* Iterates v as a for loop would: lists and tuples, dict keys, string
 * characters; undefined is empty. */
jlist *jinja_iter(jinja *j, jvalue v, size_t pos);
jvalue jinja_getattr(jinja *j, jvalue obj, jstr name, size_t pos);
jvalue jinja_getitem(jinja *j, jvalue obj, jvalue key, size_t pos);
jvalue jinja_call_macro(jinja *j, const jnode *m, const jargs *a);

#endif /* CELLM_JINJA_INTERNAL_H */

/*
 * json.h — a small JSON reader and writer for the library: a tree of
 * nodes built from JSON text (JSON Schemas, tool definitions, chat
 * messages, a model's tool calls) and compact JSON text written back from
 * it. Every input is untrusted: nesting is bounded and every error names
 * the byte where the text went wrong.
 */
#ifndef CELLM_JSON_H
#define CELLM_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "base/util.h"

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUM, JSON_STR, JSON_ARR, JSON_OBJ } json_type;

typedef struct json_node {
    json_type type;
    bool b;
    double num;
    const char *raw; /* a number's text in the source (which must outlive the tree) */
    size_t raw_len;
    char *str; /* a string's value (NUL-terminated; may hold NULs: str_len) */
    size_t str_len;
    struct json_node **kids; /* array items or object values */
    char **keys;             /* object keys */
    size_t n, cap;
} json_node;

/* Parses one JSON value from s[0..n), after leading white space; *end
 * (may be NULL) gets the offset just past it and the white space after.
 * NULL on error, with err (CELLM_ERR_FORMAT) saying "<what>: <problem> at
 * byte N". Values nested deeper than max_depth are an error. Free the tree
 * with json_free; number nodes point into s. */
json_node *json_parse(const char *s, size_t n, size_t *end, int max_depth, const char *what,
                      cellm_error *err);
void json_free(json_node *j);

/* The member `key` of object o; NULL when o is not an object or lacks it. */
const json_node *json_get(const json_node *o, const char *key);

/* A growing NUL-terminated text; zero-initialise it, free(b.s) after. */
typedef struct json_buf {
    char *s;
    size_t n, cap;
    size_t max; /* bytes at most (0: no limit); past it the buffer is full */
    bool full;  /* an allocation failed or max was passed: the text is cut */
} json_buf;

void json_buf_add(json_buf *b, const char *p, size_t n);
void json_buf_str(json_buf *b, const char *s);
/* s[0..n) as a JSON string literal. */
void json_buf_quote(json_buf *b, const char *s, size_t n);

/* A value as compact JSON text. */
void json_write(json_buf *b, const json_node *j);

#endif /* CELLM_JSON_H */

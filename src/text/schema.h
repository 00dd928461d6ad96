/*
 * schema.h — JSON Schema to GBNF: the grammar of the JSON texts that
 * validate against a schema (docs/grammar.md lists what is honoured).
 */
#ifndef CELLM_SCHEMA_H
#define CELLM_SCHEMA_H

#include <stddef.h>

#include "base/util.h"

/* Compiles `schema` (len bytes of JSON) to GBNF text in *out (*out_len
 * bytes, NUL-terminated; free() it). CELLM_ERR_FORMAT naming the problem. */
cellm_status schema_to_gbnf(const char *schema, size_t len, char **out, size_t *out_len,
                            cellm_error *err);

/* Compiles n schemas into one GBNF text without a root rule (the caller
 * writes it): schema k's start rule is named r<tops[k]>; the JSON rules
 * (value, object, string, number, ws, ...) are there once. */
cellm_status schema_to_gbnf_rules(const char *const *schemas, const size_t *lens, int n, int *tops,
                                  char **out, size_t *out_len, cellm_error *err);

#endif /* CELLM_SCHEMA_H */

/*
 * grammar_internal.h — the compiled grammar's layout, shared by the
 * compiler (grammar.c) and the matcher (grammar_run.c).
 */
#ifndef CELLM_GRAMMAR_INTERNAL_H
#define CELLM_GRAMMAR_INTERNAL_H

#include "text/grammar.h"

enum { G_END = 0, G_CHAR = 1, G_REF = 2 };

struct grammar {
    int32_t *code; /* the elements of every alternative, each ending in G_END */
    size_t n_code;
    int32_t *alt_start; /* alternative a starts at code[alt_start[a]] */
    int32_t *rule_alt;  /* rule r's alternatives: rule_alt[r] .. rule_alt[r + 1] */
    int32_t n_rules;
    int32_t root;
};

/* The position of the element after the one at pos. */
int32_t grammar_next(const grammar *g, int32_t pos);

/* Decodes one UTF-8 character at s[*i] (n bytes in all) and moves *i past
 * it; -1 if the bytes are not valid UTF-8. */
int32_t grammar_utf8_next(const char *s, size_t n, size_t *i);

#endif /* CELLM_GRAMMAR_INTERNAL_H */

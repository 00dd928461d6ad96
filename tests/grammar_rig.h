/*
 * grammar_rig.h — helpers the grammar tests share (test_grammar.c,
 * test_tools.c): a vocabulary of single bytes, and matching a whole text
 * against a compiled grammar. Include after cmocka.h.
 */
#ifndef CELLM_GRAMMAR_RIG_H
#define CELLM_GRAMMAR_RIG_H

#include "text/grammar.h"

/* The vocabulary of single bytes 1..127, for matching whole strings. */
static inline grammar_vocab *byte_vocab(void) {
    static char bytes[128];
    const char *pieces[128];
    size_t lens[128];
    for (int i = 0; i < 128; i++) {
        bytes[i] = (char)i;
        pieces[i] = &bytes[i];
        lens[i] = i > 0;
    }
    grammar_vocab *v = NULL;
    assert_int_equal(grammar_vocab_create(pieces, lens, 128, &v, NULL), CELLM_OK);
    return v;
}

/* 1: text is a whole sentence; 0: a prefix only; -1: not even a prefix. */
static inline int match(const grammar *g, const grammar_vocab *v, const char *text) {
    grammar_state *s = NULL;
    assert_int_equal(grammar_state_create(g, v, &s, NULL), CELLM_OK);
    int r = grammar_state_accept(s, text, strlen(text)) ? grammar_state_complete(s) : -1;
    grammar_state_free(s);
    return r;
}

#endif /* CELLM_GRAMMAR_RIG_H */

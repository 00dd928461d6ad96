/*
 * grammar.h — constrained sampling: a GBNF-like grammar (llama.cpp's
 * dialect: rules, `|`, groups, `?` `*` `+` `{m,n}`, string literals,
 * character classes, `.`) compiled to a flat program, and a per-request
 * state that says which tokens can continue the text it has seen.
 *
 * The state is a set of stacks of grammar positions (a pushdown automaton
 * run on all paths at once); stacks are hash-consed nodes, so stacks that
 * share a tail share memory and a set of stacks is a short sorted list of
 * ids. The tokens a state allows are found by walking a prefix tree of the
 * vocabulary's token bytes (grammar_vocab, built once per model) against
 * the set, pruning every subtree whose prefix no stack accepts; the masks
 * of recent states are cached, since generation keeps returning to the
 * same state (inside a string, between digits).
 *
 * Text is matched by code point; a token may end inside a UTF-8 character,
 * which the next token completes. Left recursion, rules that can never
 * finish and over-large grammars are refused when the grammar is
 * compiled; stack depth and the stack set are bounded at run time (deeper
 * nesting is simply not allowed), so no grammar can take unbounded memory
 * or time.
 */
#ifndef CELLM_GRAMMAR_H
#define CELLM_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

#define GRAMMAR_MAX_DEPTH 512      /* stack frames of one stack */
#define GRAMMAR_MAX_STACKS 256     /* stacks in one state */
#define GRAMMAR_MAX_CODE (1 << 20) /* program size, in int32 */
#define GRAMMAR_MAX_RULES 65536
#define GRAMMAR_MAX_REPEAT 1000 /* m and n of x{m,n} */

/* A compiled grammar: immutable, shareable between threads. */
typedef struct grammar grammar;

/* Compiles GBNF text (len bytes) whose start rule is "root".
 * CELLM_ERR_FORMAT with the line and column of a syntax error, the name of
 * an undefined, left-recursive or never-finishing rule. */
cellm_status grammar_parse(const char *text, size_t len, grammar **out, cellm_error *err);
void grammar_free(grammar *g);

/* The prefix tree of a vocabulary: token i's bytes are pieces[i]
 * (lens[i] bytes; tokens of no bytes are never allowed by a mask). */
typedef struct grammar_vocab grammar_vocab;
cellm_status grammar_vocab_create(const char *const *pieces, const size_t *lens, int32_t n_vocab,
                                  grammar_vocab **out, cellm_error *err);
void grammar_vocab_free(grammar_vocab *v);
int32_t grammar_vocab_n(const grammar_vocab *v);

/* A request's position in a grammar. Not thread-safe; `g` and `v` must
 * outlive it. */
typedef struct grammar_state grammar_state;
cellm_status grammar_state_create(const grammar *g, const grammar_vocab *v, grammar_state **out,
                                  cellm_error *err);
void grammar_state_free(grammar_state *s);

/* The tokens that can continue the text: bit t of bits[t / 32] is set when
 * token t's bytes keep the text a prefix of the grammar's language.
 * Returns a pointer to ceil(n_vocab / 32) words owned by `s`, valid until
 * the next call on `s`. */
const uint32_t *grammar_state_mask(grammar_state *s);

/* True when the text so far is a whole sentence of the grammar (the end of
 * text may come now). */
bool grammar_state_complete(const grammar_state *s);

/* True when nothing can continue the text (complete or not). */
bool grammar_state_dead_end(const grammar_state *s);

/* Advances over n bytes; false (state unchanged) when they cannot
 * continue the text. */
bool grammar_state_accept(grammar_state *s, const char *bytes, size_t n);

/* True when the n bytes (n > 0) can continue the text; the state does
 * not change. */
bool grammar_state_allows(grammar_state *s, const char *bytes, size_t n);

/* The JSON grammar of json_object mode: one JSON object, any members. */
extern const char grammar_json_object_gbnf[];

#endif /* CELLM_GRAMMAR_H */

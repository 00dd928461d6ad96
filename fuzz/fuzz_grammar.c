/*
 * fuzz_grammar.c — libFuzzer target for structured output: the GBNF
 * compiler and the JSON-Schema compiler, then the grammar run over text.
 * The first byte picks the input's kind (even: GBNF, odd: a JSON Schema);
 * the rest up to a NUL byte is the grammar or schema, and what follows the
 * NUL is text fed to the compiled grammar byte by byte, with a mask over a
 * small vocabulary at each step. Compiling must succeed or fail with a
 * message (a pattern the schema compiler passes through may be refused
 * by the GBNF compiler); the run must stay within the state bounds and never crash.
 * Seeds: fuzz/corpus/grammar/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/grammar.h"
#include "text/schema.h"

static grammar_vocab *vocab(void) {
    static grammar_vocab *v;
    if (v) return v;
    static const char *const pieces[] = {
        "{", "}", "\"", ":",        ",",    " ",    "a", "1",    "ab",   "[",  "]",
        "-", ".", "\n", "\xc3\xa9", "\xc3", "\xa9", "e", "true", "null", "\\", "0"};
    enum { N = sizeof pieces / sizeof pieces[0] };
    size_t lens[N];
    for (int i = 0; i < N; i++) lens[i] = strlen(pieces[i]);
    if (grammar_vocab_create(pieces, lens, N, &v, NULL) != CELLM_OK) abort();
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *in = (const char *)data + 1;
    size_t n = size - 1;
    const char *nul = memchr(in, '\0', n);
    size_t glen = nul ? (size_t)(nul - in) : n;
    const char *text = nul ? nul + 1 : in + n;
    size_t tlen = nul ? n - glen - 1 : 0;
    cellm_error err;
    err.msg[0] = '\0';
    char *gbnf = NULL;
    size_t gn = 0;
    if (data[0] & 1) {
        if (schema_to_gbnf(in, glen, &gbnf, &gn, &err) != CELLM_OK) {
            if (err.msg[0] == '\0' || gbnf) abort();
            return 0;
        }
        in = gbnf;
        glen = gn;
    }
    grammar *g = NULL;
    err.msg[0] = '\0';
    cellm_status st = grammar_parse(in, glen, &g, &err);
    free(gbnf);
    if (st != CELLM_OK) {
        if (err.msg[0] == '\0' || g) abort();
        return 0;
    }
    grammar_state *s = NULL;
    if (grammar_state_create(g, vocab(), &s, NULL) == CELLM_OK) {
        for (size_t i = 0; i < tlen && i < 256; i++) {
            const uint32_t *bits = grammar_state_mask(s);
            bool any = bits[0] != 0;
            bool ok = grammar_state_accept(s, text + i, 1);
            if (ok && !any && (unsigned char)text[i] < 0x80 &&
                strchr("{}\":, a1[]-.\ne\\0", text[i]))
                abort(); /* a one-byte token the mask refused was accepted */
            if (!ok) break;
        }
        grammar_state_free(s);
    }
    grammar_free(g);
    return 0;
}

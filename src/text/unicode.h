/*
 * unicode.h — the little Unicode the tokenizer needs: UTF-8 decoding in the
 * two flavours the reference tokenizers use, UTF-8 encoding, code point
 * classes for the pre-tokenizer rules (\p{L}, \p{N}, \p{P}, \s, ...), and
 * GPT-2's byte-to-unicode map for byte-level BPE.
 *
 * The class table is generated data (src/text/unicode_data.c, written by
 * scripts/gen_unicode.py from Python's unicodedata); nothing here needs a
 * Unicode library at run time. All functions are pure and thread-safe.
 */
#ifndef CELLM_UNICODE_H
#define CELLM_UNICODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Class bits of unicode_ranges[] entries (one general-category group each,
 * plus white space). Keep in sync with scripts/gen_unicode.py. */
enum {
    UCLASS_NUMBER = 0x01, /* \p{N} */
    UCLASS_LETTER = 0x02, /* \p{L} */
    UCLASS_PUNCT = 0x04,  /* \p{P} */
    UCLASS_SYMBOL = 0x08, /* \p{S} */
    UCLASS_MARK = 0x10,   /* \p{M} */
    UCLASS_SEP = 0x20,    /* \p{Z} */
    UCLASS_OTHER = 0x40,  /* \p{C}, including unassigned code points */
    UCLASS_SPACE = 0x80,  /* White_Space, what regex \s matches */
};

#define UNICODE_MAX_CP 0x10FFFFu
#define UNICODE_REPLACEMENT 0xFFFDu

/* Generated table: sorted, entry = (first code point << 8) | class bits. */
extern const uint32_t unicode_ranges[];
extern const size_t unicode_ranges_count;
/* Generated table: class bits of U+0000..U+00FF. */
extern const uint8_t unicode_latin1[256];
/* The Unicode version the table was generated from, e.g. "14.0.0". */
extern const char unicode_data_version[];

/* Class bits of code point `cp`; 0 for values past U+10FFFF. */
unsigned unicode_class(uint32_t cp);

/* Number of bytes a UTF-8 sequence starting with byte `b` claims, by its
 * top four bits only (1 for ASCII and for stray continuation bytes). This
 * is how SentencePiece-style tokenizers cut text into characters. */
static inline size_t utf8_seq_len(uint8_t b) {
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[b >> 4];
}

/* Decodes one code point at s[0..n) the lenient way llama.cpp does before
 * pre-tokenizing: the lead byte fixes the length, continuation bytes must
 * be 10xxxxxx, but overlong forms and surrogates are accepted. A malformed
 * or truncated sequence yields U+FFFD and consumes one byte. Values above
 * U+10FFFF (from F4 90.. to F7 ..) are treated as malformed. Returns the
 * code point; *used gets the bytes consumed (>= 1). Needs n >= 1. */
uint32_t utf8_decode_lenient(const uint8_t *s, size_t n, size_t *used);

/* What utf8_check found at the start of a byte string. */
typedef enum utf8_status {
    UTF8_VALID,      /* one whole character of *len bytes */
    UTF8_INCOMPLETE, /* all n bytes are a valid start that more bytes could finish */
    UTF8_INVALID,    /* *len bytes (>= 1) are the maximal malformed start to replace */
} utf8_status;

/* Checks the character at s[0..n) strictly (RFC 3629: no overlong forms,
 * no surrogates, nothing past U+10FFFF). For UTF8_INVALID, *len is the
 * "maximal subpart" that one U+FFFD replaces, as Python's and the WHATWG
 * decoders count it. Needs n >= 1. */
utf8_status utf8_check(const uint8_t *s, size_t n, size_t *len);

/* Writes `cp` (<= U+10FFFF; surrogates are written as their 3 bytes) as
 * UTF-8 into out[0..4); returns the byte count. */
size_t utf8_encode(uint32_t cp, uint8_t out[4]);

/* GPT-2's reversible byte-to-unicode map: byte b is shown as code point
 * unicode_byte_to_cp(b) (printable Latin-1 bytes map to themselves, the
 * rest to U+0100 and up). */
uint32_t unicode_byte_to_cp(uint8_t b);
/* The inverse: the byte that code point `cp` stands for, or -1. */
int unicode_cp_to_byte(uint32_t cp);

#endif /* CELLM_UNICODE_H */

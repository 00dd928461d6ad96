/*
 * unicode.c — UTF-8 decoding and encoding, code point classes over the
 * generated range table, and GPT-2's byte-to-unicode map. See unicode.h.
 */
#include "text/unicode.h"

unsigned unicode_class(uint32_t cp) {
    if (cp < 256) return unicode_latin1[cp];
    if (cp > UNICODE_MAX_CP) return 0;
    /* Last entry whose first code point is <= cp. */
    size_t lo = 0, hi = unicode_ranges_count;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((unicode_ranges[mid] >> 8) <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return unicode_ranges[lo] & 0xFFu;
}

uint32_t utf8_decode_lenient(const uint8_t *s, size_t n, size_t *used) {
    uint8_t b = s[0];
    *used = 1;
    if (b < 0x80) return b;
    size_t len;
    uint32_t cp;
    if (b < 0xC0) return UNICODE_REPLACEMENT; /* stray continuation byte */
    if (b < 0xE0) {
        len = 2;
        cp = b & 0x1Fu;
    } else if (b < 0xF0) {
        len = 3;
        cp = b & 0x0Fu;
    } else if (b < 0xF8) {
        len = 4;
        cp = b & 0x07u;
    } else {
        return UNICODE_REPLACEMENT;
    }
    if (n < len) return UNICODE_REPLACEMENT;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0u) != 0x80u) return UNICODE_REPLACEMENT;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    if (cp > UNICODE_MAX_CP) return UNICODE_REPLACEMENT;
    *used = len;
    return cp;
}

utf8_status utf8_check(const uint8_t *s, size_t n, size_t *len) {
    uint8_t b = s[0];
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    *len = 1;
    if (b < 0x80) return UTF8_VALID;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0)
            lo = 0xA0; /* no overlongs */
        else if (b == 0xED)
            hi = 0x9F; /* no surrogates */
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0)
            lo = 0x90; /* no overlongs */
        else if (b == 0xF4)
            hi = 0x8F; /* nothing past U+10FFFF */
    } else {
        return UTF8_INVALID;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n) return UTF8_INCOMPLETE;
        uint8_t c = s[i];
        bool ok = i == 1 ? (c >= lo && c <= hi) : (c & 0xC0u) == 0x80u;
        if (!ok) {
            *len = i;
            return UTF8_INVALID;
        }
    }
    *len = need;
    return UTF8_VALID;
}

size_t utf8_encode(uint32_t cp, uint8_t out[4]) {
    if (cp < 0x80) {
        out[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (uint8_t)(0xC0 | (cp >> 6));
        out[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (uint8_t)(0xE0 | (cp >> 12));
        out[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | ((cp >> 18) & 0x07));
    out[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2 keeps the printable bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF as
 * themselves and numbers the other 68 bytes, in byte order, from U+0100. */
static bool byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t unicode_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    if (b <= 0x20) return 0x100u + b;          /* 33 bytes: U+0100..U+0120 */
    if (b <= 0xA0) return 0x121u + (b - 0x7F); /* 34 bytes: U+0121..U+0142 */
    return 0x143u;                             /* 0xAD */
}

int unicode_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp <= 0x120) return (int)(cp - 0x100);
    if (cp <= 0x142) return (int)(cp - 0x121 + 0x7F);
    if (cp == 0x143) return 0xAD;
    return -1;
}

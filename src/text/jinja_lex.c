/*
 * jinja_lex.c — turns a chat template into tokens: text between tags, and
 * the expression tokens inside {{ }} and {% %}; comments disappear here.
 *
 * Whitespace is handled as transformers configures Jinja2: trim_blocks (the
 * first newline after a block or comment tag goes), lstrip_blocks (spaces and
 * tabs from the start of a line up to a block or comment tag go), and the
 * explicit controls: `-` next to a tag's delimiter strips all white space on
 * that side, `+` turns trim/lstrip off for that tag. Newlines were already
 * normalised to \n and one trailing newline dropped, as Jinja2 does.
 */
#include <stdlib.h>
#include <string.h>

#include "text/jinja_internal.h"

static void push(jinja *j, jtok t) {
    if (j->n_toks == j->cap_toks) {
        size_t cap = j->cap_toks ? j->cap_toks * 2 : 256;
        jtok *n = jalloc_array(j, cap, sizeof *n);
        if (j->n_toks) memcpy(n, j->toks, j->n_toks * sizeof *n);
        j->toks = n;
        j->cap_toks = cap;
    }
    j->toks[j->n_toks++] = t;
}

static bool is_hspace(char c) {
    return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

/* Where a run of (Unicode) white space ending at `end` (and not before
 * `start`) begins. */
static size_t rstrip_at(const jinja *j, size_t start, size_t end) {
    while (end > start) {
        size_t k = ju8_space_before(j->src, end);
        if (!k || end - k < start) break;
        end -= k;
    }
    return end;
}

static size_t lstrip_at(const jinja *j, size_t pos) {
    size_t k;
    while (pos < j->src_len && (k = ju8_space_at(j->src, j->src_len, pos)) != 0) pos += k;
    return pos;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes a string literal's body the way Jinja2 does (Python's
 * unicode-escape on the literal, non-ASCII characters kept as they are). */
static jstr unescape(jinja *j, const char *s, size_t n) {
    if (!memchr(s, '\\', n)) return jstr_c(s, n);
    char *o = jalloc(j, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            o[k++] = s[i];
            continue;
        }
        char c = s[++i];
        uint32_t cp;
        int digits = 0;
        switch (c) {
        case 'n': o[k++] = '\n'; continue;
        case 't': o[k++] = '\t'; continue;
        case 'r': o[k++] = '\r'; continue;
        case '\\': o[k++] = '\\'; continue;
        case '\'': o[k++] = '\''; continue;
        case '"': o[k++] = '"'; continue;
        case 'a': o[k++] = '\a'; continue;
        case 'b': o[k++] = '\b'; continue;
        case 'f': o[k++] = '\f'; continue;
        case 'v': o[k++] = '\v'; continue;
        case '\n': continue; /* a line continuation */
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (c >= '0' && c <= '7') {
                cp = 0;
                int m = 0;
                while (m < 3 && i < n && s[i] >= '0' && s[i] <= '7')
                    cp = cp * 8 + (uint32_t)(s[i++] - '0'), m++;
                i--;
                goto put;
            }
            o[k++] = '\\';
            o[k++] = c;
            continue;
        }
        cp = 0;
        for (int m = 0; m < digits; m++) {
            int h = i + 1 + (size_t)m < n ? hexval(s[i + 1 + m]) : -1;
            if (h < 0)
                jfail(j, CELLM_ERR_FORMAT, JPOS_NONE, "truncated \\%c escape in a string", c);
            cp = cp * 16 + (uint32_t)h;
        }
        i += (size_t)digits;
        if (cp > 0x10FFFF)
            jfail(j, CELLM_ERR_FORMAT, JPOS_NONE, "escape beyond U+10FFFF in a string");
    put:
        if (cp < 0x80) {
            o[k++] = (char)cp;
        } else if (cp < 0x800) {
            o[k++] = (char)(0xC0 | (cp >> 6));
            o[k++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            o[k++] = (char)(0xE0 | (cp >> 12));
            o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            o[k++] = (char)(0x80 | (cp & 0x3F));
        } else {
            o[k++] = (char)(0xF0 | (cp >> 18));
            o[k++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            o[k++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            o[k++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return jstr_c(o, k);
}

static bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

/* Digits with optional '_' separators from *p; returns false if none. */
static bool digits(const char *s, size_t n, size_t *p) {
    size_t i = *p;
    if (i >= n || !is_digit(s[i])) return false;
    while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1])))) i++;
    *p = i;
    return true;
}

static void lex_number(jinja *j, size_t *pp) {
    const char *s = j->src;
    size_t n = j->src_len, start = *pp, i = start;
    digits(s, n, &i);
    bool is_float = false;
    size_t k = i;
    if (k < n && s[k] == '.' && k + 1 < n && is_digit(s[k + 1])) {
        k++;
        digits(s, n, &k);
        i = k;
        is_float = true;
    }
    k = i;
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        k++;
        if (k < n && (s[k] == '+' || s[k] == '-')) k++;
        if (digits(s, n, &k)) {
            i = k;
            is_float = true;
        }
    }
    char buf[128];
    size_t m = 0;
    for (size_t q = start; q < i; q++)
        if (s[q] != '_') {
            if (m + 1 >= sizeof buf) jfail(j, CELLM_ERR_FORMAT, start, "number literal too long");
            buf[m++] = s[q];
        }
    buf[m] = '\0';
    jtok t = {.pos = start, .text = jstr_c(s + start, i - start)};
    if (is_float) {
        t.kind = T_FLOAT;
        t.f = strtod(buf, NULL);
    } else {
        t.kind = T_INT;
        int64_t v = 0;
        for (size_t q = 0; q < m; q++) {
            if (v > (INT64_MAX - (buf[q] - '0')) / 10)
                jfail(j, CELLM_ERR_UNSUPPORTED, start, "integer literal beyond 64 bits");
            v = v * 10 + (buf[q] - '0');
        }
        t.i = v;
    }
    push(j, t);
    *pp = i;
}

/* The tokens inside a tag from *pp up to its closing delimiter; returns
 * with *pp after the delimiter and *strip and *plus telling its sign. */
static void lex_tag(jinja *j, size_t *pp, bool block, size_t tag_pos, bool *strip, bool *plus) {
    const char *s = j->src;
    const size_t n = j->src_len;
    size_t i = *pp;
    int depth = 0;
    const char close = block ? '%' : '}';
    for (;;) {
        while (i < n && (is_hspace(s[i]) || s[i] == '\n')) i++;
        if (i >= n)
            jfail(j, CELLM_ERR_FORMAT, tag_pos, "unterminated '%s' tag", block ? "{%" : "{{");
        if (depth == 0) {
            size_t k = i;
            char sign = 0;
            if (s[k] == '-' || (s[k] == '+' && block)) sign = s[k++];
            if (k + 1 < n && s[k] == close && s[k + 1] == '}') {
                push(j, (jtok){.kind = block ? T_BLOCK_END : T_VAR_END, .pos = i});
                *strip = sign == '-';
                *plus = sign == '+';
                *pp = k + 2;
                return;
            }
        }
        char c = s[i];
        if (is_name_start(c)) {
            size_t st = i;
            while (i < n && (is_name_start(s[i]) || is_digit(s[i]))) i++;
            push(j, (jtok){.kind = T_NAME, .pos = st, .text = jstr_c(s + st, i - st)});
        } else if (is_digit(c)) {
            lex_number(j, &i);
        } else if (c == '\'' || c == '"') {
            size_t st = i++;
            while (i < n && s[i] != c) i += s[i] == '\\' && i + 1 < n ? 2 : 1;
            if (i >= n) jfail(j, CELLM_ERR_FORMAT, st, "unterminated string literal");
            push(j,
                 (jtok){.kind = T_STRING, .pos = st, .text = unescape(j, s + st + 1, i - st - 1)});
            i++;
        } else {
            static const char *const two[] = {"//", "**", "==", "!=", ">=", "<="};
            size_t len = 0;
            for (size_t q = 0; q < 6 && !len; q++)
                if (i + 1 < n && s[i] == two[q][0] && s[i + 1] == two[q][1]) len = 2;
            if (!len && strchr("+-*/%~[](){}<>=.:|,;", c) && c) len = 1;
            if (!len) {
                if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7f)
                    jfail(j, CELLM_ERR_FORMAT, i, "unexpected byte 0x%02x in a tag",
                          (unsigned)(unsigned char)c);
                jfail(j, CELLM_ERR_FORMAT, i, "unexpected character '%c' in a tag", c);
            }
            if (c == '(' || c == '[' || c == '{') depth++;
            if ((c == ')' || c == ']' || c == '}') && depth > 0) depth--;
            push(j, (jtok){.kind = T_OP, .pos = i, .text = jstr_c(s + i, len)});
            i += len;
        }
    }
}

/* Matches `{%[-+]? *NAME *[-+]?%}` at i; returns the end offset or 0. */
static size_t match_simple_tag(const jinja *j, size_t i, const char *name, char *lsign,
                               char *rsign) {
    const char *s = j->src;
    size_t n = j->src_len, L = strlen(name);
    if (i + 2 > n || s[i] != '{' || s[i + 1] != '%') return 0;
    i += 2;
    *lsign = i < n && (s[i] == '-' || s[i] == '+') ? s[i++] : 0;
    while (i < n && (is_hspace(s[i]) || s[i] == '\n')) i++;
    if (i + L > n || memcmp(s + i, name, L) != 0) return 0;
    i += L;
    while (i < n && (is_hspace(s[i]) || s[i] == '\n')) i++;
    *rsign = i < n && (s[i] == '-' || s[i] == '+') ? s[i++] : 0;
    if (i + 2 > n || s[i] != '%' || s[i + 1] != '}') return 0;
    return i + 2;
}

void jinja_lex(jinja *j) {
    const char *s = j->src;
    const size_t n = j->src_len;
    size_t pos = 0;
    for (;;) {
        size_t t = pos;
        while (t + 1 < n &&
               !(s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')))
            t++;
        if (t + 1 >= n) t = n;
        size_t dend = t;
        char kind = t < n ? s[t + 1] : 0;
        char sign =
            t + 2 < n && (s[t + 2] == '-' || (s[t + 2] == '+' && kind != '{')) ? s[t + 2] : 0;
        if (kind && sign == '-') {
            dend = rstrip_at(j, pos, t);
        } else if (kind && kind != '{' && sign != '+') {
            /* lstrip_blocks: only white space between the line start and the tag. */
            size_t ls = t;
            while (ls > pos && s[ls - 1] != '\n') ls--;
            bool at_line_start = ls > pos || pos == 0 || s[pos - 1] == '\n';
            bool blank = true;
            for (size_t q = ls; q < t && blank; q++) blank = is_hspace(s[q]);
            if (at_line_start && blank) dend = ls;
        }
        if (dend > pos)
            push(j, (jtok){.kind = T_DATA, .pos = pos, .text = jstr_c(s + pos, dend - pos)});
        if (t >= n) break;
        size_t i = t + 2 + (sign ? 1 : 0);
        bool strip = false, plus = false;
        if (kind == '#') {
            size_t e = i;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) jfail(j, CELLM_ERR_FORMAT, t, "unterminated comment");
            strip = e > i && s[e - 1] == '-';
            plus = e > i && s[e - 1] == '+';
            pos = e + 2;
            if (strip)
                pos = lstrip_at(j, pos);
            else if (!plus && pos < n && s[pos] == '\n')
                pos++;
            continue;
        }
        char ls, rs;
        size_t e = kind == '%' ? match_simple_tag(j, t, "raw", &ls, &rs) : 0;
        if (e) {
            /* {% raw %}: everything up to {% endraw %} is text. */
            size_t body = e;
            if (rs == '-')
                body = lstrip_at(j, body);
            else if (rs != '+' && body < n && s[body] == '\n')
                body++;
            size_t q = body, end = 0;
            char els = 0, ers = 0;
            for (; q + 1 < n; q++)
                if (s[q] == '{' && s[q + 1] == '%' &&
                    (end = match_simple_tag(j, q, "endraw", &els, &ers)))
                    break;
            if (!end) jfail(j, CELLM_ERR_FORMAT, t, "'raw' without 'endraw'");
            size_t bend = els == '-' ? rstrip_at(j, body, q) : q;
            if (bend > body)
                push(j, (jtok){.kind = T_DATA, .pos = body, .text = jstr_c(s + body, bend - body)});
            pos = end;
            if (ers == '-')
                pos = lstrip_at(j, pos);
            else if (ers != '+' && pos < n && s[pos] == '\n')
                pos++;
            continue;
        }
        bool block = kind == '%';
        push(j, (jtok){.kind = block ? T_BLOCK_BEGIN : T_VAR_BEGIN, .pos = t});
        lex_tag(j, &i, block, t, &strip, &plus);
        pos = i;
        if (strip)
            pos = lstrip_at(j, pos);
        else if (block && !plus && pos < n && s[pos] == '\n')
            pos++;
    }
    push(j, (jtok){.kind = T_EOF, .pos = n});
}

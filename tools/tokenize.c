/*
 * tokenize.c — `cellm tokenize MODEL TEXT`: shows how a model's tokenizer
 * cuts a text, one token per line (id and piece), or just the ids.
 * MODEL is a GGUF path; only its tokenizer metadata is read.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gguf.h"
#include "tokenizer.h"

static void usage(FILE *out) {
    fprintf(out, "usage: cellm tokenize MODEL TEXT [--ids] [--special] [--no-bos]\n"
                 "  --ids       print the ids only, on one line\n"
                 "  --special   recognise special tokens written in TEXT (<|im_start|>, <bos>)\n"
                 "  --no-bos    do not add the model's BOS/EOS tokens\n");
}

/* Prints bytes as a C-style quoted string: printable ASCII and valid
 * UTF-8 as is, everything else escaped, so every piece stays visible. */
static void print_quoted(const char *p, size_t n) {
    putchar('\'');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\r')
            fputs("\\r", stdout);
        else if (c == '\\' || c == '\'')
            printf("\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            printf("\\x%02x", c);
        else if (c >= 0x80) {
            size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            bool ok = len > 1 && i + len <= n;
            for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)p[i + k] & 0xC0) == 0x80;
            if (ok) {
                fwrite(p + i, 1, len, stdout);
                i += len - 1;
            } else {
                printf("\\x%02x", c);
            }
        } else
            putchar(c);
    }
    putchar('\'');
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    bool ids_only = false;
    unsigned flags = TOK_ADD_SPECIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--ids")) {
            ids_only = true;
        } else if (!strcmp(a, "--special")) {
            flags |= TOK_PARSE_SPECIAL;
        } else if (!strcmp(a, "--no-bos")) {
            flags &= ~(unsigned)TOK_ADD_SPECIAL;
        } else if (a[0] == '-' && a[1] == '-') {
            cli_error("tokenize: unknown option '%s'", a);
            usage(stderr);
            return 2;
        } else if (!model) {
            model = a;
        } else if (!text) {
            text = a;
        } else {
            cli_error("tokenize: one TEXT only (quote it)");
            return 2;
        }
    }
    if (!model || !text) {
        usage(stderr);
        return 2;
    }
    cellm_error err;
    err_clear(&err);
    gguf_file *f = NULL;
    tokenizer *t = NULL;
    tok_ids ids = {0};
    int rc = 1;
    if (gguf_open(model, &f, &err) != CELLM_OK || tokenizer_load(f, &t, &err) != CELLM_OK ||
        tokenizer_encode(t, text, strlen(text), flags, &ids, &err) != CELLM_OK) {
        cli_error("%s: %s", model, err.msg);
        goto done;
    }
    if (ids_only) {
        for (size_t i = 0; i < ids.n; i++) printf("%s%d", i ? " " : "", ids.ids[i]);
        putchar('\n');
    } else {
        for (size_t i = 0; i < ids.n; i++) {
            size_t len;
            const char *p = tokenizer_piece(t, ids.ids[i], TOK_DECODE_SPECIAL, &len);
            printf("%6d ", ids.ids[i]);
            print_quoted(p, len);
            putchar('\n');
        }
        fprintf(stderr, "%zu tokens\n", ids.n);
    }
    rc = 0;
done:
    tok_ids_free(&ids);
    tokenizer_free(t);
    gguf_close(f);
    return rc;
}

/*
 * tokenize.c — `cellm tokenize MODEL TEXT`: shows how a model's tokenizer
 * cuts a text, one token per line (id and piece), or just the ids, or
 * (--count) how many and how fast. MODEL is a GGUF path; only its
 * tokenizer metadata is read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "store.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

static void usage(FILE *out) {
    fprintf(out, "usage: cellm tokenize MODEL (TEXT | -f FILE) [--ids] [--count] [--special] "
                 "[--no-bos]\n"
                 "  -f FILE     tokenize the contents of FILE ('-': standard input)\n"
                 "  --ids       print the ids only, on one line\n"
                 "  --count     print the number of tokens and the time taken only\n"
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
    const char *model = NULL, *text = NULL, *file = NULL;
    bool ids_only = false, count_only = false;
    unsigned flags = TOK_ADD_SPECIAL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--ids")) {
            ids_only = true;
        } else if (!strcmp(a, "--count")) {
            count_only = true;
        } else if (!strcmp(a, "-f")) {
            if (++i == argc) {
                cli_error("tokenize: -f needs a file");
                return 2;
            }
            file = argv[i];
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
        } else if (!text && !file) {
            text = a;
        } else {
            cli_error("tokenize: one TEXT only (quote it)");
            return 2;
        }
    }
    if (!model || (!text && !file) || (text && file)) {
        usage(stderr);
        return 2;
    }
    char *buf = NULL;
    size_t len = 0;
    if (file) {
        if (!(buf = cli_read_file(file, &len))) {
            cli_error("tokenize: cannot read %s", file);
            return 1;
        }
        text = buf;
    } else {
        len = strlen(text);
    }
    cellm_error err;
    err_clear(&err);
    gguf_file *f = NULL;
    tokenizer *t = NULL;
    tok_ids ids = {0};
    int rc = 1;
    struct timespec t0, t1;
    char path[4096];
    if (store_resolve(model, true, path, sizeof path, &err) != CELLM_OK ||
        gguf_open(path, &f, &err) != CELLM_OK || tokenizer_load(f, &t, &err) != CELLM_OK) {
        cli_error("%s: %s", model, err.msg);
        goto done;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (tokenizer_encode(t, text, len, flags, &ids, &err) != CELLM_OK) {
        cli_error("%s: %s", model, err.msg);
        goto done;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (count_only) {
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        printf("%zu tokens from %zu bytes in %.3f s (%.1f MB/s)\n", ids.n, len, s,
               s > 0 ? (double)len / s / 1e6 : 0.0);
    } else if (ids_only) {
        for (size_t i = 0; i < ids.n; i++) printf("%s%d", i ? " " : "", ids.ids[i]);
        putchar('\n');
    } else {
        for (size_t i = 0; i < ids.n; i++) {
            size_t plen;
            const char *p = tokenizer_piece(t, ids.ids[i], TOK_DECODE_SPECIAL, &plen);
            printf("%6d ", ids.ids[i]);
            print_quoted(p, plen);
            putchar('\n');
        }
        fprintf(stderr, "%zu tokens\n", ids.n);
    }
    rc = 0;
done:
    free(buf);
    tok_ids_free(&ids);
    tokenizer_free(t);
    gguf_close(f);
    return rc;
}

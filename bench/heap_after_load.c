/*
 * heap_after_load.c — the heap a model's load leaves allocated, split into
 * model_load (the GGUF index and the layer table) and tokenizer_load (the
 * vocabulary's tables), with mallinfo2() (glibc) before and after each:
 * bytes in use from the heap plus mmap'd chunks. Also the anonymous
 * resident memory (RssAnon) each step added, which leaves out pages
 * allocated but never touched. Not built by CMake; from the repository root
 * after building ./build:
 *
 *   cc -O2 -Isrc -Iinclude bench/heap_after_load.c build/libcellm.a -lm -lpthread \
 *      -o build/heap_after_load
 *   ./build/heap_after_load ~/.cache/cellm/models/gemma3-270m.gguf
 */
#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"
#include "text/tokenizer.h"

static double heap_mib(void) {
    struct mallinfo2 m = mallinfo2();
    return (double)(m.uordblks + m.hblkhd) / (1024.0 * 1024.0);
}

static double rss_anon_mib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "RssAnon:", 8)) sscanf(line + 8, "%ld", &kib);
    if (f) fclose(f);
    return (double)kib / 1024.0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    cellm_error err;
    model *m = NULL;
    tokenizer *t = NULL;
    double h0 = heap_mib(), r0 = rss_anon_mib();
    if (model_load(argv[1], &m, &err) != CELLM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    double h1 = heap_mib(), r1 = rss_anon_mib();
    if (tokenizer_load(m->file, &t, &err) != CELLM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        model_free(m);
        return 1;
    }
    double h2 = heap_mib(), r2 = rss_anon_mib();
    printf("%s: %d tokens\n", argv[1], tokenizer_n_vocab(t));
    printf("  model_load      heap %6.2f MiB  RssAnon +%6.2f MiB\n", h1 - h0, r1 - r0);
    printf("  tokenizer_load  heap %6.2f MiB  RssAnon +%6.2f MiB\n", h2 - h1, r2 - r1);
    printf("  both            heap %6.2f MiB  RssAnon +%6.2f MiB\n", h2 - h0, r2 - r0);
    tokenizer_free(t);
    model_free(m);
    return 0;
}

/*
 * main.c — the `cellm` command: dispatches to one subcommand per file.
 */
#include <stdio.h>
#include <string.h>

#include "bench_kernels.h"
#include "cellm.h"
#include "cli.h"
#include "convert.h"
#include "devices.h"
#include "inspect.h"
#include "quantize.h"
#include "run.h"
#include "serve.h"
#include "store.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"run", cmd_run, "chat with a model (default: smollm2-135m); sampling and stop flags"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (default: smollm2-135m)"},
    {"perplexity", cmd_perplexity, "perplexity of a model over a text file"},
    {"inspect", cmd_inspect, "describe a model file and the memory it needs"},
    {"pull", cmd_pull, "fetch a known model into the model store"},
    {"list", cmd_list, "list known models and the GGUF files in the store"},
    {"tokenize", cmd_tokenize, "show the token ids and pieces of a text"},
    {"bench", cmd_bench, "decode tokens/s with 1..16 sessions; the sampler's cost per token"},
    {"bench-kernels", cmd_bench_kernels, "measure matvec kernels against memory bandwidth"},
    {"devices", cmd_devices, "list the Vulkan GPUs found and what each can do"},
    {"quantize", cmd_quantize, "re-quantize a model file (Q4_0 ... Q8_0, Q4_K_M, Q5_K_M, Q6_K)"},
    {"convert", cmd_convert, "convert a Hugging Face checkpoint folder into a GGUF file"},
    {NULL, NULL, NULL},
};

static void usage(FILE *out) {
    fprintf(out,
            "cellm %s — on-device LLM inference and serving\n\n"
            "usage: cellm COMMAND [ARGS]\n\ncommands:\n",
            cellm_version());
    for (const command *c = commands; c->name; c++) fprintf(out, "  %-14s %s\n", c->name, c->help);
    fprintf(out, "  %-14s %s\n", "version", "print the version");
    fprintf(out, "\nMODEL is a path to a GGUF file or a name from the model store.\n"
                 "Run `cellm COMMAND --help` for a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("cellm %s\n", cellm_version());
        return 0;
    }
    for (const command *c = commands; c->name; c++)
        if (!strcmp(argv[1], c->name)) return c->fn(argc - 1, argv + 1);
    cli_error("unknown command '%s' (see `cellm --help`)", argv[1]);
    return 2;
}

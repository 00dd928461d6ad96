/*
 * run.c — `cellm run [MODEL]`: chat with a model (the default model when
 * none is named, fetched on first use). The forward pass does not exist yet,
 * so for now it resolves and checks the model, then says so and stops.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "gguf.h"
#include "store.h"

#define RUN_DEFAULT_MODEL "smollm2-135m"

int cmd_run(int argc, char **argv) {
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: cellm run [MODEL]\n\n"
                   "Starts an interactive chat with MODEL (a GGUF path or a model store name;\n"
                   "default %s, fetched on first use).\n",
                   RUN_DEFAULT_MODEL);
            return 0;
        }
        if (argv[i][0] == '-') {
            cli_error("run: unknown option '%s' (see `cellm run --help`)", argv[i]);
            return 2;
        }
        if (model) {
            cli_error("run: more than one model given ('%s', '%s')", model, argv[i]);
            return 2;
        }
        model = argv[i];
    }
    if (!model) model = RUN_DEFAULT_MODEL;
    char path[4096];
    cellm_error err;
    if (store_resolve(model, true, path, sizeof path, &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        return 1;
    }
    gguf_file *f;
    if (gguf_open(path, &f, &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        return 1;
    }
    gguf_str arch = {"?", 1};
    gguf_get_str(f, "general.architecture", &arch);
    fprintf(stderr,
            "cellm: %s (%.*s, %llu tensors) is ready, but chat is not implemented yet: "
            "the forward pass comes next. Try `cellm inspect %s`.\n",
            path, (int)arch.len, arch.ptr, (unsigned long long)f->n_tensors, model);
    gguf_close(f);
    return 1;
}

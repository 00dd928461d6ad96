/*
 * cli.h — the subcommands of the `cellm` command and what they share.
 * Each cmd_* takes the arguments after the subcommand name (argv[0] is the
 * subcommand) and returns the process exit status.
 */
#ifndef CELLM_CLI_H
#define CELLM_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

/* Prints "cellm: <message>" to stderr; the one error format of the tool. */
void cli_error(const char *fmt, ...) CELLM_PRINTF(1, 2);

/* Parses a byte size such as "512M", "2G", "1048576" (K, M, G are binary
 * multiples; a trailing "B"/"iB" is accepted). False on junk or overflow. */
bool cli_parse_size(const char *s, size_t *out);

/* Parses a non-negative decimal integer no larger than `max`. */
bool cli_parse_uint(const char *s, unsigned long long max, unsigned long long *out);

/* Parses a device name (CLI_DEVICES) for --device into a cellm_device. */
#define CLI_DEVICES "auto, cpu, vulkan"
#define CLI_DEVICE_USAGE                                                                           \
    "  --device D            where the model runs: " CLI_DEVICES " (default auto: a GPU\n"         \
    "                        through Vulkan where one is usable, else the CPU)\n"                  \
    "  --gpu-layers N        on a GPU, only the last N layers and the classifier there, the\n"     \
    "                        rest on the CPU, for a model too big for the GPU's memory;\n"         \
    "                        0: all on the CPU (default: every layer on the GPU)\n"
bool cli_parse_device(const char *s, int32_t *out);

/* --gpu-layers N (also -ngl, --n-gpu-layers): kept as given (-1: not
 * given) and applied once the options are read (cli_apply_gpu_layers),
 * so that its place beside --device does not matter: 0 runs on the CPU,
 * N sets cellm_engine_params.gpu_layers. */
bool cli_is_gpu_layers(const char *opt);
bool cli_parse_gpu_layers(const char *s, long *out);
void cli_apply_gpu_layers(long arg, int32_t *device, int32_t *gpu_layers);

/* Parses a KV cache type name (CLI_KV_TYPES) for --kv-type. */
#define CLI_KV_TYPES "f16, q8_0, q4_0, q4_0h, k5v4h, q4_0hw, k5v4hw, q3_0hw, k4v3hw, k4cv4hw"
bool cli_parse_kv_type(const char *s, cellm_kv_type *out);

/* "exact" or "resample" (--spec-accept) as a cellm_spec_accept. */
bool cli_parse_spec_accept(const char *s, int32_t *out);

/* Turns a MODEL argument into a file path as store_resolve does (a file,
 * or a known name, pulled when missing), and else finds NAME or NAME.gguf
 * in the store directory, so files made there by `cellm quantize` (a draft
 * model such as smollm2-135m-q4_0) go by name too. */
cellm_status cli_resolve_model(const char *name_or_path, char *out, size_t cap, cellm_error *err);

/* `cellm tokenize MODEL TEXT`: print a text's token ids and pieces. */
int cmd_tokenize(int argc, char **argv);

/* `cellm bench [MODEL]`: aggregate decode speed with 1..16 sessions. */
int cmd_bench(int argc, char **argv);

/* Reads a whole file ("-": stdin) into a new buffer the caller frees;
 * *len gets its size. NULL when it cannot be opened or read. */
char *cli_read_file(const char *path, size_t *len);

#endif /* CELLM_CLI_H */

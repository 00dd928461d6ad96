/*
 * quantize.h — `cellm quantize IN.gguf OUT.gguf TYPE`: re-quantize a model
 * file. Every tensor llama.cpp would quantize is dequantized to float and
 * quantized to the target type, or to the type llama.cpp's mix rules give
 * it (output and tied embeddings at Q6_K, some attn_v and ffn_down layers
 * at Q6_K in the _M mixes, fallbacks for rows the type's blocks do not
 * divide); everything else (norms, 1-D tensors) is copied. Metadata is
 * copied with general.file_type set to the target. Files written this way
 * load in llama.cpp.
 */
#ifndef CELLM_QUANTIZE_H
#define CELLM_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "format/quant.h"
#include "base/util.h"

/* A target the command accepts: "Q4_K_M" and so on. */
typedef struct quantize_ftype {
    const char *name;
    uint32_t file_type; /* llama.cpp's llama_ftype id, stored as general.file_type */
    uint32_t base_type; /* tensor type before the mix rules */
    bool mix_m;         /* the _M rules (Q4_K_M, Q5_K_M) */
} quantize_ftype;

/* The target called `name` (case-insensitive), or NULL. */
const quantize_ftype *quantize_ftype_by_name(const char *name);

/* The names the command accepts, space-separated (for messages). */
const char *quantize_ftype_names(void);

typedef struct quantize_params {
    unsigned n_threads; /* 0: 2 */
    bool progress;      /* a progress line on stderr */
    /* The output matrix's type instead of the rules' (llama-quantize's
     * --output-tensor-type), when output_type_set. A model that ties its
     * output to the embeddings gets an output.weight of its own, a copy of
     * token_embd.weight in that type: the embedding rows keep their
     * precision and the classifier, read once a token, streams the copy. */
    bool output_type_set;
    uint32_t output_type;
} quantize_params;

typedef struct quantize_stats {
    uint64_t n_tensors;
    uint64_t n_quantized;             /* re-quantized (the others were copied) */
    uint64_t n_fallback;              /* took a fallback type: rows not a whole number of blocks */
    bool output_copied;               /* output.weight was added from the tied embeddings */
    uint64_t bytes_in, bytes_out;     /* tensor data only */
    uint64_t count_by_type[QT_COUNT]; /* output tensors per type */
} quantize_stats;

/* Reads the GGUF at `in_path` and writes the re-quantized file to
 * `out_path` (atomically: a failure leaves no file behind). `stats` may be
 * NULL. CELLM_ERR_UNSUPPORTED when a tensor's type cannot be dequantized or
 * its rows fit neither the type nor a fallback (as llama.cpp refuses). */
cellm_status quantize_file(const char *in_path, const char *out_path, const quantize_ftype *ft,
                           const quantize_params *params, quantize_stats *stats, cellm_error *err);

int cmd_quantize(int argc, char **argv);

#endif /* CELLM_QUANTIZE_H */

/*
 * convert.h — `cellm convert HF_DIR OUT.gguf [--type T]`: turn a Hugging
 * Face checkpoint folder (config.json, *.safetensors — one file or shards
 * with model.safetensors.index.json — tokenizer.json, tokenizer_config.json
 * and chat_template.jinja) into a GGUF file with the metadata keys and
 * tensor names llama.cpp's converter writes, so the file runs in cellm and
 * in llama.cpp alike. Families: Llama, Mistral, Qwen 2/2.5, Qwen 3, Phi-3
 * and Granite (docs/models.md). F32, F16 and BF16 are written directly;
 * the quantized types go through an F32 file and `quantize_file` (its
 * llama.cpp mix rules). Safetensors headers are untrusted input.
 */
#ifndef CELLM_CONVERT_H
#define CELLM_CONVERT_H

#include <stdbool.h>

#include "base/util.h"

typedef struct convert_params {
    const char *type;   /* "f16" (default), "f32", "bf16", or a quantize type ("q8_0", ...) */
    unsigned n_threads; /* quantizing; 0: 2 */
    bool progress;      /* a progress line on stderr */
    const char *mmproj; /* a vision-language folder's projector file; NULL:
                           mmproj-BASENAME beside the output */
} convert_params;

/* Converts the folder `dir` into `out_path` (atomically: a failure leaves no
 * file). The written file is loaded back as a check before it is kept. */
cellm_status convert_hf(const char *dir, const char *out_path, const convert_params *p,
                        cellm_error *err);

int cmd_convert(int argc, char **argv);

/* ---- convert_vision.c: the projector (mmproj) of a vision-language folder ---- */

struct cJSON;
struct safetensors_file;

/* Whether Hugging Face tensor `hf` belongs to the projector file. */
bool convert_is_vision_tensor(const char *hf);

/* Writes Idefics3's vision encoder and connector from the open shards into
 * `out_path` as llama.cpp's mmproj GGUF (F16 matrices, or F32 when `f32`),
 * with the image processor `proc` (its JSON object) as clip.vision.* keys;
 * loads it back as a check. */
cellm_status convert_mmproj(const char *dir, const struct cJSON *cfg, const struct cJSON *proc,
                            struct safetensors_file *const *shards, size_t n_shards,
                            const char *out_path, bool f32, cellm_error *err);

#endif /* CELLM_CONVERT_H */

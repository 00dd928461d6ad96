/*
 * inspect.h — `cellm inspect`: a GGUF file's description and memory needs.
 */
#ifndef CELLM_INSPECT_H
#define CELLM_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "format/quant.h"
#include "base/util.h"

typedef struct inspect_opts {
    uint64_t ctx;      /* context tokens per session; 0: trained, at most 4096 */
    uint64_t sessions; /* 0: 1 */
    uint32_t kv_type;  /* from inspect_kv_type */
    size_t budget;     /* bytes; 0: no budget */
} inspect_opts;

typedef struct inspect_report {
    char path[4096];
    char name[256];
    char arch[64];
    uint64_t file_size, n_kv, n_tensors, n_params;
    uint32_t gguf_version;
    uint64_t context_length, embedding_length, block_count, feed_forward_length;
    uint64_t head_count, head_count_kv, key_length, value_length, sliding_window;
    uint64_t n_local_layers;
    double rope_freq_base, rms_norm_eps;
    char tok_model[32], tok_pre[64];
    uint64_t vocab_size, chat_template_len;
    int64_t bos_id, eos_id;
    bool has_chat_template;
    struct {
        uint64_t count, bytes;
    } by_type[QT_COUNT];
    uint64_t ctx, sessions, budget;
    uint32_t kv_type;
    uint64_t weights_bytes, kv_bytes_per_token, kv_bytes_per_session, kv_bytes, total_bytes;
    uint64_t kv_window_bytes;                 /* a window type's f16 copies per session; 0: none */
    uint64_t expert_count, expert_used_count; /* mixture of experts; 0 when dense */
    uint64_t active_bytes; /* weights a token reads: the routed experts' share only */
    bool fits;
    /* The Vulkan device `--device auto` would take (docs/gpu.md): its
     * name and device-local memory, and whether the weights and KV cache
     * fit there; gpu_name "" when there is none (gpu_why says why). */
    char gpu_name[256], gpu_why[CELLM_ERR_MSG_MAX];
    uint64_t gpu_bytes;
    bool gpu_fits;
} inspect_report;

/* Fills `r` for the GGUF file at `path`. */
cellm_status inspect_model(const char *path, const inspect_opts *opts, inspect_report *r,
                           cellm_error *err);

/* Maps a KV type name ("f16", "q8_0", ...) to its number in inspect's
 * table (inspect_opts.kv_type); inspect_kv_name maps it back. */
bool inspect_kv_type(const char *name, uint32_t *kv_type);
const char *inspect_kv_name(uint32_t kv_type);

int cmd_inspect(int argc, char **argv);

#endif /* CELLM_INSPECT_H */

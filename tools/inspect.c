/*
 * inspect.c — `cellm inspect MODEL`: what a GGUF file holds and whether it
 * fits a memory budget. It reads the architecture's hyperparameters, the
 * tokenizer's kind and vocabulary, counts tensors and bytes per tensor type,
 * and adds up the memory a deployment needs: the mapped weights plus the KV
 * cache for a context length, a number of sessions and a KV type. Text by
 * default, JSON with --json.
 */
#include "inspect.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "format/gguf.h"
#include "format/quant.h"
#include "store.h"
#include "vulkan/vk_device.h"

/* The KV types an engine may use: bytes of 32 elements of a K and of a V
 * row (quantized rows must be whole blocks of 32). The rotated types have
 * the size of their blocks; the window types keep f16 copies of every
 * layer beside them: per session, its sink and ring (16 + KV_RING, 64
 * positions) and one shadow of a cached block (16), and one shadow more
 * (src/model/kv_cache.c). The keys of k4cv4hw are codes (16 bytes per 32)
 * plus each head's metadata per block of 16 positions (kv_kc4_meta_bytes
 * in src/model/kv_format.h: 4 + 7 key_length / 8). */
static const struct {
    const char *name;
    uint32_t k32, v32;
    bool window, kchan;
} kv_types[] = {{"f32", 128, 128, false, false}, {"f16", 64, 64, false, false},
                {"q8_0", 34, 34, false, false},  {"q4_0", 18, 18, false, false},
                {"q4_0h", 18, 18, false, false}, {"k5v4h", 22, 18, false, false},
                {"q4_0hw", 18, 18, true, false}, {"k5v4hw", 22, 18, true, false},
                {"q3_0hw", 14, 14, true, false}, {"k4v3hw", 18, 14, true, false},
                {"k4cv4hw", 16, 18, true, true}};
#define INSPECT_WINDOW_POSITIONS 80 /* 2 * KV_BLOCK_TOKENS + KV_RING, src/model/kv_cache.h */

const char *inspect_kv_name(uint32_t kv_type) {
    return kv_types[kv_type].name;
}

/* Bytes of a head of n elements of a type with `b32` bytes per 32; false
 * when a quantized head would not be whole blocks. */
static bool kv_row_bytes(uint32_t b32, uint64_t n, uint64_t *out) {
    if (b32 % 32 != 0 && n % 32 != 0) return false;
    *out = b32 % 32 == 0 ? n * (b32 / 32) : n / 32 * b32;
    return true;
}

bool inspect_kv_type(const char *name, uint32_t *kv_type) {
    for (size_t i = 0; i < sizeof kv_types / sizeof kv_types[0]; i++)
        if (!strcmp(kv_types[i].name, name)) {
            *kv_type = (uint32_t)i;
            return true;
        }
    return false;
}

/* Architectures whose local (sliding-window) layers follow a fixed pattern
 * that the file does not store: every `period`-th layer is global. */
static uint32_t swa_period(const char *arch) {
    if (!strcmp(arch, "gemma3")) return 6;
    return 0;
}

static uint64_t arch_uint(const gguf_file *f, const char *arch, const char *suffix) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint64_t v = 0;
    if (!gguf_get_uint(f, key, &v)) return 0;
    return v;
}

static double arch_float(const gguf_file *f, const char *arch, const char *suffix) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    double v = 0;
    if (!gguf_get_float(f, key, &v)) return 0;
    return v;
}

static void str_copy(char *dst, size_t cap, gguf_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = '\0';
}

/* The GPU `--device auto` would run on (vk_device_open's default device,
 * unless that is a CPU emulation), and whether the weights and KV cache fit
 * its device-local memory. */
static void find_gpu(inspect_report *r) {
    vk_device_info devs[16];
    uint32_t n = 0;
    cellm_error e;
    err_clear(&e);
    r->gpu_name[0] = 0;
    if (vk_enumerate(devs, 16, &n, &e) != CELLM_OK) {
        snprintf(r->gpu_why, sizeof r->gpu_why, "%s", e.msg);
        return;
    }
    /* The device vk_device_open takes by default, unless it is a CPU
     * emulation, which auto never runs on. */
    int best = vk_pick_best(devs, n < 16 ? n : 16);
    if (best >= 0 && devs[best].type != VK_TYPE_CPU) {
        snprintf(r->gpu_name, sizeof r->gpu_name, "%s", devs[best].name);
        r->gpu_bytes = devs[best].device_local_bytes;
        r->gpu_fits = r->total_bytes <= r->gpu_bytes;
    }
    if (!r->gpu_name[0])
        snprintf(r->gpu_why, sizeof r->gpu_why, "no Vulkan GPU (%u device%s, none a usable GPU)", n,
                 n == 1 ? "" : "s");
}

cellm_status inspect_model(const char *path, const inspect_opts *opts, inspect_report *r,
                           cellm_error *err) {
    memset(r, 0, sizeof *r);
    gguf_file *f;
    cellm_status st = gguf_open(path, &f, err);
    if (st) return st;
    snprintf(r->path, sizeof r->path, "%s", path);
    r->file_size = f->size;
    r->gguf_version = f->version;
    r->n_kv = f->n_kv;
    gguf_str s;
    if (gguf_get_str(f, "general.name", &s)) str_copy(r->name, sizeof r->name, s);
    if (!gguf_get_str(f, "general.architecture", &s) || s.len == 0) {
        gguf_close(f);
        return err_set(err, CELLM_ERR_FORMAT, "%s: no general.architecture key", path);
    }
    str_copy(r->arch, sizeof r->arch, s);
    const char *a = r->arch;
    r->context_length = arch_uint(f, a, "context_length");
    r->embedding_length = arch_uint(f, a, "embedding_length");
    r->block_count = arch_uint(f, a, "block_count");
    r->feed_forward_length = arch_uint(f, a, "feed_forward_length");
    r->head_count = arch_uint(f, a, "attention.head_count");
    r->head_count_kv = arch_uint(f, a, "attention.head_count_kv");
    if (!r->head_count_kv) r->head_count_kv = r->head_count; /* no GQA */
    r->key_length = arch_uint(f, a, "attention.key_length");
    r->value_length = arch_uint(f, a, "attention.value_length");
    if (!r->key_length && r->head_count) r->key_length = r->embedding_length / r->head_count;
    if (!r->value_length) r->value_length = r->key_length;
    r->sliding_window = arch_uint(f, a, "attention.sliding_window");
    r->rope_freq_base = arch_float(f, a, "rope.freq_base");
    r->rms_norm_eps = arch_float(f, a, "attention.layer_norm_rms_epsilon");

    if (gguf_get_str(f, "tokenizer.ggml.model", &s)) str_copy(r->tok_model, sizeof r->tok_model, s);
    if (gguf_get_str(f, "tokenizer.ggml.pre", &s)) str_copy(r->tok_pre, sizeof r->tok_pre, s);
    const gguf_value *tokens = gguf_get_arr(f, "tokenizer.ggml.tokens");
    r->vocab_size = tokens ? tokens->v.arr.n : 0;
    r->has_chat_template = gguf_get_str(f, "tokenizer.chat_template", &s);
    r->chat_template_len = r->has_chat_template ? s.len : 0;
    int64_t id;
    r->bos_id = gguf_get_int(f, "tokenizer.ggml.bos_token_id", &id) ? id : -1;
    r->eos_id = gguf_get_int(f, "tokenizer.ggml.eos_token_id", &id) ? id : -1;

    r->expert_count = arch_uint(f, a, "expert_count");
    r->expert_used_count = arch_uint(f, a, "expert_used_count");
    bool moe = r->expert_count && r->expert_used_count && r->expert_used_count <= r->expert_count;
    r->n_tensors = f->n_tensors;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        r->weights_bytes += t->size;
        /* A token reads k of the n experts of each stacked expert tensor
         * (blk.N.ffn_*_exps), all of every other tensor. */
        bool exps =
            moe && t->name.len > 12 && !memcmp(t->name.ptr + t->name.len - 12, "_exps.weight", 12);
        r->active_bytes += exps ? t->size / r->expert_count * r->expert_used_count : t->size;
        r->n_params += t->n_elems;
        r->by_type[t->type].count++;
        r->by_type[t->type].bytes += t->size;
    }
    gguf_close(f);

    /* The KV cache: per layer, per token, K and V rows for every KV head,
     * stored in whole blocks of the KV type. A sliding-window layer holds
     * its window plus the 16-token block being filled, as the paged cache
     * does (src/model/kv_cache.c). Blocks of 16 tokens round the context. */
    r->ctx = opts->ctx ? opts->ctx
                       : (r->context_length && r->context_length < 4096 ? r->context_length : 4096);
    r->sessions = opts->sessions ? opts->sessions : 1;
    r->kv_type = opts->kv_type;
    r->budget = opts->budget;
    uint64_t ctx = (r->ctx + 15) / 16 * 16;
    uint64_t k_row, v_row;
    if (!kv_row_bytes(kv_types[r->kv_type].k32, r->key_length, &k_row) ||
        !kv_row_bytes(kv_types[r->kv_type].v32, r->value_length, &v_row))
        return err_set(err, CELLM_ERR_UNSUPPORTED,
                       "KV type %s needs head sizes that are whole blocks (key %llu, value %llu)",
                       kv_types[r->kv_type].name, (unsigned long long)r->key_length,
                       (unsigned long long)r->value_length);
    /* a block's 16 positions, every KV head */
    uint64_t k_blk = (16 * k_row + (kv_types[r->kv_type].kchan ? 4 + 7 * r->key_length / 8 : 0)) *
                     r->head_count_kv,
             v_blk = 16 * v_row * r->head_count_kv;
    uint32_t period = swa_period(r->arch);
    uint64_t window = r->sliding_window ? (r->sliding_window + 15) / 16 * 16 + 16 : 0;
    for (uint64_t l = 0; l < r->block_count; l++) {
        bool local = window && (period == 0 || (l + 1) % period != 0);
        uint64_t tokens_held = local && window < ctx ? window : ctx;
        if (local) r->n_local_layers++;
        r->kv_bytes_per_session += tokens_held / 16 * (k_blk + v_blk);
    }
    r->kv_bytes_per_token = r->block_count * (k_blk + v_blk) / 16;
    if (kv_types[r->kv_type].window) {
        uint64_t position =
            r->block_count * r->head_count_kv * (r->key_length + r->value_length) * 2;
        r->kv_window_bytes = INSPECT_WINDOW_POSITIONS * position;
        r->kv_bytes_per_session += r->kv_window_bytes;
        r->kv_bytes = 16 * position; /* the shadow more */
    }
    r->kv_bytes += r->kv_bytes_per_session * r->sessions;
    r->total_bytes = r->weights_bytes + r->kv_bytes;
    r->fits = r->budget == 0 || r->total_bytes <= r->budget;
    find_gpu(r);
    return CELLM_OK;
}

static const char *tokenizer_kind(const char *model) {
    if (!strcmp(model, "gpt2")) return "byte-level BPE";
    if (!strcmp(model, "llama")) return "SentencePiece";
    if (!*model) return "none";
    return model;
}

static void print_bytes(FILE *out, uint64_t b) {
    if (b >= (1ull << 30))
        fprintf(out, "%.2f GiB", (double)b / (1ull << 30));
    else if (b >= (1ull << 20))
        fprintf(out, "%.1f MiB", (double)b / (1ull << 20));
    else if (b >= 1024)
        fprintf(out, "%.1f KiB", (double)b / 1024);
    else
        fprintf(out, "%llu B", (unsigned long long)b);
}

static void print_text(FILE *out, const inspect_report *r) {
    fprintf(out, "file          %s (", r->path);
    print_bytes(out, r->file_size);
    fprintf(out, ", GGUF v%u, %llu metadata keys)\n", r->gguf_version, (unsigned long long)r->n_kv);
    if (r->name[0]) fprintf(out, "name          %s\n", r->name);
    fprintf(out, "architecture  %s\n", r->arch);
    fprintf(out, "parameters    %.1f M\n", (double)r->n_params / 1e6);
    fprintf(out, "context       %llu tokens (trained)\n", (unsigned long long)r->context_length);
    fprintf(out, "layers        %llu", (unsigned long long)r->block_count);
    if (r->sliding_window)
        fprintf(out, " (%llu local with a %llu-token window, %llu global)",
                (unsigned long long)r->n_local_layers, (unsigned long long)r->sliding_window,
                (unsigned long long)(r->block_count - r->n_local_layers));
    fprintf(out, "\nembedding     %llu\nfeed-forward  %llu\n",
            (unsigned long long)r->embedding_length, (unsigned long long)r->feed_forward_length);
    fprintf(out, "heads         %llu query, %llu key/value, head size %llu\n",
            (unsigned long long)r->head_count, (unsigned long long)r->head_count_kv,
            (unsigned long long)r->key_length);
    fprintf(out, "rope base     %g\nrms eps       %g\n", r->rope_freq_base, r->rms_norm_eps);
    fprintf(out, "tokenizer     %s (%s%s%s), %llu tokens, bos %lld, eos %lld\n",
            tokenizer_kind(r->tok_model), r->tok_model[0] ? r->tok_model : "-",
            r->tok_pre[0] ? ", pre " : "", r->tok_pre, (unsigned long long)r->vocab_size,
            (long long)r->bos_id, (long long)r->eos_id);
    if (r->has_chat_template)
        fprintf(out, "chat template yes (%llu bytes)\n", (unsigned long long)r->chat_template_len);
    else
        fprintf(out, "chat template no\n");
    fprintf(out, "tensors       %llu, ", (unsigned long long)r->n_tensors);
    print_bytes(out, r->weights_bytes);
    fputc('\n', out);
    for (uint32_t t = 0; t < QT_COUNT; t++) {
        if (!r->by_type[t].count) continue;
        fprintf(out, "  %-8s %5llu tensors  ", quant_type_get(t)->name,
                (unsigned long long)r->by_type[t].count);
        print_bytes(out, r->by_type[t].bytes);
        fputc('\n', out);
    }
    fprintf(out, "memory        %llu-token context x %llu session%s, KV %s\n",
            (unsigned long long)r->ctx, (unsigned long long)r->sessions,
            r->sessions == 1 ? "" : "s", kv_types[r->kv_type].name);
    fprintf(out, "  weights     ");
    print_bytes(out, r->weights_bytes);
    fprintf(out, " (mapped)");
    if (r->expert_count) {
        fprintf(out, ", ");
        print_bytes(out, r->active_bytes);
        fprintf(out, " active per token (%llu of %llu experts)",
                (unsigned long long)r->expert_used_count, (unsigned long long)r->expert_count);
    }
    fprintf(out, "\n  KV cache    ");
    print_bytes(out, r->kv_bytes);
    fprintf(out, " (");
    print_bytes(out, r->kv_bytes_per_token);
    fprintf(out, " per token at full attention");
    if (r->kv_window_bytes) {
        fprintf(out, ", with ");
        print_bytes(out, r->kv_window_bytes);
        fprintf(out, " a session of f16 copies (sink, recent positions, a cached block)");
    }
    fprintf(out, ")\n  total       ");
    print_bytes(out, r->total_bytes);
    fputc('\n', out);
    if (r->budget) {
        fprintf(out, "  budget      ");
        print_bytes(out, r->budget);
        fprintf(out, ": %s\n", r->fits ? "fits" : "does NOT fit");
    }
    if (r->gpu_name[0]) {
        fprintf(out, "  GPU         %s, ", r->gpu_name);
        print_bytes(out, r->gpu_bytes);
        fprintf(out, " device-local: %s\n", r->gpu_fits ? "fits" : "does NOT fit");
    } else {
        fprintf(out, "  GPU         none (%s): runs on the CPU\n", r->gpu_why);
    }
}

static void print_json(FILE *out, const inspect_report *r) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "path", r->path);
    cJSON_AddNumberToObject(root, "file_size", (double)r->file_size);
    cJSON_AddNumberToObject(root, "gguf_version", r->gguf_version);
    cJSON_AddStringToObject(root, "name", r->name);
    cJSON_AddStringToObject(root, "architecture", r->arch);
    cJSON_AddNumberToObject(root, "parameters", (double)r->n_params);
    cJSON *h = cJSON_AddObjectToObject(root, "hparams");
    cJSON_AddNumberToObject(h, "context_length", (double)r->context_length);
    cJSON_AddNumberToObject(h, "embedding_length", (double)r->embedding_length);
    cJSON_AddNumberToObject(h, "block_count", (double)r->block_count);
    cJSON_AddNumberToObject(h, "feed_forward_length", (double)r->feed_forward_length);
    cJSON_AddNumberToObject(h, "head_count", (double)r->head_count);
    cJSON_AddNumberToObject(h, "head_count_kv", (double)r->head_count_kv);
    cJSON_AddNumberToObject(h, "key_length", (double)r->key_length);
    cJSON_AddNumberToObject(h, "value_length", (double)r->value_length);
    cJSON_AddNumberToObject(h, "sliding_window", (double)r->sliding_window);
    cJSON_AddNumberToObject(h, "rope_freq_base", r->rope_freq_base);
    cJSON_AddNumberToObject(h, "rms_norm_eps", r->rms_norm_eps);
    cJSON *t = cJSON_AddObjectToObject(root, "tokenizer");
    cJSON_AddStringToObject(t, "model", r->tok_model);
    cJSON_AddStringToObject(t, "kind", tokenizer_kind(r->tok_model));
    cJSON_AddStringToObject(t, "pre", r->tok_pre);
    cJSON_AddNumberToObject(t, "vocab_size", (double)r->vocab_size);
    cJSON_AddNumberToObject(t, "bos_id", (double)r->bos_id);
    cJSON_AddNumberToObject(t, "eos_id", (double)r->eos_id);
    cJSON_AddBoolToObject(t, "chat_template", r->has_chat_template);
    cJSON *ts = cJSON_AddObjectToObject(root, "tensors");
    cJSON_AddNumberToObject(ts, "count", (double)r->n_tensors);
    cJSON_AddNumberToObject(ts, "bytes", (double)r->weights_bytes);
    cJSON *bt = cJSON_AddObjectToObject(ts, "by_type");
    for (uint32_t i = 0; i < QT_COUNT; i++) {
        if (!r->by_type[i].count) continue;
        cJSON *o = cJSON_AddObjectToObject(bt, quant_type_get(i)->name);
        cJSON_AddNumberToObject(o, "count", (double)r->by_type[i].count);
        cJSON_AddNumberToObject(o, "bytes", (double)r->by_type[i].bytes);
    }
    cJSON *g = cJSON_AddObjectToObject(root, "gpu");
    if (r->gpu_name[0]) {
        cJSON_AddStringToObject(g, "name", r->gpu_name);
        cJSON_AddNumberToObject(g, "device_local_bytes", (double)r->gpu_bytes);
        cJSON_AddBoolToObject(g, "fits", r->gpu_fits);
    } else {
        cJSON_AddNullToObject(g, "name");
        cJSON_AddStringToObject(g, "why", r->gpu_why);
    }
    cJSON *m = cJSON_AddObjectToObject(root, "memory");
    cJSON_AddNumberToObject(m, "ctx", (double)r->ctx);
    cJSON_AddNumberToObject(m, "sessions", (double)r->sessions);
    cJSON_AddStringToObject(m, "kv_type", kv_types[r->kv_type].name);
    cJSON_AddNumberToObject(m, "weights_bytes", (double)r->weights_bytes);
    cJSON_AddNumberToObject(m, "active_bytes_per_token", (double)r->active_bytes);
    cJSON_AddNumberToObject(m, "kv_bytes_per_token", (double)r->kv_bytes_per_token);
    cJSON_AddNumberToObject(m, "kv_window_bytes_per_session", (double)r->kv_window_bytes);
    cJSON_AddNumberToObject(m, "kv_bytes", (double)r->kv_bytes);
    cJSON_AddNumberToObject(m, "total_bytes", (double)r->total_bytes);
    cJSON_AddNumberToObject(m, "budget_bytes", (double)r->budget);
    cJSON_AddBoolToObject(m, "fits", r->fits);
    char *text = cJSON_Print(root);
    if (text) fprintf(out, "%s\n", text);
    free(text);
    cJSON_Delete(root);
}

static void inspect_usage(FILE *out) {
    fprintf(out,
            "usage: cellm inspect MODEL [--json] [--ctx N] [--sessions S] [--kv-type T]\n"
            "                           [--mem-budget SIZE]\n\n"
            "Shows the architecture, hyperparameters, tokenizer and tensors of a GGUF file and\n"
            "the memory it needs: mapped weights plus the KV cache for N tokens of context\n"
            "(default: the trained context, at most 4096) in S sessions (default 1) with KV\n"
            "type T (f32, f16, q8_0, q4_0; default f16), checked against SIZE (e.g. 512M;\n"
            "default 512M, a phone app's budget; 0 for none).\n");
}

int cmd_inspect(int argc, char **argv) {
    inspect_opts opts = {.kv_type = 1 /* f16 */, .budget = (size_t)512 << 20};
    const char *model = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        unsigned long long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            inspect_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--ctx") || !strcmp(a, "-c")) {
            if (i + 1 >= argc || !cli_parse_uint(argv[++i], 1u << 24, &v) || v == 0) {
                cli_error("--ctx needs a token count from 1 to 16777216");
                return 2;
            }
            opts.ctx = v;
        } else if (!strcmp(a, "--sessions")) {
            if (i + 1 >= argc || !cli_parse_uint(argv[++i], 4096, &v) || v == 0) {
                cli_error("--sessions needs a count from 1 to 4096");
                return 2;
            }
            opts.sessions = v;
        } else if (!strcmp(a, "--kv-type")) {
            if (i + 1 >= argc || !inspect_kv_type(argv[++i], &opts.kv_type)) {
                cli_error(
                    "--kv-type needs one of f32, f16, q8_0, q4_0, q4_0h, k5v4h, q4_0hw, k5v4hw, "
                    "q3_0hw, k4v3hw, k4cv4hw");
                return 2;
            }
        } else if (!strcmp(a, "--mem-budget")) {
            if (i + 1 >= argc || !cli_parse_size(argv[++i], &opts.budget)) {
                cli_error("--mem-budget needs a size such as 512M or 2G");
                return 2;
            }
        } else if (a[0] == '-') {
            cli_error("inspect: unknown option '%s' (see `cellm inspect --help`)", a);
            return 2;
        } else if (!model) {
            model = a;
        } else {
            cli_error("inspect: more than one model given ('%s', '%s')", model, a);
            return 2;
        }
    }
    if (!model) {
        inspect_usage(stderr);
        return 2;
    }
    char path[4096];
    cellm_error err;
    if (store_resolve(model, true, path, sizeof path, &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        return 1;
    }
    inspect_report *r = malloc(sizeof *r);
    if (!r) {
        cli_error("out of memory");
        return 1;
    }
    if (inspect_model(path, &opts, r, &err) != CELLM_OK) {
        cli_error("%s", err.msg);
        free(r);
        return 1;
    }
    if (json)
        print_json(stdout, r);
    else
        print_text(stdout, r);
    free(r);
    return 0;
}

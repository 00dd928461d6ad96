/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors reader that
 * `cellm convert` uses (tools/safetensors.c). Any input must either parse
 * or fail with a message; a file that parses is walked completely: every
 * tensor is looked up by name, its first and last bytes read, and F32, F16
 * and BF16 tensors converted to float a few elements at a time.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    safetensors_file *f;
    cellm_error err;
    if (safetensors_open_memory(data, size, &f, &err) != CELLM_OK) {
        if (!err.msg[0]) abort(); /* every failure says why */
        return 0;
    }
    for (size_t i = 0; i < f->n; i++) {
        const safetensors_tensor *t = &f->tensors[i];
        if (safetensors_find(f, t->name) != t) abort();
        if (t->size) sink += t->data[0] + t->data[t->size - 1];
        float buf[16];
        uint64_t n = t->n_elems < 16 ? t->n_elems : 16;
        if (safetensors_to_float(t, t->n_elems - n, n, buf))
            for (uint64_t k = 0; k < n; k++) sink += (uint64_t)(buf[k] == buf[k]);
    }
    safetensors_close(f);
    return 0;
}

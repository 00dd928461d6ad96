/*
 * vk_matmul.c — throughput of the Vulkan matmul (src/vulkan/vk_matmul.h)
 * per weight type on whatever device opens (lavapipe on a machine without
 * a GPU): for 1 activation row (decode: weights streamed once per row) and
 * for 64 (prefill), REPS dispatches in one recording, timed by the device's
 * timestamps (and the host's clock), median of ROUNDS submissions.
 * Prints GB/s of weights for 1 row and GFLOP/s for 64.
 * Not built by CMake; from the repository root after building ./build:
 *
 *   cc -O2 -D_POSIX_C_SOURCE=200809L -Isrc -Iinclude bench/vk_matmul.c build/libcellm.a \
 *      -lm -lpthread -o build/vk_matmul
 *   ./build/vk_matmul [ROWS COLS]      (default 512 512; lavapipe takes about a minute)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "format/quant.h"
#include "vulkan/vk_device.h"
#include "vulkan/vk_matmul.h"

enum { REPS = 4, ROUNDS = 3, MAXR = 64 };

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int fail(const char *what, const cellm_error *err) {
    fprintf(stderr, "vk_matmul: %s: %s\n", what, err->msg);
    return 1;
}

int main(int argc, char **argv) {
    uint32_t rows = argc > 2 ? (uint32_t)atoi(argv[1]) : 512;
    uint32_t cols = argc > 2 ? (uint32_t)atoi(argv[2]) : 512;
    if (rows == 0 || cols == 0 || cols % 256) {
        fprintf(stderr, "usage: vk_matmul [ROWS COLS] (COLS a multiple of 256)\n");
        return 2;
    }
    cellm_error err;
    vk_device *dev;
    if (vk_device_open(NULL, &dev, &err) != CELLM_OK) return fail("open", &err);
    const vk_device_info *info = vk_device_get_info(dev);
    printf("device: %s (%s), %u x %u weights, %d dispatches a recording, median of %d\n",
           info->name, vk_device_type_name(info->type), rows, cols, REPS, ROUNDS);
    printf("%-5s %10s %12s %12s %12s\n", "type", "MiB", "1 row us", "1 row GB/s", "64 GFLOP/s");
    const uint32_t types[] = {QT_F32,  QT_F16,  QT_Q4_0, QT_Q4_1, QT_Q5_0,
                              QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    float *xf = malloc(sizeof(float) * (size_t)MAXR * cols), *wf = malloc(sizeof(float) * cols);
    uint64_t seed = 1;
    for (size_t i = 0; i < (size_t)MAXR * cols; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        xf[i] = (float)((seed >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    vk_buffer *xb, *yb;
    vk_recorder *rec;
    if (vk_buffer_create(dev, sizeof(float) * (size_t)MAXR * cols, VK_BUF_DEVICE, &xb, &err) ||
        vk_buffer_create(dev, sizeof(float) * (size_t)MAXR * rows, VK_BUF_DEVICE, &yb, &err) ||
        vk_buffer_upload(xb, 0, xf, sizeof(float) * (size_t)MAXR * cols, &err) ||
        vk_recorder_create(dev, &rec, &err))
        return fail("setup", &err);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const quant_type_info *qi = quant_type_get(types[t]);
        uint64_t row_bytes;
        quant_nbytes(types[t], cols, &row_bytes);
        size_t w_bytes = (size_t)row_bytes * rows;
        uint8_t *w = malloc(w_bytes);
        for (uint32_t o = 0; o < rows; o++) {
            for (uint32_t i = 0; i < cols; i++) wf[i] = xf[(o * 7 + i) % ((size_t)MAXR * cols)];
            qi->from_float(wf, w + (size_t)o * row_bytes, cols);
        }
        vk_buffer *wb;
        if (vk_buffer_create(dev, w_bytes, VK_BUF_DEVICE, &wb, &err) ||
            vk_buffer_upload(wb, 0, w, w_bytes, &err))
            return fail("weights", &err);
        double per[2];
        const uint32_t nr[2] = {1, MAXR};
        for (int k = 0; k < 2; k++) {
            double ns[ROUNDS];
            for (int round = -1; round < ROUNDS; round++) { /* -1: compiles the shader */
                double t0 = now_s();
                if (vk_recorder_begin(rec, &err)) return fail("begin", &err);
                for (int r = 0; r < REPS; r++)
                    vk_matmul(rec, types[t], wb, 0, rows, cols, xb, 0, yb, 0, nr[k], &err);
                if (vk_recorder_submit(rec, &err)) return fail("submit", &err);
                double gpu = vk_recorder_gpu_ns(rec);
                if (round >= 0) ns[round] = gpu > 0 ? gpu : (now_s() - t0) * 1e9;
            }
            qsort(ns, ROUNDS, sizeof ns[0], cmp_double);
            per[k] = ns[ROUNDS / 2] / REPS; /* ns per matmul */
        }
        double flop = 2.0 * rows * cols * MAXR;
        printf("%-5s %10.2f %12.1f %12.2f %12.2f\n", qi->name, (double)w_bytes / (1 << 20),
               per[0] / 1e3, (double)w_bytes / per[0], flop / per[1]);
        vk_buffer_free(wb);
        free(w);
    }
    vk_device_close(dev);
    free(xf);
    free(wf);
    return 0;
}

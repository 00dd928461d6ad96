/* test_vulkan.c — the Vulkan backend's foundation on a real Vulkan device
 * (Mesa's lavapipe in CI: scripts/setup.sh --test installs
 * mesa-vulkan-drivers): the device opens and says sane things about
 * itself, buffers go up and down through a staging buffer smaller than
 * they are, recordings copy, fill and dispatch, errors surface with
 * messages, nothing stays allocated after close, and the matmul of every
 * weight type matches the CPU's dequantized weights and is batch-invariant
 * (a row's outputs have the same bits alone as among 16 or 63 others), and
 * so does attention (against a double reference).
 * A build with Vulkan cannot pass without a device: no device is a setup
 * bug, and the test fails with the reason. A build without it checks that
 * every entry point says "built without Vulkan". */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "format/kernels/fp16.h"
#include "format/quant.h"
#include "test_common.h"
#include "top_ref.h"
#include "vulkan/vk_device.h"
#include "vulkan/vk_matmul.h"
#include "vulkan/vk_shaders.h"

/* Opens the best device or fails the test with the reason. */
static vk_device *open_device(const vk_open_params *p) {
    vk_device *dev = NULL;
    cellm_error err;
    err_clear(&err);
    cellm_status st = vk_device_open(p, &dev, &err);
    if (st != CELLM_OK) {
        print_error("no Vulkan device: %s (scripts/setup.sh --test installs lavapipe, Debian "
                    "mesa-vulkan-drivers)\n",
                    err.msg);
        fail();
    }
    return dev;
}

static uint32_t rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static float frand(uint64_t *s) {
    return (float)(rnd(s) & 0xffffff) / (float)0x1000000 * 2.0f - 1.0f;
}

static void test_asan_vulkan_open(void **state) {
    (void)state;
    vk_device_info infos[8];
    uint32_t n = 0;
    cellm_error err;
    assert_int_equal(vk_enumerate(infos, 8, &n, &err), CELLM_OK);
    assert_true(n >= 1);
    assert_int_equal(vk_live_objects(), 0); /* enumerate keeps nothing */
    vk_device *dev = open_device(NULL);
    const vk_device_info *info = vk_device_get_info(dev);
    assert_true(info->usable);
    assert_true(info->name[0] != '\0');
    assert_true(info->api_version >= ((1u << 22) | (1u << 12)));
    assert_true(info->subgroup_size >= 1 && info->subgroup_size <= 256);
    assert_true(info->max_workgroups[0] >= 65535 && info->max_workgroups[1] >= 65535);
    assert_true(info->max_storage_range >= (1u << 27));
    assert_true(info->index < n);
    assert_string_equal(info->name, infos[info->index].name);
    assert_true(vk_live_objects() > 0);
    /* Every shader the library carries makes a pipeline. */
    for (int id = 0; id < VK_SHADER_COUNT; id++) {
        const vk_pipeline *pipe = NULL;
        err_clear(&err);
        if (vk_pipeline_get(dev, (vk_shader_id)id, &pipe, &err) != CELLM_OK)
            print_error("shader %d: %s\n", id, err.msg);
        assert_non_null(pipe);
    }
    /* Other specialization constants make another pipeline, once. */
    const vk_pipeline *deflt, *one, *again;
    const uint32_t spec1[4] = {1, 0, 1, 0};
    assert_int_equal(vk_pipeline_get(dev, VK_SHADER_MATMUL_Q4_0, &deflt, &err), CELLM_OK);
    assert_int_equal(vk_pipeline_get_spec(dev, VK_SHADER_MATMUL_Q4_0, spec1, &one, &err), CELLM_OK);
    assert_int_equal(vk_pipeline_get_spec(dev, VK_SHADER_MATMUL_Q4_0, spec1, &again, &err),
                     CELLM_OK);
    assert_true(one != deflt && one == again);
    /* A device index past the list is refused with a message. */
    vk_open_params p = vk_open_default_params();
    p.index = (int)n;
    vk_device *none = NULL;
    assert_int_equal(vk_device_open(&p, &none, &err), CELLM_ERR_INVALID_ARG);
    assert_null(none);
    assert_non_null(strstr(err.msg, "no Vulkan device"));
    vk_device_close(dev);
    assert_int_equal(vk_live_objects(), 0);
}

/* Upload and download through a staging buffer of 1 MiB of a buffer of
 * about 3.5 MiB, at odd offsets too; copies and fills in a recording. */
static void test_asan_vulkan_buffers(void **state) {
    (void)state;
    vk_open_params p = vk_open_default_params();
    p.staging_bytes = (size_t)1 << 20;
    vk_device *dev = open_device(&p);
    const size_t size = ((size_t)7 << 19) + 12;
    uint8_t *src = malloc(size), *back = malloc(size);
    uint64_t seed = 7;
    for (size_t i = 0; i < size; i++) src[i] = (uint8_t)rnd(&seed);
    vk_buffer *a, *b, *rb;
    cellm_error err;
    assert_int_equal(vk_buffer_create(dev, size, VK_BUF_DEVICE, &a, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, size, VK_BUF_DEVICE, &b, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, 4096, VK_BUF_READBACK, &rb, &err), CELLM_OK);
    assert_int_equal(vk_buffer_size(a), size);
    assert_int_equal(vk_buffer_upload(a, 0, src, size, &err), CELLM_OK);
    memset(back, 0, size);
    assert_int_equal(vk_buffer_download(a, 0, back, size, &err), CELLM_OK);
    assert_memory_equal(src, back, size);
    /* A part at an odd offset, across a chunk boundary. */
    const size_t off = ((size_t)1 << 20) - 333, len = ((size_t)1 << 20) + 777;
    uint8_t *part = malloc(len);
    for (size_t i = 0; i < len; i++) part[i] = (uint8_t)(i * 31 + 5);
    assert_int_equal(vk_buffer_upload(a, off, part, len, &err), CELLM_OK);
    memcpy(src + off, part, len);
    assert_int_equal(vk_buffer_download(a, 1, back + 1, size - 1, &err), CELLM_OK);
    assert_memory_equal(src + 1, back + 1, size - 1);
    /* Out of range: refused with a message, nothing written. */
    assert_int_equal(vk_buffer_upload(a, size - 4, part, 8, &err), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "upload"));
    /* A recording: copy a to b, fill 64 words in b, copy 4 KiB of b to the
     * mapped readback buffer; one submit. */
    vk_recorder *rec;
    assert_int_equal(vk_recorder_create(dev, &rec, &err), CELLM_OK);
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    assert_int_equal(vk_recorder_copy(rec, a, 0, b, 0, size, &err), CELLM_OK);
    vk_recorder_barrier(rec);
    assert_int_equal(vk_recorder_fill(rec, b, 256, 256, 0xA5A5A5A5u, &err), CELLM_OK);
    vk_recorder_barrier(rec);
    assert_int_equal(vk_recorder_copy(rec, b, 0, rb, 0, 4096, &err), CELLM_OK);
    assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
    uint8_t got[4096];
    assert_int_equal(vk_buffer_download(rb, 0, got, sizeof got, &err), CELLM_OK);
    memset(src + 256, 0xA5, 256);
    assert_memory_equal(got, src, sizeof got);
    assert_int_equal(vk_buffer_download(b, 4096, back, size - 4096, &err), CELLM_OK);
    assert_memory_equal(back, src + 4096, size - 4096);
    if (vk_device_get_info(dev)->timestamps) assert_true(vk_recorder_gpu_ns(rec) >= 0);
    /* A bad copy is kept by the recorder and returned by submit. */
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    assert_int_equal(vk_recorder_copy(rec, a, size - 8, b, 0, 16, &err), CELLM_ERR_INVALID_ARG);
    err_clear(&err);
    assert_int_equal(vk_recorder_submit(rec, &err), CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "copy source"));
    /* And the recorder records again after it. */
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    assert_int_equal(vk_recorder_fill(rec, rb, 0, 16, 0, &err), CELLM_OK);
    assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
    /* Close frees the buffers and the recorder still alive. */
    vk_buffer_free(b);
    vk_device_close(dev);
    assert_int_equal(vk_live_objects(), 0);
    free(src);
    free(back);
    free(part);
}

static void test_asan_vulkan_no_loader(void **state) {
    (void)state;
    setenv("CELLM_VULKAN_LOADER", "libvulkan-cellm-test-missing.so.9", 1);
    vk_device *dev = (vk_device *)1;
    cellm_error err;
    err_clear(&err);
    assert_int_equal(vk_device_open(NULL, &dev, &err), CELLM_ERR_UNSUPPORTED);
    assert_null(dev);
    assert_non_null(strstr(err.msg, "no Vulkan loader"));
    assert_non_null(strstr(err.msg, "libvulkan-cellm-test-missing.so.9"));
    vk_device_info info;
    uint32_t n = 5;
    err_clear(&err);
    assert_int_equal(vk_enumerate(&info, 1, &n, &err), CELLM_ERR_UNSUPPORTED);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err.msg, "no Vulkan loader"));
    unsetenv("CELLM_VULKAN_LOADER");
    assert_int_equal(vk_live_objects(), 0);
}

/* A loader without a driver (the loader's driver list pointed at nothing):
 * CELLM_ERR_UNSUPPORTED, "no Vulkan driver", nothing left alive. */
static void test_asan_vulkan_no_driver(void **state) {
    (void)state;
    const char *vars[2] = {"VK_ICD_FILENAMES", "VK_DRIVER_FILES"};
    char *saved[2];
    for (int i = 0; i < 2; i++) {
        saved[i] = getenv(vars[i]) ? strdup(getenv(vars[i])) : NULL;
        setenv(vars[i], "/nonexistent/cellm_test_icd.json", 1);
    }
    vk_device *dev = (vk_device *)1;
    cellm_error err;
    err_clear(&err);
    assert_int_equal(vk_device_open(NULL, &dev, &err), CELLM_ERR_UNSUPPORTED);
    assert_null(dev);
    assert_non_null(strstr(err.msg, "Vulkan"));
    print_message("    %s\n", err.msg);
    for (int i = 0; i < 2; i++) {
        if (saved[i])
            setenv(vars[i], saved[i], 1);
        else
            unsetenv(vars[i]);
        free(saved[i]);
    }
    assert_int_equal(vk_live_objects(), 0);
}

enum { ROWS = 128, XR = 64 };

/* Byte offsets of the operands in their buffers: not multiples of the
 * storage alignment, so the shader's own offsets are exercised. */
enum { W_OFF = 36, X_OFF = 20, Y_OFF = 12 };

/* The rows also run alone: both ends of the first tiles of 8 rows, and
 * rows of the 64-row batch's later tiles. */
static const int single[] = {0, 1, 7, 8, 9, 16, 40, 63};
enum { NS = sizeof single / sizeof single[0] };

/* x (n values, whole blocks) as the device's matmul takes it against
 * `type` weights: as given, or with $CELLM_VK_ACT=q8 as the CPU's matmul
 * rounds it (its vec_dot_type's codes times their scale). slack[i] is
 * what x[i] may be off by on a device whose division is not correctly
 * rounded (Vulkan allows 2.5 ulp): a code's worth where x / d lies within
 * 5e-4 of a half, and the F16 scale's last bit where d lies within 8 ulp of
 * an F16 rounding tie; 0 elsewhere. */
static void device_acts(uint32_t type, const float *x, float *xr, float *slack, int n) {
    const uint32_t vt = quant_type_get(type)->vec_dot_type;
    const quant_type_info *xt = quant_type_get(vt);
    for (int i = 0; i < n; i++) xr[i] = x[i], slack[i] = 0;
    if (!vk_matmul_rounds_activations() || type == QT_F32) return;
    uint64_t bytes;
    assert_true(quant_nbytes(vt, (uint64_t)n, &bytes));
    void *q = malloc(bytes);
    xt->from_float(x, q, (size_t)n);
    xt->to_float(q, xr, (size_t)n);
    free(q);
    int bs = xt->block_size;
    for (int b = 0; bs > 1 && b < n; b += bs) {
        float amax = 0;
        for (int i = b; i < b + bs; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0;
        const bool f16 = bs == 32;
        const float dq = f16 ? fp16_to_fp32(fp32_to_fp16(d)) : d;
        uint32_t bits;
        memcpy(&bits, &d, 4);
        const uint32_t low = bits & 0x1FFFu;
        const bool tie = f16 && (low > 0x1000u ? low - 0x1000u : 0x1000u - low) <= 8;
        for (int i = b; i < b + bs; i++) {
            const float a = fabsf(x[i] * id);
            if (fabsf(a - floorf(a) - 0.5f) < 5e-4f) slack[i] += dq;
            if (tie) slack[i] += fabsf(xr[i]) / 1024;
        }
    }
}

/* For one weight type: quantize a random matrix of `cols` columns with the
 * CPU's own quantizer, run it on the device for 64, 17, 3 and 1 activation rows in
 * one recording, and check against the dequantized weights in double, and
 * each row's bits across the batch sizes. */
static void check_matmul(vk_device *dev, vk_recorder *rec, uint32_t type, int cols) {
    const quant_type_info *qi = quant_type_get(type);
    assert_non_null(qi);
    assert_true(vk_matmul_supports(type));
    uint64_t row_bytes;
    assert_true(quant_nbytes(type, cols, &row_bytes));
    size_t w_bytes = (size_t)row_bytes * ROWS;
    uint8_t *w = malloc(w_bytes);
    float *wf = malloc(sizeof(float) * cols), *deq = malloc(sizeof(float) * ROWS * cols);
    float *x = malloc(sizeof(float) * XR * cols);
    uint64_t seed = 99 + type;
    for (int o = 0; o < ROWS; o++) {
        for (int i = 0; i < cols; i++) wf[i] = frand(&seed) * (o % 7 == 0 ? 3.0f : 1.0f);
        qi->from_float(wf, w + (size_t)o * row_bytes, cols);
        qi->to_float(w + (size_t)o * row_bytes, deq + (size_t)o * cols, cols);
    }
    for (int i = 0; i < XR * cols; i++) x[i] = frand(&seed) * (i % 89 == 0 ? 6.0f : 1.0f);
    float *xr = malloc(sizeof(float) * XR * cols), *slack = malloc(sizeof(float) * XR * cols);
    device_acts(type, x, xr, slack, XR * cols);
    /* y: the 64-row result, then 17 rows, 3 rows, and the single rows. */
    const int sizes[3] = {XR, 17, 3};
    size_t y_floats = (size_t)ROWS * (XR + 17 + 3 + NS);
    vk_buffer *wb, *xb, *yb;
    cellm_error err;
    assert_int_equal(vk_buffer_create(dev, W_OFF + w_bytes, VK_BUF_DEVICE, &wb, &err), CELLM_OK);
    assert_int_equal(
        vk_buffer_create(dev, X_OFF + sizeof(float) * XR * cols, VK_BUF_DEVICE, &xb, &err),
        CELLM_OK);
    assert_int_equal(
        vk_buffer_create(dev, Y_OFF + sizeof(float) * y_floats, VK_BUF_DEVICE, &yb, &err),
        CELLM_OK);
    assert_int_equal(vk_buffer_upload(wb, W_OFF, w, w_bytes, &err), CELLM_OK);
    assert_int_equal(vk_buffer_upload(xb, X_OFF, x, sizeof(float) * XR * cols, &err), CELLM_OK);
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    /* NaN everywhere first, so a missed output cannot pass. */
    assert_int_equal(
        vk_recorder_fill(rec, yb, 0, vk_buffer_size(yb) & ~(size_t)3, 0x7FC00000u, &err), CELLM_OK);
    vk_recorder_barrier(rec);
    size_t y_at = 0;
    for (int s = 0; s < 3; s++) {
        assert_int_equal(vk_matmul(rec, type, wb, W_OFF, ROWS, cols, xb, X_OFF, yb,
                                   Y_OFF + sizeof(float) * y_at, (uint32_t)sizes[s], &err),
                         CELLM_OK);
        y_at += (size_t)ROWS * sizes[s];
    }
    for (int k = 0; k < NS; k++)
        assert_int_equal(vk_matmul(rec, type, wb, W_OFF, ROWS, cols, xb,
                                   X_OFF + sizeof(float) * cols * single[k], yb,
                                   Y_OFF + sizeof(float) * (y_at + (size_t)ROWS * k), 1, &err),
                         CELLM_OK);
    assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
    float *y = malloc(sizeof(float) * y_floats);
    assert_int_equal(vk_buffer_download(yb, Y_OFF, y, sizeof(float) * y_floats, &err), CELLM_OK);
    const float *y64 = y, *y17 = y + ROWS * XR, *y3 = y17 + ROWS * 17, *y1 = y3 + ROWS * 3;
    /* Against double sums of the CPU's dequantized weights and the
     * activations as the device takes them. */
    double worst = 0;
    for (int r = 0; r < XR; r++)
        for (int o = 0; o < ROWS; o++) {
            double ref = 0, mag = 0, off = 0;
            for (int i = 0; i < cols; i++) {
                double wi = deq[(size_t)o * cols + i], t = wi * xr[r * cols + i];
                ref += t;
                mag += fabs(t);
                off += fabs(wi) * slack[r * cols + i];
            }
            double e = fabs(y64[r * ROWS + o] - ref) / (mag + 1e-30);
            if (!(fabs(y64[r * ROWS + o] - ref) <= 1e-5 * mag + off)) {
                print_error("%s: row %d output %d: %.9g, reference %.9g (magnitude %.3g)\n",
                            qi->name, r, o, y64[r * ROWS + o], ref, mag);
                fail();
            }
            if (off == 0 && e > worst) worst = e;
        }
    /* Batch invariance: the bits of a row alone, among 3, 17 and 64. */
    assert_memory_equal(y17, y64, sizeof(float) * ROWS * 17);
    assert_memory_equal(y3, y64, sizeof(float) * ROWS * 3);
    for (int k = 0; k < NS; k++)
        assert_memory_equal(y1 + ROWS * k, y64 + ROWS * single[k], sizeof(float) * ROWS);
    print_message("    %-5s worst relative error %.2g\n", qi->name, worst);
    vk_buffer_free(wb);
    vk_buffer_free(xb);
    vk_buffer_free(yb);
    free(w);
    free(wf);
    free(deq);
    free(x);
    free(xr);
    free(slack);
    free(y);
}

static void test_vulkan_matmul(void **state) {
    (void)state;
    vk_device *dev = open_device(NULL);
    vk_recorder *rec;
    cellm_error err;
    assert_int_equal(vk_recorder_create(dev, &rec, &err), CELLM_OK);
    const uint32_t types[] = {QT_F32,  QT_F16,  QT_Q4_0, QT_Q4_1, QT_Q5_0,
                              QT_Q8_0, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    /* Both kernels on this device: the cooperative one GPUs take and the
     * lane-per-output one CPU emulations take (vk_matmul_lane_variant). */
    static const char *const kernels[2] = {"coop", "lane"};
    for (int k = 0; k < 2; k++) {
        setenv("CELLM_VK_MATMUL", kernels[k], 1);
        print_message("  %s kernel\n", kernels[k]);
        for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
            check_matmul(dev, rec, types[i], 512);
        /* Widths whose chunks of 32 share out over fewer than 16 lanes
         * (vk_matmul.c's matmul_lanes): 18 chunks over 9, 24 over 12, 49
         * over 13 (the last lane one short). */
        check_matmul(dev, rec, QT_Q4_1, 576);
        check_matmul(dev, rec, QT_Q4_K, 768);
        check_matmul(dev, rec, QT_Q8_0, 1568);
        /* Four outputs an invocation, which batches of more than 128 rows
         * take, on these batches. */
        setenv("CELLM_VK_MM_OPT", "4", 1);
        check_matmul(dev, rec, QT_Q4_1, 576);
        check_matmul(dev, rec, QT_Q6_K, 512);
        unsetenv("CELLM_VK_MM_OPT");
        /* The tiled form prompts take (past 128 rows) on the batches of
         * 64 and 17 rows, in the shape it takes (32 outputs by 32 rows)
         * and a larger one (64 by 64), against single rows through the
         * cooperative form. */
        if (k == 0) {
            setenv("CELLM_VK_MM_TILED", "1", 1);
            for (int t = 0; t < 2; t++) {
                if (t) setenv("CELLM_VK_MM_TILE", "256x16", 1);
                print_message("  tiled kernel, %s\n", t ? "256 invocations" : "64 invocations");
                for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
                    check_matmul(dev, rec, types[i], t && i < 6 ? 576 : 512);
                check_matmul(dev, rec, QT_Q4_K, 768);
                check_matmul(dev, rec, QT_Q8_0, 1568);
            }
            unsetenv("CELLM_VK_MM_TILE");
            unsetenv("CELLM_VK_MM_TILED");
        }
        /* The activations rounded as the CPU rounds them ($CELLM_VK_ACT=q8). */
        setenv("CELLM_VK_ACT", "q8", 1);
        print_message("  %s kernel, activations rounded as the CPU's\n", kernels[k]);
        for (size_t i = 1; i < sizeof types / sizeof types[0]; i++)
            check_matmul(dev, rec, types[i], i % 2 ? 512 : 768);
        unsetenv("CELLM_VK_ACT");
    }
    unsetenv("CELLM_VK_MATMUL");
    /* A type without a kernel is refused, not run. */
    assert_false(vk_matmul_supports(QT_Q2_K));
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    assert_int_equal(vk_matmul(rec, QT_Q2_K, NULL, 0, 8, 256, NULL, 0, NULL, 0, 1, &err),
                     CELLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "Q2_K"));
    vk_device_close(dev); /* with the recorder still alive */
    assert_int_equal(vk_live_objects(), 0);
}

/* Ragged shapes through vk_matmul_record: 13 outputs (a partial tile of
 * 8), 9 rows (a partial tile), strided x and y rows; the outputs past each
 * row's end are left as they were. Q4_K (blocks of 256) and Q4_0 (18-byte
 * blocks, a row of 8 blocks starting at odd word offsets). */
static void test_vulkan_matmul_ragged(void **state) {
    (void)state;
    vk_device *dev = open_device(NULL);
    vk_recorder *rec;
    cellm_error err;
    assert_int_equal(vk_recorder_create(dev, &rec, &err), CELLM_OK);
    enum { N = 13, K = 256, R = 9, XS = K + 40, YS = N + 7 };
    const uint32_t types[2] = {QT_Q4_K, QT_Q4_0};
    /* Each type with f32 activations, then rounded as the CPU
     * ($CELLM_VK_ACT=q8: the lanes' blocks of strided rows), then through
     * the tiled form. */
    for (int t = 0; t < 6; t++) {
        const uint32_t type = types[t % 2];
        if (t == 2) setenv("CELLM_VK_ACT", "q8", 1);
        if (t == 4) { /* the tiled form (prompts past 128 rows) */
            unsetenv("CELLM_VK_ACT");
            setenv("CELLM_VK_MM_TILED", "1", 1);
        }
        const quant_type_info *qi = quant_type_get(type);
        uint64_t rb;
        assert_true(quant_nbytes(type, K, &rb));
        uint8_t *w = malloc(rb * N);
        float wf[K], deq[N][K], x[R * XS], y[R * YS], y1[YS];
        uint64_t seed = 17 + t;
        for (int o = 0; o < N; o++) {
            for (int i = 0; i < K; i++) wf[i] = frand(&seed);
            qi->from_float(wf, w + o * rb, K);
            qi->to_float(w + o * rb, deq[o], K);
        }
        for (int i = 0; i < R * XS; i++) x[i] = frand(&seed);
        float xr[R][K], slack[R][K];
        for (int r = 0; r < R; r++) device_acts(type, x + r * XS, xr[r], slack[r], K);
        vk_buffer *wb, *xb, *yb, *y1b;
        assert_int_equal(vk_buffer_create(dev, 2 + rb * N, VK_BUF_DEVICE, &wb, &err), CELLM_OK);
        assert_int_equal(vk_buffer_create(dev, sizeof x, VK_BUF_DEVICE, &xb, &err), CELLM_OK);
        assert_int_equal(vk_buffer_create(dev, sizeof y, VK_BUF_DEVICE, &yb, &err), CELLM_OK);
        assert_int_equal(vk_buffer_create(dev, sizeof y1 * R, VK_BUF_DEVICE, &y1b, &err), CELLM_OK);
        assert_int_equal(vk_buffer_upload(wb, 2, w, rb * N, &err), CELLM_OK);
        assert_int_equal(vk_buffer_upload(xb, 0, x, sizeof x, &err), CELLM_OK);
        assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
        assert_int_equal(vk_recorder_fill(rec, yb, 0, sizeof y, 0x3F800000u, &err), CELLM_OK);
        vk_recorder_barrier(rec);
        vk_matmul_args a = {.type = type,
                            .w = wb,
                            .w_off = 2,
                            .rows = N,
                            .cols = K,
                            .x = xb,
                            .x_stride = XS,
                            .y = yb,
                            .y_stride = YS,
                            .n_rows = R};
        assert_int_equal(vk_matmul_record(rec, &a, &err), CELLM_OK);
        for (int r = 0; r < R; r++) /* each row alone */
            assert_int_equal(vk_matmul(rec, type, wb, 2, N, K, xb, sizeof(float) * XS * r, y1b,
                                       sizeof y1 * r, 1, &err),
                             CELLM_OK);
        assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
        assert_int_equal(vk_buffer_download(yb, 0, y, sizeof y, &err), CELLM_OK);
        for (int r = 0; r < R; r++) {
            for (int o = 0; o < N; o++) {
                double ref = 0, mag = 0, off = 0;
                for (int i = 0; i < K; i++) {
                    ref += (double)deq[o][i] * xr[r][i];
                    mag += fabs((double)deq[o][i] * xr[r][i]);
                    off += fabs((double)deq[o][i]) * slack[r][i];
                }
                if (!(fabs(y[r * YS + o] - ref) <= 1e-5 * mag + off)) {
                    print_error("%s: row %d output %d: %.9g, reference %.9g\n", qi->name, r, o,
                                y[r * YS + o], ref);
                    fail();
                }
            }
            for (int o = N; o < YS; o++) assert_true(y[r * YS + o] == 1.0f); /* untouched */
            assert_int_equal(vk_buffer_download(y1b, sizeof y1 * r, y1, sizeof(float) * N, &err),
                             CELLM_OK);
            assert_memory_equal(y1, y + r * YS, sizeof(float) * N);
        }
        vk_buffer_free(wb);
        vk_buffer_free(xb);
        vk_buffer_free(yb);
        vk_buffer_free(y1b);
        free(w);
    }
    unsetenv("CELLM_VK_MM_TILED");
    unsetenv("CELLM_VK_ACT");
    /* Misaligned and short operands are refused. */
    vk_buffer *b;
    assert_int_equal(vk_buffer_create(dev, 1 << 16, VK_BUF_DEVICE, &b, &err), CELLM_OK);
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    assert_int_equal(vk_matmul(rec, QT_Q4_0, b, 1, 8, 64, b, 0, b, 0, 1, &err),
                     CELLM_ERR_INVALID_ARG);
    assert_int_equal(vk_matmul(rec, QT_Q4_0, b, 0, 8, 48, b, 0, b, 0, 1, &err),
                     CELLM_ERR_INVALID_ARG);
    assert_int_equal(vk_matmul(rec, QT_F32, b, 0, 1024, 64, b, 0, b, 0, 1, &err),
                     CELLM_ERR_INVALID_ARG); /* 256 KiB of weights in a 64 KiB buffer */
    assert_non_null(strstr(err.msg, "outside its buffer"));
    vk_device_close(dev);
    assert_int_equal(vk_live_objects(), 0);
}

/* The GLU input of the cooperative kernel (vk_matmul_args.u): act(g) * u
 * computed as the tile loads has the bits of act.comp's dispatch followed
 * by the plain product, for SiLU and GELU, on 1 and 5 rows and on 9
 * through the tiled form. A recording submitted again reads its inputs
 * anew: after new g is uploaded, vk_recorder_resubmit gives what a fresh
 * recording gives. The lane variant refuses a GLU input. */
static void test_vulkan_matmul_glu(void **state) {
    (void)state;
    vk_device *dev = open_device(NULL);
    vk_recorder *rec;
    cellm_error err;
    assert_int_equal(vk_recorder_create(dev, &rec, &err), CELLM_OK);
    setenv("CELLM_VK_MATMUL", "coop", 1);
    enum { N = 24, K = 256, R = 9 };
    const quant_type_info *qi = quant_type_get(QT_Q4_1);
    uint64_t rb;
    assert_true(quant_nbytes(QT_Q4_1, K, &rb));
    uint8_t *w = malloc(rb * N);
    float wf[K], g[R * K], u[R * K], sep[R * N], fused[R * N], again[R * N], fresh[R * N];
    uint64_t seed = 5;
    for (int o = 0; o < N; o++) {
        for (int i = 0; i < K; i++) wf[i] = frand(&seed);
        qi->from_float(wf, w + o * rb, K);
    }
    vk_buffer *wb, *gb, *ub, *tb, *yb, *fb;
    assert_int_equal(vk_buffer_create(dev, rb * N, VK_BUF_DEVICE, &wb, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof g, VK_BUF_DEVICE, &gb, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof u, VK_BUF_DEVICE, &ub, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof g, VK_BUF_DEVICE, &tb, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof sep, VK_BUF_DEVICE, &yb, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof fused, VK_BUF_DEVICE, &fb, &err), CELLM_OK);
    assert_int_equal(vk_buffer_upload(wb, 0, w, rb * N, &err), CELLM_OK);
    const vk_pipeline *act;
    assert_int_equal(vk_pipeline_get(dev, VK_SHADER_ACT, &act, &err), CELLM_OK);
    for (uint32_t kind = 0; kind < 2; kind++)
        for (int pass = 0; pass < 3; pass++) {
            /* 1 and 5 rows, and 9 through the tiled form (which prompts
             * take past 128 rows). */
            const int rows = pass == 0 ? 1 : pass == 1 ? 5 : R;
            if (pass == 2) setenv("CELLM_VK_MM_TILED", "1", 1);
            /* Values across GELU's cut-offs at +-10 and SiLU's tails. */
            for (int i = 0; i < R * K; i++) {
                g[i] = frand(&seed) * (i % 13 == 0 ? 24.0f : 4.0f);
                u[i] = frand(&seed);
            }
            assert_int_equal(vk_buffer_upload(gb, 0, g, sizeof g, &err), CELLM_OK);
            assert_int_equal(vk_buffer_upload(ub, 0, u, sizeof u, &err), CELLM_OK);
            /* Separate: t = g; t = act(t) * u; y = W t. */
            assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
            assert_int_equal(vk_recorder_copy(rec, gb, 0, tb, 0, sizeof g, &err), CELLM_OK);
            vk_recorder_barrier(rec);
            struct {
                uint32_t n, act;
            } pa = {(uint32_t)(rows * K), kind};
            vk_binding ab[2] = {{tb, 0, 0}, {ub, 0, 0}};
            uint32_t groups[3] = {(pa.n + 255) / 256, 1, 1};
            assert_int_equal(vk_recorder_dispatch(rec, act, ab, 2, &pa, sizeof pa, groups, &err),
                             CELLM_OK);
            vk_recorder_barrier(rec);
            assert_int_equal(
                vk_matmul(rec, QT_Q4_1, wb, 0, N, K, tb, 0, yb, 0, (uint32_t)rows, &err), CELLM_OK);
            assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
            assert_int_equal(vk_buffer_download(yb, 0, sep, sizeof(float) * rows * N, &err),
                             CELLM_OK);
            /* Fused, from g and u as they are. */
            vk_matmul_args a = {.type = QT_Q4_1,
                                .w = wb,
                                .rows = N,
                                .cols = K,
                                .x = gb,
                                .y = fb,
                                .n_rows = (uint32_t)rows,
                                .u = ub,
                                .act = kind};
            assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
            assert_int_equal(vk_matmul_record(rec, &a, &err), CELLM_OK);
            assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
            assert_int_equal(vk_buffer_download(fb, 0, fused, sizeof(float) * rows * N, &err),
                             CELLM_OK);
            assert_memory_equal(fused, sep, sizeof(float) * rows * N);
            /* The same recording again over new g, against a fresh one. */
            for (int i = 0; i < R * K; i++) g[i] = frand(&seed) * 4.0f;
            assert_int_equal(vk_buffer_upload(gb, 0, g, sizeof g, &err), CELLM_OK);
            assert_int_equal(vk_recorder_resubmit(rec, &err), CELLM_OK);
            assert_int_equal(vk_buffer_download(fb, 0, again, sizeof(float) * rows * N, &err),
                             CELLM_OK);
            assert_memory_not_equal(again, fused, sizeof(float) * rows * N);
            assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
            assert_int_equal(vk_matmul_record(rec, &a, &err), CELLM_OK);
            assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
            assert_int_equal(vk_buffer_download(fb, 0, fresh, sizeof(float) * rows * N, &err),
                             CELLM_OK);
            assert_memory_equal(again, fresh, sizeof(float) * rows * N);
            unsetenv("CELLM_VK_MM_TILED");
        }
    /* Nothing to submit again once a new recording has begun. */
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    assert_int_equal(vk_recorder_resubmit(rec, &err), CELLM_ERR_INVALID_ARG);
    setenv("CELLM_VK_MATMUL", "lane", 1);
    vk_matmul_args a = {
        .type = QT_Q4_1, .w = wb, .rows = N, .cols = K, .x = gb, .y = fb, .n_rows = 1, .u = ub};
    assert_int_equal(vk_matmul_record(rec, &a, &err), CELLM_ERR_INVALID_ARG);
    unsetenv("CELLM_VK_MATMUL");
    free(w);
    vk_device_close(dev);
    assert_int_equal(vk_live_objects(), 0);
}

/* Without push descriptors: sets from the recorder's pools, more dispatches
 * in one recording than one pool holds, and again after a reset. */
static void test_asan_vulkan_descriptor_pools(void **state) {
    (void)state;
    vk_open_params p = vk_open_default_params();
    p.no_push_descriptor = true;
    vk_device *dev = open_device(&p);
    assert_false(vk_device_get_info(dev)->push_descriptor);
    enum { R = 8, C = 64, D = 700 };
    const quant_type_info *qi = quant_type_get(QT_Q8_0);
    uint64_t rb;
    assert_true(quant_nbytes(QT_Q8_0, C, &rb));
    uint8_t w[R * 68];
    float wf[C], x[C], y[D];
    uint64_t seed = 5;
    for (int o = 0; o < R; o++) {
        for (int i = 0; i < C; i++) wf[i] = frand(&seed);
        qi->from_float(wf, w + o * rb, C);
    }
    for (int i = 0; i < C; i++) x[i] = frand(&seed);
    vk_buffer *wb, *xb, *yb;
    cellm_error err;
    assert_int_equal(vk_buffer_create(dev, sizeof w, VK_BUF_DEVICE, &wb, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof x, VK_BUF_DEVICE, &xb, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof(float) * R * D, VK_BUF_DEVICE, &yb, &err),
                     CELLM_OK);
    assert_int_equal(vk_buffer_upload(wb, 0, w, sizeof w, &err), CELLM_OK);
    assert_int_equal(vk_buffer_upload(xb, 0, x, sizeof x, &err), CELLM_OK);
    vk_recorder *rec;
    assert_int_equal(vk_recorder_create(dev, &rec, &err), CELLM_OK);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
        for (int k = 0; k < D; k++)
            assert_int_equal(
                vk_matmul(rec, QT_Q8_0, wb, 0, R, C, xb, 0, yb, sizeof(float) * R * k, 1, &err),
                CELLM_OK);
        assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
    }
    float *all = malloc(sizeof(float) * R * D);
    assert_int_equal(vk_buffer_download(yb, 0, all, sizeof(float) * R * D, &err), CELLM_OK);
    for (int k = 0; k < D; k++) y[k] = all[R * k + 3];
    for (int k = 1; k < D; k++) assert_memory_equal(&y[k], &y[0], sizeof(float));
    assert_memory_equal(all + R * (D - 1), all, sizeof(float) * R);
    free(all);
    /* A dispatch with the wrong bindings is refused and kept. */
    const vk_pipeline *pipe;
    assert_int_equal(vk_pipeline_get(dev, VK_SHADER_MATMUL_Q8_0, &pipe, &err), CELLM_OK);
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    vk_binding b[1] = {{wb, 0, 0}};
    uint32_t groups[3] = {1, 1, 1};
    uint32_t push[8] = {0};
    assert_int_equal(vk_recorder_dispatch(rec, pipe, b, 1, push, sizeof push, groups, &err),
                     CELLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "bindings"));
    assert_int_equal(vk_recorder_submit(rec, &err), CELLM_ERR_INVALID_ARG);
    vk_device_close(dev);
    assert_int_equal(vk_live_objects(), 0);
}

/* attention.comp on its own, against a double reference of the CPU's
 * rounding (Q and the probabilities as f16): rows of their own sequences
 * through shuffled block tables, sliding windows (lo not a multiple of 16),
 * soft-capping, the second table of a row, head dims that are not
 * multiples of 8 (the shader's 4-byte loads) and up to 512, GQA, and
 * contexts past what the shader keeps in shared memory (its tiled path:
 * more than 2880 positions). Every K and V entry outside a row's lo..pos is
 * NaN, so a position read that should not be shows. Each row also runs
 * alone, with the same bits. */
typedef struct attn_push {
    uint32_t n_head, n_head_kv, hd, hdv;
    int32_t window;
    float scale, softcap;
    uint32_t group, k_row_words, v_row_words, block_words;
    /* The decode form (fused, with qk_prep's inputs): off here;
     * test_vk_forward checks it against the separate form, bit for bit. */
    uint32_t rope_pairs, rope_neox, rope_cfg, rope_cfgs, flags;
    float eps;
    uint32_t fused;
} attn_push;

typedef struct attn_case {
    uint32_t hd, hdv, n_head, n_head_kv;
    int32_t window;
    float softcap;
    uint32_t group;
    int n_rows;
    int32_t pos[9];
} attn_case;

static const attn_case attn_cases[] = {
    {64, 64, 9, 3, 2900, 0.0f, 0, 9, {0, 1, 15, 16, 37, 200, 2879, 2880, 3100}},
    {256, 256, 4, 1, 40, 1.0f, 1, 6, {0, 39, 40, 41, 100, 300}},
    {6, 10, 2, 2, 0, 0.0f, 0, 4, {0, 5, 33, 70}},
    {512, 512, 2, 1, 0, 0.0f, 0, 3, {0, 20, 130}},
};

static float round_f16(float x) {
    return fp16_to_fp32(fp32_to_fp16(x));
}

enum { SLOT = 8192 }; /* bytes between single rows' operands: any device's alignment */

static void check_attention(vk_device *dev, vk_recorder *rec, const attn_case *c, uint64_t seed) {
    const int R = c->n_rows;
    const uint32_t kw = c->n_head_kv * c->hd / 2, vw = c->n_head_kv * c->hdv / 2;
    const uint32_t bw = 16 * (kw + vw);
    /* Each row's table, then a decoy table (what the row's other group
     * names) of blocks no row owns: NaN throughout. */
    int32_t base[9], total = 0, maxpos = 0;
    for (int r = 0; r < R; r++) {
        base[r] = total;
        total += c->pos[r] / 16 + 1;
        if (c->pos[r] > maxpos) maxpos = c->pos[r];
    }
    const int32_t decoy = total, n_decoy = maxpos / 16 + 1;
    total += n_decoy;
    int32_t *perm = malloc(sizeof(int32_t) * total);
    for (int i = 0; i < total; i++) perm[i] = i;
    for (int i = total - 1; i > 0; i--) {
        int k = (int)(rnd(&seed) % (uint32_t)(i + 1)), s = perm[i];
        perm[i] = perm[k];
        perm[k] = s;
    }
    size_t kv_words = (size_t)total * bw;
    uint32_t *kv = malloc(sizeof(uint32_t) * kv_words);
    for (size_t i = 0; i < kv_words; i++) kv[i] = 0x7E007E00u; /* NaN pairs */
    uint16_t *h16 = (uint16_t *)kv;
    for (int r = 0; r < R; r++) {
        int32_t pos = c->pos[r],
                lo = c->window > 0 && pos - c->window + 1 > 0 ? pos - c->window + 1 : 0;
        for (int32_t j = lo; j <= pos; j++) {
            size_t b = (size_t)perm[base[r] + j / 16] * bw;
            uint16_t *k = h16 + 2 * (b + (size_t)(j % 16) * kw);
            uint16_t *v = h16 + 2 * (b + 16 * (size_t)kw + (size_t)(j % 16) * vw);
            for (uint32_t i = 0; i < 2 * kw; i++) k[i] = fp32_to_fp16(frand(&seed));
            for (uint32_t i = 0; i < 2 * vw; i++) v[i] = fp32_to_fp16(frand(&seed));
        }
    }
    size_t qn = (size_t)c->n_head * c->hd, on = (size_t)c->n_head * c->hdv;
    float *q = malloc(sizeof(float) * qn * R);
    for (size_t i = 0; i < qn * R; i++) q[i] = 4.0f * frand(&seed);
    int32_t ri[9][4];
    for (int r = 0; r < R; r++) {
        ri[r][0] = c->pos[r];
        ri[r][1] = c->group == 0 ? base[r] : decoy;
        ri[r][2] = c->group == 1 ? base[r] : decoy;
        ri[r][3] = 0;
    }

    cellm_error err;
    vk_buffer *qb, *rib, *tb, *kvb, *ob, *q1b, *ri1b, *o1b;
    const size_t kv_off = 512; /* the layer's slice starts inside the pool */
    assert_int_equal(vk_buffer_create(dev, sizeof(float) * qn * R, VK_BUF_DEVICE, &qb, &err),
                     CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof ri, VK_BUF_DEVICE, &rib, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof(int32_t) * total, VK_BUF_DEVICE, &tb, &err),
                     CELLM_OK);
    assert_int_equal(
        vk_buffer_create(dev, kv_off + sizeof(uint32_t) * kv_words, VK_BUF_DEVICE, &kvb, &err),
        CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof(float) * on * R, VK_BUF_DEVICE, &ob, &err),
                     CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, (size_t)SLOT * R, VK_BUF_DEVICE, &q1b, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, (size_t)SLOT * R, VK_BUF_DEVICE, &ri1b, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, (size_t)SLOT * R, VK_BUF_DEVICE, &o1b, &err), CELLM_OK);
    assert_int_equal(vk_buffer_upload(qb, 0, q, sizeof(float) * qn * R, &err), CELLM_OK);
    assert_int_equal(vk_buffer_upload(rib, 0, ri, sizeof ri, &err), CELLM_OK);
    assert_int_equal(vk_buffer_upload(tb, 0, perm, sizeof(int32_t) * total, &err), CELLM_OK);
    assert_int_equal(vk_buffer_upload(kvb, kv_off, kv, sizeof(uint32_t) * kv_words, &err),
                     CELLM_OK);
    for (int r = 0; r < R; r++) {
        assert_int_equal(
            vk_buffer_upload(q1b, (size_t)SLOT * r, q + qn * r, sizeof(float) * qn, &err),
            CELLM_OK);
        assert_int_equal(vk_buffer_upload(ri1b, (size_t)SLOT * r, ri[r], sizeof ri[r], &err),
                         CELLM_OK);
    }
    /* The batch through the module batches with prompt rows take
     * (attention.comp -DPREFILL), each row alone through the plain one,
     * bit for bit below. */
    const vk_pipeline *pipe, *pipe_batch;
    assert_int_equal(vk_pipeline_get(dev, VK_SHADER_ATTENTION, &pipe, &err), CELLM_OK);
    assert_int_equal(vk_pipeline_get(dev, VK_SHADER_ATTENTION_PREFILL, &pipe_batch, &err),
                     CELLM_OK);
    attn_push p = {c->n_head,  c->n_head_kv,
                   c->hd,      c->hdv,
                   c->window,  1.0f / sqrtf((float)c->hd),
                   c->softcap, c->group,
                   kw,         vw,
                   bw,         0,
                   0,          0,
                   0,          0,
                   0.0f,       0};
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    assert_int_equal(vk_recorder_fill(rec, ob, 0, sizeof(float) * on * R, 0x7FC00000u, &err),
                     CELLM_OK);
    vk_recorder_barrier(rec);
    vk_binding kb = {kvb, kv_off, sizeof(uint32_t) * kv_words};
    const vk_binding unused = {qb, 0, 0}; /* the decode form's inputs */
    vk_binding b[10] = {{qb, 0, 0}, {rib, 0, 0}, {tb, 0, 0}, kb,     {ob, 0, 0},
                        unused,     unused,      unused,     unused, unused};
    uint32_t g[3] = {(uint32_t)R, c->n_head, 1};
    assert_int_equal(vk_recorder_dispatch(rec, pipe_batch, b, 10, &p, sizeof p, g, &err), CELLM_OK);
    for (int r = 0; r < R; r++) {
        vk_binding b1[10] = {{q1b, (size_t)SLOT * r, SLOT},
                             {ri1b, (size_t)SLOT * r, SLOT},
                             {tb, 0, 0},
                             kb,
                             {o1b, (size_t)SLOT * r, SLOT},
                             unused,
                             unused,
                             unused,
                             unused,
                             unused};
        uint32_t g1[3] = {1, c->n_head, 1};
        assert_int_equal(vk_recorder_dispatch(rec, pipe, b1, 10, &p, sizeof p, g1, &err), CELLM_OK);
    }
    assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
    float *o = malloc(sizeof(float) * on * R), *o1 = malloc(sizeof(float) * on);
    assert_int_equal(vk_buffer_download(ob, 0, o, sizeof(float) * on * R, &err), CELLM_OK);

    double worst = 0, *s = malloc(sizeof(double) * (maxpos + 1));
    for (int r = 0; r < R; r++) {
        int32_t pos = c->pos[r],
                lo = c->window > 0 && pos - c->window + 1 > 0 ? pos - c->window + 1 : 0;
        for (uint32_t h = 0; h < c->n_head; h++) {
            uint32_t kvh = h / (c->n_head / c->n_head_kv);
            const float *qh = q + qn * r + (size_t)h * c->hd;
            double mx = -INFINITY, sum = 0;
            for (int32_t j = lo; j <= pos; j++) {
                size_t bb = (size_t)perm[base[r] + j / 16] * bw;
                const uint16_t *k = h16 + 2 * (bb + (size_t)(j % 16) * kw) + kvh * c->hd;
                double d = 0;
                for (uint32_t i = 0; i < c->hd; i++)
                    d += (double)round_f16(qh[i]) * fp16_to_fp32(k[i]);
                d *= p.scale;
                if (c->softcap > 0) d = c->softcap * tanh(fmax(-15, fmin(15, d / c->softcap)));
                s[j - lo] = d;
                if (d > mx) mx = d;
            }
            for (int32_t j = lo; j <= pos; j++) sum += exp(s[j - lo] - mx);
            for (uint32_t e = 0; e < c->hdv; e++) {
                double ref = 0, mag = 0;
                for (int32_t j = lo; j <= pos; j++) {
                    size_t bb = (size_t)perm[base[r] + j / 16] * bw;
                    const uint16_t *v =
                        h16 + 2 * (bb + 16 * (size_t)kw + (size_t)(j % 16) * vw) + kvh * c->hdv;
                    double t =
                        (double)round_f16((float)(exp(s[j - lo] - mx) / sum)) * fp16_to_fp32(v[e]);
                    ref += t;
                    mag += fabs(t);
                }
                float got = o[on * r + (size_t)h * c->hdv + e];
                double err_rel = fabs(got - ref) / (mag + 1e-30);
                if (!(err_rel <= 2e-3)) {
                    print_error("attention hd %u: row %d (pos %d) head %u dim %u: %.9g, reference "
                                "%.9g (magnitude %.3g)\n",
                                c->hd, r, pos, h, e, got, ref, mag);
                    fail();
                }
                if (err_rel > worst) worst = err_rel;
            }
        }
        assert_int_equal(vk_buffer_download(o1b, (size_t)SLOT * r, o1, sizeof(float) * on, &err),
                         CELLM_OK);
        assert_memory_equal(o1, o + on * r, sizeof(float) * on);
    }
    print_message("    hd %3u/%3u: worst relative error %.2g\n", c->hd, c->hdv, worst);
    vk_buffer_free(qb);
    vk_buffer_free(rib);
    vk_buffer_free(tb);
    vk_buffer_free(kvb);
    vk_buffer_free(ob);
    vk_buffer_free(q1b);
    vk_buffer_free(ri1b);
    vk_buffer_free(o1b);
    free(perm);
    free(kv);
    free(q);
    free(o);
    free(o1);
    free(s);
}

static void test_vulkan_attention(void **state) {
    (void)state;
    vk_device *dev = open_device(NULL);
    vk_recorder *rec;
    cellm_error err;
    assert_int_equal(vk_recorder_create(dev, &rec, &err), CELLM_OK);
    for (size_t i = 0; i < sizeof attn_cases / sizeof attn_cases[0]; i++)
        check_attention(dev, rec, &attn_cases[i], 1234 + i);
    vk_device_close(dev);
    assert_int_equal(vk_live_objects(), 0);
}

/* top.comp: the K best of rows made of ties, signed zeros, infinities and
 * NaN, against a sort on the host, through both stages (rows of 9,000
 * logits: three slices, the last short), bound at row 0 and (out0,
 * shift) at an unaligned row 1. */
static void test_vulkan_top(void **state) {
    (void)state;
    enum { R = 8, V = 9000, K = 8 };
    static float l[R * V];
    uint64_t seed = 77;
    const float pick[] = {0.5f, 1.0f, -0.0f, 0.0f, -INFINITY, NAN, -3.0f, 2.0f};
    for (int r = 0; r < R; r++)
        for (int i = 0; i < V; i++) {
            float *x = &l[r * V + i];
            switch (r) {
            case 0: *x = frand(&seed) * 8; break;
            case 1: *x = pick[rnd(&seed) % 8]; break;
            case 2: *x = NAN; break;
            case 3: *x = rnd(&seed) % 3 ? -INFINITY : NAN; break;
            case 4: *x = rnd(&seed) % 997 ? frand(&seed) : INFINITY; break;
            case 5: *x = 1.25f; break;
            case 6:
                *x = rnd(&seed) % 2 ? -0.0f : rnd(&seed) % 2 ? 0.0f : -frand(&seed) - 1.0f;
                break;
            default:
                *x = i >= V - 3 ? 100.0f : (float)(i % 7) - 10.0f;
                break; /* best in the short slice */
            }
        }
    vk_device *dev = open_device(NULL);
    vk_recorder *rec;
    cellm_error err;
    vk_buffer *lb, *pb, *ob;
    const uint32_t S = vk_top_slices(V);
    assert_int_equal(S, 3);
    const size_t row = sizeof(float) * V, out = sizeof(uint32_t) * 2 * K;
    assert_int_equal(vk_recorder_create(dev, &rec, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, sizeof l, VK_BUF_DEVICE, &lb, &err), CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, out * S * (2 * R - 1), VK_BUF_DEVICE, &pb, &err),
                     CELLM_OK);
    assert_int_equal(vk_buffer_create(dev, out * (2 * R - 1), VK_BUF_DEVICE, &ob, &err), CELLM_OK);
    assert_int_equal(vk_buffer_upload(lb, 0, l, sizeof l, &err), CELLM_OK);
    const vk_pipeline *pipe;
    assert_int_equal(vk_pipeline_get(dev, VK_SHADER_TOP, &pipe, &err), CELLM_OK);
    assert_int_equal(vk_recorder_begin(rec, &err), CELLM_OK);
    vk_top_push p0 = {V, 0, 0, 0, S},
                p1 = {V, (uint32_t)(vk_binding_shift(dev, row) / sizeof(float)), R, 0, S},
                p2 = {V, 0, 0, 1, S};
    vk_binding b0[2] = {{lb, 0, 0}, {pb, 0, 0}}, b1[2] = {{lb, row, row * (R - 1)}, {pb, 0, 0}},
               b2[2] = {{pb, 0, 0}, {ob, 0, 0}};
    uint32_t g0[3] = {S, R, 1}, g1[3] = {S, R - 1, 1}, g2[3] = {2 * R - 1, 1, 1};
    assert_int_equal(vk_recorder_dispatch(rec, pipe, b0, 2, &p0, sizeof p0, g0, &err), CELLM_OK);
    assert_int_equal(vk_recorder_dispatch(rec, pipe, b1, 2, &p1, sizeof p1, g1, &err), CELLM_OK);
    vk_recorder_barrier(rec);
    assert_int_equal(vk_recorder_dispatch(rec, pipe, b2, 2, &p2, sizeof p2, g2, &err), CELLM_OK);
    assert_int_equal(vk_recorder_submit(rec, &err), CELLM_OK);
    uint32_t o[(2 * R - 1) * 2 * K];
    assert_int_equal(vk_buffer_download(ob, 0, o, sizeof o, &err), CELLM_OK);
    for (int j = 0; j < 2 * R - 1; j++) {
        int r = j < R ? j : j - R + 1;
        const float *x = l + (size_t)r * V;
        int best[K];
        top_select(x, V, K, best);
        const uint32_t *oj = o + (size_t)j * 2 * K;
        for (int k = 0; k < K; k++) {
            if ((int)oj[K + k] != best[k])
                fail_msg("row %d (output %d) place %d: token %u, expected %d", r, j, k, oj[K + k],
                         best[k]);
            uint32_t bits;
            memcpy(&bits, &x[best[k]], 4);
            assert_int_equal(oj[k], bits); /* the logit as it was */
        }
    }
    vk_buffer_free(lb);
    vk_buffer_free(pb);
    vk_buffer_free(ob);
    vk_recorder_free(rec);
    vk_device_close(dev);
    assert_int_equal(vk_live_objects(), 0);
}

/* `cellm devices` lists the device the library opens, and with no loader
 * says so and still exits 0. */
static void test_vulkan_devices_command(void **state) {
    (void)state;
    vk_device *dev = open_device(NULL);
    char name[256];
    snprintf(name, sizeof name, "%s", vk_device_get_info(dev)->name);
    vk_device_close(dev);
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s devices 2>&1", test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "Vulkan: built in"));
    assert_non_null(strstr(out, name));
    assert_non_null(strstr(out, "<- default"));
    assert_non_null(strstr(out, "subgroup size"));
    free(out);
    snprintf(cmd, sizeof cmd, "CELLM_VULKAN_LOADER=libvulkan-cellm-missing.so %s devices 2>&1",
             test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 0);
    assert_non_null(strstr(out, "no Vulkan device: no Vulkan loader"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s devices --bogus 2>&1", test_cellm_bin());
    assert_int_equal(test_run_cmd(cmd, &out), 2);
    free(out);
}

/* A build without the backend: every entry point says so. */
static void test_vulkan_not_built(void **state) {
    (void)state;
    vk_device *dev = (vk_device *)1;
    cellm_error err;
    assert_int_equal(vk_device_open(NULL, &dev, &err), CELLM_ERR_UNSUPPORTED);
    assert_null(dev);
    assert_non_null(strstr(err.msg, "built without Vulkan"));
    uint32_t n = 3;
    assert_int_equal(vk_enumerate(NULL, 0, &n, &err), CELLM_ERR_UNSUPPORTED);
    assert_int_equal(n, 0);
    assert_non_null(strstr(err.msg, "built without Vulkan"));
    assert_false(vk_matmul_supports(QT_Q4_0));
    assert_int_equal(vk_live_objects(), 0);
}

int main(void) {
    /* test.sh's ASan run hides the Vulkan loader from every other program
     * (CELLM_VULKAN_LOADER naming no file): `--device auto` would open
     * lavapipe, whose unload leaves allocations LeakSanitizer reports. The
     * device tests need it, and keep lavapipe loaded (below). */
    unsetenv("CELLM_VULKAN_LOADER");
    /* test.sh's ASan run sets CELLM_TEST_FILTER=test_?san_* (the host side
     * of the device code), TSan and the aarch64 run test_tsan_* (none here:
     * the aarch64 build has no arm64 loader to open under qemu). */
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    /* The Vulkan loader unloads the driver at vkDestroyInstance, and Mesa's
     * lavapipe leaves a few static allocations behind when unloaded (128
     * bytes per instance, unreachable once its code is gone), which
     * LeakSanitizer would charge to this test. Keeping the driver loaded
     * for the life of the process leaves them reachable, as they are
     * meant to be. Nothing of cellm's own is exempt. */
    dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NODELETE);
    if (!vk_built()) {
        const struct CMUnitTest off[] = {cmocka_unit_test(test_vulkan_not_built)};
        return cmocka_run_group_tests(off, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_asan_vulkan_open),
        cmocka_unit_test(test_asan_vulkan_buffers),
        cmocka_unit_test(test_asan_vulkan_no_loader),
        cmocka_unit_test(test_asan_vulkan_no_driver),
        cmocka_unit_test(test_vulkan_matmul),
        cmocka_unit_test(test_vulkan_top),
        cmocka_unit_test(test_vulkan_matmul_ragged),
        cmocka_unit_test(test_vulkan_matmul_glu),
        cmocka_unit_test(test_vulkan_attention),
        cmocka_unit_test(test_asan_vulkan_descriptor_pools),
        cmocka_unit_test(test_vulkan_devices_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/*
 * bench_kernels.c — `cellm bench-kernels` (see bench_kernels.h).
 *
 * 1. Read bandwidth: threads sum disjoint contiguous parts of a buffer of
 *    8 times the last-level cache (at least 256 MiB, pages touched first),
 *    one untimed pass and then N timed ones (21 by default), for 1 and for
 *    the maximum number of threads: the median pass and the range. The
 *    median, not the best: the best of many passes on a shared machine is
 *    its luckiest moment, not what the kernels after it will get.
 * 2. For each weight type: a matrix of COLS columns and enough rows to fill
 *    the same size, made by quantizing 16 random rows and repeating them
 *    (the bytes still come from memory: the matrix is many times the cache).
 *    One matvec is the library's matmul() with one activation row, on the
 *    library's thread pool: exactly the engine's path (activation quantized
 *    with the type's vec_dot_type, weight rows split over the threads,
 *    dot products in tiles of four). Reported per thread count: median
 *    time, GB/s of weights streamed, the spread ((max - min) / median), the
 *    GB/s as a percentage of the median read bandwidth measured with as
 *    many threads, and the time of the same matmul with 8 activation rows.
 * 3. Matmul GFLOP/s with m = 8, 64 and 512 activation rows on a small
 *    matrix (8 MiB), where compute, not memory, sets the rate.
 */
#include "bench_kernels.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cpu/matmul.h"
#include "format/quant.h"
#include "base/threadpool.h"

#define MAX_THREADS 64
#define BATCH 8     /* activation rows of the batched streaming measurement */
#define MAX_M 512   /* the largest batch of the GFLOP/s columns */
#define SMALL_MIB 8 /* weights of the GFLOP/s matrix: compute, not memory */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs fn(arg_i) on n threads (the caller's thread takes part 0) and
 * returns the wall time. False when a thread cannot start. */
static bool run_parallel(void *(*fn)(void *), void *args, size_t arg_size, unsigned n,
                         double *secs) {
    pthread_t tid[MAX_THREADS];
    const double t0 = now_s();
    unsigned started = 1;
    for (; started < n; started++) {
        if (pthread_create(&tid[started], NULL, fn, (char *)args + started * arg_size) != 0) break;
    }
    fn(args);
    for (unsigned i = 1; i < started; i++) pthread_join(tid[i], NULL);
    *secs = now_s() - t0;
    return started == n;
}

/* ---- read bandwidth ---- */

typedef struct sum_arg {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} sum_arg;

/* Sums 64-byte lines with four 16-byte vector accumulators (GCC/clang
 * vector extensions: SSE2 or NEON on any CPU of ours), so the loop issues
 * wide loads and memory, not the adds, is what limits it. A scalar loop of
 * 8-byte loads tops out near 16 bytes a cycle, under what a core can pull
 * and under what the matvec kernels (32- and 64-byte loads) stream. */
typedef uint64_t u64x2 __attribute__((vector_size(16)));

static void *sum_part(void *v) {
    sum_arg *a = v;
    u64x2 s0 = {0, 0}, s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 8 <= a->n; i += 8) {
        u64x2 x0, x1, x2, x3;
        memcpy(&x0, a->p + i, 16);
        memcpy(&x1, a->p + i + 2, 16);
        memcpy(&x2, a->p + i + 4, 16);
        memcpy(&x3, a->p + i + 6, 16);
        s0 += x0;
        s1 += x1;
        s2 += x2;
        s3 += x3;
    }
    u64x2 s = s0 + s1 + s2 + s3;
    uint64_t sum = s[0] + s[1];
    for (; i < a->n; i++) sum += a->p[i];
    a->sum = sum;
    return NULL;
}

/* One pass of n threads over `bytes` of buf; GB/s, or 0 when a thread
 * cannot start. The sums go to *sink so that no load can be dropped. */
static double read_pass(const uint64_t *buf, size_t bytes, unsigned n, uint64_t *sink) {
    sum_arg args[MAX_THREADS];
    const size_t words = bytes / 8;
    for (unsigned i = 0; i < n; i++)
        args[i] = (sum_arg){buf + words * i / n, words * (i + 1) / n - words * i / n, 0};
    double t;
    if (!run_parallel(sum_part, args, sizeof *args, n, &t)) return 0;
    for (unsigned i = 0; i < n; i++) *sink += args[i].sum;
    return (double)bytes / t / 1e9;
}

/* The probe over a buffer the caller filled (every page touched): one
 * untimed pass, then `samples` timed ones summarised in *out. False when
 * a thread cannot start. */
static bool read_bandwidth(const uint64_t *buf, size_t bytes, unsigned n, int samples,
                           uint64_t *sink, bench_bandwidth *out) {
    double *gbs = malloc((size_t)samples * sizeof *gbs);
    bool ok = gbs && read_pass(buf, bytes, n, sink) > 0;
    for (int r = 0; r < samples && ok; r++) ok = (gbs[r] = read_pass(buf, bytes, n, sink)) > 0;
    if (ok) {
        qsort(gbs, (size_t)samples, sizeof *gbs, cmp_double);
        *out = (bench_bandwidth){
            .median_gbs =
                samples % 2 ? gbs[samples / 2] : 0.5 * (gbs[samples / 2 - 1] + gbs[samples / 2]),
            .min_gbs = gbs[0],
            .max_gbs = gbs[samples - 1],
            .samples = samples,
            .threads = n,
            .buffer_bytes = bytes,
        };
    }
    free(gbs);
    return ok;
}

/* Reads the first line of a small file (sysfs) into line; false when it
 * cannot be read. */
static bool read_line(const char *path, char *line, int size) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    const bool ok = fgets(line, size, f) != NULL;
    fclose(f);
    return ok;
}

size_t bench_llc_bytes(void) {
    /* sysfs first: it is what the kernel found per cache instance. glibc
     * 2.36's sysconf on AMD reads CPUID 0x80000006, which on the 2-core
     * development VM says 320 MiB (the host package's L3) where the kernel,
     * from CPUID 0x8000001D, reports the 32 MiB its two cores share. */
    size_t llc = 0;
    int top = 0;
    for (int i = 0; i < 32; i++) {
        char path[80], line[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (!read_line(path, line, sizeof line)) break;
        const int level = atoi(line);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (read_line(path, line, sizeof line) && !strncmp(line, "Instruction", 11)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (!read_line(path, line, sizeof line)) continue;
        char *end;
        unsigned long long v = strtoull(line, &end, 10);
        const int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
        if (end == line || v > (SIZE_MAX >> shift)) continue;
        v <<= shift;
        if (level > top || (level == top && v > llc)) {
            top = level;
            llc = (size_t)v;
        }
    }
#if defined(_SC_LEVEL3_CACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
    if (!llc) {
        long s = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (s <= 0) s = sysconf(_SC_LEVEL2_CACHE_SIZE);
        if (s > 0) llc = (size_t)s;
    }
#endif
    return llc;
}

size_t bench_bandwidth_buffer_bytes(size_t llc_bytes) {
    const size_t floor = (size_t)256 << 20;
    if (!llc_bytes) llc_bytes = (size_t)32 << 20;
    if (llc_bytes > SIZE_MAX / 8) return SIZE_MAX;
    return 8 * llc_bytes > floor ? 8 * llc_bytes : floor;
}

/* A buffer of `bytes` (a multiple of 8) with every page written, so no
 * page fault lands in a timed pass; NULL when it cannot be had. */
static uint64_t *alloc_touched(size_t bytes) {
    uint64_t *buf = malloc(bytes);
    if (buf)
        for (size_t i = 0; i < bytes / 8; i++) buf[i] = i;
    return buf;
}

/* ---- matmul ---- */

typedef struct bench_opts {
    size_t mib; /* weights per matrix */
    size_t cols;
    int reps;
    int bw_samples;   /* timed passes of the bandwidth probe */
    unsigned threads; /* the largest count measured */
} bench_opts;

typedef struct mv_result {
    double median_s, min_s, max_s;
    bool ok;
} mv_result;

/* Times `reps` calls of the library's matmul (the engine's path: the
 * activation rows quantized, then the weight rows split over the pool)
 * with m activation rows, after one warm-up. */
static mv_result time_matmul(threadpool *tp, uint32_t type, const uint8_t *w, size_t rows,
                             size_t cols, const float *x, int64_t m, void *scratch, float *y,
                             int reps) {
    mv_result res = {0};
    double *times = malloc((size_t)reps * sizeof *times);
    if (!times) return res;
    for (int r = -1; r < reps; r++) {
        const double t0 = now_s();
        matmul(tp, w, type, (int64_t)rows, (int64_t)cols, x, m, y, scratch);
        if (r >= 0) times[r] = now_s() - t0;
    }
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    res.median_s = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
    res.min_s = times[0];
    res.max_s = times[reps - 1];
    res.ok = true;
    free(times);
    return res;
}

/* Builds the matrix for `type` and prints its rows of the table. */
static bool bench_type(uint32_t type, const bench_opts *o, const double *bw) {
    const quant_type_info *info = quant_type_get(type);
    const size_t cols = o->cols, seed_rows = 16;
    const size_t row_bytes = cols / info->block_size * info->type_size;
    const size_t rows = (o->mib << 20) >= row_bytes ? (o->mib << 20) / row_bytes : 1;
    const size_t bytes = rows * row_bytes;
    uint8_t *w = malloc(bytes);
    float *seed = malloc(seed_rows * cols * sizeof(float));
    /* The GFLOP/s matrix is the first rows of the big one: all of it when
     * --mib is under SMALL_MIB. */
    size_t small_rows = ((size_t)SMALL_MIB << 20) / row_bytes;
    if (small_rows > rows || !small_rows) small_rows = rows;
    float *x = malloc(MAX_M * cols * sizeof(float));
    void *xq = malloc(matmul_scratch_size(type, (int64_t)cols, MAX_M));
    float *y = malloc((BATCH * rows > MAX_M * small_rows ? BATCH * rows : MAX_M * small_rows) *
                      sizeof(float));
    bool ok = w && seed && x && xq && y;
    if (ok) {
        srand(1234);
        for (size_t i = 0; i < seed_rows * cols; i++)
            seed[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * 0.1f;
        for (size_t i = 0; i < MAX_M * cols; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        for (size_t r = 0; r < seed_rows && r < rows; r++)
            info->from_float(seed + r * cols, w + r * row_bytes, cols);
        for (size_t r = seed_rows; r < rows; r++)
            memcpy(w + r * row_bytes, w + (r % seed_rows) * row_bytes, row_bytes);
        for (unsigned n = 1; n <= o->threads;
             n = n < o->threads && 2 * n > o->threads ? o->threads : 2 * n) {
            threadpool *tp = NULL;
            cellm_error err;
            if (tp_create((int)n, &tp, &err) != CELLM_OK) {
                ok = false;
                break;
            }
            const mv_result m = time_matmul(tp, type, w, rows, cols, x, 1, xq, y, o->reps);
            const mv_result mb = time_matmul(tp, type, w, rows, cols, x, BATCH, xq, y, o->reps);
            /* GFLOP/s (2 n k m per matmul) on a matrix the cache holds. */
            static const int64_t ms[3] = {8, 64, MAX_M};
            double gflops[3];
            for (int i = 0; i < 3 && ok; i++) {
                const int reps = ms[i] == MAX_M ? 3 : 5;
                const mv_result g =
                    time_matmul(tp, type, w, small_rows, cols, x, ms[i], xq, y, reps);
                ok = g.ok;
                gflops[i] =
                    2.0 * (double)small_rows * (double)cols * (double)ms[i] / g.median_s / 1e9;
            }
            tp_destroy(tp);
            if (!ok || !m.ok || !mb.ok) {
                ok = false;
                break;
            }
            const double gbs = (double)bytes / m.median_s / 1e9;
            printf(
                "%-6s %7u %7zu %8.1f %9.2f %8.2f %7.1f%% %7.1f%% %9.2f %7.2f %7.1f %7.1f %7.1f\n",
                info->name, n, rows, (double)bytes / (1 << 20), m.median_s * 1e3, gbs,
                100.0 * (m.max_s - m.min_s) / m.median_s, 100.0 * gbs / bw[n], mb.median_s * 1e3,
                mb.median_s / m.median_s, gflops[0], gflops[1], gflops[2]);
            fflush(stdout);
        }
    }
    free(y);
    free(xq);
    free(x);
    free(seed);
    free(w);
    return ok;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: cellm bench-kernels [--threads N] [--reps N] [--mib N] [--cols N]\n"
            "                           [--bw-samples N]\n\n"
            "Measures the read bandwidth, then the matrix-vector product (one activation\n"
            "row) for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K over a matrix much larger than\n"
            "the cache: GB/s of weights streamed and the share of the median bandwidth,\n"
            "with 1 thread up to N.\n"
            "  --threads N     most threads (default 2)\n"
            "  --reps N        timed repetitions per kernel measurement (default 10)\n"
            "  --mib N         MiB of weights per matrix (default: the bandwidth buffer's\n"
            "                  size, 8 x the last-level cache and at least 256)\n"
            "  --cols N        columns, a multiple of 256 (default 8192)\n"
            "  --bw-samples N  timed passes of the bandwidth probe (default %d)\n",
            BENCH_BW_SAMPLES);
}

void bench_print_buffer_rule(size_t buffer_bytes, size_t llc_bytes) {
    if (llc_bytes)
        printf("%zu MiB (8 x the %.1f MiB last-level cache, at least 256)", buffer_bytes >> 20,
               (double)llc_bytes / (1 << 20));
    else
        printf("%zu MiB (last-level cache unknown: the 256 MiB floor)", buffer_bytes >> 20);
}

int cmd_bench_kernels(int argc, char **argv) {
    bench_opts o = {.cols = 8192, .reps = 10, .threads = 2, .bw_samples = BENCH_BW_SAMPLES};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        unsigned long long v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        const bool has_val = i + 1 < argc;
        if (!strcmp(a, "--threads")) {
            if (!has_val || !cli_parse_uint(argv[++i], MAX_THREADS, &v) || !v) {
                cli_error("--threads needs a count from 1 to %d", MAX_THREADS);
                return 2;
            }
            o.threads = (unsigned)v;
        } else if (!strcmp(a, "--reps")) {
            if (!has_val || !cli_parse_uint(argv[++i], 10000, &v) || !v) {
                cli_error("--reps needs a count from 1 to 10000");
                return 2;
            }
            o.reps = (int)v;
        } else if (!strcmp(a, "--bw-samples")) {
            if (!has_val || !cli_parse_uint(argv[++i], 10000, &v) || !v) {
                cli_error("--bw-samples needs a count from 1 to 10000");
                return 2;
            }
            o.bw_samples = (int)v;
        } else if (!strcmp(a, "--mib")) {
            if (!has_val || !cli_parse_uint(argv[++i], 1 << 16, &v) || !v) {
                cli_error("--mib needs a size in MiB from 1 to 65536");
                return 2;
            }
            o.mib = (size_t)v;
        } else if (!strcmp(a, "--cols")) {
            if (!has_val || !cli_parse_uint(argv[++i], 1 << 20, &v) || !v || v % 256) {
                cli_error("--cols needs a multiple of 256 up to 1048576");
                return 2;
            }
            o.cols = (size_t)v;
        } else {
            cli_error("bench-kernels: unknown argument '%s' (see `cellm bench-kernels --help`)", a);
            return 2;
        }
    }

    const size_t llc = bench_llc_bytes(), bytes = bench_bandwidth_buffer_bytes(llc);
    if (!o.mib) o.mib = bytes >> 20;
    uint64_t *buf = alloc_touched(bytes);
    if (!buf) {
        cli_error("bench-kernels: cannot allocate %zu MiB for the bandwidth probe", bytes >> 20);
        return 1;
    }
    double bw[MAX_THREADS + 1] = {0};
    uint64_t sink = 0;
    printf("cellm bench-kernels: kernels %s, %d repetitions, %zu MiB of weights per matrix, "
           "%zu columns\n",
           quant_kernels_name(), o.reps, o.mib, o.cols);
    printf("read bandwidth, median (min-max) of %d passes over ", o.bw_samples);
    bench_print_buffer_rule(bytes, llc);
    printf("\n ");
    for (unsigned n = 1; n <= o.threads;
         n = n < o.threads && 2 * n > o.threads ? o.threads : 2 * n) {
        bench_bandwidth r;
        if (!read_bandwidth(buf, bytes, n, o.bw_samples, &sink, &r)) {
            cli_error("bench-kernels: cannot start %u threads", n);
            free(buf);
            return 1;
        }
        bw[n] = r.median_gbs;
        printf(" %u thread%s %.2f (%.2f-%.2f) GB/s%s", n, n > 1 ? "s" : "", r.median_gbs, r.min_gbs,
               r.max_gbs, n < o.threads ? "," : "");
    }
    printf("%s\n", sink == 1 ? " " : ""); /* keeps the sums live */
    free(buf);

    printf("\n%-6s %7s %7s %8s %9s %8s %8s %8s %9s %7s %7s %7s %7s\n", "type", "threads", "rows",
           "MiB", "median ms", "GB/s", "spread", "% of bw", "m=8 ms", "m8/m1", "GF m8", "GF m64",
           "GF m512");
    static const uint32_t types[] = {QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q8_0, QT_Q4_K, QT_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (!bench_type(types[i], &o, bw)) {
            cli_error("bench-kernels: out of memory or threads for %s",
                      quant_type_get(types[i])->name);
            return 1;
        }
    }
    printf("\nThe first columns are the matvec (m = 1). GB/s counts weight bytes per matvec;\n"
           "%% of bw divides it by the median read bandwidth at the same thread count;\n"
           "spread is (max - min) / median. m=8 ms is the median of a matmul with 8\n"
           "activation rows and m8/m1 its cost in matvecs (8 would mean no reuse of the\n"
           "weights). GF m8, m64, m512: GFLOP/s (2 n k m per matmul) with m activation rows\n"
           "on a %zu MiB matrix, which the cache holds: the compute rate without the memory.\n",
           o.mib < SMALL_MIB ? o.mib : (size_t)SMALL_MIB);
    return 0;
}

static volatile uint64_t g_sink; /* keeps the sums from being optimised away */

bool bench_read_bandwidth(unsigned n_threads, int samples, bench_bandwidth *out) {
    *out = (bench_bandwidth){0};
    if (n_threads < 1) n_threads = 1;
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (samples < 1) samples = 1;
    const size_t llc = bench_llc_bytes(), bytes = bench_bandwidth_buffer_bytes(llc);
    uint64_t *buf = alloc_touched(bytes);
    if (!buf) return false;
    uint64_t sink = 0;
    const bool ok = read_bandwidth(buf, bytes, n_threads, samples, &sink, out);
    free(buf);
    g_sink = sink;
    if (ok) out->llc_bytes = llc;
    return ok;
}

/*
 * bench_kernels.h — `cellm bench-kernels`: how close the matrix-vector
 * kernels come to the machine's memory bandwidth. Decoding one token reads
 * every weight once, so a matvec (m = 1) over a matrix far larger than the
 * last-level cache should stream its weights at the speed memory delivers
 * them; the ratio of the two says how much the kernel itself costs.
 * The read-bandwidth probe is shared with `cellm bench --pp/--tg`, which
 * sets decode speed against it.
 */
#ifndef CELLM_BENCH_KERNELS_H
#define CELLM_BENCH_KERNELS_H

#include <stdbool.h>
#include <stddef.h>

int cmd_bench_kernels(int argc, char **argv);

/* Timed passes of the probe unless a command is told otherwise. Odd, so
 * the median is one of the passes. */
#define BENCH_BW_SAMPLES 21

/* What the read-bandwidth probe measured: n threads, each summing its own
 * contiguous part of one buffer, one untimed pass and then `samples` timed
 * ones. GB/s are 1e9 bytes/s. Shares of the bandwidth divide by the
 * median; min and max show how much the machine moved while it ran. */
typedef struct bench_bandwidth {
    double median_gbs, min_gbs, max_gbs;
    int samples;         /* timed passes */
    unsigned threads;    /* threads that read */
    size_t buffer_bytes; /* bench_bandwidth_buffer_bytes(llc_bytes) */
    size_t llc_bytes;    /* last-level cache found; 0 when unknown */
} bench_bandwidth;

/* The size in bytes of one instance of the CPU's last-level cache (the
 * highest level cpu0 has), or 0 when the system does not say. Linux and
 * Android: /sys/devices/system/cpu/cpu0/cache; elsewhere glibc's
 * sysconf(_SC_LEVEL3_CACHE_SIZE) (then level 2) where it exists. */
size_t bench_llc_bytes(void);

/* The probe's buffer: 8 times the last-level cache, so that the cache
 * holds at most an eighth of it, and never under 256 MiB; an unknown
 * cache (llc_bytes 0) counts as 32 MiB, which gives the 256 MiB floor. */
size_t bench_bandwidth_buffer_bytes(size_t llc_bytes);

/* Prints the buffer's size and how the rule above chose it, e.g.
 * "256 MiB (8 x the 32.0 MiB last-level cache, at least 256)", to stdout. */
void bench_print_buffer_rule(size_t buffer_bytes, size_t llc_bytes);

/* Runs the probe with n_threads (1 to 64) and `samples` timed passes
 * (at least 1) over a buffer of bench_bandwidth_buffer_bytes(), allocated
 * and freed here. False, with *out zeroed, when the buffer or the threads
 * cannot be had. */
bool bench_read_bandwidth(unsigned n_threads, int samples, bench_bandwidth *out);

#endif /* CELLM_BENCH_KERNELS_H */

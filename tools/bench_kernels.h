/*
 * bench_kernels.h — `cellm bench-kernels`: how close the matrix-vector
 * kernels come to the machine's memory bandwidth. Decoding one token reads
 * every weight once, so a matvec (m = 1) over a matrix far larger than the
 * last-level cache should stream its weights at the speed memory delivers
 * them; the ratio of the two says how much the kernel itself costs.
 */
#ifndef CELLM_BENCH_KERNELS_H
#define CELLM_BENCH_KERNELS_H

#include <stddef.h>

int cmd_bench_kernels(int argc, char **argv);

/* The best read bandwidth in GB/s (1e9 bytes/s) of n_threads threads summing
 * a buffer of `mib` MiB, over `reps` runs; 0 if the buffer cannot be had.
 * `cellm bench` sets decode speed against it. */
double bench_read_bandwidth(unsigned n_threads, size_t mib, int reps);

#endif /* CELLM_BENCH_KERNELS_H */

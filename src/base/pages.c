/*
 * pages.c — anonymous page mappings and giving pages back (see pages.h).
 * Linux and Android drop a page range with madvise(MADV_DONTNEED), which
 * frees it at once and refills it with zeros on the next touch; elsewhere
 * (Darwin, the BSDs) a fresh anonymous mapping is put over the range with
 * MAP_FIXED, which has the same effect with POSIX calls only.
 */
#if defined(__APPLE__)
#define _DARWIN_C_SOURCE /* MAP_ANON next to _POSIX_C_SOURCE */
#else
#define _DEFAULT_SOURCE /* madvise and MAP_ANONYMOUS next to _POSIX_C_SOURCE */
#endif

#include "base/pages.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#if !defined(MAP_ANONYMOUS) && defined(MAP_ANON)
#define MAP_ANONYMOUS MAP_ANON
#endif

size_t pages_size(void) {
    long n = sysconf(_SC_PAGESIZE);
    return n > 0 ? (size_t)n : 4096;
}

void *pages_map(size_t bytes) {
    if (bytes == 0) return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void pages_unmap(void *p, size_t bytes) {
    if (p) munmap(p, bytes);
}

size_t pages_release(void *p, size_t bytes) {
    size_t page = pages_size();
    uintptr_t lo = ((uintptr_t)p + page - 1) / page * page;
    uintptr_t hi = ((uintptr_t)p + bytes) / page * page;
    if (hi <= lo) return 0;
    size_t n = (size_t)(hi - lo);
#if defined(__linux__)
    if (madvise((void *)lo, n, MADV_DONTNEED) == 0) return n;
#endif
    void *q =
        mmap((void *)lo, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return q == MAP_FAILED ? 0 : n;
}

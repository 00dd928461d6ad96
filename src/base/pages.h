/*
 * pages.h — memory in whole pages straight from the OS, for pools whose
 * pages should go back to the OS when memory runs low (the KV cache). Such
 * memory costs nothing until it is touched, and pages_release() returns
 * pages without unmapping them: they read as zero on their next use.
 */
#ifndef CELLM_PAGES_H
#define CELLM_PAGES_H

#include <stddef.h>

/* The OS page size in bytes. */
size_t pages_size(void);

/* `bytes` of zeroed, private memory, page-aligned; NULL when the OS
 * refuses. Free with pages_unmap(p, bytes). */
void *pages_map(size_t bytes);
void pages_unmap(void *p, size_t bytes);

/* Gives the whole pages inside [p, p + bytes) back to the OS (the partial
 * pages at either end stay); they read as zero when next touched. Returns
 * the bytes given back. `p` must lie in memory from pages_map. */
size_t pages_release(void *p, size_t bytes);

#endif /* CELLM_PAGES_H */

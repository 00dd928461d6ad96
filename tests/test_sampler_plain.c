/*
 * test_sampler_plain.c — all of test_sampler.c against the sampler built
 * without GCC/Clang vector types (CELLM_NO_VECTOR_EXT), the path compilers
 * without them take. It must draw the same tokens bit for bit, the golden
 * draws included: the vector and the plain exponential are the same
 * operations in the same order.
 */
#define CELLM_NO_VECTOR_EXT
#include "runtime/sampler.c"

#include "test_sampler.c"

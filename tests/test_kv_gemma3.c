/*
 * test_kv_gemma3.c — Gemma 3's perplexity over the forward fixture's text
 * with each compressed KV type against f16 KV (forward_rig.h:
 * check_kv_perplexity). Apart from test_kv_forward, which has SmolLM2's,
 * so that each runs within ctest's time limit under the sanitizers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "forward_rig.h"

static void test_ppl_gemma3(void **st) {
    (void)st;
    check_kv_perplexity("gemma3-270m");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ppl_gemma3),
    };
    /* test.sh's TSan and aarch64 runs set CELLM_TEST_FILTER=test_tsan_*,
     * which leaves this slow test out there. */
    if (getenv("CELLM_TEST_FILTER")) cmocka_set_test_filter(getenv("CELLM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}

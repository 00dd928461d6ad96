/* top_ref.h — the host's reference for a row's best logits in fwd_top's
 * order (model/backend.h), for test_sampler and test_vulkan. */
#ifndef CELLM_TEST_TOP_REF_H
#define CELLM_TEST_TOP_REF_H

#include <math.h>
#include <stdbool.h>

/* Whether logit a (token ta) comes before b (tb): the larger first (-0
 * equal to +0), NaN last, a tie to the lower token. */
static inline bool top_before(float a, int ta, float b, int tb) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? ta < tb : isnan(b);
    return a > b || (a == b && ta < tb);
}

/* The k best of x[0..n) into best[0..k), by selection: slow and plain. */
static inline void top_select(const float *x, int n, int k, int *best) {
    for (int q = 0; q < k; q++) {
        int b = -1;
        for (int i = 0; i < n; i++) {
            bool taken = false;
            for (int p = 0; p < q; p++) taken |= best[p] == i;
            if (!taken && (b < 0 || top_before(x[i], i, x[b], b))) b = i;
        }
        best[q] = b;
    }
}

#endif /* CELLM_TEST_TOP_REF_H */

/* test_stop.c — stop strings over streamed pieces: matches inside one piece
 * and across several, held tails released when they turn out not to be a
 * stop string, nothing of a stop string ever emitted, and every split of a
 * text giving the same output. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "text/stop.h"

/* Feeds `text` in pieces cut at `cuts` (sorted offsets), then flushes;
 * writes everything emitted into out and returns the matched index. */
static int run(stop_matcher *m, const char *text, const size_t *cuts, size_t n_cuts, char *out) {
    size_t prev = 0, len = strlen(text), o = 0;
    bool stopped = false;
    stop_reset(m);
    for (size_t c = 0; c <= n_cuts && !stopped; c++) {
        size_t end = c < n_cuts ? cuts[c] : len;
        const char *e;
        size_t el;
        assert_int_equal(stop_feed(m, text + prev, end - prev, &e, &el, &stopped, NULL), CELLM_OK);
        memcpy(out + o, e, el);
        o += el;
        prev = end;
    }
    if (!stopped) {
        const char *e;
        size_t el;
        stop_flush(m, &e, &el);
        memcpy(out + o, e, el);
        o += el;
    }
    out[o] = '\0';
    return stop_matched(m);
}

static void test_basic(void **st) {
    (void)st;
    const char *stops[] = {"<|im_end|>", "\n\nUser:"};
    stop_matcher *m;
    assert_int_equal(stop_create(stops, 2, &m, NULL), CELLM_OK);
    char out[256];
    size_t c1[] = {5};
    assert_int_equal(run(m, "Hello<|im_end|>tail", c1, 1, out), 0);
    assert_string_equal(out, "Hello");
    size_t c2[] = {3, 7, 9, 12};
    assert_int_equal(run(m, "Hi <|im_ok no\n\nUser: x", c2, 4, out), 1);
    assert_string_equal(out, "Hi <|im_ok no");
    /* A held prefix that never completes comes out on flush. */
    assert_int_equal(run(m, "end <|im", NULL, 0, out), -1);
    assert_string_equal(out, "end <|im");
    stop_free(m);
}

/* What is emitted before each piece is fed must never contain the start of
 * a stop string that then completes. */
static void test_never_leaks(void **st) {
    (void)st;
    const char *stops[] = {"STOP"};
    stop_matcher *m;
    assert_int_equal(stop_create(stops, 1, &m, NULL), CELLM_OK);
    const char *pieces[] = {"ab", "S", "T", "O", "P", "zz"};
    bool stopped = false;
    char seen[64] = "";
    for (int i = 0; i < 6 && !stopped; i++) {
        const char *e;
        size_t el;
        assert_int_equal(stop_feed(m, pieces[i], strlen(pieces[i]), &e, &el, &stopped, NULL),
                         CELLM_OK);
        strncat(seen, e, el);
        assert_null(strchr(seen, 'S'));
    }
    assert_true(stopped);
    assert_string_equal(seen, "ab");
    /* After a match, nothing more. */
    const char *e;
    size_t el;
    assert_int_equal(stop_feed(m, "more", 4, &e, &el, &stopped, NULL), CELLM_OK);
    assert_int_equal(el, 0);
    assert_true(stopped);
    stop_free(m);
}

/* Every way of cutting a text into two or three pieces gives the same
 * result as feeding it whole. */
static void test_all_splits(void **st) {
    (void)st;
    const char *stops[] = {"abab", "b\xc3\xa9", "</s>"};
    stop_matcher *m;
    assert_int_equal(stop_create(stops, 3, &m, NULL), CELLM_OK);
    const char *texts[] = {"xxabaabab yy", "ab ab a</s", "aab\xc3\xa9z", "no stop here ab"};
    for (size_t t = 0; t < 4; t++) {
        char want[64], got[64];
        int wi = run(m, texts[t], NULL, 0, want);
        size_t len = strlen(texts[t]);
        for (size_t a = 0; a <= len; a++) {
            for (size_t b = a; b <= len; b++) {
                size_t cuts[2] = {a, b};
                assert_int_equal(run(m, texts[t], cuts, 2, got), wi);
                assert_string_equal(got, want);
            }
        }
    }
    char out[64];
    assert_int_equal(run(m, "xxabaabab yy", NULL, 0, out), 0);
    assert_string_equal(out, "xxaba");
    assert_int_equal(run(m, "ab ab a</s", NULL, 0, out), -1);
    assert_string_equal(out, "ab ab a</s");
    stop_free(m);
}

static void test_empty_rejected(void **st) {
    (void)st;
    const char *stops[] = {"ok", ""};
    stop_matcher *m;
    cellm_error err;
    assert_int_equal(stop_create(stops, 2, &m, &err), CELLM_ERR_INVALID_ARG);
    assert_null(m);
    assert_non_null(strstr(err.msg, "empty"));
    /* No stop strings: everything passes through at once. */
    assert_int_equal(stop_create(NULL, 0, &m, NULL), CELLM_OK);
    const char *e;
    size_t el;
    bool stopped;
    assert_int_equal(stop_feed(m, "abc", 3, &e, &el, &stopped, NULL), CELLM_OK);
    assert_int_equal(el, 3);
    assert_false(stopped);
    stop_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic),
        cmocka_unit_test(test_never_leaks),
        cmocka_unit_test(test_all_splits),
        cmocka_unit_test(test_empty_rejected),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test_util.c — status names, error records and size parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "cli.h"
#include "format/quant.h"
#include "base/util.h"

static void test_err_set(void **state) {
    (void)state;
    cellm_error e;
    err_clear(&e);
    assert_int_equal(e.code, CELLM_OK);
    assert_int_equal(err_set(&e, CELLM_ERR_FORMAT, "bad %s at %d", "field", 7), CELLM_ERR_FORMAT);
    assert_string_equal(e.msg, "bad field at 7");
    assert_int_equal(err_set(NULL, CELLM_ERR_IO, "x"), CELLM_ERR_IO);
    assert_string_equal(cellm_status_str(CELLM_ERR_CHECKSUM), "checksum mismatch");
}

static void test_parse_size(void **state) {
    (void)state;
    size_t v;
    assert_true(cli_parse_size("512M", &v));
    assert_int_equal(v, 512u << 20);
    assert_true(cli_parse_size("2GiB", &v));
    assert_int_equal(v, (size_t)2 << 30);
    assert_true(cli_parse_size("1234", &v));
    assert_int_equal(v, 1234);
    assert_false(cli_parse_size("-1", &v));
    assert_false(cli_parse_size("12X", &v));
    assert_false(cli_parse_size("99999999999999999999G", &v));
    assert_false(cli_parse_size("", &v));
}

static void test_quant_table(void **state) {
    (void)state;
    uint64_t n;
    assert_true(quant_nbytes(QT_Q4_K, 512, &n));
    assert_int_equal(n, 288);
    assert_false(quant_nbytes(QT_Q4_K, 100, &n));       /* not whole blocks */
    assert_false(quant_nbytes(4, 32, &n));              /* retired id */
    assert_false(quant_nbytes(QT_F32, UINT64_MAX, &n)); /* overflow */
    uint32_t t;
    assert_non_null(quant_type_by_name("q8_0", &t));
    assert_int_equal(t, QT_Q8_0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_set),
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_quant_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

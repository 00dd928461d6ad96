#!/usr/bin/env bash
# test.sh — sets everything up and runs the whole test suite: the unit and
# real-model tests (warnings as errors), the same under ASan+UBSan and under
# TSan, the fuzzers for a bounded time, the kernel tests cross-compiled for
# aarch64 under QEMU, and the format check. Exits non-zero on any failure.
# CI runs exactly this (.ci/run).
#   FUZZ_SECONDS=N   seconds per fuzzer (default 60 in all, split evenly)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$CELLM_ROOT"

cellm_install_packages --test

passed=0
failed=0
run_ctest() { # run_ctest BUILD_DIR LABEL [CTEST ARGS...]
    local log dir="$1" label="$2"
    shift 2
    log="$(mktemp)"
    echo "== ctest ($label)"
    if (cd "$dir" && ctest --output-on-failure -j2 "$@") >"$log" 2>&1; then :; fi
    cat "$log"
    local line
    line="$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1)"
    if [ -z "$line" ]; then
        echo "test.sh: ctest ($label) printed no summary" >&2
        failed=$((failed + 1))
    else
        local total nfail
        total="$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")"
        nfail="$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$line")"
        passed=$((passed + total - nfail))
        failed=$((failed + nfail))
    fi
    rm -f "$log"
}

echo "== build (warnings are errors; with the Java binding)"
cellm_build build -DCELLM_WERROR=ON -DCELLM_BUILD_JAVA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo

echo "== real models"
"$CELLM_ROOT/build/cellm" pull smollm2-135m
"$CELLM_ROOT/build/cellm" pull gemma3-270m

run_ctest build "release"

echo "== examples (programs that use only cellm.h)"
for ex in build/example_*; do
    if "$ex" "${CELLM_HOME:-$HOME/.cache/cellm}/models/smollm2-135m.gguf" >"$ex.log" 2>&1; then
        echo "-- $(basename "$ex"): ok"
        passed=$((passed + 1))
    else
        cat "$ex.log"
        echo "test.sh: $(basename "$ex") failed" >&2
        failed=$((failed + 1))
    fi
done

# count_summary LOG LABEL RC: adds the counts of a test program's closing
# "N passed, M failed" line; a program that failed without one counts as one
# failure.
count_summary() {
    local line
    line="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -1)"
    if [ -n "$line" ]; then
        passed=$((passed + $(cut -d' ' -f1 <<<"$line")))
        failed=$((failed + $(cut -d' ' -f3 <<<"$line")))
    fi
    if [ "$3" -ne 0 ] && { [ -z "$line" ] || [ "$(cut -d' ' -f3 <<<"$line")" -eq 0 ]; }; then
        echo "test.sh: $2 exited with $3" >&2
        failed=$((failed + 1))
    fi
}

# run_java_test LABEL JNI_LIBRARY [VAR=VALUE...]: the Java binding's test
# program (bindings/java/test) on the real default model, counted.
run_java_test() {
    local label="$1" lib="$2" log rc=0
    shift 2
    log="$(mktemp)"
    echo "-- Java binding test ($label)"
    # A UTF-8 locale: the test runs `cellm run` with non-ASCII prompts as
    # arguments, which the JVM encodes in the locale's charset (under CI's
    # empty environment, ASCII: every emoji would become '?').
    env "$@" LC_ALL=C.UTF-8 CELLM_BIN="$CELLM_ROOT/build/cellm" timeout 900 java \
        -Dcellm.jni.library="$lib" \
        -cp build/cellm.jar:build/cellm-test.jar org.cellm.CellmTest >"$log" 2>&1 || rc=$?
    cat "$log"
    count_summary "$log" "the Java binding test ($label)" "$rc"
    rm -f "$log"
}

# run_python_tests LABEL [VAR=VALUE...]: the Python binding's unittest tests
# on the real default model, from outside the source tree with the package
# pip installed into build/python-site, counted.
run_python_tests() {
    local label="$1" log rc=0 total nfail n kind
    shift
    log="$(mktemp)"
    echo "-- Python binding tests ($label)"
    (cd "$(dirname "$log")" && env "$@" PYTHONPATH="$CELLM_ROOT/build/python-site" \
        CELLM_BIN="$CELLM_ROOT/build/cellm" timeout 900 \
        python3 -m unittest discover -v -s "$CELLM_ROOT/bindings/python/tests") >"$log" 2>&1 ||
        rc=$?
    cat "$log"
    total="$(sed -nE 's/^Ran ([0-9]+) tests? in .*/\1/p' "$log" | tail -1)"
    nfail=0
    for kind in failures errors; do
        n="$(sed -nE "s/^FAILED \(.*$kind=([0-9]+).*/\1/p" "$log" | tail -1)"
        nfail=$((nfail + ${n:-0}))
    done
    if [ -n "$total" ]; then
        passed=$((passed + total - nfail))
        failed=$((failed + nfail))
    fi
    if [ "$rc" -ne 0 ] && { [ -z "$total" ] || [ "$nfail" -eq 0 ]; }; then
        echo "test.sh: the Python binding tests ($label) exited with $rc" >&2
        failed=$((failed + 1))
    fi
    rm -f "$log"
}

echo "== Java binding (bindings/java, JNI on the desktop JVM, real default model)"
run_java_test "release" "$CELLM_ROOT/build/libcellm_jni.so"
# The example docs/mobile.md shows (an Android-shaped chat), run on the desktop.
if java -Dcellm.jni.library="$CELLM_ROOT/build/libcellm_jni.so" \
    -cp build/cellm.jar:build/cellm-examples.jar org.cellm.examples.StreamingChat \
    "${CELLM_HOME:-$HOME/.cache/cellm}/models/smollm2-135m.gguf" \
    "What is the capital of France?" "And of Italy?" >build/java_example.log 2>&1; then
    echo "-- StreamingChat (Java example): ok"
    passed=$((passed + 1))
else
    cat build/java_example.log
    echo "test.sh: the Java example StreamingChat failed" >&2
    failed=$((failed + 1))
fi

echo "== Python binding (pip install ./bindings/python, real default model)"
# Installed into a folder of its own (no virtualenv or system site needed);
# pip builds libcellm into the package with CMake.
rm -rf build/python-site
if python3 -m pip install --quiet --target build/python-site ./bindings/python \
    >build/python-pip.log 2>&1; then
    run_python_tests "release, the installed package"
else
    tail -40 build/python-pip.log
    echo "test.sh: pip install ./bindings/python failed" >&2
    failed=$((failed + 1))
fi

echo "== build (ASan + UBSan)"
# Optimised (-O2 -g) so the real models run at a usable speed.
cellm_build build-asan -DCELLM_WERROR=ON -DCELLM_ASAN=ON -DCELLM_BUILD_JAVA=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_ctest build-asan "ASan+UBSan"
# The bindings over the ASan+UBSan libraries: libasan preloaded into the JVM
# and python (whose own leaks are not ours: no leak check there, and the
# JVM's signal handlers need ASan to leave SIGSEGV alone).
asan_rt="$(gcc -print-file-name=libasan.so)"
run_java_test "ASan+UBSan" "$CELLM_ROOT/build-asan/libcellm_jni.so" LD_PRELOAD="$asan_rt" \
    ASAN_OPTIONS=detect_leaks=0:handle_segv=0:allow_user_segv_handler=1:use_sigaltstack=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
[ ! -d build/python-site ] ||
    run_python_tests "ASan+UBSan" CELLM_LIB="$CELLM_ROOT/build-asan/libcellm.so" \
        LD_PRELOAD="$asan_rt" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

echo "== build (TSan)"
cellm_build build-tsan -DCELLM_WERROR=ON -DCELLM_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
# Under TSan the models run 10-20x slower: the real-model tests run only
# their cases named test_tsan_* there (test_forward's invariance on SmolLM2
# with 1 and 2 threads, test_engine's 16-thread stress run, test_session's
# live QoS changes and concurrent sessions under trims), and
# test_commands is left out (the same code runs in its release and ASan
# runs; test_threadpool covers the pool under TSan).
TSAN_OPTIONS=halt_on_error=1 CELLM_TEST_FILTER="test_tsan_*" \
    run_ctest build-tsan "TSan" -E '^test_commands$'

echo "== fuzzers"
CC=clang cellm_build build-fuzz -DCELLM_FUZZ=ON -DCELLM_BUILD_TESTS=OFF \
    -DCELLM_BUILD_TOOLS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo
fuzzers=(build-fuzz/fuzz_*)
per=$(( ${FUZZ_SECONDS:-60} / ${#fuzzers[@]} ))
[ "$per" -ge 5 ] || per=5
for fz in "${fuzzers[@]}"; do
    name="$(basename "$fz")"
    corpus="fuzz/corpus/${name#fuzz_}"
    work="$(mktemp -d)"
    echo "-- $name for ${per}s (seeds: $corpus)"
    if "$fz" -max_total_time="$per" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$work/" "$work" "$corpus" >"$work/log" 2>&1; then
        grep -E "^Done|stat::number_of_executed_units" "$work/log" | head -2
        passed=$((passed + 1))
    else
        tail -40 "$work/log"
        echo "test.sh: $name found a failure; inputs in $work" >&2
        failed=$((failed + 1))
        continue
    fi
    rm -rf "$work"
done

# The phone's CPU: everything (library, the cellm command, every test) cross-
# compiled for aarch64 and run under qemu-aarch64 with its default CPU (has
# SDOT). Under emulation the real models run 30-100x slower, so the
# real-model programs run their small cases there (test_tsan_*, the same
# ones TSan runs) and test_commands and the Python end-to-end tests are left
# to the native runs; every other test runs whole. The kernel-level tests
# run again on a Cortex-A53 (plain NEON, no SDOT). The arm64 C library,
# cmocka, cJSON, libedit and libmicrohttpd come from Debian multiarch.
install_aarch64() {
    local missing=()
    for p in gcc-aarch64-linux-gnu qemu-user libc6:arm64 libcmocka-dev:arm64 libcjson-dev:arm64 \
        libedit-dev:arm64 libmicrohttpd-dev:arm64; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    echo "test.sh: installing ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
}
echo "== aarch64 (cross-compiled, under qemu-aarch64)"
if install_aarch64 &&
    cellm_build build-aarch64 -DCMAKE_TOOLCHAIN_FILE="$CELLM_ROOT/cmake/aarch64-linux-gnu.cmake" \
        -DCELLM_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo; then
    CELLM_TEST_FILTER="test_tsan_*" \
        run_ctest build-aarch64 "aarch64, default CPU (dotprod)" -E '^test_commands$|_e2e$'
    QEMU_CPU=cortex-a53 run_ctest build-aarch64 "aarch64, cortex-a53" \
        -R '^test_(quant|kernels_simd|sampler|attention|matmul|threadpool|xmath)$'
    # A real generation on the phone's CPU: 32 tokens of the default model
    # with two threads, sampled with the chat defaults from their fixed seed,
    # the text the x86 build prints to the byte (every kernel computes the
    # same bits on every CPU: docs/kernels.md; so does the sampler:
    # docs/sampling.md).
    gen_model="${CELLM_HOME:-$HOME/.cache/cellm}/models/smollm2-135m.gguf"
    gen_args=(run "$gen_model" -p "What is the capital of France?" -n 32 -t 2)
    build/cellm "${gen_args[@]}" >build/gen-x86.txt 2>/dev/null || echo "(x86 run failed)" >>build/gen-x86.txt
    for cpu in max cortex-a53; do
        if QEMU_CPU="$cpu" build-aarch64/cellm-emu "${gen_args[@]}" >"build/gen-$cpu.txt" 2>&1 &&
            [ -s build/gen-x86.txt ] && cmp -s build/gen-x86.txt "build/gen-$cpu.txt"; then
            echo "-- real generation, aarch64 ($cpu) under qemu: the x86 text, byte for byte"
            passed=$((passed + 1))
        else
            echo "test.sh: aarch64 ($cpu) generation differs from x86:" >&2
            diff build/gen-x86.txt "build/gen-$cpu.txt" >&2 || true
            failed=$((failed + 1))
        fi
    done
else
    echo "test.sh: could not set up or build the aarch64 cross build" >&2
    failed=$((failed + 1))
fi

echo "== format"
if command -v clang-format >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files '*.c' '*.h' | grep -v '^src/unicode_data\.c$')
    if clang-format --dry-run -Werror "${files[@]}" 2>/dev/null; then
        passed=$((passed + 1))
    else
        clang-format --dry-run "${files[@]}" 2>&1 | head -20
        echo "test.sh: files are not clang-formatted (run clang-format -i)" >&2
        failed=$((failed + 1))
    fi
fi

echo
echo "summary: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# test.sh — sets everything up and runs the whole test suite: the unit and
# real-model tests (warnings as errors), the same under ASan+UBSan and under
# TSan, the fuzzers for a bounded time, the kernel tests cross-compiled for
# aarch64 under QEMU, and the format check. Exits non-zero on any failure.
# CI runs exactly this (.ci/run).
#   FUZZ_SECONDS=N   seconds per fuzzer (default 60 in all, split evenly)
#   CELLM_TEST_SUITES="KEY ..."   only these suites (for developers; CI runs
#                    all): packages build models ctest examples java python
#                    asan tsan fuzz aarch64 format
#
# Every suite runs whatever happened before it: a suite that fails (a build,
# a test program that dies without its summary line, a missing tool) counts
# as failed and the script goes on to the next, then prints each suite's
# time and the summary. Nothing here may end the script early: no `set -e`
# below setup.sh, and every step's status is looked at.
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
set +e -uo pipefail
cd "$CELLM_ROOT" || exit 1

passed=0
failed=0
# fail MSG: counts one failure and says why.
fail() {
    echo "test.sh: $*" >&2
    failed=$((failed + 1))
}

# suite KEY TITLE: ends the suite that was running (its time goes to the
# table printed at the end) and starts TITLE; false when CELLM_TEST_SUITES
# (a developer's shortcut: keys separated by spaces, such as "java python")
# leaves KEY out. `suite` alone ends the last one.
suite_name=""
suite_t0=0
suite_times=()
suite() {
    if [ -n "$suite_name" ]; then
        local s=$((SECONDS - suite_t0))
        suite_times+=("$(printf '%5d s  %s' "$s" "$suite_name")")
        echo "-- $suite_name: ${s} s"
    fi
    suite_name=""
    [ $# -gt 0 ] || return 0
    if [ -n "${CELLM_TEST_SUITES:-}" ] && [[ " $CELLM_TEST_SUITES " != *" $1 "* ]]; then
        echo "== $2: left out (CELLM_TEST_SUITES)"
        return 1
    fi
    suite_name="$2"
    suite_t0=$SECONDS
    echo "== $suite_name"
}
store="${CELLM_HOME:-$HOME/.cache/cellm}/models"

run_ctest() { # run_ctest BUILD_DIR LABEL [CTEST ARGS...]
    local log dir="$1" label="$2"
    shift 2
    log="$(mktemp)"
    echo "== ctest ($label)"
    if (cd "$dir" && ctest --output-on-failure -j2 "$@") >"$log" 2>&1; then :; fi
    cat "$log"
    local line
    line="$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1)" || true
    if [ -z "$line" ]; then
        fail "ctest ($label) printed no summary"
    else
        local total nfail
        total="$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")"
        nfail="$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$line")"
        passed=$((passed + total - nfail))
        failed=$((failed + nfail))
    fi
    rm -f "$log"
}

# count_summary LOG LABEL RC: adds the counts of a test program's closing
# "N passed, M failed" line; a program that failed without one counts as one
# failure.
count_summary() {
    local line
    line="$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$1" | tail -1)" || true
    if [ -n "$line" ]; then
        passed=$((passed + $(cut -d' ' -f1 <<<"$line")))
        failed=$((failed + $(cut -d' ' -f3 <<<"$line")))
    fi
    if [ -z "$line" ]; then
        fail "$2 exited with $3 without its \"N passed, M failed\" line"
    elif [ "$3" -ne 0 ] && [ "$(cut -d' ' -f3 <<<"$line")" -eq 0 ]; then
        fail "$2 exited with $3"
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
    total="$(sed -nE 's/^Ran ([0-9]+) tests? in .*/\1/p' "$log" | tail -1)" || true
    nfail=0
    for kind in failures errors; do
        n="$(sed -nE "s/^FAILED \(.*$kind=([0-9]+).*/\1/p" "$log" | tail -1)" || true
        nfail=$((nfail + ${n:-0}))
    done
    if [ -n "$total" ]; then
        passed=$((passed + total - nfail))
        failed=$((failed + nfail))
    fi
    if [ -z "$total" ]; then
        fail "the Python binding tests ($label) exited with $rc without unittest's summary"
    elif [ "$rc" -ne 0 ] && [ "$nfail" -eq 0 ]; then
        fail "the Python binding tests ($label) exited with $rc"
    fi
    rm -f "$log"
}

# The phone's CPU: everything (library, the cellm command, every test) cross-
# compiled for aarch64 and run under qemu-aarch64 with its default CPU (has
# SDOT). Under emulation the real models run 30-100x slower, so the
# real-model programs that check the kernels' results (test_forward,
# test_kv_forward, test_logprobs, test_grammar) run their small cases there
# (test_tsan_*, the same ones TSan runs, on a smaller sample:
# CELLM_TEST_SMALL); the engine's scheduling tests (engine, sessions,
# prefix cache, server, speculation, memory), test_commands and the Python
# end-to-end tests are left to the native runs (their code is the same C
# on every CPU, and qemu on an x86 host runs threads with x86's memory
# order, so it cannot show what ARM's weaker order would; it is weaker
# than ARM in one place, a store-release then a load-acquire, which it lets
# pass each other: src/base/threadpool.c publishes its tasks with a
# read-modify-write for that); every other test
# runs whole, but for test_sampler_plain (the sampler's portable C, the
# same on every CPU). The kernel-level tests run again on a Cortex-A53
# (plain NEON, no SDOT; the sampler's vector code uses no SDOT). The arm64
# C library, cmocka, cJSON, libedit and libmicrohttpd come from Debian
# multiarch.
install_aarch64() {
    local missing=()
    for p in gcc-aarch64-linux-gnu qemu-user libc6:arm64 libcmocka-dev:arm64 libcjson-dev:arm64 \
        libedit-dev:arm64 libmicrohttpd-dev:arm64 libpng-dev:arm64 libjpeg-dev:arm64; do
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

if suite packages "packages (Debian and Python, only what is missing)"; then
    cellm_install_packages --test || fail "could not install what the tests need"
fi

if suite build "build (warnings are errors; with the Java binding)"; then
    cellm_build build -DCELLM_WERROR=ON -DCELLM_BUILD_JAVA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo ||
        fail "the release build failed"
fi

if suite models "real models"; then
    for m in smollm2-135m gemma3-270m; do
        "$CELLM_ROOT/build/cellm" pull "$m" || fail "cellm pull $m failed"
        # The speculative-decoding tests' draft: the same model requantized
        # to Q4_0 (tests/test_spec.c, tests/test_run_spec.c).
        if [ ! -s "$store/$m-q4_0.gguf" ]; then
            "$CELLM_ROOT/build/cellm" quantize "$store/$m.gguf" "$store/$m-q4_0.gguf" Q4_0 \
                >/dev/null || fail "cellm quantize $m Q4_0 failed"
        fi
    done
fi

if suite ctest "ctest (release)"; then
    run_ctest build "release"
fi

if suite examples "examples (programs that use only cellm.h)"; then
    examples=(build/example_*)
    [ -e "${examples[0]}" ] || fail "no example programs were built"
    for ex in "${examples[@]}"; do
        [ -e "$ex" ] || continue
        if "$ex" "$store/smollm2-135m.gguf" >"$ex.log" 2>&1; then
            echo "-- $(basename "$ex"): ok"
            passed=$((passed + 1))
        else
            cat "$ex.log"
            fail "$(basename "$ex") failed"
        fi
    done
fi

if suite java "Java binding (bindings/java, JNI on the desktop JVM, real default model)"; then
    run_java_test "release" "$CELLM_ROOT/build/libcellm_jni.so"
    # The example docs/mobile.md shows (an Android-shaped chat), run on the desktop.
    if java -Dcellm.jni.library="$CELLM_ROOT/build/libcellm_jni.so" \
        -cp build/cellm.jar:build/cellm-examples.jar org.cellm.examples.StreamingChat \
        "$store/smollm2-135m.gguf" "What is the capital of France?" "And of Italy?" \
        >build/java_example.log 2>&1; then
        echo "-- StreamingChat (Java example): ok"
        passed=$((passed + 1))
    else
        cat build/java_example.log
        fail "the Java example StreamingChat failed"
    fi
fi

if suite python "Python binding (pip install ./bindings/python, real default model)"; then
    # Installed into a folder of its own (no virtualenv or system site needed);
    # pip builds libcellm into the package with CMake.
    rm -rf build/python-site
    if python3 -m pip install --quiet --target build/python-site ./bindings/python \
        >build/python-pip.log 2>&1; then
        run_python_tests "release, the installed package"
    else
        tail -40 build/python-pip.log
        fail "pip install ./bindings/python failed"
    fi
fi

if suite asan "ASan + UBSan (build, ctest, the bindings)"; then
    # Optimised (-O2 -g) so the real models run at a usable speed.
    cellm_build build-asan -DCELLM_WERROR=ON -DCELLM_ASAN=ON -DCELLM_BUILD_JAVA=ON \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo || fail "the ASan+UBSan build failed"
    # The real models run 3-5x slower under ASan: the real-model tests run
    # their small cases there, those named test_tsan_* (which TSan and the
    # aarch64 build run too) and test_asan_* (ASan and release only), hence
    # the glob test_?san_*. Every other test runs whole. The Vulkan loader is
    # hidden (CELLM_VULKAN_LOADER naming no file), so `--device auto` runs on
    # the CPU at once: opening lavapipe to find it is no GPU would leave
    # allocations of Mesa's that LeakSanitizer reports when it unloads;
    # test_vulkan and test_vk_forward unset it and keep lavapipe loaded.
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        CELLM_TEST_FILTER="test_?san_*" CELLM_VULKAN_LOADER=/nonexistent/libvulkan.so.1 \
        run_ctest build-asan "ASan+UBSan"
    # The bindings over the ASan+UBSan libraries: libasan preloaded into the JVM
    # and python (whose own leaks are not ours: no leak check there, and the
    # JVM's signal handlers need ASan to leave SIGSEGV alone). The Vulkan
    # loader is hidden here too: the tests also start the release `cellm`,
    # which inherits the preload, and a process with libasan preloaded that
    # opened lavapipe hangs in exit (p11-kit's destructor waits on glibc's
    # locale lock for ever: both runs took their 900 s timeout in one CI run).
    asan_rt="$(gcc -print-file-name=libasan.so)"
    no_vk=CELLM_VULKAN_LOADER=/nonexistent/libvulkan.so.1
    run_java_test "ASan+UBSan" "$CELLM_ROOT/build-asan/libcellm_jni.so" LD_PRELOAD="$asan_rt" \
        ASAN_OPTIONS=detect_leaks=0:handle_segv=0:allow_user_segv_handler=1:use_sigaltstack=0 \
        UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$no_vk"
    if [ -d build/python-site ]; then
        run_python_tests "ASan+UBSan" CELLM_LIB="$CELLM_ROOT/build-asan/libcellm.so" \
            LD_PRELOAD="$asan_rt" ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
            "$no_vk"
    else
        fail "the Python binding tests (ASan+UBSan) have no installed package to run on"
    fi
fi

if suite tsan "TSan (build, ctest)"; then
    cellm_build build-tsan -DCELLM_WERROR=ON -DCELLM_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo ||
        fail "the TSan build failed"
    # Under TSan the models run 10-20x slower: the real-model tests run only
    # their cases named test_tsan_* there (test_forward's invariance on SmolLM2
    # with 1 and 2 threads, test_engine's 16-thread stress run, test_session's
    # live QoS changes and concurrent sessions under trims), and
    # test_commands is left out (the same code runs in its release and ASan
    # runs; test_threadpool covers the pool under TSan), and so are the
    # sampler's, the tokenizer's and the KV cache's tests, which start no
    # thread (TSan has nothing to watch there; they take minutes under it).
    TSAN_OPTIONS=halt_on_error=1 CELLM_TEST_FILTER="test_tsan_*" \
        CELLM_VULKAN_LOADER=/nonexistent/libvulkan.so.1 run_ctest build-tsan "TSan" -E '^(test_commands|test_sampler|test_sampler_plain|test_tokenizer|test_kv_cache)$'
fi

if suite fuzz "fuzzers"; then
    if CC=clang cellm_build build-fuzz -DCELLM_FUZZ=ON -DCELLM_BUILD_TESTS=OFF \
        -DCELLM_BUILD_TOOLS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo; then
        fuzzers=(build-fuzz/fuzz_*)
        per=$((${FUZZ_SECONDS:-60} / ${#fuzzers[@]}))
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
                rm -rf "$work"
            else
                tail -40 "$work/log"
                fail "$name found a failure; inputs in $work"
            fi
        done
    else
        fail "the fuzzer build failed"
    fi
fi

if suite aarch64 "aarch64 (cross-compiled, under qemu-aarch64)"; then
    if install_aarch64 &&
        cellm_build build-aarch64 -DCMAKE_TOOLCHAIN_FILE="$CELLM_ROOT/cmake/aarch64-linux-gnu.cmake" \
            -DCELLM_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo; then
        CELLM_TEST_FILTER="test_tsan_*" CELLM_TEST_SMALL=1 \
            run_ctest build-aarch64 "aarch64, default CPU (dotprod)" \
            -E '^(test_commands|test_engine|test_session|test_prefix|test_serve|test_spec|test_run_spec|test_window|test_memory|test_kv_gemma3|test_sampler_plain)$|_e2e$'
        QEMU_CPU=cortex-a53 run_ctest build-aarch64 "aarch64, cortex-a53" \
            -R '^test_(quant|kernels_simd|attention|matmul|threadpool|xmath)$'
        # A real generation on the phone's CPU: 32 tokens of the default model
        # with two threads, sampled with the chat defaults from their fixed
        # seed, the text the x86 build prints to the byte (every kernel
        # computes the same bits on every CPU: docs/kernels.md; so does the
        # sampler: docs/sampling.md).
        gen_args=(run "$store/smollm2-135m.gguf" -p "What is the capital of France?" -n 32 -t 2)
        build/cellm "${gen_args[@]}" >build/gen-x86.txt 2>/dev/null || echo "(x86 run failed)" >>build/gen-x86.txt
        for cpu in max cortex-a53; do
            if QEMU_CPU="$cpu" build-aarch64/cellm-emu "${gen_args[@]}" >"build/gen-$cpu.txt" 2>&1 &&
                [ -s build/gen-x86.txt ] && cmp -s build/gen-x86.txt "build/gen-$cpu.txt"; then
                echo "-- real generation, aarch64 ($cpu) under qemu: the x86 text, byte for byte"
                passed=$((passed + 1))
            else
                diff build/gen-x86.txt "build/gen-$cpu.txt" >&2
                fail "aarch64 ($cpu) generation differs from x86 (above)"
            fi
        done
        # The same with window KV types: their key statistics (taken at
        # start-up), f16 copies and compressed rows, the same bits too; the
        # keys per channel (k4cv4hw) over 96 tokens, so that queries read
        # several blocks rounded per channel.
        for kvt in q4_0hw k4cv4hw; do
            kv_args=(--kv-type "$kvt")
            [ "$kvt" = k4cv4hw ] && kv_args+=(-n 96)
            build/cellm "${gen_args[@]}" "${kv_args[@]}" >"build/gen-x86-$kvt.txt" 2>/dev/null ||
                echo "(x86 run failed)" >>"build/gen-x86-$kvt.txt"
            if build-aarch64/cellm-emu "${gen_args[@]}" "${kv_args[@]}" >"build/gen-max-$kvt.txt" 2>&1 &&
                [ -s "build/gen-x86-$kvt.txt" ] && cmp -s "build/gen-x86-$kvt.txt" "build/gen-max-$kvt.txt"; then
                echo "-- real generation with --kv-type $kvt, aarch64 under qemu: the x86 text, byte for byte"
                passed=$((passed + 1))
            else
                diff "build/gen-x86-$kvt.txt" "build/gen-max-$kvt.txt" >&2
                fail "aarch64 generation with --kv-type $kvt differs from x86 (above)"
            fi
        done
    else
        fail "could not set up or build the aarch64 cross build"
    fi
fi

if suite format "format"; then
    if command -v clang-format >/dev/null 2>&1; then
        mapfile -t files < <(git ls-files '*.c' '*.h' | grep -v '^src/text/unicode_data\.c$')
        if clang-format --dry-run -Werror "${files[@]}" 2>/dev/null; then
            passed=$((passed + 1))
        else
            clang-format --dry-run "${files[@]}" 2>&1 | head -20
            fail "files are not clang-formatted (run clang-format -i)"
        fi
    else
        fail "clang-format is missing (setup.sh --test installs it)"
    fi
    # src/ is laid out by layer (DESIGN.md): nothing includes from above.
    if python3 scripts/check_layers.py; then
        echo "-- src/ layers: no file includes from a layer above its own"
        passed=$((passed + 1))
    else
        fail "a file in src/ includes from a layer above its own (above)"
    fi
fi
suite

echo
echo "time per suite:"
printf '%s\n' "${suite_times[@]}"
printf '%5d s  in all\n' "$SECONDS"
echo "summary: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

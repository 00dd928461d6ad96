# aarch64-linux-gnu.cmake — cross-compile cellm for 64-bit ARM Linux on a
# Debian x86-64 machine and run its tests under QEMU user mode. Needs
# gcc-aarch64-linux-gnu and qemu-user, and from Debian multiarch the arm64
# C library and the -dev packages the build links (libc6:arm64,
# libcmocka-dev:arm64; for the cellm command libcjson-dev:arm64,
# libedit-dev:arm64, libmicrohttpd-dev:arm64, libpng-dev:arm64, libjpeg-dev:arm64). scripts/test.sh uses it as
#   cmake -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#         -DCELLM_WERROR=ON
# and ctest then runs each test through qemu-aarch64 (QEMU_CPU picks the CPU).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)

# The cross libc lives under /usr/aarch64-linux-gnu; multiarch libraries in
# /usr/lib/aarch64-linux-gnu (found through the library architecture) and
# their headers in /usr/include, shared with the host.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)

# The programs run with the multiarch arm64 C library (libc6:arm64, at
# /lib/ld-linux-aarch64.so.1), not the cross compiler's copy under
# /usr/aarch64-linux-gnu: with `-L /usr/aarch64-linux-gnu` the cross loader
# finds the multiarch libc.so.6 through the host's ld.so.cache, and a loader
# and libc from different builds hang in pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)

# Cross compilation for 64-bit Arm Linux (`make test-aarch64`): Debian's cross g++
# (g++-aarch64-linux-gnu), the target's libraries (Highway, GoogleTest, libgomp) from Debian's arm64
# multiarch packages in /usr/lib/aarch64-linux-gnu, and the binaries run under qemu-user's
# qemu-aarch64, which CMake then uses for every target binary it runs (gtest_discover_tests, ctest).
# scripts/setup-cross-deps installs all of it.
#   cmake -S . -B build-aarch64 --toolchain cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

find_program(ATTN_AARCH64_CXX aarch64-linux-gnu-g++)
find_program(ATTN_QEMU_AARCH64 qemu-aarch64)
if(NOT ATTN_AARCH64_CXX OR NOT ATTN_QEMU_AARCH64)
  message(FATAL_ERROR "cmake/aarch64-linux-gnu.cmake needs aarch64-linux-gnu-g++ and qemu-aarch64 "
                      "(scripts/setup-cross-deps installs them)")
endif()
set(CMAKE_CXX_COMPILER ${ATTN_AARCH64_CXX})

# The CPU is qemu's environment variable QEMU_CPU, default max: every extension qemu emulates, SVE and
# SVE2 (512-bit vectors) included, so Highway's runtime dispatch finds NEON, SVE and SVE2; e.g.
# QEMU_CPU=max,sve-default-vector-length=32 gives 256-bit vectors (Highway's SVE_256), =16 128-bit
# ones (SVE2_128).
# No -L /usr/aarch64-linux-gnu: the binaries run on the multiarch runtime (/lib/ld-linux-aarch64.so.1,
# libc6:arm64 and the rest in /lib/aarch64-linux-gnu, where libhwy1:arm64 is too). The cross
# toolchain's own copy of glibc there is an older Debian build than libc6:arm64, and a process that
# takes ld.so from one and libc.so.6 from the other hangs in its first OpenMP parallel region.
set(CMAKE_CROSSCOMPILING_EMULATOR ${ATTN_QEMU_AARCH64})

# Programs from the host; headers and libraries are the target's through CMAKE_LIBRARY_ARCHITECTURE.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

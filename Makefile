# The two commands of the README's quick start. Each installs what it needs (scripts/setup-deps), then
# configures and builds in ./build (Release).
SHELL := /bin/bash
BUILD ?= build
JOBS  ?= $(shell nproc)

# `make demo` builds the library and the CLI only (target attn_cli, $(BUILD)/tools/attn) and runs
# `attn demo`, then builds the explorer page (target attn_explorer, when em++ is found) and says how to
# open it. It configures a new $(BUILD) without the CUDA backend, which the CLI does not use (nvcc
# would add about a minute); an existing $(BUILD) is used as configured. `make build` and `make test`
# configure with ATTN_CUDA (default AUTO: on when nvcc is found), so after `make demo` they recompile
# the library once with the backend.
#
# `make test` = the format check (scripts/check-format, and scripts/check-function-length: no library
# function over 100 lines), the release suite, the Python package's tests
# (scripts/python-tests), a sample of flash-attn's own test file on attn (scripts/flash-attn-tests/sample),
# then the same suite under
# AddressSanitizer + UBSan, the threaded tests under ThreadSanitizer, and a few seconds of each
# libFuzzer target (docs/robustness.md), and last the tests of the SIMD kernels on AArch64: cross-compiled
# and run under qemu-aarch64 (`make test-aarch64`, below). scripts/run-stages runs the stages in that
# order, stops at the first that fails and names it, and prints the seconds of each at the end (also in
# $(BUILD)/stage-times). Each stage's output is also in $(BUILD)/stage-<n>.log; after a failure the last
# lines printed are the failed tests' output, the stage's last lines, then the failed tests' names.
# Knobs: FUZZ_RUNS (the differential test's configurations per target in the release build), FUZZ_RUN_SECONDS (per
# libFuzzer target), SAN_JOBS (parallel compile jobs, <= 2 on CI), ATTN_CUDA (AUTO, ON or OFF: the CUDA
# backend of the release build), AARCH64_FUZZ_RUNS (the same under qemu). Counts, not seconds: a
# loaded machine runs the same tests, only slower.
FUZZ_RUNS        ?= 2000
FUZZ_RUN_SECONDS ?= 5
SAN_JOBS         ?= $(JOBS)
ATTN_CUDA        ?= AUTO
FUZZERS          := reference tiled tiled_amx splitk splitk_partials varlen decode decode_quantized backward backward_amx
LSAN_ENV         := LSAN_OPTIONS=suppressions=$(CURDIR)/tests/differential/lsan-libomp.supp
AARCH64_FUZZ_RUNS ?= 60

# ccache (scripts/setup-deps installs it), for every compile: `pip install .` (the Python stage)
# compiles libattn with the same commands as the release build, so it takes the release build's objects
# from the cache instead of compiling the Highway kernels again (minutes on 2 cores). The cache lives
# in $(BUILD)/ccache, so a fresh clone starts empty. Each stage is a make of its own (below), so a stage
# after `deps` finds ccache even on a machine that had none.
# ccache hashes the compiler's name too, and scikit-build-core compiles with Python's g++
# (sysconfig's CXX) where CMake alone picks c++: a fresh configure is given g++ as well.
CCACHE := $(shell command -v ccache 2>/dev/null)
ifneq ($(CCACHE),)
export CMAKE_CXX_COMPILER_LAUNCHER ?= $(CCACHE)
export CCACHE_DIR ?= $(CURDIR)/$(BUILD)/ccache
export CXX ?= g++
endif

# Within `make test` each stage is a make of its own, run after the stages before it: NODEPS=1 drops
# the prerequisites those stages made, so that each stage's time is its own work.
after = $(if $(NODEPS),,$(1))

.PHONY: demo test build deps deps-aarch64 check-format test-release test-python test-flash-attn asan-build test-asan test-tsan \
        test-fuzz test-aarch64
demo: $(call after,deps)
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(if $(wildcard $(BUILD)/CMakeCache.txt),,-DATTN_CUDA=OFF)
	cmake --build $(BUILD) -j$(JOBS) --target attn_cli
	$(BUILD)/tools/attn demo
	@if grep -q '^ATTN_EMXX:FILEPATH=/' $(BUILD)/CMakeCache.txt; then \
	  cmake --build $(BUILD) -j$(JOBS) --target attn_explorer && \
	  echo "The explorer page: run $(BUILD)/tools/attn explore and open the URL it prints (docs/explorer.md)"; \
	else echo "The explorer page needs Emscripten's em++ (apt-get install emscripten, then make demo; docs/explorer.md)"; fi

test:
	@scripts/run-stages $(BUILD)/stage-times \
	  "packages"         "$(MAKE) --no-print-directory deps deps-aarch64" \
	  "format check"     "$(MAKE) --no-print-directory NODEPS=1 check-format" \
	  "release build"    "$(MAKE) --no-print-directory NODEPS=1 build" \
	  "release tests"    "$(MAKE) --no-print-directory NODEPS=1 test-release" \
	  "Python package"   "$(MAKE) --no-print-directory NODEPS=1 test-python" \
	  "flash-attn's tests" "$(MAKE) --no-print-directory NODEPS=1 test-flash-attn" \
	  "ASan build"       "$(MAKE) --no-print-directory NODEPS=1 asan-build" \
	  "ASan tests"       "$(MAKE) --no-print-directory NODEPS=1 test-asan" \
	  "TSan build+tests" "$(MAKE) --no-print-directory NODEPS=1 test-tsan" \
	  "fuzz"             "$(MAKE) --no-print-directory NODEPS=1 test-fuzz" \
	  "AArch64 build+tests" "$(MAKE) --no-print-directory NODEPS=1 test-aarch64"

check-format: $(call after,deps)
	scripts/check-format
	scripts/check-function-length

test-release: $(call after,build)
	cd $(BUILD) && ATTN_FUZZ_RUNS=$(FUZZ_RUNS) ctest --output-on-failure -j$(JOBS) --timeout 600

# The Python package (pip install . into .venv, then pytest; scripts/python-tests, docs/python.md).
test-python: $(call after,deps)
	scripts/python-tests

# flash-attn's own tests/test_flash_attn.py (its 2.8.3 release, fetched from PyPI) on attn: a seeded sample
# of one case per test function (scripts/flash-attn-tests/sample; docs/python.md). Needs test-python's .venv.
test-flash-attn: $(call after,deps)
	scripts/flash-attn-tests/sample

# ASan + UBSan: every test binary and the fuzzers (clang-16, -O0; scripts/configure-sanitized).
build-asan/CMakeCache.txt: | $(call after,deps)
	scripts/configure-sanitized build-asan address,undefined -DATTN_BUILD_FUZZERS=ON
asan-build: $(call after,deps) build-asan/CMakeCache.txt
	cmake --build build-asan -j$(SAN_JOBS)
# The IO-model simulations at N = 1000 (minutes under ASan at -O0, no kernel code) run in test-release only.
test-asan: $(call after,asan-build)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 $(LSAN_ENV) \
	  ATTN_FUZZ_RUNS=30 ctest --output-on-failure -j$(JOBS) --timeout 600 -E 'Counted\..*N1000'

# TSan: the tests labelled threaded (tests/CMakeLists.txt), which run the threaded paths. libomp's
# libarcher makes OpenMP's synchronisation visible to TSan; ignore_noninstrumented_modules=1 (LLVM's documented setting for Archer) skips the
# accesses inside the uninstrumented libomp itself. No suppressions: any report in attn's code fails.
build-tsan/CMakeCache.txt: | $(call after,deps)
	scripts/configure-sanitized build-tsan thread
test-tsan: $(call after,deps) build-tsan/CMakeCache.txt
	cmake --build build-tsan -j$(SAN_JOBS) --target attn_tests_threaded
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 abort_on_error=1 ignore_noninstrumented_modules=1" \
	  OMP_NUM_THREADS=4 ATTN_FUZZ_RUNS=20 OMP_TOOL_LIBRARIES=$$(ls /usr/lib/llvm-*/lib/libarcher.so | head -1) \
	  ctest --output-on-failure -j$(JOBS) --timeout 600 -L '^threaded$$'

# libFuzzer: FUZZ_RUN_SECONDS per target from the seed corpus (new inputs go to build-asan/corpus/);
# tiled_amx and backward_amx (on the AMX tile emulator) start from tiled's and backward's seeds, the same input formats.
test-fuzz: $(call after,asan-build)
	@for f in $(FUZZERS); do \
	  mkdir -p build-asan/corpus/$$f; \
	  echo "== fuzz_$$f: $(FUZZ_RUN_SECONDS) s"; \
	  if ! $(LSAN_ENV) build-asan/fuzz/fuzz_$$f -max_total_time=$(FUZZ_RUN_SECONDS) -print_final_stats=1 -artifact_prefix=build-asan/ \
	      build-asan/corpus/$$f fuzz/corpus/$${f%_amx} > build-asan/fuzz_$$f.log 2>&1; then \
	    tail -n 60 build-asan/fuzz_$$f.log; exit 1; \
	  fi; \
	  grep -E "stat::number_of_executed_units|Done [0-9]+ runs" build-asan/fuzz_$$f.log; \
	done

# AArch64: libattn and the tests labelled simd (tests/CMakeLists.txt: the SIMD kernels' tests)
# cross-compiled by Debian's aarch64-linux-gnu-g++
# (cmake/aarch64-linux-gnu.cmake; Release, no CUDA, MPI, tools or explorer) in build-aarch64, and run by
# ctest under qemu-aarch64: all of them with QEMU_CPU=max (Highway's NEON, SVE and SVE2 at 512 bits;
# the tiled, backward and decode kernels are NEON only), then the dequantization test, whose kernel is
# compiled for every SVE target, at 256- and 128-bit vectors (SVE_256, SVE2_128). Each run ends with the
# targets the tests ran on ([  TARGETS ] lines). The toolchain file fails the configure if the cross
# compiler or qemu is missing.
AARCH64_CTEST := ctest --output-on-failure --timeout 600
AARCH64_RAN   := grep -h '^\[  TARGETS \]' Testing/Temporary/LastTest.log | sort | uniq -c
test-aarch64: $(call after,deps deps-aarch64)
	cmake -S . -B build-aarch64 --toolchain cmake/aarch64-linux-gnu.cmake -DCMAKE_BUILD_TYPE=Release \
	  -DATTN_CUDA=OFF -DATTN_MPI=OFF -DATTN_BUILD_TOOLS=OFF -DATTN_EXPLORER=OFF
	cmake --build build-aarch64 -j$(JOBS) --target attn_tests_simd
	cd build-aarch64 && QEMU_CPU=max ATTN_FUZZ_RUNS=$(AARCH64_FUZZ_RUNS) $(AARCH64_CTEST) -j$(JOBS) \
	  -L '^simd$$' && $(AARCH64_RAN)
	set -e; cd build-aarch64 && for bytes in 32 16; do \
	  echo "== SVE vectors of $$bytes bytes"; \
	  QEMU_CPU=max,sve-default-vector-length=$$bytes $(AARCH64_CTEST) -R '^QuantizedTypes\.SimdDequantization'; \
	  $(AARCH64_RAN); \
	done

build: $(call after,deps)
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DATTN_CUDA=$(ATTN_CUDA)
	cmake --build $(BUILD) -j$(JOBS)

deps:
	@scripts/setup-deps
deps-aarch64:
	@scripts/setup-cross-deps

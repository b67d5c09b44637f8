# The two commands of the README's quick start. Each installs what it needs (scripts/setup-deps), then
# configures and builds in ./build (Release).
SHELL := /bin/bash
BUILD ?= build
JOBS  ?= $(shell nproc)

# `make test` = the release suite, then the same suite under AddressSanitizer + UBSan, the threaded
# tests under ThreadSanitizer, and a few seconds of each libFuzzer target (docs/robustness.md).
# Each stage stops the run on failure. Knobs: FUZZ_SECONDS (the differential test's budget in the
# release build), FUZZ_RUN_SECONDS (per libFuzzer target), SAN_JOBS (parallel compile jobs, <= 2 on CI).
FUZZ_SECONDS     ?= 60
FUZZ_RUN_SECONDS ?= 5
SAN_JOBS         ?= $(JOBS)
FUZZERS          := reference tiled splitk splitk_partials varlen decode
LSAN_ENV         := LSAN_OPTIONS=suppressions=$(CURDIR)/tests/differential/lsan-libomp.supp
TSAN_TESTS       := test_exactness test_features test_differential $(if $(wildcard tests/test_decode.cpp),test_decode)

.PHONY: demo test build deps test-release asan-build test-asan test-tsan test-fuzz
demo: build
	$(BUILD)/tools/attn demo

test: test-release test-asan test-tsan test-fuzz

test-release: build
	cd $(BUILD) && ATTN_FUZZ_SECONDS=$(FUZZ_SECONDS) ctest --output-on-failure -j$(JOBS) --timeout 600

# ASan + UBSan: every test binary and the fuzzers (clang-16, -O0; scripts/configure-sanitized).
build-asan/CMakeCache.txt: | deps
	scripts/configure-sanitized build-asan address,undefined -DATTN_BUILD_FUZZERS=ON
asan-build: deps build-asan/CMakeCache.txt
	cmake --build build-asan -j$(SAN_JOBS)
# The IO-model simulations at N = 1000 (minutes under ASan at -O0, no kernel code) run in test-release only.
test-asan: asan-build
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 $(LSAN_ENV) \
	  ATTN_FUZZ_SECONDS=20 ctest --output-on-failure -j$(JOBS) --timeout 600 -E 'Counted\..*N1000'

# TSan: the tests that run the threaded paths. libomp's libarcher makes OpenMP's synchronisation
# visible to TSan; ignore_noninstrumented_modules=1 (LLVM's documented setting for Archer) skips the
# accesses inside the uninstrumented libomp itself. No suppressions: any report in attn's code fails.
build-tsan/CMakeCache.txt: | deps
	scripts/configure-sanitized build-tsan thread
test-tsan: deps build-tsan/CMakeCache.txt
	cmake --build build-tsan -j$(SAN_JOBS) --target $(TSAN_TESTS)
	set -e; for t in $(TSAN_TESTS); do \
	  echo "== tsan: $$t"; \
	  TSAN_OPTIONS="halt_on_error=1 abort_on_error=1 ignore_noninstrumented_modules=1" OMP_NUM_THREADS=4 ATTN_FUZZ_SECONDS=12 \
	    OMP_TOOL_LIBRARIES=$$(ls /usr/lib/llvm-*/lib/libarcher.so | head -1) build-tsan/tests/$$t; \
	done

# libFuzzer: FUZZ_RUN_SECONDS per target from the seed corpus (new inputs go to build-asan/corpus/).
test-fuzz: asan-build
	@for f in $(FUZZERS); do \
	  mkdir -p build-asan/corpus/$$f; \
	  echo "== fuzz_$$f: $(FUZZ_RUN_SECONDS) s"; \
	  if ! $(LSAN_ENV) build-asan/fuzz/fuzz_$$f -max_total_time=$(FUZZ_RUN_SECONDS) -print_final_stats=1 -artifact_prefix=build-asan/ \
	      build-asan/corpus/$$f fuzz/corpus/$$f > build-asan/fuzz_$$f.log 2>&1; then \
	    tail -n 60 build-asan/fuzz_$$f.log; exit 1; \
	  fi; \
	  grep -E "stat::number_of_executed_units|Done [0-9]+ runs" build-asan/fuzz_$$f.log; \
	done

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j$(JOBS)

deps:
	@scripts/setup-deps

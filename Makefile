# The two commands of the README's quick start. Each installs what it needs (scripts/setup-deps), then
# configures and builds in ./build (Release).
BUILD ?= build
JOBS  ?= $(shell nproc)

.PHONY: demo test build deps
demo: build
	$(BUILD)/tools/attn demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 600

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j$(JOBS)

deps:
	@scripts/setup-deps

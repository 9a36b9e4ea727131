# carpool: the developer entry points. Every target installs what is missing first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
ifneq ($(CI),)
  CMAKE_FLAGS += -DCARPOOL_WERROR=ON
endif

.PHONY: deps configure build test run bench fuzz format clean

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

# Every test this machine can run; GPU tests report themselves skipped without a GPU.
test: build
	@ctest --test-dir $(BUILD) --output-on-failure -j$(JOBS) --timeout 600

run: build
	@bash scripts/run-local.sh $(BUILD)

# The benchmark suite; SCENARIO=b (or a,c) runs some scenarios only. Rewrites the suite's sections
# of docs/PERFORMANCE.md.
SCENARIO ?= abcdefghi
bench: build
	@bash scripts/bench.sh $(BUILD) $(SCENARIO)

# libFuzzer (clang, ASan + UBSan) over the router's frame decoder and request validator;
# `make test` runs it for 30 s.
FUZZ_SECONDS ?= 600
fuzz: deps
	@bash router/fuzz/run_fuzz.sh $(BUILD)/fuzz $(FUZZ_SECONDS)

format:
	@find common kernels worker client tests bench cluster router proto \
	  -name '*.h' -o -name '*.cc' -o -name '*.cu' 2>/dev/null | xargs -r clang-format -i

clean:
	@rm -rf $(BUILD)

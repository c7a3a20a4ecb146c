# lpx — the two commands: `make demo` and `make test` (plus `make bench`,
# and on a machine with an NVIDIA GPU `make test-gpu` and `make bench-gpu`).
# Both install what is missing (apt-get when run as root, otherwise they
# print the exact command and stop), configure, build and run.

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
# the tests whose point is concurrency also run under ThreadSanitizer
TSAN_TESTS ?= dispatch comm trace dtype fsdp_ckpt
# libFuzzer targets (tests/fuzz/, clang): 5 s each in `make test`,
# FUZZ_SECONDS each in `make fuzz`
FUZZ_BUILD   ?= build-fuzz
FUZZ_TARGETS ?= safetensors dlpack schema plugin_info plugin_load cli unflatten
FUZZ_SECONDS ?= 300
# the CUDA build (docs/GPU.md): lpx-cuda.so, the GPU suite, bench_gpu
GPU_BUILD  ?= build-gpu
MESON_OPTS ?=
LPX        := $(BUILD)/tools/lpx/lpx
# `make test` (and so CI) compiles the GPU plugins whenever nvcc is there,
# GPU or not: the CUDA code must compile. `make demo` and `make build`
# leave it to -Dcuda=auto (meson.build: the toolkit and a GPU). `make test
# TEST_CUDA=auto` skips them.
NVCC       := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
TEST_CUDA  ?= $(if $(NVCC),enabled,auto)

.PHONY: all deps test-deps build build-lpx build-test build-asan build-tsan build-fuzz build-gpu demo test test-gpu fuzz bench mutate \
	bench-gpu bench-train-gpu gpu-acceptance install clean

all: build

deps:
	@echo "lpx: installing deps (only what is missing)"
	@scripts/ensure-deps.sh

test-deps:
	@echo "lpx: installing test deps (only what is missing)"
	@scripts/ensure-deps.sh test

$(BUILD)/build.ninja:
	@echo "lpx: configuring $(BUILD)"
	@meson setup $(BUILD) $(MESON_OPTS) >/dev/null || (cat $(BUILD)/meson-logs/meson-log.txt | tail -30; exit 1)

# CUDA's runtime does not belong under sanitizers: the ASan, TSan and fuzz
# builds leave the GPU plugins out (the GPU suite runs in build/ and build-gpu/).
$(ASAN_BUILD)/build.ninja:
	@echo "lpx: configuring $(ASAN_BUILD)"
	@meson setup $(ASAN_BUILD) -Dbuildtype=debug -Db_sanitize=address,undefined \
	  -Db_lundef=false -Dcuda=disabled -Dnccl=disabled $(MESON_OPTS) >/dev/null || (tail -30 $(ASAN_BUILD)/meson-logs/meson-log.txt; exit 1)

$(TSAN_BUILD)/build.ninja:
	@echo "lpx: configuring $(TSAN_BUILD)"
	@meson setup $(TSAN_BUILD) -Dbuildtype=debug -Db_sanitize=thread -Db_lundef=false \
	  -Dcuda=disabled -Dnccl=disabled $(MESON_OPTS) >/dev/null || (tail -30 $(TSAN_BUILD)/meson-logs/meson-log.txt; exit 1)

$(FUZZ_BUILD)/build.ninja:
	@echo "lpx: configuring $(FUZZ_BUILD)"
	@CC=clang meson setup $(FUZZ_BUILD) -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false \
	  -Dfuzz=true -Dcuda=disabled -Dnccl=disabled $(MESON_OPTS) >/dev/null || (tail -30 $(FUZZ_BUILD)/meson-logs/meson-log.txt; exit 1)

$(GPU_BUILD)/build.ninja:
	@echo "lpx: configuring $(GPU_BUILD)"
	@meson setup $(GPU_BUILD) -Dbuildtype=release -Dcuda=enabled $(MESON_OPTS) >/dev/null \
	  || (tail -30 $(GPU_BUILD)/meson-logs/meson-log.txt; exit 1)

# scripts/ninja-progress.sh: prints "lpx: building DIR/ (N targets)", then
# runs ninja (its progress line on a terminal, quiet otherwise)
build: deps $(BUILD)/build.ninja
	@scripts/cuda-stale.sh $(BUILD)
	@scripts/ninja-progress.sh $(BUILD)

# what `make demo` runs: the lpx command and liblpx, nothing else
build-lpx: deps $(BUILD)/build.ninja
	@scripts/cuda-stale.sh $(BUILD)
	@scripts/ninja-progress.sh $(BUILD) tools/lpx/lpx

# `make test`'s build/: the same directory, with the GPU plugins compiled
# when nvcc is there (TEST_CUDA), also on a machine without a GPU
build-test: test-deps $(BUILD)/build.ninja
	@scripts/meson-option.sh $(BUILD) cuda $(TEST_CUDA)
	@scripts/cuda-stale.sh $(BUILD)
	@scripts/ninja-progress.sh $(BUILD)

build-asan: deps $(ASAN_BUILD)/build.ninja
	@scripts/ninja-progress.sh $(ASAN_BUILD)

build-tsan: deps $(TSAN_BUILD)/build.ninja
	@scripts/ninja-progress.sh $(TSAN_BUILD) $(addprefix tests/test_,$(TSAN_TESTS))

build-fuzz: test-deps $(FUZZ_BUILD)/build.ninja
	@scripts/ninja-progress.sh $(FUZZ_BUILD) tests/fuzz/lpx-mx-fuzz.so tests/fuzz/lpx-fuzz-plugin.so $(addprefix tests/fuzz/fuzz_,$(FUZZ_TARGETS))

build-gpu: deps $(GPU_BUILD)/build.ninja
	@scripts/cuda-stale.sh $(GPU_BUILD)
	@scripts/ninja-progress.sh $(GPU_BUILD)

# The main job: float8-tensorwise training on 4 local ranks with fp8
# all-gather, plus the bf16 baseline (tools/train/, docs/TRAIN.md). Builds
# only the lpx command: no tests, benches or GPU plugins (docs/PERFORMANCE.md,
# "Build time").
demo: build-lpx
	@echo "lpx: running demo ($(LPX) train --compare --out $(BUILD)/train-demo)"
	@$(LPX) train --compare --out $(BUILD)/train-demo

# The whole suite twice, a normal build and an ASan+UBSan build, plus the
# concurrency tests under TSan, plus 5 s of each fuzz target (ASan+UBSan).
# The last line is the total over all four: "N passed, N failed, N skipped".
test: test-deps build-test build-asan build-tsan build-fuzz
	@rc=0; \
	OPENBLAS_NUM_THREADS=1 meson test -C $(BUILD) --no-suite docs-slow --print-errorlogs --num-processes 2 || rc=1; \
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  OPENBLAS_NUM_THREADS=1 meson test -C $(ASAN_BUILD) --print-errorlogs --num-processes 2 --timeout-multiplier 3 || rc=1; \
	TSAN_OPTIONS=halt_on_error=1 OPENBLAS_NUM_THREADS=1 meson test -C $(TSAN_BUILD) --no-rebuild \
	  --print-errorlogs --timeout-multiplier 3 $(TSAN_TESTS) || rc=1; \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 meson test -C $(FUZZ_BUILD) --no-rebuild --suite fuzz \
	  --print-errorlogs --num-processes 3 $(addprefix fuzz_,$(FUZZ_TARGETS)) || rc=1; \
	scripts/test-summary.py $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) || rc=1; \
	exit $$rc

# The GPU suite (tests/gpu/: every CUDA kernel against the CPU backend,
# NCCL collectives) in a release build with -Dcuda=enabled, one test at a
# time (they share the device). LPX_TEST_REQUIRE_GPU=1: this target is
# for a GPU machine, so a plugin that declines (no GPU, a broken driver)
# fails every program instead of skipping it.
test-gpu: build-gpu
	@rc=0; rm -rf $(GPU_BUILD)/tests/gpu/coverage; \
	LPX_TEST_REQUIRE_GPU=1 meson test -C $(GPU_BUILD) --no-rebuild --suite gpu --print-errorlogs --num-processes 1 || rc=1; \
	scripts/test-summary.py $(GPU_BUILD) || rc=1; \
	exit $$rc

# Long fuzzing runs: FUZZ_SECONDS per target (default 300), from the seeds
# in tests/fuzz/corpus/<target>/; new inputs are kept in
# $(FUZZ_BUILD)/fuzz-corpus/<target>/, crashes in $(FUZZ_BUILD)/fuzz-artifacts/.
fuzz: build-fuzz
	@for t in $(FUZZ_TARGETS); do echo "fuzz_$$t: $(FUZZ_SECONDS) s (log: $(FUZZ_BUILD)/fuzz-$$t.log)"; \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 $(FUZZ_BUILD)/tests/fuzz/fuzz_$$t \
	    -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
	    -create_missing_dirs=1 -artifact_prefix=$(FUZZ_BUILD)/fuzz-artifacts/$$t- \
	    $(FUZZ_BUILD)/fuzz-corpus/$$t tests/fuzz/corpus/$$t >$(FUZZ_BUILD)/fuzz-$$t.log 2>&1 \
	    || { tail -60 $(FUZZ_BUILD)/fuzz-$$t.log; exit 1; }; \
	  grep -E '^#[0-9]+.*DONE|^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' \
	    $(FUZZ_BUILD)/fuzz-$$t.log; done

# Goals a machine can miss print MISSED in their table (and exit 0: speed
# is measured, never asserted); the last line counts them over all benches.
bench: build
	@rm -f $(BUILD)/bench.out; for b in dispatch float8 nf4 fsdp ckpt; do \
	  $(LPX) bench $$b | tee -a $(BUILD)/bench.out || exit 1; echo; done; \
	awk '/^lpx-bench-goals:/ { split($$3, a, "="); split($$4, b, "="); met += a[2]; missed += b[2] } \
	  END { printf "bench goals: %d met, %d MISSED\n", met, missed }' $(BUILD)/bench.out

# The mutation check (scripts/mutate.py, docs/TESTING.md): small deliberate
# bugs in the codecs, dispatcher, engine and optimizer, each built and run
# against the suite in a scratch copy; fails unless every one is caught.
mutate: test-deps
	@scripts/mutate.py

# lpx-cuda.so next to the GPU's copy bandwidth and PyTorch (bench/gpu/run.sh;
# PYTHON= the interpreter with torch, default python3).
bench-gpu: build-gpu
	@bash bench/gpu/run.sh $(GPU_BUILD)

# lpx train --device cuda beside transformers (eager, compile, torchao) on
# Llama-3-8B shapes with 8 layers, one call (bench/gpu/train_compare.py;
# staged: python3 bench/train_compare.py --stage . in gpu-stage/).
bench-train-gpu: build-gpu
	@$${PYTHON:-python3} bench/gpu/train_compare.py

# Issue 32's acceptance run, prepared here (docs/GPU.md, "Acceptance run"):
# build-gpu, staged into gpu-stage/ with torchao's wheel (the GPU machine
# has no network), then the CPU smoke of the staged run (ACC_SMOKE=0 skips
# it): every stage runs, says "no GPU", the table reads "not measured".
# There: bash gpu-stage/run-gpu.sh acceptance [STAGE...]
ACC_SMOKE ?= 1
gpu-acceptance: build-gpu
	@scripts/gpu-stage.sh -B $(GPU_BUILD) --no-build
	@if [ "$(ACC_SMOKE)" = 1 ]; then \
	  echo "lpx: the CPU smoke of the staged acceptance run (OUT=$(GPU_BUILD)/acceptance-smoke)"; \
	  rm -rf $(GPU_BUILD)/acceptance-smoke; \
	  OUT=$(abspath $(GPU_BUILD))/acceptance-smoke bash gpu-stage/run-gpu.sh acceptance --smoke; fi
	@echo "lpx: staged; on the GPU machine: bash gpu-stage/run-gpu.sh acceptance [STAGE...]"

install: build
	meson install -C $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) $(GPU_BUILD)

# lpx — the two commands: `make demo` and `make test` (plus `make bench`).
# Both install what is missing (apt-get when run as root, otherwise they
# print the exact command and stop), configure, build and run.

BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
# the tests whose point is concurrency also run under ThreadSanitizer
TSAN_TESTS ?= dispatch comm trace dtype
MESON_OPTS ?=
LPX        := $(BUILD)/tools/lpx/lpx

.PHONY: all deps test-deps build build-asan build-tsan demo test bench install clean

all: build

deps:
	@scripts/ensure-deps.sh

test-deps:
	@scripts/ensure-deps.sh test

$(BUILD)/build.ninja:
	@meson setup $(BUILD) $(MESON_OPTS) >/dev/null || (cat $(BUILD)/meson-logs/meson-log.txt | tail -30; exit 1)

$(ASAN_BUILD)/build.ninja:
	@meson setup $(ASAN_BUILD) -Dbuildtype=debug -Db_sanitize=address,undefined \
	  -Db_lundef=false $(MESON_OPTS) >/dev/null || (tail -30 $(ASAN_BUILD)/meson-logs/meson-log.txt; exit 1)

$(TSAN_BUILD)/build.ninja:
	@meson setup $(TSAN_BUILD) -Dbuildtype=debug -Db_sanitize=thread -Db_lundef=false \
	  $(MESON_OPTS) >/dev/null || (tail -30 $(TSAN_BUILD)/meson-logs/meson-log.txt; exit 1)

build: deps $(BUILD)/build.ninja
	@ninja -C $(BUILD) --quiet

build-asan: deps $(ASAN_BUILD)/build.ninja
	@ninja -C $(ASAN_BUILD) --quiet

build-tsan: deps $(TSAN_BUILD)/build.ninja
	@ninja -C $(TSAN_BUILD) --quiet $(addprefix tests/test_,$(TSAN_TESTS))

# The main job: float8-tensorwise training on 4 local ranks with fp8
# all-gather, plus the bf16 baseline (tools/train/, docs/TRAIN.md).
demo: build
	@$(LPX) train --compare --out $(BUILD)/train-demo

# The whole suite twice, a normal build and an ASan+UBSan build, plus the
# concurrency tests under TSan. The last line is the total over all three:
# "N passed, N failed, N skipped".
test: test-deps build build-asan build-tsan
	@rc=0; \
	OPENBLAS_NUM_THREADS=1 meson test -C $(BUILD) --print-errorlogs --num-processes 2 || rc=1; \
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  OPENBLAS_NUM_THREADS=1 meson test -C $(ASAN_BUILD) --print-errorlogs --num-processes 2 --timeout-multiplier 3 || rc=1; \
	TSAN_OPTIONS=halt_on_error=1 OPENBLAS_NUM_THREADS=1 meson test -C $(TSAN_BUILD) --no-rebuild \
	  --print-errorlogs --timeout-multiplier 3 $(TSAN_TESTS) || rc=1; \
	scripts/test-summary.py $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) || rc=1; \
	exit $$rc

bench: build
	@for b in dispatch float8 nf4 fsdp; do $(LPX) bench $$b || exit 1; echo; done

install: build
	meson install -C $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)

#!/usr/bin/env bash
# The GPU benchmark, lpx next to PyTorch (docs/GPU.md, `make bench-gpu`).
#
#   bench/gpu/run.sh [DIR]
#
# DIR: a meson build directory configured with -Dcuda=enabled (default
# build-gpu; bench_gpu at bench/gpu/, the plugin at backends/cuda/) or a
# folder made by scripts/gpu-stage.sh (bench_gpu and lpx-cuda.so at its top).
# Runs every bench_gpu case in a process of its own (a crash or a hang in one
# case costs that row only), then torch_bench.py (eager, then the
# torch.compile variants under a time limit), then prints the side-by-side
# table and the targets (compare.py). Never stops at a failing case.
#
# Environment: LPX_CUDA_PLUGIN (plugin path), PYTHON (default python3, the
# interpreter with torch), BENCH_OUT (where the JSON lines and the summary go;
# default $OUT/bench when $OUT is set, else a new temporary folder),
# BENCH_REPS (default 30), BENCH_BATCH (back-to-back reps per timed sample,
# default 10: no event between the reps of a sample, as in a training step;
# 1 times each rep between its own events), BENCH_QUICK=1 (small sizes: smoke test),
# BENCH_COMPILE=0 (skip torch.compile), BENCH_CASE_TIMEOUT (s per lpx case,
# default 90), BENCH_TORCH_TIMEOUT (s for the eager run, default 420),
# BENCH_COMPILE_TIMEOUT (s for the compile run, default 150), BENCH_ONLY
# (comma-separated case names), BENCH_DEADLINE (epoch seconds by which the
# whole run must have printed its table: each stage's limit shrinks to fit,
# keeping time for the later ones; gpu-stage's run-gpu.sh sets it).
set -u
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-build-gpu}
if [ -x "$dir/bench_gpu" ]; then
    exe=$dir/bench_gpu
    plugin=${LPX_CUDA_PLUGIN:-$dir/lpx-cuda.so}
else
    exe=$dir/bench/gpu/bench_gpu
    plugin=${LPX_CUDA_PLUGIN:-$dir/backends/cuda/lpx-cuda.so}
fi
py=${PYTHON:-python3}
reps=${BENCH_REPS:-30}
batch=${BENCH_BATCH:-10}
if [ -n "${BENCH_OUT:-}" ]; then out=$BENCH_OUT
elif [ -n "${OUT:-}" ]; then out=$OUT/bench
else out=$(mktemp -d /tmp/lpx-bench-gpu.XXXXXX)
fi
mkdir -p "$out"
lpx_json=$out/lpx.jsonl
torch_json=$out/torch.jsonl
: >"$lpx_json"
: >"$torch_json"
quick=()
[ "${BENCH_QUICK:-0}" = 1 ] && quick=(--quick)
torch_reserve=170
[ "${BENCH_COMPILE:-1}" = 0 ] && torch_reserve=60
have_timeout=1
command -v timeout >/dev/null 2>&1 || have_timeout=0
run_limited() {  # seconds, command...
    local s=$1
    shift
    if [ $have_timeout = 1 ]; then timeout -k 10 "$s" "$@"; else "$@"; fi
}
# limit SECONDS RESERVE: SECONDS, cut so that RESERVE s remain before
# BENCH_DEADLINE (0 when nothing is left)
limit() {
    local s=$1
    if [ -n "${BENCH_DEADLINE:-}" ]; then
        local left=$((BENCH_DEADLINE - $(date +%s) - $2))
        [ "$left" -lt 0 ] && left=0
        [ "$s" -gt "$left" ] && s=$left
    fi
    echo "$s"
}

echo "== lpx GPU benchmark: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "== device"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
        --format=csv 2>&1 | sed 's/^/   /'
else
    echo "   nvidia-smi: not found"
fi
echo "   host: $(uname -n), $(nproc 2>/dev/null || echo '?') cores"
echo "   results: $out"

echo
echo "== lpx (bench_gpu, one process per case)"
if [ ! -x "$exe" ]; then
    echo "   $exe: not built (configure with -Dcuda=enabled)"
    echo "{\"impl\": \"lpx\", \"case\": \"copy\", \"error\": \"bench_gpu not built\"}" >>"$lpx_json"
else
    cases=$("$exe" --list)
    if [ -n "${BENCH_ONLY:-}" ]; then
        cases=$(echo "$cases" | grep -xF -f <(tr ',' '\n' <<<"$BENCH_ONLY"))
    fi
    for c in $cases; do
        before=$(grep -c "\"case\": \"$c\"" "$lpx_json")
        # the copy row's bandwidth, once measured, so each process prints its % of copy
        ref=()
        gbps=$(grep '"case": "copy",' "$lpx_json" | sed -n 's/.*"gbps": \([0-9.]*\).*/\1/p' | tail -1)
        [ -n "$gbps" ] && ref=(--copy-gbps "$gbps")
        # keep about 150 s for PyTorch (40 s without torch.compile) and 20 s
        # for the table
        lim=$(limit "${BENCH_CASE_TIMEOUT:-90}" "$torch_reserve")
        if [ "$lim" -lt 10 ]; then
            echo "$c: not run (BENCH_DEADLINE)"
            echo "{\"impl\": \"lpx\", \"case\": \"$c\", \"error\": \"not run: no time left\"}" >>"$lpx_json"
            continue
        fi
        run_limited "$lim" "$exe" --plugin "$plugin" --reps "$reps" --batch "$batch" "${quick[@]}" \
            "${ref[@]}" --only "$c" --json "$lpx_json"
        rc=$?
        if [ $rc = 77 ]; then
            echo "   the plugin declined (no CUDA device): no lpx numbers"
            echo "{\"impl\": \"lpx\", \"case\": \"$c\", \"error\": \"plugin declined (no CUDA device)\"}" >>"$lpx_json"
            break
        fi
        after=$(grep -c "\"case\": \"$c\"" "$lpx_json")
        if [ "$after" = "$before" ]; then
            case $rc in
                124|137) why="timed out after $lim s" ;;
                139) why="crashed (SIGSEGV)" ;;
                134) why="aborted (SIGABRT)" ;;
                *) why="exited with status $rc without a result" ;;
            esac
            echo "$c: $why"
            echo "{\"impl\": \"lpx\", \"case\": \"$c\", \"error\": \"$why\"}" >>"$lpx_json"
        fi
    done
fi

echo
echo "== PyTorch (torch_bench.py, $py)"
only=()
[ -n "${BENCH_ONLY:-}" ] && only=(--only "$BENCH_ONLY")
lim=$(limit "${BENCH_TORCH_TIMEOUT:-420}" 20)
rc=124
if [ "$lim" -ge 10 ]; then
    run_limited "$lim" "$py" "$here/torch_bench.py" --reps "$reps" --batch "$batch" "${quick[@]}" "${only[@]}" \
        --json "$torch_json"
    rc=$?
    case $rc in 124|137) echo "   torch_bench.py: stopped after $lim s (the rows above are kept)" ;; esac
else
    echo "   not run (BENCH_DEADLINE)"
fi
lim=$(limit "${BENCH_COMPILE_TIMEOUT:-150}" 10)
if [ "${BENCH_COMPILE:-1}" != 0 ] && [ $rc != 3 ] && [ $rc != 77 ] && [ "$lim" -ge 30 ]; then
    echo "-- torch.compile variants (limit $lim s)"
    run_limited "$lim" "$py" "$here/torch_bench.py" --compile --reps "$reps" --batch "$batch" "${quick[@]}" \
        "${only[@]}" --json "$torch_json"
    case $? in 124|137) echo "   torch.compile run: stopped after $lim s (the rows above are kept)" ;; esac
fi

echo
echo "== lpx vs PyTorch"
"$py" "$here/compare.py" "$lpx_json" "$torch_json" --summary "$out/summary.json" ||
    python3 "$here/compare.py" "$lpx_json" "$torch_json" --summary "$out/summary.json"
echo "(JSON lines: $lpx_json, $torch_json; summary: $out/summary.json)"

# the chip file lpx plan reads (docs/PLAN.md): the measured GEMM and copy
# rates, with the chip's published SM count, memory and bf16 peak
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    case $gpu in
        *H200*) chip=(--name "NVIDIA H200" --sms 132 --memory-gib 141 --peak-tflops 989.4) ;;
        *H100*) chip=(--name "NVIDIA H100" --sms 132 --memory-gib 80 --peak-tflops 989.4) ;;
        *) chip=() ;;
    esac
    if [ ${#chip[@]} -gt 0 ]; then
        cf=$here/chip-file.py   # a gpu-stage folder carries it beside this script
        [ -f "$cf" ] || cf=$here/../../scripts/chip-file.py
        if python3 "$cf" "$lpx_json" "${chip[@]}" >"$out/chip.json"; then
            echo "(chip file for lpx plan: $out/chip.json)"
        else
            rm -f "$out/chip.json"
        fi
    else
        echo "(no chip file: '$gpu' has no published figures in bench/gpu/run.sh)"
    fi
fi
exit 0

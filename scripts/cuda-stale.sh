#!/usr/bin/env bash
# Deletes the CUDA objects of a meson build that are older than a header
# they may include, so that the next ninja run recompiles them.
#
#   scripts/cuda-stale.sh BUILD
#
# Why: meson 1.0 runs nvcc without a dependency file, so ninja knows only
# the .cu file itself; after a change to a header (an op added to
# include/lpx/ops*.def renumbers the ops after it) the plugin would link
# objects built against the old header and register kernels under wrong
# op ids. Cheap: compares modification times, runs before each GPU build
# (Makefile, scripts/gpu-stage.sh).
set -eu
build=${1:?usage: cuda-stale.sh BUILD}
root=$(cd "$(dirname "$0")/.." && pwd)
[ -d "$build" ] || exit 0
newest=$(find "$root/include" "$root/core/numerics" "$root/backends/cuda" "$root/plugins/mx" \
    \( -name '*.h' -o -name '*.cuh' -o -name '*.def' \) -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -1 | cut -d' ' -f2-)
[ -n "$newest" ] || exit 0
n=0
while IFS= read -r o; do
    rm -f "$o"
    n=$((n + 1))
done < <(find "$build" -name '*.cu.o' ! -newer "$newest" 2>/dev/null)
[ $n -gt 0 ] && echo "cuda-stale.sh: $n CUDA object(s) older than $(basename "$newest"): rebuilt" >&2
exit 0

#!/usr/bin/env bash
# Stages what the GPU machine needs into one folder (docs/GPU.md, "Running
# on another machine"): build here, carry the folder there, run
# `bash gpu-stage/run-gpu.sh [bench|acceptance]`.
#
#   scripts/gpu-stage.sh [-B BUILD] [-o DIR] [--no-build] [--no-wheel]
#
# BUILD: a meson build with -Dcuda=enabled (default build-gpu, else build);
# DIR: the stage (default gpu-stage/, listed in .git/info/exclude). The
# stage holds liblpx.so.0, lpx-cuda.so, lpx-nccl.so (when built), lpx-mx.so,
# lpx-mx-cuda.so, the GPU test programs (tests/), bench_gpu, the lpx tool, libcjson.so.1
# (the target machine lacks it) and the bench scripts (bench/), binaries
# stripped, plus run-gpu.sh, which sets LD_LIBRARY_PATH to the stage (it
# is searched before the binaries' RUNPATH, which points into this build
# tree) and runs each GPU test with the environment meson gives it, paths
# mapped into the stage. For the acceptance run (`run-gpu.sh acceptance`,
# bench/gpu/acceptance.py, docs/GPU.md "Acceptance run") it also carries
# acceptance.py, the measured H200 chip file, the commit (lpx-commit.txt)
# and torchao's wheel in wheels/ (the GPU machine has no network):
# $TORCHAO_WHEEL when given, else one already in BUILD/wheels/ or in pip's
# cache, else `pip download --no-deps` of $TORCHAO_SPEC (default
# torchao==0.18.0, the version measured with torch 2.11) for CPython 3.12
# on manylinux_2_28 x86_64; --no-wheel (or no network) stages without it
# and the torchao rows say so.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=
stage=gpu-stage
do_build=1
do_wheel=1
while [ $# -gt 0 ]; do
    case $1 in
        -B) build=$2; shift 2 ;;
        -o) stage=$2; shift 2 ;;
        --no-build) do_build=0; shift ;;
        --no-wheel) do_wheel=0; shift ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "gpu-stage.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
cd "$root"
if [ -z "$build" ]; then
    if [ -f build-gpu/build.ninja ]; then build="build-gpu"; else build="build"; fi
fi
[ -f "$build/build.ninja" ] || { echo "gpu-stage.sh: $build is not a meson build (run: make build-gpu)" >&2; exit 1; }
[ $do_build = 1 ] && scripts/cuda-stale.sh "$build" && ninja -C "$build" --quiet
build=$(cd "$build" && pwd)
cuda=$build/backends/cuda/lpx-cuda.so
[ -f "$cuda" ] || { echo "gpu-stage.sh: $cuda missing: configure $build with -Dcuda=enabled" >&2; exit 1; }

rm -rf "$stage"
mkdir -p "$stage/tests" "$stage/bench"
stage=$(cd "$stage" && pwd)

# files: liblpx under its soname only (no symlinks to carry)
cp -L "$build/liblpx.so.0" "$stage/liblpx.so.0"
cp "$cuda" "$stage/"
[ -f "$build/backends/nccl/lpx-nccl.so" ] && cp "$build/backends/nccl/lpx-nccl.so" "$stage/"
cp "$build/plugins/mx/lpx-mx.so" "$stage/"
[ -f "$build/plugins/mx/cuda/lpx-mx-cuda.so" ] && cp "$build/plugins/mx/cuda/lpx-mx-cuda.so" "$stage/"
cp "$build/tools/lpx/lpx" "$stage/"
[ -f "$build/bench/gpu/bench_gpu" ] && cp "$build/bench/gpu/bench_gpu" "$stage/"
for t in "$build"/tests/gpu/test_*; do
    [ -f "$t" ] && [ -x "$t" ] && cp "$t" "$stage/tests/"
done
cjson=$(ls /lib/x86_64-linux-gnu/libcjson.so.1 2>/dev/null || ls /usr/lib/x86_64-linux-gnu/libcjson.so.1 2>/dev/null || true)
if [ -n "$cjson" ]; then cp -L "$cjson" "$stage/libcjson.so.1"; else echo "gpu-stage.sh: warning: libcjson.so.1 not found" >&2; fi
cp bench/gpu/run.sh bench/gpu/torch_bench.py bench/gpu/compare.py bench/gpu/train_ref.py bench/gpu/train_compare.py \
    bench/gpu/acceptance.py scripts/chip-file.py "$stage/bench/"
# the acceptance run: lpx plan's measured chip file, the commit
cp data/chips/h200-measured.json "$stage/"
{ git rev-parse --short HEAD 2>/dev/null || echo unknown; } | tr -d '\n' >"$stage/lpx-commit.txt"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then echo -n "+ (uncommitted changes)" >>"$stage/lpx-commit.txt"; fi
echo >>"$stage/lpx-commit.txt"
# the Python package and lpx.torch's tests (run by run-gpu.sh; train_ref.py's
# lpx-f8-* modes import it from here)
mkdir -p "$stage/python" "$stage/tests/python"
cp -r python/lpx "$stage/python/"
rm -rf "$stage/python/lpx/__pycache__"
cp tests/python/pycase.py tests/python/test_torch.py tests/python/test_torch_optim.py "$stage/tests/python/"
# the Llama fixture the GPU suite checks its kernels' composition against
cp -r tests/data/llama_tiny "$stage/llama_tiny"
cp data/corpus.txt "$stage/corpus.txt"   # lpx train's default corpus (test_train_gpu, lpx train in gpu-stage)
chmod +x "$stage/bench/run.sh"

# torchao's wheel (the acceptance run's torchao rows; unpacked there into
# gpu-stage/site/ when the machine's Python lacks torchao)
if [ $do_wheel = 1 ]; then
    mkdir -p "$stage/wheels" "$build/wheels"
    whl=${TORCHAO_WHEEL:-}
    [ -z "$whl" ] && whl=$(ls -t "$build"/wheels/torchao-*.whl 2>/dev/null | head -1 || true)
    [ -z "$whl" ] && whl=$(find "$HOME/.cache/pip" "$root/.test-venv" -name 'torchao-*.whl' 2>/dev/null | head -1 || true)
    if [ -z "$whl" ]; then
        pip=(python3 -m pip)
        [ -x "$root/.test-venv/bin/python3" ] && pip=("$root/.test-venv/bin/python3" -m pip)
        echo "gpu-stage.sh: downloading ${TORCHAO_SPEC:-torchao==0.18.0}'s wheel into $build/wheels/" >&2
        timeout 180 "${pip[@]}" download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
            --platform manylinux_2_28_x86_64 -d "$build/wheels" "${TORCHAO_SPEC:-torchao==0.18.0}" >&2 || true
        whl=$(ls -t "$build"/wheels/torchao-*.whl 2>/dev/null | head -1 || true)
    fi
    if [ -n "$whl" ] && [ -f "$whl" ]; then
        cp "$whl" "$stage/wheels/"
    else
        echo "gpu-stage.sh: warning: no torchao wheel (TORCHAO_WHEEL=FILE, or network for pip download): the" \
            "acceptance run's torchao rows will say torchao is missing" >&2
    fi
fi

# strip (the plugins keep their dynamic symbols), and check that nothing
# carries a DT_RPATH, which (unlike DT_RUNPATH) would be searched before
# LD_LIBRARY_PATH and could pick libraries from a stale tree there
elves=$(find "$stage" -type f \( -name '*.so*' -o -perm -u+x \) ! -name '*.sh' ! -name '*.py')
for f in $elves; do
    if [ "$(head -c 4 "$f" | cut -c2-4)" = ELF ]; then
        strip --strip-unneeded "$f" 2>/dev/null || true
        dyn=$(readelf -d "$f" 2>/dev/null || true)
        if [[ $dyn == *"(RPATH)"* ]]; then
            echo "gpu-stage.sh: warning: $f has DT_RPATH (searched before LD_LIBRARY_PATH)" >&2
        fi
    fi
done

# The GPU tests as meson defines them (name, timeout, command, environment),
# with every path of the build tree mapped to the staged file of that name.
tests_sh=$(python3 - "$build" "$stage" <<'PY'
import json, os, shlex, subprocess, sys
build, stage = sys.argv[1], sys.argv[2]
staged, staged_dirs = {}, {}
for dirpath, dirs, files in os.walk(stage):
    for f in files:
        staged[f] = os.path.relpath(os.path.join(dirpath, f), stage)
    for d in dirs:
        staged_dirs[d] = os.path.relpath(os.path.join(dirpath, d), stage)
src = os.path.dirname(os.path.abspath(build))
def mapped(v):
    if v.startswith(build + "/") and os.path.basename(v) in staged:
        return '"$D/%s"' % staged[os.path.basename(v)]
    # a directory of the source tree that was staged (the Llama fixture)
    if v.startswith(src + "/") and os.path.isdir(v) and os.path.basename(v) in staged_dirs:
        return '"$D/%s"' % staged_dirs[os.path.basename(v)]
    # a file of the source tree that was staged (the corpus of test_train_gpu)
    if v.startswith(src + "/") and os.path.isfile(v) and os.path.basename(v) in staged:
        return '"$D/%s"' % staged[os.path.basename(v)]
    return shlex.quote(v)
try:
    tests = json.loads(subprocess.run(["meson", "introspect", build, "--tests"], check=True,
                                      capture_output=True, text=True).stdout)
except Exception as e:
    print("# meson introspect failed (%s): the staged programs with the default environment" % e)
    tests = [{"name": f[len("test_"):], "cmd": [os.path.join(build, "tests/gpu", f)], "timeout": 600,
              "suite": ["gpu"], "env": {"LPX_TEST_CUDA_PLUGIN": os.path.join(build, "backends/cuda/lpx-cuda.so"),
                                        "LPX_TEST_NCCL_PLUGIN": os.path.join(build, "backends/nccl/lpx-nccl.so")}}
             for f in sorted(os.listdir(os.path.join(stage, "tests")))]
for t in tests:
    if not any(s == "gpu" or s.endswith(":gpu") for s in t["suite"]):
        continue
    exe = os.path.basename(t["cmd"][0])
    if exe not in staged:
        print("# %s: %s was not built" % (t["name"], exe))
        continue
    env = " ".join("%s=%s" % (k, '"$D/coverage"' if k == "LPX_TEST_GPU_COVERAGE" else mapped(v))
                   for k, v in sorted(t.get("env", {}).items()) if k != "LD_LIBRARY_PATH")
    args = " ".join(mapped(a) for a in t["cmd"][1:])
    print("run_test %s %d %s %s -- %s" % (shlex.quote(t["name"]), t.get("timeout") or 600,
                                          '"$D/%s"' % staged[exe], env, args))
PY
)

cat >"$stage/run-gpu.sh" <<'EOF'
#!/usr/bin/env bash
# Runs the staged GPU suite (and with `bench` the benchmark) on this machine.
#   bash run-gpu.sh            the GPU tests: PASS/FAIL/SKIP per program and
#                              "N passed, N failed, N skipped" over cases
#   bash run-gpu.sh bench      the tests, then bench/run.sh (lpx vs PyTorch)
#   bash run-gpu.sh bench-only the benchmark only
#   bash run-gpu.sh acceptance [STAGE...]  issue 32's acceptance run
#                              (bench/gpu/acceptance.py: every stage in its own
#                              process, within ACC_BUDGET s, default 540;
#                              one table target | measured | goal | met, JSON
#                              in $OUT/acceptance/); STAGE names rerun some
# Environment: GPU_TEST_TIMEOUT (s per test, default 300), PYTHON (the
# interpreter with torch, for the benchmark), BENCH_* (see bench/run.sh).
# RUN_BUDGET (s): the whole run must end within it (default 570 with a
# benchmark, none for tests alone), so one call of a time-limited runner
# still ends with the tables: the tests stop BENCH_RESERVE s (default 330)
# before the end (a test left without time is reported NOT RUN and counted
# as failed) and the benchmark fits its stages into the rest.
# Logs go to $OUT/gpu-tests when $OUT is set, else to logs/ here.
set -u
start=$(date +%s)
D=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mode=${1:-tests}
logs=${OUT:+$OUT/gpu-tests}
logs=${logs:-$D/logs}
mkdir -p "$logs"
passed=0 failed=0 skipped=0
budget=${RUN_BUDGET:-}
if [ -z "$budget" ] && { [ "$mode" = bench ] || [ "$mode" = bench-only ]; }; then budget=570; fi
tests_end=
if [ -n "$budget" ]; then
    export BENCH_DEADLINE=$((start + budget))
    reserve=0
    [ "$mode" = bench ] && reserve=${BENCH_RESERVE:-330}
    tests_end=$((start + budget - reserve))
fi

echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n)"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L; else echo "nvidia-smi: not found"; fi
# libraries the staged binaries cannot find here
missing=$(for f in "$D"/*.so* "$D"/lpx "$D"/bench_gpu "$D"/tests/*; do
    [ -f "$f" ] && ldd "$f" 2>/dev/null | grep 'not found' | sed "s|^|$(basename "$f"): |"; done | sort -u)
[ -n "$missing" ] && { echo "missing libraries:"; echo "$missing" | sed 's/^/  /'; }

run_test() {  # name timeout exe VAR=value... -- args...
    local name=$1 limit=$2 exe=$3
    shift 3
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    local cap=${GPU_TEST_TIMEOUT:-300}
    [ "$limit" -gt "$cap" ] && limit=$cap
    if [ -n "$tests_end" ]; then
        local left=$((tests_end - $(date +%s)))
        if [ "$left" -lt 15 ]; then
            failed=$((failed + 1))
            echo "NOT RUN $name (no time left in RUN_BUDGET)"
            return
        fi
        [ "$limit" -gt "$left" ] && limit=$left
    fi
    local log=$logs/$name.log t0=$SECONDS rc
    if command -v timeout >/dev/null 2>&1; then
        env "${envs[@]}" timeout -k 10 "$limit" "$exe" "$@" >"$log" 2>&1
    else
        env "${envs[@]}" "$exe" "$@" >"$log" 2>&1
    fi
    rc=$?
    local dt=$((SECONDS - t0))
    # cases, from the program's "lpx-cases: passed=P failed=F skipped=S gpu=G"
    # line(s) (tests/check.h); a program without one is one case
    local p f s
    read -r p f s < <(awk '/^lpx-cases:/ { for (i = 2; i <= 4; i++) { split($i, kv, "="); n[i] += kv[2] }; seen = 1 }
                           END { if (seen) print n[2] + 0, n[3] + 0, n[4] + 0; else print "- - -" }' "$log")
    if [ "$p" = - ]; then
        case $rc in 0) p=1 f=0 s=0 ;; 77) p=0 f=0 s=1 ;; *) p=0 f=1 s=0 ;; esac
    fi
    [ "$rc" != 0 ] && [ "$rc" != 77 ] && [ "$f" = 0 ] && f=1   # failed after its cases (crash, timeout)
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    case $rc in
        0) echo "PASS $name ($p passed, $s skipped, ${dt} s)"; grep '^skip ' "$log" | sed 's/^/    /' ;;
        77) echo "SKIP $name: $( (grep -m1 -i 'skip' "$log" || tail -1 "$log") | sed 's/^SKIP: *//')" ;;
        *) case $rc in 124|137) why="timed out after $limit s" ;; 139) why="SIGSEGV" ;; 134) why="SIGABRT" ;;
                       *) why="exit status $rc" ;; esac
           echo "FAIL $name ($why, $f failed case(s), ${dt} s); last lines of $log:"
           tail -40 "$log" | sed 's/^/    /' ;;
    esac
}
# this machine is for the GPU: a plugin that declines here is a failure
# (the acceptance run's CPU smoke sets 0)
export LPX_TEST_REQUIRE_GPU=${LPX_TEST_REQUIRE_GPU:-1}
# cuDNN (attention's fused path): lpx-cuda finds it through the loader, then
# LPX_CUDNN_PATH, then site-packages/nvidia/cudnn/lib beside a loaded library
# (docs/GPU.md, "Attention"). The C programs here load no Python library, so
# when only torch's wheel has cuDNN, name its folders (Python asked here, by
# this script, never by lpx)
if [ -z "${LPX_CUDNN_PATH:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9 '; then
    cudnn_dirs=$(python3 -c 'import os, site
ps = site.getsitepackages() + [site.getusersitepackages()]
print(":".join(d for d in (os.path.join(p, "nvidia", "cudnn", "lib") for p in ps) if os.path.isdir(d)))' \
        2>/dev/null || true)
    if [ -n "$cudnn_dirs" ]; then
        export LPX_CUDNN_PATH=$cudnn_dirs
        echo "LPX_CUDNN_PATH=$cudnn_dirs (cuDNN of Python's site-packages; none in the loader's path)"
    fi
fi
# which cuDNN file attention runs on (or where lpx-cuda looked)
LPX_PLUGIN_PATH="$D" "$D/lpx" info 2>&1 | grep '^attention' || echo "lpx info: no attention line"

if [ "$mode" = acceptance ]; then
    shift
    exec "${PYTHON:-python3}" "$D/bench/acceptance.py" --stage "$D" "$@"
fi

if [ "$mode" != bench-only ]; then
    echo "== GPU tests"
    rm -rf "$D/coverage"  # written by this run's programs, checked by cuda_coverage (last)
@TESTS@
    # lpx.torch on CUDA tensors (DLPack into lpx-cuda, stream ordering);
    # GPU_TEST_PYTHON=0 leaves it out (the acceptance run's CPU smoke)
    if [ "${GPU_TEST_PYTHON:-1}" = 1 ]; then
        run_test python_torch 600 python3 LPX_LIBRARY="$D/liblpx.so.0" LPX_PLUGIN_PATH="$D" \
            -- "$D/tests/python/test_torch.py"
        # lpx.torch's optimizers: test_cuda_matches_cpu (the CUDA step bit-equal to the CPU's)
        run_test python_torch_optim 600 python3 LPX_LIBRARY="$D/liblpx.so.0" LPX_PLUGIN_PATH="$D" \
            -- "$D/tests/python/test_torch_optim.py"
    fi
    echo "$passed passed, $failed failed, $skipped skipped"
fi
rc=0
[ $failed -gt 0 ] && rc=1
if [ "$mode" = bench ] || [ "$mode" = bench-only ]; then
    echo
    bash "$D/bench/run.sh" "$D"
fi
exit $rc
EOF
python3 - "$stage/run-gpu.sh" "$tests_sh" <<'PY'
import sys
p, tests = sys.argv[1], sys.argv[2]
s = open(p).read()
s = s.replace("@TESTS@", "\n".join("    " + l for l in tests.splitlines()) or "    :")
open(p, "w").write(s)
PY
chmod +x "$stage/run-gpu.sh"

# keep the stage out of git
exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
rel=${stage#"$root"/}
if [ -n "$exclude" ] && [ "$rel" != "$stage" ] && ! grep -qxF "/$rel/" "$exclude" 2>/dev/null; then
    echo "/$rel/" >>"$exclude"
fi

size=$(du -sk "$stage" | cut -f1)
echo "staged $(find "$stage" -type f | wc -l) files, $((size / 1024)) MiB, in $stage (from $build)"
[ "$size" -gt $((60 * 1024)) ] && echo "gpu-stage.sh: warning: the stage is over 60 MiB" >&2
echo "run there: bash $rel/run-gpu.sh [bench|bench-only|acceptance [STAGE...]]"

#!/usr/bin/env python3
"""Mutation check: does the suite catch small deliberate bugs?

Each mutation below replaces one snippet of the sources (it must occur
exactly once) by a plausible wrong version: the kind of bug a refactor or a
port to a new backend introduces in the core codecs, the dispatcher, the
sharding engine and the optimizer. The script copies the working tree
(tracked and untracked, not ignored, files) to a scratch directory, builds
it once (CPU only: -Dcuda=disabled -Dnccl=disabled), checks that the
unmutated suite passes, then for each mutation: applies it, rebuilds, runs
the suite (every non-GPU test, stopping at the first failure; --full runs
them all and lists every test that catches it), and restores
the file. A mutation is CAUGHT when some test fails, SURVIVED when the
suite passes. The report lists which tests caught each one; exit 1 if any
mutation survived or did not apply.

    scripts/mutate.py [--keep DIR] [--only NAME[,NAME...]] [--tests T[,T...]] [--full] [--list]
    make mutate

It takes about a minute per mutation on 2 cores. docs/TESTING.md explains
how to add one (every new class of bug the suite should catch)."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# (name, file, original snippet, mutated snippet, what the bug is)
MUTATIONS = [
    ("fp8-normals-truncate", "core/numerics/minifloat.h",
     "uint32_t r = a + ((1u << (sh - 1)) - 1u) + ((a >> sh) & 1u);",
     "uint32_t r = mant <= 3 ? a : a + ((1u << (sh - 1)) - 1u) + ((a >> sh) & 1u);",
     "the fp8 codec truncates normal values instead of rounding to nearest even (f16/bf16 untouched)"),
    ("minifloat-subnormal-tie", "core/numerics/minifloat.h",
     "q += (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;",
     "q += (rem >= half) ? 1u : 0u;",
     "subnormal ties round away from zero instead of to even"),
    ("bf16-truncate", "core/numerics/half.h",
     "uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;",
     "uint32_t r = u >> 16;",
     "f32 -> bf16 truncates instead of rounding to nearest even"),
    ("nf4-threshold", "core/numerics/nf4.h",
     "for (int i = 0; i < 15; i++) c += (unsigned)(v >= t[i]);",
     "for (int i = 0; i < 15; i++) c += (unsigned)(v > t[i]);",
     "a value exactly on an NF4 decision threshold gets the lower code"),
    ("nf4-scaler-factor", "core/numerics/nf4.h",
     "float f = (LPX_NF4_SCALER_RANGE / 2.0f) / absmax;",
     "float f = (LPX_NF4_SCALER_RANGE / 2.0f - 1.0f) / absmax;",
     "the NF4 scaler factor uses 127 / absmax where the format says 128"),
    ("dispatch-list-first-only", "dispatch/dispatch.c",
     "for (uint32_t j = 0; j < v->len; j++) {\n                    const lpx_tensor *t = v->u.ts[j];",
     "for (uint32_t j = 0; j < (v->len ? 1u : 0u); j++) {\n                    const lpx_tensor *t = v->u.ts[j];",
     "the keys of a Tensor[] argument come from its first element only"),
    ("dispatch-lowest-key", "dispatch/dispatch.c",
     "int key = 63 - __builtin_clzll(c->keys);",
     "int key = __builtin_ctzll(c->keys);",
     "the lowest key of the call runs instead of the highest (kinds bypassed)"),
    ("dispatch-mixed-devices", "dispatch/dispatch.c",
     "if (LPX_UNLIKELY(mixed) && !row->cross_device) return mixed_devices(c, row);",
     "if (0 && LPX_UNLIKELY(mixed) && !row->cross_device) return mixed_devices(c, row);",
     "tensors on different devices reach a kernel"),
    ("fp8-scale-formula", "backends/cpu/float8.c",
     "double s = fp8_max / (amax > 1e-12 ? amax : 1e-12);",
     "double s = fp8_max / (amax > 1e-12 ? amax : 1e-12) / 1.5;",
     "the dynamic scale is 1.5x too small (the fp8 range is under-used)"),
    ("fp8-gemm-unscale", "backends/cpu/float8_mm.c",
     "float f = fa * sb_v[0];",
     "float f = fa;",
     "the fp8 GEMM forgets b's scale_inv when both operands are tensorwise"),
    ("fsdp-replica-sum", "subclasses/dtensor/fsdp_grads.c",
     "if (!st && f->rep) st = lpx_comm_all_reduce_buf(f->rep, recv, recv, (size_t)block, w, LPX_REDUCE_AVG);",
     "if (!st && f->rep) st = lpx_comm_all_reduce_buf(f->rep, recv, recv, (size_t)block, w, LPX_REDUCE_SUM);",
     "hybrid sharding sums grads over replicas instead of averaging"),
    ("fsdp-fp8-grads-summed", "subclasses/dtensor/fsdp_grads.c",
     "*unscale = (float)(1.0 / ((double)*scale * f->world));",
     "*unscale = (float)(1.0 / (double)*scale);",
     "fp8 grad reduce-scatter returns the sum over ranks, not the average"),
    ("fsdp-fp8-amax-local", "subclasses/dtensor/fsdp_grads.c",
     "lpx_status st = lpx_comm_all_reduce_buf(f->comm, &amax, &amax, 1, LPX_F32, LPX_REDUCE_MAX);\n    if (st) return st;",
     "lpx_status st = LPX_OK;\n    if (st) return st;",
     "each rank scales its fp8 grads by its own amax (no shared scale)"),
    ("float8-weight-amax-sum", "subclasses/float8/float8_weight.c",
     "return lpx_comm_all_reduce_buf(comm, amax, amax, 1, LPX_F32, LPX_REDUCE_MAX);",
     "return lpx_comm_all_reduce_buf(comm, amax, amax, 1, LPX_F32, LPX_REDUCE_SUM);",
     "a float8 weight's amax is summed over ranks instead of max-reduced (host path)"),
    ("adamw-eps-inside-sqrt", "backends/cpu/optim.c",
     "x[i] = x[i] * decay - lr * mh / (sqrtf(vh) + eps);",
     "x[i] = x[i] * decay - lr * mh / sqrtf(vh + eps);",
     "AdamW's epsilon added under the square root"),
    ("adamw-bias-correction-step", "dispatch/meta_optim.c",
     "k->bc1 = (float)(1.0 - pow(beta1, (double)step));",
     "k->bc1 = (float)(1.0 - pow(beta1, (double)(step + 1)));",
     "AdamW's first-moment bias correction uses the next step's power (off by one)"),
    ("delayed-history-drops-nan", "subclasses/float8/float8_delayed.c",
     "if (isnan(v) || isnan(a)) a = NAN;\n            else if (v > a) a = v;",
     "if (v > a) a = v;",
     "a NaN amax in the delayed-scaling history is ignored instead of propagated"),
    ("loss-chunk-ignored", "tools/train/model.c",
     "int64_t c = R->o->loss_chunk;",
     "int64_t c = 0;",
     "--loss-chunk is parsed but the LM head and loss run in the automatic chunks"),
    ("block-stats-underflow-of-all", "backends/cpu/float8_block.c",
     "stv[1] = nonzero ? (float)((double)under / (double)nonzero) : 0.0f;",
     "stv[1] = n > 0 ? (float)((double)under / n) : 0.0f;",
     "the blockwise cast's underflow is a fraction of all elements, not of the nonzero ones"),
    ("mem-guard-main-phase-only", "tools/train/mem.c",
     "    if (r->pretrain) phase(o, g, r, TR_BF16, \"bf16-pretrain\", &out[n++]);",
     "    if (0 && r->pretrain) phase(o, g, r, TR_BF16, \"bf16-pretrain\", &out[n++]);",
     "the memory guard skips nf4-qlora's bf16 pre-training phase"),
    ("mem-guard-cgroup-ignored", "tools/train/mem.c",
     "        if (room < m->avail) m->avail = room;",
     "        if (0 && room < m->avail) m->avail = room;",
     "the memory guard ignores the cgroup's limit (MemAvailable only)"),
    ("mem-process-no-overhead", "tools/train/mem.c",
     "    p->total = p->per_rank * p->ranks + p->weights + p->corpus + p->overhead;",
     "    p->total = p->per_rank * p->ranks + p->weights + p->corpus;",
     "the process estimate leaves out the measured overhead (BLAS, conversions, allocator)"),
    ("mem-kv-as-heads", "tools/train/mem.c",
     "KV = (int64_t)g->kv_heads * g->head_dim;",
     "KV = (int64_t)g->heads * g->head_dim;",
     "lpx mem sizes k and v activations with every query head (grouped-query attention ignored)"),
    ("plan-mem-no-loss-chunk", "tools/plan/cmd_plan.c",
     "me.activations + me.transient);",
     "me.activations);",
     "lpx plan's memory per GPU leaves out the loss chunk that lpx mem's device total counts"),
]


def with_counts(src):
    """The mutations, each with how often its snippet occurs in its file."""
    return [(name, path, old, new, why, open(os.path.join(src, path)).read().count(old))
            for name, path, old, new, why in MUTATIONS]


def run(cmd, cwd, log, env=None):
    with open(log, "ab") as f:
        f.write(("\n$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        return subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode


def failed_tests(build):
    """The tests that failed on their own (not those meson stopped after the
    first failure: killed by a signal it sent)."""
    names = []
    path = os.path.join(build, "meson-logs", "testlog.json")
    if os.path.exists(path):
        for line in open(path):
            r = json.loads(line)
            if r.get("result") not in ("OK", "SKIP", "EXPECTEDFAIL") and r.get("returncode") not in (-15, -9):
                names.append(r["name"].split(" / ")[-1])
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", help="scratch directory to use and keep (default: a temporary one, removed)")
    ap.add_argument("--only", help="comma-separated mutation names")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--tests", help="comma-separated meson test names to run instead of the whole non-GPU suite "
                    "(with TEST_FILTER in the environment: the cases of those tests whose name contains it)")
    ap.add_argument("--full", action="store_true",
                    help="run the whole suite for each mutation (lists every test that catches it; slower)")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    muts = with_counts(root)
    if args.list:
        for m in muts:
            print(f"{m[0]:28} {m[1]:36} {m[4]}")
        return 0
    if args.only:
        want = set(args.only.split(","))
        unknown = want - {m[0] for m in muts}
        if unknown:
            print("unknown mutation(s):", ", ".join(sorted(unknown)))
            return 2
        muts = [m for m in muts if m[0] in want]
    bad = [m for m in muts if m[5] != 1]
    for m in bad:
        print(f"mutation {m[0]}: the snippet occurs {m[5]} times in {m[1]} (must be once): update scripts/mutate.py")
    if bad:
        return 1

    scratch = args.keep or tempfile.mkdtemp(prefix="lpx-mutate-")
    tree, build, log = os.path.join(scratch, "tree"), os.path.join(scratch, "tree", "build-mutate"), \
        os.path.join(scratch, "mutate.log")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, check=True,
                           stdout=subprocess.PIPE).stdout.decode().split("\0")
    os.makedirs(tree, exist_ok=True)
    for f in files:
        if not f or not os.path.isfile(os.path.join(root, f)):
            continue
        dst = os.path.join(tree, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.exists(dst) or open(dst, "rb").read() != open(os.path.join(root, f), "rb").read():
            shutil.copy(os.path.join(root, f), dst)   # a new mtime: a kept build (--keep) rebuilds it
    # the test interpreter (.test-venv) is found by absolute path: share it
    venv = os.path.join(root, ".test-venv")
    if os.path.isdir(venv) and not os.path.exists(os.path.join(tree, ".test-venv")):
        os.symlink(venv, os.path.join(tree, ".test-venv"))
    print(f"lpx mutate: {len(muts)} mutations, scratch {scratch} (log: {log})")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    if not os.path.exists(os.path.join(build, "build.ninja")):
        if run(["meson", "setup", build, "-Dcuda=disabled", "-Dnccl=disabled"], tree, log):
            print("meson setup failed: see", log)
            return 1
    # not the GPU suite (no GPU) nor the wheel (it builds a second liblpx
    # from the repository, not from this tree)
    test_cmd = ["meson", "test", "-C", build, "--no-rebuild", "--no-suite", "gpu", "--no-suite", "wheel",
                "--num-processes",
                str(min(4, os.cpu_count() or 2))] + ([] if args.full else ["--maxfail", "1"]) + \
        (args.tests.split(",") if args.tests else [])
    t0 = time.time()
    if run(["ninja", "-C", build], tree, log) or run(test_cmd, tree, log, env):
        print("the UNMUTATED tree does not build or pass its suite: fix that first; see", log)
        return 1
    print(f"baseline: builds and passes ({time.time() - t0:.0f} s)")

    results = []
    for name, path, old, new, why, _ in muts:
        full = os.path.join(tree, path)
        orig = open(full).read()
        t0 = time.time()
        try:
            open(full, "w").write(orig.replace(old, new, 1))
            if run(["ninja", "-C", build], tree, log):
                verdict, by = "NOT BUILT", []
            elif run(test_cmd, tree, log, env):
                verdict, by = "caught", failed_tests(build)
            else:
                verdict, by = "SURVIVED", []
        finally:
            open(full, "w").write(orig)
            os.utime(full)  # newer than the mutated build: the next ninja rebuilds it
        results.append((name, verdict, by, why))
        print(f"  {verdict:9} {name:28} {', '.join(by) if by else ''}  ({time.time() - t0:.0f} s)")
        sys.stdout.flush()

    caught = sum(1 for r in results if r[1] == "caught")
    print(f"\n{caught} of {len(results)} mutations caught")
    for name, verdict, by, why in results:
        if verdict != "caught":
            print(f"  {verdict}: {name}: {why}")
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The GPU acceptance run (issue 32; docs/GPU.md, "Acceptance run"): every
target of the issue measured in one call on one GPU, one table.

    python3 acceptance.py [--stage DIR] [--budget S] [--smoke] [--list] [STAGE...]

Run from a folder made by scripts/gpu-stage.sh (`make gpu-acceptance`):
`bash gpu-stage/run-gpu.sh acceptance [STAGE...]` calls this script with
--stage. Every stage runs in a process of its own under its own time limit
(a crash or a hang costs that stage's rows only), and the limits shrink to
fit the whole run into --budget seconds (default $ACC_BUDGET or 540: 9
minutes), keeping each later stage its minimum, as bench/gpu/run.sh's
BENCH_DEADLINE does. STAGE names pick stages (in the order below); none:
all of them. Prints a header (chip, driver, CUDA, torch, transformers,
torchao, the lpx commit), each stage's progress, and one table

    target | measured | goal | met

and writes it as JSON to $OUT/acceptance/acceptance.json when $OUT is set
(else to STAGE/acceptance-out/), with every stage's metrics, limits and
logs beside it (stages/NAME.json, logs/).

Without a GPU (or with --smoke) the stages run their smoke versions
(small shapes, lpx train on the CPU, bench_gpu and the GPU tests say the
plugin declined), each says "no GPU", and every target reads "not
measured (no GPU)": tests/python/test_gpu_acceptance_smoke.py checks that table.
Speed is never asserted here: the table is the place for goals; the exit
status is 0 when the table was written.
"""
import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))

# name, default limit (s), minimum kept for it while earlier stages run (s), what it measures
STAGES = [
    ("suite", 150, 40, "the GPU suite (run-gpu.sh tests): programs, cases, the cuDNN / cuBLASLt / coverage counters"),
    ("kernels", 45, 18, "bench_gpu: copy, rowwise quantize [16384^2], NF4 dequantize [8192^2], adamw_state_ "
                        "8-bit / 4-bit / fp8 on a bf16 [4096, 14336]"),
    ("blockwise", 40, 15, "bench_gpu: GEMM 8192^3 bf16 and fp8 block-scaled; Float8Linear bf16 and blockwise "
                          "4096 x 14336"),
    ("attention", 35, 15, "bench_gpu attention_llama3 (lpx, cuDNN) and torch_bench.py's SDPA flash, fwd + bwd"),
    ("delayed", 15, 5, "tests/test_cuda_delayed: the delayed scale over 8 steps on the GPU against the CPU"),
    ("trainer", 150, 50, "lpx train --device cuda, Llama-3-8B shapes x 8 layers, batch 2 x 4096: bf16, "
                         "float8-tensorwise/-rowwise/-blockwise, nf4-qlora"),
    ("plan", 10, 3, "lpx plan --chip h200-measured.json against the trainer stage's measured steps"),
    ("trainer-ref", 150, 50, "train_ref.py: transformers + per-block torch.compile (bf16), torchao float8 "
                             "tensorwise + compile, same shapes"),
    ("losses", 60, 20, "first-step loss lpx bf16 vs transformers from the same --init weights and tokens; "
                       "float8-tensorwise vs bf16 after 50 steps (smaller shape)"),
    ("lpxtorch", 70, 25, "train_ref.py eager bf16 vs lpx.torch eager float8 (convert_to_float8_training + "
                         "convert_to_fused_ops)"),
]
STAGE_NAMES = [s[0] for s in STAGES]

# The known gap of the delayed-scaling target: the history and the scale
# update run on the host (subclasses/float8/float8_quantize.c reads the
# cast's 4 statistics back from the device after each cast, then
# lpx_float8_delayed_update). Set True when they run on the device.
DELAYED_UPDATE_ON_DEVICE = False

# the trainer's shapes (train_ref.py's defaults: Llama-3-8B, 8 layers)
MODEL = dict(dim=4096, layers=8, heads=32, kv_heads=8, ffn=14336, vocab=128256, batch=2, seq=4096)
SMOKE_MODEL = dict(dim=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256, batch=1, seq=32)
TRAIN_RECIPES = ["bf16", "float8-tensorwise", "float8-rowwise", "float8-blockwise", "nf4-qlora"]


# ---------------------------------------------------------------- helpers

def now():
    return time.time()


def run_cmd(cmd, limit, log, env=None, cwd=None):
    """Runs cmd (its own process group) for at most `limit` seconds, output
    (stdout + stderr) into the file `log`; returns dict(rc, out, secs,
    timed_out). A timed-out group gets SIGTERM, then SIGKILL 5 s later."""
    t0 = now()
    limit = max(1, int(limit))
    full_env = dict(os.environ)
    if env:
        full_env.update({k: str(v) for k, v in env.items()})
    with open(log, "w") as f:
        f.write("$ %s\n" % " ".join(cmd))
        f.flush()
        try:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                                 start_new_session=True)
        except OSError as e:
            f.write("cannot start: %s\n" % e)
            return {"rc": 127, "out": "cannot start %s: %s" % (cmd[0], e), "secs": 0.0, "timed_out": False}
        timed_out = False
        try:
            rc = p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            rc = 124
    with open(log, errors="replace") as f:
        f.readline()   # the command line written above
        out = f.read()
    return {"rc": rc, "out": out, "secs": round(now() - t0, 1), "timed_out": timed_out}


def why_failed(r, limit=None):
    if r["timed_out"]:
        return "timed out after %s s" % (limit if limit is not None else int(r["secs"]))
    rc = r["rc"]
    names = {-11: "SIGSEGV", -6: "SIGABRT", -9: "SIGKILL", 139: "SIGSEGV", 134: "SIGABRT", 137: "SIGKILL"}
    last = " | ".join(l for l in r["out"].strip().splitlines()[-3:] if not l.startswith("$ "))
    return "exit %s%s: %s" % (rc, " (%s)" % names[rc] if rc in names else "", last[-300:])


def gpu_present():
    """An NVIDIA GPU visible to this process (the GPU suite's test, tests/gpu/gpu_util.h)."""
    return os.path.exists("/dev/nvidia0") or os.path.exists("/proc/driver/nvidia/gpus")


def fmt_x(v):
    return "-" if v is None else "%.2fx" % v


def ratio(a, b):
    return a / b if a and b else None


# ---------------------------------------------------------------- a stage's process

class Ctx:
    """What a stage's process knows: the stage folder, smoke or not, its
    deadline, where its logs and metrics go."""

    def __init__(self, d):
        self.stage_dir = d["stage_dir"]
        self.name = d["name"]
        self.smoke = d["smoke"]
        self.gpu = d["gpu"]
        self.end = d["end"]
        self.acc = d["acc_dir"]
        self.python = d["python"]
        self.logs = os.path.join(self.acc, "logs")
        self.res_path = os.path.join(self.acc, "stages", self.name + ".json")
        self.res = {"stage": self.name, "smoke": self.smoke, "gpu": self.gpu, "notes": []}
        self.save()

    def p(self, *parts):
        return os.path.join(self.stage_dir, *parts)

    def left(self, reserve=0):
        return self.end - now() - reserve

    def limit(self, want, reserve=0):
        return int(max(0, min(want, self.left(reserve))))

    def save(self):
        tmp = self.res_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.res, f, indent=1, sort_keys=True)
        os.replace(tmp, self.res_path)

    def note(self, msg):
        print("  [%s] %s" % (self.name, msg), flush=True)
        self.res["notes"].append(msg)
        self.save()

    def run(self, tag, cmd, limit, env=None, cwd=None):
        log = os.path.join(self.logs, "%s-%s.log" % (self.name, tag))
        if limit < 3:
            return {"rc": 124, "out": "", "secs": 0.0, "timed_out": True, "not_run": True}
        r = run_cmd(cmd, limit, log, env=env, cwd=cwd)
        r["log"] = log
        return r

    def lpx_env(self):
        return {"LPX_PLUGIN_PATH": self.stage_dir, "LPX_LIBRARY": self.p("liblpx.so.0")}

    def model(self):
        return dict(SMOKE_MODEL if self.smoke else MODEL)


def bench_gpu_cases(ctx, cases, per_case=60):
    """bench_gpu, one process per case (bench/gpu/run.sh's way); returns
    {case: record} from its JSON lines, errors as {"error": ...}."""
    exe, plugin = ctx.p("bench_gpu"), ctx.p("lpx-cuda.so")
    jl = os.path.join(ctx.acc, "stages", ctx.name + "-lpx.jsonl")
    recs = {}
    if not os.path.exists(exe):
        for c in cases:
            recs[c] = {"error": "bench_gpu was not staged (configure with -Dcuda=enabled)"}
        return recs
    copy = None
    for i, c in enumerate(cases):
        lim = ctx.limit(per_case, reserve=5 * (len(cases) - i - 1))
        cmd = [exe, "--plugin", plugin, "--reps", "20", "--batch", "5", "--only", c, "--json", jl]
        if ctx.smoke:
            cmd.append("--quick")
        if copy:
            cmd += ["--copy-gbps", "%.3f" % copy]
        r = ctx.run("bench_gpu-" + c, cmd, lim)
        got = {}
        if os.path.exists(jl):
            with open(jl) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    got[rec.get("case")] = rec
        if r["rc"] == 77:
            last = (r["out"].strip().splitlines() or ["-"])[-1][:200]
            for k in cases[i:]:
                recs[k] = {"error": "no GPU (lpx-cuda.so declined: %s)" % last}
            ctx.note("bench_gpu: no GPU (the plugin declined)")
            break
        for k, rec in got.items():
            if k == c or k == c + "_fwd":
                recs[k] = rec
        if c not in recs:
            recs[c] = {"error": "not run: no time left" if r.get("not_run") else why_failed(r, lim)}
        if c == "copy" and recs[c].get("gbps"):
            copy = recs[c]["gbps"]
        ctx.note("bench_gpu %s: %s" % (c, "%.3f ms" % recs[c]["ms"] if recs[c].get("ms") else recs[c].get("error")))
    return recs


def torch_bench_case(ctx, case, limit):
    jl = os.path.join(ctx.acc, "stages", ctx.name + "-torch.jsonl")
    cmd = [ctx.python, os.path.join(HERE, "torch_bench.py"), "--reps", "20", "--batch", "5", "--only", case,
           "--json", jl]
    if ctx.smoke:
        cmd.append("--quick")
    r = ctx.run("torch_bench-" + case, cmd, limit)
    recs = {}
    if os.path.exists(jl):
        with open(jl) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                recs[rec.get("case")] = rec
    if case not in recs:
        if r["rc"] == 77:
            recs[case] = {"error": "no GPU (torch.cuda.is_available() is False)"}
        elif r["rc"] == 3:
            recs[case] = {"error": "torch is not installed for %s" % ctx.python}
        else:
            recs[case] = {"error": "not run: no time left" if r.get("not_run") else why_failed(r, limit)}
    return recs


# ---- stage: suite

def parse_suite(out, logs):
    res = {"programs": {}}
    for line in out.splitlines():
        m = re.match(r"^(PASS|FAIL|SKIP|NOT RUN) (\S+)", line)
        if m:
            res["programs"][m.group(2).rstrip(":")] = m.group(1)
    m = None
    for m in re.finditer(r"^(\d+) passed, (\d+) failed, (\d+) skipped", out, re.M):
        pass
    if m:
        res["passed"], res["failed"], res["skipped"] = (int(m.group(i)) for i in (1, 2, 3))

    def read(name):
        try:
            with open(os.path.join(logs, name + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""
    a = re.search(r"attention path: (.*)", read("cuda_attention"))
    res["attention_path"] = a.group(1).strip() if a else None
    b = re.search(r"blockwise GEMM path: (.*) \((\d+) combinations on cuBLASLt\)", read("cuda_float8_block"))
    if b:
        res["block_path"], res["block_used"] = b.group(1).strip(), int(b.group(2))
    c = re.search(r"cuda coverage: (\d+) ops with a CUDA kernel, (\d+) dispatched", read("cuda_coverage"))
    if c:
        res["coverage"] = [int(c.group(1)), int(c.group(2))]
    torch_cases = {}
    for line in read("python_torch").splitlines():
        m = re.match(r"^(ok|skip|FAIL)\s+(test_cuda_\w+)", line)
        if m:
            torch_cases[m.group(2)] = {"ok": "pass", "skip": "skip", "FAIL": "FAIL"}[m.group(1)]
    res["torch_cuda_cases"] = torch_cases
    return res


def stage_suite(ctx):
    script = ctx.p("run-gpu.sh")
    lim = ctx.limit(10 ** 6)
    env = {"RUN_BUDGET": max(10, lim - 10), "OUT": ctx.acc, "GPU_TEST_TIMEOUT": min(150, max(10, lim - 10)),
           "LPX_TEST_REQUIRE_GPU": "1" if ctx.gpu else "0",
           # the smoke leaves lpx.torch's test_torch.py out: without a GPU it
           # is the CPU suite's python_torch test, minutes of it
           "GPU_TEST_PYTHON": "1" if ctx.gpu else "0"}
    r = ctx.run("run-gpu-tests", ["bash", script, "tests"], lim, env=env)
    res = parse_suite(r["out"], os.path.join(ctx.acc, "gpu-tests"))
    res["rc"], res["secs"] = r["rc"], r["secs"]
    if r["timed_out"]:
        res["error"] = "timed out after %d s" % lim
    ctx.res.update(res)
    if not ctx.gpu:
        ctx.note("no GPU: the programs report skipped (%s passed, %s failed, %s skipped)" %
                 (res.get("passed"), res.get("failed"), res.get("skipped")))
    else:
        ctx.note("%s passed, %s failed, %s skipped" % (res.get("passed"), res.get("failed"), res.get("skipped")))


# ---- stages: kernels, blockwise, attention

def stage_kernels(ctx):
    ctx.res["lpx"] = bench_gpu_cases(ctx, ["copy", "fp8_quant_rowwise", "nf4_dequant", "adamw_state_8bit",
                                           "adamw_state_4bit", "adamw_state_fp8"])
    ctx.save()


def stage_blockwise(ctx):
    ctx.res["lpx"] = bench_gpu_cases(ctx, ["gemm_bf16", "gemm_fp8_blockwise", "float8_linear_bf16_4096x14336",
                                           "float8_linear_blockwise_4096x14336"])
    ctx.save()


def stage_attention(ctx):
    ctx.res["lpx"] = bench_gpu_cases(ctx, ["attention_llama3"], per_case=25)
    ctx.save()
    ctx.res["torch"] = torch_bench_case(ctx, "attention_llama3", ctx.limit(60))
    t = ctx.res["torch"].get("attention_llama3", {})
    ctx.note("torch SDPA flash: %s" % ("%.3f ms" % t["ms"] if t.get("ms") else t.get("error")))
    ctx.save()


# ---- stage: delayed

def stage_delayed(ctx):
    exe = ctx.p("tests", "test_cuda_delayed")
    if not os.path.exists(exe):
        ctx.res["error"] = "no measuring code: test_cuda_delayed was not staged"
        ctx.save()
        return
    env = {"LPX_TEST_CUDA_PLUGIN": ctx.p("lpx-cuda.so"), "LPX_TEST_REQUIRE_GPU": "1" if ctx.gpu else "0"}
    r = ctx.run("test_cuda_delayed", [exe], ctx.limit(60), env=env)
    m = re.search(r"delayed-scaling: steps=(\d+) moved=(\d+) equal=(\w+) final_scale=(\S+)", r["out"])
    if m:
        ctx.res.update(steps=int(m.group(1)), moved=int(m.group(2)), equal=m.group(3) == "yes",
                       final_scale=float(m.group(4)))
    ctx.res["rc"] = r["rc"]
    if r["rc"] == 77:
        ctx.res["error"] = "no GPU (skipped: the plugin declined)"
    elif r["rc"] != 0:
        ctx.res["error"] = why_failed(r)
    ctx.note("test_cuda_delayed: %s" % ("rc 0" if r["rc"] == 0 else ctx.res.get("error")))
    ctx.save()


# ---- stage: trainer (lpx) and trainer-ref (transformers)

def lpx_args(ctx, m, steps, timeout, extra=""):
    return argparse.Namespace(device="cpu" if ctx.smoke else "cuda", steps=steps, timeout=int(timeout), extra=extra,
                              **m)


def stage_trainer(ctx):
    sys.path.insert(0, HERE)
    import train_compare  # beside this file (bench/gpu/ or gpu-stage/bench/): the command and its parser
    m = ctx.model()
    runs = ctx.res.setdefault("lpx", {})
    for i, recipe in enumerate(TRAIN_RECIPES):
        # each run up to 45 s (the 8B model's init is CPU work before the
        # first step), keeping 15 s for each later one; the last takes the rest
        left = len(TRAIN_RECIPES) - i - 1
        want = max(45, ctx.left() / (left + 1)) if left else 10 ** 6
        lim = ctx.limit(want, reserve=15 * left)
        if lim < 5:
            runs[recipe] = {"skipped": "not run: no time left"}
            ctx.save()
            continue
        a = lpx_args(ctx, m, 3 if ctx.smoke else 6, lim, "--pretrain 1" if recipe == "nf4-qlora" else "")
        # --out outside $OUT: nf4-qlora writes its pre-trained base there (GBs at these shapes)
        out = tempfile.mkdtemp(prefix="lpx-acc-train-%s-" % recipe)
        r = ctx.run("lpx-train-" + recipe, train_compare.lpx_cmd(a, ctx.p("lpx"), ctx.p("corpus.txt"), recipe, out),
                    lim, env=ctx.lpx_env())
        shutil.rmtree(out, ignore_errors=True)
        if r["timed_out"]:
            row = {"mode": "lpx " + recipe, "skipped": "timed out after %d s" % lim}
        else:
            row = train_compare.parse_lpx(a, recipe, r["out"], r["rc"])
        row["secs"] = r["secs"]
        runs[recipe] = row
        ctx.note("lpx train %s: %s" % (recipe, "%.0f tok/s, %.1f ms/step, peak %s GiB" % (
            row["tok_s"], row["ms_step"], row.get("peak_gib")) if row.get("tok_s") else row.get("skipped")))
        ctx.save()


def stage_trainer_ref(ctx):
    m = ctx.model()
    modes = ["eager"] if ctx.smoke else ["compile", "f8-tensorwise"]
    rows = ctx.res.setdefault("torch", {})
    for i, mode in enumerate(modes):
        left = len(modes) - i - 1
        lim = ctx.limit(10 ** 6 if not left else max(30, ctx.left() / (left + 1)), reserve=40 * left)
        cmd = [ctx.python, os.path.join(HERE, "train_ref.py"), "--json", "--device", "cpu" if ctx.smoke else "cuda",
               "--modes", mode, "--steps", "2" if ctx.smoke else "5", "--warmup", "1" if ctx.smoke else "2"]
        for k, v in m.items():
            cmd += ["--" + k.replace("_", "-"), str(v)]
        r = ctx.run("train_ref-" + mode, cmd, lim)
        got = None
        for line in r["out"].splitlines():
            if line.startswith("{"):
                try:
                    got = json.loads(line)
                except ValueError:
                    pass
        if got is None:
            got = {"mode": mode, "skipped": "not run: no time left" if r.get("not_run") else why_failed(r, lim)}
        rows[mode] = got
        ctx.note("train_ref %s: %s" % (mode, "%.0f tok/s, peak %s GiB" % (got["tokens_per_s"], got.get("peak_gib"))
                                       if got.get("tokens_per_s") else got.get("skipped")))
        ctx.save()


# ---- stage: plan

def stage_plan(ctx):
    chip = ctx.p("h200-measured.json")
    m = MODEL   # the trainer's shapes, also in smoke mode (the prediction is CPU arithmetic)
    pred = ctx.res.setdefault("predicted_ms", {})
    for recipe in ("float8-tensorwise", "float8-rowwise"):
        cmd = [ctx.p("lpx"), "plan", "--dim", str(m["dim"]), "--layers", str(m["layers"]), "--heads", str(m["heads"]),
               "--kv-heads", str(m["kv_heads"]), "--ffn", str(m["ffn"]), "--vocab", str(m["vocab"]), "--gpus", "1",
               "--gpus-per-node", "1", "--batch", str(m["batch"]), "--seq", str(m["seq"]), "--ac", "none",
               "--chip", chip, "--recipe", recipe, "--json"]
        r = ctx.run("plan-" + recipe, cmd, ctx.limit(20), env=ctx.lpx_env())
        try:
            j = json.loads(r["out"][r["out"].index("{"):])
            for s in j["steps"]:
                if s["case"] == "bf16":
                    pred["bf16"] = s["step_s"] * 1e3
                elif s["case"].endswith("as lpx runs it"):
                    pred[recipe] = s["step_s"] * 1e3
            ctx.res["fits"] = j.get("fits")
        except (ValueError, KeyError) as e:
            ctx.res["error"] = "lpx plan: %s (%s)" % (why_failed(r), e)
    trainer = os.path.join(ctx.acc, "stages", "trainer.json")
    meas = ctx.res.setdefault("measured_ms", {})
    try:
        with open(trainer) as f:
            t = json.load(f)
        for k, v in t.get("lpx", {}).items():
            if v.get("ms_step"):
                meas[k] = v["ms_step"]
    except (OSError, ValueError):
        ctx.res["trainer_missing"] = "no trainer stage result in this call (run the trainer stage first)"
    ctx.note("predicted ms/step: %s; measured: %s" % (
        ", ".join("%s %.1f" % kv for kv in pred.items()), ", ".join("%s %.1f" % kv for kv in meas.items()) or "none"))
    ctx.save()


# ---- stage: losses

def splitmix(x):
    M = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)


def lpx_batch(tok, seed, step, chunk, b, seq):
    """tools/train/data.c's tr_batch (the training split, not validation):
    the rows lpx train feeds its step `step`, micro-batch `chunk`."""
    n_train = len(tok) * 9 // 10
    span = n_train - seq - 1
    idx, tgt = [], []
    for r in range(b):
        h = splitmix(seed ^ splitmix((step * 1000003 + chunk * 7919 + r) & ((1 << 64) - 1)))
        off = h % span
        idx.append(tok[off:off + seq])
        tgt.append(tok[off + 1:off + seq + 1])
    return idx, tgt


REF_LOSS = r'''
import json, sys, torch, transformers
a = json.loads(sys.argv[1])
if a["make"]:
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    kw = dict(vocab_size=a["vocab"], hidden_size=a["dim"], intermediate_size=a["ffn"], num_hidden_layers=a["layers"],
              num_attention_heads=a["heads"], num_key_value_heads=a["kv_heads"], rms_norm_eps=1e-5,
              max_position_embeddings=8192, tie_word_embeddings=False)
    if int(transformers.__version__.split(".")[0]) >= 5:
        cfg = transformers.LlamaConfig(rope_parameters=dict(rope, rope_theta=500000.0), **kw)
    else:
        cfg = transformers.LlamaConfig(rope_theta=500000.0, rope_scaling=rope, **kw)
    torch.manual_seed(7)
    m = transformers.LlamaForCausalLM(cfg)
    m = m.to(torch.bfloat16)
    try:
        m.save_pretrained(a["ckpt"], safe_serialization=True)
    except TypeError:   # a transformers that always writes safetensors
        m.save_pretrained(a["ckpt"])
dev = a["device"]
try:   # transformers 5 names it dtype, 4 torch_dtype
    m = transformers.LlamaForCausalLM.from_pretrained(a["ckpt"], dtype=torch.float32, attn_implementation="sdpa")
except TypeError:
    m = transformers.LlamaForCausalLM.from_pretrained(a["ckpt"], torch_dtype=torch.float32,
                                                      attn_implementation="sdpa")
m.to(dev).eval()
idx = torch.tensor(a["idx"], dtype=torch.long, device=dev)
tgt = torch.tensor(a["tgt"], dtype=torch.long, device=dev)
with torch.no_grad():
    logits = m(input_ids=idx).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
print(json.dumps({"loss": loss.item(), "torch": torch.__version__, "transformers": transformers.__version__}))
'''


def stage_losses(ctx):
    # scratch outside $OUT (the checkpoint is ~0.6 GB), removed at the end
    work = tempfile.mkdtemp(prefix="lpx-acc-losses-")
    try:
        losses(ctx, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def losses(ctx, work):
    # (a) the first step from the same weights and tokens
    if ctx.smoke:
        m = dict(dim=64, layers=2, heads=4, kv_heads=2, ffn=96, vocab=128, batch=1, seq=16)
        ckpt, make = ctx.p("llama_tiny"), False   # the staged fixture (transformers wrote it)
    else:
        m = dict(dim=1024, layers=2, heads=8, kv_heads=4, ffn=3584, vocab=128256, batch=2, seq=1024)
        ckpt, make = os.path.join(work, "init"), True
    first = ctx.res.setdefault("first_step", {"shape": m})
    rng = splitmix(12345)
    tok = []
    for _ in range(16384):
        rng = splitmix(rng)
        tok.append(rng % m["vocab"])
    data = os.path.join(work, "tokens.bin")
    with open(data, "wb") as f:
        f.write(struct.pack("<%dI" % len(tok), *tok))
    idx, tgt = lpx_batch(tok, 1, 0, 0, m["batch"], m["seq"])
    ref_args = dict(m, make=make, ckpt=ckpt, device="cpu" if ctx.smoke else "cuda", idx=idx, tgt=tgt)
    argf = os.path.join(work, "ref-args.json")
    with open(argf, "w") as f:
        json.dump(ref_args, f)
    r = ctx.run("first-step-transformers", [ctx.python, "-c", REF_LOSS.replace("json.loads(sys.argv[1])",
                                                                               "json.load(open(sys.argv[1]))"), argf],
                ctx.limit(90, reserve=25))
    got = [json.loads(l) for l in r["out"].splitlines() if l.startswith("{")]
    if got:
        first["ref_loss"] = got[-1]["loss"]
    else:
        first["ref_error"] = why_failed(r)
    ctx.save()
    if os.path.isdir(ckpt):
        cmd = [ctx.p("lpx"), "train", "--device", "cpu" if ctx.smoke else "cuda", "--recipe", "bf16", "--ranks", "1",
               "--micro", "1", "--init", ckpt, "--data", data, "--data-dtype", "u32", "--batch", str(m["batch"]),
               "--seq", str(m["seq"]), "--steps", "1", "--log-every", "1", "--log-exact", "--eval", "1", "--sample",
               "0", "--seed", "1", "--out", os.path.join(work, "first-out")]
        r = ctx.run("first-step-lpx", cmd, ctx.limit(60, reserve=20), env=ctx.lpx_env())
        mm = re.search(r"step +1/1 +loss [0-9.]+ \[(\S+)\]", r["out"])
        if mm:
            first["lpx_loss"] = float.fromhex(mm.group(1))
        else:
            first["lpx_error"] = why_failed(r)
    else:
        first["lpx_error"] = "no --init checkpoint (%s)" % first.get("ref_error", "not made")
    if first.get("lpx_loss") is not None and first.get("ref_loss"):
        first["rel"] = abs(first["lpx_loss"] - first["ref_loss"]) / abs(first["ref_loss"])
    ctx.note("first step: lpx %s, transformers %s" % (first.get("lpx_loss", first.get("lpx_error")),
                                                       first.get("ref_loss", first.get("ref_error"))))
    ctx.save()
    # (b) float8-tensorwise vs bf16 after 50 steps (lpx train --compare: both in one process)
    if ctx.smoke:
        m2, steps = dict(SMOKE_MODEL), 3
    else:
        m2, steps = dict(dim=1024, layers=4, heads=8, kv_heads=4, ffn=2816, vocab=256, batch=8, seq=512), 50
    cmp_ = ctx.res.setdefault("fifty", {"shape": m2, "steps": steps})
    cmd = [ctx.p("lpx"), "train", "--device", "cpu" if ctx.smoke else "cuda", "--recipe", "float8-tensorwise",
           "--compare", "--ranks", "1", "--micro", "1", "--steps", str(steps), "--log-every", str(steps), "--eval", "1",
           "--sample", "0", "--data", ctx.p("corpus.txt"), "--out", os.path.join(work, "fifty-out")]
    for k, v in m2.items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    r = ctx.run("fifty-steps", cmd, ctx.limit(10 ** 6), env=ctx.lpx_env())
    for mm in re.finditer(r"^\s+(\S+)\s+step +%d/%d +loss ([0-9.]+)" % (steps, steps), r["out"], re.M):
        cmp_.setdefault("loss", {})[mm.group(1)] = float(mm.group(2))
    ls = cmp_.get("loss", {})
    tw = next((v for k, v in ls.items() if "tensorwise" in k), None)
    bf = next((v for k, v in ls.items() if k.startswith("bf16")), None)
    if tw is not None and bf:
        cmp_["rel"] = abs(tw - bf) / bf
    else:
        cmp_["error"] = why_failed(r) if r["rc"] else "no step %d line for both recipes" % steps
    ctx.note("step %d: %s" % (steps, ", ".join("%s %.4f" % kv for kv in ls.items()) or cmp_.get("error")))
    ctx.save()


# ---- stage: lpxtorch

def stage_lpxtorch(ctx):
    m = ctx.model()
    rows = ctx.res.setdefault("torch", {})
    modes = ["eager", "lpx-f8-tensorwise"]
    for i, mode in enumerate(modes):
        left = len(modes) - i - 1
        lim = ctx.limit(10 ** 6 if not left else max(25, ctx.left() / 2), reserve=20 * left)
        cmd = [ctx.python, os.path.join(HERE, "train_ref.py"), "--json", "--device", "cpu" if ctx.smoke else "cuda",
               "--modes", mode, "--steps", "2" if ctx.smoke else "5", "--warmup", "1" if ctx.smoke else "2"]
        for k, v in m.items():
            cmd += ["--" + k.replace("_", "-"), str(v)]
        r = ctx.run("train_ref-" + mode, cmd, lim, env=ctx.lpx_env())
        got = None
        for line in r["out"].splitlines():
            if line.startswith("{"):
                try:
                    got = json.loads(line)
                except ValueError:
                    pass
        if got is None:
            got = {"mode": mode, "skipped": "not run: no time left" if r.get("not_run") else why_failed(r, lim)}
        rows[mode] = got
        ctx.note("train_ref %s: %s" % (mode, "%.0f tok/s" % got["tokens_per_s"] if got.get("tokens_per_s")
                                       else got.get("skipped")))
        ctx.save()


STAGE_FNS = {"suite": stage_suite, "kernels": stage_kernels, "blockwise": stage_blockwise,
             "attention": stage_attention, "delayed": stage_delayed, "trainer": stage_trainer,
             "trainer-ref": stage_trainer_ref, "plan": stage_plan, "losses": stage_losses, "lpxtorch": stage_lpxtorch}


# ---------------------------------------------------------------- the table

def rec_ms(recs, case):
    r = (recs or {}).get(case) or {}
    return r.get("ms") if not r.get("error") else None


def rec_err(recs, *cases):
    for c in cases:
        r = (recs or {}).get(c) or {}
        if r.get("error"):
            return "%s: %s" % (c, r["error"])
    return "no result"


def row_suite_pass(R):
    s = R.get("suite", {})
    if "passed" not in s:
        return "missing: %s" % s.get("error", "no summary line from run-gpu.sh"), False
    bad = [k for k, v in s.get("programs", {}).items() if v in ("FAIL", "NOT RUN")]
    txt = "%d passed, %d failed, %d skipped (%d programs)" % (s["passed"], s["failed"], s["skipped"],
                                                             len(s.get("programs", {})))
    if bad:
        txt += "; failed: " + ", ".join(bad)
    return txt, s["failed"] == 0 and not bad and s["passed"] > 0


def row_suite_cudnn(R):
    s = R.get("suite", {})
    st = s.get("programs", {}).get("cuda_attention")
    if not st:
        return "missing: cuda_attention did not run", False
    path = s.get("attention_path") or "no path line"
    return "cuda_attention %s; %s" % (st, path[:120]), st == "PASS" and "fused SDPA" in path


def row_suite_block(R):
    s = R.get("suite", {})
    st = s.get("programs", {}).get("cuda_float8_block")
    if not st:
        return "missing: cuda_float8_block did not run", False
    if "block_used" not in s:
        return "cuda_float8_block %s; no path line" % st, False
    return ("cuda_float8_block %s; %d kinds on cuBLASLt (%s)" % (st, s["block_used"], s["block_path"][:80]),
            st == "PASS" and s["block_used"] > 0)


def row_suite_coverage(R):
    s = R.get("suite", {})
    st = s.get("programs", {}).get("cuda_coverage")
    if not st:
        return "missing: cuda_coverage did not run", False
    if "coverage" not in s:
        return "cuda_coverage %s; no coverage line" % st, False
    w, d = s["coverage"]
    return "cuda_coverage %s; %d of %d ops with a CUDA kernel dispatched" % (st, d, w), st == "PASS" and d == w


def trainer_tok(R, recipe):
    return ((R.get("trainer", {}).get("lpx") or {}).get(recipe) or {}).get("tok_s")


def trainer_why(R, recipe):
    r = (R.get("trainer", {}).get("lpx") or {}).get(recipe) or {}
    return r.get("skipped", "no result")


def ref_row(R, mode):
    return (R.get("trainer-ref", {}).get("torch") or {}).get(mode) or {}


def row_ratio(num, den, goal, what_num, what_den):
    v = ratio(num, den)
    if v is None:
        missing = what_num if not num else what_den
        return "missing: %s" % missing, False
    return "%.2fx (%.0f vs %.0f tok/s)" % (v, num, den), v >= goal


def row_bf16_tok(R):
    return row_ratio(trainer_tok(R, "bf16"), ref_row(R, "compile").get("tokens_per_s"), 0.95,
                     "lpx bf16 (%s)" % trainer_why(R, "bf16"),
                     "torch compile (%s)" % ref_row(R, "compile").get("skipped", "no result"))


def row_bf16_mem(R):
    lp = ((R.get("trainer", {}).get("lpx") or {}).get("bf16") or {}).get("peak_gib")
    tp = ref_row(R, "compile").get("peak_gib")
    if not lp or not tp:
        return "missing: %s" % ("lpx bf16 peak" if not lp else "torch compile peak"), False
    return "%.1f GiB vs %.1f GiB (%.2fx)" % (lp, tp, lp / tp), lp <= tp


def mk_vs_bf16(recipe, goal):
    def f(R):
        return row_ratio(trainer_tok(R, recipe), trainer_tok(R, "bf16"), goal,
                         "lpx %s (%s)" % (recipe, trainer_why(R, recipe)), "lpx bf16 (%s)" % trainer_why(R, "bf16"))
    return f


def row_tw_vs_torchao(R):
    t = ref_row(R, "f8-tensorwise")
    return row_ratio(trainer_tok(R, "float8-tensorwise"), t.get("tokens_per_s"), 1.0,
                     "lpx float8-tensorwise (%s)" % trainer_why(R, "float8-tensorwise"),
                     "torchao f8-tensorwise (%s)" % t.get("skipped", "no result"))


def row_nf4(R):
    tok = trainer_tok(R, "nf4-qlora")
    if not tok:
        return "missing: %s" % trainer_why(R, "nf4-qlora"), False
    return "%.0f tok/s (%.2fx lpx bf16)" % (tok, ratio(tok, trainer_tok(R, "bf16")) or 0), True


def row_first_loss(R):
    f = R.get("losses", {}).get("first_step", {})
    if "rel" not in f:
        return "missing: lpx %s; transformers %s" % (f.get("lpx_loss", f.get("lpx_error", "-")),
                                                     f.get("ref_loss", f.get("ref_error", "-"))), False
    return "rel %.2e (lpx %.6f, transformers %.6f)" % (f["rel"], f["lpx_loss"], f["ref_loss"]), f["rel"] <= 1e-3


def row_fifty(R):
    f = R.get("losses", {}).get("fifty", {})
    if "rel" not in f:
        return "missing: %s" % f.get("error", "no result"), False
    ls = f["loss"]
    return ("%.2f%% (%s)" % (100 * f["rel"], ", ".join("%s %.4f" % kv for kv in ls.items())), f["rel"] <= 0.01)


def row_attention(R):
    a = R.get("attention", {})
    lm, tm = rec_ms(a.get("lpx"), "attention_llama3"), rec_ms(a.get("torch"), "attention_llama3")
    if not lm or not tm:
        return "missing: %s" % (rec_err(a.get("lpx"), "attention_llama3") if not lm else
                                rec_err(a.get("torch"), "attention_llama3")), False
    path = ((a.get("lpx") or {}).get("attention_llama3") or {}).get("path", "")
    cudnn = re.search(r"on cuDNN: (\d+)", path)
    fwd = ratio(rec_ms(a.get("torch"), "attention_llama3_fwd"), rec_ms(a.get("lpx"), "attention_llama3_fwd"))
    on = bool(cudnn and int(cudnn.group(1)) > 0)
    v = tm / lm
    return ("%.2fx (lpx %.3f ms, SDPA %.3f ms; fwd %s; %s)" % (v, lm, tm, fmt_x(fwd), "cuDNN" if on else
                                                                "NOT cuDNN: " + path[:80]), v >= 0.8 and on)


def mk_lpx_ratio(stage, num, den, goal, path=False):
    def f(R):
        recs = R.get(stage, {}).get("lpx")
        a, b = rec_ms(recs, num), rec_ms(recs, den)
        if not a or not b:
            return "missing: %s" % rec_err(recs, num, den), False
        txt = "%.2fx (%.3f vs %.3f ms)" % (b / a, a, b)
        if path:
            p = (recs.get(num) or {}).get("path", "")
            mm = re.search(r"on cuBLASLt: (\d+)", p)
            txt += "; %s" % ("cuBLASLt" if mm and int(mm.group(1)) > 0 else "reference kernel")
        return txt, b / a >= goal
    return f


def mk_pct_copy(case, goal=0.85):
    def f(R):
        recs = R.get("kernels", {}).get("lpx") or {}
        c, r = (recs.get("copy") or {}).get("gbps"), (recs.get(case) or {}).get("gbps")
        if not c or not r:
            return "missing: %s" % rec_err(recs, "copy", case), False
        return "%.1f%% of copy (%.0f of %.0f GB/s)" % (100 * r / c, r, c), r / c >= goal
    return f


def row_lpxtorch(R):
    t = R.get("lpxtorch", {}).get("torch") or {}
    e, f = t.get("eager") or {}, t.get("lpx-f8-tensorwise") or {}
    return row_ratio(f.get("tokens_per_s"), e.get("tokens_per_s"), 1.3,
                     "lpx-f8-tensorwise (%s)" % f.get("skipped", "no result"),
                     "eager (%s)" % e.get("skipped", "no result"))


def row_lpxtorch_tests(R):
    s = R.get("suite", {})
    st = s.get("programs", {}).get("python_torch")
    if not st:
        return "missing: python_torch did not run", False
    cases = s.get("torch_cuda_cases", {})
    n = {k: sum(1 for v in cases.values() if v == k) for k in ("pass", "FAIL", "skip")}
    return ("python_torch %s; CUDA cases %d passed, %d failed, %d skipped" % (st, n["pass"], n["FAIL"], n["skip"]),
            st == "PASS" and n["FAIL"] == 0 and n["skip"] == 0 and n["pass"] > 0)


def mk_plan(recipe):
    def f(R):
        p = R.get("plan", {})
        pr, me = (p.get("predicted_ms") or {}).get(recipe), (p.get("measured_ms") or {}).get(recipe)
        if not pr:
            return "missing: prediction (%s)" % p.get("error", "no result"), False
        if not me:
            return "missing: measured %s step (%s)" % (recipe, p.get("trainer_missing", "trainer stage")), False
        d = (pr - me) / me
        return "%+.1f%% (predicted %.1f ms, measured %.1f ms)" % (100 * d, pr, me), abs(d) <= 0.10
    return f


def row_delayed(R):
    d = R.get("delayed", {})
    if "moved" not in d:
        return "missing: %s" % d.get("error", "no result"), False
    txt = "scale moved %d times in %d steps; GPU history == CPU bit for bit: %s; update on the device: %s" % (
        d["moved"], d["steps"], "yes" if d["equal"] else "NO",
        "yes" if DELAYED_UPDATE_ON_DEVICE else "no (the stats are read back to the host per cast)")
    return txt, d["moved"] >= 5 and d["equal"] and DELAYED_UPDATE_ON_DEVICE and d.get("rc") == 0


# id, stage, target, goal, function(results) -> (measured, met)
ROWS = [
    ("suite.pass", "suite", "GPU suite: every program passes", "0 failed, every program PASS", row_suite_pass),
    ("suite.cudnn", "suite", "GPU suite: cuDNN fused SDPA taken (counter)", "cuda_attention PASS, path cuDNN",
     row_suite_cudnn),
    ("suite.cublaslt_block", "suite", "GPU suite: cuBLASLt block-scaled GEMM taken (counter)",
     "cuda_float8_block PASS, > 0 kinds on cuBLASLt", row_suite_block),
    ("suite.own_kernels", "suite", "GPU suite: lpx-cuda's own kernels dispatched (coverage)",
     "every op with a CUDA kernel", row_suite_coverage),
    ("trainer.bf16_tokens", "trainer", "lpx train bf16 tok/s vs transformers + per-block compile",
     ">= 0.95x", row_bf16_tok),
    ("trainer.bf16_memory", "trainer", "lpx train bf16 peak GPU memory vs PyTorch (compile)", "<= 1.0x",
     row_bf16_mem),
    ("trainer.f8_tensorwise_vs_bf16", "trainer", "float8-tensorwise tok/s vs lpx bf16", ">= 1.25x",
     mk_vs_bf16("float8-tensorwise", 1.25)),
    ("trainer.f8_tensorwise_vs_torchao", "trainer", "float8-tensorwise tok/s vs torchao float8 + compile",
     ">= 1.0x", row_tw_vs_torchao),
    ("trainer.f8_rowwise_vs_bf16", "trainer", "float8-rowwise tok/s vs lpx bf16", ">= 1.10x",
     mk_vs_bf16("float8-rowwise", 1.10)),
    ("trainer.f8_blockwise_vs_bf16", "trainer", "float8-blockwise tok/s vs lpx bf16", ">= 1.15x",
     mk_vs_bf16("float8-blockwise", 1.15)),
    ("trainer.nf4_qlora_runs", "trainer", "nf4-qlora runs (tok/s reported)", "runs", row_nf4),
    ("losses.first_step", "losses", "first-step loss lpx bf16 vs transformers (same --init, same ids)",
     "<= 1e-3 relative", row_first_loss),
    ("losses.f8_50_steps", "losses", "float8-tensorwise vs lpx bf16 loss after 50 steps", "<= 1%", row_fifty),
    ("attention.fwd_bwd_vs_sdpa", "attention", "cuDNN attention fwd+bwd vs SDPA flash (32/8 heads, hd 128, "
     "T 4096, causal)", ">= 0.8x", row_attention),
    ("blockwise.gemm_8192", "blockwise", "fp8 block-scaled GEMM 8192^3 vs bf16 GEMM", ">= 1.5x",
     mk_lpx_ratio("blockwise", "gemm_fp8_blockwise", "gemm_bf16", 1.5, path=True)),
    ("blockwise.linear_4096x14336", "blockwise", "Float8Linear blockwise fwd+bwd vs bf16, 4096 x 14336",
     ">= 1.25x", mk_lpx_ratio("blockwise", "float8_linear_blockwise_4096x14336",
                              "float8_linear_bf16_4096x14336", 1.25, path=True)),
    ("lpxtorch.f8_vs_bf16", "lpxtorch", "lpx.torch eager float8 (convert_to_float8_training + fused ops) "
     "vs eager bf16, train_ref.py", ">= 1.3x", row_lpxtorch),
    ("lpxtorch.cuda_tests", "suite", "lpx.torch CUDA tests (python_torch)", "all pass", row_lpxtorch_tests),
    ("plan.bf16", "plan", "lpx plan vs measured one-GPU step, bf16", "within 10%", mk_plan("bf16")),
    ("plan.f8_tensorwise", "plan", "lpx plan vs measured one-GPU step, float8-tensorwise", "within 10%",
     mk_plan("float8-tensorwise")),
    ("plan.f8_rowwise", "plan", "lpx plan vs measured one-GPU step, float8-rowwise", "within 10%",
     mk_plan("float8-rowwise")),
    ("kernels.rowwise_quantize", "kernels", "rowwise quantize [16384, 16384] vs copy", ">= 85%",
     mk_pct_copy("fp8_quant_rowwise")),
    ("kernels.nf4_dequantize", "kernels", "NF4 dequantize [8192, 8192] vs copy", ">= 85%",
     mk_pct_copy("nf4_dequant")),
    ("kernels.adamw_state_8bit", "kernels", "adamw_state_ 8-bit states, bf16-SR [4096, 14336]: bytes moved vs copy",
     ">= 80%", mk_pct_copy("adamw_state_8bit", 0.80)),
    ("kernels.adamw_state_4bit", "kernels", "adamw_state_ 4-bit states, bf16-SR [4096, 14336]: bytes moved vs copy",
     ">= 80%", mk_pct_copy("adamw_state_4bit", 0.80)),
    ("kernels.adamw_state_fp8", "kernels", "adamw_state_ fp8 states, bf16-SR [4096, 14336]: bytes moved vs copy",
     ">= 80%", mk_pct_copy("adamw_state_fp8", 0.80)),
    ("delayed.on_device", "delayed", "delayed scaling on the GPU: scale moves, history == CPU, on the device",
     "moves, bit-equal, no host round trip", row_delayed),
]
# rows whose measurement comes from another stage's results too
ROW_NEEDS = {"trainer.bf16_tokens": ["trainer", "trainer-ref"], "trainer.bf16_memory": ["trainer", "trainer-ref"],
             "trainer.f8_tensorwise_vs_torchao": ["trainer", "trainer-ref"], "plan.bf16": ["plan", "trainer"],
             "plan.f8_tensorwise": ["plan", "trainer"], "plan.f8_rowwise": ["plan", "trainer"]}


def build_rows(results, status, gpu):
    """One row per target. Without a GPU: "not measured (no GPU)". A row
    whose numbers are there is judged even if its stage was cut short
    later (the stage saves as it goes); a row without them names the
    stage that did not run, timed out or crashed, or (its stage ran) is a
    failure: met NO."""
    rows = []
    for rid, stage, target, goal, fn in ROWS:
        needs = ROW_NEEDS.get(rid, [stage])
        not_ok = [(s, status.get(s) or {}) for s in needs if (status.get(s) or {}).get("state") != "ran"]
        try:
            detail, met = fn(results)
        except Exception as e:  # noqa: BLE001 (a row's code must not lose the table)
            detail, met = "row error: %s: %s" % (type(e).__name__, e), False
        have = not detail.startswith(("missing", "row error"))
        if not gpu:
            measured, met_s = "not measured (no GPU)", "-"
        elif have:
            measured, met_s = detail, "yes" if met else "NO"
        elif not_ok:
            s, st = not_ok[0]
            measured, met_s = "not measured: stage %s %s" % (s, st.get("why", "not run")), "-"
        else:
            measured, met_s = detail, "NO"
        rows.append({"id": rid, "stage": stage, "target": target, "measured": measured, "goal": goal, "met": met_s,
                     "detail": detail})
    return rows


def print_table(rows):
    hdr = ["target", "measured", "goal", "met"]
    # long messages cut at 150 characters here; the JSON keeps them whole
    cut = lambda v: v if len(v) <= 150 else v[:147] + "..."  # noqa: E731
    cells = [[r["target"], cut(r["measured"]), r["goal"], r["met"]] for r in rows]
    w = [min(max(len(str(x)) for x in col), 90) for col in zip(hdr, *cells)]
    fmt = " | ".join("{:<%d}" % x for x in w)
    print(fmt.format(*hdr))
    print("-+-".join("-" * x for x in w))
    for c in cells:
        print(fmt.format(*c))


# ---------------------------------------------------------------- the orchestrator

PROBE = r'''
import json
v = {}
for m in ("torch", "transformers", "torchao"):
    try:
        mod = __import__(m)
        v[m] = getattr(mod, "__version__", "?")
    except Exception as e:
        v[m] = None
        v[m + "_error"] = "%s: %s" % (type(e).__name__, str(e)[:200])
try:
    import torch
    v["torch_cuda"] = torch.version.cuda
    v["cuda_available"] = torch.cuda.is_available()
    if v["cuda_available"]:
        v["gpu"] = torch.cuda.get_device_name(0)
except Exception:
    pass
print(json.dumps(v))
'''


def probe_python(python, acc):
    r = run_cmd([python, "-c", PROBE], 90, os.path.join(acc, "logs", "probe-python.log"))
    for line in r["out"].splitlines():
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return {"error": why_failed(r)}


def torchao_from_wheel(stage, python, acc):
    """torchao from the staged wheel (the GPU machine has no network):
    unpacked into STAGE/site (a wheel is a zip; pure Python for float8)
    and put on PYTHONPATH for every stage."""
    wheels = sorted(f for f in os.listdir(os.path.join(stage, "wheels")) if f.startswith("torchao")) \
        if os.path.isdir(os.path.join(stage, "wheels")) else []
    if not wheels:
        return "no torchao wheel in the stage"
    site = os.path.join(stage, "site")
    if not os.path.isdir(os.path.join(site, "torchao")):
        with zipfile.ZipFile(os.path.join(stage, "wheels", wheels[-1])) as z:
            z.extractall(site)
    os.environ["PYTHONPATH"] = site + (":" + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    return "torchao from %s (unpacked into %s)" % (wheels[-1], site)


def header(stage, python, acc, gpu):
    h = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "host": os.uname().nodename}
    try:
        with open(os.path.join(stage, "lpx-commit.txt")) as f:
            h["lpx"] = f.read().strip()
    except OSError:
        h["lpx"] = "unknown (no lpx-commit.txt in the stage)"
    if gpu:
        r = run_cmd(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], 30,
                    os.path.join(acc, "logs", "nvidia-smi.log"))
        line = [l for l in r["out"].splitlines() if l and not l.startswith("$ ")]
        h["chip"] = "unknown (nvidia-smi: %s)" % why_failed(r)
        if r["rc"] == 0 and line:
            parts = [p.strip() for p in line[0].split(",")]
            h["chip"], h["driver"] = parts[0], parts[1] if len(parts) > 1 else "?"
            h["memory"] = parts[2] if len(parts) > 2 else "?"
        r = run_cmd(["nvidia-smi"], 30, os.path.join(acc, "logs", "nvidia-smi-full.log"))
        m = re.search(r"CUDA Version: *([0-9.]+)", r["out"])
        h["cuda_driver_api"] = m.group(1) if m else "?"
    else:
        h["chip"] = "no GPU (smoke run: nothing is measured)"
    v = probe_python(python, acc)
    if gpu and not v.get("torchao") and v.get("torch"):
        h["torchao_source"] = torchao_from_wheel(stage, python, acc)
        v2 = probe_python(python, acc)
        v["torchao"], v["torchao_error"] = v2.get("torchao"), v2.get("torchao_error")
    h["python"] = python
    h.update({k: v.get(k) for k in ("torch", "torch_cuda", "transformers", "torchao")})
    for k in ("torch_error", "torchao_error", "transformers_error"):
        if v.get(k):
            h[k] = v[k]
    return h


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stages", nargs="*", help="stages to run (default: all): " + ", ".join(STAGE_NAMES))
    ap.add_argument("--stage", dest="stage_dir", default=os.path.dirname(HERE),
                    help="the gpu-stage folder (default: the folder above this script)")
    ap.add_argument("--budget", type=int, default=int(os.environ.get("ACC_BUDGET", "540")),
                    help="seconds the whole run may take (default $ACC_BUDGET or 540)")
    ap.add_argument("--smoke", action="store_true", help="the CPU smoke run even on a GPU machine")
    ap.add_argument("--list", action="store_true", help="the stages and their limits, then the targets")
    ap.add_argument("--stage-run", help=argparse.SUPPRESS)
    ap.add_argument("--ctx", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.stage_run:   # a stage's own process
        with open(a.ctx) as f:
            ctx = Ctx(json.load(f))
        if not ctx.gpu:
            ctx.note("no GPU: the smoke version of this stage (small shapes, the CPU); nothing it prints is a "
                     "measurement")
        STAGE_FNS[a.stage_run](ctx)
        return 0
    if a.list:
        for name, lim, mn, what in STAGES:
            print("%-12s %4d s (min %3d s)  %s" % (name, lim, mn, what))
        print()
        for rid, stage, target, goal, _ in ROWS:
            print("%-34s %-12s %s: %s" % (rid, stage, target, goal))
        return 0
    bad = [s for s in a.stages if s not in STAGE_NAMES]
    if bad:
        ap.error("unknown stage(s) %s; stages: %s" % (", ".join(bad), ", ".join(STAGE_NAMES)))
    start = now()
    stage_dir = os.path.abspath(a.stage_dir)
    if not os.path.exists(os.path.join(stage_dir, "lpx")):
        ap.error("%s is not a gpu-stage folder (no lpx): make gpu-acceptance" % stage_dir)
    gpu = gpu_present() and not a.smoke
    base = os.environ.get("OUT") or os.path.join(stage_dir, "acceptance-out")
    acc = os.path.join(base, "acceptance")
    os.makedirs(os.path.join(acc, "logs"), exist_ok=True)
    os.makedirs(os.path.join(acc, "stages"), exist_ok=True)
    python = os.environ.get("PYTHON", sys.executable)
    selected = [s for s in STAGE_NAMES if not a.stages or s in a.stages]
    deadline = start + a.budget - 5   # 5 s for the table
    print("== lpx GPU acceptance run (issue 32): %s" % ("stages " + " ".join(selected) if a.stages else "all stages"))
    h = header(stage_dir, python, acc, gpu)
    h.update(budget_s=a.budget, smoke=not gpu, stages=selected)
    for k in ("date", "host", "chip", "driver", "memory", "cuda_driver_api", "torch", "torch_cuda", "transformers",
              "torchao", "torchao_source", "lpx", "python"):
        if h.get(k) is not None:
            print("   %-16s %s" % (k, h[k]))
    if not gpu:
        print("   no GPU: every stage runs its smoke version and says so; the table reads \"not measured\"")
    status = {s: {"state": "not selected", "why": "not run (not selected in this call)"} for s in STAGE_NAMES}
    results = {}
    info = {s[0]: s for s in STAGES}
    for i, s in enumerate(selected):
        _, default, _, what = info[s]
        reserve = sum(info[t][2] for t in selected[i + 1:])
        lim = int(min(default, deadline - now() - reserve))
        print("\n== stage %s (limit %d s): %s" % (s, max(lim, 0), what), flush=True)
        if lim < info[s][2] // 2 or lim < 3:
            status[s] = {"state": "skipped", "why": "not run: no time left in the budget (rerun: run-gpu.sh "
                                                    "acceptance %s)" % s, "limit_s": max(lim, 0)}
            print("   not run: no time left in the budget", flush=True)
            continue
        ctxf = os.path.join(acc, "stages", s + ".ctx.json")
        with open(ctxf, "w") as f:
            json.dump({"stage_dir": stage_dir, "name": s, "smoke": not gpu, "gpu": gpu, "end": now() + lim - 2,
                       "acc_dir": acc, "python": python}, f)
        r = run_cmd([sys.executable, os.path.abspath(__file__), "--stage-run", s, "--ctx", ctxf], lim,
                    os.path.join(acc, "logs", s + ".log"))
        for line in r["out"].splitlines():
            if line.startswith("  ["):
                print(line, flush=True)
        try:
            with open(os.path.join(acc, "stages", s + ".json")) as f:
                results[s] = json.load(f)
        except (OSError, ValueError):
            results[s] = {}
        if r["timed_out"]:
            status[s] = {"state": "timed out", "why": "timed out after %d s" % lim}
        elif r["rc"] != 0:
            status[s] = {"state": "crashed", "why": "crashed (%s)" % why_failed(r)}
        else:
            status[s] = {"state": "ran"}
        status[s].update(limit_s=lim, secs=r["secs"])
        print("   (%s in %.1f s%s)" % (s, r["secs"], ", " + status[s]["why"] if status[s].get("why") else ""),
              flush=True)
    rows = build_rows(results, status, gpu)
    print("\n== acceptance table (%s; %.0f s of %d s)" % (h.get("chip") or "chip unknown", now() - start, a.budget))
    print_table(rows)
    met = sum(r["met"] == "yes" for r in rows)
    missed = sum(r["met"] == "NO" for r in rows)
    print("acceptance: %d targets, %d met, %d NOT met, %d not measured" % (len(rows), met, missed,
                                                                         len(rows) - met - missed))
    rerun = [s for s in selected if status[s]["state"] != "ran"]
    if rerun:
        print("rerun: bash run-gpu.sh acceptance %s" % " ".join(rerun))
    out = {"header": h, "rows": rows, "stages": status, "results": results, "seconds": round(now() - start, 1)}
    path = os.path.join(acc, "acceptance.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("(JSON: %s; logs: %s)" % (path, os.path.join(acc, "logs")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

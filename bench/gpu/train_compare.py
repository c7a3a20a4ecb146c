#!/usr/bin/env python3
"""lpx train on the GPU beside the PyTorch reference, one call (`make
bench-train-gpu`, or staged: `python3 bench/train_compare.py --stage .` in
gpu-stage/). Same model and shapes for both (default: Llama-3-8B shapes
with 8 layers, vocab 128256, batch 2 x seq 4096, one GPU):

  lpx train --device cuda --recipe R ...   for R in --recipes (bf16 activations,
                                           device-resident shards, fused AdamW)
  bench/gpu/train_ref.py --modes ...       transformers LlamaForCausalLM: eager,
                                           per-block compile, torchao float8

Prints tokens/s, ms per step, MFU and peak memory per row, the ratios the GPU
trainer issue asks for, and with --json one JSON object per row. lpx's
tokens/s is the mean over its steps after the first (the summary's step
line), the reference's over its timed steps after warm-up. Smoke test on the
CPU (no GPU numbers; transformers on PYTHONPATH):
    python3 bench/gpu/train_compare.py --device cpu --lpx build/tools/lpx/lpx \
        --plugin-path build/plugins/mx --dim 64 --layers 2 --heads 4 --kv-heads 2 \
        --ffn 128 --vocab 256 --batch 1 --seq 32 --steps 3 --ref-steps 2 --ref-modes eager
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import train_ref   # beside this file (bench/gpu/, or gpu-stage/bench/)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stage", help="a gpu-stage folder (lpx, the plugins, corpus.txt, bench/train_ref.py)")
    p.add_argument("--lpx", help="the lpx executable (default: build-gpu/tools/lpx/lpx or STAGE/lpx)")
    p.add_argument("--plugin-path", help="LPX_PLUGIN_PATH for lpx (default: the build's plugin folders or STAGE)")
    p.add_argument("--corpus", help="training text (default data/corpus.txt or STAGE/corpus.txt)")
    train_ref.add_model_args(p)   # the reference's shapes, the same defaults
    p.add_argument("--steps", type=int, default=8, help="lpx steps (the first is not timed)")
    p.add_argument("--recipes", default="bf16,float8-tensorwise,float8-rowwise")
    p.add_argument("--ref-modes", default="eager,compile,f8-tensorwise,f8-rowwise")
    p.add_argument("--ref-steps", type=int, default=6)
    p.add_argument("--timeout", type=int, default=240, help="seconds per lpx run and for the reference")
    p.add_argument("--extra", default="", help="more lpx train options, e.g. '--ac full'")
    p.add_argument("--device", default="cuda", help="cpu: a smoke test of this script with small shapes")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def paths(a):
    if a.stage:
        s = os.path.abspath(a.stage)
        return (a.lpx or os.path.join(s, "lpx"), a.plugin_path or s, a.corpus or os.path.join(s, "corpus.txt"),
                os.path.join(s, "bench", "train_ref.py"))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    b = os.path.join(root, "build-gpu")
    plugins = ":".join(os.path.join(b, d) for d in ("backends/cuda", "backends/nccl", "plugins/mx", "plugins/mx/cuda"))
    return (a.lpx or os.path.join(b, "tools", "lpx", "lpx"), a.plugin_path or plugins,
            a.corpus or os.path.join(root, "data", "corpus.txt"), os.path.join(root, "bench", "gpu", "train_ref.py"))


def lpx_cmd(a, exe, corpus, recipe, out):
    """The lpx train command of one row (acceptance.py runs it too)."""
    return [exe, "train", "--device", a.device, "--recipe", recipe, "--ranks", "1", "--micro", "1",
            "--dim", str(a.dim), "--layers", str(a.layers), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
            "--ffn", str(a.ffn), "--vocab", str(a.vocab), "--rope-theta", "500000", "--seq", str(a.seq),
            "--batch", str(a.batch), "--steps", str(a.steps), "--log-every", "1", "--eval", "1", "--sample", "0",
            "--data", corpus, "--out", out] + a.extra.split()


def parse_lpx(a, recipe, text, returncode):
    """The row of one lpx train run from its output: ms per step (the
    summary's mean over the steps after the first), tokens/s, MFU, peak GPU
    memory, the last step's loss; "skipped" with the reason when the run
    failed or printed no step line."""
    if returncode != 0:
        tail = " | ".join(text.strip().splitlines()[-3:])
        return {"mode": "lpx " + recipe, "skipped": "exit %d: %s" % (returncode, tail)}
    r = {"mode": "lpx " + recipe}
    m = re.search(r"step ([0-9.]+) ms = compute ([0-9.]+) \+ collectives ([0-9.]+) \+ optimizer ([0-9.]+)", text)
    if m:
        r["ms_step"] = float(m.group(1))
        r["tok_s"] = a.batch * a.seq / (r["ms_step"] / 1e3)
        r["compute_ms"], r["comm_ms"], r["optim_ms"] = (float(m.group(i)) for i in (2, 3, 4))
    m = re.search(r"MFU ([0-9.]+)%", text)
    if m:
        r["mfu"] = float(m.group(1))
    m = re.search(r"peak GPU memory[^:]*: ([0-9.]+) GiB", text)
    if m:
        r["peak_gib"] = float(m.group(1))
    losses = re.findall(r"step +\d+/\d+ +loss ([0-9.]+)", text)
    if losses:
        r["loss"] = float(losses[-1])
    if "ms_step" not in r:
        r["skipped"] = "no step line in the output: " + " | ".join(text.strip().splitlines()[-3:])
    return r


def run_lpx(a, exe, plugin_path, corpus, recipe):
    out = tempfile.mkdtemp(prefix="lpx-train-compare-")
    cmd = lpx_cmd(a, exe, corpus, recipe, out)
    env = dict(os.environ, LPX_PLUGIN_PATH=plugin_path)
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return {"mode": "lpx " + recipe, "skipped": "timed out after %d s" % a.timeout}
    r = parse_lpx(a, recipe, p.stdout + p.stderr, p.returncode)
    if "skipped" not in r or "no step line" in r["skipped"]:
        r["wall_s"] = round(time.time() - t0, 1)
    return r


def run_ref(a, script):
    cmd = [sys.executable, script, "--json", "--device", a.device, "--modes", a.ref_modes, "--steps", str(a.ref_steps),
           "--dim", str(a.dim), "--layers", str(a.layers), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
           "--ffn", str(a.ffn), "--vocab", str(a.vocab), "--batch", str(a.batch), "--seq", str(a.seq)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout * 2)
    except subprocess.TimeoutExpired:
        return [{"mode": "torch (all)", "skipped": "timed out"}]
    rows = []
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            d["mode"] = "torch " + d["mode"]
            if "ms_per_step" in d:
                d["ms_step"] = d["ms_per_step"]
            if "tokens_per_s" in d:
                d["tok_s"] = d["tokens_per_s"]
            rows.append(d)
    if not rows:
        rows.append({"mode": "torch (all)", "skipped": "exit %d: %s" % (p.returncode, p.stderr.strip()[-300:])})
    return rows


def main():
    a = parse()
    exe, plugin_path, corpus, script = paths(a)
    rows = [run_lpx(a, exe, plugin_path, corpus, r) for r in a.recipes.split(",") if r]
    rows += run_ref(a, script)
    print("lpx train vs PyTorch: dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, batch %d x seq %d, one GPU" %
          (a.dim, a.layers, a.heads, a.kv_heads, a.ffn, a.vocab, a.batch, a.seq))
    tok = {r["mode"]: r.get("tok_s") for r in rows if r.get("tok_s")}
    for r in rows:
        if a.json:
            print(json.dumps(dict(r, bench="train_compare")))
        if "skipped" in r:
            print("  %-24s skipped: %s" % (r["mode"], r["skipped"]))
            continue
        extra = ""
        if "mfu" in r:
            extra += "  MFU %.1f%%" % r["mfu"]
        if "compute_ms" in r:
            extra += "  (compute %.1f, collectives %.1f, optimizer %.1f ms)" % (r["compute_ms"], r["comm_ms"],
                                                                               r["optim_ms"])
        peak = r.get("peak_gib")
        print("  %-24s %9.0f tok/s %8.1f ms/step  peak %s%s" % (r["mode"], r.get("tok_s", 0), r.get("ms_step", 0),
                                                              "%.1f GiB" % peak if peak else "-", extra))

    def ratio(x, y):
        return tok[x] / tok[y] if tok.get(x) and tok.get(y) else None

    checks = [("lpx bf16 / torch compile (>= 0.95)", ratio("lpx bf16", "torch compile"), 0.95),
              ("lpx bf16 / torch eager (> 1)", ratio("lpx bf16", "torch eager"), 1.0),
              ("lpx float8-tensorwise / lpx bf16 (>= 1.25)", ratio("lpx float8-tensorwise", "lpx bf16"), 1.25),
              ("lpx float8-rowwise / lpx bf16 (>= 1.1)", ratio("lpx float8-rowwise", "lpx bf16"), 1.1)]
    best_torch = max((v for k, v in tok.items() if k.startswith("torch ")), default=None)
    if tok.get("lpx float8-tensorwise") and best_torch:
        checks.append(("lpx float8-tensorwise / best PyTorch row (> 1)", tok["lpx float8-tensorwise"] / best_torch,
                       1.0))
    print("targets (issue: the GPU trainer):")
    for name, v, goal in checks:
        print("  %-48s %s" % (name, "-" if v is None else "%.2fx  %s" % (v, "met" if v >= goal else "NOT met")))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The PyTorch reference for `lpx train --device cuda` (docs/GPU.md): the same
Llama 3 model in transformers (LlamaForCausalLM, SDPA attention, fused AdamW,
bf16 weights and activations), timed the ways a PyTorch user would train it:

  eager           bf16, no compilation
  compile         bf16, each decoder block torch.compile'd (torchtitan's way)
  f8-tensorwise   torchao Float8Linear "tensorwise" + per-block compile
  f8-rowwise      torchao Float8Linear "rowwise" + per-block compile
                  (the LM head stays bf16, as in torchao's recipes; the two
                  float8 rows are skipped with a message without torchao)
  lpx-f8-tensorwise  lpx.torch Float8Linear "tensorwise", EAGER (no compile),
  lpx-f8-rowwise     and lpx.torch's fused RMSNorm and SwiGLU (convert_to_fused_ops):
                  lpx's kernels called from PyTorch (python/lpx/torch.py;
                  the python package on sys.path, liblpx and lpx-cuda.so found
                  through LPX_LIBRARY / LPX_PLUGIN_PATH or a wheel); the LM
                  head stays bf16 as above
  lpx-f8-tensorwise-linears  the fp8 linears alone (no fused ops)
  lpx-fused       bf16 linears, lpx's fused RMSNorm and SwiGLU alone

Prints one line per mode (tokens/s, ms per step, peak memory) and, with
--json, one JSON object per mode, so bench scripts can put lpx's numbers
beside them from the same call. Defaults: Llama-3-8B shapes with 8 layers,
vocab 128256, batch 2 x seq 4096 (the GPU trainer issue's comparison).
Runs on the CPU with small shapes for a smoke test:
    python3 bench/gpu/train_ref.py --device cpu --dim 64 --layers 2 --heads 4 \\
        --kv-heads 2 --ffn 128 --vocab 256 --batch 1 --seq 32 --steps 2 --modes eager
"""
import argparse
import json
import sys
import time


def add_model_args(p):
    """The model and batch shape options (Llama-3-8B shapes, 8 layers, batch
    2 x 4096 by default); train_compare.py takes the same ones."""
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=4096)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p)
    p.add_argument("--steps", type=int, default=10, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (compilation happens here)")
    p.add_argument("--modes", default="eager,compile,f8-tensorwise,f8-rowwise")
    p.add_argument("--device", default="cuda")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed steps, profile N more (torch.profiler) and print where the device "
                        "time goes: GEMMs, attention, fp8 casts, the rest, and the top kernels")
    return p.parse_args()


def build(a, torch, transformers):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}
    kw = dict(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn, num_hidden_layers=a.layers,
              num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, rms_norm_eps=1e-5,
              max_position_embeddings=max(a.seq, 131072), tie_word_embeddings=False)
    if int(transformers.__version__.split(".")[0]) >= 5:
        cfg = transformers.LlamaConfig(rope_parameters=dict(rope, rope_theta=500000.0), **kw)
    else:
        cfg = transformers.LlamaConfig(rope_theta=500000.0, rope_scaling=rope, **kw)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(a.device):
        model = transformers.LlamaForCausalLM(cfg)
    return model.to(dtype=torch.bfloat16)


def float8(model, recipe):
    """torchao's Float8Linear on every linear but the LM head, or None."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError:
        return None
    cfg = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn != "lm_head")
    return model


def lpx_convert(model, mode, device):
    """A mode's lpx.torch conversion of model (Float8Linear on every linear
    but the LM head; fused RMSNorm and SwiGLU), or the reason it cannot
    run."""
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "..", "python"), os.path.join(here, "..", "..", "python")):  # a stage, the repo
        if os.path.isdir(os.path.join(d, "lpx")):
            sys.path.insert(0, d)
            break
    try:
        import lpx
        import lpx.torch as lt
        if device.startswith("cuda"):
            lpx.cuda_stream(0)   # lpx-cuda.so must be loaded (a wheel loads it; else LPX_PLUGIN_PATH)
    except Exception as e:  # noqa: BLE001 (ImportError, LpxLoadError)
        return str(e)
    rest = mode[len("lpx-"):]
    if rest.startswith("f8-"):
        recipe = rest[len("f8-"):].removesuffix("-linears")
        lt.convert_to_float8_training(model, recipe=recipe, module_filter_fn=lambda m, fqn: fqn != "lm_head")
    if not rest.endswith("-linears"):
        lt.convert_to_fused_ops(model)
        norms = sum(isinstance(m, lt.RMSNorm) for m in model.modules())
        mlps = sum(isinstance(m, lt.SwiGLUMLP) for m in model.modules())
        if norms != 2 * len(model.model.layers) + 1 or mlps != len(model.model.layers):
            return f"convert_to_fused_ops replaced {norms} norms and {mlps} MLPs of this transformers' model"
    return None


def run_mode(a, mode, torch, transformers):
    model = build(a, torch, transformers)
    if mode.startswith("f8-"):
        if float8(model, mode[3:]) is None:
            return {"mode": mode, "skipped": "torchao is not installed"}
    if mode.startswith("lpx-"):
        why = lpx_convert(model, mode, a.device)
        if why:
            return {"mode": mode, "skipped": why}
    if mode != "eager" and not mode.startswith("lpx-"):
        # each block is one more compilation (transformers keeps layer_idx as
        # a static int), and dynamo's cache outlives the model: without a
        # reset and a limit above the block count, a second compiled mode in
        # this process (or a model past 8 blocks) silently runs eagerly
        # ("hit config.recompile_limit (8)"; measured on an H200: torchao
        # rowwise at 420 ms/step, as the eager run)
        torch._dynamo.reset()
        limit = 2 * len(model.model.layers) + 8
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), limit))
        for layer in model.model.layers:
            layer.compile()
    fused = a.device.startswith("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=gen).to(a.device)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    if a.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for _ in range(a.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    dt = (time.perf_counter() - t0) / a.steps
    peak = torch.cuda.max_memory_allocated() / 2**30 if a.device.startswith("cuda") else None   # null in JSON
    if a.profile > 0:
        profile(a, mode, step, sync, torch)
    del model, opt
    if a.device.startswith("cuda"):
        torch.cuda.empty_cache()
    return {"mode": mode, "tokens_per_s": a.batch * a.seq / dt, "ms_per_step": dt * 1e3, "peak_gib": peak,
            "loss": loss.item()}


# kernel-name fragments -> category, first match wins (cuBLAS/cuBLASLt GEMMs,
# flash/cuDNN/efficient attention, lpx's fp8 casts, torch's elementwise and
# reductions; the rest is "other")
_CATEGORIES = (("gemm", ("gemm", "sm90_xmma", "cutlass", "nvjet", "cublas")),
               ("attention", ("flash", "fmha", "attention", "cudnn")),
               ("fp8 cast", ("quant", "fp8", "k_rows", "k_amax", "k_cast", "transpose")),
               ("optimizer", ("adam", "multi_tensor")),
               ("elementwise/reduce", ("elementwise", "vectorized", "reduce", "softmax", "rms", "swiglu",
                                       "k_bin", "k_un", "cat", "copy", "index", "nll", "embedding")))


def profile(a, mode, step, sync, torch):
    """Device time per category and the top kernels over a.profile steps."""
    from torch.profiler import ProfilerActivity, profile as prof
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device.startswith("cuda") else [])
    with prof(activities=acts) as p:
        for _ in range(a.profile):
            step()
        sync()
    rows = {}
    for e in p.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        # kernels only: a user annotation (Optimizer.step#AdamW.step) spans
        # its kernels' time again
        if getattr(e, "is_user_annotation", False) or "#" in e.key:
            continue
        if t and e.key and getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
            rows[e.key] = rows.get(e.key, 0.0) + t / 1e3 / a.profile    # ms per step
    total = sum(rows.values())
    cats = {}
    for k, t in rows.items():
        low = k.lower()
        c = next((name for name, keys in _CATEGORIES if any(f in low for f in keys)), "other")
        cats[c] = cats.get(c, 0.0) + t
    print("  profile %s: %.1f ms of device time per step: %s" % (
        mode, total, ", ".join("%s %.1f" % kv for kv in sorted(cats.items(), key=lambda kv: -kv[1]))))
    for k, t in sorted(rows.items(), key=lambda kv: -kv[1])[:12]:
        print("    %7.2f ms  %s" % (t, k[:110]))


def main():
    a = parse()
    try:
        import torch
        import transformers
    except ImportError as e:
        print("train_ref.py: needs torch and transformers (%s)" % e, file=sys.stderr)
        return 2
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("train_ref.py: no CUDA device (use --device cpu for a smoke test)", file=sys.stderr)
        return 2
    print("reference: LlamaForCausalLM dim %d, %d layers, %d/%d heads, ffn %d, vocab %d, batch %d x seq %d, "
          "torch %s, transformers %s, %s" % (a.dim, a.layers, a.heads, a.kv_heads, a.ffn, a.vocab, a.batch, a.seq,
                                            torch.__version__, transformers.__version__,
                                            torch.cuda.get_device_name() if a.device.startswith("cuda")
                                            else a.device))
    for mode in a.modes.split(","):
        r = run_mode(a, mode.strip(), torch, transformers)
        if a.json:
            print(json.dumps(dict(r, bench="train_ref")))
        elif "skipped" in r:
            print("  %-14s skipped: %s" % (r["mode"], r["skipped"]))
        else:
            peak = "%6.2f GiB" % r["peak_gib"] if r["peak_gib"] is not None else "     - (cpu)"
            print("  %-14s %10.0f tok/s %9.1f ms/step   peak %s   loss %.4f" %
                  (r["mode"], r["tokens_per_s"], r["ms_per_step"], peak, r["loss"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch side of the GPU benchmark (bench/gpu/run.sh): the operations of
bench_gpu.c, same sizes, same data distribution (uniform in [-2, 2)), same
rotation over input buffers, timed with torch.cuda.Event around each
sample of --batch back-to-back repetitions after a warm-up (median and
minimum of --reps samples, per repetition).

    python3 torch_bench.py [--json FILE] [--reps N] [--warmup N] [--batch K]
                           [--only CASE[,CASE...]] [--quick] [--compile]

--compile runs the torch.compile'd variants instead (cases named
CASE@compile: the quantize and NF4 functions, fused by Inductor); run.sh
runs it as a second process under a time limit, since a cold compile can
take a while. A case that fails prints its error on its own row and the
others go on. Exit status: 0 all ran, 1 one failed, 77 no CUDA device,
3 torch missing.
"""
import argparse
import json
import sys
import time
import traceback

GIB = 1 << 30
MIB = 1 << 20

# NF4 codebook (docs/NF4.md "The format")
NF4_TABLE = [
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
]

# the reference and the cases with targets first, so a run cut short still has them
CASES = [
    "copy", "fp8_quant_static", "nf4_dequant", "gemm_bf16", "gemm_fp8_tensorwise", "adamw",
    "copy_op", "cast_fp8", "fp8_quant_dynamic", "fp8_quant_rowwise", "nf4_dequant_16k", "gemm_fp8_rowwise",
    "gemm_fp8_tensorwise_fastaccum", "attention_llama3",
]
# the linear layer (bench_gpu's float8_linear_*): bf16 nn.Linear eager and
# compiled, torchao's Float8Linear (convert_to_float8_training) compiled;
# each case also reports the forward alone as CASE_fwd
LIN_SHAPES = ["4096x14336", "14336x4096", "4096x4096"]
LIN_TORCHAO = ["tensorwise", "rowwise", "rowwise_with_gw_hp"]
LIN_CASES = [f"float8_linear_bf16_{s}" for s in LIN_SHAPES]
# (bf16 and tensorwise at every shape first: a compile run cut short by its
# time limit keeps the rows with targets)
LIN_COMPILE_CASES = ([f"float8_linear_{r}_{s}" for s in LIN_SHAPES for r in ["bf16", "tensorwise"]]
                     + [f"float8_linear_{r}_{s}" for r in LIN_TORCHAO[1:] for s in LIN_SHAPES])
CASES += LIN_CASES + [c for c in LIN_COMPILE_CASES if c not in LIN_CASES]
# the cases that have a torch.compile variant (run with --compile)
# (the layer first: a compile run cut short by its time limit keeps it)
COMPILE_CASES = LIN_COMPILE_CASES + ["fp8_quant_static", "nf4_dequant", "fp8_quant_dynamic", "fp8_quant_rowwise",
                                     "cast_fp8"]
# torchao's layer runs under torch.compile only (its eager path is not
# what its users train with)
EAGER_CASES = [c for c in CASES if c not in LIN_COMPILE_CASES or c in LIN_CASES]


class Bench:
    def __init__(self, torch, args):
        self.torch = torch
        self.args = args
        self.json = open(args.json, "a") if args.json else None
        self.copy_gbps = 0.0
        self.failed = 0
        self.dev = torch.device("cuda", 0)

    # ---- data ----
    def unif(self, shape, dtype, seed):
        t = self.torch
        g = t.Generator(device=self.dev)
        g.manual_seed(seed)
        x = t.rand(shape, generator=g, device=self.dev, dtype=t.float32).mul_(4.0).sub_(2.0)
        return x if dtype == t.float32 else x.to(dtype)

    # ---- timing ----
    def time_reps(self, fn):
        t = self.torch
        reps, warm, batch = self.args.reps, self.args.warmup, self.args.batch
        for i in range(warm):
            fn(i)
        t.cuda.synchronize()
        ev = [t.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
        ev[0].record()
        i = warm
        for k in range(reps):
            for _ in range(batch):
                fn(i)
                i += 1
            ev[k + 1].record()
        ev[reps].synchronize()
        t.cuda.synchronize()
        ms = sorted(ev[k].elapsed_time(ev[k + 1]) / batch for k in range(reps))
        med = ms[reps // 2] if reps % 2 else 0.5 * (ms[reps // 2 - 1] + ms[reps // 2])
        return med, ms[0]

    # ---- reporting ----
    def report(self, name, desc, med, mn, nbytes=0.0, flops=0.0):
        gbps = nbytes / (med * 1e-3) / 1e9 if nbytes else 0.0
        tflops = flops / (med * 1e-3) / 1e12 if flops else 0.0
        line = f"{name:<22} {med:9.3f} ms"
        if nbytes:
            line += f"  {gbps:8.1f} GB/s"
            if self.copy_gbps:
                line += f"  {100.0 * gbps / self.copy_gbps:6.1f}% copy"
        elif flops:
            line += f"  {tflops:8.1f} TFLOP/s"
        print(f"{line}   (min {mn:.3f} ms; {desc})", flush=True)
        rec = {"impl": "torch", "case": name, "desc": desc, "ms": med, "min_ms": mn, "reps": self.args.reps,
               "batch": self.args.batch, "bytes": nbytes, "flops": flops, "error": None}
        if nbytes:
            rec["gbps"] = gbps
        if flops:
            rec["tflops"] = tflops
        self.emit(rec)

    def report_error(self, name, msg):
        print(f"{name:<22} ERROR: {msg}", flush=True)
        self.emit({"impl": "torch", "case": name, "error": msg})

    def emit(self, rec):
        if self.json:
            self.json.write(json.dumps(rec) + "\n")
            self.json.flush()

    def maybe_compile(self, fn, compiled):
        if not compiled:
            return fn
        # a fresh dynamo cache per case: the cases compile the same code
        # objects (nn.Linear.forward, Float8Linear.forward) at other shapes
        # and configs, and past torch._dynamo.config.cache_size_limit (8)
        # recompilations dynamo silently runs them eagerly
        self.torch._dynamo.reset()
        return self.torch.compile(fn, dynamic=False)

    # ---- cases ----
    def case_copy(self, name, f32):
        t = self.torch
        n = 16 * MIB if self.args.quick else GIB
        dt, numel = (t.float32, n // 4) if f32 else (t.uint8, n)
        src = [t.full((numel,), 0x3C, dtype=dt, device=self.dev) for _ in range(2)]
        dst = [t.empty((numel,), dtype=dt, device=self.dev) for _ in range(2)]
        med, mn = self.time_reps(lambda i: dst[i % 2].copy_(src[i % 2]))
        if not f32:
            self.copy_gbps = 2.0 * n / (med * 1e-3) / 1e9
        what = "f32 " if f32 else ""
        self.report(name, f"x.copy_ {what}{n // MIB} MiB, read + write", med, mn, 2.0 * n)

    def case_quant(self, name, mode, compiled):
        t = self.torch
        f8 = t.float8_e4m3fn
        n = 2048 if self.args.quick else 16384
        x = [self.unif((n, n), t.bfloat16, 11) for _ in range(2)]
        scale = t.tensor(448.0 / 2.0, dtype=t.float32, device=self.dev)

        if mode == "cast":
            def f(x, scale):
                return x.to(f8)
        elif mode == "static":
            def f(x, scale):
                amax = t.amax(t.abs(x))
                return (x * scale).to(f8), amax
        elif mode == "dynamic":
            def f(x, scale):
                amax = t.amax(t.abs(x)).float()
                s = 448.0 / t.clamp(amax, min=1e-12)
                return (x * s).to(f8), s, amax
        else:  # rowwise
            def f(x, scale):
                amax = t.amax(t.abs(x), dim=1, keepdim=True).float()
                s = 448.0 / t.clamp(amax, min=1e-12)
                return (x * s).to(f8), s, amax

        g = self.maybe_compile(f, compiled)
        med, mn = self.time_reps(lambda i: g(x[i % 2], scale))
        nbytes = n * n * 2 + n * n
        if mode == "rowwise":
            nbytes += n * 4 * 2
        elif mode != "cast":
            nbytes += 4 * 2
        if mode != "cast":
            nbytes += 16
        what = {"cast": "x.to(e4m3)", "static": "amax(abs(x)), (x*scale).to(e4m3)",
                "dynamic": "amax, scale = 448/amax, (x*scale).to(e4m3)",
                "rowwise": "amax(dim=1), per-row scale, (x*s).to(e4m3)"}[mode]
        self.report(name, f"bf16 [{n},{n}] -> e4m3, {what}", med, mn, float(nbytes))

    def case_nf4(self, name, n, compiled):
        t = self.torch
        if self.args.quick:
            n //= 8
        p = n * n
        block, sblock = 64, 256
        table = t.tensor(NF4_TABLE, dtype=t.float32, device=self.dev)
        copies = []
        for k in range(3):
            g = t.Generator(device=self.dev)
            g.manual_seed(100 + k)
            codes = t.randint(0, 256, (p // 2,), generator=g, device=self.dev, dtype=t.uint8)
            qs = t.randint(-128, 128, (p // block,), generator=g, device=self.dev, dtype=t.int8)
            factors = t.rand((p // (block * sblock),), generator=g, device=self.dev) * 100 + 50
            mean = t.tensor([0.5], dtype=t.float32, device=self.dev)
            copies.append((codes, qs, factors, mean))

        def dequant(codes, qs, factors, mean):
            idx = t.stack((codes >> 4, codes & 0xF), dim=-1).view(-1).long()
            vals = table[idx]
            absmax = qs.float() / factors.repeat_interleave(sblock) + mean
            return (vals.view(-1, block) * absmax[:, None]).to(t.bfloat16).view(-1)

        g = self.maybe_compile(dequant, compiled)
        med, mn = self.time_reps(lambda i: g(*copies[i % 3]))
        c = copies[0]
        in_bytes = c[0].numel() + c[1].numel() + 4 * c[2].numel() + 4
        self.report(name, f"NF4 [{n},{n}] -> bf16: unpack, table[idx] * absmax per block of 64", med, mn,
                    float(in_bytes + 2 * p))

    def case_gemm(self, name, mode):
        t = self.torch
        n = 1024 if self.args.quick else 8192
        if mode == "bf16":
            a = self.unif((n, n), t.bfloat16, 31)
            b = self.unif((n, n), t.bfloat16, 32)
            fn = lambda i: t.matmul(a, b)  # noqa: E731
            desc = "torch.matmul bf16"
        else:
            f8 = t.float8_e4m3fn
            a = self.unif((n, n), t.float32, 41).to(f8)
            w = self.unif((n, n), t.float32, 42).to(f8)  # [N, K] row-major
            b = w.t()                                    # [K, N] column-major
            if mode == "rowwise":
                sa = t.full((n, 1), 1.0 / 224, dtype=t.float32, device=self.dev)
                sb = t.full((1, n), 1.0 / 224, dtype=t.float32, device=self.dev)
            else:
                sa = t.tensor(1.0 / 224, dtype=t.float32, device=self.dev)
                sb = t.tensor(1.0 / 224, dtype=t.float32, device=self.dev)
            fast = mode == "fastaccum"
            fn = lambda i: t._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=t.bfloat16,  # noqa: E731
                                        use_fast_accum=fast)
            desc = {"tensorwise": "torch._scaled_mm e4m3 x e4m3^T, tensorwise scales",
                    "rowwise": "torch._scaled_mm e4m3 x e4m3^T, rowwise [M,1] x [1,N] scales",
                    "fastaccum": "torch._scaled_mm tensorwise, use_fast_accum=True"}[mode]
        med, mn = self.time_reps(fn)
        self.report(name, f"{n}^3, {desc} -> bf16", med, mn, flops=2.0 * n * n * n)

    def case_adamw(self, name):
        t = self.torch
        per = (1 << 16) if self.args.quick else (1 << 22)
        ntens = 64
        params = [t.nn.Parameter(self.unif((per,), t.float32, 51 + k)) for k in range(ntens)]
        for k, p in enumerate(params):
            p.grad = self.unif((per,), t.float32, 151 + k)
        opt = t.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, fused=True)
        med, mn = self.time_reps(lambda i: opt.step())
        pbytes = per * 4 * ntens
        self.report(name, f"torch.optim.AdamW(fused=True).step, {ntens} f32 params x {per * 4 / MIB:.3g} MiB "
                          f"({pbytes / MIB:.4g} MiB)", med, mn, 7.0 * pbytes)

    def case_linear(self, name, recipe, shape, compiled):
        """bf16 x [8192, K] -> [8192, N]: forward, then forward + backward
        (grad_x and grad_W), as bench_gpu's float8_linear_* cases."""
        t = self.torch
        k, n = (int(v) for v in shape.split("x"))
        m = 8192
        if self.args.quick:
            m, k, n = 512, k // 8, n // 8
        label = name + "@compile" if compiled else name
        lin = t.nn.Linear(k, n, bias=False, device=self.dev, dtype=t.bfloat16)
        what = "nn.Linear bf16"
        if recipe != "bf16":
            if not compiled:
                raise ValueError("torchao Float8Linear is measured under torch.compile only")
            try:
                from torchao.float8 import Float8LinearConfig, convert_to_float8_training
                import torchao
            except Exception as e:
                self.report_error(label, f"torchao not installed ({type(e).__name__}: {e}); row skipped")
                self.report_error(label.replace(name, name + "_fwd"), "torchao not installed; row skipped")
                return
            mod = t.nn.Sequential(lin)
            convert_to_float8_training(mod, config=Float8LinearConfig.from_recipe_name(recipe))
            lin = mod
            what = f"torchao {torchao.__version__} Float8Linear {recipe}"
        f = self.maybe_compile(lin, compiled)
        x = self.unif((m, k), t.bfloat16, 61).requires_grad_(True)
        g = self.unif((m, n), t.bfloat16, 63)
        params = list(lin.parameters())

        def fwd(i):
            return f(x)

        def fwd_bwd(i):
            for p in params:
                p.grad = None
            x.grad = None
            f(x).backward(g)

        fl = 2.0 * m * k * n
        desc = f"{what}{' + torch.compile' if compiled else ''}, x [{m}, {k}] bf16, W [{n}, {k}]"
        med, mn = self.time_reps(fwd)
        self.report(label.replace(name, name + "_fwd"), desc + ": forward", med, mn, flops=fl)
        med, mn = self.time_reps(fwd_bwd)
        self.report(label, desc + ": forward + backward", med, mn, flops=3.0 * fl)

    def case_attention(self, name):
        """bench_gpu's attention_llama3: causal SDPA, bf16, q [B, T, 32, 128]
        and k/v [B, T, 8, 128] viewed as [B, heads, T, 128] (transformers'
        layout: transposed views, not copies), the flash backend only
        (torch.nn.attention.sdpa_kernel), forward and forward + backward
        (dq, dk, dv). GQA through enable_gqa; a torch whose flash kernel
        refuses it gets k/v repeated to 32 heads outside the timed region
        (said in the row)."""
        t = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        F = t.nn.functional
        b, n, h, kh, d = (1, 256, 32, 8, 128) if self.args.quick else (2, 4096, 32, 8, 128)
        q = self.unif((b, n, h, d), t.bfloat16, 71).transpose(1, 2).requires_grad_(True)
        k = self.unif((b, n, kh, d), t.bfloat16, 72).transpose(1, 2).requires_grad_(True)
        v = self.unif((b, n, kh, d), t.bfloat16, 73).transpose(1, 2).requires_grad_(True)
        g = self.unif((b, n, h, d), t.bfloat16, 74).transpose(1, 2)
        how = "enable_gqa"

        def attn(q, k, v, gqa):
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                if gqa:
                    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        try:
            attn(q, k, v, True).backward(g)
            gqa = True
        except Exception:  # noqa: BLE001 (a flash kernel without GQA)
            k = k.detach().repeat_interleave(h // kh, dim=1).requires_grad_(True)
            v = v.detach().repeat_interleave(h // kh, dim=1).requires_grad_(True)
            gqa, how = False, "k/v repeated to 32 heads before timing"

        def fwd(i):
            with t.no_grad():
                return attn(q, k, v, gqa)

        def fwd_bwd(i):
            q.grad = k.grad = v.grad = None
            attn(q, k, v, gqa).backward(g)

        fl = 2.0 * b * h * n * n * d
        desc = f"SDPA flash bf16 causal, q [{b}, {n}, {h}, {d}], k/v {kh} heads ({how})"
        med, mn = self.time_reps(fwd)
        self.report(name + "_fwd", desc + ": forward", med, mn, flops=fl)
        med, mn = self.time_reps(fwd_bwd)
        self.report(name, desc + ": forward + backward", med, mn, flops=3.5 * fl)

    def run_case(self, name, compiled):
        if name == "copy":
            return self.case_copy(name, False)
        if name == "copy_op":
            return self.case_copy(name, True)
        label = name + "@compile" if compiled else name
        quant = {"cast_fp8": "cast", "fp8_quant_static": "static", "fp8_quant_dynamic": "dynamic",
                 "fp8_quant_rowwise": "rowwise"}
        if name in quant:
            return self.case_quant(label, quant[name], compiled)
        if name == "nf4_dequant":
            return self.case_nf4(label, 8192, compiled)
        if name == "nf4_dequant_16k":
            return self.case_nf4(label, 16384, compiled)
        if name == "gemm_bf16":
            return self.case_gemm(name, "bf16")
        if name == "gemm_fp8_tensorwise":
            return self.case_gemm(name, "tensorwise")
        if name == "gemm_fp8_rowwise":
            return self.case_gemm(name, "rowwise")
        if name == "gemm_fp8_tensorwise_fastaccum":
            return self.case_gemm(name, "fastaccum")
        if name == "adamw":
            return self.case_adamw(name)
        if name == "attention_llama3":
            return self.case_attention(name)
        if name.startswith("float8_linear_"):
            recipe, shape = name[len("float8_linear_"):].rsplit("_", 1)
            return self.case_linear(name, recipe, shape, compiled)
        raise ValueError(f"unknown case {name}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="append one JSON object per case to this file")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--compile", action="store_true", help="run the torch.compile variants only")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.reps < 20:
        ap.error("--reps must be >= 20")
    if args.batch < 1:
        ap.error("--batch must be >= 1")
    if args.list:
        print("\n".join(CASES))
        return 0
    names = COMPILE_CASES if args.compile else EAGER_CASES
    if args.only:
        # BENCH_ONLY is shared with bench_gpu: names only lpx has (the
        # float8_linear recipes torch lacks) are skipped, not errors
        want = args.only.split(",")
        if not any(w in CASES for w in want):
            ap.error(f"no torch case among: {', '.join(want)}")
        names = [c for c in names if c in want]
    try:
        import torch
    except Exception as e:  # no torch here: say so per row, like a failed case
        print(f"# torch_bench: cannot import torch: {e}", flush=True)
        if args.json:
            with open(args.json, "a") as f:
                for c in names:
                    f.write(json.dumps({"impl": "torch", "case": c + ("@compile" if args.compile else ""),
                                        "error": f"cannot import torch: {e}"}) + "\n")
        return 3
    if not torch.cuda.is_available():
        print("# torch_bench: torch.cuda.is_available() is False (no CUDA device)", flush=True)
        return 77
    b = Bench(torch, args)
    print(f"# torch_bench: torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"{torch.cuda.get_device_name(0)}, {args.reps} reps (median), {args.warmup} warm-up"
          + (", torch.compile" if args.compile else "") + (", --quick sizes" if args.quick else ""), flush=True)
    for name in names:
        t0 = time.time()
        try:
            b.run_case(name, args.compile)
        except Exception as e:
            b.failed += 1
            msg = f"{type(e).__name__}: {e}".strip().splitlines()
            b.report_error(name + ("@compile" if args.compile else ""), " ".join(msg)[:400])
            traceback.print_exc(limit=2, file=sys.stderr)
        finally:
            try:  # after a CUDA error these raise too: the next case reports its own
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as e:
                print(f"#   (cleanup after {name}: {type(e).__name__}: {e})", flush=True)
        if args.compile:
            print(f"#   ({name}@compile took {time.time() - t0:.1f} s with compilation)", flush=True)
    return 1 if b.failed else 0


if __name__ == "__main__":
    sys.exit(main())

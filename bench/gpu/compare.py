#!/usr/bin/env python3
"""Side-by-side table of bench_gpu (lpx) and torch_bench.py (PyTorch) from
their JSON lines, with the GPU targets as pass/fail (bench/gpu/run.sh).

    python3 compare.py LPX.jsonl TORCH.jsonl [--summary OUT.json]

Columns: op | lpx (ms, GB/s or TFLOP/s) | torch eager | torch.compile |
lpx/torch = best torch ms / lpx ms (> 1: lpx faster) | lpx % of copy (the
lpx run's own cudaMemcpyAsync row) | target.
Exit status 0 (the table is information; the targets are in the output).
"""
import json
import sys

ORDER = [
    "copy", "copy_op", "cast_fp8", "fp8_quant_static", "fp8_quant_dynamic", "fp8_quant_rowwise",
    "nf4_dequant", "nf4_dequant_16k", "gemm_bf16", "gemm_fp8_tensorwise", "gemm_fp8_rowwise",
    "gemm_fp8_blockwise", "gemm_fp8_tensorwise_fastaccum", "adamw", "attention_llama3_fwd", "attention_llama3",
]


def load(path):
    recs = {}
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                recs[r.get("case", "?")] = r  # the last record of a case wins
    except OSError as e:
        print(f"# {path}: {e}")
    return recs


def ok(r):
    return r is not None and not r.get("error") and r.get("ms")


def rate(r):
    if not ok(r):
        return None
    if r.get("gbps"):
        return r["gbps"]
    return r.get("tflops")


def cell(r):
    if r is None:
        return "-"
    if r.get("error"):
        return "ERROR"
    unit = "GB/s" if r.get("gbps") else "TFLOP/s" if r.get("tflops") else ""
    return f"{r['ms']:.3f} ms {rate(r):.0f} {unit}".rstrip()


def print_table(hdr, rows):
    """Left-aligned columns as wide as their widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*hdr))
    print(fmt.format(*["-" * w for w in widths]))
    for r in rows:
        print(fmt.format(*r))


LIN_SHAPES = ["4096x4096", "4096x14336", "14336x4096"]
LIN_RECIPES = ["bf16", "tensorwise", "tensorwise_fp8w", "rowwise", "rowwise_with_gw_hp", "delayed", "blockwise"]


def lin_table(lpx, torch, ms_of, lin_ratio):
    """The Float8Linear rows: M = 8192, K x N, per recipe."""
    if not any(c.startswith("float8_linear_") for c in list(lpx) + list(torch)):
        return
    print()
    print("Float8Linear (M = 8192; x, W, grad_out bf16): speedups are time ratios, > 1 means lpx is faster")
    hdr = ["K x N", "recipe", "lpx fwd+bwd", "fwd / lpx bf16", "fwd+bwd / lpx bf16", "vs torchao+compile",
           "torchao+compile / torch bf16+compile"]
    rows = []
    for shape in LIN_SHAPES:
        for recipe in LIN_RECIPES:
            case = f"float8_linear_{recipe}_{shape}"
            ms = ms_of(lpx, case)
            tr = recipe if recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp") else None
            fw, fb = lin_ratio(recipe, shape, fwd=True), lin_ratio(recipe, shape)
            vt = lin_ratio(recipe, shape, tr, torch) if tr else None
            if recipe == "bf16":
                vt = lin_ratio("bf16", shape, "bf16", torch)
            ta = ms_of(torch, f"float8_linear_{tr}_{shape}@compile") if tr else None
            tb = ms_of(torch, f"float8_linear_bf16_{shape}@compile")
            if ms is None and ta is None:
                continue
            f = lambda v: f"{v:.2f}x" if v else "-"  # noqa: E731
            rows.append([shape, recipe, f"{ms:.3f} ms" if ms else "-", f(fw), f(fb), f(vt),
                         f(tb / ta if ta and tb else None)])
    print_table(hdr, rows)
    print("vs torchao+compile: torchao Float8Linear (same recipe) + torch.compile time over lpx's; for bf16, torch "
          "nn.Linear + compile over lpx's bf16 layer")


def main():
    args = sys.argv[1:]
    summary_path = None
    if "--summary" in args:
        i = args.index("--summary")
        summary_path = args[i + 1] if i + 1 < len(args) else None
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__)
        return 2
    lpx, torch = load(args[0]), load(args[1])
    copy = rate(lpx.get("copy"))
    torch_copy = rate(torch.get("copy"))

    def pct(r, ref=copy):
        v = rate(r)
        return 100.0 * v / ref if v and ref and r.get("gbps") else None

    # targets (the issue's): (case, label, check(lpx, torch) -> (value text, passed) or None)
    def t_copy_pct(case, goal):
        def check():
            p = pct(lpx.get(case))
            return None if p is None else (f"{p:.1f}% of copy (goal >= {goal}%)", p >= goal)
        return check

    def t_fp8_vs_bf16():
        a, b = rate(lpx.get("gemm_fp8_tensorwise")), rate(lpx.get("gemm_bf16"))
        if not a or not b:
            return None
        return (f"{a / b:.2f}x lpx bf16 GEMM (goal >= 1.6x)", a / b >= 1.6)

    def t_block_vs_bf16():
        a, b = rate(lpx.get("gemm_fp8_blockwise")), rate(lpx.get("gemm_bf16"))
        if not a or not b:
            return None
        return (f"{a / b:.2f}x lpx bf16 GEMM (goal >= 1.5x)", a / b >= 1.5)

    def t_fp8_vs_torch():
        a, b = rate(lpx.get("gemm_fp8_tensorwise")), rate(torch.get("gemm_fp8_tensorwise"))
        if not a or not b:
            return None
        return (f"{a / b:.2f}x torch._scaled_mm (goal >= 0.95x)", a / b >= 0.95)

    # the layer (float8_linear_*): speedups are time ratios (> 1: faster)
    def ms_of(recs, case):
        r = recs.get(case)
        return r["ms"] if ok(r) else None

    def lin_ratio(recipe, shape, ref_recipe="bf16", ref=None, fwd=False):
        suffix = "_fwd" if fwd else ""
        a = ms_of(lpx, f"float8_linear_{recipe}_{shape}{suffix}")
        b = ms_of(ref if ref is not None else lpx, f"float8_linear_{ref_recipe}_{shape}{suffix}"
                  + ("@compile" if ref is not None else ""))
        return b / a if a and b else None

    def t_lin(recipe, shape, goal, ref_recipe="bf16", vs_torch=False):
        def check():
            v = lin_ratio(recipe, shape, ref_recipe, torch if vs_torch else None)
            if v is None:
                return None
            ref = f"torchao {ref_recipe} + compile" if vs_torch else (
                "lpx bf16 layer" if ref_recipe == "bf16" else f"lpx {ref_recipe}")
            return (f"{v:.2f}x {ref} (goal >= {goal}x)", v >= goal)
        return check

    lin_targets = []
    for shape in LIN_SHAPES:
        case = f"float8_linear_tensorwise_{shape}"
        lin_targets += [
            (case, f"{shape} tensorwise fwd+bwd >= 1.40x bf16", t_lin("tensorwise", shape, 1.40)),
            (case, f"{shape} tensorwise fwd+bwd >= 1.0x torchao+compile",
             t_lin("tensorwise", shape, 1.0, "tensorwise", True)),
            (f"float8_linear_tensorwise_fp8w_{shape}", f"{shape} weight already fp8 >= 1.5x bf16",
             t_lin("tensorwise_fp8w", shape, 1.5)),
            (f"float8_linear_rowwise_{shape}", f"{shape} rowwise >= 1.15x bf16", t_lin("rowwise", shape, 1.15)),
            (f"float8_linear_rowwise_{shape}", f"{shape} rowwise >= 1.05x torchao+compile",
             t_lin("rowwise", shape, 1.05, "rowwise", True)),
            (f"float8_linear_rowwise_with_gw_hp_{shape}", f"{shape} rowwise_with_gw_hp >= 1.2x bf16",
             t_lin("rowwise_with_gw_hp", shape, 1.2)),
            (f"float8_linear_delayed_{shape}", f"{shape} delayed >= tensorwise",
             t_lin("delayed", shape, 1.0, "tensorwise")),
            (f"float8_linear_blockwise_{shape}", f"{shape} blockwise >= 1.25x bf16", t_lin("blockwise", shape, 1.25)),
        ]
    targets = [
        ("fp8_quant_static", "cast+amax bf16->fp8 >= 85% of copy", t_copy_pct("fp8_quant_static", 85)),
        ("fp8_quant_rowwise", "rowwise quantize [16384,16384] >= 85% of copy", t_copy_pct("fp8_quant_rowwise", 85)),
        ("nf4_dequant", "NF4 dequant -> bf16 >= 85% of copy", t_copy_pct("nf4_dequant", 85)),
        ("gemm_fp8_tensorwise", "fp8 GEMM 8192^3 >= 1.6x bf16 GEMM", t_fp8_vs_bf16),
        ("gemm_fp8_tensorwise", "fp8 GEMM 8192^3 >= 0.95x torch._scaled_mm", t_fp8_vs_torch),
        ("gemm_fp8_blockwise", "blockwise fp8 GEMM 8192^3 >= 1.5x bf16 GEMM", t_block_vs_bf16),
        ("adamw", "fused AdamW >= 80% of copy", t_copy_pct("adamw", 80)),
    ] + lin_targets
    results = []
    row_target = {}
    for case, label, check in targets:
        r = check()
        verdict = "n/a" if r is None else ("PASS" if r[1] else "FAIL")
        results.append({"case": case, "target": label, "result": verdict, "value": r[0] if r else None})
        row_target[case] = (row_target[case] + "," if case in row_target else "") + verdict

    cases = [c for c in ORDER if c in lpx or c in torch]
    cases += sorted(c for c in set(lpx) | set(torch)
                    if c not in ORDER and "@" not in c and not c.startswith("float8_linear_"))
    hdr = ["op", "lpx", "torch", "torch.compile", "lpx/torch", "lpx %copy", "target"]
    rows = []
    for c in cases:
        lr, tr, cr = lpx.get(c), torch.get(c), torch.get(c + "@compile")
        best = min((r["ms"] for r in (tr, cr) if ok(r)), default=None)
        ratio = f"{best / lr['ms']:.2f}x" if ok(lr) and best else "-"
        p = pct(lr) if ok(lr) else None
        rows.append([c, cell(lr), cell(tr), cell(cr) if cr else "-", ratio,
                     f"{p:.1f}%" if p is not None else "-", row_target.get(c, "")])
    print_table(hdr, rows)
    print("lpx/torch: the faster of torch eager and torch.compile, in time, over lpx (> 1: lpx is faster).")
    lin_table(lpx, torch, ms_of, lin_ratio)
    batches = sorted({r.get("batch", 1) for recs in (lpx, torch) for r in recs.values() if ok(r)})
    if batches:
        print("timing: median over samples of " + "/".join(str(b) for b in batches)
              + " back-to-back reps (per rep; BENCH_BATCH)")
    if copy:
        print(f"copy bandwidth (cudaMemcpyAsync D2D, read + write): lpx run {copy:.0f} GB/s"
              + (f", torch run {torch_copy:.0f} GB/s" if torch_copy else ""))
    errors = [(impl, c, r["error"]) for impl, recs in (("lpx", lpx), ("torch", torch))
              for c, r in recs.items() if r.get("error")]
    if errors:
        print("errors:")
        grouped = {}
        for impl, c, e in errors:
            grouped.setdefault((impl, e), []).append(c)
        for (impl, e), cs in grouped.items():
            print(f"  {impl} {', '.join(cs)}: {e}")
    print("targets:")
    for t in results:
        print(f"  [{t['result']:>4}] {t['target']}: {t['value'] or 'not measured'}")
    npass = sum(t["result"] == "PASS" for t in results)
    print(f"targets: {npass} of {len(results)} met")
    if summary_path:
        with open(summary_path, "w") as f:
            json.dump({"copy_gbps": copy, "targets": results,
                       "rows": [dict(zip(hdr, r)) for r in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A chip file for `lpx plan` (docs/PLAN.md) from what the GPU benchmark
measured (bench/gpu/run.sh writes lpx.jsonl; `make bench-gpu` calls this
at its end and leaves chip.json beside it).

    scripts/chip-file.py LPX_JSONL --name NAME --sms N --memory-gib M
                         --peak-tflops P [--date YYYY-MM-DD] [--command CMD]

Rates taken (lpx's own kernels, the median of the run): bf16_tflops from
the case gemm_bf16, fp8_tflops from gemm_fp8_tensorwise, copy_gbs from
copy; attention_tflops is left out (the benchmark has no attention case:
lpx plan then uses the bf16 GEMM rate). The SM count, memory and the bf16
peak (what MFU is over) are the chip's published figures, given on the
command line with --name saying which chip. A case that errored or is
missing is refused: a chip file holds measurements or nothing.
"""
import argparse
import datetime
import json
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("jsonl")
    ap.add_argument("--name", required=True)
    ap.add_argument("--sms", type=int, required=True)
    ap.add_argument("--memory-gib", type=float, required=True)
    ap.add_argument("--peak-tflops", type=float, required=True)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--command", default="make bench-gpu")
    a = ap.parse_args()
    rows = {}
    with open(a.jsonl) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if r.get("impl", "lpx") == "lpx" and "case" in r:
                rows[r["case"]] = r
    need = {"gemm_bf16": "tflops", "gemm_fp8_tensorwise": "tflops", "copy": "gbps"}
    got = {}
    for case, key in need.items():
        r = rows.get(case)
        if not r or r.get("error") or not isinstance(r.get(key), (int, float)) or r[key] <= 0:
            why = "missing" if not r else (r.get("error") or "no %s" % key)
            print("chip-file.py: case %s: %s; no chip file written" % (case, why), file=sys.stderr)
            return 2
        got[case] = r
    src = "measured by bench/gpu/bench_gpu (%s) on %s, case %%s: %%s" % (a.command, a.date)
    out = {
        "name": a.name + " (measured)",
        "kind": "measured",
        "date": a.date,
        "command": a.command,
        "sms": {"value": a.sms, "source": "published figure for " + a.name + ", given to chip-file.py"},
        "memory_gib": {"value": a.memory_gib, "source": "published figure for " + a.name + ", given to chip-file.py"},
        "bf16_tflops": {"value": got["gemm_bf16"]["tflops"],
                        "source": src % ("gemm_bf16", got["gemm_bf16"].get("desc", ""))},
        "fp8_tflops": {"value": got["gemm_fp8_tensorwise"]["tflops"],
                       "source": src % ("gemm_fp8_tensorwise", got["gemm_fp8_tensorwise"].get("desc", ""))},
        "copy_gbs": {"value": got["copy"]["gbps"], "source": src % ("copy", got["copy"].get("desc", ""))},
        "bf16_peak_tflops": {"value": a.peak_tflops,
                             "source": "published dense BF16 peak for " + a.name + ", given to chip-file.py"},
    }
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Quantizes the f32 AdamW moments of a checkpoint (lpx train --optim adamw
--save DIR) as AdamW4bit would (blocks of B on each parameter's global flat
index: v on the unsigned map (c + 1) / 16, m on the signed dynamic map with
3 exponent bits, torchao's nearest rule, the values of core/numerics/
optim_state.h's LPX_OS_MAP4_*) and reports how the step m / sqrt(v) would
change: the share of v rounded up, of v floored to absmax / 16, of m
rounded to 0, and the RMS of the quantized step over the f32 one, in all
and for the largest parameters. docs/NUMERICS.md "In the engine and in
training" (issue 37: is adamw4bit's lower demo loss real or a bug?).

    scripts/optim4-probe.py CHECKPOINT_DIR [BLOCK]     (default 256)

Pure Python (no numpy): a few seconds on the demo model."""
import json, struct, sys, array, math, bisect
d = sys.argv[1]; B = int(sys.argv[2]) if len(sys.argv) > 2 else 256
idx = json.load(open(d + "/index.json"))
W = idx["world"]
def load(path):
    f = open(path, "rb"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
    return f, h, base
files = [load("%s/rank-%05d-of-%05d.safetensors" % (d, r, W)) for r in range(W)]
def get(key):
    out = array.array("f")
    for f, h, base in files:
        if key not in h: continue
        a, b = h[key]["data_offsets"]; f.seek(base + a); x = array.array("f"); x.frombytes(f.read(b - a)); out.extend(x)
    return out
QS = [-0.887499988, -0.662500024, -0.4375, -0.212499991, -0.0775000006, -0.0325000025, -0.00549999997, 0, 0.00549999997, 0.0325000025, 0.0775000006, 0.212499991, 0.4375, 0.662500024, 0.887499988, 1]
QU = [(c + 1) / 16 for c in range(16)]
def enc(q, x):
    c = max(0, bisect.bisect_right(q, x) - 1); up = min(c + 1, 15)
    return q[up] if x - q[c] >= (q[up] - q[c]) * 0.5 else q[c]
eps = 1e-8
tot = dict(n=0, vup=0, vfloor=0, m0=0, num=0.0, den=0.0, numv=0.0, shrink_sum=0.0)
per = []
for p in idx["params"]:
    key = p["key"]; m = get(key + "#m"); v = get(key + "#v")
    if not v: continue
    n = len(v); pn = dict(n=n, vfloor=0, num=0.0, den=0.0)
    for s in range(0, n, B):
        mb, vb = m[s:s + B], v[s:s + B]
        am = max(abs(x) for x in mb) or 1e-12; av = max(vb) or 1e-12
        for mi, vi in zip(mb, vb):
            vq = enc(QU, vi / av) * av; mq = enc(QS, mi / am) * am
            u = mi / (math.sqrt(vi) + eps); uq = mq / (math.sqrt(vq) + eps); uv = mi / (math.sqrt(vq) + eps)
            tot["n"] += 1; tot["vup"] += vq > vi; f = vi < av / 32; tot["vfloor"] += f; pn["vfloor"] += f
            tot["m0"] += mq == 0
            tot["num"] += uq * uq; tot["den"] += u * u; tot["numv"] += uv * uv
            pn["num"] += uq * uq; pn["den"] += u * u
    per.append((key, n, pn["vfloor"] / n, math.sqrt(pn["num"] / pn["den"]) if pn["den"] else 0))
n = tot["n"]
print("elements %d, block %d" % (n, B))
print("v rounded up by the 4-bit map: %.1f%%; v below absmax/32 (floored to absmax/16): %.1f%%" % (100 * tot["vup"] / n, 100 * tot["vfloor"] / n))
print("m rounded to 0: %.1f%%" % (100 * tot["m0"] / n))
print("step RMS ratio (4-bit m and v / f32): %.3f; v alone: %.3f" % (math.sqrt(tot["num"] / tot["den"]), math.sqrt(tot["numv"] / tot["den"])))
for key, pn_, fl, r in sorted(per, key=lambda t: -t[1])[:6]:
    print("  %-22s %8d elems: v floored %.1f%%, step RMS ratio %.3f" % (key, pn_, 100 * fl, r))

#!/usr/bin/env python3
"""The typed API from the op spec (issue 36, docs/ARCHITECTURE.md "The op
spec"): every row of include/lpx/ops.def gives its C wrapper and is checked
against its prototype in include/lpx/ops.h.

The C signature of an op's typed function follows from its schema by one
rule:

    Tensor, Tensor(host)  lpx_tensor *x
    Tensor?               lpx_tensor *x (NULL = absent); a last argument
                          `Tensor? out` is not a parameter: the plain
                          function passes it absent, the `_out` variant
                          (OUT_VARIANTS) passes the caller's tensor
    Tensor[]              lpx_tensor *const *xs, int n
    int                   int64_t
    int[], int[]?         int n, const int64_t *x (int[]?: n == 0 = absent)
    float                 double
    bool                  bool
    dtype                 lpx_dtype
    device                lpx_device dev
    results               one lpx_tensor ** per result, after the
                          arguments; none for an in-place op (a name
                          ending in `_`: its results are dropped)

Argument names are the schema's (`device` is spelled `dev`); the names of
list counts and results, which the schema does not have, are ops.h's. The
body: a negative list count is refused ("<op>: <count> %d is negative"),
the arguments go into an lpx_value array on the stack, and
dispatch/api_util.h's lpx__call_ret0/ret1/retn dispatch it, as the
hand-written wrappers did. Where an op's typed API differs from the rule,
the difference is data below (API) or the function is hand-written
(HAND, in dispatch/api_hand.c); docs/ARCHITECTURE.md lists both.

Run by meson at build time (the build fails when ops.h, ops.def and the
hand-written file disagree):

    scripts/gen-ops.py --ops-def include/lpx/ops.def --ops-h include/lpx/ops.h \\
        --hand dispatch/api_hand.c [-o dispatch_ops_api.c]
    scripts/gen-ops.py --self-test   planted faults must be caught
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

# ---- the typed API's differences from the rule (data) ------------------

# Ops with an `lpx_<op>_out(inputs..., lpx_tensor *out)` variant: the
# caller's tensor as `out`, no new reference (lpx__call_ret0). The value:
# None, or the message when a NULL out is refused before dispatch (matmul:
# an absent out would mean "allocate" and the result would be dropped).
OUT_VARIANTS = {
    "add": None, "sub": None, "mul": None, "div": None, "swiglu": None,
    "matmul": "matmul_out: out is NULL",
}

# Per-op differences that stay generated:
#   types:    a parameter's C type other than the rule's (randn/rand take
#             an unsigned seed, passed as the int's bits)
#   required: which result pointers may not be NULL: "first" (refused as
#             "<op>: <name> is NULL"), "any" (not all of them NULL); by
#             default every result of a multi-result op may be NULL
#   ret2:     the two results through lpx__call_ret2 (a kernel's extra or
#             missing results tolerated), not lpx__call_retn
API = {
    "randn": {"types": {"seed": "uint64_t"}},
    "rand": {"types": {"seed": "uint64_t"}},
    "rmsnorm": {"required": "first", "ret2": True},
    "attention": {"required": "first"},
    "swiglu_backward": {"required": "any"},
}

# Typed functions written by hand in dispatch/api_hand.c: ops whose API is
# not the rule's, and functions that are not ops. The value: why; for an
# op, also the C types its prototype must have (checked like the rest).
HAND = {
    "rmsnorm_backward": "hands grad_w out only when weight is given",
    "adamw_": "four lists share one count n; n == 0 returns before dispatch; NULL lists refused by name",
    "split": "not an op: pieces of lpx_narrow",
    "chunk": "not an op: pieces of lpx_narrow",
    "item": "not an op: reads one element",
}
HAND_TYPES = {
    "adamw_": ["lpx_tensor *const *"] * 4 + ["int"] + ["double"] * 5 + ["int64_t"],
}

# Ops with no function in ops.h: the dense ops behind the built-in kinds.
# Their typed calls are the kind's own (include/lpx/float8.h, written in
# subclasses/float8/float8_quantize.c) or internal (subclasses/nf4), and
# the optimizer states' fused op (include/lpx/optim_state.h: typed master
# modes and seed, written in dispatch/api_optim_state.c).
NO_OPS_H = re.compile(r"^(fp8_|nf4_|qlora_dropout$|adamw_state_$)")

# ---- reading ops.def and ops.h -----------------------------------------

ROW = re.compile(r'LPX_OP\(\s*(\w+)\s*,\s*(\w+)\s*,\s*"([^"]*)"\s*\)')
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def read_rows(path, files=None):
    """[(name, spec, schema)] in op-id order, following ops.def's #includes."""
    text = COMMENT.sub(" ", open(path).read())
    if files is not None:
        files.append(path)
    rows = []
    for m in re.finditer(ROW.pattern + "|" + INCLUDE.pattern, text, re.M):
        if m.group(4):
            rows += read_rows(os.path.join(os.path.dirname(path), m.group(4)), files)
        else:
            rows.append((m.group(1), m.group(2), m.group(3)))
    return rows


class SpecError(Exception):
    pass


def parse_schema(name, schema):
    """([(type, argname)], nresults)"""
    m = re.fullmatch(r"\s*(\w+)\s*\((.*)\)\s*->\s*(.*?)\s*", schema)
    if not m or m.group(1) != name:
        raise SpecError(f"{name}: schema {schema!r} is not '{name}(args) -> results'")
    args = []
    for a in filter(None, (s.strip() for s in m.group(2).split(","))):
        t, _, n = a.rpartition(" ")
        args.append((t.replace(" ", ""), n))
    res = m.group(3)
    if res.startswith("("):
        nres = len([r for r in res[1:-1].split(",") if r.strip()])
    else:
        nres = 1
    return args, nres


PROTO = re.compile(r"LPX_API\s+lpx_status\s+lpx_(\w+)\s*\(([^;]*?)\)\s*;", re.S)


def ctype(t):
    """Canonical spelling of a C type: 'lpx_tensor *const *'."""
    t = re.sub(r"\s+", " ", t.strip())
    t = re.sub(r"\s*\*\s*", " *", t)
    return t.replace("* ", "*").strip()


def read_protos(path):
    """{function name without lpx_: [(ctype, param name)]}"""
    text = COMMENT.sub(" ", open(path).read())
    protos = {}
    for m in PROTO.finditer(text):
        params = []
        for p in m.group(2).split(","):
            p = p.strip()
            if p == "void":
                continue
            pm = re.fullmatch(r"(.*?)(\w+)", p, re.S)
            params.append((ctype(pm.group(1)), pm.group(2)))
        protos[m.group(1)] = params
    return protos


# ---- the rule ----------------------------------------------------------

def expected(name, args, nres, out_variant=False):
    """The rule's parameters for lpx_<name>(_out): a list of
    (ctype, schema name or None, role) where role says how the parameter
    travels: ('arg', i, kind), ('count', i), ('res', j), ('out',)."""
    params = []
    over = API.get(name, {}).get("types", {})
    for i, (t, n) in enumerate(args):
        last_out = i == len(args) - 1 and t == "Tensor?" and n == "out"
        if last_out:
            if out_variant:
                params.append(("lpx_tensor *", "out", ("out",)))
            continue
        if t in ("Tensor", "Tensor(host)"):
            params.append(("lpx_tensor *", n, ("arg", i, "tensor")))
        elif t in ("Tensor?", "Tensor(host)?"):
            params.append(("lpx_tensor *", n, ("arg", i, "opt_tensor")))
        elif t == "Tensor[]":
            params.append(("lpx_tensor *const *", n, ("arg", i, "tensors")))
            params.append(("int", None, ("count", i)))
        elif t in ("int[]", "int[]?"):
            params.append(("int", None, ("count", i)))
            params.append(("const int64_t *", n, ("arg", i, "ints" if t == "int[]" else "opt_ints")))
        elif t in ("int", "float", "bool", "dtype", "device"):
            c = {"int": "int64_t", "float": "double", "bool": "bool", "dtype": "lpx_dtype", "device": "lpx_device"}[t]
            c = over.get(n, c)
            params.append((c, "dev" if t == "device" else n, ("arg", i, t)))
        else:
            raise SpecError(f"{name}: argument '{t} {n}' has no C rule; write lpx_{name} by hand (HAND)")
    if out_variant:
        return params
    if not name.endswith("_"):
        for j in range(nres):
            params.append(("lpx_tensor **", None, ("res", j)))
    return params


def check_proto(fn, want, have, errors):
    """ops.h's prototype of lpx_<fn> against the rule's parameters."""
    if have is None:
        errors.append(f"ops.h: no prototype of lpx_{fn} (ops.def row '{fn.removesuffix('_out')}')")
        return False
    wt = [p[0] for p in want]
    ht = [p[0] for p in have]
    if wt != ht:
        errors.append(f"ops.h: lpx_{fn}({', '.join(ht)}) is not the schema's lpx_{fn}({', '.join(wt)})")
        return False
    ok = True
    for (_, wn, _), (_, hn) in zip(want, have):
        if wn is not None and wn != hn:
            errors.append(f"ops.h: lpx_{fn}: parameter '{hn}' is '{wn}' in the schema")
            ok = False
    return ok


# ---- the wrappers ------------------------------------------------------

def value(kind, pname, count):
    return {
        "tensor": f"lpx_v_tensor({pname})",
        "opt_tensor": f"lpx_v_opt_tensor({pname})",
        "tensors": f"lpx_v_tensors({pname}, (uint32_t){count})",
        "ints": f"lpx_v_ints({pname}, (uint32_t){count})",
        "opt_ints": f"{count} ? lpx_v_ints({pname}, (uint32_t){count}) : lpx_v_none()",
        "int": f"lpx_v_i64({pname})",
        "float": f"lpx_v_f64({pname})",
        "bool": f"lpx_v_bool({pname})",
        "dtype": f"lpx_v_dtype({pname})",
        "device": f"lpx_v_device({pname})",
    }[kind]


def wrapper(name, args, params, names, out_variant):
    """The C text of lpx_<name>(_out), parameters named as in ops.h."""
    fn = name + ("_out" if out_variant else "")
    decl = ", ".join(f"{t}{'' if t.endswith('*') else ' '}{n}" for (t, _, _), n in zip(params, names))
    body = []
    vals = [None] * len(args)
    counts = {}
    res = []
    for (t, _, role), pname in zip(params, names):
        if role[0] == "count":
            counts[role[1]] = pname
        elif role[0] == "res":
            res.append(pname)
    for (t, _, role), pname in zip(params, names):
        if role[0] == "arg":
            i, kind = role[1], role[2]
            v = value(kind, pname, counts.get(i))
            if t == "uint64_t":
                v = f"lpx_v_i64((int64_t){pname})"
            vals[i] = v
        elif role[0] == "out":
            vals[-1] = "lpx_v_tensor(out)"
    for i, (t, n) in enumerate(args):
        if vals[i] is None:  # the plain function's absent `out`
            vals[i] = "lpx_v_none()"
    spec = API.get(name, {})
    if out_variant and OUT_VARIANTS[name]:
        body.append(f'if (!out) return lpx_error(LPX_EINVAL, "{OUT_VARIANTS[name]}");')
    if len(res) > 1:
        body.append(f"lpx_tensor **lpx_outs[{len(res)}] = {{{', '.join(res)}}};")
        body.append(f"for (int lpx_i = 0; lpx_i < {len(res)}; lpx_i++)")
        body.append("    if (lpx_outs[lpx_i]) *lpx_outs[lpx_i] = NULL;")
        req = spec.get("required")
        if req == "first":
            body.append(f'if (!{res[0]}) return lpx_error(LPX_EINVAL, "{name}: {res[0]} is NULL");')
        elif req == "any":
            if len(res) != 2:
                raise SpecError(f"{name}: required 'any' is written for two results")
            body.append(f"if (!{res[0]} && !{res[1]})")
            body.append(f'    return lpx_error(LPX_EINVAL, "{name}: {res[0]} and {res[1]} are both NULL");')
    for i, (t, n) in enumerate(args):
        if i in counts:
            c = counts[i]
            if len(res) == 1:
                body.append(f"if ({c} < 0) {{")
                body.append(f"    if ({res[0]}) *{res[0]} = NULL;")
                body.append(f'    return lpx_error(LPX_EINVAL, "{name}: {c} %d is negative", {c});')
                body.append("}")
            else:
                body.append(f'if ({c} < 0) return lpx_error(LPX_EINVAL, "{name}: {c} %d is negative", {c});')
    body.append(f"lpx_value lpx_args[{len(args)}] = {{{', '.join(vals)}}};")
    op = f"LPX_OP_{name}"
    if out_variant or not res:
        body.append(f"return lpx__call_ret0({op}, lpx_args, {len(args)});")
    elif len(res) == 1:
        body.append(f"return lpx__call_ret1({op}, lpx_args, {len(args)}, {res[0]});")
    elif spec.get("ret2"):
        if len(res) != 2:
            raise SpecError(f"{name}: ret2 with {len(res)} results")
        body.append(f"return lpx__call_ret2({op}, lpx_args, {len(args)}, {res[0]}, {res[1]});")
    else:
        body.append(f"return lpx__call_retn({op}, lpx_args, {len(args)}, {len(res)}, lpx_outs);")
    for pname in names:
        if pname.startswith("lpx_"):
            raise SpecError(f"lpx_{fn}: parameter '{pname}' is spelled like the wrapper's own names (lpx_*)")
    lines = [wrap(f"lpx_status lpx_{fn}({decl})", "(")] + [wrap("    " + b, "{") for b in body]
    return "\n".join(lines[:1] + ["{"] + lines[1:] + ["}"]) + "\n"


def wrap(line, opener, width=118):
    """line cut after commas to at most width columns, the rest aligned
    one past the first `opener`."""
    if len(line) <= width or opener not in line:
        return line
    indent = " " * (line.index(opener) + 1)
    out, cur = [], ""
    for part in line.split(", "):
        cand = part if not cur else cur + ", " + part
        if len(cand) > width and cur:
            out.append(cur + ",")
            cur = indent + part
        else:
            cur = cand
    return "\n".join(out + [cur])


def generate(ops_def, ops_h, hand, errors, files=None):
    """The generated C file's text; every disagreement appended to errors
    (files: gets every file read, for the depfile)."""
    try:
        rows = read_rows(ops_def, files)
    except OSError as e:
        errors.append(f"ops.def: {e}")
        return None
    protos = read_protos(ops_h)
    hand_text = COMMENT.sub(" ", open(hand).read())
    out = []
    seen = set()
    names_in_def = {r[0] for r in rows}
    for name, _spec, schema in rows:
        try:
            args, nres = parse_schema(name, schema)
        except SpecError as e:
            errors.append(str(e))
            continue
        if NO_OPS_H.match(name):
            if name in protos:
                errors.append(f"ops.h: lpx_{name} is declared, but {name} is listed as having no ops.h function "
                              "(NO_OPS_H in scripts/gen-ops.py)")
            continue
        seen.add(name)
        if name in HAND:
            have = protos.get(name)
            if name in HAND_TYPES:
                want = [(t, None, None) for t in HAND_TYPES[name]]
            else:
                try:
                    want = expected(name, args, nres)
                except SpecError as e:
                    errors.append(str(e))
                    continue
            check_proto(name, want, have, errors)
            if not re.search(r"\blpx_status\s+lpx_" + name + r"\s*\(", hand_text):
                errors.append(f"{hand}: no definition of lpx_{name} (listed in HAND)")
            continue
        variants = [False] + ([True] if name in OUT_VARIANTS else [])
        for ov in variants:
            fn = name + ("_out" if ov else "")
            try:
                want = expected(name, args, nres, ov)
            except SpecError as e:
                errors.append(str(e))
                continue
            have = protos.get(fn)
            seen.add(fn)
            if not check_proto(fn, want, have, errors):
                continue
            if re.search(r"\blpx_status\s+lpx_" + fn + r"\s*\(", hand_text):
                errors.append(f"{hand}: lpx_{fn} is generated; remove the hand-written one")
            try:
                out.append(wrapper(name, args, want, [n for _, n in have], ov))
            except SpecError as e:
                errors.append(str(e))
    for fn in OUT_VARIANTS:
        if fn not in names_in_def:
            errors.append(f"OUT_VARIANTS names '{fn}', which is no ops.def row")
    for fn in list(API) + list(HAND_TYPES):
        if fn not in names_in_def:
            errors.append(f"API/HAND_TYPES name '{fn}', which is no ops.def row")
    for fn in HAND:
        if fn not in names_in_def:
            seen.add(fn)
            if fn not in protos:
                errors.append(f"ops.h: no prototype of lpx_{fn} (listed in HAND)")
            if not re.search(r"\blpx_status\s+lpx_" + fn + r"\s*\(", hand_text):
                errors.append(f"{hand}: no definition of lpx_{fn} (listed in HAND)")
    for fn in protos:
        if fn not in seen:
            errors.append(f"ops.h: lpx_{fn} is neither an ops.def row's function (lpx_<op>, lpx_<op>_out in "
                          "OUT_VARIANTS) nor hand-written (HAND in scripts/gen-ops.py)")
    head = ("/* Generated by scripts/gen-ops.py from include/lpx/ops.def (the schemas)\n"
            " * and include/lpx/ops.h (the prototypes' names): the typed API, one\n"
            " * wrapper per op. Do not edit; see docs/ARCHITECTURE.md, \"The op spec\". */\n")
    return head, out


def emit(path, ops_def, ops_h, hand, head, out):
    util = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(hand)), "api_util.h"),
                           os.path.dirname(os.path.abspath(path)))
    text = head + f'#include "{util}"\n\n' + "\n".join(out)
    old = open(path).read() if os.path.exists(path) else None
    if old != text:
        with open(path, "w") as f:
            f.write(text)


def run(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops-def")
    ap.add_argument("--ops-h")
    ap.add_argument("--hand")
    ap.add_argument("-o", "--output")
    ap.add_argument("--depfile", help="write a make-style depfile of every file read (ops.def's #includes)")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args(argv)
    if a.self_test:
        return self_test()
    if not (a.ops_def and a.ops_h and a.hand):
        ap.error("--ops-def, --ops-h and --hand are required")
    errors = []
    files = []
    got = generate(a.ops_def, a.ops_h, a.hand, errors, files)
    for e in errors:
        print(f"gen-ops: {e}", file=sys.stderr)
    if errors:
        print(f"gen-ops: {len(errors)} disagreement(s) between {a.ops_def}, {a.ops_h} and {a.hand}",
              file=sys.stderr)
        return 1
    head, out = got
    if a.output:
        emit(a.output, a.ops_def, a.ops_h, a.hand, head, out)
        if a.depfile:
            with open(a.depfile, "w") as f:
                f.write(a.output + ": " + " ".join(files + [a.ops_h, a.hand]).replace("\\", "/") + "\n")
    else:
        print(f"gen-ops: {len(out)} wrappers, ops.h agrees with ops.def")
    return 0


# ---- self-test: planted faults must be caught --------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def self_test():
    src = {"def": os.path.join(ROOT, "include/lpx/ops.def"), "h": os.path.join(ROOT, "include/lpx/ops.h"),
           "hand": os.path.join(ROOT, "dispatch/api_hand.c")}
    faults = [
        # (what, file, old, new, a word the error must contain)
        ("a row with no prototype", "def", "/* creation */",
         '/* creation */\nLPX_OP(frob, none, "frob(Tensor x) -> Tensor")', "lpx_frob"),
        ("a prototype removed", "h", "LPX_API lpx_status lpx_softmax(lpx_tensor *x, int64_t dim, lpx_tensor **out);",
         "", "lpx_softmax"),
        ("a parameter type that is not the schema's", "h",
         "lpx_transpose(lpx_tensor *x, int64_t dim0, int64_t dim1,", "lpx_transpose(lpx_tensor *x, int dim0, int64_t dim1,",
         "lpx_transpose"),
        ("parameters swapped", "h", "lpx_slice(lpx_tensor *x, int64_t dim, int64_t start,",
         "lpx_slice(lpx_tensor *x, int64_t start, int64_t dim,", "lpx_slice"),
        ("a result missing", "h", "double eps, lpx_tensor **y, lpx_tensor **rstd);", "double eps, lpx_tensor **y);",
         "lpx_rmsnorm"),
        ("a schema argument added", "def", '"cast(Tensor x, dtype dtype, bool saturate)',
         '"cast(Tensor x, dtype dtype, bool saturate, int extra)', "lpx_cast"),
        ("an _out variant missing", "h", "LPX_API lpx_status lpx_mul_out(lpx_tensor *a, lpx_tensor *b, lpx_tensor *out);",
         "", "lpx_mul_out"),
        ("a prototype with no wrapper", "h", "LPX_BEGIN_DECLS",
         "LPX_BEGIN_DECLS\nLPX_API lpx_status lpx_frob(lpx_tensor *x, lpx_tensor **out);", "lpx_frob"),
        ("a hand-written function missing", "hand", "lpx_status lpx_adamw_(", "lpx_status lpx_adamw_x(", "lpx_adamw_"),
        ("a hand-written op with a prototype off its schema", "h",
         "lpx_tensor *const *exp_avg_sq, int n, double lr", "lpx_tensor *const *exp_avg_sq, int64_t n, double lr",
         "lpx_adamw_"),
    ]
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        inc = os.path.join(tmp, "include")
        os.makedirs(inc)
        for f in os.listdir(os.path.dirname(src["def"])):
            if f.endswith((".def", ".h")):
                shutil.copy(os.path.join(os.path.dirname(src["def"]), f), inc)
        shutil.copy(src["hand"], tmp)
        paths = {"def": os.path.join(inc, "ops.def"), "h": os.path.join(inc, "ops.h"),
                 "hand": os.path.join(tmp, "api_hand.c")}
        clean = []
        if generate(paths["def"], paths["h"], paths["hand"], clean) is None or clean:
            print("not ok: the unplanted tree fails: " + "; ".join(clean))
            return 1
        for what, which, old, new, word in faults:
            orig = open(paths[which]).read()
            if old not in orig:
                print(f"not ok: {what}: the text to plant over is gone: {old!r}")
                failed += 1
                continue
            open(paths[which], "w").write(orig.replace(old, new, 1))
            errors = []
            generate(paths["def"], paths["h"], paths["hand"], errors)
            open(paths[which], "w").write(orig)
            if any(word in e for e in errors):
                print(f"ok: {what}: caught ({next(e for e in errors if word in e)})")
            else:
                print(f"not ok: {what}: not caught ({errors})")
                failed += 1
    print(f"{len(faults) - failed} of {len(faults)} planted faults caught")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))

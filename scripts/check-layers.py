#!/usr/bin/env python3
"""The layering check (docs/ARCHITECTURE.md, "Layers"): dependencies point
down only. Run by `make test`; fails naming every edge that points up or
sideways.

Two readings of the same rule:

1. Includes. Every `#include "..."` of every C, C++ and CUDA file of the
   repository is resolved (next to the file, then the include directories
   meson gives it) and the including and included files are mapped to
   their components; an include must stay inside its component or go to
   one that the includer's component may use (ALLOWED_INCLUDES).

2. Symbols (given a build directory). `nm` reads the objects of liblpx; a
   call or reference from one component to a symbol defined in another
   must go to a lower layer (LAYERS), with one exception: every layer may
   reach the composition root's lazy entry point (lpx_init, through
   lpx_ensure_init), since every public function starts there.

3. Policy (issue 36). The sharding engine's files (ENGINE_FILES) move
   bytes; what a dtype or a device means belongs to kinds, gradient codecs
   (subclasses/dtensor/grad_codec.c), the engine's format file
   (subclasses/dtensor/precision.c) and the backend and comm vtables. So
   outside comments they name no dtype constant (the names of
   include/lpx/dtype.h's enum), no device type but the CPU (LPX_DEVICE_*),
   no backend (a string, identifier or header naming cuda, nccl, mpi,
   simdev or sim).

    scripts/check-layers.py [BUILD_DIR]
    scripts/check-layers.py --self-test   planted edges must be caught
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# liblpx, lowest first. A component may use those of a lower layer; the
# components of one layer may not use each other (sideways).
LAYERS = [
    ["core"],                                   # tensors, dtypes, errors, allocation, backend table, journal
    ["dispatch"],                               # registry, dispatcher, typed API, meta functions, tracing
    ["comm"],                                   # collectives API (traces, names kinds: above dispatch)
    ["backends/cpu", "backends/local"],         # the built-in compute and comm backends
    ["plugins"],                                # the plugin loader (rolls back every layer below)
    ["subclasses/float8", "subclasses/nf4", "subclasses/dtensor", "subclasses/optim_state"],  # kinds; dtensor holds the engine
    ["interop"],                                # DLPack, safetensors (reads kinds through their vtables)
    ["init"],                                   # the composition root
]
RANK = {c: i for i, layer in enumerate(LAYERS) for c in layer}
ROOT_ENTRY = {"lpx_init", "lpx__inited"}        # lpx_ensure_init's targets

# Header-only components anyone below the application may include.
SHARED_HEADERS = {"include", "third_party", "core/numerics"}
# What each component may include besides itself and SHARED_HEADERS.
ALLOWED_INCLUDES = {
    "core": set(),
    "dispatch": {"core"},
    "comm": {"core"},
    "backends/cpu": {"core", "dispatch"},
    "backends/local": {"core"},
    "plugins": {"core"},
    "subclasses/kind_author.h": {"core", "dispatch"},
    "subclasses/float8": {"subclasses/kind_author.h"},
    "subclasses/nf4": {"subclasses/kind_author.h"},
    "subclasses/dtensor": {"subclasses/kind_author.h"},
    "subclasses/optim_state": {"subclasses/kind_author.h"},
    "interop": {"core", "dispatch"},
    "init": {"core"},
    # outside liblpx: plugins see the public headers only (and their own
    # files: plugins/mx/cuda is part of the MX plugin)
    "backends/cuda": set(),
    "backends/nccl": set(),
    "backends/mpi": set(),
    "plugins/mx": set(),
    "tools/lpx": {"tools/conformance"},
    "tools/train": {"tools/lpx"},
    # `lpx plan` sizes the model lpx train runs (its geometry and lpx mem's memory model)
    "tools/plan": {"tools/lpx", "tools/train"},
    "tools/conformance": set(),
    "examples": set(),
    "bench": set(),
    # the tests may look at anything (they check internals)
    "tests": None,
}


def component(rel):
    """The component a repository path belongs to."""
    p = rel.split("/")
    if rel == "subclasses/kind_author.h":
        return rel
    if p[0] == "core" and len(p) > 2 and p[1] == "numerics":
        return "core/numerics"
    if p[0] == "plugins" and len(p) > 2 and p[1] == "mx":
        return "plugins/mx"
    if p[0] in ("backends", "subclasses", "tools") and len(p) > 2:
        return p[0] + "/" + p[1]
    return p[0]


def sources():
    """The C, C++ and CUDA files of the tree: git's list (tracked and
    untracked, not ignored) in a checkout, else a walk that leaves out build
    directories and the test venv (a tarball, a scratch copy)."""
    exts = (".c", ".h", ".cu", ".cuh", ".cpp")
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.split()
        return [f for f in out if f.endswith(exts) and not f.startswith("build")]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for dp, dirs, fs in os.walk(ROOT):
            rel = os.path.relpath(dp, ROOT)
            dirs[:] = [d for d in dirs if not d.startswith((".", "build")) and d != "gpu-stage"]
            files += [os.path.normpath(os.path.join(rel, f)) for f in fs if f.endswith(exts)]
        return files


INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
# include directories meson adds, per component (besides include/ and dlpack)
EXTRA_DIRS = {"plugins/mx": ["plugins/mx", "core/numerics"], "tools/lpx": ["tools/conformance"],
              "tests": ["tests", "."], "backends/cuda": ["core/numerics"], "backends/cpu": ["."]}


def read_source(f):
    return open(os.path.join(ROOT, f), errors="replace").read()


def check_includes(errors, files=None, read=read_source):
    for f in files if files is not None else sources():
        comp = component(f)
        allowed = ALLOWED_INCLUDES.get(comp, set())
        text = read(f)
        for inc in INCLUDE.findall(text):
            dirs = [os.path.dirname(f), "include", "third_party/dlpack/include"] + EXTRA_DIRS.get(comp, [])
            target = None
            for d in dirs:
                cand = os.path.normpath(os.path.join(d, inc))
                if os.path.exists(os.path.join(ROOT, cand)):
                    target = cand
                    break
            if target is None:
                continue  # a generated or system header
            tc = component(target)
            if tc == comp or tc in SHARED_HEADERS or allowed is None or tc in allowed:
                continue
            errors.append(f'include: {f} ({comp}) includes "{inc}" = {target} ({tc})')


def object_component(obj):
    """liblpx.so.0.1.0.p/subclasses_float8_float8_kind.c.o -> subclasses/float8"""
    name = os.path.basename(obj)
    name = name[:-len(".c.o")] if name.endswith(".c.o") else name
    # a generated source (meson-generated_.._dispatch_ops_api.c.o, the typed
    # API scripts/gen-ops.py writes): its name says its component
    if name.startswith("meson-generated_"):
        name = name[len("meson-generated_"):]
        while name.startswith(".._"):
            name = name[len(".._"):]
    for comp in sorted(RANK, key=len, reverse=True):
        prefix = comp.replace("/", "_") + "_"
        if name.startswith(prefix):
            return comp
    return None


def read_objects(build, errors):
    """(defined: symbol -> component, wanted: [(component, symbol, object)])"""
    objs = glob.glob(os.path.join(build, "liblpx.so.*.p", "*.o"))
    if not objs:
        errors.append(f"symbols: no liblpx objects under {build} (build it first)")
    defined, wanted = {}, []
    for o in objs:
        comp = object_component(o)
        if comp is None:
            errors.append(f"symbols: {os.path.basename(o)} belongs to no layer: add its directory to LAYERS")
            continue
        out = subprocess.run(["nm", "-g", o], check=True, stdout=subprocess.PIPE, text=True).stdout
        for line in out.splitlines():
            f = line.split()
            if len(f) == 3 and f[1] in "TDBRVWC":
                defined[f[2]] = comp
            elif len(f) == 2 and f[0] == "U":
                wanted.append((comp, f[1], os.path.basename(o)))
    return defined, wanted


def check_symbols(defined, wanted, errors):
    edges = 0
    for comp, sym, obj in wanted:
        target = defined.get(sym)
        if target is None or target == comp:
            continue
        edges += 1
        if sym in ROOT_ENTRY:
            continue
        if RANK[target] >= RANK[comp]:
            how = "up" if RANK[target] > RANK[comp] else "sideways"
            errors.append(f"symbol: {obj} ({comp}) uses {sym} of {target}: points {how}")
    return edges


# The sharding engine: its files name no dtype and no backend (3. above).
ENGINE_FILES = ("subclasses/dtensor/fsdp*.c", "subclasses/dtensor/fsdp_internal.h")
BACKEND_NAMES = ("cuda", "nccl", "mpi", "simdev", "sim")


def dtype_constants():
    """The dtype constants: the names of the enum after `typedef int32_t
    lpx_dtype;` in include/lpx/dtype.h (not its counts)."""
    text = read_source("include/lpx/dtype.h")
    enum = re.search(r"typedef\s+int32_t\s+lpx_dtype;\s*enum\s*\{(.*?)\}", text, re.S)
    names = re.findall(r"\b(LPX_[A-Z0-9_]+)\s*=", enum.group(1)) if enum else []
    return [n for n in names if not n.startswith("LPX_DTYPE_")]


COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def strip_comments(text):
    """Comments become blanks (line numbers stay)."""
    return COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def check_policy(errors, files=None, read=read_source, dtypes=None):
    if files is None:
        files = sorted(f for pat in ENGINE_FILES for f in glob.glob(os.path.join(ROOT, pat)))
        files = [os.path.relpath(f, ROOT) for f in files]
    dtypes = dtype_constants() if dtypes is None else dtypes
    dt = re.compile(r"\b(" + "|".join(map(re.escape, dtypes)) + r")\b") if dtypes else None
    dev = re.compile(r"\bLPX_DEVICE_(?!CPU\b)[A-Z0-9_]+\b")
    names = "|".join(BACKEND_NAMES)
    ident = re.compile(r"\b(?:lpx_(?:%s)_\w*|LPX_(?:%s)_\w*)" % (names, "|".join(n.upper() for n in BACKEND_NAMES)))
    string = re.compile(r'"(?:[^"\\\n]|\\.)*"')
    word = re.compile(r"(?<![A-Za-z0-9_])(?:lpx-)?(?:%s)(?![A-Za-z0-9_])" % names, re.I)
    for f in files:
        for no, line in enumerate(strip_comments(read(f)).splitlines(), 1):
            what = []
            if dt:
                what += ["dtype constant " + m for m in dt.findall(line)]
            what += ["device type " + m for m in dev.findall(line)]
            what += ["backend symbol " + m for m in ident.findall(line)]
            for lit in string.findall(line):
                what += ["backend name %s in %s" % (m, lit) for m in word.findall(lit)]
            for w in what:
                errors.append(f"policy: {f}:{no} (the sharding engine) names {w}")


def self_test():
    """The check catches what it is for: planted edges of each class."""
    planted = {
        "core/tensor.c": '#include "../dispatch/dispatch_internal.h"\n',          # up
        "subclasses/dtensor/fsdp.c": '#include "../float8/float8_internal.h"\n',  # sideways: the engine and a kind
        "tools/lpx/main.c": '#include "../../tests/check.h"\n',                  # a tool building from tests/
        "plugins/mx/mx_kind.c": '#include "../../core/lpx_internal.h"\n',        # a plugin's private reach
        "dispatch/dispatch.c": '#include "../core/lpx_internal.h"\n',            # fine: down
    }
    errors = []
    check_includes(errors, list(planted), planted.get)
    defined = {"lpx_dispatch": "dispatch", "lpx_float8_weight_is": "subclasses/float8", "lpx_init": "init",
               "lpx_malloc": "core"}
    wanted = [("core", "lpx_dispatch", "core_tensor.c.o"),                       # up
              ("subclasses/dtensor", "lpx_float8_weight_is", "fsdp.c.o"),        # sideways
              ("dispatch", "lpx_init", "dispatch_dispatch.c.o"),                 # the root entry: allowed
              ("dispatch", "lpx_malloc", "dispatch_dispatch.c.o")]               # down
    check_symbols(defined, wanted, errors)
    # the engine naming dtypes and backends (comments may)
    engine = {
        "subclasses/dtensor/fsdp_planted.c":
            "/* LPX_F8E5M2, \"nccl\", lpx_cuda_host_alloc: comments may */\n"
            "static int a = LPX_F8E5M2;\n"                                  # a dtype constant
            "static int b = LPX_DEVICE_SIM, c = LPX_DEVICE_CPU;\n"           # a device type (the CPU is fine)
            "static const char *d = \"nccl\";\n"                           # a backend by name
            "static void *e = lpx_cuda_host_alloc; // \"cuda\" here is fine\n"  # a backend's symbol
            "static const char *g = \"simulated, local shard\";\n",         # fine: no backend word
    }
    check_policy(errors, list(engine), engine.get, dtypes=["LPX_F32", "LPX_F8E5M2"])
    want = ["core/tensor.c", "subclasses/dtensor/fsdp.c", "tools/lpx/main.c", "plugins/mx/mx_kind.c",
            "uses lpx_dispatch", "uses lpx_float8_weight_is", "fsdp_planted.c:2 (the sharding engine) names dtype",
            "fsdp_planted.c:3 (the sharding engine) names device type LPX_DEVICE_SIM",
            "fsdp_planted.c:4 (the sharding engine) names backend name nccl",
            "fsdp_planted.c:5 (the sharding engine) names backend symbol lpx_cuda_host_alloc"]
    missing = [w for w in want if not any(w in e for e in errors)]
    extra = [e for e in errors if "dispatch/dispatch.c" in e or "lpx_init" in e or "lpx_malloc" in e
             or "fsdp_planted.c:1 " in e or "fsdp_planted.c:6 " in e or "LPX_DEVICE_CPU" in e]
    for e in errors:
        print("  planted:", e)
    if missing or extra or len(errors) != len(want):
        print(f"check-layers self-test FAILED: missed {missing}, wrongly flagged {extra}")
        return 1
    print(f"check-layers self-test: all {len(want)} planted edges caught, the allowed ones passed")
    return 0


def main():
    if sys.argv[1:2] == ["--self-test"]:
        return self_test()
    errors = []
    check_includes(errors)
    check_policy(errors)
    edges = None
    if len(sys.argv) > 1:
        defined, wanted = read_objects(sys.argv[1], errors)
        edges = check_symbols(defined, wanted, errors)
    for e in sorted(set(errors)):
        print(e)
    what = "includes, the engine's policy" + (f" and {edges} cross-component symbol references of liblpx"
                                              if edges is not None else "")
    if errors:
        print(f"check-layers: {len(set(errors))} dependencies point up or sideways or the engine names a "
              f"dtype or backend ({what} read)")
        return 1
    print(f"check-layers: every dependency points down ({what} read)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

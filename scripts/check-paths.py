#!/usr/bin/env python3
"""Every repository path the docs and the source comments name exists
(the meson test `doc_paths`; docs/TESTING.md, "Docs that cannot go
stale").

Scanned: README.md and docs/*.md (all their text), and the comments of
every .c, .h, .cu, .cuh and .py file and of meson.build, Makefile and
shell scripts. A token is taken for a repository path when it contains a
'/' and starts with a top-level directory of the repository (`core/`,
`tools/train/`, ...), or when it ends in a source extension (`.c`, `.h`,
`.cu`, `.py`, `.md`, ...). It resolves when it exists relative to the
repository root, to the naming file's directory, to include/ (the public
headers: `lpx/ops.h`), or, for a bare file name, anywhere in the
repository; a markdown section titled by a directory (ARCHITECTURE.md's
"## core/") resolves its bare names there first, and fails one that
exists only elsewhere. `*` and `<name>` are wildcards (`core/numerics/*.h`,
`tests/fuzz/corpus/<target>/`).

    scripts/check-paths.py [SRC_ROOT]

Prints each path that does not resolve with where it is named, and exits
1 when there is one. Deliberate non-paths (system headers, files outside
the repository, examples of names) go in ALLOW below, each with why.
"""
import fnmatch
import os
import re
import sys

EXTS = (".c", ".h", ".cu", ".cuh", ".py", ".md", ".def", ".sh", ".build")
SKIP_DIRS = {".git", "subprojects", "third_party", "node_modules", "__pycache__"}
# Not repository files, named on purpose.
ALLOW = {
    # system and toolkit headers
    "stdio.h", "stdlib.h", "string.h", "stdint.h", "stddef.h", "stdbool.h", "stdatomic.h", "math.h", "float.h",
    "limits.h", "errno.h", "pthread.h", "dlfcn.h", "unistd.h", "fcntl.h", "assert.h", "time.h", "inttypes.h",
    "threads.h", "ffi.h", "uthash.h", "cblas.h", "openblas/cblas.h", "cjson/cJSON.h", "cJSON.h", "mpi.h",
    "nccl.h", "cuda.h", "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cublasLt.h", "cudnn.h",
    "cudnn_frontend.h", "cuda_runtime_api.h", "stdarg.h", "signal.h", "sys/stat.h", "sys/types.h", "sys/mman.h",
    "sys/wait.h", "sys/time.h", "sys/resource.h", "sys/sysinfo.h", "sys/file.h", "Python.h", "numpy/arrayobject.h",
    "dlpack.h", "dlpack/dlpack.h", "immintrin.h", "sched.h", "dirent.h", "libgen.h", "setjmp.h", "ctype.h",
    "sys/random.h", "sys/syscall.h", "linux/limits.h", "sanitizer/asan_interface.h", "sanitizer/lsan_interface.h",
    # Python modules and files of other projects
    "setup.py", "__init__.py", "conftest.py", "modeling_llama.py", "torch/nn/functional.py",
    "torchao/float8/float8_linear.py", "torch/distributed/fsdp/_fully_shard/_fsdp_param.py",
    "torch/distributed/_composable/fsdp/_fsdp_collectives.py", "torch/_tensor.py",
    "float8_training_tensor.py", "fsdp_utils.py", "fsdp.py", "float8_linear.py", "config.py",
    "float8_scaling_utils.py", "float8_tensor.py", "ir.py", "nf4tensor.py", "_fsdp_param.py",
    "_fsdp_collectives.py", "distributed_utils.py", "float8_ops.py", "quant_utils.py",
    # placeholders in usage lines
    "FILE.md", "INPUT.md", "OUTPUT.c",
    # the example plugin's file name in docs/PLUGINS.md (the reader's file)
    "lpx-int8row.c",
    # build outputs named by their place in the build directory (dispatch_ops_api.c:
    # the typed API scripts/gen-ops.py writes there)
    "bench/torch_add_out", "tools/lpx/lpx", "dispatch_ops_api.c",
    # the Python binding's declarations, generated beside liblpx (meson.build)
    "liblpx_cffi.py",
    # Random123's known-answer file (tests/test_creation.c cites its source)
    "tests/kat_vectors",
    # paths inside gpu-stage/ (scripts/gpu-stage.sh copies bench/gpu/*.py
    # and run.sh to gpu-stage/bench/ and writes run-gpu.sh there)
    "run-gpu.sh", "bench/run.sh", "bench/train_ref.py", "bench/train_compare.py",
}
# built, not committed: a path with one of these extensions is an output
OUTPUT_EXTS = (".so", ".o", ".a", ".log", ".svg", ".csv", ".whl")
TOKEN = re.compile(r"[A-Za-z0-9_.\-/*<>]+")


def repo_files(root):
    files, dirs = set(), set()
    for d, subdirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        subdirs[:] = [s for s in subdirs if s not in SKIP_DIRS and not s.startswith(("build", "."))
                      or (rel == "." and s == ".ci")]
        if rel != ".":
            dirs.add(rel.replace(os.sep, "/"))
        for n in names:
            files.add(os.path.normpath(os.path.join(rel, n)).replace(os.sep, "/"))
    # third_party is real: its paths exist, it is just not scanned
    for d, _, names in os.walk(os.path.join(root, "third_party")):
        rel = os.path.relpath(d, root).replace(os.sep, "/")
        dirs.add(rel)
        files.update(rel + "/" + n for n in names)
    return files, dirs


def comments(path, text):
    """(line, comment text) of a source file."""
    if path.endswith((".c", ".h", ".cu", ".cuh")):
        for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.S):
            line = text.count("\n", 0, m.start()) + 1
            for k, part in enumerate(m.group(0).split("\n")):
                yield line + k, part
    elif path.endswith(".py"):  # comments and docstrings (tokenize: not a '#' in a string)
        import io
        import tokenize
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.COMMENT:
                    yield tok.start[0], tok.string
                elif tok.type == tokenize.STRING and re.match(r"[rRbBuU]?(\"\"\"|''')", tok.string):
                    for k, part in enumerate(tok.string.split("\n")):
                        yield tok.start[0] + k, part
        except (tokenize.TokenError, SyntaxError):
            pass
    else:  # '#' comments: meson, Makefile, shell
        for k, l in enumerate(text.split("\n")):
            i = l.find("#")
            if i >= 0 and not l.lstrip().startswith("#!"):
                yield k + 1, l[i:]


def candidates(text, tops, before=""):
    for m in TOKEN.finditer(text):
        t = m.group(0).strip(".-")
        if "://" in text[max(0, m.start() - 8):m.end()] or t.startswith("/"):
            continue
        t = t.rstrip(":")
        if ".." in t or t.endswith(OUTPUT_EXTS) or t.startswith("gpu-stage/"):
            continue
        # history: "split from the former cuda_gemm.c", "(was fsdp.c)"
        if re.search(r"\b(former|formerly|was|renamed from)\s*$", before + " " + text[:m.start()]):
            continue
        first = t.split("/")[0]
        if ("/" in t and first in tops) or t.endswith(EXTS):
            if text[m.end():m.end() + 1] == "(" or t.startswith(("lpx.", "lpx_")) and t.count(".") > 1:
                continue  # a call, or a dotted Python name (lpx.torch.x.py)
            yield t


def resolves(tok, where_dir, section, files, dirs, root):
    pat = re.sub(r"<[^>]*>", "*", tok).rstrip("/")
    if not pat:
        return True
    is_glob = "*" in pat

    def exists(p):
        p = os.path.normpath(p).replace(os.sep, "/")
        if p.startswith("../"):
            return False
        if is_glob:
            return any(fnmatch.fnmatch(f, p) for f in files) or any(fnmatch.fnmatch(d, p) for d in dirs)
        return p in files or p in dirs or os.path.lexists(os.path.join(root, p))

    bare = "/" not in pat
    if bare and section:
        if exists(section + "/" + pat) or any(exists(d + "/" + pat) for d in dirs if d.startswith(section + "/")):
            return True
        if any(f.endswith("/" + pat) or f == pat for f in files):
            return False  # the section's directory does not hold it
    for base in ("", where_dir, "include", "tools", "python"):
        if exists(os.path.join(base, pat) if base else pat):
            return True
    if bare:
        return any(fnmatch.fnmatch(f.rsplit("/", 1)[-1], pat) for f in files)
    return False


def self_test():
    """Plants stale paths in a scratch repository: each must be caught, and
    nothing else."""
    import tempfile
    with tempfile.TemporaryDirectory() as root:
        def put(rel, text):
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        put("core/tensor.c", "/* see core/alloc.c and comm/comm.c (the former core/old.c) */\n"
                             "#include <stdio.h>\nint x; // stdio.h, core/gone.c\n")
        put("core/alloc.c", "")
        put("comm/comm.c", "/* lpx_internal.h: core/comm/comm.c */\n")
        put("init/init.c", "")
        put("docs/A.md", "# A\n`core/tensor.c`, [B](B.md), `core/numerics/*.h`\n## core/\n"
                         "- (`init.c`) (`alloc.c`)\n## Other\n`init.c`, docs/GONE.md\n")
        put("README.md", "`docs/A.md` `tools/x/<name>.c`\n")
        put("Makefile", "# scripts/nope.sh\n")
        got = sorted(m.split(": ", 1)[1].split(" ")[0] for m in scan(root))
        want = sorted(["core/gone.c", "lpx_internal.h", "core/comm/comm.c", "init.c", "B.md",
                       "core/numerics/*.h", "docs/GONE.md", "tools/x/<name>.c", "scripts/nope.sh"])
        if got != want:
            print(f"check-paths self-test: caught {got}, expected {want}")
            return 1
    print(f"check-paths self-test: all {len(want)} planted stale paths caught, nothing else")
    return 0


def main():
    if sys.argv[1:2] == ["--self-test"]:
        return self_test()
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    missing = scan(root)
    for m in missing:
        print(m)
    print(f"check-paths: {len(missing)} path(s) named in the docs and source comments missing")
    return 1 if missing else 0


def scan(root):
    files, dirs = repo_files(root)
    tops = {d for d in dirs if "/" not in d}
    sources = sorted(f for f in files if not f.startswith("third_party/") and
                     (f.endswith((".c", ".h", ".cu", ".cuh", ".py", ".sh"))
                      or f.rsplit("/", 1)[-1] in ("meson.build", "Makefile") or f == ".ci/run"))
    docs = ["README.md"] + sorted(f for f in files if f.startswith("docs/") and f.endswith(".md"))
    missing = []
    n = 0
    for rel in docs + sources:
        path = os.path.join(root, rel)
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        where_dir = os.path.dirname(rel)
        if rel.endswith(".md"):
            section = None
            lines = []
            for k, l in enumerate(text.split("\n")):
                h = re.match(r"^#+\s+`?([A-Za-z0-9_./-]+?)/?`?(\s|$)", l)
                if l.startswith("#"):
                    section = h.group(1) if h and h.group(1) in dirs else None
                lines.append((k + 1, l, section))
        else:
            lines = [(k, l, None) for k, l in comments(rel, text)]
        prev = ""
        for line, l, section in lines:
            # "former" at the end of the previous line counts too
            body = re.sub(r"^\s*(\*|//|#)?\s*", "", l)
            for tok in candidates(body, tops, prev):
                n += 1
                if tok in ALLOW or tok.rsplit("/", 1)[-1] in ALLOW and "/" not in tok:
                    continue
                if not resolves(tok, where_dir, section, files, dirs, root):
                    missing.append(f"{rel}:{line}: {tok}" + (f" (under the section {section}/)" if section else ""))
            prev = body
    print(f"check-paths: {n} path(s) named in {len(docs)} docs and {len(sources)} sources")
    return missing


if __name__ == "__main__":
    sys.exit(main())

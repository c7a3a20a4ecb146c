#!/usr/bin/env python3
"""Compiles every C snippet of README.md and docs/*.md against the public
headers, so no example in the docs drifts from the API (a meson test,
`doc_snippets`; docs/TESTING.md).

A fenced ```c block is compiled as it stands when it is a whole program
or plugin (it defines a function: `int main(` or `lpx_plugin_init(`);
otherwise it is a fragment, compiled as the body of a function after
`#include "lpx/lpx.h"`. A fragment states what it takes from its context
in a first comment line `/* given: TYPE NAME; TYPE NAME; ... */` (those
become the function's parameters), and the headers it needs beyond lpx.h
with `#include` lines at its top. Warnings are errors, unused variables
excepted (a fragment shows calls, not a program).

    scripts/doc-snippets.py CC SRC_ROOT [FILE.md ...]
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

FLAGS = ["-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
         "-Wno-unused-parameter", "-Wno-unused-function", "-fsyntax-only"]


def blocks(path):
    text = open(path, encoding="utf-8").read()
    for m in re.finditer(r"^```c\n(.*?)^```", text, flags=re.S | re.M):
        yield text[:m.start()].count("\n") + 2, m.group(1)


def as_unit(code):
    """The translation unit a block is compiled as."""
    if re.search(r"^\s*(int\s+main|LPX_PLUGIN_EXPORT\s+lpx_status\s+lpx_plugin_init)\s*\(", code, re.M) and "{" in code:
        return code
    if re.search(r"^\s*LPX_PLUGIN_EXPORT", code, re.M):
        # the plugin entry points' declarations
        return '#include <stddef.h>\n#include "lpx/lpx.h"\n#include "lpx/plugin.h"\n' + code
    includes = "".join(l + "\n" for l in code.splitlines() if l.startswith("#include"))
    body = "\n".join(l for l in code.splitlines() if not l.startswith("#include"))
    params = "void"
    m = re.match(r"\s*/\*\s*given:\s*(.*?)\*/", body, flags=re.S)
    if m:
        decls = [d.strip() for d in m.group(1).split(";") if d.strip()]
        params = ", ".join(decls) or "void"
    return ('#include <stdio.h>\n#include "lpx/lpx.h"\n' + includes +
            f"void doc_snippet({params});\nvoid doc_snippet({params})\n{{\n" + body + "\n}\n")


def main():
    cc, root = sys.argv[1], sys.argv[2]
    files = sys.argv[3:] or [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    inc = ["-I" + os.path.join(root, "include"), "-I" + os.path.join(root, "third_party", "dlpack", "include")]
    failed = n = 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            for line, code in blocks(path):
                n += 1
                src = os.path.join(tmp, f"snippet{n}.c")
                open(src, "w").write(as_unit(code))
                r = subprocess.run([cc] + FLAGS + inc + ["-c", src], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
                where = f"{os.path.relpath(path, root)}:{line}"
                if r.returncode:
                    failed += 1
                    print(f"FAIL {where}\n" + "".join("    " + l + "\n" for l in r.stdout.splitlines()[:12]))
                else:
                    print(f"ok   {where}")
    passed = n - failed
    print(f"{n} cases: {passed} passed, {failed} failed, 0 skipped")
    print(f"lpx-cases: passed={passed} failed={failed} skipped=0 gpu=0")
    return 1 if failed or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Keeps the command output quoted in the docs equal to what the commands
print now: every marked block of README.md and docs/*.md is run again and
compared (--check, the meson tests `docs_sync` and `docs_sync_demo`) or
rewritten (--update). docs/TESTING.md, "Docs that cannot go stale".

The convention. A fenced block right after the HTML comment
`<!-- lpx-doc -->` (invisible once rendered) holds commands, each on a
line starting with `$ `, each followed by its exact output (stdout and
stderr; trailing spaces ignored):

    <!-- lpx-doc -->
    ```
    $ lpx mem --model llama3-70b --recipe bf16 --ranks 8,64,512
    model: dim 8192, layers 80, ...
    ```

A command runs with `sh -c` in the repository root, `lpx` being the
built one (--lpx, default build/tools/lpx/lpx), so a pipe (`| grep
'device total'`) shows a part of an output. Words after `lpx-doc:` in
the comment change that:

    slow          runs only with --slow (the demo: minutes); the meson
                  test `docs_sync_demo` (suite docs-slow, not part of
                  `make test`) checks those blocks
    from=REGEX    the block shows the output from the first line matching
    until=REGEX   REGEX up to (not including) the first line after it
                  matching REGEX; trailing blank lines dropped
    ignore=REGEX  text matching REGEX (tok/s, times, this machine's
                  memory) is masked on both sides before comparing; --update
                  writes the new run's text
    rc=N          the command's expected exit status (default 0)

Values with spaces are quoted as in a shell (shlex).

    scripts/docs-sync.py --check|--update [--slow] [--lpx PATH] [--root DIR] [FILE.md ...]

--check exits 1 listing every block that differs (with a diff) and the
command that regenerates it; --update rewrites the blocks in place.
"""
import argparse
import difflib
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

MARK = re.compile(r"^<!--\s*lpx-doc(?::(.*?))?\s*-->\s*$")


def parse_opts(text, where):
    opts = {"slow": False, "from": None, "until": None, "ignore": None, "rc": 0}
    for word in shlex.split(text or ""):
        key, eq, val = word.partition("=")
        if key == "slow" and not eq:
            opts["slow"] = True
        elif key in ("from", "until", "ignore") and eq:
            opts[key] = re.compile(val)
        elif key == "rc" and eq and val.lstrip("-").isdigit():
            opts["rc"] = int(val)
        else:
            sys.exit(f"{where}: lpx-doc: unknown option '{word}'")
    return opts


def find_blocks(lines, path):
    """(marker line index, opts, first body line, end fence line) for each
    marked block."""
    out = []
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if not m:
            i += 1
            continue
        where = f"{path}:{i + 1}"
        opts = parse_opts(m.group(1), where)
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            sys.exit(f"{where}: lpx-doc: the next line must open a fenced block")
        j = i + 2
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if j >= len(lines):
            sys.exit(f"{where}: lpx-doc: the block is not closed")
        if not any(l.startswith("$ ") for l in lines[i + 2:j]):
            sys.exit(f"{where}: lpx-doc: the block names no command (a line '$ CMD')")
        out.append((i, opts, i + 2, j))
        i = j + 1
    return out


def commands(body):
    """[(command, [doc output lines])] of a block's lines."""
    cmds = []
    for line in body:
        if line.startswith("$ "):
            cmds.append((line[2:], []))
        elif cmds:
            cmds[-1][1].append(line)
    return cmds


def run(cmd, opts, root, lpx_dir, where):
    env = dict(os.environ, PATH=lpx_dir + os.pathsep + os.environ.get("PATH", ""), OPENBLAS_NUM_THREADS="1",
               LC_ALL="C")
    p = subprocess.run(["sh", "-c", cmd], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, errors="replace")
    if p.returncode != opts["rc"]:
        sys.stderr.write(p.stdout[-3000:])
        sys.exit(f"{where}: `{cmd}` exited {p.returncode} (expected {opts['rc']})")
    out = [l.rstrip() for l in p.stdout.splitlines()]
    if opts["from"]:
        k = next((n for n, l in enumerate(out) if opts["from"].search(l)), None)
        if k is None:
            sys.exit(f"{where}: no line of `{cmd}` matches from={opts['from'].pattern}")
        out = out[k:]
    if opts["until"]:
        k = next((n for n, l in enumerate(out) if n > 0 and opts["until"].search(l)), len(out))
        out = out[:k]
    while out and not out[-1]:
        out.pop()
    return out


def masked(lines, opts):
    lines = [l.rstrip() for l in lines]
    while lines and not lines[-1]:
        lines.pop()
    if opts["ignore"]:
        lines = [opts["ignore"].sub("<ignored>", l) for l in lines]
    return lines


def self_test():
    """A scratch doc with a current block, a stale one, one whose volatile
    text is ignored, a stale slow one and a wrong exit status: --check must
    flag exactly the stale one (and the slow one with --slow), --update
    must fix them, an unexpected exit status must fail and rc=N accept N
    (the meson test docs_sync_self_test)."""
    with tempfile.TemporaryDirectory() as tmp:
        lpx = os.path.join(tmp, "lpx-fake")
        with open(lpx, "w") as f:
            f.write('#!/bin/sh\nprintf "header\\ntotal %s\\n" "$2"\n[ "$1" = fail ] && exit 3\nexit 0\n')
        os.chmod(lpx, 0o755)
        doc = os.path.join(tmp, "doc.md")

        def block(mark, body):
            return f"<!-- lpx-doc{mark} -->\n```\n{body}\n```\n\n"
        with open(doc, "w") as f:
            f.write("# t\n\n" + block("", "$ lpx mem 5\nheader\ntotal 5")
                    + block("", "$ lpx mem 6 | grep total\ntotal 7")
                    + block(': "ignore=took [0-9]+ s"', "$ lpx t 1 | grep total; echo took 99 s\ntotal 1\ntook 12 s")
                    + block(": slow", "$ lpx slow 8\nheader\ntotal 9"))

        def run(*args):
            p = subprocess.run([sys.executable, os.path.abspath(__file__), *args, "--lpx", lpx, "--root", tmp, doc],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            return p.returncode, p.stdout
        checks = []
        rc, out = run("--check")
        checks.append(("stale block caught", rc == 1 and "doc.md:10:" in out and out.count("differs") == 1))
        rc, out = run("--check", "--slow")
        checks.append(("slow block caught with --slow", rc == 1 and out.count("differs") == 2))
        rc, out = run("--update", "--slow")
        text = open(doc).read()
        checks.append(("--update rewrites", rc == 0 and "total 6" in text and "total 9" not in text
                       and "took 99 s" in text))
        rc, out = run("--check", "--slow")
        checks.append(("clean after --update", rc == 0 and "0 stale" in out))
        with open(doc, "a") as f:
            f.write(block("", "$ lpx fail 1\nheader\ntotal 1"))
        rc, out = run("--check")
        checks.append(("wrong exit status fails", rc != 0 and "exited 3" in out))
        with open(doc, "w") as f:
            f.write(block(": rc=3", "$ lpx fail 2\nheader\ntotal 2"))
        rc, out = run("--check")
        checks.append(("rc=N expects that status", rc == 0 and "1 block(s) checked, 0 stale" in out))
    bad = [name for name, ok in checks if not ok]
    for name, ok in checks:
        print(("ok   " if ok else "FAIL ") + name)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--update", action="store_true")
    ap.add_argument("--slow", action="store_true", help="also the slow blocks (the demo)")
    ap.add_argument("--only-slow", action="store_true", help="only the slow blocks")
    ap.add_argument("--lpx", help="the lpx executable (default ROOT/build/tools/lpx/lpx)")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("files", nargs="*")
    ap.add_argument("--self-test", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    lpx = os.path.abspath(a.lpx or os.path.join(root, "build", "tools", "lpx", "lpx"))
    if not os.access(lpx, os.X_OK):
        sys.exit(f"docs-sync: no lpx at {lpx} (build it: make build-lpx, or pass --lpx)")
    # `lpx` on PATH: a scratch directory holding only a link to the built one
    shim = tempfile.mkdtemp(prefix="docs-sync-")
    os.symlink(lpx, os.path.join(shim, "lpx"))
    try:
        return sync(a, root, shim)
    finally:
        shutil.rmtree(shim, ignore_errors=True)


def sync(a, root, shim):
    files = a.files or [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    stale = []
    nblocks = nskipped = 0
    for path in files:
        rel = os.path.relpath(path, root)
        lines = open(path, encoding="utf-8").read().split("\n")
        changed = False
        # bottom-up, so that rewriting a block keeps the indices above valid
        for mark, opts, start, end in reversed(find_blocks(lines, rel)):
            if (opts["slow"] and not (a.slow or a.only_slow)) or (a.only_slow and not opts["slow"]):
                nskipped += 1
                continue
            nblocks += 1
            where = f"{rel}:{mark + 1}"
            new = []
            for cmd, doc_out in commands(lines[start:end]):
                out = run(cmd, opts, root, shim, where)
                new += ["$ " + cmd] + out
                if masked(doc_out, opts) != masked(out, opts):
                    stale.append((where, cmd, masked(doc_out, opts), masked(out, opts)))
            if a.update and new != lines[start:end]:
                lines[start:end] = new
                changed = True
        if changed:
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(lines))
            print(f"docs-sync: updated {rel}")
    if a.check:
        for where, cmd, doc, out in stale:
            print(f"{where}: the output of `{cmd}` differs from the doc:")
            sys.stdout.writelines(l + "\n" for l in difflib.unified_diff(doc, out, "doc", "now", lineterm="", n=1))
        print(f"docs-sync: {nblocks} block(s) checked, {len(stale)} stale, {nskipped} skipped"
              + (" (slow: --slow)" if nskipped and not a.slow else ""))
        if stale:
            print("regenerate: scripts/docs-sync.py --update" + (" --slow" if a.slow or a.only_slow else "")
                  + " (then review the prose around the blocks)")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

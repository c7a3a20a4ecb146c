#!/usr/bin/env python3
"""Sums the suite's results over build dirs and prints the closing line
`N passed, N failed, N skipped` that CI reads. It counts CASES, not
programs: every program built on tests/check.h (and the Python binding's
tests) ends its output with

    lpx-cases: passed=P failed=F skipped=S gpu=G

(G of the S skips are for hardware the machine lacks: no GPU, too few
GPUs); a program that prints no such line (a fuzz target, one that could
not start) counts as one case with meson's verdict. A program that meson
saw fail (a crash, a sanitizer report at exit, a timeout) while its line
says nothing failed counts one more failed case: no failure is lost.

Skips are listed with their reasons. With CI=true a skip for any reason
other than missing hardware (a Python package, mpirun) is a failure: CI
installs every dependency (scripts/ensure-deps.sh test), so such a skip
means a test silently stopped running.

Exit 1 if anything failed or no case ran at all."""
import json
import os
import re
import sys

LINE = re.compile(r"^lpx-cases: passed=(\d+) failed=(\d+) skipped=(\d+) gpu=(\d+)\s*$", re.M)
SKIP = re.compile(r"^skip (.+?) \((gpu|dependency)\): (.*)$", re.M)

in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
passed = failed = skipped = 0
gpu_reasons, dep_reasons, failures = {}, {}, []


def note(table, reason, where):
    table.setdefault(reason, []).append(where)


for build in sys.argv[1:]:
    path = os.path.join(build, "meson-logs", "testlog.json")
    if not os.path.exists(path):
        print(f"{build}: no test log (did the build fail?)")
        failed += 1
        continue
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            name, verdict = r.get("name", "?"), r.get("result", "")
            where = f"{build}: {name}"
            out = r.get("stdout") or ""
            counts = LINE.findall(out)
            if name.split(" / ")[0].endswith(":harness"):  # meson names tests "project:suite / name"
                counts = []                    # the harness's own tests: one case each, by verdict
                verdict = "OK" if verdict == "EXPECTEDFAIL" else verdict
            if not counts:
                if verdict == "OK":
                    passed += 1
                elif verdict == "SKIP":
                    skipped += 1
                    why = (out.strip().splitlines() or ["(no reason printed)"])[-1]
                    note(dep_reasons, why, where)
                else:
                    failed += 1
                    failures.append(f"{where}: {verdict}")
                continue
            # several lines: a launcher whose ranks each ran the cases (mpirun)
            p = sum(int(c[0]) for c in counts)
            fl = sum(int(c[1]) for c in counts)
            s = sum(int(c[2]) for c in counts)
            g = sum(int(c[3]) for c in counts)
            if verdict not in ("OK", "SKIP") and fl == 0:
                fl = 1  # meson saw it fail after the cases (crash, leak report, timeout)
            if fl:
                failures.append(f"{where}: {fl} failed ({verdict})")
            passed, failed, skipped = passed + p, failed + fl, skipped + s
            for case, cls, why in SKIP.findall(out):
                note(gpu_reasons if cls == "gpu" else dep_reasons, why.strip(), f"{where}: {case}")
            if len(SKIP.findall(out)) < s:    # skips counted without a reason line
                note(dep_reasons, "(no reason printed)", where)
            del g

for title, table in (("skipped for lack of hardware", gpu_reasons), ("skipped for a missing dependency", dep_reasons)):
    for why, wheres in sorted(table.items()):
        print(f"{title} ({len(wheres)}): {why}")
        for w in wheres[:3]:
            print(f"    {w}")
        if len(wheres) > 3:
            print(f"    ... and {len(wheres) - 3} more")
for f in failures:
    print(f"failed: {f}")
if in_ci and dep_reasons:
    n = sum(len(w) for w in dep_reasons.values())
    print(f"CI: {n} case(s) skipped for a missing dependency that scripts/ensure-deps.sh should have installed: "
          "counted as failures")
    failed += n
    skipped -= n
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or passed + failed == 0 else 0)

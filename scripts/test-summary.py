#!/usr/bin/env python3
"""Sums meson's test results over build dirs and prints the closing line
`N passed, N failed, N skipped` that CI reads. Exit 1 if anything failed
or if no test ran at all."""
import json
import os
import sys

passed = failed = skipped = 0
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
            r = json.loads(line).get("result", "")
            if r in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif r == "SKIP":
                skipped += 1
            else:
                failed += 1
ran = passed + failed
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed or ran == 0 else 0)

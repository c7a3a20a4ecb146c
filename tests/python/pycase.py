"""The Python tests' harness (tests/python/test_*.py): cases run at
definition and pass, fail (with the traceback) or skip with a reason;
finish() prints the summary line the suite reads (tests/check.h prints the
same) and exits 1 on a failure, 77 when everything skipped."""
import os
import sys

_counts = {"passed": 0, "failed": 0, "skipped": 0}
# LPX_TEST_PY_NUMPY_ONLY=1 (the system interpreter's run, tests/meson.build):
# cases that need packages besides numpy are not part of this configuration,
# so they are neither run nor counted; every other run needs them all, and a
# missing one is a dependency skip (which fails CI, scripts/test-summary.py).
NUMPY_ONLY = os.environ.get("LPX_TEST_PY_NUMPY_ONLY") == "1"


class Skip(Exception):
    """Raised by a case that cannot run here; carries the reason."""


class SkipGpu(Skip):
    """A case that needs hardware this machine lacks (a GPU skip, which
    does not fail CI)."""


def needs(module):
    """Imports `module` for a case, or skips the case naming the package."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError:
        raise Skip(f"{module} is not importable by {sys.executable} "
                   "(scripts/ensure-deps.sh test installs it)") from None


_gpu_skips = 0


def case(fn=None, *, extra=()):
    """Runs a case at definition: ok, FAIL (with the traceback) or skip
    (with the reason). `extra`: packages besides numpy the case imports."""
    global _gpu_skips
    if fn is None:
        return lambda f: case(f, extra=extra)
    if extra and NUMPY_ONLY:
        return fn
    try:
        fn()
        print("ok  ", fn.__name__)
        _counts["passed"] += 1
    except SkipGpu as e:
        print(f"skip {fn.__name__} (gpu): {e}")
        _counts["skipped"] += 1
        _gpu_skips += 1
    except Skip as e:
        print(f"skip {fn.__name__} (dependency): {e}")
        _counts["skipped"] += 1
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        print("FAIL", fn.__name__, e)
        _counts["failed"] += 1
    return fn


def finish():
    p, f, s = _counts["passed"], _counts["failed"], _counts["skipped"]
    print(f"{p + f + s} cases: {p} passed, {f} failed, {s} skipped")
    print(f"lpx-cases: passed={p} failed={f} skipped={s} gpu={_gpu_skips}")
    sys.exit(1 if f else (77 if s and not p else 0))

"""`pip install ./python` on a clean virtual environment, then `import lpx`
with no environment variable (issue: "a wheel ... works without any
environment variable"): the wheel builds liblpx and its plugins with meson
(meson-python) and bundles them. argv[1]: the repository, argv[2]: a
scratch directory (the build directory's wheel-test/). Needs the package
index (meson-python, meson, ninja, numpy, ml_dtypes are fetched by pip)."""
import os
import shutil
import subprocess
import sys
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pycase import case, finish  # noqa: E402

src, scratch = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
venv = os.path.join(scratch, "venv")
py = os.path.join(venv, "bin", "python")
# the user's situation: nothing points at a build
clean_env = {k: v for k, v in os.environ.items()
             if k not in ("LPX_LIBRARY", "LPX_PLUGIN_PATH", "PYTHONPATH", "LD_LIBRARY_PATH")}
state = {}


def run(cmd, timeout, cwd=None):
    r = subprocess.run(cmd, cwd=cwd or scratch, env=clean_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if r.returncode:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout[-4000:]}")
    return r.stdout


@case
def test_pip_install_into_clean_venv():
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    run([sys.executable, "-m", "venv", venv], 300)
    run([py, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], 600)
    run([py, "-m", "pip", "install", "--quiet", os.path.join(src, "python")], 1500)
    state["installed"] = True


@case
def test_import_without_environment():
    assert state.get("installed"), "the install failed (above)"
    check = textwrap.dedent("""
        import os, lpx, numpy as np, ml_dtypes
        lib = lpx.load_library()._name
        assert "site-packages" in lib and lib.endswith("_lib/liblpx.so.0"), lib
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        t = lpx.from_numpy(a)
        assert np.array_equal((t + t).numpy(), 2 * a)
        b = lpx.cast(t, "bf16").numpy()
        assert b.dtype == ml_dtypes.bfloat16 and np.array_equal(b.astype(np.float32), a)
        q = lpx.float8_quantize(a, role="input")
        assert np.allclose(lpx.float8_dequantize(q).numpy(), a, rtol=0.07)
        plugins = lpx.bundled_plugins()
        assert plugins.get("lpx-mx.so") == "loaded", plugins
        for name, how in plugins.items():   # the GPU ones decline politely without a GPU
            assert how == "loaded" or "declined" in how, (name, how)
        print("plugins:", plugins)
    """)
    out = run([py, "-c", check], 120, cwd=scratch)
    print(out.strip())


finish()

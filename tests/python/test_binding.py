"""Tests of the Python binding (python/lpx) with real clients: numpy and,
when importable, PyTorch through DLPack. Run by meson with an interpreter
that has numpy; exits 77 (skip) when numpy is missing or under ASan."""
import gc
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

if os.environ.get("LPX_TEST_ASAN"):
    print("skip: the Python binding is not run under ASan (the interpreter is not instrumented)")
    sys.exit(77)
try:
    import numpy as np
except ImportError:
    print("skip: numpy is not importable by", sys.executable)
    sys.exit(77)

import lpx  # noqa: E402

failures = 0


def case(fn):
    global failures
    try:
        fn()
        print("ok  ", fn.__name__)
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        print("FAIL", fn.__name__, e)
        failures += 1
    return fn


@case
def test_numpy_roundtrip_zero_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = lpx.from_numpy(a)
    assert t.shape == (3, 4) and t.dtype == "f32" and t.strides == (4, 1)
    v = t.numpy()
    assert np.shares_memory(v, a), "numpy -> lpx -> numpy copied"
    a[0, 0] = 42
    assert v[0, 0] == 42
    # strided numpy input keeps its strides
    s = lpx.from_numpy(a[:, ::2])
    assert s.strides == (4, 2) and (s.numpy() == a[:, ::2]).all()
    for dt in (np.float16, np.int8, np.uint8, np.int32, np.int64):
        x = (np.arange(6) % 5).astype(dt)
        assert (lpx.from_numpy(x).numpy() == x).all()


@case
def test_ops():
    a = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32)
    ta, tb = lpx.from_numpy(a), lpx.from_numpy(b)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose((ta + ta).numpy(), a + a)
    h = lpx.cast(ta, "f16")
    assert h.dtype == "f16"
    np.testing.assert_array_equal(h.numpy(), a.astype(np.float16))
    bf = lpx.cast(ta, "bf16")
    assert bf.dtype == "bf16"
    back = lpx.cast(bf, "f32").numpy()
    assert np.abs(back - a).max() <= np.abs(a).max() / 128


@case
def test_kinds():
    w = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
    q8 = lpx.float8_quantize(w)
    assert q8.kind == "float8"
    d8 = lpx.float8_dequantize(q8).numpy()
    assert np.abs(d8 - w).max() <= 0.07 * np.abs(w).max()
    q4 = lpx.nf4_quantize(w)
    assert q4.kind == "nf4"
    d4 = lpx.nf4_dequantize(q4).numpy()
    assert np.abs(d4 - w).max() <= 0.5 * np.abs(w).max()
    try:
        q4.numpy()
        raise AssertionError("a kind tensor exposed a dense buffer")
    except lpx.LpxError:
        pass


@case
def test_errors():
    a = lpx.from_numpy(np.zeros((2, 3), np.float32))
    b = lpx.from_numpy(np.zeros((4, 5), np.float32))
    try:
        lpx.matmul(a, b)
        raise AssertionError("no error")
    except lpx.LpxError as e:
        assert e.status < 0 and "matmul" in str(e), str(e)
    try:
        lpx.cast(a, "nosuchdtype")
        raise AssertionError("no error")
    except lpx.LpxError:
        pass
    assert "f8e4m3fn" in lpx.dtype_names()


@case
def test_ownership():
    a = np.ones(1000, np.float32)
    t = lpx.from_numpy(a)
    v = t.numpy()
    del t
    gc.collect()
    assert v.sum() == 1000  # the numpy view keeps the lpx tensor alive
    t = lpx.from_numpy(a)
    assert t.refcount() == 1
    c = t.__dlpack__()
    assert t.refcount() == 2
    del c  # unconsumed capsule: its destructor runs the deleter
    gc.collect()
    assert t.refcount() == 1


@case
def test_numpy_from_dlpack():
    if not hasattr(np, "from_dlpack"):
        print("  (numpy has no from_dlpack)")
        return
    t = lpx.from_numpy(np.arange(10, dtype=np.float32) * 2)
    v = np.from_dlpack(t)
    assert v.__array_interface__["data"][0] == t.__array_interface__["data"][0], "copied"
    assert (v == np.arange(10) * 2).all()


@case
def test_torch_dlpack():
    try:
        import torch
        import torch.utils.dlpack as tdl
    except ImportError:
        print("  skip: torch is not importable")
        return
    # torch -> lpx, strided, zero-copy
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    xt = x.t()
    t = lpx.from_dlpack(tdl.to_dlpack(xt))
    assert t.shape == (6, 4) and t.strides == (1, 6), (t.shape, t.strides)
    assert t.numpy().__array_interface__["data"][0] == xt.data_ptr()
    x[0, 1] = 100.0
    assert t.numpy()[1, 0] == 100.0
    # bf16 and int64 too
    b = torch.randn(5, 3).to(torch.bfloat16)
    tb = lpx.from_dlpack(tdl.to_dlpack(b))
    assert tb.dtype == "bf16"
    np.testing.assert_array_equal(lpx.cast(tb, "f32").numpy(), b.float().numpy())
    # lpx -> torch, zero-copy, values and strides
    a = lpx.from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4))
    y = tdl.from_dlpack(a)
    assert y.data_ptr() == a.__array_interface__["data"][0]
    assert y.shape == (3, 4) and y.stride() == (4, 1) and float(y[2, 3]) == 11.0
    s = lpx.matmul(a, lpx.from_numpy(np.ones((4, 2), np.float32)))
    ys = tdl.from_dlpack(s)
    assert torch.equal(ys, torch.arange(12, dtype=torch.float32).reshape(3, 4) @ torch.ones(4, 2))
    del a, s
    gc.collect()
    assert float(y.sum()) == 66.0  # torch's reference keeps lpx memory alive


print(f"{failures} failed")
sys.exit(1 if failures else 0)

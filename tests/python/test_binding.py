"""Tests of the Python binding (python/lpx) with real clients: numpy,
PyTorch through DLPack and the safetensors package. Run by meson with the
project's test interpreter (.test-venv, made by scripts/ensure-deps.sh test)
and with the system's python3 (numpy only: LPX_TEST_PY_NUMPY_ONLY=1); exits
77 (skip) when numpy is missing or under ASan."""
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

from pycase import NUMPY_ONLY, Skip, case, finish, needs  # noqa: E402,F401


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


@case(extra=("torch",))
def test_torch_dlpack():
    torch = needs("torch")
    tdl = needs("torch.utils.dlpack")
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



# ---- DLPack: versioned and legacy capsules ------------------------------------


def _np_version():
    return tuple(int(p) for p in np.__version__.split(".")[:2])


@case
def test_dlpack_capsule_versions():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = lpx.from_numpy(a)
    ptr = t.__array_interface__["data"][0]
    v = t.__dlpack__(max_version=(1, 0))
    assert lpx.capsule_name(v) == "dltensor_versioned", lpx.capsule_name(v)
    assert lpx.capsule_name(t.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    old = t.__dlpack__()
    assert lpx.capsule_name(old) == "dltensor"
    assert lpx.capsule_name(t.__dlpack__(max_version=(0, 8))) == "dltensor"
    # lpx imports both, zero-copy, and marks them consumed
    for cap, name in ((v, "dltensor_versioned"), (old, "dltensor")):
        u = lpx.from_dlpack(cap)
        assert lpx.capsule_name(cap) is None, f"{name} not marked used"
        assert u.__array_interface__["data"][0] == ptr and u.shape == (3, 4)
        del u
    gc.collect()
    base = t.refcount()
    unused = t.__dlpack__(max_version=(1, 0))
    assert t.refcount() == base + 1
    del unused   # an unconsumed versioned capsule gives its reference back
    gc.collect()
    assert t.refcount() == base
    # copy=True exports a copy
    c = lpx.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=True))
    assert c.__array_interface__["data"][0] != ptr and (c.numpy() == a).all()
    try:
        t.__dlpack__(dl_device=(2, 0))
        raise AssertionError("exported to a CUDA device")
    except BufferError:
        pass


class _Spy:
    """Forwards __dlpack__ and records the consumer's keywords."""

    def __init__(self, t):
        self.t, self.kw = t, None

    def __dlpack__(self, **kw):
        self.kw = kw
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@case
def test_numpy_consumes_versioned():
    if not hasattr(np, "from_dlpack"):
        print("  (numpy has no from_dlpack)")
        return
    t = lpx.from_numpy(np.arange(6, dtype=np.float32) + 1)
    spy = _Spy(t)
    v = np.from_dlpack(spy)
    assert v.__array_interface__["data"][0] == t.__array_interface__["data"][0], "copied"
    assert (v == np.arange(6) + 1).all()
    mv = (spy.kw or {}).get("max_version")
    if _np_version() >= (2, 1):
        assert mv is not None and tuple(mv) >= (1, 0), spy.kw
        print(f"  numpy {np.__version__} asked for max_version={tuple(mv)}: versioned capsule")
    else:
        print(f"  numpy {np.__version__} asked for {spy.kw}: legacy capsule")


@case
def test_from_dlpack_numpy_both_protocols():
    a = np.arange(20, dtype=np.int64).reshape(4, 5)[:, 1:4]   # strided
    t = lpx.from_dlpack(a)   # versioned when numpy >= 2.1 produces it, else legacy
    assert t.shape == (4, 3) and t.strides == (5, 1)
    assert t.__array_interface__["data"][0] == a.__array_interface__["data"][0]
    a[0, 0] = -7
    assert t.numpy()[0, 0] == -7
    if _np_version() >= (2, 1):
        cap = a.__dlpack__(max_version=(1, 0))
        assert lpx.capsule_name(cap) == "dltensor_versioned"
        assert lpx.from_dlpack(cap).shape == (4, 3)
        # a read-only array crosses as a read-only tensor, and back
        r = np.arange(4, dtype=np.float32)
        r.flags.writeable = False
        tr = lpx.from_numpy(r)
        assert tr.readonly and tr.__array_interface__["data"][0] == r.__array_interface__["data"][0]
        back = np.from_dlpack(tr)
        assert not back.flags.writeable
        try:
            tr.__dlpack__()
            raise AssertionError("a read-only tensor left as a legacy capsule")
        except BufferError:
            pass
    legacy = a.__dlpack__()
    assert lpx.capsule_name(legacy) == "dltensor"
    assert lpx.from_dlpack(legacy).shape == (4, 3)


class _CudaProducer:
    """Says it lives on CUDA device 1 and records the handshake's keywords;
    hands over a host capsule (so this runs without a GPU)."""

    def __init__(self, a, legacy=False):
        self.a, self.kw, self.legacy = a, None, legacy

    def __dlpack_device__(self):
        return (2, 1)   # kDLCUDA

    def __dlpack__(self, **kw):
        if self.legacy and "max_version" in kw:
            raise TypeError("a pre-1.0 producer")
        self.kw = kw
        return self.a.__dlpack__()


@case
def test_from_dlpack_passes_consumer_stream():
    """issue 34 item 4: lpx is the consumer, so on CUDA it passes its own
    stream in the handshake (__dlpack__(stream=...)), and the producer
    orders its work before lpx's; on the CPU it passes none (numpy refuses
    one)."""
    a = np.arange(6, dtype=np.float32)
    asked = []
    real = lpx.cuda_stream
    lpx.cuda_stream = lambda d=0: asked.append(d) or 0x7f00 + d   # lpx-cuda's stream, stood in for
    try:
        p = _CudaProducer(a)
        t = lpx.from_dlpack(p)
        assert p.kw.get("stream") == 0x7f01 and asked == [1], (p.kw, asked)
        assert (t.numpy() == a).all()
        p = _CudaProducer(a)
        lpx.from_dlpack(p, stream=0x1234)            # the caller's own stream
        assert p.kw.get("stream") == 0x1234 and asked == [1], (p.kw, asked)
        p = _CudaProducer(a, legacy=True)            # the legacy protocol keeps the stream
        lpx.from_dlpack(p)
        assert p.kw == {"stream": 0x7f01}, p.kw
        spy = _Spy(lpx.from_numpy(a))                # a host producer: no stream
        lpx.from_dlpack(spy)
        assert "stream" not in spy.kw, spy.kw
        lpx.from_dlpack(a)                           # numpy itself (it refuses a stream)
    finally:
        lpx.cuda_stream = real
    # without lpx-cuda loaded there is no lpx stream to order: none passed
    def not_loaded(d=0):
        raise lpx.LpxLoadError(-1, "lpx-cuda.so is not loaded")
    lpx.cuda_stream = not_loaded
    try:
        p = _CudaProducer(a)
        lpx.from_dlpack(p)
        assert "stream" not in p.kw, p.kw
    finally:
        lpx.cuda_stream = real


# ---- Float8 -------------------------------------------------------------------------


def _e4m3fn_table():
    """float32 value of every f8e4m3fn code, from the OCP spec (bias 7)."""
    out = np.empty(256, np.float32)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = m / 8 * 2.0 ** -6
        else:
            v = (1 + m / 8) * 2.0 ** (e - 7)
        out[c] = -v if s else v
    return out


@case
def test_float8_roundtrip():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 96)) * 3).astype(np.float32)
    q, stats = lpx.float8_quantize(x, return_stats=True)
    info = lpx.float8_info(q)
    assert q.kind == "float8" and info["fp8"] == "f8e4m3fn" and info["granularity"] == "tensorwise"
    inner = q.inner()
    assert list(inner) == ["data", "scale", "scale_inv"], list(inner)
    amax = float(np.abs(x).max())
    assert stats["amax"] == amax
    scale = inner["scale"].numpy()
    assert scale.shape == () and scale == np.float32(448.0 / amax)
    sinv = inner["scale_inv"].numpy()
    assert sinv == np.float32(1.0 / float(scale))
    codes = inner["data"].numpy().view(np.uint8)
    ref = _e4m3fn_table()[codes] * sinv   # decode(q) * scale_inv in f32
    d = lpx.float8_dequantize(q).numpy()
    assert d.dtype == np.float32 and np.array_equal(d.view(np.uint32), ref.view(np.uint32)), "not bit-exact"
    # the codes are what lpx's own cast of x * scale gives
    xs = lpx.from_numpy(x * scale)
    assert np.array_equal(lpx.cast(xs, "f8e4m3fn", True).numpy().view(np.uint8), codes)
    assert np.abs(d - x).max() <= amax * 2 ** -4
    # rowwise, power-of-2 scales
    qr = lpx.float8_quantize(x, rowwise=True, pow2_scale=True, role="weight")
    assert lpx.float8_info(qr)["granularity"] == "axiswise" and lpx.float8_info(qr)["role"] == "weight"
    sr = qr.inner()["scale"].numpy()
    assert sr.shape == (64, 1) and np.all(np.log2(sr) == np.round(np.log2(sr)))
    dr = lpx.float8_dequantize(qr).numpy()
    ref = _e4m3fn_table()[qr.inner()["data"].numpy().view(np.uint8)] * qr.inner()["scale_inv"].numpy()
    assert np.array_equal(dr, ref)
    # f16 in, bf16 logical through cast; dequantize to another dtype
    h = lpx.float8_quantize(x.astype(np.float16))
    assert h.dtype == "f16" and lpx.float8_dequantize(h).dtype == "f16"
    assert lpx.float8_dequantize(h, "f32").dtype == "f32"


@case
def test_float8_linear():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    w = rng.standard_normal((48, 64)).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    g = rng.standard_normal((32, 48)).astype(np.float32)
    for recipe in ("tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed"):
        layer = lpx.Float8Linear(w, b, recipe)
        out = layer(x).numpy()
        gx, gw, gb = (t.numpy() for t in layer.backward(g))
        layer.close()
        ref = x @ w.T + b

        def sqnr(a, r):
            return 10 * np.log10((r ** 2).sum() / ((a - r) ** 2).sum())
        if recipe != "delayed":   # delayed starts from scale 1: the first step is coarse by design
            assert sqnr(out, ref) >= 18, (recipe, sqnr(out, ref))
            assert sqnr(gx, g @ w) >= 17 and sqnr(gw, g.T @ x) >= 17, recipe
        assert out.shape == (32, 48) and gx.shape == (32, 64) and gw.shape == (48, 64)
        np.testing.assert_allclose(gb, g.sum(0), rtol=1e-5, atol=1e-4)
    # the fp8 GEMM itself against its dequantized operands
    qx = lpx.float8_quantize(x, role="input")
    qw = lpx.float8_quantize(w, role="weight")
    out = lpx.float8_linear(qx, qw).numpy()
    ref = lpx.float8_dequantize(qx).numpy() @ lpx.float8_dequantize(qw).numpy().T
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4)


# ---- NF4 / QLoRA ------------------------------------------------------------------


@case
def test_nf4_linear_and_qlora():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((128, 64)).astype(np.float32)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    q = lpx.nf4_quantize(w)
    info = lpx.nf4_info(q)
    # 8192 elements = 128 blocks: the default scaler block is 128 (the largest
    # count up to 256 dividing the block count), so nothing is padded
    assert info["block"] == 64 and info["scaler_block"] == 128 and info["numel"] == 128 * 64 and info["whole"]
    assert info["padded"] == 128 * 64, info
    wd = lpx.nf4_dequantize(q).numpy()
    np.testing.assert_allclose(lpx.nf4_linear(x, q).numpy(), x @ wd.T, rtol=1e-4, atol=1e-4)
    g = rng.standard_normal((5, 128)).astype(np.float32)
    np.testing.assert_allclose(lpx.nf4_linear_backward(g, q).numpy(), g @ wd, rtol=1e-4, atol=1e-4)
    a = (rng.standard_normal((8, 64)) * 0.1).astype(np.float32)
    bb = (rng.standard_normal((128, 8)) * 0.1).astype(np.float32)
    bias = rng.standard_normal(128).astype(np.float32)
    out, xa = lpx.qlora_linear(x, q, a, bb, bias=bias, alpha=16, return_xa=True)
    ref = x @ wd.T + bias + 2.0 * (x @ a.T) @ bb.T
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)
    gx, ga, gb = lpx.qlora_linear_backward(g, x, q, a, bb, xa=xa, alpha=16)
    np.testing.assert_allclose(gb.numpy(), 2.0 * g.T @ (x @ a.T), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ga.numpy(), (2.0 * g @ bb).T @ x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gx.numpy(), g @ wd + (2.0 * g @ bb) @ a, rtol=1e-4, atol=1e-4)


def _bytes(t):
    return np.ascontiguousarray(t.numpy()).tobytes()


def _same_tensor(a, b):
    assert a.kind == b.kind and a.dtype == b.dtype and a.shape == b.shape, (a, b)
    if a.kind:
        assert a.meta() == b.meta()
        ia, ib = a.inner(), b.inner()
        assert list(ia) == list(ib)
        for k in ia:
            _same_tensor(ia[k], ib[k])
    else:
        assert _bytes(a) == _bytes(b)


@case
def test_nf4_model_save_load_bitexact():
    import tempfile
    rng = np.random.default_rng(6)
    model = {
        "layers.0.w": lpx.nf4_quantize(lpx.cast(lpx.from_numpy(rng.standard_normal((128, 64)).astype(np.float32)),
                                                "bf16")),
        "layers.1.w": lpx.nf4_quantize(rng.standard_normal((64, 200)).astype(np.float32), block=32, scaler_block=8),
        "layers.1.f8": lpx.float8_quantize(rng.standard_normal((16, 32)).astype(np.float32), rowwise=True),
        "norm": lpx.from_numpy(rng.standard_normal(64).astype(np.float32)),
        "ids": lpx.from_numpy(np.arange(7, dtype=np.int64)),
    }
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        lpx.save_file(model, path, metadata={"step": "42"})
        back = lpx.load_file(path)
        assert set(back) == set(model)
        for k in model:
            _same_tensor(model[k], back[k])
        for k in ("layers.0.w", "layers.1.w"):
            assert _bytes(lpx.nf4_dequantize(model[k])) == _bytes(lpx.nf4_dequantize(back[k]))
        with lpx.safe_open(path) as f:
            assert f.metadata() == {"step": "42"}
            assert f.kind_of("layers.0.w") == "nf4" and f.kind_of("norm") is None
            q = f.get_tensor("norm", quantize="float8")
            assert q.kind == "float8"
        try:
            lpx.safe_open(os.path.join(d, "missing.safetensors"))
            raise AssertionError("opened a missing file")
        except lpx.LpxError as e:
            assert "missing.safetensors" in e.message and e.status == -14, str(e)


@case(extra=("safetensors",))
def test_safetensors_python_package_interop():
    safetensors = needs("safetensors")
    st_load = needs("safetensors.numpy").load_file
    st_save = needs("safetensors.numpy").save_file
    import tempfile
    rng = np.random.default_rng(7)
    arrays = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((4,)).astype(np.float16),
        "i64": np.arange(-3, 9, dtype=np.int64).reshape(3, 4),
        "i32": np.arange(6, dtype=np.int32),
        "u8": np.arange(256, dtype=np.uint8),
        "i8": np.arange(-5, 5, dtype=np.int8),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }
    with tempfile.TemporaryDirectory() as d:
        # written by the safetensors package, read by lpx
        p1 = os.path.join(d, "from_st.safetensors")
        st_save(arrays, p1, metadata={"format": "np", "who": "safetensors " + safetensors.__version__})
        got = lpx.load_file(p1)
        assert set(got) == set(arrays)
        for k, a in arrays.items():
            t = got[k]
            assert t.shape == a.shape and t.numpy().dtype == a.dtype, (k, t, a.dtype)
            assert t.numpy().tobytes() == a.tobytes(), k
        with lpx.safe_open(p1) as f:
            assert f.metadata()["format"] == "np"
        # written by lpx (a strided input is written contiguous), read by the package
        p2 = os.path.join(d, "from_lpx.safetensors")
        tensors = {k: lpx.from_numpy(a) for k, a in arrays.items()}
        tensors["strided"] = lpx.from_numpy(np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2])
        lpx.save_file(tensors, p2, metadata={"format": "pt"})
        back = st_load(p2)
        assert set(back) == set(tensors)
        for k, a in arrays.items():
            assert back[k].dtype == a.dtype and back[k].shape == a.shape and back[k].tobytes() == a.tobytes(), k
        assert (back["strided"] == np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]).all()
        with safetensors.safe_open(p2, framework="np") as f:
            assert f.metadata() == {"format": "pt"}
        # an nf4 model is a valid file for the package too: inner tensors as U8/I8/F32
        p3 = os.path.join(d, "nf4.safetensors")
        lpx.save_file({"w": lpx.nf4_quantize(arrays["f32"].repeat(64, 0))}, p3)
        inner = st_load(p3)
        assert sorted(inner) == ["w::nf4::codes", "w::nf4::factors", "w::nf4::mean", "w::nf4::qscalers"], sorted(inner)
        assert inner["w::nf4::codes"].dtype == np.uint8 and inner["w::nf4::qscalers"].dtype == np.int8


@case
def test_errors_carry_lpx_message():
    x = np.ones((4, 64), np.float32)
    x[2, 5] = np.nan
    try:
        lpx.nf4_quantize(x)
        raise AssertionError("quantized a NaN")
    except lpx.LpxError as e:
        assert e.status == -16 and e.message and "nf4" in e.message.lower(), str(e)
    try:
        lpx.float8_quantize(x)
        raise AssertionError("dynamic scaling of a NaN")
    except lpx.LpxError as e:
        assert e.status == -16 and e.message, str(e)
    try:
        lpx.float8_quantize(np.ones((2, 2), np.float32), fp8="nosuch")
        raise AssertionError("no error")
    except lpx.LpxError as e:
        assert "nosuch" in e.message


# ---- the papercuts a new user found (the reliability issue) --------------------


@case
def test_refused_capsule_neither_leaks_nor_raises_from_its_destructor():
    t = lpx.cast(lpx.from_numpy(np.ones((2, 3), np.float32)), "bf16")
    before = t.refcount()
    for _ in range(50):
        try:
            np.from_dlpack(t)   # numpy has no bfloat16: it refuses the capsule
        except Exception as e:  # noqa: BLE001
            assert not isinstance(e, SystemError), e   # the consumer's own error surfaces
    gc.collect()
    assert t.refcount() == before, (before, t.refcount())


@case(extra=("ml_dtypes",))
def test_ml_dtypes_in_and_out():
    ml_dtypes = needs("ml_dtypes")
    t = lpx.cast(lpx.from_numpy(np.array([1.5, -2.0, 3.25], np.float32)), "bf16")
    a = t.numpy()
    assert a.dtype == ml_dtypes.bfloat16 and a.astype(np.float32).tolist() == [1.5, -2.0, 3.25]
    q = lpx.cast(t, ml_dtypes.float8_e4m3fn)          # a numpy dtype where a name goes
    assert q.dtype == "f8e4m3fn" and q.numpy().dtype == ml_dtypes.float8_e4m3fn
    back = lpx.from_numpy(a)
    assert back.dtype == "bf16" and back.numpy().astype(np.float32).tolist() == [1.5, -2.0, 3.25]


@case
def test_dtypes_and_names_checked():
    assert lpx.cast(lpx.from_numpy(np.ones(2, np.float32)), np.float16).dtype == "f16"
    try:
        lpx.from_numpy(np.ones(3))
        raise AssertionError("float64 taken silently")
    except lpx.LpxTypeError as e:
        assert "dtype=" in e.message
    assert lpx.from_numpy(np.ones(3), dtype="f32").dtype == "f32"      # explicit
    for bad in ({"fp8": "f32"}, {"role": "bogus"}):
        try:
            lpx.float8_quantize(np.ones((2, 2), np.float32), **bad)
            raise AssertionError(f"{bad} accepted")
        except lpx.LpxValueError as e:
            assert e.message and isinstance(e, lpx.LpxError)
    c = lpx.from_numpy(np.ones(2, np.float32))
    c.close()
    try:
        c.shape
        raise AssertionError("a closed tensor answered")
    except lpx.LpxError as e:
        assert "closed" in e.message


@case
def test_operators_indexing_len():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = lpx.from_numpy(a)
    np.testing.assert_array_equal((t - t).numpy(), a - a)
    np.testing.assert_array_equal((t * t).numpy(), a * a)
    np.testing.assert_array_equal((t / (t + 1)).numpy(), a / (a + 1))
    np.testing.assert_array_equal((2 * t - 1).numpy(), 2 * a - 1)
    np.testing.assert_array_equal((-t).numpy(), -a)
    np.testing.assert_array_equal((t / 4).numpy(), a / 4)
    assert len(t) == 3
    for key in (1, -1, (1, 2), slice(1, None), (slice(None), slice(None, None, 2)), (Ellipsis, 0),
                (slice(-2, None), slice(1, 3))):
        v = t[key]
        np.testing.assert_array_equal(v.numpy(), a[key], err_msg=str(key))
    v = t[:, 1]                      # a view: writes through numpy show in it
    a[2, 1] = 100.0
    assert v.numpy()[2] == 100.0
    for bad, exc in ((7, lpx.LpxIndexError), ((0, 0, 0), lpx.LpxIndexError), ("x", lpx.LpxTypeError),
                     (slice(None, None, -1), lpx.LpxValueError)):
        try:
            t[bad]
            raise AssertionError(f"t[{bad!r}] accepted")
        except exc:
            pass
    try:
        len(t[0, 0])
        raise AssertionError("len() of a 0-d tensor")
    except lpx.LpxTypeError:
        pass



# ---- memory the binding hands out, and handles after close (issue 33) ----------

_PYDIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


def _child(code):
    """Runs `code` in a fresh interpreter (numpy and lpx imported), so that a
    crash (SIGSEGV, SIGBUS) fails the case instead of killing the runner;
    asserts exit 0 and returns its stdout."""
    import subprocess
    import textwrap
    src = f"import gc, os, sys\nsys.path.insert(0, {_PYDIR!r})\nimport numpy as np\nimport lpx\n"
    r = subprocess.run([sys.executable, "-c", src + textwrap.dedent(code)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, (f"child exited {r.returncode}"
                               f"{' (signal ' + str(-r.returncode) + ')' if r.returncode < 0 else ''}: "
                               f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


# 64 MiB: above malloc's largest mmap threshold, so freed memory is unmapped
# and a read of it crashes rather than reading stale bytes
_BIG = 16 << 20


@case
def test_views_outlive_close():
    """numpy(), np.asarray, an index view, a DLPack capsule and inner()
    taken before close() keep the memory: reading them after close() (the
    handle gone, collected) sees the values; the segfault of issue 33."""
    cases = {
        "numpy()": "a = t.numpy()",
        "np.asarray": "a = np.asarray(t)",
        "index view": "a = t[1:].numpy()[-1:]",
        "DLPack capsule": "cap = t.__dlpack__(); t.close(); a = lpx.from_dlpack(cap).numpy()",
        "bf16 numpy()": "t = lpx.cast(t, 'bf16'); a = t.numpy()",
    }
    for what, take in cases.items():
        out = _child(f"""
            t = lpx.from_numpy(np.full({_BIG}, 3.0, np.float32), copy=True)
            {take}
            t.close()
            del t
            gc.collect()
            junk = [np.ones({_BIG}, np.float32) * 7 for _ in range(2)]  # reuse what was freed
            print(float((a.view(np.uint8) if a.dtype.kind == "V" else a).ravel()[-1]))
        """)
        assert out.split()[-1] in ("3.0", "64.0"), f"{what}: {out}"   # bf16 3.0: high byte 0x40
    out = _child(f"""
        q = lpx.nf4_quantize(np.ones(({_BIG // 1024}, 1024), np.float32))
        codes = q.inner()["codes"].numpy()
        want = codes[-1]
        q.close()
        del q
        gc.collect()
        print(codes[-1] == want)
    """)
    assert out.split()[-1] == "True", out


@case
def test_use_after_close_raises():
    """Every object with close() (Tensor, safe_open, Float8Linear and its
    context) raises LpxValueError naming what is closed, never reaching C
    with a dead handle (run in a child: the old code crashed here)."""
    out = _child("""
        import tempfile
        bad = []
        def refused(what, fn, word):
            sys.stdout.flush()
            try:
                fn()
                bad.append(f"{what} worked on a closed object")
            except lpx.LpxValueError as e:
                if word not in str(e):
                    bad.append(f"{what}: {e}")
            except Exception as e:
                bad.append(f"{what}: {type(e).__name__}: {e}")
        t = lpx.from_numpy(np.ones((4, 4), np.float32), copy=True)
        q = lpx.nf4_quantize(np.ones((4, 64), np.float32))
        t.close(); t.close()   # closing twice is fine
        q.close()
        for what, fn in {"shape": lambda: t.shape, "strides": lambda: t.strides, "numel": lambda: t.numel,
                         "dtype": lambda: t.dtype, "device": lambda: t.device, "kind": lambda: t.kind,
                         "readonly": lambda: t.readonly, "refcount": t.refcount, "inner": q.inner,
                         "meta": q.meta, "contiguous": t.contiguous, "handle": lambda: t.handle,
                         "numpy": t.numpy, "np.asarray": lambda: np.asarray(t), "np.array": lambda: np.array(t),
                         "index": lambda: t[0], "len": lambda: len(t), "dlpack": t.__dlpack__,
                         "dlpack_device": t.__dlpack_device__, "t + 1": lambda: t + 1, "t * t": lambda: t * t,
                         "-t": lambda: -t, "add": lambda: lpx.add(t, np.ones((4, 4), np.float32)),
                         "matmul": lambda: lpx.matmul(t, t), "cast": lambda: lpx.cast(t, "f16"),
                         "clone": lambda: lpx.clone(t), "nf4_dequantize": lambda: lpx.nf4_dequantize(q),
                         "nf4_info": lambda: lpx.nf4_info(q), "save_file": lambda: lpx.save_file({"t": t}, "x")
                         }.items():
            refused(what, fn, "lpx.Tensor is closed")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.safetensors")
            lpx.save_file({"w": np.ones(4, np.float32)}, path, metadata={"k": "v"})
            f = lpx.safe_open(path)
            f.close(); f.close()
            for what, fn in {"keys": f.keys, "kind_of": lambda: f.kind_of("w"), "get": lambda: f.get_tensor("w"),
                             "metadata": f.metadata, "with": lambda: f.__enter__()}.items():
                refused("safe_open " + what, fn, "m.safetensors') is closed")
        w = np.ones((16, 16), np.float32)
        layer = lpx.Float8Linear(w)
        _, ctx = layer.forward_ctx(np.ones((16, 16), np.float32))
        ctx.close()
        refused("ctx.backward", lambda: ctx.backward(np.ones((16, 16), np.float32)), "freed")
        layer.close(); layer.close()
        for what, fn in {"forward": lambda: layer(np.ones((16, 16), np.float32)),
                         "state_bytes": layer.state_bytes}.items():
            refused("Float8Linear " + what, fn, "Float8Linear is closed")
        if not (getattr(t, "closed", False) and repr(t) == "lpx.Tensor(closed)"):
            bad.append("t.closed / repr")
        assert not bad, bad
        print("done")
    """)
    assert out.split()[-1] == "done", out


@case
def test_loaded_tensors_independent_of_the_file():
    """load_file / safe_open.get_tensor copy out of the mapping: rewriting
    the file in place, then truncating it, changes nothing a loaded tensor
    holds (the old zero-copy tensors changed, then died of SIGBUS)."""
    out = _child(f"""
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "m.safetensors")
            w = np.arange({_BIG // 16}, dtype=np.float32)
            lpx.save_file({{"w": w, "q": lpx.nf4_quantize(np.ones((64, 64), np.float32) * 2),
                           "ids": np.arange(10, dtype=np.int64)}}, path)
            back = lpx.load_file(path)
            with lpx.safe_open(path) as f:
                one = f.get_tensor("w")
                q8 = f.get_tensor("w", quantize="float8")
            size = os.path.getsize(path)
            with open(path, "r+b") as fh:   # rewritten in place: the same inode, new bytes
                fh.seek(size // 2)
                fh.write(bytes([255]) * (size - size // 2))
            assert (back["w"].numpy() == w).all() and (one.numpy() == w).all(), "a loaded tensor changed"
            os.truncate(path, 0)
            assert (back["w"].numpy() == w).all() and (one.numpy() == w).all()
            assert (back["ids"].numpy() == np.arange(10)).all()
            assert (lpx.nf4_dequantize(back["q"]).numpy() == 2).all()
            assert q8.kind == "float8" and abs(lpx.float8_dequantize(q8).numpy()[-1] - w[-1]) <= w[-1] / 8
            print("same")
    """)
    assert out.split()[-1] == "same", out


@case(extra=("torch",))
def test_torch_tensor_outlives_close():
    """lpx.torch.to_torch(t) holds its own lpx reference (DLPack): valid
    after t.close()."""
    needs("torch")
    out = _child(f"""
        import lpx.torch as lt
        t = lpx.from_numpy(np.full({_BIG}, 3.0, np.float32), copy=True)
        x = lt.to_torch(t)
        t.close()
        del t
        gc.collect()
        print(float(x[-1]))
    """)
    assert out.split()[-1] == "3.0", out

finish()

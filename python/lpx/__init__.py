"""lpx: a ctypes binding over liblpx.

liblpx.so is found through, in order: the LPX_LIBRARY environment variable
(a path to the .so), a meson build directory next to the source tree
(build*/liblpx.so), then the system loader (ldconfig / LD_LIBRARY_PATH).

Tensors are refcounted handles: a Tensor owns one lpx reference and releases
it when garbage-collected. Errors raise LpxError(status, message) with
lpx_last_error(). DLPack: Tensor.__dlpack__/__dlpack_device__ (legacy
capsules, read by numpy.from_dlpack and torch.utils.dlpack.from_dlpack) and
lpx.from_dlpack(obj) for anything exposing __dlpack__.
"""
import ctypes as C
import glob
import os

__all__ = ["LpxError", "Tensor", "from_numpy", "from_dlpack", "load_library", "dtype_names",
           "add", "matmul", "cast", "float8_quantize", "float8_dequantize",
           "nf4_quantize", "nf4_dequantize", "load_plugin"]


class LpxError(RuntimeError):
    """An lpx call failed: .status is the lpx_status code, str() the message."""

    def __init__(self, status, message):
        super().__init__(f"{message} (status {status})")
        self.status = status
        self.message = message


def _find_library():
    env = os.environ.get("LPX_LIBRARY")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    for cand in sorted(glob.glob(os.path.join(root, "build*", "liblpx.so"))):
        return cand
    return "liblpx.so.0"


_lib = None


class _Device(C.Structure):
    _fields_ = [("type", C.c_int32), ("index", C.c_int32)]


def load_library(path=None):
    """Loads liblpx (idempotent); returns the ctypes CDLL."""
    global _lib
    if _lib is not None:
        return _lib
    lib = C.CDLL(path or _find_library())
    P, I64P, VP = C.c_void_p, C.POINTER(C.c_int64), C.c_void_p
    Dev = _Device
    sig = {
        "lpx_last_error": (C.c_char_p, []),
        "lpx_init": (C.c_int, []),
        "lpx_tensor_new": (C.c_int, [C.c_int32, C.c_int, I64P, Dev, C.POINTER(P)]),
        "lpx_tensor_release": (None, [P]),
        "lpx_tensor_retain": (None, [P]),
        "lpx_tensor_ndim": (C.c_int, [P]),
        "lpx_tensor_shape": (I64P, [P]),
        "lpx_tensor_strides": (I64P, [P]),
        "lpx_tensor_dtype": (C.c_int32, [P]),
        "lpx_tensor_data": (VP, [P]),
        "lpx_tensor_kind": (P, [P]),
        "lpx_tensor_refcount": (C.c_int, [P]),
        "lpx_tensor_is_readonly": (C.c_bool, [P]),
        "lpx_kind_name": (C.c_char_p, [P]),
        "lpx_dtype_name": (C.c_char_p, [C.c_int32]),
        "lpx_dtype_from_name": (C.c_int32, [C.c_char_p]),
        "lpx_dtype_count": (C.c_int, []),
        "lpx_add": (C.c_int, [P, P, C.POINTER(P)]),
        "lpx_matmul": (C.c_int, [P, P, C.POINTER(P)]),
        "lpx_cast": (C.c_int, [P, C.c_int32, C.c_bool, C.POINTER(P)]),
        "lpx_float8_quantize": (C.c_int, [P, P, C.POINTER(P), P]),
        "lpx_float8_dequantize": (C.c_int, [P, C.c_int32, C.POINTER(P)]),
        "lpx_nf4_quantize": (C.c_int, [P, P, C.POINTER(P)]),
        "lpx_nf4_dequantize": (C.c_int, [P, C.c_int32, C.POINTER(P)]),
        "lpx_to_dlpack_legacy": (C.c_int, [P, C.c_bool, C.POINTER(P)]),
        "lpx_from_dlpack_legacy": (C.c_int, [P, C.POINTER(P)]),
        "lpx_plugin_load": (C.c_int, [C.c_char_p, C.POINTER(P)]),
    }
    for name, (res, args) in sig.items():
        if not hasattr(lib, name):
            continue
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    _lib = lib
    _check(lib.lpx_init())
    return lib


def _check(status):
    if status != 0:
        msg = _lib.lpx_last_error().decode("utf-8", "replace")
        raise LpxError(status, msg)


def dtype_names():
    """Names of every registered dtype, by index."""
    lib = load_library()
    return [lib.lpx_dtype_name(i).decode() for i in range(lib.lpx_dtype_count())]


def _dtype(d):
    if isinstance(d, int):
        return d
    lib = load_library()
    v = lib.lpx_dtype_from_name(str(d).encode())
    if v < 0:
        raise LpxError(-4, f"unknown dtype name '{d}'")
    return v


_NP = {"f32": "<f4", "f16": "<f2", "u8": "|u1", "i8": "|i1", "i32": "<i4", "i64": "<i8", "bool": "|b1",
       "bf16": "<V2", "f8e4m3fn": "|V1", "f8e5m2": "|V1"}


class Tensor:
    """An owned reference to an lpx_tensor. Released by __del__ (or close())."""

    __slots__ = ("_h", "_keep", "__weakref__")

    def __init__(self, handle, keep=None):
        if not handle:
            raise ValueError("NULL lpx tensor")
        self._h = C.c_void_p(handle) if isinstance(handle, int) else handle
        self._keep = keep  # Python objects that own memory the tensor borrows

    @property
    def handle(self):
        return self._h.value

    def close(self):
        if self._h is not None and self._h.value and _lib is not None:
            _lib.lpx_tensor_release(self._h)
        self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def shape(self):
        n = _lib.lpx_tensor_ndim(self._h)
        s = _lib.lpx_tensor_shape(self._h)
        return tuple(s[i] for i in range(n))

    @property
    def strides(self):
        """Strides in elements."""
        n = _lib.lpx_tensor_ndim(self._h)
        s = _lib.lpx_tensor_strides(self._h)
        return tuple(s[i] for i in range(n))

    @property
    def dtype(self):
        return _lib.lpx_dtype_name(_lib.lpx_tensor_dtype(self._h)).decode()

    @property
    def kind(self):
        k = _lib.lpx_tensor_kind(self._h)
        return _lib.lpx_kind_name(k).decode() if k else None

    @property
    def readonly(self):
        return bool(_lib.lpx_tensor_is_readonly(self._h))

    def refcount(self):
        return _lib.lpx_tensor_refcount(self._h)

    def __repr__(self):
        k = f", kind={self.kind}" if self.kind else ""
        return f"lpx.Tensor(shape={self.shape}, dtype={self.dtype}{k})"

    # ---- numpy, zero-copy through the array interface
    @property
    def __array_interface__(self):
        if self.kind:
            raise LpxError(-1, f"a {self.kind} tensor has no dense buffer; dequantize it first")
        import numpy as np
        typestr = _NP.get(self.dtype)
        if typestr is None:
            raise LpxError(-7, f"dtype {self.dtype} has no numpy equivalent")
        item = np.dtype(typestr).itemsize
        return {"version": 3, "shape": self.shape, "typestr": typestr,
                "data": (_lib.lpx_tensor_data(self._h) or 0, self.readonly),
                "strides": tuple(s * item for s in self.strides)}

    def numpy(self):
        """A zero-copy numpy view (keeps this tensor alive)."""
        import numpy as np
        return np.asarray(self)

    # ---- DLPack (legacy capsules: what numpy 1.x and torch < 2.3 read)
    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("lpx exports without copying")
        out = C.c_void_p()
        _check(_lib.lpx_to_dlpack_legacy(self._h, False, C.byref(out)))
        return _capsule_new(out.value)

    # ---- ops
    def __add__(self, other):
        return add(self, other)

    def __matmul__(self, other):
        return matmul(self, other)


# ---- PyCapsule plumbing (ctypes.pythonapi)
_api = C.pythonapi
_api.PyCapsule_New.restype = C.py_object
_api.PyCapsule_New.argtypes = [C.c_void_p, C.c_char_p, C.c_void_p]
_api.PyCapsule_GetPointer.restype = C.c_void_p
_api.PyCapsule_GetPointer.argtypes = [C.py_object, C.c_char_p]
_api.PyCapsule_IsValid.restype = C.c_int
_api.PyCapsule_IsValid.argtypes = [C.py_object, C.c_char_p]
_api.PyCapsule_SetName.restype = C.c_int
_api.PyCapsule_SetName.argtypes = [C.py_object, C.c_char_p]
_DESTRUCTOR = C.CFUNCTYPE(None, C.c_void_p)


class _DLManagedTensor(C.Structure):
    # DLTensor (data, device{int32,int32}, ndim, dtype{u8,u8,u16}, shape, strides, byte_offset), ctx, deleter
    _fields_ = [("data", C.c_void_p), ("device_type", C.c_int32), ("device_id", C.c_int32), ("ndim", C.c_int32),
                ("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16), ("shape", C.c_void_p),
                ("strides", C.c_void_p), ("byte_offset", C.c_uint64), ("manager_ctx", C.c_void_p),
                ("deleter", C.CFUNCTYPE(None, C.c_void_p))]


def _capsule_destructor(cap):
    # an unconsumed "dltensor" capsule still owns its struct: call its deleter
    capobj = C.cast(C.c_void_p(cap), C.py_object)
    if _api.PyCapsule_IsValid(capobj, b"dltensor"):
        p = _api.PyCapsule_GetPointer(capobj, b"dltensor")
        m = _DLManagedTensor.from_address(p)
        if m.deleter:
            m.deleter(p)


_capsule_destructor_c = _DESTRUCTOR(_capsule_destructor)


def _capsule_new(ptr):
    return _api.PyCapsule_New(ptr, b"dltensor", C.cast(_capsule_destructor_c, C.c_void_p))


def from_dlpack(obj):
    """Imports anything with __dlpack__ (numpy arrays, torch tensors, lpx
    tensors) as an lpx Tensor, zero-copy. The producer's memory is released
    when the last lpx view of it dies."""
    lib = load_library()
    cap = obj.__dlpack__() if hasattr(obj, "__dlpack__") else obj
    if not _api.PyCapsule_IsValid(cap, b"dltensor"):
        raise LpxError(-1, "from_dlpack: not an unconsumed 'dltensor' capsule")
    p = _api.PyCapsule_GetPointer(cap, b"dltensor")
    out = C.c_void_p()
    _check(lib.lpx_from_dlpack_legacy(p, C.byref(out)))
    _api.PyCapsule_SetName(cap, b"used_dltensor")  # lpx owns it now
    return Tensor(out)


def from_numpy(a, copy=False):
    """An lpx Tensor over numpy array `a` (zero-copy through DLPack when
    numpy supports it, else a copy)."""
    import numpy as np
    a = np.asarray(a)
    if not copy and hasattr(a, "__dlpack__") and a.dtype != np.bool_:
        try:
            return from_dlpack(a)
        except (BufferError, TypeError, LpxError):
            pass
    lib = load_library()
    names = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.uint8): "u8",
             np.dtype(np.int8): "i8", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.bool_): "bool"}
    if a.dtype not in names:
        raise LpxError(-7, f"numpy dtype {a.dtype} has no lpx dtype")
    shape = (C.c_int64 * max(a.ndim, 1))(*a.shape)
    out = C.c_void_p()
    _check(lib.lpx_tensor_new(_dtype(names[a.dtype]), a.ndim, shape, _Device(1, 0), C.byref(out)))
    t = Tensor(out)
    np.copyto(np.asarray(t), np.ascontiguousarray(a), casting="no")
    return t


def _t(x):
    return x if isinstance(x, Tensor) else from_numpy(x)


def _op(fn, *args):
    out = C.c_void_p()
    _check(fn(*args, C.byref(out)))
    return Tensor(out)


def add(a, b):
    a, b = _t(a), _t(b)
    return _op(load_library().lpx_add, a._h, b._h)


def matmul(a, b):
    a, b = _t(a), _t(b)
    return _op(load_library().lpx_matmul, a._h, b._h)


def cast(x, dtype, saturate=False):
    x = _t(x)
    return _op(load_library().lpx_cast, x._h, _dtype(dtype), bool(saturate))


def float8_quantize(x):
    """Float8 (e4m3fn, dynamic tensorwise scaling) tensor of x."""
    x = _t(x)
    lib = load_library()
    out = C.c_void_p()
    _check(lib.lpx_float8_quantize(x._h, None, C.byref(out), None))
    return Tensor(out)


def float8_dequantize(t, dtype="f32"):
    return _op(load_library().lpx_float8_dequantize, t._h, _dtype(dtype))


def nf4_quantize(x):
    """NF4 tensor of x with the default config (block 64, scaler block 256)."""
    x = _t(x)
    return _op(load_library().lpx_nf4_quantize, x._h, None)


def nf4_dequantize(t, dtype="f32"):
    return _op(load_library().lpx_nf4_dequantize, t._h, _dtype(dtype))


def load_plugin(path):
    """Loads an lpx plugin (e.g. lpx-mx.so) by path."""
    lib = load_library()
    out = C.c_void_p()
    _check(lib.lpx_plugin_load(str(path).encode(), C.byref(out)))

"""lpx: a ctypes binding over liblpx.

liblpx.so is found through, in order: the LPX_LIBRARY environment variable
(a path to the .so), the copy bundled in the wheel (`pip install ./python`
builds and bundles liblpx and its plugins, and loads lpx-mx and the CUDA
plugins with it), a meson build directory next to the source tree
(build*/liblpx.so), then the system loader (ldconfig / LD_LIBRARY_PATH).

Tensors are refcounted handles: a Tensor owns one lpx reference and releases
it when garbage-collected or closed. numpy views, DLPack capsules and torch
tensors of it hold their own, so they stay valid after close(); a closed
handle (Tensor, safe_open, Float8Linear) raises LpxValueError when used.
load_file / safe_open copy tensors out of the file (docs/INTEROP.md,
"Lifetimes"). Errors raise LpxError(status, message) with
lpx_last_error().

DLPack: Tensor.__dlpack__ makes a versioned capsule ("dltensor_versioned",
DLManagedTensorVersioned, read-only flag included) when the consumer passes
max_version >= (1, 0), as NumPy >= 2.1 and PyTorch >= 2.3 do, and a legacy
"dltensor" capsule otherwise; lpx.from_dlpack(obj) takes either from
anything with __dlpack__, or a capsule itself. Zero-copy both ways.

Low precision: float8_quantize / float8_dequantize / float8_mm and
Float8Linear (float8.h), nf4_quantize / nf4_dequantize / nf4_linear and
qlora_linear (nf4.h). Files: save_file / load_file / safe_open
(safetensors.h), dense and kind tensors alike.
"""
import ctypes as C
import glob
import os

__all__ = ["LpxError", "LpxValueError", "LpxTypeError", "LpxIndexError", "LpxLoadError", "Tensor", "from_numpy",
           "from_dlpack", "load_library", "dtype_names", "sub", "mul", "div",
           "add", "matmul", "cast", "clone", "rmsnorm", "rmsnorm_backward", "swiglu", "swiglu_backward",
           "float8_quantize", "float8_dequantize", "float8_mm", "float8_info", "float8_linear", "Float8Linear",
           "Float8Recipe", "Float8LinearCtx", "kind_unflatten", "cuda_stream",
           "nf4_quantize", "nf4_dequantize", "nf4_info", "nf4_linear", "nf4_linear_backward",
           "qlora_linear", "qlora_linear_backward",
           "save_file", "load_file", "safe_open", "load_plugin", "bundled_plugins"]


class LpxError(RuntimeError):
    """An lpx call failed: .status is the lpx_status code, .message lpx's
    message (lpx_last_error), str() both. Every failure of this module is
    an LpxError; the subclasses below are also the Python exception a
    caller would catch for the same mistake."""

    def __init__(self, status, message):
        super().__init__(f"{message} (status {status})")
        self.status = status
        self.message = message


_EINVAL, _ENOTFOUND, _ERANGE, _EDTYPE, _EPLUGIN = -1, -4, -6, -7, -12


class LpxValueError(LpxError, ValueError):
    """A bad argument value (an unknown role or format name)."""


class LpxTypeError(LpxError, TypeError):
    """An argument of the wrong type (len() of a 0-d tensor, an index that
    is not an int or a slice)."""


class LpxIndexError(LpxError, IndexError):
    """An index out of range."""


class LpxLoadError(LpxError, OSError):
    """liblpx could not be loaded."""


_HERE = os.path.dirname(os.path.abspath(__file__))
# the wheel's bundled liblpx and plugins (python/meson.build)
_BUNDLED = os.path.join(_HERE, "_lib")
# bundled plugins loaded with liblpx, in this order (lpx-mx-cuda and
# lpx-nccl need lpx-cuda); each declines politely where it cannot run.
# lpx-mpi.so is bundled but loaded only on request (load_plugin): it
# initializes MPI.
_AUTOLOAD = ("lpx-mx.so", "lpx-cuda.so", "lpx-mx-cuda.so", "lpx-nccl.so")


def _find_library():
    """(path, bundled): LPX_LIBRARY, else the wheel's own copy, else a meson
    build directory of the source tree (build*/liblpx.so), else the system
    loader."""
    env = os.environ.get("LPX_LIBRARY")
    if env:
        return env, False
    mine = os.path.join(_BUNDLED, "liblpx.so.0")
    if os.path.exists(mine):
        return mine, True
    root = os.path.dirname(os.path.dirname(_HERE))
    for cand in sorted(glob.glob(os.path.join(root, "build*", "liblpx.so"))):
        return cand, False
    return "liblpx.so.0", False


_lib = None

LPX_DEVICE_CPU = 1
_DEVICE_CUDA = 2   # LPX_DEVICE_CUDA (= DLPack's kDLCUDA)
_FLOAT8_LOGICAL = -1
_TENSORWISE, _AXISWISE = 0, 1
_ROLES = {None: 0, "input": 1, "weight": 2, "grad_output": 3}


class _Device(C.Structure):
    _fields_ = [("type", C.c_int32), ("index", C.c_int32)]


class _Float8QuantOpts(C.Structure):
    # lpx_float8_quant_opts
    _fields_ = [("struct_size", C.c_size_t), ("fp8", C.c_int32), ("granularity", C.c_int), ("axis", C.c_int),
                ("role", C.c_int), ("pow2_scale", C.c_bool), ("nonsaturating", C.c_bool),
                ("scale", C.c_void_p), ("delayed", C.c_void_p)]


class _Float8Stats(C.Structure):
    _fields_ = [("amax", C.c_double), ("scale", C.c_double), ("scale_max", C.c_double),
                ("underflow", C.c_double), ("saturation", C.c_double), ("nan", C.c_double), ("numel", C.c_int64)]


class _Float8Info(C.Structure):
    _fields_ = [("fp8", C.c_int32), ("logical", C.c_int32), ("role", C.c_int), ("granularity", C.c_int),
                ("axis", C.c_int)]


class _Float8LinearState(C.Structure):
    _fields_ = [("input", C.c_void_p), ("weight", C.c_void_p), ("grad_output", C.c_void_p)]


class _OperandConfig(C.Structure):
    # lpx_float8_operand_config
    _fields_ = [("dtype", C.c_int32), ("granularity", C.c_int), ("scaling", C.c_int), ("pow2_scale", C.c_bool)]


class _GemmConfig(C.Structure):
    _fields_ = [("mode", C.c_int), ("a", _OperandConfig), ("b", _OperandConfig)]


class _DelayedConfig(C.Structure):
    _fields_ = [("history_len", C.c_int), ("algo", C.c_int), ("margin", C.c_int), ("interval", C.c_int),
                ("fp8", C.c_int32)]


class _Float8LinearRecipe(C.Structure):
    # lpx_float8_linear_recipe (ABI 1.1 layout; the preset writes
    # struct_size, which load_library's check compares with this)
    _fields_ = [("struct_size", C.c_size_t), ("fprop", _GemmConfig), ("dgrad", _GemmConfig), ("wgrad", _GemmConfig),
                ("nonsaturating", C.c_bool), ("delayed", _DelayedConfig), ("fast_accum", C.c_uint)]


class _OperandReport(C.Structure):
    _fields_ = [("quantized", C.c_bool), ("reused", C.c_bool), ("given_fp8", C.c_bool), ("dtype", C.c_int32),
                ("stats", _Float8Stats)]


class _GemmReport(C.Structure):
    _fields_ = [("mode", C.c_int), ("a", _OperandReport), ("b", _OperandReport)]


class _LinearReport(C.Structure):
    _fields_ = [("fprop", _GemmReport), ("dgrad", _GemmReport), ("wgrad", _GemmReport)]


class _Nf4Config(C.Structure):
    _fields_ = [("block", C.c_int64), ("scaler_block", C.c_int64), ("pad", C.c_bool)]


class _Nf4Info(C.Structure):
    _fields_ = [("block", C.c_int64), ("scaler_block", C.c_int64), ("numel", C.c_int64), ("padded", C.c_int64),
                ("bytes", C.c_int64), ("bits_per_param", C.c_double), ("shard_unit_rows", C.c_int64),
                ("transposed", C.c_bool), ("whole", C.c_bool)]


class _QloraOpts(C.Structure):
    _fields_ = [("alpha", C.c_double), ("dropout", C.c_double), ("seed", C.c_uint64)]


class _KV(C.Structure):
    _fields_ = [("key", C.c_char_p), ("value", C.c_char_p)]


def load_library(path=None):
    """Loads liblpx (idempotent); returns the ctypes CDLL."""
    global _lib
    if _lib is not None:
        return _lib
    where, bundled = (path, False) if path else _find_library()
    try:
        lib = C.CDLL(where)
    except OSError as e:
        raise LpxLoadError(_EPLUGIN, f"cannot load liblpx from '{where}' ({e}); build it (make) or point "
                                     "LPX_LIBRARY at liblpx.so") from None
    P, I64P, VP, PP = C.c_void_p, C.POINTER(C.c_int64), C.c_void_p, C.POINTER(C.c_void_p)
    Dev, D, S = _Device, C.c_int32, C.c_int
    sig = {
        "lpx_last_error": (C.c_char_p, []),
        "lpx_clear_error": (None, []),
        "lpx_init": (S, []),
        "lpx_version": (C.c_char_p, []),
        "lpx_tensor_new": (S, [D, C.c_int, I64P, Dev, PP]),
        "lpx_tensor_release": (None, [P]),
        "lpx_tensor_retain": (None, [P]),
        "lpx_tensor_ndim": (C.c_int, [P]),
        "lpx_tensor_shape": (I64P, [P]),
        "lpx_tensor_strides": (I64P, [P]),
        "lpx_tensor_dtype": (D, [P]),
        "lpx_tensor_device": (Dev, [P]),
        "lpx_tensor_numel": (C.c_int64, [P]),
        "lpx_tensor_data": (VP, [P]),
        "lpx_tensor_kind": (P, [P]),
        "lpx_tensor_refcount": (C.c_int, [P]),
        "lpx_tensor_is_readonly": (C.c_bool, [P]),
        "lpx_tensor_inner_count": (C.c_int, [P]),
        "lpx_tensor_inner": (P, [P, C.c_int]),
        "lpx_tensor_meta": (VP, [P, C.POINTER(C.c_size_t)]),
        "lpx_kind_name": (C.c_char_p, [P]),
        "lpx_kind_find": (S, [C.c_char_p, PP]),
        "lpx_kind_inner_name": (C.c_char_p, [P, C.c_int, C.c_char_p, C.c_size_t]),
        "lpx_kind_unflatten": (S, [P, D, C.c_int, I64P, PP, C.c_int, VP, C.c_size_t, PP]),
        "lpx_dtype_name": (C.c_char_p, [D]),
        "lpx_dtype_from_name": (D, [C.c_char_p]),
        "lpx_dtype_count": (C.c_int, []),
        "lpx_dtype_nbytes": (C.c_size_t, [D, C.c_int64]),
        "lpx_convert": (S, [VP, D, VP, D, C.c_size_t, C.c_uint]),
        "lpx_add": (S, [P, P, PP]),
        "lpx_sub": (S, [P, P, PP]),
        "lpx_mul": (S, [P, P, PP]),
        "lpx_div": (S, [P, P, PP]),
        "lpx_add_scalar": (S, [P, C.c_double, PP]),
        "lpx_mul_scalar": (S, [P, C.c_double, PP]),
        "lpx_neg": (S, [P, PP]),
        "lpx_tensor_offset": (C.c_int64, [P]),
        "lpx_tensor_view_of": (S, [P, C.c_int, I64P, I64P, C.c_int64, PP]),
        "lpx_matmul": (S, [P, P, PP]),
        "lpx_cast": (S, [P, D, C.c_bool, PP]),
        "lpx_clone": (S, [P, PP]),
        "lpx_rmsnorm": (S, [P, P, C.c_double, PP, PP]),
        "lpx_rmsnorm_backward": (S, [P, P, P, P, PP, PP]),
        "lpx_swiglu": (S, [P, P, PP]),
        "lpx_swiglu_backward": (S, [P, P, P, PP, PP]),
        "lpx_contiguous": (S, [P, PP]),
        # float8
        "lpx_float8_quantize": (S, [P, C.POINTER(_Float8QuantOpts), PP, C.POINTER(_Float8Stats)]),
        "lpx_float8_dequantize": (S, [P, D, PP]),
        "lpx_float8_mm": (S, [P, P, P, D, PP]),
        "lpx_float8_get_info": (S, [P, C.POINTER(_Float8Info)]),
        "lpx_float8_is": (C.c_bool, [P]),
        "lpx_float8_linear_recipe_preset": (S, [C.c_char_p, C.POINTER(_Float8LinearRecipe)]),
        "lpx_float8_linear_state_init": (S, [C.POINTER(_Float8LinearState), C.POINTER(_Float8LinearRecipe)]),
        "lpx_float8_linear_state_destroy": (None, [C.POINTER(_Float8LinearState)]),
        "lpx_float8_linear_forward": (S, [C.POINTER(_Float8LinearRecipe), C.POINTER(_Float8LinearState), P, P, P,
                                          PP, PP, C.POINTER(_LinearReport)]),
        "lpx_float8_linear_backward": (S, [P, P, PP, PP, PP, C.POINTER(_LinearReport)]),
        "lpx_float8_delayed_save": (S, [P, VP, C.c_size_t, C.POINTER(C.c_size_t)]),
        "lpx_float8_delayed_load": (S, [P, VP, C.c_size_t]),
        "lpx_float8_delayed_scale": (C.c_float, [P]),
        "lpx_float8_delayed_steps": (C.c_int64, [P]),
        "lpx_float8_linear_ctx_free": (None, [P]),
        # nf4
        "lpx_nf4_config_default": (_Nf4Config, []),
        "lpx_nf4_quantize": (S, [P, C.POINTER(_Nf4Config), PP]),
        "lpx_nf4_dequantize": (S, [P, D, PP]),
        "lpx_nf4_get_info": (S, [P, C.POINTER(_Nf4Info)]),
        "lpx_nf4_is": (C.c_bool, [P]),
        "lpx_nf4_linear": (S, [P, P, P, PP]),
        "lpx_nf4_linear_backward": (S, [P, P, PP]),
        "lpx_qlora_opts_default": (_QloraOpts, []),
        "lpx_qlora_linear": (S, [P, P, P, P, P, C.POINTER(_QloraOpts), PP, PP]),
        "lpx_qlora_linear_backward": (S, [P, P, P, P, P, P, C.POINTER(_QloraOpts), PP, PP, PP]),
        # DLPack
        "lpx_to_dlpack": (S, [P, PP]),
        "lpx_to_dlpack_legacy": (S, [P, C.c_bool, PP]),
        "lpx_from_dlpack": (S, [P, PP]),
        "lpx_from_dlpack_legacy": (S, [P, PP]),
        # safetensors
        "lpx_safetensors_save": (S, [C.c_char_p, C.c_int, C.POINTER(C.c_char_p), PP, C.c_int, C.POINTER(_KV)]),
        "lpx_safetensors_open": (S, [C.c_char_p, PP]),
        "lpx_safetensors_close": (None, [P]),
        "lpx_safetensors_count": (C.c_int, [P]),
        "lpx_safetensors_name": (C.c_char_p, [P, C.c_int]),
        "lpx_safetensors_kind_of": (C.c_char_p, [P, C.c_char_p]),
        "lpx_safetensors_get": (S, [P, C.c_char_p, PP]),
        "lpx_safetensors_get_quantized": (S, [P, C.c_char_p, P, PP]),
        "lpx_safetensors_metadata_count": (C.c_int, [P]),
        "lpx_safetensors_metadata_at": (C.c_char_p, [P, C.c_int, C.POINTER(C.c_char_p)]),
        # plugins
        "lpx_plugin_load": (S, [C.c_char_p, PP]),
        "lpx_plugin_find": (S, [C.c_char_p, PP]),
        "lpx_plugin_symbol": (VP, [P, C.c_char_p]),
    }
    for name, (res, args) in sig.items():
        if not hasattr(lib, name):
            continue
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    _lib = lib
    _check(lib.lpx_init())
    if bundled and "LPX_PLUGIN_PATH" not in os.environ:
        _load_bundled_plugins(lib)
    return lib


_bundled_status = {}


def _load_bundled_plugins(lib):
    """Loads the wheel's plugins (a caller who set LPX_PLUGIN_PATH chose the
    plugins, as for the lpx command); a decline (no GPU) is recorded, not
    raised: see bundled_plugins()."""
    for name in _AUTOLOAD:
        path = os.path.join(_BUNDLED, name)
        if not os.path.exists(path):
            continue
        out = C.c_void_p()
        if lib.lpx_plugin_load(path.encode(), C.byref(out)) == 0:
            _bundled_status[name] = "loaded"
        else:
            _bundled_status[name] = lib.lpx_last_error().decode("utf-8", "replace")
    lib.lpx_clear_error()


def bundled_plugins():
    """{file: "loaded" or the reason it was not} for the plugins bundled in
    this wheel and loaded with liblpx ({} outside a wheel, or when
    LPX_PLUGIN_PATH is set)."""
    load_library()
    return dict(_bundled_status)


def _check(status):
    if status != 0:
        msg = _lib.lpx_last_error().decode("utf-8", "replace")
        raise LpxError(status, msg)


def dtype_names():
    """Names of every registered dtype, by index."""
    lib = load_library()
    return [lib.lpx_dtype_name(i).decode() for i in range(lib.lpx_dtype_count())]


def _np_name(d):
    """The lpx name of a numpy dtype or scalar type (ml_dtypes' bfloat16 and
    float8 types included), or None."""
    try:
        import numpy as np
        nd = np.dtype(d)
    except Exception:  # noqa: BLE001 (not a numpy dtype)
        return None
    by_name = {"float32": "f32", "float16": "f16", "uint8": "u8", "int8": "i8", "int32": "i32", "int64": "i64",
               "bool": "bool", "bfloat16": "bf16", "float8_e4m3fn": "f8e4m3fn", "float8_e5m2": "f8e5m2"}
    return by_name.get(nd.name)


def _dtype(d):
    """An lpx dtype id from a name ("bf16"), an id, or a numpy dtype / type
    (np.float16, ml_dtypes.bfloat16)."""
    if isinstance(d, int) and not isinstance(d, bool):
        return d
    lib = load_library()
    name = d if isinstance(d, str) else _np_name(d)
    if name is None:
        raise LpxValueError(_ENOTFOUND, f"{d!r} is neither an lpx dtype name nor a numpy dtype lpx has")
    v = lib.lpx_dtype_from_name(str(name).encode())
    if v < 0:
        raise LpxValueError(_ENOTFOUND, f"unknown dtype name '{name}'")
    return v


def _fp8(d):
    """An fp8 format (a name or ml_dtypes' float8 types); any other dtype is
    refused (the C options read 0, f32's id, as 'default')."""
    name = d if isinstance(d, str) else _np_name(d)
    if name not in ("f8e4m3fn", "f8e5m2"):
        raise LpxValueError(_EDTYPE, f"fp8 must be 'f8e4m3fn' or 'f8e5m2' (or their ml_dtypes types), not {d!r}")
    return _dtype(name)


_NP = {"f32": "<f4", "f16": "<f2", "u8": "|u1", "i8": "|i1", "i32": "<i4", "i64": "<i8", "bool": "|b1",
       "bf16": "<V2", "f8e4m3fn": "|V1", "f8e5m2": "|V1"}


class Tensor:
    """An owned reference to an lpx_tensor. Released by __del__ (or close()).

    Memory the binding hands out stays valid after close(): numpy() views,
    DLPack capsules and lpx.torch tensors each hold their own lpx
    reference, and an array numpy made from the tensor itself
    (np.asarray(t), through __array_interface__) keeps the reference this
    handle held until the last such array is gone. close() ends the
    handle: any later use of it raises LpxValueError."""

    __slots__ = ("_hp", "_closed", "_exported", "_keep", "__weakref__")

    def __init__(self, handle, keep=None):
        if not handle:
            raise ValueError("NULL lpx tensor")
        self._hp = C.c_void_p(handle) if isinstance(handle, int) else handle
        self._closed = False
        self._exported = False   # numpy arrays may have this object as their base
        self._keep = keep  # Python objects that own memory the tensor borrows

    @classmethod
    def _borrowed(cls, ptr, keep=None):
        """A new reference to a tensor lpx lends (an inner tensor)."""
        load_library().lpx_tensor_retain(C.c_void_p(ptr))
        return cls(C.c_void_p(ptr), keep)

    @property
    def handle(self):
        return self._live().value

    @property
    def _h(self):
        """The lpx handle, or LpxValueError once closed (every use of the
        handle goes through here, so a closed tensor never reaches C)."""
        return self._live()

    def _live(self):
        if self._closed or self._hp is None or not self._hp.value:
            raise LpxValueError(_EINVAL, "lpx.Tensor is closed: close() ended this handle (numpy views and "
                                         "DLPack capsules taken before it stay valid)")
        return self._hp

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Ends this handle and drops its lpx reference, unless numpy arrays
        made from it through __array_interface__ may still exist (they have
        this object as their base): then the reference goes with the object,
        when the last of them is gone."""
        self._closed = True
        if not self._exported:
            self._release()

    def _release(self):
        if self._hp is not None and self._hp.value and _lib is not None:
            _lib.lpx_tensor_release(self._hp)
        self._hp = None

    def __del__(self):
        try:
            self._closed = True
            self._release()
        except Exception:
            pass

    @property
    def shape(self):
        n = _lib.lpx_tensor_ndim(self._live())
        s = _lib.lpx_tensor_shape(self._h)
        return tuple(s[i] for i in range(n))

    @property
    def strides(self):
        """Strides in elements."""
        n = _lib.lpx_tensor_ndim(self._live())
        s = _lib.lpx_tensor_strides(self._h)
        return tuple(s[i] for i in range(n))

    @property
    def numel(self):
        return _lib.lpx_tensor_numel(self._live())

    @property
    def dtype(self):
        return _lib.lpx_dtype_name(_lib.lpx_tensor_dtype(self._live())).decode()

    @property
    def device(self):
        d = _lib.lpx_tensor_device(self._live())
        return (d.type, d.index)

    @property
    def kind(self):
        k = _lib.lpx_tensor_kind(self._live())
        return _lib.lpx_kind_name(k).decode() if k else None

    @property
    def readonly(self):
        return bool(_lib.lpx_tensor_is_readonly(self._h))

    def refcount(self):
        return _lib.lpx_tensor_refcount(self._h)

    def inner(self):
        """A kind tensor's inner tensors, {name: Tensor} in order (the names
        of safetensors files and DLPack flattening: float8 data, scale,
        scale_inv; nf4 codes, qscalers, factors, mean). {} for dense."""
        k = _lib.lpx_tensor_kind(self._h)
        out = {}
        buf = C.create_string_buffer(64)
        for i in range(_lib.lpx_tensor_inner_count(self._h)):
            name = _lib.lpx_kind_inner_name(k, i, buf, 64).decode()
            out[name] = Tensor._borrowed(_lib.lpx_tensor_inner(self._h, i), keep=self)
        return out

    def meta(self):
        """A kind tensor's metadata blob (bytes; b"" for dense)."""
        n = C.c_size_t(0)
        p = _lib.lpx_tensor_meta(self._h, C.byref(n))
        return C.string_at(p, n.value) if p and n.value else b""

    def contiguous(self):
        return _op(load_library().lpx_contiguous, self._h)

    def __repr__(self):
        if self._closed:
            return "lpx.Tensor(closed)"
        k = f", kind={self.kind}" if self.kind else ""
        return f"lpx.Tensor(shape={self.shape}, dtype={self.dtype}{k})"

    # ---- numpy, zero-copy through the array interface
    @property
    def __array_interface__(self):
        if self.kind:
            raise LpxError(-1, f"a {self.kind} tensor has no dense buffer; dequantize it first")
        if self.device[0] != LPX_DEVICE_CPU:
            raise LpxError(-9, f"tensor on device {self.device}: move it to the CPU first")
        import numpy as np
        typestr = _NP.get(self.dtype)
        if typestr is None:
            raise LpxError(-7, f"dtype {self.dtype} has no numpy equivalent")
        item = np.dtype(typestr).itemsize
        # an array made from this may outlive close(): see close()
        self._exported = True
        return {"version": 3, "shape": self.shape, "typestr": typestr,
                "data": (_lib.lpx_tensor_data(self._h) or 0, self.readonly),
                "strides": tuple(s * item for s in self.strides)}

    def __array__(self, dtype=None, copy=None):
        # numpy (< 2) turns an error of __array_interface__ into "no
        # interface" and asks here next: a closed tensor must not become a
        # 0-d object array
        import numpy as np
        self.__array_interface__  # noqa: B018 (raises the reason: closed, a kind, on a device)
        a = self._array()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError(f"lpx.Tensor of {self.dtype} as {np.dtype(dtype)} needs a copy")
            return a.astype(dtype)
        return a.copy() if copy else a

    def _array(self):
        """A zero-copy numpy array of this tensor whose base holds its own
        lpx reference (a private handle), so that close() frees nothing it
        reads."""
        import numpy as np
        return np.asarray(Tensor._borrowed(self._h.value, self._keep))

    def numpy(self):
        """A zero-copy numpy view. It holds its own reference to the lpx
        tensor: valid after this handle's close(), the memory is freed with
        the last view. bf16 and the fp8 formats come back as ml_dtypes'
        bfloat16 / float8_e4m3fn / float8_e5m2 when ml_dtypes is installed
        (else raw void bytes)."""
        a = self._array()
        ml = {"bf16": "bfloat16", "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}.get(self.dtype)
        if ml:
            try:
                import ml_dtypes
                a = a.view(getattr(ml_dtypes, ml))
            except ImportError:
                pass
        return a

    def __len__(self):
        shape = self.shape
        if not shape:
            raise LpxTypeError(_EINVAL, "len() of a 0-d tensor")
        return shape[0]

    def __getitem__(self, key):
        """Basic indexing as a view of the same storage: ints (dropping the
        dim), slices with a positive step, and Ellipsis, as numpy does (a
        negative step is refused: lpx has no negative strides)."""
        if self.kind:
            raise LpxTypeError(_EINVAL, f"a {self.kind} tensor is not indexed: dequantize it first")
        shape, strides = list(self.shape), list(self.strides)
        key = key if isinstance(key, tuple) else (key,)
        if key.count(Ellipsis) > 1:
            raise LpxIndexError(_ERANGE, "an index can only have a single ellipsis")
        if Ellipsis in key:
            i = key.index(Ellipsis)
            fill = len(shape) - (len(key) - 1)
            key = key[:i] + (slice(None),) * max(fill, 0) + key[i + 1:]
        if len(key) > len(shape):
            raise LpxIndexError(_ERANGE, f"too many indices ({len(key)}) for a {len(shape)}-d tensor")
        off = _lib.lpx_tensor_offset(self._h)
        nshape, nstrides = [], []
        for d, k in enumerate(key):
            if isinstance(k, bool) or not isinstance(k, (int, slice)) and not hasattr(k, "__index__"):
                raise LpxTypeError(_EINVAL, f"index {k!r}: lpx indexes with ints, slices and ...")
            if isinstance(k, slice):
                start, stop, step = k.indices(shape[d])
                if step < 0:
                    raise LpxValueError(_EINVAL, f"slice step {step}: lpx strides are non-negative, so a "
                                                 "reversed slice is not a view (reverse a numpy() copy)")
                n = len(range(start, stop, step))
                off += start * strides[d] if n else 0
                nshape.append(n)
                nstrides.append(strides[d] * step)
            else:
                i = k.__index__()
                if not -shape[d] <= i < shape[d]:
                    raise LpxIndexError(_ERANGE, f"index {i} is out of range for dim {d} of size {shape[d]}")
                off += (i + shape[d] if i < 0 else i) * strides[d]
        nshape += shape[len(key):]
        nstrides += strides[len(key):]
        nd = len(nshape)
        s = (C.c_int64 * max(nd, 1))(*nshape)
        st = (C.c_int64 * max(nd, 1))(*nstrides)
        out = C.c_void_p()
        _check(_lib.lpx_tensor_view_of(self._h, nd, s, st, off, C.byref(out)))
        return Tensor(out)

    # ---- DLPack
    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this (dense) tensor: versioned
        ("dltensor_versioned") when max_version >= (1, 0), else legacy
        ("dltensor"). copy=True exports a copy; copy=False and None export
        the tensor itself (lpx never needs to copy). On CUDA, `stream` is
        the consumer's stream (DLPack's numbering: 1 legacy default, 2
        per-thread, -1 none): it is made to wait for the work lpx queued,
        through an event, as the protocol asks of a producer."""
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError(f"lpx cannot export to device {tuple(dl_device)} (tensor is on {self.device})")
        if self.kind:
            raise BufferError(f"a {self.kind} tensor has no dense buffer: dequantize it, or export its inner()")
        t = clone(self) if copy else self
        if self.device[0] == _DEVICE_CUDA and stream != -1:
            _cuda_stream_wait(self.device[1], stream)
        out = C.c_void_p()
        if max_version is not None and tuple(max_version)[0] >= 1:
            _check(_lib.lpx_to_dlpack(t._h, C.byref(out)))
            return _capsule_new(out.value, _VERSIONED)
        if t.readonly:
            raise BufferError("a read-only tensor cannot be exported as a legacy DLPack capsule "
                              "(pass max_version=(1, 0))")
        _check(_lib.lpx_to_dlpack_legacy(t._h, False, C.byref(out)))
        return _capsule_new(out.value, _LEGACY)

    # ---- ops: tensors (or numpy arrays) and Python scalars
    def __add__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return _op(load_library().lpx_add_scalar, self._live(), float(other))
        return add(self, other)

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return _op(load_library().lpx_add_scalar, self._live(), -float(other))
        return sub(self, other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return _op(load_library().lpx_mul_scalar, self._live(), float(other))
        return mul(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return _op(load_library().lpx_mul_scalar, self._live(), 1.0 / float(other))
        return div(self, other)

    def __neg__(self):
        return _op(load_library().lpx_neg, self._live())

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
_DELETER = C.CFUNCTYPE(None, C.c_void_p)

_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"


class _DLManagedTensor(C.Structure):
    # DLTensor (data, device{int32,int32}, ndim, dtype{u8,u8,u16}, shape, strides, byte_offset), ctx, deleter
    _fields_ = [("data", C.c_void_p), ("device_type", C.c_int32), ("device_id", C.c_int32), ("ndim", C.c_int32),
                ("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16), ("shape", C.c_void_p),
                ("strides", C.c_void_p), ("byte_offset", C.c_uint64), ("manager_ctx", C.c_void_p),
                ("deleter", _DELETER)]


class _DLManagedTensorVersioned(C.Structure):
    # version{u32 major, u32 minor}, manager_ctx, deleter, flags, DLTensor
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("manager_ctx", C.c_void_p), ("deleter", _DELETER),
                ("flags", C.c_uint64), ("data", C.c_void_p), ("device_type", C.c_int32), ("device_id", C.c_int32),
                ("ndim", C.c_int32), ("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16),
                ("shape", C.c_void_p), ("strides", C.c_void_p), ("byte_offset", C.c_uint64)]




def _capsule_new(ptr, name):
    # the destructor is liblpx's C one: a Python destructor cannot run while
    # a refusing consumer's exception is pending (it then raised SystemError
    # and leaked the tensor)
    lib = load_library()
    return _api.PyCapsule_New(ptr, name, C.cast(lib.lpx_dlpack_capsule_destructor, C.c_void_p))


def capsule_name(cap):
    """'dltensor_versioned', 'dltensor' (unconsumed), or None."""
    for name in (_VERSIONED, _LEGACY):
        if _api.PyCapsule_IsValid(cap, name):
            return name.decode()
    return None


_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13


def _consumer_stream(obj, stream):
    """The `stream` to pass to obj.__dlpack__: None for a producer off
    CUDA; for a CUDA producer the given stream, else lpx-cuda's stream of
    its device (None when lpx-cuda is not loaded: nothing of lpx's runs on
    that memory then)."""
    try:
        dev = obj.__dlpack_device__()
    except (AttributeError, TypeError):
        return None
    if int(dev[0]) not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        return None
    if stream is not None:
        return int(stream)
    try:
        return cuda_stream(int(dev[1])) or None
    except LpxLoadError:
        return None


def from_dlpack(obj, *, stream=None):
    """Imports anything with __dlpack__ (numpy arrays, torch tensors, lpx
    tensors) or an unconsumed DLPack capsule, versioned or legacy, as an lpx
    Tensor, zero-copy. Asks producers for a versioned capsule first
    (max_version=(1, 1)) and falls back to the legacy protocol. The
    producer's memory is released when the last lpx view of it dies.

    On CUDA the handshake orders the producer's work before lpx's: lpx is
    the consumer, so it passes `stream=` to obj.__dlpack__ (lpx-cuda's
    stream of the tensor's device, or the `stream` given, a cudaStream_t as
    an int), and the producer makes that stream wait for the work it queued
    on its own (torch: an event on its current stream). Without it, lpx's
    kernels could read the memory before the producer has written it."""
    lib = load_library()
    if hasattr(obj, "__dlpack__"):
        s = _consumer_stream(obj, stream)
        kw = {} if s is None else {"stream": s}
        try:
            cap = obj.__dlpack__(max_version=(1, 1), **kw)
        except TypeError:   # a producer that predates DLPack 1.0
            cap = obj.__dlpack__(**kw)
    else:
        cap = obj
    out = C.c_void_p()
    if _api.PyCapsule_IsValid(cap, _VERSIONED):
        p = _api.PyCapsule_GetPointer(cap, _VERSIONED)
        _check(lib.lpx_from_dlpack(p, C.byref(out)))
        _api.PyCapsule_SetName(cap, b"used_dltensor_versioned")  # lpx owns it now
    elif _api.PyCapsule_IsValid(cap, _LEGACY):
        p = _api.PyCapsule_GetPointer(cap, _LEGACY)
        _check(lib.lpx_from_dlpack_legacy(p, C.byref(out)))
        _api.PyCapsule_SetName(cap, b"used_dltensor")
    else:
        raise LpxError(-1, "from_dlpack: not an unconsumed 'dltensor' or 'dltensor_versioned' capsule")
    return Tensor(out)


def from_numpy(a, copy=False, dtype=None):
    """An lpx Tensor over numpy array `a` (zero-copy through DLPack when
    numpy supports it, else a copy). `dtype` (an lpx name or a numpy dtype)
    converts explicitly, e.g. float64 input: from_numpy(a, dtype="f32") or
    dtype="bf16" (rounded once, from f32). ml_dtypes' bfloat16 and float8
    arrays are taken as bf16 / f8e4m3fn / f8e5m2."""
    import numpy as np
    a = np.asarray(a)
    if dtype is not None:
        want = _dtype(dtype)
        name = load_library().lpx_dtype_name(want).decode()
        np_direct = {"f32": np.float32, "f16": np.float16, "u8": np.uint8, "i8": np.int8, "i32": np.int32,
                     "i64": np.int64, "bool": np.bool_}
        if name in np_direct:
            return from_numpy(a.astype(np_direct[name]), copy=True)
        return cast(from_numpy(a.astype(np.float32), copy=True), name)
    ml = _np_name(a.dtype)
    if ml in ("bf16", "f8e4m3fn", "f8e5m2"):
        # ml_dtypes arrays: the same bits, copied into an lpx tensor
        src = np.ascontiguousarray(a)
        out = C.c_void_p()
        s = (C.c_int64 * max(a.ndim, 1))(*a.shape)
        lib = load_library()
        _check(lib.lpx_tensor_new(_dtype(ml), a.ndim, s, _Device(1, 0), C.byref(out)))
        t = Tensor(out)
        if src.nbytes:
            C.memmove(lib.lpx_tensor_data(t._h), src.ctypes.data, src.nbytes)
        return t
    if not copy and hasattr(a, "__dlpack__") and a.dtype != np.bool_:
        try:
            return from_dlpack(a)
        except (BufferError, TypeError, LpxError):
            pass
    lib = load_library()
    names = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.uint8): "u8",
             np.dtype(np.int8): "i8", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.bool_): "bool"}
    if a.dtype not in names:
        hint = " (convert explicitly: from_numpy(a, dtype=\"f32\"))" if a.dtype.kind == "f" else ""
        raise LpxTypeError(_EDTYPE, f"numpy dtype {a.dtype} has no lpx dtype{hint}")
    shape = (C.c_int64 * max(a.ndim, 1))(*a.shape)
    out = C.c_void_p()
    _check(lib.lpx_tensor_new(_dtype(names[a.dtype]), a.ndim, shape, _Device(1, 0), C.byref(out)))
    t = Tensor(out)
    np.copyto(t._array(), np.ascontiguousarray(a), casting="no")
    return t


def _t(x):
    return x if isinstance(x, Tensor) else from_numpy(x)


def _opt(x):
    """x as a Tensor, or None. Keep the result in a local for as long as
    its handle is in use: a temporary Tensor releases its lpx reference
    when it is collected."""
    return None if x is None else _t(x)


def _h(t):
    """The handle of an optional Tensor (already converted with _opt)."""
    return None if t is None else t._h


def _op(fn, *args):
    out = C.c_void_p()
    _check(fn(*args, C.byref(out)))
    return Tensor(out)


def add(a, b):
    a, b = _t(a), _t(b)
    return _op(load_library().lpx_add, a._h, b._h)


def sub(a, b):
    a, b = _t(a), _t(b)
    return _op(load_library().lpx_sub, a._h, b._h)


def mul(a, b):
    a, b = _t(a), _t(b)
    return _op(load_library().lpx_mul, a._h, b._h)


def div(a, b):
    a, b = _t(a), _t(b)
    return _op(load_library().lpx_div, a._h, b._h)


def matmul(a, b):
    a, b = _t(a), _t(b)
    return _op(load_library().lpx_matmul, a._h, b._h)


def cast(x, dtype, saturate=False):
    x = _t(x)
    return _op(load_library().lpx_cast, x._h, _dtype(dtype), bool(saturate))


def clone(x):
    """A contiguous copy with its own storage."""
    x = _t(x)
    return _op(load_library().lpx_clone, x._h)


# ---- fused neural-network ops ------------------------------------------------

def _op2(fn, *args):
    a, b = C.c_void_p(), C.c_void_p()
    _check(fn(*args, C.byref(a), C.byref(b)))
    return tuple(Tensor(h) if h.value else None for h in (a, b))


def rmsnorm(x, weight=None, eps=1e-6):
    """(y, rstd): y = x * rstd * weight over the last dim, rstd =
    1 / sqrt(mean(x^2) + eps) in f32 ([..., 1], kept for the backward); the
    math in f32 whatever x's dtype, y rounded once to x's dtype. One kernel
    (lpx_rmsnorm)."""
    x, w = _t(x), _opt(weight)
    return _op2(load_library().lpx_rmsnorm, x._h, _h(w), float(eps))


def rmsnorm_backward(grad, x, weight, rstd):
    """(grad_x, grad_weight) of rmsnorm (grad_weight None without a
    weight)."""
    g, x, w, r = _t(grad), _t(x), _opt(weight), _t(rstd)
    return _op2(load_library().lpx_rmsnorm_backward, g._h, x._h, _h(w), r._h)


def swiglu(gate, up):
    """silu(gate) * up in one kernel (f32 math, one rounding to gate's
    dtype; broadcasting as mul)."""
    g, u = _t(gate), _t(up)
    return _op(load_library().lpx_swiglu, g._h, u._h)


def swiglu_backward(grad, gate, up):
    """(grad_gate, grad_up) of swiglu in one kernel: grad * up * silu'(gate)
    and grad * silu(gate); grad, gate and up of one shape."""
    g, a, b = _t(grad), _t(gate), _t(up)
    return _op2(load_library().lpx_swiglu_backward, g._h, a._h, b._h)


# ---- float8 ------------------------------------------------------------------

def float8_quantize(x, fp8="f8e4m3fn", rowwise=False, axis=None, pow2_scale=False, nonsaturating=False,
                    role=None, scale=None, return_stats=False):
    """Float8 tensor of dense x (f32/bf16/f16: the logical dtype). Dynamic
    tensorwise scaling by default; rowwise=True (or axis=d) for one scale
    per row (per slice along d); scale= a static f32 scale; role one of
    'input', 'weight', 'grad_output'. With return_stats, also returns a dict
    of the cast's statistics (amax, scale, underflow, saturation, nan)."""
    lib = load_library()
    x = _t(x)
    o = _Float8QuantOpts()
    o.struct_size = C.sizeof(_Float8QuantOpts)
    o.fp8 = _fp8(fp8)
    if rowwise or axis is not None:
        o.granularity = _AXISWISE
        o.axis = -1 if axis is None else int(axis)
    if role not in _ROLES:
        raise LpxValueError(_EINVAL, f"role {role!r}: one of {sorted(r for r in _ROLES if r)} or None")
    o.role = _ROLES[role]
    o.pow2_scale = bool(pow2_scale)
    o.nonsaturating = bool(nonsaturating)
    s = _t(scale) if scale is not None else None
    o.scale = s._h.value if s is not None else None
    st = _Float8Stats()
    out = C.c_void_p()
    _check(lib.lpx_float8_quantize(x._h, C.byref(o), C.byref(out), C.byref(st)))
    t = Tensor(out)
    if return_stats:
        return t, {f: getattr(st, f) for f, _ in _Float8Stats._fields_}
    return t


def float8_dequantize(t, dtype=None):
    """Dense copy of a float8 tensor in `dtype` (default: its logical dtype):
    decode(q) * scale_inv in f32, rounded once."""
    t = _t(t)
    return _op(load_library().lpx_float8_dequantize, t._h, _FLOAT8_LOGICAL if dtype is None else _dtype(dtype))


def float8_info(t):
    """{'fp8', 'logical', 'role', 'granularity', 'axis'} of a float8 tensor."""
    i = _Float8Info()
    _check(load_library().lpx_float8_get_info(t._h, C.byref(i)))
    roles = {v: k for k, v in _ROLES.items()}
    return {"fp8": _lib.lpx_dtype_name(i.fp8).decode(), "logical": _lib.lpx_dtype_name(i.logical).decode(),
            "role": roles.get(i.role), "granularity": "axiswise" if i.granularity == _AXISWISE else "tensorwise",
            "axis": i.axis}


def float8_mm(a, b, bias=None, out_dtype=None):
    """Scaled fp8 GEMM of float8 tensors a [M, K] and b [K, N]."""
    bias = _opt(bias)
    return _op(load_library().lpx_float8_mm, a._h, b._h, _h(bias),
               _FLOAT8_LOGICAL if out_dtype is None else _dtype(out_dtype))


_GEMM_MODES = {"fp8": 0, "high_precision": 1, "fake_quant": 2}
_GRANULARITIES = {"tensorwise": 0, "axiswise": 1, "block": 2}
_SCALINGS = {"dynamic": 0, "delayed": 1}
_GEMMS = ("fprop", "dgrad", "wgrad")


def _name_of(table, value):
    for k, v in table.items():
        if v == value:
            return k
    return value


def _choose(table, what, value):
    if value not in table:
        raise LpxValueError(_EINVAL, f"{what} must be one of {sorted(table)}, not {value!r}")
    return table[value]


class _OperandView:
    """One operand's cast within a Float8Recipe GEMM (a view of the C
    struct: setting a field changes the recipe)."""

    __slots__ = ("_c",)

    def __init__(self, c):
        self._c = c

    @property
    def dtype(self):
        """'f8e4m3fn' or 'f8e5m2'."""
        return _lib.lpx_dtype_name(self._c.dtype).decode()

    @dtype.setter
    def dtype(self, v):
        self._c.dtype = _fp8(v)

    @property
    def granularity(self):
        """'tensorwise' or 'axiswise' (one scale per row of A / column of B)."""
        return _name_of(_GRANULARITIES, self._c.granularity)

    @granularity.setter
    def granularity(self, v):
        self._c.granularity = _choose(_GRANULARITIES, "granularity", v)

    @property
    def scaling(self):
        """'dynamic' (from this tensor's amax) or 'delayed' (amax history)."""
        return _name_of(_SCALINGS, self._c.scaling)

    @scaling.setter
    def scaling(self, v):
        self._c.scaling = _choose(_SCALINGS, "scaling", v)

    @property
    def pow2_scale(self):
        """Dynamic scales rounded down to powers of two."""
        return bool(self._c.pow2_scale)

    @pow2_scale.setter
    def pow2_scale(self, v):
        self._c.pow2_scale = bool(v)

    def __repr__(self):
        return (f"{self.dtype}/{self.granularity}/{self.scaling}" + ("/pow2" if self.pow2_scale else ""))


class _GemmView:
    """One GEMM of a Float8Recipe: mode ('fp8', 'high_precision',
    'fake_quant') and its operands a and b."""

    __slots__ = ("_c",)

    def __init__(self, c):
        self._c = c

    @property
    def mode(self):
        return _name_of(_GEMM_MODES, self._c.mode)

    @mode.setter
    def mode(self, v):
        self._c.mode = _choose(_GEMM_MODES, "mode", v)

    @property
    def a(self):
        return _OperandView(self._c.a)

    @property
    def b(self):
        return _OperandView(self._c.b)

    def __repr__(self):
        return f"{self.mode}(a={self.a!r}, b={self.b!r})" if self.mode != "high_precision" else self.mode


class Float8Recipe:
    """A Float8Linear recipe (lpx_float8_linear_recipe): a preset
    ('tensorwise', 'rowwise', 'rowwise_with_gw_hp', 'delayed', 'blockwise') whose three
    GEMMs can be overridden one by one, as torchao's Float8LinearConfig and
    TransformerEngine's recipes allow:

        r = lpx.Float8Recipe("tensorwise")
        r.wgrad.mode = "high_precision"      # grad_W = g^T @ x in bf16/f32
        r.dgrad.a.dtype = "f8e4m3fn"         # grad_output in e4m3 for dgrad
        r.fast_accum = {"fprop", "dgrad"}

    fprop: out = x @ W^T (a = x, b = W^T); dgrad: grad_x = g @ W (a = g,
    b = W); wgrad: grad_W = g^T @ x (a = g^T, b = x). The recipe is checked
    when a layer uses it."""

    def __init__(self, preset="tensorwise"):
        lib = load_library()
        if isinstance(preset, Float8Recipe):
            self._c = _Float8LinearRecipe()
            C.pointer(self._c)[0] = preset._c
            self.name = preset.name
            return
        if not isinstance(preset, str):
            raise LpxTypeError(_EINVAL, f"a recipe is a preset name or a Float8Recipe, not {type(preset).__name__}")
        self._c = _Float8LinearRecipe()
        st = lib.lpx_float8_linear_recipe_preset(preset.encode(), C.byref(self._c))
        if st == _ENOTFOUND:
            raise LpxValueError(st, lib.lpx_last_error().decode("utf-8", "replace"))
        _check(st)
        if self._c.struct_size != C.sizeof(_Float8LinearRecipe):
            raise LpxLoadError(_EPLUGIN, f"liblpx's Float8Linear recipe is {self._c.struct_size} bytes, this binding "
                                         f"expects {C.sizeof(_Float8LinearRecipe)}: binding and library disagree")
        self.name = preset

    fprop = property(lambda self: _GemmView(self._c.fprop), doc="out = x @ W^T")
    dgrad = property(lambda self: _GemmView(self._c.dgrad), doc="grad_x = g @ W")
    wgrad = property(lambda self: _GemmView(self._c.wgrad), doc="grad_W = g^T @ x")

    @property
    def nonsaturating(self):
        """Casts overflow to NaN/inf instead of clamping."""
        return bool(self._c.nonsaturating)

    @nonsaturating.setter
    def nonsaturating(self, v):
        self._c.nonsaturating = bool(v)

    @property
    def fast_accum(self):
        """The GEMMs ({'fprop', 'dgrad', 'wgrad'}) whose fp8 products may
        accumulate without promotion to f32."""
        return {g for i, g in enumerate(_GEMMS) if self._c.fast_accum >> i & 1}

    @fast_accum.setter
    def fast_accum(self, gemms):
        bits = 0
        for g in gemms:
            if g not in _GEMMS:
                raise LpxValueError(_EINVAL, f"fast_accum names GEMMs of {_GEMMS}, not {g!r}")
            bits |= 1 << _GEMMS.index(g)
        self._c.fast_accum = bits

    @property
    def history_len(self):
        """Amax history length of the delayed-scaling states (0: 1024)."""
        return self._c.delayed.history_len

    @history_len.setter
    def history_len(self, v):
        self._c.delayed.history_len = int(v)

    @property
    def uses_delayed(self):
        """True when some operand uses delayed scaling (the layer then
        carries amax histories, saved with its state)."""
        return any(getattr(self._c, g).mode != 1 and
                   (getattr(self._c, g).a.scaling == 1 or getattr(self._c, g).b.scaling == 1) for g in _GEMMS)

    def __repr__(self):
        return (f"Float8Recipe({self.name!r}: fprop={self.fprop!r}, dgrad={self.dgrad!r}, wgrad={self.wgrad!r}, "
                f"fast_accum={sorted(self.fast_accum)})")


def _report_dict(r, gemms):
    out = {}
    for g in gemms:
        gr = getattr(r, g)
        if gr.mode < 0:
            continue
        d = {"mode": _name_of(_GEMM_MODES, gr.mode)}
        for side in ("a", "b"):
            o = getattr(gr, side)
            d[side] = {"quantized": o.quantized, "reused": o.reused, "given_fp8": o.given_fp8,
                       "dtype": _lib.lpx_dtype_name(o.dtype).decode() if o.dtype else None,
                       **{f: getattr(o.stats, f) for f, _ in _Float8Stats._fields_}}
        out[g] = d
    return out


class Float8LinearCtx:
    """What one Float8Linear forward keeps for its backward (lpx's
    lpx_float8_linear_ctx: references to x, W and their fp8 casts). Freed
    by backward(free=True), close(), or garbage collection."""

    __slots__ = ("_p", "_bias", "report")

    def __init__(self, p, has_bias):
        self._p, self._bias, self.report = p, has_bias, {}

    def backward(self, grad_out, need_x=True, need_w=True, free=True):
        """(grad_x, grad_w, grad_b) as lpx Tensors (None where not asked or
        the layer has no bias); `report` gets the dgrad/wgrad statistics."""
        if not self._p or not self._p.value:
            raise LpxValueError(_EINVAL, "Float8Linear backward: the forward context was freed (one backward "
                                         "per forward)")
        g = _t(grad_out)
        gx, gw, gb = C.c_void_p(), C.c_void_p(), C.c_void_p()
        rep = _LinearReport()
        try:
            _check(_lib.lpx_float8_linear_backward(self._p, g._h, C.byref(gx) if need_x else None,
                                                   C.byref(gw) if need_w else None,
                                                   C.byref(gb) if self._bias else None, C.byref(rep)))
        finally:
            if free:
                self.close()
        self.report.update(_report_dict(rep, ("dgrad", "wgrad")))
        return tuple(Tensor(h) if h.value else None for h in (gx, gw, gb))

    def close(self):
        if self._p and self._p.value and _lib is not None:
            _lib.lpx_float8_linear_ctx_free(self._p)
        self._p = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


class Float8Linear:
    """A linear layer out = x @ W^T (+ b) through lpx's Float8Linear.
    `recipe` is a preset name or a Float8Recipe (per-GEMM overrides).
    forward(x) keeps what backward(grad_out) needs; backward returns
    (grad_x, grad_w, grad_b). W and b are dense (or float8) tensors or
    arrays (weight may be None when every forward_ctx passes one). last_report holds the fp8 statistics of the last forward and
    backward: per GEMM, per operand, amax, scale, underflow and saturation
    fractions. With a delayed-scaling recipe the layer owns amax
    histories: state_bytes()/load_state_bytes() save and restore them."""

    def __init__(self, weight, bias=None, recipe="tensorwise"):
        lib = load_library()
        self.weight = None if weight is None else _t(weight)
        self.bias = None if bias is None else _t(bias)
        self.recipe = Float8Recipe(recipe)
        self._state = _Float8LinearState()
        _check(lib.lpx_float8_linear_state_init(C.byref(self._state), C.byref(self.recipe._c)))
        self._ctx = None
        self.last_report = {}

    def forward_ctx(self, x, weight=None, bias=None, keep=True):
        """(out, ctx): the forward with this layer's recipe and state on x
        (and, when given, on another weight/bias of the same shape, such as
        a framework's parameter seen through DLPack); ctx (None unless
        keep) runs the matching backward."""
        x = _t(x)
        w = self.weight if weight is None else _t(weight)
        if w is None:
            raise LpxValueError(_EINVAL, "Float8Linear: no weight (give one to the constructor or to forward_ctx)")
        b = self.bias if bias is None else _t(bias)
        out, p = C.c_void_p(), C.c_void_p()
        rep = _LinearReport()
        _check(_lib.lpx_float8_linear_forward(C.byref(self.recipe._c), C.byref(self._live()), x._h, w._h, _h(b),
                                              C.byref(out), C.byref(p) if keep else None, C.byref(rep)))
        ctx = Float8LinearCtx(p, b is not None) if keep else None
        self.last_report = _report_dict(rep, ("fprop",))
        if ctx is not None:
            ctx.report = self.last_report
        return Tensor(out), ctx

    def forward(self, x):
        if self._ctx is not None:
            self._ctx.close()
        out, self._ctx = self.forward_ctx(x)
        return out

    __call__ = forward

    def backward(self, grad_out):
        if self._ctx is None:
            raise LpxError(_EINVAL, "Float8Linear.backward before forward")
        ctx, self._ctx = self._ctx, None
        return ctx.backward(grad_out)

    def _live(self):
        if self._state is None:
            raise LpxValueError(_EINVAL, "Float8Linear is closed: close() freed its scaling state")
        return self._state

    def _states(self):
        st = self._live()
        return [(n, getattr(st, n)) for n in ("input", "weight", "grad_output")]

    def state_bytes(self):
        """{'input'|'weight'|'grad_output': bytes} of the delayed-scaling
        states this recipe uses (lpx_float8_delayed_save blobs; {} for
        dynamic recipes)."""
        out = {}
        for name, h in self._states():
            if not h:
                continue
            size = C.c_size_t(0)
            _check(_lib.lpx_float8_delayed_save(h, None, 0, C.byref(size)))
            buf = C.create_string_buffer(size.value)
            _check(_lib.lpx_float8_delayed_save(h, buf, size, C.byref(size)))
            out[name] = buf.raw[:size.value]
        return out

    def load_state_bytes(self, blobs):
        """Restores what state_bytes() returned (each blob is checked; a
        state this recipe lacks, or one missing from blobs, is an error)."""
        have = {n for n, h in self._states() if h}
        if set(blobs) != have:
            raise LpxValueError(_EINVAL, f"Float8Linear state: this recipe keeps {sorted(have)}, "
                                         f"given {sorted(blobs)}")
        for name, h in self._states():
            if h:
                data = bytes(blobs[name])
                _check(_lib.lpx_float8_delayed_load(h, data, len(data)))

    def close(self):
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if _lib is not None and self._state is not None:
            _lib.lpx_float8_linear_state_destroy(C.byref(self._state))
            self._state = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def float8_linear(x, w, bias=None, recipe="tensorwise"):
    """One Float8Linear forward (no backward context kept)."""
    layer = Float8Linear(w, bias, recipe)
    try:
        return layer.forward_ctx(x, keep=False)[0]
    finally:
        layer.close()


def kind_unflatten(kind, dtype, shape, inner, meta=b""):
    """Rebuilds a kind tensor (an 'nf4', 'float8', plugin kind...) from its
    inner tensors and metadata, the inverse of Tensor.inner / Tensor.meta
    (lpx_kind_unflatten: the kind validates every byte, so this is safe on
    untrusted input). `inner` is a sequence of Tensors or arrays, shared
    (zero copy), in the kind's order; `dtype` the logical dtype."""
    lib = load_library()
    k = C.c_void_p()
    st = lib.lpx_kind_find(str(kind).encode(), C.byref(k))
    if st:
        raise LpxValueError(st, lib.lpx_last_error().decode("utf-8", "replace"))
    ts = [_t(x) for x in inner]
    arr = (C.c_void_p * max(1, len(ts)))(*[t._h.value for t in ts])
    shp = (C.c_int64 * max(1, len(shape)))(*[int(v) for v in shape])
    meta = bytes(meta)
    out = C.c_void_p()
    _check(lib.lpx_kind_unflatten(k, _dtype(dtype), len(shape), shp, arr, len(ts), meta or None, len(meta),
                                  C.byref(out)))
    return Tensor(out)


_stream_fn = None
_stream_wait_fn = None


def _cuda_plugin_symbol(name):
    lib = load_library()
    p = C.c_void_p()
    if lib.lpx_plugin_find(b"cuda", C.byref(p)) != 0:
        lib.lpx_clear_error()
        raise LpxLoadError(_EPLUGIN, "lpx-cuda.so is not loaded (no GPU, or LPX_PLUGIN_PATH does not name it)")
    sym = lib.lpx_plugin_symbol(p, name.encode())
    if not sym:
        raise LpxLoadError(_EPLUGIN, f"lpx-cuda.so exports no {name}")
    return sym


def _cuda_stream_wait(device, stream):
    """The consumer's `stream` waits for lpx's work on `device` (DLPack
    export; None: the legacy default stream)."""
    global _stream_wait_fn
    if _stream_wait_fn is None:
        _stream_wait_fn = C.CFUNCTYPE(C.c_int, C.c_int, C.c_void_p)(_cuda_plugin_symbol("lpx_cuda_stream_wait"))
    _check(_stream_wait_fn(int(device), None if stream is None else int(stream)))


def cuda_stream(device=0):
    """The CUDA stream (a cudaStream_t, as an int) on which lpx-cuda.so
    queues its work for `device`: order a framework's stream against it
    (lpx.torch does) so that neither reads the other's results early.
    Raises LpxLoadError when lpx-cuda.so is not loaded."""
    global _stream_fn
    if _stream_fn is None:
        _stream_fn = C.CFUNCTYPE(C.c_void_p, C.c_int)(_cuda_plugin_symbol("lpx_cuda_stream"))
    return _stream_fn(int(device)) or 0


# ---- nf4 / QLoRA ---------------------------------------------------------------

def nf4_quantize(x, block=64, scaler_block=0, pad=True):
    """NF4 tensor of dense x (f32/f16/bf16: the logical dtype), with double
    quantized block scales (block 64 by default; scaler_block 0: chosen per
    tensor, the largest count up to 256 that divides the block count)."""
    cfg = _Nf4Config(int(block), int(scaler_block), bool(pad))
    x = _t(x)
    return _op(load_library().lpx_nf4_quantize, x._h, C.byref(cfg))


def nf4_dequantize(t, dtype=None):
    """Dense copy of an nf4 tensor in `dtype` (default: its logical dtype)."""
    return _op(load_library().lpx_nf4_dequantize, t._h, -1 if dtype is None else _dtype(dtype))


def nf4_info(t):
    i = _Nf4Info()
    _check(load_library().lpx_nf4_get_info(t._h, C.byref(i)))
    return {f: getattr(i, f) for f, _ in _Nf4Info._fields_}


def nf4_linear(x, w, bias=None):
    """x @ W^T (+ bias) with an nf4 weight W (dequantized in tiles)."""
    x, bias = _t(x), _opt(bias)
    return _op(load_library().lpx_nf4_linear, x._h, w._h, _h(bias))


def nf4_linear_backward(grad, w):
    """grad_x = grad @ W for an nf4 weight (frozen: no grad_W)."""
    grad = _t(grad)
    return _op(load_library().lpx_nf4_linear_backward, grad._h, w._h)


def _qlora_opts(alpha, dropout, seed):
    return _QloraOpts(float(alpha), float(dropout), int(seed))


def qlora_linear(x, w, a, b, bias=None, alpha=16.0, dropout=0.0, seed=0, return_xa=False):
    """QLoRA forward: x @ W^T + bias + (alpha / r) * (drop(x) @ A^T) @ B^T,
    W nf4 [out, in] (frozen), A [r, in], B [out, r]. With return_xa, also
    returns drop(x) @ A^T for the backward."""
    lib = load_library()
    o = _qlora_opts(alpha, dropout, seed)
    x, a, b, bias = _t(x), _t(a), _t(b), _opt(bias)
    out, xa = C.c_void_p(), C.c_void_p()
    _check(lib.lpx_qlora_linear(x._h, w._h, _h(bias), a._h, b._h, C.byref(o), C.byref(out),
                                C.byref(xa) if return_xa else None))
    return (Tensor(out), Tensor(xa)) if return_xa else Tensor(out)


def qlora_linear_backward(grad, x, w, a, b, xa=None, alpha=16.0, dropout=0.0, seed=0):
    """(grad_x, grad_a, grad_b) of qlora_linear (same alpha/dropout/seed)."""
    lib = load_library()
    o = _qlora_opts(alpha, dropout, seed)
    grad, x, a, b, xa = _t(grad), _t(x), _t(a), _t(b), _opt(xa)
    gx, ga, gb = C.c_void_p(), C.c_void_p(), C.c_void_p()
    _check(lib.lpx_qlora_linear_backward(grad._h, x._h, w._h, a._h, b._h, _h(xa), C.byref(o),
                                         C.byref(gx), C.byref(ga), C.byref(gb)))
    return Tensor(gx), Tensor(ga), Tensor(gb)


# ---- safetensors -----------------------------------------------------------------

def save_file(tensors, path, metadata=None):
    """Writes {name: Tensor or array} to `path` atomically (safetensors;
    kind tensors as their inner tensors plus a __metadata__ entry), with
    user `metadata` {str: str}."""
    lib = load_library()
    items = [(str(k), _t(v)) for k, v in tensors.items()]
    n = len(items)
    names = (C.c_char_p * max(n, 1))(*[k.encode() for k, _ in items])
    handles = (C.c_void_p * max(n, 1))(*[t._h.value for _, t in items])
    meta = list((metadata or {}).items())
    kvs = (_KV * max(len(meta), 1))(*[_KV(str(k).encode(), str(v).encode()) for k, v in meta])
    _check(lib.lpx_safetensors_save(os.fsencode(path), n, names, handles, len(meta), kvs))


class safe_open:
    """An open safetensors file: keys(), get_tensor(name, quantize=None,
    copy=True), kind_of(name), metadata(). lpx maps the file (a private
    mapping) and get_tensor copies each tensor into memory of its own, so
    the tensors outlive the handle and do not depend on the file: rewriting
    or truncating it afterwards changes nothing they hold. copy=False skips
    the copy (zero-copy where the data is aligned): such a tensor shares the
    file's pages, sees later writes to the file, and reading it after the
    file is truncated kills the process (SIGBUS). A context manager; after
    close() every method raises LpxValueError."""

    def __init__(self, path):
        lib = load_library()
        self._f = C.c_void_p()
        self._path = os.fsdecode(path)
        _check(lib.lpx_safetensors_open(os.fsencode(path), C.byref(self._f)))

    def _live(self):
        if not self._f or not self._f.value:
            raise LpxValueError(_EINVAL, f"safe_open('{self._path}') is closed")
        return self._f

    def keys(self):
        f = self._live()
        return [_lib.lpx_safetensors_name(f, i).decode() for i in range(_lib.lpx_safetensors_count(f))]

    def kind_of(self, name):
        k = _lib.lpx_safetensors_kind_of(self._live(), name.encode())
        if k is None:
            raise KeyError(name)
        return k.decode() or None

    def get_tensor(self, name, quantize=None, copy=True):
        """Entry `name`, in memory of its own (copy=False: possibly a view
        of the file's pages, see the class); quantize='nf4' / 'float8' / a
        plugin kind reads a dense entry quantized on load (a new tensor
        either way)."""
        f = self._live()
        out = C.c_void_p()
        if quantize is None:
            _check(_lib.lpx_safetensors_get(f, name.encode(), C.byref(out)))
        else:
            k = C.c_void_p()
            _check(_lib.lpx_kind_find(str(quantize).encode(), C.byref(k)))
            _check(_lib.lpx_safetensors_get_quantized(f, name.encode(), k, C.byref(out)))
        t = Tensor(out)
        # a dense entry quantized on load is new memory already; an entry
        # read as stored may be the mapping's pages
        if copy and (quantize is None or self.kind_of(name) == str(quantize)):
            t = _owned(t)
        return t

    def metadata(self):
        f = self._live()
        out = {}
        for i in range(_lib.lpx_safetensors_metadata_count(f)):
            v = C.c_char_p()
            k = _lib.lpx_safetensors_metadata_at(f, i, C.byref(v))
            out[k.decode()] = v.value.decode()
        return out

    @property
    def closed(self):
        return not self._f or not self._f.value

    def close(self):
        if self._f and self._f.value and _lib is not None:
            _lib.lpx_safetensors_close(self._f)
        self._f = C.c_void_p()

    def __enter__(self):
        self._live()
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _owned(t):
    """t copied into memory of its own (lpx_clone; a kind tensor whose kind
    does not clone is rebuilt from copies of its inner tensors)."""
    try:
        return clone(t)
    except LpxError:
        if not t.kind:
            raise
    return kind_unflatten(t.kind, t.dtype, t.shape, [clone(x) for x in t.inner().values()], t.meta())


def load_file(path, copy=True):
    """{name: Tensor} of every entry of a safetensors file (kind tensors
    rebuilt: nf4, float8, plugin kinds when their plugin is loaded), each
    in memory of its own: independent of the file once loaded (copy=False:
    views of the file's pages where aligned, see safe_open)."""
    with safe_open(path) as f:
        return {k: f.get_tensor(k, copy=copy) for k in f.keys()}


def load_plugin(path):
    """Loads an lpx plugin (e.g. lpx-mx.so) by path."""
    lib = load_library()
    out = C.c_void_p()
    _check(lib.lpx_plugin_load(str(path).encode(), C.byref(out)))

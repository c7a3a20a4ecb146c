"""lpx.Tensor: an owned reference to an lpx_tensor, numpy's and Python's
views of it (array interface, indexing, operators), and the conversions
every function of the binding applies to its tensor arguments."""
from . import _ffi
from ._errors import _EDTYPE, _EINVAL, _ENOTFOUND, _ERANGE, LpxError, LpxIndexError, LpxTypeError, LpxValueError
from ._ffi import check as _check, load_library

LPX_DEVICE_CPU = 1  # replaced by tensor.h's value when liblpx loads
_DEVICE_CUDA = 2    # LPX_DEVICE_CUDA (= DLPack's kDLCUDA)


_TENSOR_P = _TENSOR_PP = None


def _device_constants(lib):
    global LPX_DEVICE_CPU, _DEVICE_CUDA, _TENSOR_P, _TENSOR_PP
    LPX_DEVICE_CPU, _DEVICE_CUDA = lib.LPX_DEVICE_CPU, lib.LPX_DEVICE_CUDA
    _TENSOR_P, _TENSOR_PP = _ffi.ffi.typeof("lpx_tensor *"), _ffi.ffi.typeof("lpx_tensor **")


_ffi._on_load.append(_device_constants)


def _handle(h):
    """An lpx_tensor * of a handle: a cffi pointer, an int address or a
    ctypes c_void_p."""
    f = _ffi.ffi
    if f is None:
        load_library()
        f = _ffi.ffi
    if isinstance(h, f.CData):
        return h if f.typeof(h) is _TENSOR_P else f.cast("lpx_tensor *", h)
    if isinstance(h, int):
        return f.cast("lpx_tensor *", h)
    v = getattr(h, "value", None)   # a ctypes pointer
    if isinstance(v, int):
        return f.cast("lpx_tensor *", v)
    raise TypeError(f"an lpx tensor handle is an int or a pointer, not {type(h).__name__}")


def _new(dtype, shape):
    """A new contiguous CPU tensor (lpx_tensor_new)."""
    f = _ffi.ffi
    out = f.new("lpx_tensor **")
    dev = f.new("lpx_device *", {"type": _ffi.lib.LPX_DEVICE_CPU, "index": 0})
    _check(_ffi.lib.lpx_tensor_new(dtype, len(shape), f.new("int64_t[]", [int(v) for v in shape] or [0]), dev[0], out))
    return Tensor(out[0])


def dtype_names():
    """Names of every registered dtype, by index."""
    lib = _ffi.L()
    return [_ffi.string(lib.lpx_dtype_name(i)) for i in range(lib.lpx_dtype_count())]


def _dtype_name(d):
    return _ffi.string(_ffi.lib.lpx_dtype_name(d))


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
    lib = _ffi.L()
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
        self._hp = _handle(handle)
        self._closed = False
        self._exported = False   # numpy arrays may have this object as their base
        self._keep = keep  # Python objects that own memory the tensor borrows

    @classmethod
    def _borrowed(cls, ptr, keep=None):
        """A new reference to a tensor lpx lends (an inner tensor)."""
        load_library()
        p = _handle(ptr)
        _ffi.lib.lpx_tensor_retain(p)
        return cls(p, keep)

    @property
    def handle(self):
        return _ffi.addr(self._live())

    @property
    def _h(self):
        """The lpx handle, or LpxValueError once closed (every use of the
        handle goes through here, so a closed tensor never reaches C)."""
        return self._live()

    def _live(self):
        if self._closed or self._hp is None:
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
        if self._hp is not None and _ffi.lib is not None:
            _ffi.lib.lpx_tensor_release(self._hp)
        self._hp = None

    def __del__(self):
        try:
            self._closed = True
            self._release()
        except Exception:
            pass

    @property
    def shape(self):
        h = self._live()
        return tuple(_ffi.ffi.unpack(_ffi.lib.lpx_tensor_shape(h), _ffi.lib.lpx_tensor_ndim(h)))

    @property
    def strides(self):
        """Strides in elements."""
        h = self._live()
        return tuple(_ffi.ffi.unpack(_ffi.lib.lpx_tensor_strides(h), _ffi.lib.lpx_tensor_ndim(h)))

    @property
    def numel(self):
        return _ffi.lib.lpx_tensor_numel(self._live())

    @property
    def dtype(self):
        return _dtype_name(_ffi.lib.lpx_tensor_dtype(self._live()))

    @property
    def device(self):
        d = _ffi.lib.lpx_tensor_device(self._live())
        return (d.type, d.index)

    @property
    def kind(self):
        k = _ffi.lib.lpx_tensor_kind(self._live())
        return _ffi.string(_ffi.lib.lpx_kind_name(k)) if k else None

    @property
    def readonly(self):
        return bool(_ffi.lib.lpx_tensor_is_readonly(self._h))

    def refcount(self):
        return _ffi.lib.lpx_tensor_refcount(self._h)

    def inner(self):
        """A kind tensor's inner tensors, {name: Tensor} in order (the names
        of safetensors files and DLPack flattening: float8 data, scale,
        scale_inv; nf4 codes, qscalers, factors, mean). {} for dense."""
        lib, h = _ffi.lib, self._h
        k = lib.lpx_tensor_kind(h)
        out = {}
        buf = _ffi.ffi.new("char[]", 64)
        for i in range(lib.lpx_tensor_inner_count(h)):
            name = _ffi.string(lib.lpx_kind_inner_name(k, i, buf, 64))
            out[name] = Tensor._borrowed(lib.lpx_tensor_inner(h, i), keep=self)
        return out

    def meta(self):
        """A kind tensor's metadata blob (bytes; b"" for dense)."""
        n = _ffi.ffi.new("size_t *")
        p = _ffi.lib.lpx_tensor_meta(self._h, n)
        return _ffi.ffi.buffer(p, n[0])[:] if p and n[0] else b""

    def contiguous(self):
        return _op(_ffi.L().lpx_contiguous, self._h)

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
                "data": (_ffi.addr(_ffi.lib.lpx_tensor_data(self._h)), self.readonly),
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
        return np.asarray(Tensor._borrowed(self._h, self._keep))

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
        off = _ffi.lib.lpx_tensor_offset(self._h)
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
        out = _ffi.ffi.new("lpx_tensor **")
        _check(_ffi.lib.lpx_tensor_view_of(self._h, nd, _ffi.ffi.new("int64_t[]", nshape or [0]),
                                           _ffi.ffi.new("int64_t[]", nstrides or [0]), off, out))
        return Tensor(out[0])

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
            from .plugins import _cuda_stream_wait
            _cuda_stream_wait(self.device[1], stream)
        from . import dlpack
        return dlpack._export(t, max_version)

    # ---- ops: tensors (or numpy arrays) and Python scalars
    def __add__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return _op(_ffi.L().lpx_add_scalar, self._live(), float(other))
        return add(self, other)

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return _op(_ffi.L().lpx_add_scalar, self._live(), -float(other))
        return sub(self, other)

    def __rsub__(self, other):
        return (-self) + other

    def __mul__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return _op(_ffi.L().lpx_mul_scalar, self._live(), float(other))
        return mul(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            return _op(_ffi.L().lpx_mul_scalar, self._live(), 1.0 / float(other))
        return div(self, other)

    def __neg__(self):
        return _op(_ffi.L().lpx_neg, self._live())

    def __matmul__(self, other):
        return matmul(self, other)




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
        name = _dtype_name(want)
        np_direct = {"f32": np.float32, "f16": np.float16, "u8": np.uint8, "i8": np.int8, "i32": np.int32,
                     "i64": np.int64, "bool": np.bool_}
        if name in np_direct:
            return from_numpy(a.astype(np_direct[name]), copy=True)
        return cast(from_numpy(a.astype(np.float32), copy=True), name)
    ml = _np_name(a.dtype)
    if ml in ("bf16", "f8e4m3fn", "f8e5m2"):
        # ml_dtypes arrays: the same bits, copied into an lpx tensor
        src = np.ascontiguousarray(a)
        t = _new(_dtype(ml), a.shape)
        if src.nbytes:
            _ffi.ffi.memmove(_ffi.lib.lpx_tensor_data(t._h), memoryview(src.reshape(-1).view(np.uint8)),
                             src.nbytes)
        return t
    if not copy and hasattr(a, "__dlpack__") and a.dtype != np.bool_:
        try:
            from .dlpack import from_dlpack
            return from_dlpack(a)
        except (BufferError, TypeError, LpxError):
            pass
    names = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.uint8): "u8",
             np.dtype(np.int8): "i8", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(np.bool_): "bool"}
    if a.dtype not in names:
        hint = " (convert explicitly: from_numpy(a, dtype=\"f32\"))" if a.dtype.kind == "f" else ""
        raise LpxTypeError(_EDTYPE, f"numpy dtype {a.dtype} has no lpx dtype{hint}")
    t = _new(_dtype(names[a.dtype]), a.shape)
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
    return _ffi.NULL if t is None else t._h


def _op(fn, *args):
    out = _ffi.ffi.new(_TENSOR_PP)
    st = fn(*args, out)
    if st:
        _check(st)
    return Tensor(out[0])


# the functions behind the operators (ops.py uses this module: imported last)
from .ops import add, cast, clone, div, matmul, mul, sub  # noqa: E402

"""The ops: elementwise and matmul, casts and copies, the fused
neural-network ops, and rebuilding kind tensors (kind_unflatten)."""
from . import _ffi
from ._errors import LpxValueError
from ._ffi import check as _check
from .tensor import Tensor, _dtype, _h, _op, _opt, _t


def add(a, b):
    a, b = _t(a), _t(b)
    return _op(_ffi.L().lpx_add, a._h, b._h)


def sub(a, b):
    a, b = _t(a), _t(b)
    return _op(_ffi.L().lpx_sub, a._h, b._h)


def mul(a, b):
    a, b = _t(a), _t(b)
    return _op(_ffi.L().lpx_mul, a._h, b._h)


def div(a, b):
    a, b = _t(a), _t(b)
    return _op(_ffi.L().lpx_div, a._h, b._h)


def matmul(a, b):
    a, b = _t(a), _t(b)
    return _op(_ffi.L().lpx_matmul, a._h, b._h)


def cast(x, dtype, saturate=False):
    x = _t(x)
    return _op(_ffi.L().lpx_cast, x._h, _dtype(dtype), bool(saturate))


def clone(x):
    """A contiguous copy with its own storage."""
    x = _t(x)
    return _op(_ffi.L().lpx_clone, x._h)


# ---- fused neural-network ops ------------------------------------------------

def _op2(fn, *args):
    a, b = _ffi.ffi.new("lpx_tensor **"), _ffi.ffi.new("lpx_tensor **")
    _check(fn(*args, a, b))
    return tuple(Tensor(h[0]) if h[0] else None for h in (a, b))


def rmsnorm(x, weight=None, eps=1e-6):
    """(y, rstd): y = x * rstd * weight over the last dim, rstd =
    1 / sqrt(mean(x^2) + eps) in f32 ([..., 1], kept for the backward); the
    math in f32 whatever x's dtype, y rounded once to x's dtype. One kernel
    (lpx_rmsnorm)."""
    x, w = _t(x), _opt(weight)
    return _op2(_ffi.L().lpx_rmsnorm, x._h, _h(w), float(eps))


def rmsnorm_backward(grad, x, weight, rstd):
    """(grad_x, grad_weight) of rmsnorm (grad_weight None without a
    weight)."""
    g, x, w, r = _t(grad), _t(x), _opt(weight), _t(rstd)
    return _op2(_ffi.L().lpx_rmsnorm_backward, g._h, x._h, _h(w), r._h)


def swiglu(gate, up):
    """silu(gate) * up in one kernel (f32 math, one rounding to gate's
    dtype; broadcasting as mul)."""
    g, u = _t(gate), _t(up)
    return _op(_ffi.L().lpx_swiglu, g._h, u._h)


def swiglu_backward(grad, gate, up):
    """(grad_gate, grad_up) of swiglu in one kernel: grad * up * silu'(gate)
    and grad * silu(gate); grad, gate and up of one shape."""
    g, a, b = _t(grad), _t(gate), _t(up)
    return _op2(_ffi.L().lpx_swiglu_backward, g._h, a._h, b._h)


def kind_unflatten(kind, dtype, shape, inner, meta=b""):
    """Rebuilds a kind tensor (an 'nf4', 'float8', plugin kind...) from its
    inner tensors and metadata, the inverse of Tensor.inner / Tensor.meta
    (lpx_kind_unflatten: the kind validates every byte, so this is safe on
    untrusted input). `inner` is a sequence of Tensors or arrays, shared
    (zero copy), in the kind's order; `dtype` the logical dtype."""
    lib, f = _ffi.L(), _ffi.ffi
    k = f.new("const lpx_kind **")
    st = lib.lpx_kind_find(str(kind).encode(), k)
    if st:
        raise LpxValueError(st, _ffi.last_error())
    ts = [_t(x) for x in inner]
    arr = f.new("lpx_tensor *[]", [t._h for t in ts] or [f.NULL])
    shp = f.new("int64_t[]", [int(v) for v in shape] or [0])
    meta = bytes(meta)
    out = f.new("lpx_tensor **")
    _check(lib.lpx_kind_unflatten(k[0], _dtype(dtype), len(shape), shp, arr, len(ts), meta or f.NULL, len(meta),
                                  out))
    return Tensor(out[0])

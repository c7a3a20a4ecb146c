"""NF4 (QLoRA's 4-bit NormalFloat): quantize / dequantize / linear, and
the QLoRA linear layer's forward and backward (nf4.h)."""
from . import _ffi
from ._ffi import check as _check
from .tensor import Tensor, _dtype, _h, _op, _opt, _t

def nf4_quantize(x, block=64, scaler_block=0, pad=True):
    """NF4 tensor of dense x (f32/f16/bf16: the logical dtype), with double
    quantized block scales (block 64 by default; scaler_block 0: chosen per
    tensor, the largest count up to 256 that divides the block count)."""
    lib = _ffi.L()
    cfg = _ffi.ffi.new("lpx_nf4_config *", {"block": int(block), "scaler_block": int(scaler_block), "pad": bool(pad)})
    x = _t(x)
    return _op(lib.lpx_nf4_quantize, x._h, cfg)


def nf4_dequantize(t, dtype=None):
    """Dense copy of an nf4 tensor in `dtype` (default: its logical dtype)."""
    return _op(_ffi.L().lpx_nf4_dequantize, t._h, -1 if dtype is None else _dtype(dtype))


def nf4_info(t):
    i = _ffi.ffi.new("lpx_nf4_info *")
    _check(_ffi.L().lpx_nf4_get_info(t._h, i))
    return {f: getattr(i, f) for f, _ in _ffi.ffi.typeof("lpx_nf4_info").fields}


def nf4_linear(x, w, bias=None):
    """x @ W^T (+ bias) with an nf4 weight W (dequantized in tiles)."""
    x, bias = _t(x), _opt(bias)
    return _op(_ffi.L().lpx_nf4_linear, x._h, w._h, _h(bias))


def nf4_linear_backward(grad, w):
    """grad_x = grad @ W for an nf4 weight (frozen: no grad_W)."""
    grad = _t(grad)
    return _op(_ffi.L().lpx_nf4_linear_backward, grad._h, w._h)


def _qlora_opts(alpha, dropout, seed):
    return _ffi.ffi.new("lpx_qlora_opts *", {"alpha": float(alpha), "dropout": float(dropout), "seed": int(seed)})


def qlora_linear(x, w, a, b, bias=None, alpha=16.0, dropout=0.0, seed=0, return_xa=False):
    """QLoRA forward: x @ W^T + bias + (alpha / r) * (drop(x) @ A^T) @ B^T,
    W nf4 [out, in] (frozen), A [r, in], B [out, r]. With return_xa, also
    returns drop(x) @ A^T for the backward."""
    lib, f = _ffi.L(), _ffi.ffi
    o = _qlora_opts(alpha, dropout, seed)
    x, a, b, bias = _t(x), _t(a), _t(b), _opt(bias)
    out, xa = f.new("lpx_tensor **"), f.new("lpx_tensor **")
    _check(lib.lpx_qlora_linear(x._h, w._h, _h(bias), a._h, b._h, o, out, xa if return_xa else f.NULL))
    return (Tensor(out[0]), Tensor(xa[0])) if return_xa else Tensor(out[0])


def qlora_linear_backward(grad, x, w, a, b, xa=None, alpha=16.0, dropout=0.0, seed=0):
    """(grad_x, grad_a, grad_b) of qlora_linear (same alpha/dropout/seed)."""
    lib, f = _ffi.L(), _ffi.ffi
    o = _qlora_opts(alpha, dropout, seed)
    grad, x, a, b, xa = _t(grad), _t(x), _t(a), _t(b), _opt(xa)
    gx, ga, gb = f.new("lpx_tensor **"), f.new("lpx_tensor **"), f.new("lpx_tensor **")
    _check(lib.lpx_qlora_linear_backward(grad._h, x._h, w._h, a._h, b._h, _h(xa), o, gx, ga, gb))
    return Tensor(gx[0]), Tensor(ga[0]), Tensor(gb[0])

"""lpx.torch: lpx's Float8Linear and NF4/QLoRA layers inside PyTorch models,
eagerly (no torch.compile).

    import lpx.torch
    model = lpx.torch.convert_to_float8_training(model, recipe="tensorwise")
    loss = model(x).sum(); loss.backward()      # fp8 GEMMs run in liblpx

Each converted layer keeps its parameters as ordinary torch Parameters (so
optimizers, state_dict and FSDP see plain tensors) and runs its forward and
backward as a torch.autograd.Function whose work is lpx's: the tensors'
memory is handed to liblpx through DLPack, without a copy, on the CPU and on
CUDA. On CUDA, lpx queues its kernels on lpx-cuda's own stream. Each
tensor handed to lpx is ordered by the DLPack handshake itself: to_lpx
makes a non-contiguous tensor contiguous on torch's current stream and then
passes lpx's stream as the consumer's (`__dlpack__(stream=...)`), so torch
makes lpx's stream wait for everything queued so far, that copy included.
Each call also makes lpx's stream wait for torch's current stream on entry
and torch's current stream wait for lpx's afterwards (_StreamOrder), so
neither reads the other's results early (and memory either side frees is
reused only after the other is done: a copy made for lpx is
record_stream'ed on lpx's stream).

Layers:
- Float8Linear (an nn.Linear): lpx_float8_linear_forward/backward with a
  recipe (a preset name or a lpx.Float8Recipe with per-GEMM overrides);
  `last_report` holds the fp8 statistics of its last forward and backward.
  Delayed-scaling recipes keep amax histories, saved in the state_dict as
  uint8 tensors (an `_extra_state` entry); dynamic recipes add nothing, so a
  converted model's state_dict loads into the unconverted one and back.
- NF4Linear: a frozen NF4 base weight (lpx's nf4 kind: 4-bit codes, double
  quantized scales) with optional LoRA adapters (QLoRA, r > 0); its
  state_dict holds the nf4 payload as plain tensors (codes, qscalers,
  factors, mean, meta), rebuilt and validated by lpx on load.

Optimizers (python/lpx/torch_optim.py): AdamW8bit, AdamW4bit, AdamWFp8,
torchao's names with torch.optim.AdamW's arguments, stepped by liblpx's
fused AdamW over block-quantized states (docs/PYTORCH.md).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
from torch import nn

import lpx as _lpx

__all__ = ["Float8Linear", "NF4Linear", "convert_to_float8_training", "convert_to_nf4", "to_lpx", "to_torch",
           "RMSNorm", "SwiGLUMLP", "rms_norm", "swiglu", "convert_to_fused_ops",
           "AdamW8bit", "AdamW4bit", "AdamWFp8"]

_DENSE = (torch.float32, torch.bfloat16, torch.float16)


def _lpx_stream(idx: int) -> "torch.cuda.ExternalStream":
    """lpx-cuda's stream of device idx as a torch stream (cached)."""
    ext = _StreamOrder._streams.get(idx)
    if ext is None:
        ext = torch.cuda.ExternalStream(_lpx.cuda_stream(idx), device=torch.device("cuda", idx))
        _StreamOrder._streams[idx] = ext
    return ext


def to_lpx(t: torch.Tensor) -> "_lpx.Tensor":
    """An lpx Tensor over t's memory (DLPack, no copy; a non-contiguous t is
    made contiguous first). The lpx tensor keeps t's storage alive.

    On CUDA the handshake orders it: the contiguous copy is queued on
    torch's current stream, then lpx.from_dlpack passes lpx's stream to
    t.__dlpack__(stream=...), and torch makes lpx's stream wait for its
    current stream at that point (after the copy). The copy is
    record_stream'ed on lpx's stream, so torch's allocator does not reuse its
    memory before the lpx work queued while it was alive is done."""
    t = t.detach()
    if t.device.type != "cuda":
        return _lpx.from_dlpack(t.contiguous())
    idx = t.device.index if t.device.index is not None else torch.cuda.current_device()
    # torch's __dlpack__ records its event on the *current* device's stream
    with torch.cuda.device(idx):
        if not t.is_contiguous():
            t = t.contiguous()
            t.record_stream(_lpx_stream(idx))
        return _lpx.from_dlpack(t, stream=_lpx.cuda_stream(idx))


def to_torch(t: "_lpx.Tensor") -> torch.Tensor:
    """A torch tensor over lpx tensor t's memory (DLPack, no copy). It holds
    its own lpx reference: valid after t.close(), the memory is freed with
    the last torch view."""
    return torch.from_dlpack(t)


class _StreamOrder:
    """On CUDA: lpx-cuda's stream waits for torch's current stream on entry,
    torch's current stream waits for lpx's on exit. Nothing on the CPU.
    Work torch queues inside the block (to_lpx's contiguous copies) is
    ordered by to_lpx's DLPack handshake, not by the entry wait."""

    _streams: dict = {}

    def __init__(self, device: torch.device):
        self.device = device
        self.ext = None

    def __enter__(self):
        if self.device.type == "cuda":
            idx = self.device.index if self.device.index is not None else torch.cuda.current_device()
            ext = _lpx_stream(idx)
            ext.wait_stream(torch.cuda.current_stream(idx))
            self.ext, self.idx = ext, idx
        return self

    def __exit__(self, *exc):
        if self.ext is not None:
            torch.cuda.current_stream(self.idx).wait_stream(self.ext)
        return False


def _autocast(x: torch.Tensor) -> torch.Tensor:
    """x in the autocast dtype when autocast is on for its device (as
    nn.Linear would compute), else x."""
    try:
        on = torch.is_autocast_enabled(x.device.type)
        dt = torch.get_autocast_dtype(x.device.type) if on else None
    except TypeError:  # older torch: no device argument
        on = torch.is_autocast_enabled() if x.device.type == "cuda" else torch.is_autocast_cpu_enabled()
        dt = torch.get_autocast_gpu_dtype() if x.device.type == "cuda" else torch.get_autocast_cpu_dtype()
    return x.to(dt) if on and x.dtype != dt and x.is_floating_point() else x


def _check_dense(what: str, t: torch.Tensor):
    if t.dtype not in _DENSE:
        raise _lpx.LpxTypeError(-7, f"lpx.torch.{what}: {t.dtype} is not float32, bfloat16 or float16")


# ---- Float8Linear -----------------------------------------------------------------------


class _Float8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        with _StreamOrder(x.device):
            out, lctx = layer._core.forward_ctx(to_lpx(x), weight=to_lpx(weight),
                                                bias=None if bias is None else to_lpx(bias))
            y = to_torch(out)
        ctx.lctx, ctx.layer, ctx.has_bias = lctx, layer, bias is not None
        layer.last_report = lctx.report
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        with _StreamOrder(grad_out.device):
            gx, gw, gb = ctx.lctx.backward(to_lpx(grad_out), need_x=need_x, need_w=need_w)
            res = tuple(None if t is None else to_torch(t) for t in (gx, gw, gb))
        ctx.layer.last_report = ctx.lctx.report
        ctx.lctx = None
        return res[0], res[1], res[2] if need_b else None, None


class Float8Linear(nn.Linear):
    """nn.Linear whose three GEMMs (out = x @ W^T, grad_x = g @ W,
    grad_W = g^T @ x) run through lpx's Float8Linear with `recipe` (a preset
    name: 'tensorwise', 'rowwise', 'rowwise_with_gw_hp', 'delayed'; or a
    lpx.Float8Recipe). Parameters stay torch Parameters in their dtype
    (the master weights); x and W are cast to fp8 by lpx each step.
    `last_report`: per GEMM and operand, the fp8 cast statistics (amax,
    scale, underflow and saturation fractions) of the last call."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None,
                 recipe: Union[str, "_lpx.Float8Recipe"] = "tensorwise"):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._core = _lpx.Float8Linear(None, None, recipe)
        self.recipe = self._core.recipe
        self.last_report: dict = {}

    @classmethod
    def from_float(cls, mod: nn.Linear, recipe: Union[str, "_lpx.Float8Recipe"] = "tensorwise") -> "Float8Linear":
        """A Float8Linear sharing mod's weight and bias Parameters."""
        r = _lpx.Float8Recipe(recipe)
        kind = _Float8LinearDelayed if r.uses_delayed else Float8Linear
        with torch.device("meta"):
            new = kind(mod.in_features, mod.out_features, bias=False, recipe=r)
        new.weight = mod.weight
        new.bias = mod.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _autocast(x)
        _check_dense("Float8Linear", x)
        w = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        b = self.bias if self.bias is None or self.bias.dtype == x.dtype else self.bias.to(x.dtype)
        if x.device != w.device:
            raise _lpx.LpxValueError(-1, f"lpx.torch.Float8Linear: input on {x.device}, weight on {w.device}")
        return _Float8LinearFn.apply(x, w, b, self)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", recipe={self.recipe.name!r}"


class _Float8LinearDelayed(Float8Linear):
    """Float8Linear with a delayed-scaling recipe: its amax histories are
    part of the module's state (state_dict `_extra_state`: uint8 tensors,
    lpx_float8_delayed_save blobs, checked by lpx on load)."""

    def get_extra_state(self):
        return {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) for k, v in self._core.state_bytes().items()}

    def set_extra_state(self, state):
        self._core.load_state_bytes({k: v.cpu().numpy().tobytes() for k, v in state.items()})


def _swap_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module],
                  module_filter_fn: Optional[Callable[[nn.Module, str], bool]], prefix: str = "") -> nn.Module:
    if type(module) is nn.Linear and (module_filter_fn is None or module_filter_fn(module, prefix)):
        return make(module)
    for name, child in list(module.named_children()):
        fqn = f"{prefix}.{name}" if prefix else name
        new = _swap_linears(child, make, module_filter_fn, fqn)
        if new is not child:
            setattr(module, name, new)
    return module


def convert_to_float8_training(module: nn.Module, *, recipe: Union[str, "_lpx.Float8Recipe"] = "tensorwise",
                               module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None) -> nn.Module:
    """Replaces every nn.Linear of `module` (itself included) for which
    module_filter_fn(linear, fully_qualified_name) is true (all when None)
    by a Float8Linear sharing its Parameters, in place; returns the module
    (the new layer when `module` is an nn.Linear). The signature follows
    torchao.float8.convert_to_float8_training."""
    _lpx.Float8Linear(None, None, recipe).close()  # a bad recipe fails here, before anything changes
    return _swap_linears(module, lambda m: Float8Linear.from_float(m, recipe), module_filter_fn)


# ---- fused RMSNorm and SwiGLU ------------------------------------------------------------
#
# What an eager transformer block spends outside its GEMMs: Hugging Face's
# RMSNorm is eight elementwise kernels forward (upcast, square, mean, add,
# rsqrt, multiply, downcast, weight) and about ten backward; the MLP's
# silu(gate) * up is two forward and three backward. lpx does each in one
# kernel forward and one or two backward (lpx_rmsnorm, lpx_swiglu and their
# backwards), f32 math with one rounding per result.


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        with _StreamOrder(x.device):
            y, rstd = _lpx.rmsnorm(to_lpx(x), None if weight is None else to_lpx(weight), eps)
            y, rstd = to_torch(y), to_torch(rstd)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        with _StreamOrder(grad.device):
            gx, gw = _lpx.rmsnorm_backward(to_lpx(grad), to_lpx(x), None if weight is None else to_lpx(weight),
                                           to_lpx(rstd))
            gx = to_torch(gx) if ctx.needs_input_grad[0] else None
            gw = to_torch(gw) if gw is not None and ctx.needs_input_grad[1] else None
        return gx, gw, None


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(mean(x^2, -1) + eps) * weight in one lpx kernel (forward)
    and two (backward): f32 math whatever the dtype, the result rounded once
    to x's dtype (Hugging Face's LlamaRMSNorm rounds before the weight too),
    then promoted with weight's dtype as torch would."""
    _check_dense("rms_norm", x)
    if weight is not None:
        _check_dense("rms_norm", weight)
        if weight.device != x.device:
            raise _lpx.LpxValueError(-1, f"lpx.torch.rms_norm: weight on {weight.device}, x on {x.device}")
    y = _RMSNormFn.apply(x, weight, float(eps))
    want = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
    return y if y.dtype == want else y.to(want)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim through rms_norm (lpx's fused kernels).
    Parameter `weight` [dim] and state_dict key as Hugging Face's
    LlamaRMSNorm and torch.nn.RMSNorm, so either converts in place."""

    def __init__(self, dim: int, eps: Optional[float] = 1e-6, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.eps = eps

    @classmethod
    def from_module(cls, norm: nn.Module) -> "RMSNorm":
        """An RMSNorm sharing `norm`'s weight Parameter: a Hugging Face
        *RMSNorm (weight, variance_epsilon) or a torch.nn.RMSNorm with an
        affine weight over one dim."""
        w = getattr(norm, "weight", None)
        if not isinstance(w, nn.Parameter) or w.dim() != 1:
            raise _lpx.LpxValueError(-1, f"lpx.torch.RMSNorm.from_module: {type(norm).__name__} has no 1-D weight")
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        new = cls.__new__(cls)
        nn.Module.__init__(new)
        new.weight, new.eps = w, eps
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps   # torch.nn.RMSNorm's default
        return rms_norm(x, self.weight, eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class _SwiGLUFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):
        with _StreamOrder(gate.device):
            y = to_torch(_lpx.swiglu(to_lpx(gate), to_lpx(up)))
        ctx.save_for_backward(gate, up)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        with _StreamOrder(grad.device):
            dg, du = _lpx.swiglu_backward(to_lpx(grad), to_lpx(gate), to_lpx(up))
            dg, du = to_torch(dg), to_torch(du)
        return dg, du


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in one lpx kernel, its backward in one: f32 math,
    each result rounded once (eager torch rounds silu(gate) first). gate
    and up of one shape and dtype."""
    _check_dense("swiglu", gate)
    if up.shape != gate.shape or up.dtype != gate.dtype or up.device != gate.device:
        raise _lpx.LpxValueError(-1, f"lpx.torch.swiglu: up {tuple(up.shape)} {up.dtype} on {up.device} does not "
                                     f"match gate {tuple(gate.shape)} {gate.dtype} on {gate.device}")
    return _SwiGLUFn.apply(gate, up)


class SwiGLUMLP(nn.Module):
    """down_proj(swiglu(gate_proj(x), up_proj(x))): a Llama/Mistral/Qwen
    MLP with the activation and the product fused. Keeps the original
    gate_proj/up_proj/down_proj children (converted linears included), so
    the state_dict keys do not change."""

    def __init__(self, gate_proj: nn.Module, up_proj: nn.Module, down_proj: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x)))


def _is_rmsnorm(m: nn.Module) -> bool:
    if isinstance(m, RMSNorm):
        return False
    if getattr(nn, "RMSNorm", None) is not None and isinstance(m, nn.RMSNorm):
        return m.weight is not None and len(m.normalized_shape) == 1
    return (type(m).__name__.endswith("RMSNorm") and isinstance(getattr(m, "weight", None), nn.Parameter)
            and m.weight.dim() == 1 and isinstance(getattr(m, "variance_epsilon", None), float))


def _is_silu_mlp(m: nn.Module) -> bool:
    act = getattr(m, "act_fn", None)
    return (not isinstance(m, SwiGLUMLP) and all(isinstance(getattr(m, n, None), nn.Module)
                                                 for n in ("gate_proj", "up_proj", "down_proj"))
            and isinstance(act, nn.Module) and type(act).__name__ in ("SiLU", "SiLUActivation"))


def convert_to_fused_ops(module: nn.Module, *, rmsnorm: bool = True, swiglu_mlp: bool = True,
                         module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None) -> nn.Module:
    """Replaces, in place, every RMSNorm (Hugging Face's *RMSNorm with
    `variance_epsilon`, or torch.nn.RMSNorm with a 1-D weight) by
    lpx.torch.RMSNorm and every SiLU-gated MLP (children gate_proj, up_proj,
    down_proj and act_fn = SiLU: Llama, Mistral, Qwen2) by SwiGLUMLP, both
    sharing the original Parameters (state_dict keys unchanged); returns the
    module. Composes with convert_to_float8_training in either order."""
    def swap(m: nn.Module, prefix: str) -> nn.Module:
        if module_filter_fn is None or module_filter_fn(m, prefix):
            if rmsnorm and _is_rmsnorm(m):
                return RMSNorm.from_module(m)
            if swiglu_mlp and _is_silu_mlp(m):
                m = SwiGLUMLP(m.gate_proj, m.up_proj, m.down_proj)
        for name, child in list(m.named_children()):
            new = swap(child, f"{prefix}.{name}" if prefix else name)
            if new is not child:
                setattr(m, name, new)
        return m
    return swap(module, "")


# ---- NF4Linear (QLoRA) ------------------------------------------------------------------

_NF4_INNER = ("codes", "qscalers", "factors", "mean")


class _NF4LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, w):
        with _StreamOrder(x.device):
            y = to_torch(_lpx.nf4_linear(to_lpx(x), w, None if bias is None else to_lpx(bias)))
        ctx.w = w
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        gx = gb = None
        with _StreamOrder(g.device):
            if ctx.needs_input_grad[0]:
                gx = to_torch(_lpx.nf4_linear_backward(to_lpx(g), ctx.w))
        if ctx.needs_input_grad[1]:
            gb = g.reshape(-1, g.shape[-1]).sum(0)
        ctx.w = None
        return gx, gb, None


class _QLoRAFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, b, bias, w, alpha, dropout, seed):
        lx, la, lb = to_lpx(x), to_lpx(a), to_lpx(b)
        with _StreamOrder(x.device):
            out, xa = _lpx.qlora_linear(lx, w, la, lb, None if bias is None else to_lpx(bias), alpha=alpha,
                                        dropout=dropout, seed=seed, return_xa=True)
            y = to_torch(out)
        ctx.saved = (lx, la, lb, xa, w)
        ctx.opts = (alpha, dropout, seed)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        lx, la, lb, xa, w = ctx.saved
        alpha, dropout, seed = ctx.opts
        with _StreamOrder(g.device):
            gx, ga, gb = _lpx.qlora_linear_backward(to_lpx(g), lx, w, la, lb, xa, alpha=alpha, dropout=dropout,
                                                    seed=seed)
            gx, ga, gb = to_torch(gx), to_torch(ga), to_torch(gb)
        gbias = g.reshape(-1, g.shape[-1]).sum(0) if ctx.needs_input_grad[3] else None
        ctx.saved = None
        return (gx if ctx.needs_input_grad[0] else None, ga, gb, gbias, None, None, None, None)


class NF4Linear(nn.Module):
    """A linear layer with a frozen NF4 weight (4-bit NormalFloat codes with
    double-quantized block scales, lpx's nf4 kind; bitsandbytes' format)
    and, with r > 0, trainable LoRA adapters (QLoRA):
    out = x @ W^T + bias + (alpha / r) * (dropout(x) @ A^T) @ B^T.
    The weight never exists dense: lpx dequantizes it in tiles inside the
    GEMM. A is initialized as nn.Linear's weight (Kaiming uniform), B to
    zero (the PEFT convention), so a new adapter changes nothing. The bias
    is kept dense and frozen. Build one with NF4Linear.from_linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, r: int = 0,
                 alpha: float = 16.0, dropout: float = 0.0, block: int = 64, scaler_block: int = 0,
                 device=None, dtype=torch.float32):
        super().__init__()
        if r < 0:
            raise _lpx.LpxValueError(-1, f"lpx.torch.NF4Linear: LoRA rank r = {r} is negative")
        if not 0.0 <= dropout < 1.0:
            raise _lpx.LpxValueError(-1, f"lpx.torch.NF4Linear: dropout {dropout} is not in [0, 1)")
        self.in_features, self.out_features = in_features, out_features
        self.r, self.alpha, self.dropout = r, float(alpha), float(dropout)
        self.block, self.scaler_block, self.weight_dtype = block, scaler_block, dtype
        self._w = None           # the lpx nf4 tensor over the nf4_* buffers
        self._w_key = None       # what it was built from (buffers' storage, meta)
        self._step = 0           # dropout seeds: one per training forward
        w = torch.empty(out_features, in_features, device=device, dtype=dtype)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        self._set_weight(w)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False) \
            if bias else None
        if r:
            self.lora_a = nn.Parameter(torch.empty(r, in_features, device=device, dtype=dtype))
            self.lora_b = nn.Parameter(torch.zeros(out_features, r, device=device, dtype=dtype))
            nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        else:
            self.lora_a = self.lora_b = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, r: int = 0, alpha: float = 16.0, dropout: float = 0.0,
                    block: int = 64, scaler_block: int = 0) -> "NF4Linear":
        """Quantizes linear's weight to NF4 (frozen) and copies its bias."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, bias=False, r=r, alpha=alpha, dropout=dropout,
                      block=block, scaler_block=scaler_block, dtype=linear.weight.dtype)
        dev = linear.weight.device
        new._set_weight(linear.weight.detach())
        if linear.bias is not None:
            new.bias = nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        if r:
            new.lora_a = nn.Parameter(torch.empty(r, linear.in_features, device=dev, dtype=linear.weight.dtype))
            new.lora_b = nn.Parameter(torch.zeros(linear.out_features, r, device=dev, dtype=linear.weight.dtype))
            nn.init.kaiming_uniform_(new.lora_a, a=math.sqrt(5))
        return new

    def _set_weight(self, w: torch.Tensor):
        if w.device.type == "meta":  # shapes only (from_linear fills it)
            for n in _NF4_INNER + ("meta",):
                self.register_buffer("nf4_" + n, torch.empty(0, dtype=torch.uint8, device="meta"))
            return
        _check_dense("NF4Linear", w)
        # lpx's quantize reads w after torch's writes to it (the layer's
        # init, a copy_) and torch reads the codes after lpx wrote them
        with _StreamOrder(w.device):
            q = _lpx.nf4_quantize(to_lpx(w), block=self.block, scaler_block=self.scaler_block)
            inner = q.inner()
            for n in _NF4_INNER:
                self.register_buffer("nf4_" + n, to_torch(inner[n]))
        self.register_buffer("nf4_meta", torch.frombuffer(bytearray(q.meta()), dtype=torch.uint8))
        self._w, self._w_key = q, self._key()

    def _key(self):
        return tuple(getattr(self, "nf4_" + n).data_ptr() for n in _NF4_INNER) + (bytes(self.nf4_meta.tolist()),)

    def nf4_weight(self) -> "_lpx.Tensor":
        """The lpx nf4 tensor over this module's buffers (rebuilt, and
        validated by the nf4 kind, after load_state_dict or .to())."""
        key = self._key()
        if self._w is None or key != self._w_key:
            dev = self.nf4_codes.device
            if self.nf4_meta.device.type != "cpu":
                self.nf4_meta = self.nf4_meta.cpu()  # metadata: read on the host
            inner = [to_lpx(getattr(self, "nf4_" + n).to(dev)) for n in _NF4_INNER]
            dt = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[self.weight_dtype]
            self._w = _lpx.kind_unflatten("nf4", dt, (self.out_features, self.in_features), inner,
                                          bytes(self.nf4_meta.tolist()))
            self._w_key = self._key()
        return self._w

    def dequantize(self) -> torch.Tensor:
        """The dense weight the codes stand for, in its dtype (for checks)."""
        # ordered after torch's writes to the nf4 buffers (load_state_dict's
        # copy_), and torch's reads of the result after lpx's kernel
        with _StreamOrder(self.nf4_codes.device):
            return to_torch(_lpx.nf4_dequantize(self.nf4_weight()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _autocast(x)
        _check_dense("NF4Linear", x)
        w = self.nf4_weight()
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        if not self.r:
            return _NF4LinearFn.apply(x, bias, w)
        p = self.dropout if self.training else 0.0
        seed = self._step
        if self.training:
            self._step += 1
        a, b = self.lora_a, self.lora_b
        if a.dtype != x.dtype:
            a, b = a.to(x.dtype), b.to(x.dtype)
        return _QLoRAFn.apply(x, a, b, bias, w, self.alpha, p, seed)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"r={self.r}, alpha={self.alpha}, dropout={self.dropout}, block={self.block}")


def convert_to_nf4(module: nn.Module, *, r: int = 0, alpha: float = 16.0, dropout: float = 0.0,
                   module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None) -> nn.Module:
    """Replaces nn.Linear layers (filtered as convert_to_float8_training)
    by NF4Linear (frozen NF4 weight, LoRA rank r), in place; returns the
    module. Freeze the rest of the model yourself (QLoRA trains only the
    adapters)."""
    return _swap_linears(module, lambda m: NF4Linear.from_linear(m, r=r, alpha=alpha, dropout=dropout),
                         module_filter_fn)


# the low-precision AdamW optimizers (torchao's names): python/lpx/torch_optim.py
from .torch_optim import AdamW4bit, AdamW8bit, AdamWFp8  # noqa: E402

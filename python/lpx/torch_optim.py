"""lpx.torch's low-precision AdamW optimizers (issue 37): AdamW8bit,
AdamW4bit and AdamWFp8, named and called as torchao.optim names and calls
them, so one swaps for the other:

    import lpx.torch
    opt = lpx.torch.AdamW8bit(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss.backward(); opt.step(); opt.zero_grad()

Each is a torch.optim.Optimizer with torch.optim.AdamW's arguments. The
step is liblpx's fused op adamw_state_ (include/lpx/optim_state.h: per
block, dequantize m and v, lpx's f32 AdamW, write the parameter,
requantize with fresh scales) run on the parameters', grads' and states'
own memory: torch tensors are handed to liblpx through DLPack (to_lpx), no
copy unless a tensor is non-contiguous. Parameters under
`min_quant_numel` elements (4096, torchao's and bitsandbytes' threshold)
keep f32 moments, stepped by lpx's plain fused op adamw_. The state dict
holds plain tensors and Python scalars only, so torch.save and
torch.load(weights_only=True) round-trip it; docs/PYTORCH.md has the
layout and its mapping to torchao's states. Written out here rather than in
torch.py: lpx.torch re-exports the three classes.
"""
from __future__ import annotations

import math
import struct
from typing import Optional

import torch

import lpx as _lpx
from . import _ffi
from ._ffi import check as _check

__all__ = ["AdamW8bit", "AdamW4bit", "AdamWFp8", "MIN_QUANT_NUMEL"]

MIN_QUANT_NUMEL = 4096   # torchao (after bitsandbytes) quantizes states of >= 4096 elements
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_QKEYS = ("step", "block_size", "exp_avg_codes", "exp_avg_scale", "exp_avg_sq_codes", "exp_avg_sq_scale")
_FKEYS = ("step", "exp_avg", "exp_avg_sq")
_META = struct.Struct("<IIiiq")   # lpx_optim_state_meta: magic, version, format, role, block


_cuda_loaded = False


def _cuda_plugin_loaded() -> bool:
    """Whether lpx-cuda.so is loaded (once it is, it stays)."""
    global _cuda_loaded
    if not _cuda_loaded:
        lib, f = _ffi.L(), _ffi.ffi
        p = f.new("const lpx_plugin **")
        _cuda_loaded = lib.lpx_plugin_find(b"cuda", p) == 0
        lib.lpx_clear_error()
    return _cuda_loaded


def _arr(ts):
    return _ffi.ffi.new("lpx_tensor *[]", [t._h for t in ts])


class _LpxAdamW(torch.optim.Optimizer):
    """The shared body of AdamW8bit, AdamW4bit and AdamWFp8 (see the
    module's docstring). Subclasses set _FORMAT (lpx_optim_state_format),
    _BLOCK (the default block_size) and _V_DTYPE (the v codes' dtype)."""

    _FORMAT = -1
    _BLOCK = 256
    _V_DTYPE = torch.uint8

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 block_size: Optional[int] = None, bf16_stochastic_round: bool = False,
                 min_quant_numel: int = MIN_QUANT_NUMEL, seed: int = 0):
        name = self._name()
        if capturable:
            raise NotImplementedError(f"{name}: capturable=True (CUDA graph capture) is not supported: the step "
                                      f"reads its step count on the host")
        if differentiable:
            raise NotImplementedError(f"{name}: differentiable=True is not supported: the step runs in liblpx, "
                                      f"outside autograd")
        # foreach / fused are torch's implementation hints: lpx's step is always one fused op per group
        block = self._BLOCK if block_size is None else block_size
        if isinstance(block, bool) or not isinstance(block, int) or block < 2 or block > 256 or block & (block - 1):
            raise ValueError(f"{name}: block_size must be a power of two in 2..256, not {block_size!r}")
        if isinstance(min_quant_numel, bool) or not isinstance(min_quant_numel, int) or min_quant_numel < 1:
            raise ValueError(f"{name}: min_quant_numel must be a positive int, not {min_quant_numel!r}")
        if not isinstance(seed, int) or not 0 <= seed < 1 << 64:
            raise ValueError(f"{name}: seed must be an int in 0..2^64-1, not {seed!r}")
        self.block_size = block
        self.bf16_stochastic_round = bool(bf16_stochastic_round)
        self.min_quant_numel = min_quant_numel
        self.seed = seed
        self._offsets = None
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=False, differentiable=False, fused=fused)
        super().__init__(params, defaults)

    @classmethod
    def _name(cls):
        return f"lpx.torch.{cls.__name__}"

    # ---- arguments ---------------------------------------------------------------------------

    def _check_group(self, group):
        name = self._name()
        if group.get("amsgrad", False):
            raise NotImplementedError(f"{name}: amsgrad=True is not supported (lpx's fused AdamW keeps no "
                                      f"max_exp_avg_sq); use torch.optim.AdamW or torchao's optimizers for amsgrad")
        if group.get("maximize", False):
            raise NotImplementedError(f"{name}: maximize=True is not supported; negate the loss instead")
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            if lr.numel() != 1:
                raise ValueError(f"{name}: a tensor lr must hold one value, not {lr.numel()}")
            lr = lr.item()
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not (0.0 <= lr < math.inf):
            raise ValueError(f"{name}: lr must be a finite number >= 0, not {group['lr']!r}")
        betas = group["betas"]
        if (not isinstance(betas, (tuple, list)) or len(betas) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"{name}: betas must be two numbers in [0, 1), not {betas!r}")
        eps = group["eps"]
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not (0.0 < eps < math.inf):
            raise ValueError(f"{name}: eps must be a finite number > 0 (lpx divides by sqrt(v) + eps), not {eps!r}")
        wd = group["weight_decay"]
        if not isinstance(wd, (int, float)) or isinstance(wd, bool) or not (0.0 <= wd < math.inf):
            raise ValueError(f"{name}: weight_decay must be a finite number >= 0, not {wd!r}")
        for p in group["params"]:
            if p.dtype not in _FLOATS:
                raise ValueError(f"{name}: parameters must be float32, bfloat16 or float16, not {p.dtype}")
            if p.device.type not in ("cpu", "cuda"):
                raise ValueError(f"{name}: parameters must be on the CPU or CUDA, not {p.device}")
        return float(lr)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        self._check_group(self.param_groups[-1])
        self._offsets = None

    # ---- state -------------------------------------------------------------------------------

    def _quantized(self, p):
        return p.numel() >= self.min_quant_numel

    def _shapes(self, n, block):
        """(m codes, v codes) element counts and the number of blocks."""
        nb = -(-n // block)
        mc = (n // block) * block // 2 + (n % block + 1) // 2 if self._FORMAT == 1 else n
        vc = mc if self._FORMAT != 2 else n
        return mc, vc, nb

    def _new_state(self, p):
        dev = p.device
        st = {"step": torch.tensor(0.0)}
        if self._quantized(p):
            mc, vc, nb = self._shapes(p.numel(), self.block_size)
            st["block_size"] = self.block_size
            st["exp_avg_codes"] = torch.zeros(mc, dtype=torch.uint8, device=dev)
            st["exp_avg_scale"] = torch.zeros(nb, dtype=torch.float32, device=dev)
            st["exp_avg_sq_codes"] = torch.zeros(vc, dtype=self._V_DTYPE, device=dev)
            st["exp_avg_sq_scale"] = torch.zeros(nb, dtype=torch.float32, device=dev)
        else:
            st["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=dev)
            st["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=dev)
        return st

    def _flat_offsets(self):
        """Each parameter's first index in the optimizer's flat space (the
        param groups in order): the stochastic rounding's key, so no two
        parameters share random bits and a run replays bit for bit."""
        if self._offsets is None:
            off, at = {}, 0
            for g in self.param_groups:
                for p in g["params"]:
                    if id(p) not in off:
                        off[id(p)] = at
                        at += p.numel()
            self._offsets = off
        return self._offsets

    # ---- the step ----------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        name = self._name()
        for group in self.param_groups:
            lr = self._check_group(group)
            b1, b2 = (float(b) for b in group["betas"])
            hyper = (lr, b1, b2, float(group["eps"]), float(group["weight_decay"]))
            batches = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError(f"{name}: sparse gradients are not supported")
                if p.grad.shape != p.shape:
                    raise RuntimeError(f"{name}: grad of shape {tuple(p.grad.shape)} for a parameter of shape "
                                       f"{tuple(p.shape)}")
                if p.device.type == "cuda" and not _cuda_plugin_loaded():
                    raise RuntimeError(f"{name}: parameter on {p.device}: lpx-cuda.so is not loaded (no GPU, or "
                                       f"LPX_PLUGIN_PATH does not name it); lpx's step cannot run there")
                st = self.state[p]
                if len(st) == 0:
                    st.update(self._new_state(p))
                st["step"] += 1
                step = int(st["step"].item())
                quant = "exp_avg_codes" in st
                sr = self.bf16_stochastic_round and p.dtype == torch.bfloat16
                key = (quant, step, p.device, st.get("block_size"), sr and not quant)
                if sr and quant:   # one call each: its own flat offset keys the random bits
                    self._run_quant(p.device, [(p, st)], step, hyper, st["block_size"], True)
                else:
                    batches.setdefault(key, []).append((p, st))
            for (quant, step, dev, block, sr), items in batches.items():
                if quant:
                    self._run_quant(dev, items, step, hyper, block, False)
                else:
                    self._run_plain(dev, items, step, hyper, sr)
        return loss

    @staticmethod
    def _views(items):
        """lpx views of the parameters (contiguous work copies where a
        parameter is not, written back by the caller) and the grads."""
        from .torch import to_lpx
        work, P, G = [], [], []
        for p, _ in items:
            d = p.detach()
            w = d if d.is_contiguous() else d.contiguous()
            work.append((d, w))
            P.append(to_lpx(w))
            G.append(to_lpx(p.grad.detach()))
        return work, P, G

    def _run_quant(self, dev, items, step, hyper, block, sr):
        from .torch import _StreamOrder, to_lpx
        lib, f = _ffi.L(), _ffi.ffi
        with _StreamOrder(dev):
            work, P, G = self._views(items)
            M = [to_lpx(st["exp_avg_codes"]) for _, st in items]
            MS = [to_lpx(st["exp_avg_scale"]) for _, st in items]
            V = [to_lpx(st["exp_avg_sq_codes"]) for _, st in items]
            VS = [to_lpx(st["exp_avg_sq_scale"]) for _, st in items]
            master = lib.LPX_OPTIM_MASTER_BF16_SR if sr else lib.LPX_OPTIM_MASTER_PLAIN
            index0 = self._flat_offsets()[id(items[0][0])] if sr else 0
            _check(lib.lpx_adamw_state_(_arr(P), _arr(G), _arr(M), _arr(MS), _arr(V), _arr(VS), len(items),
                                        self._FORMAT, block, *hyper, step, master, self.seed if sr else 0, 0,
                                        index0, f.NULL))
        # after _StreamOrder's exit: on CUDA torch's stream then waits for lpx's step
        for d, w in work:
            if w is not d:
                d.copy_(w)

    def _run_plain(self, dev, items, step, hyper, sr):
        """f32 moments (small parameters): lpx's adamw_; with bf16
        stochastic rounding, on f32 copies of the parameters rounded back
        here (torchao's rounding, bits from a generator keyed by the seed,
        the step and the parameter's flat offset)."""
        from .torch import _StreamOrder, to_lpx
        lib = _ffi.L()
        with _StreamOrder(dev):
            if sr:
                work = [(p.detach(), p.detach().float()) for p, _ in items]
                P = [to_lpx(w) for _, w in work]
                G = [to_lpx(p.grad.detach()) for p, _ in items]
            else:
                work, P, G = self._views(items)
            M = [to_lpx(st["exp_avg"]) for _, st in items]
            V = [to_lpx(st["exp_avg_sq"]) for _, st in items]
            _check(lib.lpx_adamw_(_arr(P), _arr(G), _arr(M), _arr(V), len(items), *hyper, step))
        offs = self._flat_offsets() if sr else None
        for (p, _), (d, w) in zip(items, work):
            if sr:
                d.copy_(self._bf16_sr(w, step, offs[id(p)]))
            elif w is not d:
                d.copy_(w)

    def _bf16_sr(self, x, step, offset):
        """torchao's _fp32_to_bf16_sr with bits from a generator seeded by
        (seed, step, offset), so a run replays."""
        gen = torch.Generator(device=x.device)
        gen.manual_seed((self.seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + offset) % (1 << 63))
        r = torch.randint(0, 1 << 16, x.shape, generator=gen, device=x.device, dtype=torch.int32)
        bits = x.view(torch.int32)
        low = bits & 0xFFFF
        down = bits & -65536   # 0xFFFF0000 as int32
        out = torch.where(r < low, down + 0x10000, down).view(torch.float32)
        return torch.where(torch.isfinite(x), out, x).bfloat16()

    # ---- state dict --------------------------------------------------------------------------

    def _check_state(self, p, st, where):
        """A loaded state of parameter p, validated and copied onto p's
        device (never cast: codes stay uint8). Raises ValueError naming what
        is wrong."""
        name = self._name()
        if not isinstance(st, dict):
            raise ValueError(f"{name}: load_state_dict: {where} is a {type(st).__name__}, not a dict")
        if not st:
            return {}
        quant = "exp_avg_codes" in st
        keys = _QKEYS if quant else _FKEYS
        if set(st) != set(keys):
            raise ValueError(f"{name}: load_state_dict: {where} has keys {sorted(st)}, expected {sorted(keys)} "
                             f"(a state of another optimizer?)")
        step = st["step"]
        if isinstance(step, torch.Tensor):
            if step.numel() != 1:
                raise ValueError(f"{name}: load_state_dict: {where}['step'] holds {step.numel()} values, not 1")
            step = step.item()
        if not isinstance(step, (int, float)) or isinstance(step, bool) or step < 0 or step != int(step):
            raise ValueError(f"{name}: load_state_dict: {where}['step'] = {st['step']!r} is not a count >= 0")
        out = {"step": torch.tensor(float(step))}

        def take(k, dtype, n, shape=None):
            t = st[k]
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.numel() != n or (
                    shape is not None and tuple(t.shape) != tuple(shape)):
                got = (f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__)
                raise ValueError(f"{name}: load_state_dict: {where}['{k}'] is {got}, expected {dtype} of "
                                 f"{tuple(shape) if shape is not None else n} for a parameter of shape "
                                 f"{tuple(p.shape)}")
            out[k] = t.detach().to(device=p.device, copy=True).contiguous()

        if quant:
            block = st["block_size"]
            if isinstance(block, torch.Tensor):
                block = int(block.item())
            if not isinstance(block, int) or isinstance(block, bool) or block < 2 or block > 256 or block & (block - 1):
                raise ValueError(f"{name}: load_state_dict: {where}['block_size'] = {block!r} is not a power of two "
                                 f"in 2..256")
            out["block_size"] = block
            mc, vc, nb = self._shapes(p.numel(), block)
            take("exp_avg_codes", torch.uint8, mc, (mc,))
            take("exp_avg_scale", torch.float32, nb, (nb,))
            take("exp_avg_sq_codes", self._V_DTYPE, vc, (vc,))
            take("exp_avg_sq_scale", torch.float32, nb, (nb,))
        else:
            take("exp_avg", torch.float32, p.numel(), p.shape)
            take("exp_avg_sq", torch.float32, p.numel(), p.shape)
        return out

    def load_state_dict(self, state_dict):
        """Restores a state_dict() bit for bit: the codes and scales are
        copied, never cast (torch's Optimizer.load_state_dict casts every
        floating-point parameter's state to the parameter's dtype, which
        would turn codes into floats). Each state is checked against its
        parameter (keys, dtypes, sizes, block)."""
        name = self._name()
        if not isinstance(state_dict, dict) or "param_groups" not in state_dict:
            raise ValueError(f"{name}: load_state_dict: not an optimizer state dict (no 'param_groups')")
        groups = state_dict["param_groups"]
        saved = state_dict.get("state", {})
        for g in groups:
            g = {**self.defaults, **g}
            self._check_group({**g, "params": []})
        super().load_state_dict({"state": {}, "param_groups": groups})   # checks the group sizes, sets hyperparameters
        ids = [i for g in groups for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        unknown = set(saved) - set(ids)
        if unknown:
            raise ValueError(f"{name}: load_state_dict: state for parameter ids {sorted(unknown)} that no param "
                             f"group names")
        self.state.clear()
        for i, p in zip(ids, params):
            if i in saved:
                st = self._check_state(p, saved[i], f"state[{i}]")
                if st:
                    self.state[p] = st
        self._offsets = None

    # ---- inspection --------------------------------------------------------------------------

    def state_bytes(self) -> int:
        """Bytes held by the moments of every parameter (codes, scales, f32
        moments; not the step counters)."""
        return sum(t.numel() * t.element_size() for st in self.state.values() for k, t in st.items()
                   if k != "step" and isinstance(t, torch.Tensor))

    def dequantized_state(self, p):
        """(exp_avg, exp_avg_sq) of parameter p as f32 torch tensors of p's
        shape (lpx's decoding of the codes: lpx_kind_to_dense of the
        state kinds), or None before p's first step. For comparisons and for
        moving a state to another optimizer."""
        st = self.state.get(p)
        if not st:
            return None
        if "exp_avg" in st:
            return st["exp_avg"].clone(), st["exp_avg_sq"].clone()
        lib, f = _ffi.L(), _ffi.ffi
        out = []
        for role, ck, sk in ((0, "exp_avg_codes", "exp_avg_scale"), (1, "exp_avg_sq_codes", "exp_avg_sq_scale")):
            codes, scale = st[ck].cpu(), st[sk].cpu()
            meta = _META.pack(lib.LPX_OPTIM_STATE_META_MAGIC, lib.LPX_OPTIM_STATE_META_VERSION, self._FORMAT, role,
                              st["block_size"])
            kind = _ffi.string(lib.lpx_kind_name(lib.lpx_optim_state_kind(self._FORMAT)))
            from .torch import to_lpx, to_torch
            t = _lpx.kind_unflatten(kind, "f32", tuple(p.shape), [to_lpx(codes), to_lpx(scale)], meta)
            o = f.new("lpx_tensor **")
            _check(lib.lpx_kind_to_dense(t._h, o))
            d = to_torch(_lpx.Tensor(o[0])).clone().to(p.device)
            out.append(d)
        return tuple(out)


class AdamW8bit(_LpxAdamW):
    """torchao.optim.AdamW8bit's arguments and state format (bitsandbytes'
    block-wise dynamic 8-bit maps, block_size 256), stepped by liblpx.
    2.03 bytes of state per parameter (f32 AdamW: 8)."""
    _FORMAT, _BLOCK, _V_DTYPE = 0, 256, torch.uint8


class AdamW4bit(_LpxAdamW):
    """torchao.optim.AdamW4bit's arguments and state format (4-bit dynamic
    maps, two codes per byte), stepped by liblpx. The default block_size is
    256 (1.03 bytes of state per parameter), not torchao's 128 (1.06):
    block_size=128 gives torchao's default layout."""
    _FORMAT, _BLOCK, _V_DTYPE = 1, 256, torch.uint8


class AdamWFp8(_LpxAdamW):
    """torchao.optim.AdamWFp8's arguments; m in e4m3fn with a scale per
    block as torchao's, v in scaled f16 (FP8-LM's, where torchao keeps e4m3:
    docs/NUMERICS.md "Why the fp8 state keeps v in scaled f16"), stepped by
    liblpx. 3.03 bytes of state per parameter."""
    _FORMAT, _BLOCK, _V_DTYPE = 2, 256, torch.float16

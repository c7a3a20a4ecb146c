"""Float8: quantize / dequantize / scaled GEMM, and Float8Linear with its
recipe (lpx_float8_linear_recipe, overridable GEMM by GEMM), its
forward context and its delayed-scaling state (float8.h)."""
from . import _ffi
from ._errors import _EINVAL, _ENOTFOUND, _EPLUGIN, LpxError, LpxLoadError, LpxTypeError, LpxValueError
from ._ffi import check as _check
from .tensor import Tensor, _dtype, _dtype_name, _fp8, _h, _op, _opt, _t

# float8.h's LPX_FLOAT8_LOGICAL, ((lpx_dtype)-1): a cast, not an integer
# #define, so not among the declarations
_FLOAT8_LOGICAL = -1
# the names of float8.h's enums the binding takes and reports, filled from
# the declarations when liblpx loads
_ROLES = {}
_GEMM_MODES = {}
_GRANULARITIES = {}
_SCALINGS = {}
_FAST_ACCUM = {}
_GEMMS = ("fprop", "dgrad", "wgrad")
_TENSORWISE = _AXISWISE = _HIGH_PRECISION = _DELAYED = None


def _tables(lib):
    global _TENSORWISE, _AXISWISE, _HIGH_PRECISION, _DELAYED
    _ROLES.update({None: lib.LPX_FLOAT8_ROLE_NONE, "input": lib.LPX_FLOAT8_ROLE_INPUT,
                   "weight": lib.LPX_FLOAT8_ROLE_WEIGHT, "grad_output": lib.LPX_FLOAT8_ROLE_GRAD_OUTPUT})
    _GEMM_MODES.update({"fp8": lib.LPX_FLOAT8_GEMM_FP8, "high_precision": lib.LPX_FLOAT8_GEMM_HIGH_PRECISION,
                        "fake_quant": lib.LPX_FLOAT8_GEMM_FAKE_QUANT})
    _GRANULARITIES.update({"tensorwise": lib.LPX_FLOAT8_TENSORWISE, "axiswise": lib.LPX_FLOAT8_AXISWISE,
                           "block": lib.LPX_FLOAT8_BLOCK})
    _SCALINGS.update({"dynamic": lib.LPX_FLOAT8_DYNAMIC, "delayed": lib.LPX_FLOAT8_DELAYED})
    _FAST_ACCUM.update({"fprop": lib.LPX_FLOAT8_FAST_ACCUM_FPROP, "dgrad": lib.LPX_FLOAT8_FAST_ACCUM_DGRAD,
                        "wgrad": lib.LPX_FLOAT8_FAST_ACCUM_WGRAD})
    _TENSORWISE, _AXISWISE = lib.LPX_FLOAT8_TENSORWISE, lib.LPX_FLOAT8_AXISWISE
    _HIGH_PRECISION, _DELAYED = lib.LPX_FLOAT8_GEMM_HIGH_PRECISION, lib.LPX_FLOAT8_DELAYED


_ffi._on_load.append(_tables)


def _fields(ctype):
    """The field names of a C struct, in order (from the declarations)."""
    return [n for n, _ in _ffi.ffi.typeof(ctype).fields]


def float8_quantize(x, fp8="f8e4m3fn", rowwise=False, axis=None, pow2_scale=False, nonsaturating=False,
                    role=None, scale=None, return_stats=False):
    """Float8 tensor of dense x (f32/bf16/f16: the logical dtype). Dynamic
    tensorwise scaling by default; rowwise=True (or axis=d) for one scale
    per row (per slice along d); scale= a static f32 scale; role one of
    'input', 'weight', 'grad_output'. With return_stats, also returns a dict
    of the cast's statistics (amax, scale, underflow, saturation, nan)."""
    lib, f = _ffi.L(), _ffi.ffi
    x = _t(x)
    o = f.new("lpx_float8_quant_opts *")
    o.struct_size = f.sizeof("lpx_float8_quant_opts")
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
    o.scale = s._h if s is not None else f.NULL
    st = f.new("lpx_float8_stats *")
    out = f.new("lpx_tensor **")
    _check(lib.lpx_float8_quantize(x._h, o, out, st))
    t = Tensor(out[0])
    if return_stats:
        return t, {n: getattr(st, n) for n in _fields("lpx_float8_stats")}
    return t


def float8_dequantize(t, dtype=None):
    """Dense copy of a float8 tensor in `dtype` (default: its logical dtype):
    decode(q) * scale_inv in f32, rounded once."""
    t = _t(t)
    return _op(_ffi.L().lpx_float8_dequantize, t._h, _FLOAT8_LOGICAL if dtype is None else _dtype(dtype))


def float8_info(t):
    """{'fp8', 'logical', 'role', 'granularity', 'axis'} of a float8 tensor."""
    i = _ffi.ffi.new("lpx_float8_info *")
    _check(_ffi.L().lpx_float8_get_info(t._h, i))
    roles = {v: k for k, v in _ROLES.items()}
    return {"fp8": _dtype_name(i.fp8), "logical": _dtype_name(i.logical),
            "role": roles.get(i.role), "granularity": "axiswise" if i.granularity == _AXISWISE else "tensorwise",
            "axis": i.axis}


def float8_mm(a, b, bias=None, out_dtype=None):
    """Scaled fp8 GEMM of float8 tensors a [M, K] and b [K, N]."""
    bias = _opt(bias)
    return _op(_ffi.L().lpx_float8_mm, a._h, b._h, _h(bias),
               _FLOAT8_LOGICAL if out_dtype is None else _dtype(out_dtype))




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

    __slots__ = ("_c", "_owner")

    def __init__(self, c, owner):
        self._c, self._owner = c, owner   # owner: the recipe's memory, kept alive

    @property
    def dtype(self):
        """'f8e4m3fn' or 'f8e5m2'."""
        return _dtype_name(self._c.dtype)

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

    __slots__ = ("_c", "_owner")

    def __init__(self, c, owner):
        self._c, self._owner = c, owner   # owner: the recipe's memory, kept alive

    @property
    def mode(self):
        return _name_of(_GEMM_MODES, self._c.mode)

    @mode.setter
    def mode(self, v):
        self._c.mode = _choose(_GEMM_MODES, "mode", v)

    @property
    def a(self):
        return _OperandView(self._c.a, self._owner)

    @property
    def b(self):
        return _OperandView(self._c.b, self._owner)

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
        lib, f = _ffi.L(), _ffi.ffi
        if isinstance(preset, Float8Recipe):
            self._c = f.new("lpx_float8_linear_recipe *")
            self._c[0] = preset._c[0]
            self.name = preset.name
            return
        if not isinstance(preset, str):
            raise LpxTypeError(_EINVAL, f"a recipe is a preset name or a Float8Recipe, not {type(preset).__name__}")
        self._c = f.new("lpx_float8_linear_recipe *")
        st = lib.lpx_float8_linear_recipe_preset(preset.encode(), self._c)
        if st == _ENOTFOUND:
            raise LpxValueError(st, _ffi.last_error())
        _check(st)
        if self._c.struct_size != f.sizeof("lpx_float8_linear_recipe"):
            raise LpxLoadError(_EPLUGIN, f"liblpx's Float8Linear recipe is {self._c.struct_size} bytes, this binding "
                                         f"expects {f.sizeof('lpx_float8_linear_recipe')}: binding and library "
                                         "disagree")
        self.name = preset

    fprop = property(lambda self: _GemmView(self._c.fprop, self._c), doc="out = x @ W^T")
    dgrad = property(lambda self: _GemmView(self._c.dgrad, self._c), doc="grad_x = g @ W")
    wgrad = property(lambda self: _GemmView(self._c.wgrad, self._c), doc="grad_W = g^T @ x")

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
        return {g for g in _GEMMS if self._c.fast_accum & _FAST_ACCUM[g]}

    @fast_accum.setter
    def fast_accum(self, gemms):
        bits = 0
        for g in gemms:
            if g not in _GEMMS:
                raise LpxValueError(_EINVAL, f"fast_accum names GEMMs of {_GEMMS}, not {g!r}")
            bits |= _FAST_ACCUM[g]
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
        return any(getattr(self._c, g).mode != _HIGH_PRECISION and
                   (getattr(self._c, g).a.scaling == _DELAYED or getattr(self._c, g).b.scaling == _DELAYED)
                   for g in _GEMMS)

    def __repr__(self):
        return (f"Float8Recipe({self.name!r}: fprop={self.fprop!r}, dgrad={self.dgrad!r}, wgrad={self.wgrad!r}, "
                f"fast_accum={sorted(self.fast_accum)})")


def _report_dict(r, gemms):
    stats = _fields("lpx_float8_stats")
    out = {}
    for g in gemms:
        gr = getattr(r, g)
        if gr.mode < 0:
            continue
        d = {"mode": _name_of(_GEMM_MODES, gr.mode)}
        for side in ("a", "b"):
            o = getattr(gr, side)
            d[side] = {"quantized": o.quantized, "reused": o.reused, "given_fp8": o.given_fp8,
                       "dtype": _dtype_name(o.dtype) if o.dtype else None,
                       **{f: getattr(o.stats, f) for f in stats}}
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
        if not self._p:
            raise LpxValueError(_EINVAL, "Float8Linear backward: the forward context was freed (one backward "
                                         "per forward)")
        g = _t(grad_out)
        f = _ffi.ffi
        gx, gw, gb = f.new("lpx_tensor **"), f.new("lpx_tensor **"), f.new("lpx_tensor **")
        rep = f.new("lpx_float8_linear_report *")
        try:
            _check(_ffi.lib.lpx_float8_linear_backward(self._p, g._h, gx if need_x else f.NULL,
                                                       gw if need_w else f.NULL, gb if self._bias else f.NULL, rep))
        finally:
            if free:
                self.close()
        self.report.update(_report_dict(rep, ("dgrad", "wgrad")))
        return tuple(Tensor(h[0]) if h[0] else None for h in (gx, gw, gb))

    def close(self):
        if self._p and _ffi.lib is not None:
            _ffi.lib.lpx_float8_linear_ctx_free(self._p)
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
        lib = _ffi.L()
        self.weight = None if weight is None else _t(weight)
        self.bias = None if bias is None else _t(bias)
        self.recipe = Float8Recipe(recipe)
        self._state = _ffi.ffi.new("lpx_float8_linear_state *")
        _check(lib.lpx_float8_linear_state_init(self._state, self.recipe._c))
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
        f = _ffi.ffi
        out, p = f.new("lpx_tensor **"), f.new("lpx_float8_linear_ctx **")
        rep = f.new("lpx_float8_linear_report *")
        _check(_ffi.lib.lpx_float8_linear_forward(self.recipe._c, self._live(), x._h, w._h, _h(b),
                                                  out, p if keep else f.NULL, rep))
        ctx = Float8LinearCtx(p[0], b is not None) if keep else None
        self.last_report = _report_dict(rep, ("fprop",))
        if ctx is not None:
            ctx.report = self.last_report
        return Tensor(out[0]), ctx

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
        f = _ffi.ffi
        out = {}
        for name, h in self._states():
            if not h:
                continue
            size = f.new("size_t *")
            _check(_ffi.lib.lpx_float8_delayed_save(h, f.NULL, 0, size))
            buf = f.new("char[]", size[0])
            _check(_ffi.lib.lpx_float8_delayed_save(h, buf, size[0], size))
            out[name] = f.buffer(buf, size[0])[:]
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
                _check(_ffi.lib.lpx_float8_delayed_load(h, _ffi.ffi.from_buffer(data), len(data)))

    def close(self):
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None
        if _ffi.lib is not None and self._state is not None:
            _ffi.lib.lpx_float8_linear_state_destroy(self._state)
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

"""Tests of lpx.torch (python/lpx/torch.py): lpx's Float8Linear and
NF4/QLoRA layers inside PyTorch models. The oracles are independent of
liblpx: fp8 casts emulated with torch's own float8 dtypes and float64
GEMMs (torchao's recipe, written out here), torchao's Float8Linear in
emulation mode for a whole training run, and torch autograd in float64 for
the gradients. Run by meson with the project's test interpreter (.test-venv:
torch, torchao); exits 77 under ASan."""
import copy
import io
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if os.environ.get("LPX_TEST_ASAN"):
    print("skip: lpx.torch is not run under ASan (the interpreter is not instrumented)")
    sys.exit(77)

from pycase import Skip, SkipGpu, case, finish, needs  # noqa: E402

import lpx  # noqa: E402


def _torch():
    torch = needs("torch")
    import lpx.torch as lt
    torch.manual_seed(0)
    return torch, lt


def rel(a, b):
    """Relative error of a against reference b (Frobenius), in float64."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm()).item()


def emulate_cast(torch, t, fmt, axis=None, pow2=False):
    """torchao's dynamic cast, written out: scale = fp8_max / max(amax,
    1e-12) in float32 (per row along `axis` when given, rounded down to a
    power of two when pow2), x * scale clamped and cast with torch's own
    float8 dtype. Returns (the fp8 values as float64, the scale as float64)."""
    mx = torch.finfo(fmt).max
    a = t.float().abs()
    amax = a.amax() if axis is None else a.amax(dim=axis, keepdim=True)
    s = torch.tensor(mx, dtype=torch.float32) / amax.clamp(min=1e-12)
    if pow2:
        s = torch.exp2(torch.floor(torch.log2(s)))
    return (t.float() * s).clamp(-mx, mx).to(fmt).double(), s.double()


# ---- Float8Linear ----------------------------------------------------------------------


@case(extra=("torch",))
def test_float8_tensorwise_matches_emulation():
    torch, lt = _torch()
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    for dt, tol in ((torch.float32, 1e-6), (torch.bfloat16, 4e-3)):
        M, K, N = 48, 96, 80
        x = (torch.randn(M, K) * 3).to(dt).requires_grad_()
        lin = torch.nn.Linear(K, N).to(dt)
        layer = lt.Float8Linear.from_float(lin)
        assert layer.weight is lin.weight and layer.bias is lin.bias   # shared, not copied
        y = layer(x)
        g = torch.randn(M, N).to(dt)
        y.backward(g)
        x8, sx = emulate_cast(torch, x.detach(), e4)
        w8, sw = emulate_cast(torch, lin.weight.detach(), e4)
        g8, sg = emulate_cast(torch, g, e5)
        y_ref = x8 @ w8.T / (sx * sw) + lin.bias.detach().double()
        # bf16 results are rounded once: compare with the rounded reference
        assert y.dtype == dt and rel(y, y_ref.to(dt)) < tol, (dt, rel(y, y_ref))
        assert rel(x.grad, (g8 @ w8 / (sg * sw)).to(dt)) < tol, (dt, rel(x.grad, g8 @ w8 / (sg * sw)))
        assert rel(lin.weight.grad, (g8.T @ x8 / (sg * sx)).to(dt)) < tol
        assert rel(lin.bias.grad, g.double().sum(0).to(dt)) < tol
        # the fp8 statistics of the three GEMMs
        rep = layer.last_report
        assert set(rep) == {"fprop", "dgrad", "wgrad"}, rep.keys()
        assert rep["fprop"]["a"]["amax"] == x.detach().float().abs().max().item()
        assert rep["fprop"]["a"]["dtype"] == "f8e4m3fn" and rep["dgrad"]["a"]["dtype"] == "f8e5m2"
        assert abs(rep["fprop"]["a"]["scale"] - sx.item()) <= 1e-6 * sx.item()


@case(extra=("torch",))
def test_float8_rowwise_and_per_gemm_override():
    torch, lt = _torch()
    e4 = torch.float8_e4m3fn
    M, K, N = 32, 64, 48
    x = torch.randn(M, K).requires_grad_()
    lin = torch.nn.Linear(K, N, bias=False)
    # rowwise: one power-of-two scale per row of x and per row of W
    layer = lt.Float8Linear.from_float(lin, recipe="rowwise")
    y = layer(x)
    x8, sx = emulate_cast(torch, x.detach(), e4, axis=1, pow2=True)
    w8, sw = emulate_cast(torch, lin.weight.detach(), e4, axis=1, pow2=True)
    y_ref = (x8 / sx) @ (w8 / sw).T
    assert rel(y, y_ref) < 1e-6, rel(y, y_ref)
    # an override: grad_W in high precision, the other GEMMs as the preset
    r = lpx.Float8Recipe("tensorwise")
    r.wgrad.mode = "high_precision"
    x.grad = None
    layer = lt.convert_to_float8_training(torch.nn.Linear(K, N, bias=False), recipe=r)
    with torch.no_grad():
        layer.weight.copy_(lin.weight)
    g = torch.randn(M, N)
    layer(x).backward(g)
    exact = g.double().T @ x.detach().double()
    assert rel(layer.weight.grad, exact) < 1e-6, rel(layer.weight.grad, exact)
    assert rel(x.grad, g.double() @ lin.weight.detach().double()) > 1e-3   # dgrad is still fp8
    assert layer.last_report["wgrad"]["mode"] == "high_precision"
    assert layer.last_report["dgrad"]["mode"] == "fp8"
    assert "recipe='tensorwise'" in repr(layer)


# A transformers-free Llama (RMSNorm, rope, grouped-query attention, SwiGLU).
def _llama(torch):
    nn, F = torch.nn, torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.w = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.w

    class Block(nn.Module):
        def __init__(self, d, h, kvh, ffn):
            super().__init__()
            self.h, self.kvh, self.hd = h, kvh, d // h
            self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
            self.q = nn.Linear(d, d, bias=False)
            self.k = nn.Linear(d, kvh * self.hd, bias=False)
            self.v = nn.Linear(d, kvh * self.hd, bias=False)
            self.o = nn.Linear(d, d, bias=False)
            self.gate = nn.Linear(d, ffn, bias=False)
            self.up = nn.Linear(d, ffn, bias=False)
            self.down = nn.Linear(ffn, d, bias=False)

        def forward(self, x, cos, sin):
            B, T, D = x.shape
            hx = self.n1(x)
            q = self.q(hx).view(B, T, self.h, self.hd).transpose(1, 2)
            k = self.k(hx).view(B, T, self.kvh, self.hd).transpose(1, 2)
            v = self.v(hx).view(B, T, self.kvh, self.hd).transpose(1, 2)

            def rope(t):
                t1, t2 = t[..., : self.hd // 2], t[..., self.hd // 2:]
                return t * cos + torch.cat((-t2, t1), -1) * sin
            q, k = rope(q), rope(k)
            k = k.repeat_interleave(self.h // self.kvh, 1)
            v = v.repeat_interleave(self.h // self.kvh, 1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
            x = x + self.o(a)
            hx = self.n2(x)
            return x + self.down(F.silu(self.gate(hx)) * self.up(hx))

    class Llama(nn.Module):
        def __init__(self, vocab=256, d=128, layers=2, h=4, kvh=2, ffn=256, T=64):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList([Block(d, h, kvh, ffn) for _ in range(layers)])
            self.norm = RMSNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)
            hd = d // h
            inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
            f = torch.outer(torch.arange(T).float(), inv)
            e = torch.cat((f, f), -1)
            self.register_buffer("cos", e.cos())
            self.register_buffer("sin", e.sin())

        def forward(self, idx):
            x = self.emb(idx)
            T = idx.shape[1]
            for b in self.blocks:
                x = b(x, self.cos[:T], self.sin[:T])
            return self.head(self.norm(x))

    return Llama


def _train(torch, model, steps, B=8, T=64, vocab=256):
    """AdamW on sequences that count up from a random start with a random
    stride (learnable: the loss falls from ln 256 = 5.5 to ~0.3)."""
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, vocab, (steps, B, 1), generator=g)
    stride = torch.randint(1, 4, (steps, B, 1), generator=g)
    seq = (start + stride * torch.arange(T + 1)) % vocab
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for i in range(steps):
        logits = model(seq[i, :, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), seq[i, :, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@case(extra=("torch", "torchao"))
def test_llama_loss_curve_matches_torchao():
    """50 AdamW steps of a 2-block Llama with every linear but the output
    head in fp8 (tensorwise): lpx.torch against torchao's Float8Linear in
    emulation mode (the same recipe computed with torch ops on the CPU).
    The first step is the same arithmetic (1e-5: summation order only);
    later steps drift as any two fp8 runs do (measured here: at most 1.2%
    per step where fp8 vs f32 differ by up to 2.3%); the bound is 3% per
    step and 2% on the last loss."""
    torch, lt = _torch()
    ao = needs("torchao.float8")
    Llama = _llama(torch)
    base = Llama()
    keep_head = lambda mod, fqn: fqn != "head"   # noqa: E731 (as torchtitan does)
    mine = lt.convert_to_float8_training(copy.deepcopy(base), module_filter_fn=keep_head)
    theirs = copy.deepcopy(base)
    ao.convert_to_float8_training(theirs, config=ao.Float8LinearConfig(emulate=True), module_filter_fn=keep_head)
    assert type(mine.head) is torch.nn.Linear
    assert sum(isinstance(m, lt.Float8Linear) for m in mine.modules()) == 14
    a, b = _train(torch, mine, 50), _train(torch, theirs, 50)
    worst = max(abs(x - y) / y for x, y in zip(a, b))
    assert abs(a[0] - b[0]) / b[0] < 1e-5, (a[0], b[0])
    assert worst < 0.03, (worst, a, b)
    assert abs(a[-1] - b[-1]) / b[-1] < 0.02, (a[-1], b[-1])
    assert a[-1] < a[0] / 5, a                  # it learned


@case(extra=("torch",))
def test_convert_filter_state_dict_and_errors():
    torch, lt = _torch()
    nn = torch.nn
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 8)))
    plain = copy.deepcopy(model)
    seen = []

    def only_inner(mod, fqn):
        seen.append(fqn)
        return fqn.startswith("2.")
    lt.convert_to_float8_training(model, module_filter_fn=only_inner)
    assert seen == ["0", "2.0", "2.1"], seen
    assert type(model[0]) is nn.Linear and isinstance(model[2][0], lt.Float8Linear)
    # converting again changes nothing (only plain nn.Linear is converted)
    lt.convert_to_float8_training(model)
    assert isinstance(model[0], lt.Float8Linear) and type(model[2][1]) is lt.Float8Linear
    # state_dict: the same keys and plain tensors, loadable both ways
    sd = model.state_dict()
    assert set(sd) == set(plain.state_dict()) and all(type(v) is torch.Tensor for v in sd.values())
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    plain.load_state_dict(torch.load(buf, weights_only=True))
    model.load_state_dict(plain.state_dict())
    # an unknown recipe fails before anything is converted
    fresh = nn.Sequential(nn.Linear(4, 4))
    try:
        lt.convert_to_float8_training(fresh, recipe="bogus")
        raise AssertionError("unknown recipe accepted")
    except lpx.LpxValueError as e:
        assert "bogus" in e.message
    assert type(fresh[0]) is nn.Linear
    bad = lpx.Float8Recipe()
    bad.fprop.a.dtype = bad.fprop.b.dtype = "f8e5m2"
    try:
        lt.convert_to_float8_training(fresh, recipe=bad)
        raise AssertionError("e5m2 x e5m2 accepted")
    except lpx.LpxError as e:
        assert "e5m2 x e5m2" in e.message, e.message
    assert type(fresh[0]) is nn.Linear
    # float64 input: refused with lpx's error type, not a crash
    layer = lt.convert_to_float8_training(nn.Linear(4, 4))
    try:
        layer(torch.randn(2, 4, dtype=torch.float64))
        raise AssertionError("float64 accepted")
    except lpx.LpxTypeError as e:
        assert "float64" in e.message
    # a shape lpx refuses surfaces as an LpxError naming the op
    try:
        layer(torch.randn(2, 5))
        raise AssertionError("K mismatch accepted")
    except lpx.LpxError as e:
        assert "float8" in e.message.lower() or "linear" in e.message.lower(), e.message
    # a recipe field set to nonsense is refused by name
    r = lpx.Float8Recipe()
    for setter in (lambda: setattr(r.fprop, "mode", "fp4"), lambda: setattr(r.wgrad.a, "dtype", "f32"),
                   lambda: setattr(r, "fast_accum", {"bprop"})):
        try:
            setter()
            raise AssertionError("bad recipe field accepted")
        except lpx.LpxValueError:
            pass


@case(extra=("torch",))
def test_float8_delayed_state_roundtrip():
    torch, lt = _torch()
    lin = torch.nn.Linear(32, 16)
    a = lt.convert_to_float8_training(copy.deepcopy(lin), recipe="delayed")
    for _ in range(3):
        a(torch.randn(8, 32)).sum().backward()
    sd = a.state_dict()
    assert set(sd) == {"weight", "bias", "_extra_state"}
    assert set(sd["_extra_state"]) == {"input", "weight", "grad_output"}
    assert all(v.dtype == torch.uint8 for v in sd["_extra_state"].values())
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    b = lt.convert_to_float8_training(torch.nn.Linear(32, 16), recipe="delayed")
    b.load_state_dict(torch.load(buf, weights_only=True))
    x = torch.randn(8, 32)
    assert torch.equal(a(x), b(x))       # same weights, same amax histories: same bits
    assert a.last_report["fprop"]["a"]["scale"] == b.last_report["fprop"]["a"]["scale"] != 1.0
    # a damaged history is refused by lpx, and the module keeps its state
    bad = {k: v.clone() for k, v in sd["_extra_state"].items()}
    bad["input"][:8] = 0xFF
    try:
        b.set_extra_state(bad)
        raise AssertionError("damaged state accepted")
    except lpx.LpxError:
        pass
    assert torch.equal(a(x), b(x))


# ---- NF4 / QLoRA --------------------------------------------------------------------------


@case(extra=("torch",))
def test_nf4_linear_forward_bits_and_grads():
    torch, lt = _torch()
    K, N = 128, 96
    lin = torch.nn.Linear(K, N)
    layer = lt.NF4Linear.from_linear(lin)
    wd = layer.dequantize()
    assert wd.shape == (N, K) and rel(wd, lin.weight) < 0.15   # 4 bits: ~10% error
    # x = I: out = W_deq^T + bias, every element one product: exact bits
    eye = torch.eye(K)
    out = layer(eye)
    assert torch.equal(out, wd.T + lin.bias.detach()), (out - wd.T - lin.bias).abs().max()
    # random x: out = x @ W_deq^T + b, gradient of x = g @ W_deq (float64 autograd)
    x = torch.randn(7, 3, K, requires_grad=True)
    y = layer(x)
    xr = x.detach().double().requires_grad_()
    yr = xr @ wd.double().T + lin.bias.detach().double()
    assert rel(y, yr) < 1e-6
    g = torch.randn_like(y)
    y.backward(g)
    yr.backward(g.double())
    assert rel(x.grad, xr.grad) < 1e-6
    assert layer.bias.grad is None                # frozen
    assert sum(p.numel() for p in layer.parameters() if p.requires_grad) == 0


@case(extra=("torch",))
def test_qlora_matches_autograd():
    torch, lt = _torch()
    K, N, r, alpha = 64, 48, 8, 16.0
    layer = lt.NF4Linear.from_linear(torch.nn.Linear(K, N), r=r, alpha=alpha)
    assert [n for n, p in layer.named_parameters() if p.requires_grad] == ["lora_a", "lora_b"]
    with torch.no_grad():
        layer.lora_b.normal_()                    # a trained adapter, not the zero init
    x = torch.randn(5, K, requires_grad=True)
    y = layer(x)
    wd = layer.dequantize().double()
    xr = x.detach().double().requires_grad_()
    ar = layer.lora_a.detach().double().requires_grad_()
    br = layer.lora_b.detach().double().requires_grad_()
    yr = xr @ wd.T + layer.bias.double() + (alpha / r) * (xr @ ar.T) @ br.T
    assert rel(y, yr) < 1e-6, rel(y, yr)
    g = torch.randn_like(y)
    y.backward(g)
    yr.backward(g.double())
    for got, want in ((x.grad, xr.grad), (layer.lora_a.grad, ar.grad), (layer.lora_b.grad, br.grad)):
        assert rel(got, want) < 1e-6, rel(got, want)
    # dropout: train-mode forwards draw new masks, eval mode has none, and
    # the same step's seed gives the same mask
    drop = lt.NF4Linear.from_linear(torch.nn.Linear(K, N), r=r, dropout=0.5)
    with torch.no_grad():
        drop.lora_b.normal_()
    drop.train()
    y1, y2 = drop(x), drop(x)
    assert not torch.equal(y1, y2)
    drop._step = 0
    assert torch.equal(drop(x), y1)
    drop.eval()
    e1 = drop(x)
    drop.dropout = 0.0
    assert torch.equal(e1, drop(x))


@case(extra=("torch",))
def test_nf4_state_dict_roundtrip_and_damage():
    torch, lt = _torch()
    a = lt.NF4Linear.from_linear(torch.nn.Linear(64, 32), r=4)
    with torch.no_grad():
        a.lora_b.normal_()
    sd = a.state_dict()
    assert set(sd) == {"bias", "lora_a", "lora_b", "nf4_codes", "nf4_qscalers", "nf4_factors", "nf4_mean",
                       "nf4_meta"}, set(sd)
    assert all(type(v) is torch.Tensor for v in sd.values())
    assert sd["nf4_codes"].numel() == 64 * 32 // 2            # 4 bits per weight
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    b = lt.NF4Linear(64, 32, r=4)
    b.load_state_dict(torch.load(buf, weights_only=True))
    x = torch.randn(3, 64)
    assert torch.equal(a(x), b(x))
    # damaged metadata: the nf4 kind refuses to rebuild the weight
    meta = b.nf4_meta.clone()
    meta[0] ^= 0xFF
    b.nf4_meta.copy_(meta)
    try:
        b(x)
        raise AssertionError("damaged nf4 metadata accepted")
    except lpx.LpxError as e:
        assert "nf4" in e.message, e.message
    # convert_to_nf4 on a model
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    lt.convert_to_nf4(model, r=2, module_filter_fn=lambda m, fqn: fqn == "0")
    assert isinstance(model[0], lt.NF4Linear) and type(model[2]) is torch.nn.Linear
    assert model(x).shape == (3, 8)
    try:
        lt.NF4Linear(8, 8, r=-1)
        raise AssertionError("negative rank accepted")
    except lpx.LpxValueError:
        pass


# ---- fused RMSNorm / SwiGLU ----------------------------------------------------------------


def _hf_like(torch):
    """A block shaped as Hugging Face's Llama names its parts (LlamaRMSNorm:
    weight + variance_epsilon, computed as transformers does; LlamaMLP:
    gate_proj/up_proj/down_proj/act_fn), without transformers."""
    nn = torch.nn

    class LlamaRMSNorm(nn.Module):
        def __init__(self, d, eps=1e-5):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.variance_epsilon = eps

        def forward(self, x):
            dt = x.dtype
            x = x.to(torch.float32)
            x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return self.weight * x.to(dt)

    class LlamaMLP(nn.Module):
        def __init__(self, d, ffn):
            super().__init__()
            self.gate_proj = nn.Linear(d, ffn, bias=False)
            self.up_proj = nn.Linear(d, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, d, bias=False)
            self.act_fn = nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    class Block(nn.Module):
        def __init__(self, d=64, ffn=160):
            super().__init__()
            self.input_layernorm = LlamaRMSNorm(d)
            self.mlp = LlamaMLP(d, ffn)
            self.norm = nn.RMSNorm(d)           # torch's own, eps None
            with torch.no_grad():
                self.input_layernorm.weight.uniform_(0.5, 1.5)
                self.norm.weight.uniform_(0.5, 1.5)

        def forward(self, x):
            return self.norm(x + self.mlp(self.input_layernorm(x)))

    return Block


@case(extra=("torch",))
def test_fused_rmsnorm_swiglu_match_autograd():
    """lpx.torch.rms_norm and swiglu against torch autograd in float64:
    values and every gradient (f32: 1e-6 values, 1e-5 gradients; bf16: one
    rounding of the f32 result, so within 2^-8 of it), weightless norm,
    and the refusals."""
    torch, lt = _torch()
    F = torch.nn.functional
    x = torch.randn(6, 5, 96) * 3
    w = torch.rand(96) + 0.5
    gy = torch.randn(6, 5, 96)
    for weight in (w, None):
        xa = x.clone().requires_grad_()
        wa = None if weight is None else weight.clone().requires_grad_()
        y = lt.rms_norm(xa, wa, eps=1e-5)
        y.backward(gy)
        xd = x.double().requires_grad_()
        wd = None if weight is None else weight.double().requires_grad_()
        yd = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * (1 if wd is None else wd)
        yd.backward(gy.double())
        assert y.dtype == torch.float32 and rel(y, yd) < 1e-6, rel(y, yd)
        assert rel(xa.grad, xd.grad) < 1e-5, rel(xa.grad, xd.grad)
        if weight is not None:
            assert rel(wa.grad, wd.grad) < 1e-5, rel(wa.grad, wd.grad)
    # bf16 storage: f32 math, one rounding
    xb = x.bfloat16()
    yb = lt.rms_norm(xb, w.bfloat16(), 1e-5)
    ref = (xb.double() * torch.rsqrt(xb.double().pow(2).mean(-1, keepdim=True) + 1e-5) * w.bfloat16().double())
    assert yb.dtype == torch.bfloat16 and rel(yb, ref) < 2 ** -8, rel(yb, ref)
    # swiglu
    g, u = torch.randn(7, 300) * 4, torch.randn(7, 300)
    ga, ua = g.clone().requires_grad_(), u.clone().requires_grad_()
    y = lt.swiglu(ga, ua)
    y.backward(gy.flatten()[: 2100].view(7, 300))
    gd, ud = g.double().requires_grad_(), u.double().requires_grad_()
    yd = F.silu(gd) * ud
    yd.backward(gy.flatten()[: 2100].view(7, 300).double())
    assert rel(y, yd) < 1e-6 and rel(ga.grad, gd.grad) < 1e-5 and rel(ua.grad, ud.grad) < 1e-5, \
        (rel(y, yd), rel(ga.grad, gd.grad), rel(ua.grad, ud.grad))
    yb = lt.swiglu(g.bfloat16(), u.bfloat16())
    assert yb.dtype == torch.bfloat16 and rel(yb, yd) < 2 ** -8, rel(yb, yd)
    for bad, err in (((g, u[:, :10]), lpx.LpxValueError), ((g, u.double()), lpx.LpxValueError),
                     ((g.long(), u.long()), lpx.LpxTypeError)):
        try:
            lt.swiglu(*bad)
            raise AssertionError(f"swiglu accepted {[t.shape for t in bad]} {[t.dtype for t in bad]}")
        except err as e:
            assert "swiglu" in e.message, e.message
    try:
        lt.rms_norm(x, torch.ones(95))
        raise AssertionError("rms_norm accepted a weight of the wrong size")
    except lpx.LpxError as e:
        assert "rmsnorm" in e.message and "[95]" in e.message, e.message


@case(extra=("torch",))
def test_convert_to_fused_ops_keeps_model():
    """convert_to_fused_ops on Hugging Face-shaped modules (LlamaRMSNorm,
    LlamaMLP) and torch.nn.RMSNorm: the same Parameters and state_dict keys,
    outputs and every gradient equal to the unconverted model's (f32, 1e-5:
    summation order), composing with convert_to_float8_training; modules
    that are not norms or SiLU MLPs are left alone."""
    torch, lt = _torch()
    Block = _hf_like(torch)
    base = Block()
    fused = lt.convert_to_fused_ops(copy.deepcopy(base))
    assert isinstance(fused.input_layernorm, lt.RMSNorm) and isinstance(fused.norm, lt.RMSNorm)
    assert isinstance(fused.mlp, lt.SwiGLUMLP) and fused.input_layernorm.eps == 1e-5 and fused.norm.eps is None
    assert list(fused.state_dict()) == list(base.state_dict())
    fused.load_state_dict(base.state_dict())
    x = torch.randn(3, 11, 64)
    ya, yb = base(x), fused(x)
    assert rel(yb, ya) < 1e-5, rel(yb, ya)
    ya.square().sum().backward()
    yb.square().sum().backward()
    for (n, pa), (_, pb) in zip(base.named_parameters(), fused.named_parameters()):
        assert rel(pb.grad, pa.grad) < 1e-5, (n, rel(pb.grad, pa.grad))
    # with fp8 linears, either order
    f8 = lt.convert_to_fused_ops(lt.convert_to_float8_training(copy.deepcopy(base)))
    f8b = lt.convert_to_float8_training(lt.convert_to_fused_ops(copy.deepcopy(base)))
    assert isinstance(f8.mlp.gate_proj, lt.Float8Linear) and isinstance(f8b.mlp.down_proj, lt.Float8Linear)
    assert torch.equal(f8(x), f8b(x)) and rel(f8(x), ya) < 0.1
    # only norms; filtered; a GELU MLP stays
    only = lt.convert_to_fused_ops(copy.deepcopy(base), swiglu_mlp=False)
    assert isinstance(only.norm, lt.RMSNorm) and not isinstance(only.mlp, lt.SwiGLUMLP)
    kept = lt.convert_to_fused_ops(copy.deepcopy(base), module_filter_fn=lambda m, fqn: fqn != "norm")
    assert type(kept.norm) is torch.nn.RMSNorm and isinstance(kept.input_layernorm, lt.RMSNorm)
    gelu = copy.deepcopy(base)
    gelu.mlp.act_fn = torch.nn.GELU()
    assert not isinstance(lt.convert_to_fused_ops(gelu).mlp, lt.SwiGLUMLP)


# ---- CUDA ---------------------------------------------------------------------------------


def _cuda_torch():
    """torch and lpx.torch with lpx-cuda loaded, or a GPU skip."""
    torch, lt = _torch()
    if not torch.cuda.is_available():
        raise SkipGpu("torch sees no CUDA device")
    lib = os.path.dirname(os.environ.get("LPX_LIBRARY", ""))
    try:
        lpx.cuda_stream(0)        # loaded already (a wheel, LPX_PLUGIN_PATH)
    except lpx.LpxLoadError:
        # a build tree (meson) or a gpu-stage folder
        found = [p for p in (os.path.join(lib, "backends", "cuda", "lpx-cuda.so"), os.path.join(lib, "lpx-cuda.so"))
                 if os.path.exists(p)]
        if not found:
            raise Skip(f"lpx-cuda.so is not built beside {lib or 'liblpx'}") from None
        lpx.load_plugin(found[0])
    return torch, lt


def _gpu_delay(torch):
    """Queues ~0.1 s of spinning on torch's current stream: work queued
    after it lands late, so a reader on lpx's stream that is not ordered
    after that work reads what was there before."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(200_000_000)


class _SlowPoisonedCopies:
    """Within: every .contiguous() copy of a non-contiguous CUDA tensor
    lands in memory that held NaNs (a same-sized NaN block freed just
    before, which torch's caching allocator hands out again) and is queued
    behind _gpu_delay on torch's stream. A consumer that reads the copy
    without being ordered after it (lpx's stream told to wait before the
    copy was queued) sees NaNs or stale values."""

    def __init__(self, torch):
        self.torch, self.orig, self.copies = torch, torch.Tensor.contiguous, 0

    def __enter__(self):
        torch, orig = self.torch, self.orig

        def slow(t, *a, **k):
            if t.is_cuda and not t.is_contiguous():
                # filled, freed (back to the cache), and the fill done
                torch.empty(t.shape, dtype=t.dtype, device=t.device).fill_(float("nan"))
                torch.cuda.synchronize()
                _gpu_delay(torch)
                self.copies += 1
            return orig(t, *a, **k)
        torch.Tensor.contiguous = slow
        return self

    def __exit__(self, *exc):
        self.torch.Tensor.contiguous = self.orig
        return False


@case(extra=("torch",))
def test_cuda_noncontiguous_inputs_are_ordered():
    """issue 34 item 4: a non-contiguous tensor handed to lpx (the expanded
    grad of .sum(), a transposed input) is made contiguous on torch's
    stream; lpx must read the copy only after it is written (to_lpx orders
    it by the DLPack handshake). With the copies delayed and their memory
    poisoned, the results agree with the CPU run."""
    torch, lt = _cuda_torch()
    lin = torch.nn.Linear(256, 128)
    xt = torch.randn(256, 64)                 # x = xt.t(): [64, 256], transposed
    cpu = lt.Float8Linear.from_float(copy.deepcopy(lin))
    gpu = lt.Float8Linear.from_float(copy.deepcopy(lin).cuda())
    xc = xt.t().contiguous().requires_grad_()
    xg = xt.cuda().requires_grad_()
    yc = cpu(xc)
    yc.sum().backward()
    with _SlowPoisonedCopies(torch) as sp:
        yg = gpu(xg.t())                      # the transposed input
        yg.sum().backward()                   # the grad: ones expanded (stride 0)
        torch.cuda.synchronize()
    assert sp.copies >= 2, f"{sp.copies} contiguous copies made: the case does not test what it says"
    errs = {"out": rel(yg.detach().cpu(), yc.detach()), "grad_x": rel(xg.grad.t().cpu(), xc.grad),
            "grad_w": rel(gpu.weight.grad.cpu(), cpu.weight.grad)}
    assert all(e == e for e in errs.values()), f"NaN read before the copy was written: {errs}"
    assert errs["out"] < 5e-3 and errs["grad_x"] < 5e-4 and errs["grad_w"] < 5e-4, errs
    # the fused RMSNorm: a transposed input and the expanded grad of .sum()
    w = torch.randn(64)
    xr = torch.randn(33, 4, 64)
    xa, xb = xr.transpose(0, 1).contiguous().requires_grad_(), xr.cuda().requires_grad_()
    wa, wb = w.clone().requires_grad_(), w.cuda().requires_grad_()
    ya = lt.rms_norm(xa, wa, 1e-6)
    ya.sum().backward()
    with _SlowPoisonedCopies(torch) as sp:
        yb = lt.rms_norm(xb.transpose(0, 1), wb, 1e-6)
        yb.sum().backward()
        torch.cuda.synchronize()
    assert sp.copies >= 2, f"{sp.copies} contiguous copies made (rms_norm)"
    errs = {"out": rel(yb.detach().cpu(), ya.detach()), "grad_x": rel(xb.grad.transpose(0, 1).cpu(), xa.grad),
            "grad_w": rel(wb.grad.cpu(), wa.grad)}
    assert all(e < 1e-5 for e in errs.values()), f"rms_norm on CUDA (NaN: read before written): {errs}"


@case(extra=("torch",))
def test_cuda_nf4_linear_from_cuda_layer_is_ordered():
    """issue 34 item 5: NF4Linear made from a CUDA layer quantizes the
    weight torch just wrote (a copy_ queued behind a delay), and
    dequantize() reads the codes load_state_dict just copied in: both
    ordered against torch's stream. Against the CPU's NF4 of the same
    weight (the codec is the CPU's on the GPU: equal bits expected; an
    unordered read gives other weights altogether)."""
    torch, lt = _cuda_torch()
    w = torch.randn(128, 256)
    lin_c = torch.nn.Linear(256, 128)
    with torch.no_grad():
        lin_c.weight.copy_(w)
    ref = lt.NF4Linear.from_linear(lin_c).dequantize()
    lin_g = copy.deepcopy(lin_c).cuda()       # the same bias; the weight zero until the copy below lands
    wg = w.cuda()
    with torch.no_grad():
        lin_g.weight.zero_()
        torch.cuda.synchronize()
        _gpu_delay(torch)
        lin_g.weight.copy_(wg)                # queued on torch's stream, late
    n = lt.NF4Linear.from_linear(lin_g)
    assert n.nf4_codes.is_cuda
    got = n.dequantize().cpu()
    e = rel(got, ref)
    assert e < 1e-6, f"NF4 of a CUDA layer differs from the CPU's: relative error {e:.3g}"
    print(f"  NF4 of a CUDA layer: {'the CPU bits' if torch.equal(got, ref) else f'relative error {e:.3g}'}")
    # dequantize() after load_state_dict's copies into the CUDA buffers
    other = lt.NF4Linear.from_linear(torch.nn.Linear(256, 128).cuda())
    torch.cuda.synchronize()
    _gpu_delay(torch)
    other.load_state_dict(n.state_dict())    # copy_ into the same buffers, late
    got = other.dequantize().cpu()
    e = rel(got, ref)
    assert e < 1e-6, f"dequantize() read the codes before load_state_dict wrote them: relative error {e:.3g}"
    # and the layer's output over the loaded codes (and bias)
    x = torch.randn(8, 256)
    e = rel(other(x.cuda()).cpu(), lt.NF4Linear.from_linear(lin_c)(x))
    assert e < 1e-5, f"NF4Linear from a CUDA layer vs CPU: relative error {e:.3g}"


@case(extra=("torch",))
def test_cuda_attention_finds_cudnn():
    """issue 34 item 6: in a torch process cuDNN is reachable (torch's
    wheel brings it: nvidia/cudnn/lib in site-packages), so lpx-cuda's
    attention takes cuDNN's fused SDPA and names the file it loaded."""
    torch, lt = _cuda_torch()
    import ctypes
    fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)(
        lpx._cuda_plugin_symbol("lpx_cuda_attention_path"))
    buf = ctypes.create_string_buffer(4096)
    fn(buf, len(buf))
    words = buf.value.decode()
    print(f"  attention (cuda): {words}")
    if os.environ.get("LPX_CUDA_ATTENTION") == "reference":
        raise Skip("LPX_CUDA_ATTENTION=reference is set")
    assert "fused SDPA (/" in words, f"lpx-cuda did not load cuDNN in a torch process: {words}"


@case(extra=("torch",))
def test_cuda_layers_match_cpu():
    """On a GPU: the same layers on CUDA tensors (lpx-cuda through DLPack,
    ordered against torch's stream) agree with the CPU run."""
    torch, lt = _cuda_torch()
    lin = torch.nn.Linear(256, 128)
    x = torch.randn(64, 256)
    cpu = lt.Float8Linear.from_float(copy.deepcopy(lin))
    gpu = lt.Float8Linear.from_float(copy.deepcopy(lin).cuda())
    xc, xg = x.clone().requires_grad_(), x.cuda().requires_grad_()
    yc, yg = cpu(xc), gpu(xg)
    g = torch.randn_like(yc)
    yc.backward(g)
    yg.backward(g.cuda())
    assert yg.device.type == "cuda"
    # the tolerances of the GPU suite's Float8Linear cases (test_cuda_gemm_nn.c):
    # the casts are bit-exact, but the forward GEMM runs with cuBLASLt's fast
    # fp8 accumulation (every preset's fprop, as torchao's) while the CPU sums
    # exactly (5e-3), and dgrad/wgrad promote to f32 in another order (5e-4)
    errs = {"out": rel(yg.cpu(), yc), "grad_x": rel(xg.grad.cpu(), xc.grad),
            "grad_w": rel(gpu.weight.grad.cpu(), cpu.weight.grad)}
    assert errs["out"] < 5e-3 and errs["grad_x"] < 5e-4 and errs["grad_w"] < 5e-4, errs
    n = lt.NF4Linear.from_linear(copy.deepcopy(lin).cuda(), r=4)
    nc = lt.NF4Linear.from_linear(copy.deepcopy(lin), r=4)
    with torch.no_grad():
        nc.lora_a.copy_(n.lora_a.cpu())
    e = rel(n(x.cuda()).cpu(), nc(x))
    assert e < 1e-5, f"NF4Linear on CUDA vs CPU: relative error {e:.3g}"
    # the fused ops (lpx-cuda's rmsnorm and swiglu kernels) against the CPU's,
    # in f32 (CUDA's expf: within ulps) and bf16 (one rounding either side)
    Block = _hf_like(torch)
    base = lt.convert_to_fused_ops(Block())
    dev = copy.deepcopy(base).cuda()
    xb = torch.randn(4, 33, 64)
    for dt, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        a, b = copy.deepcopy(base).to(dt), copy.deepcopy(dev).to(dt)
        ya, yb = a(xb.to(dt)), b(xb.to(dt).cuda())
        ya.float().square().sum().backward()
        yb.float().square().sum().backward()
        errs = {"out": rel(yb.cpu(), ya)}
        errs.update({n: rel(pb.grad.cpu(), pa.grad) for (n, pa), (_, pb) in
                     zip(a.named_parameters(), b.named_parameters())})
        assert max(errs.values()) < tol, (dt, errs)


finish()

#!/usr/bin/env python3
"""PyTorch reference for `lpx bench dispatch`.

Times, on 16-element float tensors, ns per call of:
  torch_add_out       torch.add(a, b, out=c)
  torch_dispatch_1    the same through one __torch_dispatch__ wrapper subclass
                      (unwrap args, call the op on the inner tensors)
  torch_dispatch_2    two wrapper layers (a wrapper of a wrapper)
The wrappers are the minimal form of the tensor-subclass pattern lpx kinds
reproduce (torchao's Float8Tensor, DTensor): lpx's "1 kind layer" and
"2 kind layers" rows are their analogs.

Timing matches lpx_bench_measure: calibrate a batch to ~batch_ms, warm up,
then the median over --reps timed batches.

Output, one line per case (read by tools/lpx/bench_dispatch.c):
  <case> <median_ns> <min_ns>
Exit status 3 when torch cannot be imported (the caller tries another
interpreter or reports "not available").
"""
import argparse
import sys
import time

try:
    import torch
    from torch.utils._pytree import tree_map
except Exception as e:  # noqa: BLE001 - any import failure means "no torch"
    print(f"torch unavailable: {e}", file=sys.stderr)
    sys.exit(3)


def make_wrapper(name):
    """A wrapper subclass class; two distinct classes give two layers."""

    class Wrapper(torch.Tensor):
        __slots__ = ("elem",)

        @staticmethod
        def __new__(cls, elem):
            r = torch.Tensor._make_wrapper_subclass(
                cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
                dtype=elem.dtype, layout=elem.layout, device=elem.device, requires_grad=False)
            r.elem = elem
            return r

        # dispatch-level subclass only, as torchao's subclasses do
        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}

            def unwrap(x):
                return x.elem if isinstance(x, cls) else x

            out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
            if "out" in kwargs:  # out= variants return the (wrapped) out
                return kwargs["out"]
            return tree_map(lambda x: cls(x) if isinstance(x, torch.Tensor) else x, out)

    Wrapper.__name__ = Wrapper.__qualname__ = name
    return Wrapper


def measure(batch, reps, batch_ms):
    n = 1
    while True:
        t0 = time.perf_counter_ns()
        batch(n)
        t = time.perf_counter_ns() - t0
        if t >= batch_ms * 1e5 or n >= 1 << 40:
            break
        n *= 2
    size = max(1, int(batch_ms * 1e6 / max(t / n, 1e-3)))
    warm_end = time.perf_counter_ns() + 50e6
    while True:
        batch(size)
        if time.perf_counter_ns() >= warm_end:
            break
    v = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter_ns()
        batch(size)
        v.append((time.perf_counter_ns() - t0) / size)
    v.sort()
    k = len(v)
    med = v[k // 2] if k % 2 else 0.5 * (v[k // 2 - 1] + v[k // 2])
    return med, v[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=101)
    ap.add_argument("--batch-ms", type=float, default=2.0)
    opt = ap.parse_args()
    torch.set_num_threads(1)
    a, b, c = torch.rand(16), torch.rand(16), torch.empty(16)
    W1, W2 = make_wrapper("Wrapper1"), make_wrapper("Wrapper2")
    w1 = [W1(x) for x in (a, b, c)]
    w2 = [W2(W1(x)) for x in (a, b, c)]

    def plain(n):
        add = torch.add
        for _ in range(n):
            add(a, b, out=c)

    def layer1(n):
        add, (x, y, z) = torch.add, w1
        for _ in range(n):
            add(x, y, out=z)

    def layer2(n):
        add, (x, y, z) = torch.add, w2
        for _ in range(n):
            add(x, y, out=z)

    # the wrappers must really compute the sum before we time them
    layer2(1)
    layer1(1)
    assert torch.equal(w2[2].elem.elem, a + b) and torch.equal(w1[2].elem, a + b)

    for name, fn in (("torch_add_out", plain), ("torch_dispatch_1", layer1), ("torch_dispatch_2", layer2)):
        med, lo = measure(fn, opt.reps, opt.batch_ms)
        print(f"{name} {med:.3f} {lo:.3f}", flush=True)


if __name__ == "__main__":
    main()

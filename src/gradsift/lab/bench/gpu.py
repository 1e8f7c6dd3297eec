"""``gradsift bench select|step --device cuda``: the Triton kernels against plain torch
on a GPU, timed with CUDA events (medians).

- select: ``topk_indices(x, k, backend="triton")`` vs the torch backend vs
  ``torch.topk(x.abs(), k)``, float32 normal data, k = 0.1% and 1% of N.
- step: ``TopK(SGD)`` + error feedback with ``backend="triton"`` vs the torch backend
  vs dense ``SGD(foreach=True)`` and ``SGD(fused=True)``, on ResNet-18's shapes
  (11.7M) and on 8 equal tensors at larger N.

``device`` may also be ``"cpu"`` with ``TRITON_INTERPRET=1`` (the tests run it so, on
tiny sizes, to check the rows); such times mean nothing.
"""

from __future__ import annotations

import statistics

import torch

from gradsift import TopK, topk_indices
from gradsift.budget import resolve_k
from gradsift.lab.bench.step import resnet18_shapes
from gradsift.lab.bench.timing import interleaved_ms
from gradsift.lab.tables import columns

__all__ = ["GPU_BENCHES", "bench_select_gpu", "bench_step_gpu", "require_cuda"]

SIZES = (11_700_000, 25_000_000, 100_000_000)
DENSITIES = (0.001, 0.01)

SELECT_COLUMNS = columns(
    """
    n                   N               d
    k                   k               d
    triton_ms           triton ms       .3f
    torch_backend_ms    torch path ms   .3f
    torch_topk_ms       topk(|x|) ms    .3f
    topk_over_triton    topk/triton     .1f
    """
)

STEP_COLUMNS = columns(
    """
    n                   N                d
    density             density          g
    triton_ms           triton ms        .3f
    torch_backend_ms    torch path ms    .3f
    foreach_sgd_ms      SGD foreach ms   .3f
    fused_sgd_ms        SGD fused ms     .3f
    triton_over_fused   triton/fused     .2f
    """
)


def require_cuda(device: str) -> torch.device:
    """``device`` as a torch device; ValueError for anything but CUDA or CPU, and for
    CUDA where torch has none."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device must be cuda (or cuda:N), got {device!r}") from None
    if dev.type not in ("cuda", "cpu"):
        raise ValueError(f"--device must be cuda (or cuda:N), got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda needs a CUDA GPU, and this torch sees none")
    return dev


def _median_ms(fn, repeats: int, device: torch.device, setup=None) -> float:
    """Median of ``repeats`` timed calls after a warm-up (the first compiles the
    kernels): CUDA events on a GPU, the queue drained before each so that each call
    is timed alone; ``interleaved_ms``'s wall clock on CPU (the interpreter)."""
    setup = setup or (lambda: None)
    if device.type != "cuda":
        return statistics.median(interleaved_ms({"fn": (setup, fn)}, repeats)["fn"])
    times = []
    for i in range(repeats + 1):
        setup()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def bench_select_gpu(sizes=SIZES, repeats: int = 7, device: str = "cuda", seed: int = 0):
    dev = require_cuda(device)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in sizes:
        x = torch.randn(n, generator=gen).to(dev)
        for k in sorted({max(1, int(n * d)) for d in DENSITIES}):
            t = {
                "triton_ms": lambda: topk_indices(x, k, backend="triton"),  # noqa: B023
                "torch_backend_ms": lambda: topk_indices(x, k),  # noqa: B023
                "torch_topk_ms": lambda: torch.topk(x.abs(), k),  # noqa: B023
            }
            row = {"n": n, "k": k, **{name: _median_ms(fn, repeats, dev) for name, fn in t.items()}}
            row["topk_over_triton"] = row["torch_topk_ms"] / row["triton_ms"]
            rows.append(row)
    return rows


def _step_models(sizes) -> list[list[tuple[int, ...]]]:
    """Parameter shapes to step: by default ResNet-18's, then 8 equal tensors at each
    larger N of ``SIZES``; for given ``sizes``, 8 equal tensors each."""
    if sizes is None:
        return [resnet18_shapes(), *([(n // 8,)] * 8 for n in SIZES[1:])]
    return [[(n // 8,)] * 8 for n in sizes]


def _steppers(shapes, density, dev, gen):
    """name -> (params, optimizer), each on its own copy of the same parameters."""
    start = [torch.randn(s, generator=gen).to(dev) for s in shapes]

    def params():
        return [torch.nn.Parameter(p.clone()) for p in start]

    def sgd(ps, **kw):
        return torch.optim.SGD(ps, lr=1e-3, **kw)

    out = {}
    for name, backend in (("triton_ms", "triton"), ("torch_backend_ms", "torch")):
        ps = params()
        out[name] = ps, TopK(sgd(ps, foreach=True), density=density, backend=backend)
    for name, kw in (("foreach_sgd_ms", {"foreach": True}), ("fused_sgd_ms", {"fused": True})):
        ps = params()
        out[name] = ps, sgd(ps, **kw)
    return out


def bench_step_gpu(sizes=None, repeats: int = 15, device: str = "cuda", seed: int = 0):
    """One row per (N, density); the gradient is refilled (untimed) before each step."""
    dev = require_cuda(device)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for shapes in _step_models(sizes):
        grads = [torch.randn(s, generator=gen).to(dev) for s in shapes]
        for density in DENSITIES:
            row = {"n": sum(g.numel() for g in grads), "density": density}
            row["k"] = resolve_k(row["n"], density=density)
            for name, (ps, opt) in _steppers(shapes, density, dev, gen).items():

                def refill(ps=ps, grads=grads):
                    for p, g in zip(ps, grads):
                        if p.grad is None:
                            p.grad = g.clone()
                        else:
                            p.grad.copy_(g)  # in place: keeps TopK's flat-buffer views

                row[name] = _median_ms(opt.step, repeats, dev, setup=refill)
            row["triton_over_fused"] = row["triton_ms"] / row["fused_sgd_ms"]
            rows.append(row)
    return rows


GPU_BENCHES = {
    "select": (bench_select_gpu, SELECT_COLUMNS),
    "step": (bench_step_gpu, STEP_COLUMNS),
}

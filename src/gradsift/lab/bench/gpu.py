"""``gradsift bench select|step --device cuda``: the Triton kernels against plain torch
on a GPU, timed with CUDA events (medians).

- select: ``topk_indices(x, k)`` (the default, ``backend="auto"``: the Triton kernels
  on a GPU) and the torch backend against the anchors measured in the same run:
  ``torch.topk(x.abs(), k)``, one ``x.abs().amax()`` (a read), the threshold pass
  ``(x.abs() >= t).nonzero()``, DGC's sampled threshold (a 1% random sample's top,
  then that pass; Lin et al. 2018) and a device copy of ``x`` (a read and a write:
  the bandwidth the card gives). ``reads`` is the selection's time over one read.
  float32 normal data, N = 11.7M, 25M, 100M, 1B, k = 0.1% and 1% of N.
- step: ``TopK(SGD)`` + error feedback with ``backend="triton"`` vs the torch backend
  vs dense ``SGD(foreach=True)`` and ``SGD(fused=True)``, on ResNet-18's shapes
  (11.7M) and on 8 equal tensors at 25M, 100M and 1B.

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
SELECT_SIZES = (*SIZES, 1_000_000_000)
DENSITIES = (0.001, 0.01)

SELECT_COLUMNS = columns(
    """
    n                   N               d
    k                   k               d
    auto_ms             gradsift ms     .3f
    torch_backend_ms    torch path ms   .3f
    torch_topk_ms       topk(|x|) ms    .3f
    amax_ms             amax ms         .3f
    threshold_pass_ms   >=t nonzero ms  .3f
    dgc_ms              DGC sampled ms  .3f
    topk_over_auto      topk/gradsift   .1f
    reads               reads           .2f
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


def _dgc_threshold(x: torch.Tensor, k: int) -> torch.Tensor:
    """DGC's selection (Lin et al. 2018, arXiv:1712.01887): the threshold is the top of
    a 1% random sample, then one pass keeps ``|x| >= t`` (about k, not exactly k)."""
    n = x.numel()
    m = max(1, n // 100)
    sample = x[torch.randint(0, n, (m,), device=x.device)].abs()
    t = torch.topk(sample, max(1, k * m // n)).values[-1]
    return (x.abs() >= t).nonzero()


def bench_select_gpu(sizes=SELECT_SIZES, repeats: int = 7, device: str = "cuda", seed: int = 0):
    dev = require_cuda(device)
    gen = torch.Generator(device=dev).manual_seed(seed)
    rows = []
    for n in sizes:
        x = torch.randn(n, generator=gen, device=dev)
        copy_ms = _median_ms(lambda: torch.empty_like(x).copy_(x), repeats, dev)  # noqa: B023
        for k in sorted({resolve_k(n, density=d) for d in DENSITIES}):
            t = torch.topk(x.abs(), k).values[-1]
            times = {
                "auto_ms": lambda: topk_indices(x, k),  # noqa: B023
                "torch_backend_ms": lambda: topk_indices(x, k, backend="torch"),  # noqa: B023
                "torch_topk_ms": lambda: torch.topk(x.abs(), k),  # noqa: B023
                "amax_ms": lambda: x.abs().amax(),  # noqa: B023
                "threshold_pass_ms": lambda: (x.abs() >= t).nonzero(),  # noqa: B023
                "dgc_ms": lambda: _dgc_threshold(x, k),  # noqa: B023
            }
            row = {"n": n, "k": k}
            row |= {name: _median_ms(fn, repeats, dev) for name, fn in times.items()}
            row["topk_over_auto"] = row["torch_topk_ms"] / row["auto_ms"]
            row["reads"] = row["auto_ms"] / (copy_ms / 2)
            rows.append(row)
    return rows


def _step_models(sizes) -> list[list[tuple[int, ...]]]:
    """Parameter shapes to step: by default ResNet-18's, then 8 equal tensors at each
    larger N of ``SIZES``; for given ``sizes``, 8 equal tensors each."""
    if sizes is None:
        return [resnet18_shapes(), *([(n // 8,)] * 8 for n in SELECT_SIZES[1:])]
    return [[(n // 8,)] * 8 for n in sizes]


def _steppers(shapes, density, dev, gen):
    """name -> (params, optimizer), each on its own copy of the same parameters."""
    start = [torch.randn(s, generator=gen, device=gen.device).to(dev) for s in shapes]

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
    gen = torch.Generator(device=dev).manual_seed(seed)
    rows = []
    for shapes in _step_models(sizes):
        grads = [torch.randn(s, generator=gen, device=dev) for s in shapes]
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

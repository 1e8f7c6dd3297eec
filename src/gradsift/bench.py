"""Benchmarks as ratios measured in one run: ours vs baselines on the same inputs.

Each entry is the median of ``repeats`` timed calls after one warm-up call. Ratios
are what to read; absolute times depend on the machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from gradsift.select import topk_indices

__all__ = ["median_ms", "bench_select"]


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def bench_select(sizes=(1_000_000, 11_700_000, 25_000_000), repeats: int = 7, seed: int = 0):
    """``topk_indices(x, k)`` vs ``torch.topk(x.abs(), k)`` vs one ``abs`` pass.

    For each N: k in {1000, 0.1% N, 1% N}, float32 normal data.
    """
    rows = []
    gen = torch.Generator().manual_seed(seed)
    for n in sizes:
        x = torch.randn(n, generator=gen)
        buf = torch.empty_like(x)
        abs_ms = median_ms(lambda: torch.abs(x, out=buf), repeats)  # noqa: B023
        for k in sorted({min(1000, n), max(1, n // 1000), max(1, n // 100)}):
            ours = median_ms(lambda: topk_indices(x, k), repeats)  # noqa: B023
            base = median_ms(lambda: torch.topk(x.abs(), k), repeats)  # noqa: B023
            rows.append(
                {
                    "n": n,
                    "k": k,
                    "ours_ms": ours,
                    "torch_topk_ms": base,
                    "abs_pass_ms": abs_ms,
                    "speedup_vs_topk": base / ours,
                    "ours_over_abs_pass": ours / abs_ms,
                }
            )
    return rows


def resnet18_shapes() -> list[tuple[int, ...]]:
    """Parameter shapes of torchvision's ResNet-18 (ImageNet head): 62 tensors, 11.69M."""
    shapes: list[tuple[int, ...]] = [(64, 3, 7, 7), (64,), (64,)]
    cin = 64
    for cout, down in ((64, False), (128, True), (256, True), (512, True)):
        for b in range(2):
            c0 = cin if b == 0 else cout
            shapes += [(cout, c0, 3, 3), (cout,), (cout,), (cout, cout, 3, 3), (cout,), (cout,)]
            if b == 0 and down:
                shapes += [(cout, c0, 1, 1), (cout,), (cout,)]
        cin = cout
    return shapes + [(1000, 512), (1000,)]


def _naive_topk_step(params, sgd, k):
    """What research code does: cat every grad, torch.topk, build a mask, write back."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    idx = torch.topk(flat.abs(), k).indices
    mask = torch.zeros_like(flat)
    mask[idx] = 1.0
    offset = 0
    for p in params:
        p.grad.mul_(mask[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    sgd.step()


def interleaved_ms(cases: dict, repeats: int) -> dict[str, list[float]]:
    """Times in ms of each ``(setup, fn)`` in ``cases``, ``repeats`` rounds.

    Every round runs each case once (``setup()`` untimed before it), so drift in the
    machine's speed hits all cases alike; one warm-up call each first.
    """
    for setup, fn in cases.values():
        setup()
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (setup, fn) in cases.items():
            setup()
            start = time.perf_counter()
            fn()
            times[name].append(1e3 * (time.perf_counter() - start))
    return times


def _ratio(num: list[float], den: list[float]) -> float:
    """Median over rounds of the per-round ratio (robust to drift between rounds)."""
    return statistics.median(a / b for a, b in zip(num, den))


def bench_step(densities=(0.001, 0.01), repeats: int = 15, seed: int = 0):
    """``TopK(SGD)`` + EF step vs dense ``SGD(foreach=True)`` vs the naive method.

    The three run interleaved (``interleaved_ms``); times are medians, ratios are
    medians of the per-round ratios.
    """
    from gradsift.optim import TopK, resolve_k

    gen = torch.Generator().manual_seed(seed)
    shapes = resnet18_shapes()
    grads = [torch.randn(s, generator=gen) for s in shapes]

    def fresh():
        ps = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        return ps

    def refill(ps):
        def setup():
            for p, g in zip(ps, grads):
                p.grad.copy_(g)  # in place: keeps TopK's flat-buffer views

        return setup

    n = sum(g.numel() for g in grads)
    param_bytes = sum(g.numel() * g.element_size() for g in grads)
    dense_ps = fresh()
    dense = torch.optim.SGD(dense_ps, lr=1e-3, foreach=True)
    rows = []
    for density in densities:
        k = resolve_k(n, density=density)
        ps, naive_ps = fresh(), fresh()
        opt = TopK(torch.optim.SGD(ps, lr=1e-3, foreach=True), density=density)
        sgd = torch.optim.SGD(naive_ps, lr=1e-3, foreach=True)
        t = interleaved_ms(
            {
                "ours": (refill(ps), opt.step),
                "dense": (refill(dense_ps), dense.step),
                "naive": (refill(naive_ps), partial(_naive_topk_step, naive_ps, sgd, k)),
            },
            repeats,
        )
        held = sum(b.residual.numel() * b.residual.element_size() for b in opt._buckets)
        keys = sum(t.numel() * t.element_size() for t in opt._keys)
        if opt._scratch is not None:
            keys += opt._scratch.numel() * opt._scratch.element_size()
        rows.append(
            {
                "n": n,
                "tensors": len(shapes),
                "density": density,
                "k": k,
                "topk_ef_ms": statistics.median(t["ours"]),
                "dense_sgd_ms": statistics.median(t["dense"]),
                "naive_ms": statistics.median(t["naive"]),
                "ours_over_dense": _ratio(t["ours"], t["dense"]),
                "naive_over_ours": _ratio(t["naive"], t["ours"]),
                "residual_bytes": held,
                "other_extra_bytes": keys,
                "other_extra_over_param_bytes": keys / param_bytes,
            }
        )
    return rows


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> int:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux); return it in bytes."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return 1024 * _status_kib("VmRSS")


def _peak_rss() -> int:
    return 1024 * _status_kib("VmHWM")


def _grasp_inputs(model_name: str, samples_per_class: int):
    from gradsift.models import build_model

    torch.manual_seed(0)
    classes = 10
    model = build_model(model_name, input_shape=(3, 32, 32), num_classes=classes)
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(classes).repeat_interleave(samples_per_class)
    x = torch.randn(classes * samples_per_class, 3, 32, 32, generator=gen)
    return model, x, y


def _grasp_call(which: str, model, x, y, chunk_size: int, keep_graphs: bool = False):
    from gradsift.pruning import score
    from gradsift.reference import reference_grasp

    if which == "ours":
        per_class = y.numel() // int(y.max() + 1)
        return lambda: score(
            model,
            "grasp",
            [(x, y)],
            samples_per_class=per_class,
            chunk_size=chunk_size,
            keep_graphs=keep_graphs,
        )
    return lambda: reference_grasp(model, x, y)


def _peak_job(which: str, model_name: str, samples_per_class: int, chunk, keep, queue):
    """One GraSP scoring in a fresh process: report its peak RSS growth in bytes."""
    model, x, y = _grasp_inputs(model_name, samples_per_class)
    run = _grasp_call(which, model, x, y, chunk, keep)
    before = _reset_peak_rss()
    run()
    queue.put(_peak_rss() - before)


def bench_score(model: str = "resnet20", samples_per_class: int = 25, repeats: int = 3):
    """Our GraSP vs the reference transcription: median time and peak memory growth.

    Time: in this process, one warm-up call each, then ``repeats`` rounds that run
    every configuration once (interleaved, so machine noise hits all alike); median.
    Memory: each configuration once in a fresh spawned process, as the growth of the
    kernel's peak-RSS mark (reset just before scoring, Linux ``clear_refs``).
    Ours runs with its default chunk size (64), with half the sample (as the
    reference does), and with ``keep_graphs=True`` (no recomputation, more memory).
    Time ratios are medians of per-round ratios.
    """
    import multiprocessing as mp

    n = 10 * samples_per_class
    configs = [  # (method, chunk_size, keep_graphs)
        ("reference", n // 2, False),
        ("ours", 64, False),
        ("ours", (n + 1) // 2, False),
        ("ours", 64, True),
    ]
    net, x, y = _grasp_inputs(model, samples_per_class)
    cases = {c: (lambda: None, _grasp_call(c[0], net, x, y, c[1], c[2])) for c in configs}
    times = interleaved_ms(cases, repeats)
    ctx = mp.get_context("spawn")
    peaks = {}
    for config in configs:
        queue = ctx.Queue()
        proc = ctx.Process(
            target=_peak_job, args=(config[0], model, samples_per_class, *config[1:], queue)
        )
        proc.start()
        peaks[config] = queue.get(timeout=600)
        proc.join()
    ref = configs[0]
    return [
        {
            "method": which,
            "model": model,
            "samples": n,
            "chunk_size": chunk,
            "keep_graphs": keep,
            "seconds": statistics.median(times[(which, chunk, keep)]) / 1e3,
            "peak_bytes": peaks[(which, chunk, keep)],
            "time_over_reference": _ratio(times[(which, chunk, keep)], times[ref]),
            "memory_over_reference": peaks[(which, chunk, keep)] / peaks[ref],
        }
        for which, chunk, keep in configs
    ]


def _ddp_job(rank: int, world: int, port: int, densities, steps: int, batch: int, queue):
    """One rank of ``bench_ddp``: ResNet-20 steps with allreduce, then with the hook."""
    import os
    from datetime import timedelta

    import torch.distributed as dist
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.parallel import DistributedDataParallel

    from gradsift.distributed import TopKHookState, topk_hook
    from gradsift.models import build_model

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    torch.set_num_threads(1)  # two processes share the machine's cores
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (batch,), generator=gen)
    rows = []
    for density in [None, *densities]:
        torch.manual_seed(0)
        ddp = DistributedDataParallel(build_model("resnet20"))
        state = None
        if density is not None:
            state = TopKHookState(density=density)
            ddp.register_comm_hook(state, topk_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        times = []
        for step in range(steps):
            dist.barrier()
            start = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            times.append(time.perf_counter() - start)
            if state is not None and step == 2:  # past warm-up: count compressed steps only
                state.bytes_sent = state.bytes_dense = 0
        rows.append(
            {
                "density": density,
                "step_ms": 1e3 * statistics.median(times[3:]),
                "bytes_sent_per_step": state.bytes_sent / (steps - 3) if state else None,
                "bytes_dense_per_step": state.bytes_dense / (steps - 3) if state else None,
            }
        )
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def bench_ddp(densities=(0.01, 0.001), steps: int = 13, batch: int = 32):
    """2 gloo processes, ResNet-20: step time and bytes per step, hook vs allreduce."""
    import multiprocessing as mp

    from gradsift.ddp_train import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_ddp_job, args=(r, 2, port, densities, steps, batch, queue))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    rows = queue.get(timeout=900)
    for p in procs:
        p.join()
    base = rows[0]["step_ms"]
    for r in rows:
        r["time_over_allreduce"] = r["step_ms"] / base
        if r["bytes_sent_per_step"]:
            r["compression"] = r["bytes_dense_per_step"] / r["bytes_sent_per_step"]
    return rows

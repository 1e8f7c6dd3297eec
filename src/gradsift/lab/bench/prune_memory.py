"""``gradsift bench prune-memory``: time and extra peak memory of pruning a large model
with each method, against ``torch.nn.utils.prune.global_unstructured(L1Unstructured)``.

The model is an MLP of four ``Linear(4096, 4096)`` layers (67M weights) on the CPU.
Each case runs in a fresh process (``spawn``), so that one case's freed memory, kept by
the allocator, does not hide the next one's: the process builds the model and its
batch, resets the kernel's peak-RSS mark (``gradsift.lab.bench.memory``), prunes, and
reports the peak and the retained resident memory above the mark, in multiples of
the model's parameter bytes, and the wall time. On a GPU (``device="cuda"``) the
memory is ``torch.cuda.max_memory_allocated`` above what was allocated before.

The masks that ``torch.nn.utils.prune`` installs are float tensors shaped like the
weights, and it keeps the masked ``weight`` beside ``weight_orig``: every case retains
about 2x the parameter bytes, whoever computes the masks. ``extra peak`` includes that;
``before install`` is the peak up to the first installation of masks
(``gradsift.pruning.at_init.apply_masks_``): what scoring and selecting cost (for the
anchor, which computes and installs in one call, it is the whole peak).
"""

from __future__ import annotations

import multiprocessing
import statistics
import time

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.utils import prune

from gradsift.lab.bench.memory import peak_rss, reset_peak_rss
from gradsift.lab.tables import columns

__all__ = ["bench_prune_memory", "COLUMNS", "measure"]

COLUMNS = columns(
    """
    case                case                 s
    iterations          iterations           d
    seconds             s                    .2f
    over_anchor         time/anchor          .2f
    extra_peak          extra peak (x params)  .2f
    masks_peak          before install (x params)  .2f
    retained            retained (x params)  .2f
    """
)

ANCHOR = "torch global_unstructured L1"
CASES = (ANCHOR, "magnitude", "snip", "synflow", "random", "grasp")
_ITERATIONS = {"synflow": 10}  # as the issue sets it: 10 SynFlow rounds


def _model(width: int, depth: int, device: str) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).to(device)


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return 1024 * int(line.split()[1])
    raise RuntimeError("VmRSS not in /proc/self/status")


def measure(case: str, width: int, depth: int, sparsity: float, device: str) -> dict:
    """One case in this process: seconds, extra peak and retained memory (bytes)."""
    from gradsift import prune_at_init
    from gradsift.pruning import supported_options

    torch.set_num_threads(max(1, torch.get_num_threads()))
    model = _model(width, depth, device)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(64, width, generator=gen).to(device), (torch.arange(64) % 10).to(device))]
    weights = [m for m in model.modules() if isinstance(m, nn.Linear)]
    param_bytes = sum(m.weight.numel() * m.weight.element_size() for m in weights)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = reset_peak_rss()
    probe = _probe_installation(device)
    start = time.perf_counter()
    if case == ANCHOR:
        prune.global_unstructured(
            [(m, "weight") for m in weights], pruning_method=prune.L1Unstructured, amount=sparsity
        )
    else:
        options = supported_options(
            case, num_classes=10, samples_per_class=2, chunk_size=10, input_shape=(width,)
        )
        prune_at_init(model, case, sparsity, data, iterations=_ITERATIONS.get(case, 1), **options)
        F.cross_entropy(model(data[0][0]), data[0][1])  # the pruned model runs
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if device == "cuda":
        peak, now = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    else:
        peak, now = peak_rss(), _rss()
    return {
        "seconds": seconds,
        "extra_peak": (peak - before) / param_bytes,
        "masks_peak": (probe.get("peak", peak) - before) / param_bytes,
        "retained": (now - before) / param_bytes,
        "param_bytes": param_bytes,
    }


def _probe_installation(device: str) -> dict:
    """Record the peak memory when masks are first installed (this process only: the
    case runs in a process of its own)."""
    from gradsift.pruning import at_init

    seen: dict = {}
    install = at_init.apply_masks_

    def probed(*args, **kwargs):
        if "peak" not in seen:
            seen["peak"] = torch.cuda.max_memory_allocated() if device == "cuda" else peak_rss()
        return install(*args, **kwargs)

    at_init.apply_masks_ = probed
    return seen


def bench_prune_memory(
    repeats: int = 1,
    *,
    cases=CASES,
    width: int = 4096,
    depth: int = 4,
    sparsity: float = 0.9,
    device: str = "cpu",
) -> list[dict]:
    """Each case ``repeats`` times, each time in a fresh process, interleaved; the
    median time and the largest peak; ``time/anchor`` the median of per-round ratios."""
    ctx = multiprocessing.get_context("spawn")
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    for _ in range(repeats):
        for case in cases:
            with ctx.Pool(1) as pool:
                runs[case].append(pool.apply(measure, (case, width, depth, sparsity, device)))
    rows = []
    for case in cases:
        row = {
            "case": case,
            "iterations": _ITERATIONS.get(case, 1),
            "seconds": statistics.median(r["seconds"] for r in runs[case]),
            "extra_peak": max(r["extra_peak"] for r in runs[case]),
            "masks_peak": max(r["masks_peak"] for r in runs[case]),
            "retained": max(r["retained"] for r in runs[case]),
            "param_bytes": runs[case][0]["param_bytes"],
        }
        if ANCHOR in runs:
            row["over_anchor"] = statistics.median(
                r["seconds"] / a["seconds"] for r, a in zip(runs[case], runs[ANCHOR])
            )
        rows.append(row)
    return rows

"""``gradsift bench prune-memory``: time and extra peak memory of pruning a large model
with each method, against ``torch.nn.utils.prune.global_unstructured(L1Unstructured)``.

The network (``gradsift.lab.bench.prune_networks``) is an MLP of four
``Linear(4096, 4096)`` layers (67M weights), or with ``network="gpt2"`` a GPT-2 of
GPT-2-XL's shape from a config (for a GPU), where the yardstick is also one of its own
training steps (``training step (SGD)``: forward, backward and an SGD step). Each case
runs in a fresh process (``spawn``), so that one case's freed memory, kept by the
allocator, does not hide the next one's: the process builds the model and its batch,
resets the kernel's peak-RSS mark (``gradsift.lab.bench.memory``), prunes, and reports
the peak and the retained resident memory above the mark, in multiples of the bytes
of the weights a pruning selects, and the wall time. On a GPU (``device="cuda"``) the
memory is ``torch.cuda.max_memory_allocated`` above what was allocated before. A
method that refuses the network (SynFlow and GraSP on token ids) gets NaN and its
message.

``torch.nn.utils.prune``'s own masks are float tensors shaped like the weights, kept
beside the masked ``weight`` and ``weight_orig`` (the anchor retains about 3x); gradsift
installs boolean masks (``gradsift.pruning.boolean_mask``): 1.25x. ``extra peak``
includes what is installed; RSS also counts freed heap that glibc keeps (a few tens of
MB; run with ``MALLOC_MMAP_THRESHOLD_=131072`` to see live bytes only);
``before install`` is the peak up to the first installation of masks
(``gradsift.pruning.at_init.install_masks_``): what scoring and selecting cost (for the
anchor, which computes and installs in one call, it is the whole peak).
"""

from __future__ import annotations

import math
import statistics
import time

import torch
from torch.nn.utils import prune

from gradsift.lab.bench.fresh_process import in_fresh_process
from gradsift.lab.bench.memory import peak_and_current_rss, peak_rss, reset_peak_rss
from gradsift.lab.bench.prune_networks import NETWORKS, build
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
    note                note                 s
    """
)

ANCHOR = "torch global_unstructured L1"
TRAIN_STEP = "training step (SGD)"
CASES = (ANCHOR, "magnitude", "snip", "synflow", "random", "grasp")
TRANSFORMER_CASES = (ANCHOR, "magnitude", "random", "snip", "synflow", "grasp", TRAIN_STEP)


def iterations(case: str, network: str) -> int:
    """SynFlow's rounds: the issue's 10 on the MLP, its paper's 100 on a transformer."""
    return {"mlp": 10, "gpt2": 100}[network] if case == "synflow" else 1


def measure(
    case: str, width: int, depth: int, sparsity: float, device: str, network: str = "mlp"
) -> dict:
    """One case in this process: seconds, extra peak and retained memory (bytes); a
    method that refuses the network gets NaN and its message."""
    from gradsift import prune_at_init
    from gradsift.pruning import supported_options
    from gradsift.pruning.params import original, prunable

    torch.set_num_threads(max(1, torch.get_num_threads()))
    work = build(network, width, depth, device)
    targets = prunable(work.model, warn=False)
    param_bytes = sum(original(m, a).numel() * original(m, a).element_size()
                      for m, a in targets.values())  # fmt: skip
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = reset_peak_rss()
    probe = _probe_installation(device)
    start, note = time.perf_counter(), ""
    try:
        if case == ANCHOR:
            pairs = list(targets.values())
            prune.global_unstructured(pairs, pruning_method=prune.L1Unstructured, amount=sparsity)
        elif case == TRAIN_STEP:
            opt = torch.optim.SGD(work.model.parameters(), lr=1e-3)
            work.loss().backward()
            opt.step()
        else:
            options = supported_options(
                case, num_classes=10, samples_per_class=2, chunk_size=10,
                input_shape=work.input_shape, loss_fn=work.loss_fn,
            )  # fmt: skip
            prune_at_init(
                work.model, case, sparsity, work.data, iterations=iterations(case, network),
                **options,
            )  # fmt: skip
            work.loss()  # the pruned model runs
    except (ValueError, TypeError) as error:  # the method refuses this network
        note = str(error).split(";")[0][:120]
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start if not note else math.nan
    if device == "cuda":
        peak, now = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
    else:
        peak, now = peak_and_current_rss()
    return {
        "seconds": seconds,
        "extra_peak": (peak - before) / param_bytes,
        "masks_peak": (probe.get("peak", peak) - before) / param_bytes,
        "retained": (now - before) / param_bytes,
        "param_bytes": param_bytes,
        "note": note,
    }


def _probe_installation(device: str) -> dict:
    """Record the peak memory when masks are first installed (this process only: the
    case runs in a process of its own)."""
    from gradsift.pruning import at_init

    seen: dict = {}
    install = at_init.install_masks_

    def probed(*args, **kwargs):
        if "peak" not in seen:
            seen["peak"] = torch.cuda.max_memory_allocated() if device == "cuda" else peak_rss()
        return install(*args, **kwargs)

    at_init.install_masks_ = probed
    return seen


def bench_prune_memory(
    repeats: int = 1,
    *,
    cases=None,
    network: str = "mlp",
    width: int | None = None,
    depth: int | None = None,
    sparsity: float = 0.9,
    device: str = "cpu",
) -> list[dict]:
    """Each case ``repeats`` times, each time in a fresh process, interleaved; the
    median time and the largest peak; ``time/anchor`` the median of per-round ratios.
    ``cases`` default to ``CASES`` (MLP) or ``TRANSFORMER_CASES``; ``width`` and
    ``depth`` to the network's (``prune_networks.NETWORKS``)."""
    if network not in NETWORKS:
        raise ValueError(f"network must be one of {sorted(NETWORKS)}, got {network!r}")
    cases = cases or (CASES if network == "mlp" else TRANSFORMER_CASES)
    width, depth = width or NETWORKS[network][0], depth or NETWORKS[network][1]
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    for _ in range(repeats):
        for case in cases:
            args = (case, width, depth, sparsity, device, network)
            runs[case].append(in_fresh_process(measure, *args))
    return [_row(case, runs, network) for case in cases]


def _row(case: str, runs: dict, network: str) -> dict:
    mine = runs[case]
    row = {
        "case": case,
        "iterations": iterations(case, network) if case not in (ANCHOR, TRAIN_STEP) else 1,
        "seconds": statistics.median(r["seconds"] for r in mine),
        "extra_peak": max(r["extra_peak"] for r in mine),
        "masks_peak": max(r["masks_peak"] for r in mine),
        "retained": max(r["retained"] for r in mine),
        "param_bytes": mine[0]["param_bytes"],
        "note": mine[0]["note"],
    }
    if ANCHOR in runs:
        row["over_anchor"] = statistics.median(
            r["seconds"] / a["seconds"] for r, a in zip(mine, runs[ANCHOR])
        )
    return row

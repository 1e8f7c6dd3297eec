"""``gradsift bench score``: our GraSP vs a transcription of the authors' algorithm,
median time (interleaved rounds in this process) and peak memory (each configuration
once in a fresh spawned process, as the growth of the kernel's peak-RSS mark)."""

from __future__ import annotations

import statistics
import warnings

import torch

from gradsift import score
from gradsift.lab.baselines import reference_grasp
from gradsift.lab.bench.fresh_process import in_fresh_process
from gradsift.lab.bench.memory import peak_rss, reset_peak_rss
from gradsift.lab.bench.timing import interleaved_ms, ratio
from gradsift.lab.models import build_model
from gradsift.lab.tables import Column

__all__ = ["bench_score", "COLUMNS"]

COLUMNS = [
    Column("method", "GraSP", "s"),
    Column("model", "model", "s"),
    Column("samples", "samples", "d"),
    Column(lambda r: "halves" if r["chunk_size"] is None else r["chunk_size"], "chunk"),
    Column(lambda r: "yes" if r["keep_graphs"] else "", "keep_graphs"),
    Column("seconds", "seconds", ".2f"),
    Column(lambda r: r["peak_bytes"] / 2**20, "peak MiB", ".0f"),
    Column("time_over_reference", "time/ref", ".2f"),
    Column("memory_over_reference", "mem/ref", ".2f"),
]


def _inputs(model_name: str, samples_per_class: int, input_shape):
    torch.manual_seed(0)
    classes = 10
    model = build_model(model_name, input_shape=input_shape, num_classes=classes)
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(classes).repeat_interleave(samples_per_class)
    x = torch.randn(classes * samples_per_class, *input_shape, generator=gen)
    return model, x, y


def _call(which: str, model, x, y, chunk_size: int | None, keep_graphs: bool):
    if which == "ours":
        per_class = y.numel() // int(y.max() + 1)

        def run():
            with warnings.catch_warnings():  # chunks of 64 change BatchNorm statistics
                warnings.simplefilter("ignore", UserWarning)
                return score(
                    model,
                    "grasp",
                    [(x, y)],
                    samples_per_class=per_class,
                    chunk_size=chunk_size,
                    keep_graphs=keep_graphs,
                )

        return run
    return lambda: reference_grasp(model, x, y)


def _peak_job(config, model_name, samples_per_class, input_shape) -> int:
    """One GraSP scoring (run in a fresh process): its peak RSS growth in bytes."""
    which, chunk, keep = config
    run = _call(which, *_inputs(model_name, samples_per_class, input_shape), chunk, keep)
    before = reset_peak_rss()
    run()
    return peak_rss() - before


def _peaks(configs, model, samples_per_class, input_shape) -> dict:
    return {
        config: in_fresh_process(_peak_job, config, model, samples_per_class, input_shape)
        for config in configs
    }


def bench_score(
    model: str = "resnet20", samples_per_class: int = 25, repeats: int = 3, input_shape=(3, 32, 32)
) -> list[dict]:
    """Ours by default (the reference's two halves), with ``keep_graphs=True``, and in
    chunks of 64 (less memory, but other BatchNorm statistics: different scores),
    against the reference; time ratios are medians of per-round ratios."""
    n = 10 * samples_per_class
    configs = [  # (which, chunk_size, keep_graphs)
        ("reference", n // 2, False),
        ("ours", None, False),
        ("ours", None, True),
        ("ours", 64, False),
    ]
    net, x, y = _inputs(model, samples_per_class, input_shape)
    cases = {c: (lambda: None, _call(c[0], net, x, y, c[1], c[2])) for c in configs}
    times = interleaved_ms(cases, repeats)
    peaks = _peaks(configs, model, samples_per_class, tuple(input_shape))
    ref = configs[0]
    return [
        {
            "method": c[0],
            "model": model,
            "samples": n,
            "chunk_size": c[1],
            "keep_graphs": c[2],
            "seconds": statistics.median(times[c]) / 1e3,
            "peak_bytes": peaks[c],
            "time_over_reference": ratio(times[c], times[ref]),
            "memory_over_reference": peaks[c] / peaks[ref],
        }
        for c in configs
    ]

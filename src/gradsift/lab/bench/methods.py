"""``gradsift bench methods``: each pruning criterion (all of ``list_methods()``, with
its paper's rounds) on ResNet-20 with CIFAR shapes, against the dense training step it
precedes, as a ratio measured in one run (interleaved rounds).

A method is timed as a user runs it: ``prune_at_init`` on a fresh copy of the same
initial model (the copy untimed), with the synthetic batches a run would read; the
dense step is one SGD step (forward, backward, update) on a batch of the same size.
"""

from __future__ import annotations

import copy
import math
import statistics

import torch
import torch.nn.functional as F  # noqa: N812

from gradsift import list_methods, prune_at_init
from gradsift.lab.bench.timing import interleaved_ms, ratio
from gradsift.lab.models import build_model
from gradsift.lab.tables import columns
from gradsift.pruning import get_method, supported_options

__all__ = ["bench_methods", "COLUMNS"]

COLUMNS = columns(
    """
    method              method           s
    iterations          iterations       d
    own_schedule        own schedule     s
    method_ms           method ms        .1f
    step_ms             dense step ms    .1f
    method_over_step    method/step      .1f
    """
)

_CLASSES = 10
_STEP = "dense step"


def _batches(batch_size: int, input_shape, count: int) -> list:
    """Gaussian inputs, labels cycling through the classes across batches."""
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(batch_size * count) % _CLASSES
    return [
        (torch.randn(batch_size, *input_shape, generator=gen), y) for y in labels.split(batch_size)
    ]


def _dense_step(model, batch):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()

    def step():
        opt.zero_grad()
        F.cross_entropy(model(batch[0]), batch[1]).backward()
        opt.step()

    return step


def _pruning(base, method, sparsity, data, iterations, options):
    """``(setup, run)``: a fresh copy of ``base`` (untimed), then the pruning."""
    work = {}

    def setup():
        work["model"] = copy.deepcopy(base)

    def run():
        prune_at_init(work["model"], method, sparsity, data, iterations=iterations, **options)

    return setup, run


def bench_methods(
    repeats: int = 3,
    *,
    model: str = "resnet20",
    input_shape=(3, 32, 32),
    batch_size: int = 128,
    sparsity: float = 0.9,
    methods=None,
    iterations: int | None = None,
) -> list[dict]:
    """Median ms of each method and of the dense step; ratios are medians of the
    per-round ratios. ``iterations``: rounds for every method (default: each one's
    ``paper_iterations``); enough batches for GraSP's 25 samples per class."""
    torch.manual_seed(0)
    base = build_model(model, input_shape=input_shape, num_classes=_CLASSES)
    data = _batches(batch_size, input_shape, max(2, math.ceil(25 * _CLASSES / batch_size)))
    methods = list(methods or list_methods())
    rounds = {m: iterations or get_method(m).paper_iterations for m in methods}
    cases = {_STEP: (lambda: None, _dense_step(copy.deepcopy(base), data[0]))}
    for m in methods:
        options = supported_options(m, num_classes=_CLASSES, input_shape=input_shape, seed=0)
        cases[m] = _pruning(base, m, sparsity, data, rounds[m], options)
    times = interleaved_ms(cases, repeats)
    step_ms = statistics.median(times[_STEP])
    return [
        {
            "method": m,
            "model": model,
            "batch_size": batch_size,
            "iterations": rounds[m],
            "own_schedule": "yes" if get_method(m).takes_sparsity else "",
            "method_ms": statistics.median(times[m]),
            "step_ms": step_ms,
            "method_over_step": ratio(times[m], times[_STEP]),
        }
        for m in methods
    ]

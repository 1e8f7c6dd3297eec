"""Reading batches for the data-driven criteria: device placement, a bounded number of
batches, one-pass iterators read once, how batches are weighted, and GraSP's
class-balanced sample. What a batch may hold: ``gradsift.pruning.inputs``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from gradsift.checks import check_choice, check_int
from gradsift.pruning.inputs import index, join, split, to_device

__all__ = [
    "BATCH_WEIGHTINGS",
    "batch_weight",
    "batches",
    "class_balanced_sample",
    "need_data",
    "replayable",
    "UNSIZED_SEARCH_BATCHES",
]

BATCH_WEIGHTINGS = ("size", "batch")

# how many batches of an iterator without ``len`` the class search reads at most
UNSIZED_SEARCH_BATCHES = 1000


def need_data(data, method: str) -> None:
    if data is None:
        raise ValueError(f"method {method!r} needs data= (an iterable of (inputs, targets))")


def batch_weight(num_samples: int, batch_weighting: str) -> float:
    """The unnormalised weight of one batch's mean loss in a loss over several.

    ``"size"``: its number of samples, so that the combination, divided by the total
    weight, is the mean over all samples, whatever the batching. ``"batch"``: 1, every
    batch's mean counts the same, as the Synaptic-Flow repository (and the GraSP
    repository with its two halves) sums them.
    """
    check_choice("batch_weighting", batch_weighting, BATCH_WEIGHTINGS)
    return float(num_samples) if batch_weighting == "size" else 1.0


class _Replay:
    """A one-pass iterator read once: what it yielded is kept and yielded again by every
    later pass, which then continues with the iterator where it stopped."""

    def __init__(self, source: Iterator):
        self._source = source
        self._seen: list = []

    def __iter__(self):
        i = 0
        while True:
            if i == len(self._seen):
                try:
                    self._seen.append(next(self._source))
                except StopIteration:
                    return
            yield self._seen[i]
            i += 1


def replayable(data):
    """``data`` itself if it can be iterated again (a list, a DataLoader); a one-pass
    iterator (a generator) wrapped so that every pass sees the same batches (those
    already read are kept in memory)."""
    if data is None or isinstance(data, _Replay) or iter(data) is not data:
        return data
    return _Replay(data)


def batches(data: Iterable, device, limit: int | None, split_batch=None) -> Iterator:
    """``(inputs, targets)`` from ``data`` on ``device``, at most ``limit`` (None: all;
    a criterion's ``num_batches``)."""
    if limit is not None:
        check_int("num_batches", limit, minimum=1)
    for i, batch in enumerate(data):
        if limit is not None and i >= limit:
            return
        x, y = split(batch, split_batch)
        yield to_device(x, device), to_device(y, device)


def class_balanced_sample(
    data: Iterable,
    samples_per_class: int,
    num_classes: int,
    device=None,
    *,
    split_batch=None,
    max_batches: int | None = None,
):
    """``samples_per_class`` examples of each class, in class order, from one pass.

    Targets are class indices, one per sample. Stops as soon as every class is full,
    after ``max_batches`` batches (None: the whole of data with a ``len``, at most
    ``UNSIZED_SEARCH_BATCHES`` of an iterator without one, which may never end), or
    at the end of the data; then raises ``ValueError`` naming the classes it does not
    hold enough of (never loops forever).
    """
    samples_per_class = check_int("samples_per_class", samples_per_class, minimum=1)
    if max_batches is None and not hasattr(data, "__len__"):
        max_batches = UNSIZED_SEARCH_BATCHES
    if max_batches is not None:
        max_batches = check_int("max_batches", max_batches, minimum=1)
    xs: list[list] = [[] for _ in range(num_classes)]
    have = [0] * num_classes
    read = 0
    for batch in data:
        x, y = split(batch, split_batch)
        read += 1
        for c in range(num_classes):
            need = samples_per_class - have[c]
            if need > 0:
                idx = torch.nonzero(y == c).flatten()[:need]
                if idx.numel():
                    xs[c].append(index(x, idx))
                    have[c] += idx.numel()
        if min(have) >= samples_per_class or read == max_batches:
            break
    _check_full(have, samples_per_class, read, max_batches)
    x = join([join(parts) for parts in xs])
    x = to_device(x, device)
    y = torch.arange(num_classes, device=device).repeat_interleave(samples_per_class)
    return x, y


def _check_full(have: list, samples_per_class: int, read: int, max_batches) -> None:
    short = [c for c in range(len(have)) if have[c] < samples_per_class]
    if not short:
        return
    bound = (
        f"; raise max_batches (it stopped the search at {max_batches})"
        if read == max_batches
        else ""
    )
    raise ValueError(
        f"data has fewer than samples_per_class={samples_per_class} examples of "
        f"classes {short} (found {[have[c] for c in short]}) in {read} batches; lower "
        f"samples_per_class or pass num_classes{bound}"
    )

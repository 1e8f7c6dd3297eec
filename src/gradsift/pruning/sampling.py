"""Reading batches for the data-driven criteria: device placement, a bounded number of
batches, and GraSP's class-balanced sample."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from gradsift.checks import check_int

__all__ = ["batches", "class_balanced_sample", "need_data"]


def need_data(data, method: str) -> None:
    if data is None:
        raise ValueError(f"method {method!r} needs data= (an iterable of (inputs, targets))")


def batches(data: Iterable, device, limit: int | None) -> Iterator:
    """``(x, y)`` from ``data`` on ``device``, at most ``limit`` of them (None: all)."""
    for i, (x, y) in enumerate(data):
        if limit is not None and i >= limit:
            return
        yield x.to(device), y.to(device)


def class_balanced_sample(
    data: Iterable, samples_per_class: int, num_classes: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples_per_class`` examples of each class, in class order, from one pass.

    Stops as soon as every class is full. Raises ``ValueError`` naming the classes
    that the data does not hold enough of (never loops forever).
    """
    samples_per_class = check_int("samples_per_class", samples_per_class, minimum=1)
    xs: list[list[torch.Tensor]] = [[] for _ in range(num_classes)]
    have = [0] * num_classes
    for x, y in data:
        for c in range(num_classes):
            need = samples_per_class - have[c]
            if need > 0:
                idx = torch.nonzero(y == c).flatten()[:need]
                if idx.numel():
                    xs[c].append(x[idx])
                    have[c] += idx.numel()
        if min(have) >= samples_per_class:
            break
    short = [c for c in range(num_classes) if have[c] < samples_per_class]
    if short:
        raise ValueError(
            f"data has fewer than samples_per_class={samples_per_class} examples of "
            f"classes {short} (found {[have[c] for c in short]}); lower samples_per_class "
            "or pass num_classes"
        )
    x = torch.cat([torch.cat(parts) for parts in xs])
    y = torch.arange(num_classes).repeat_interleave(samples_per_class)
    return x.to(device), y.to(device)

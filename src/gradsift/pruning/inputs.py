"""What a batch may hold, and how the data-driven criteria call the model on it.

A batch is an ``(inputs, targets)`` pair, or anything that ``split_batch(batch)``
turns into one (a Hugging Face style dict: ``split_batch=lambda b: ({k: v for k, v in
b.items() if k != "labels"}, b["labels"])``). ``inputs`` is a tensor (``model(x)``), a
tuple or list of positional arguments (``model(*x)``) or a mapping of keyword
arguments (``model(**x)``); every tensor in it has the batch as its first dimension.
``loss_fn(model_output, targets)`` turns the output, of any type, into a scalar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

__all__ = ["forward", "index", "join", "num_samples", "split", "to_device"]


def split(batch, split_batch: Callable | None = None):
    """``(inputs, targets)`` of one batch; a clear ``TypeError`` for anything else."""
    if split_batch is not None:
        batch = split_batch(batch)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    kind = type(batch).__name__
    size = f" of length {len(batch)}" if isinstance(batch, (tuple, list)) else ""
    raise TypeError(
        f"batches must be (inputs, targets) pairs, got a {kind}{size}; for other batches "
        "(a dict of tensors, say) pass split_batch= (batch -> (inputs, targets)), whose "
        "inputs may be a tensor, a tuple of positional or a dict of keyword arguments"
    )


def _map(fn, inputs):
    if isinstance(inputs, torch.Tensor):
        return fn(inputs)
    if isinstance(inputs, Mapping):
        return {k: _map(fn, v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return type(inputs)(_map(fn, v) for v in inputs)
    return inputs  # a flag or a size passed to the model as is


def to_device(inputs, device):
    """``inputs`` with every tensor in it moved to ``device``."""
    return _map(lambda t: t.to(device), inputs)


def index(inputs, idx):
    """The samples ``idx`` (indices or a slice along the first dimension)."""
    return _map(lambda t: t[idx], inputs)


def join(parts: list):
    """The samples of ``parts`` (inputs of the same structure) concatenated."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, Mapping):
        return {k: join([p[k] for p in parts]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(join([p[i] for p in parts]) for i in range(len(first)))
    return first


def forward(model: nn.Module, inputs):
    """``model`` called on ``inputs`` as the module docstring says."""
    if isinstance(inputs, Mapping):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def num_samples(targets) -> int:
    """A batch's number of samples: the first dimension of its targets."""
    if isinstance(targets, torch.Tensor) and targets.dim():
        return int(targets.shape[0])
    if isinstance(targets, torch.Tensor):
        return 1
    return len(targets)

"""What a batch may hold, and how the data-driven criteria call the model on it.

A batch is an ``(inputs, targets)`` pair, or anything that ``split_batch(batch)``
turns into one (a Hugging Face style dict: ``split_batch=lambda b: ({k: v for k, v in
b.items() if k != "labels"}, b["labels"])``). ``inputs`` is a tensor (``model(x)``), a
tuple or list of positional arguments (``model(*x)``) or a mapping of keyword
arguments (``model(**x)``); every tensor in it has the batch as its first dimension.
``loss_fn(model_output, targets)`` turns the output, of any type, into a scalar.

Every criterion reads its batches through ``gradsift.pruning.sampling.batches`` (which
calls ``split``) and calls the model through ``forward``, with its own parameters or,
for those that differentiate through substituted weights, with ``parameters=``
(``torch.func.functional_call``, tied weights tied). The data-free criteria (SynFlow,
NTK-SAP) make their own real-valued inputs and read only a shape from ``data``:
``real_inputs`` refuses, before any work, data whose inputs are not one floating
tensor (token ids, dicts), and ``refuse_token_ids`` stops an embedding from being fed
their real-valued inputs as ids.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

__all__ = [
    "arguments",
    "forward",
    "index",
    "join",
    "num_samples",
    "real_inputs",
    "refuse_token_ids",
    "split",
    "to_device",
]


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


def arguments(inputs) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of the call ``forward`` makes: ``model(**inputs)`` for a
    mapping, ``model(*inputs)`` for a tuple or list, ``model(inputs)`` otherwise."""
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def forward(model: nn.Module, inputs, parameters: dict | None = None):
    """``model`` called on ``inputs`` as the module docstring says; with
    ``parameters`` (``{name: tensor}``, any subset of the model's parameters) through
    ``torch.func.functional_call``, a tensor tied to others standing for all of them."""
    args, kwargs = arguments(inputs)
    if parameters is None:
        return model(*args, **kwargs)
    from torch.func import functional_call

    return functional_call(model, parameters, args, kwargs, tie_weights=True, strict=False)


def real_inputs(data, method: str, split_batch: Callable | None = None) -> torch.Tensor:
    """The inputs of ``data``'s first batch, for a data-free criterion that reads only
    their shape; a ``ValueError`` unless they are one floating tensor."""
    first = next(iter(data), None)
    if first is None:
        raise ValueError("data yielded no batches")
    x, _ = split(first, split_batch)
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x
    kind = f"a {x.dtype} tensor" if isinstance(x, torch.Tensor) else f"a {type(x).__name__}"
    raise ValueError(
        f"{method} is data-free: it feeds the network real-valued inputs of its own and "
        f"reads only their shape from data=, whose inputs must be one floating tensor; "
        f"got {kind} (pass input_shape= to give the shape itself). Models that take "
        "token ids or several inputs are not supported (score them with snip, grasp, "
        "force, iter_snip, prospr, magnitude or random)"
    )


def refuse_token_ids(model: nn.Module, method: str) -> list:
    """Make every embedding of ``model`` raise a ``ValueError`` when a data-free
    criterion's real-valued input reaches it as ids (an embedding fed ids made inside
    the model is left alone). Returns the hooks' handles: on the caller's own model
    (not a private copy) remove them when done."""
    return [
        module.register_forward_pre_hook(_RefuseReal(method, name, type(module).__name__))
        for name, module in model.named_modules()
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag))
    ]


class _RefuseReal:
    def __init__(self, method: str, name: str, kind: str):
        self.method, self.name, self.kind = method, name, kind

    def __call__(self, module, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
            raise ValueError(
                f"{self.method} feeds the network a real-valued input, and nn.{self.kind} "
                f"{self.name!r} received it as token ids; {self.method} is defined for "
                "networks whose input is real-valued, so models that take token ids are "
                "not supported (score them with snip, grasp, magnitude or random)"
            )


def num_samples(targets) -> int:
    """A batch's number of samples: the first dimension of its targets."""
    if isinstance(targets, torch.Tensor) and targets.dim():
        return int(targets.shape[0])
    if isinstance(targets, torch.Tensor):
        return 1
    return len(targets)

"""The gradient communications a data-parallel run can use, by name, for training
(``TrainConfig.comm``) and the DDP benchmark alike.

- ``allreduce``: DDP's own.
- ``fp16``: torch's ``fp16_compress_hook``.
- ``powersgd``: torch's PowerSGD (Vogels et al. 2019, arXiv:1905.13727), rank 4, its
  memories following DDP's bucket layouts (``gradsift.lab.powersgd``).
- ``topk``: gradsift's top-k hook, error feedback, float32 values.
- ``topk-dgc``: the Deep Gradient Compression recipe on top: momentum correction
  (the hook keeps the velocity and the inner SGD has none), DGC's four-epoch density
  warm-up, bfloat16 values in the compact wire format.
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gradsift.distributed import TopKHookState, dgc_warmup, topk_hook
from gradsift.lab.powersgd import PowerSGDRunState, powersgd_hook

__all__ = ["COMMS", "check_density", "dense_ratio", "make_hook"]

COMMS = ("allreduce", "fp16", "powersgd", "topk", "topk-dgc")


def check_density(comm: str | None, density) -> None:
    """The top-k communications need a density (``topk-dgc``'s warm-up ramps down to
    it), the dense ones take none. One check for ``make_hook`` and for the command
    line, which calls it before any rank starts."""
    if comm in ("topk", "topk-dgc") and density is None:
        raise ValueError(f"comm='{comm}' needs a density (the fraction of coordinates sent)")
    if comm in ("allreduce", "fp16", "powersgd") and density is not None:
        raise ValueError(f"comm='{comm}' sends dense gradients: a density is for topk, topk-dgc")


def dense_ratio(cfg, model) -> float:
    """Allreduce's bytes over the bytes sent, for a communication without a state that
    counts them: ``fp16`` sends 2 bytes per coordinate, the others every byte."""
    if cfg.comm != "fp16":
        return 1.0
    params = [p for p in model.parameters() if p.requires_grad]
    return sum(p.numel() * p.element_size() for p in params) / sum(2 * p.numel() for p in params)


def make_hook(
    comm: str,
    *,
    density=None,
    k=None,
    error_feedback=True,
    momentum: float = 0.0,
    iterations_per_epoch: int = 1,
    encoding: str = "auto",
    value_dtype=None,
    params=None,
):
    """``(state, hook, inner_momentum)`` for ``comm``; hook None means allreduce.
    ``params``: the model's parameters, which PowerSGD's memories follow when DDP
    lays its buckets out anew (``gradsift.lab.powersgd``)."""
    if comm == "allreduce":
        return None, None, momentum
    if comm == "fp16":
        return None, default_hooks.fp16_compress_hook, momentum
    if comm == "powersgd":
        state = PowerSGDRunState(
            None, matrix_approximation_rank=4, start_powerSGD_iter=2, params=params
        )
        return state, powersgd_hook, momentum
    if comm == "topk":
        state = TopKHookState(
            density=density,
            k=k,
            error_feedback=error_feedback,
            encoding=encoding,
            value_dtype=value_dtype,
        )
        return state, topk_hook, momentum
    if comm == "topk-dgc":
        check_density(comm, density)
        state = TopKHookState(
            density=density,
            value_dtype=torch.bfloat16,
            momentum_correction=momentum or None,
            warmup=dgc_warmup(density, iterations_per_epoch),
        )
        return state, topk_hook, 0.0
    raise ValueError(f"comm must be one of {list(COMMS)}, got {comm!r}")

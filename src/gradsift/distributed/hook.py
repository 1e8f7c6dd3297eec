"""Top-k gradient compression with error feedback as a DDP communication hook.

Deep Gradient Compression (Lin, Han, Mao, Wang & Dally, ICLR 2018, arXiv:1712.01887)
sends only the largest gradient coordinates and accumulates the rest locally. Per
DDP bucket ``b`` on each rank::

    a = g_b + r_b                      (error feedback: add what was held back)
    S = top_k(|a|)                     (gradsift.topk_indices, exact)
    r_b <- a with S zeroed             (what is kept for later; a = sent + r_b exactly)
    all-gather (S, a[S]) from every rank, scatter-add into zeros, divide by world size

Every rank decodes the same gathered lists, so every rank applies the same update.
The hook state follows ``powerSGD_hook.PowerSGDState``: ``__slots__``, and plain
allreduce for the first ``start_iter`` iterations, because DDP rebuilds its buckets
after the first one. Residuals are stored per parameter, keyed by the parameter's
``(bucket index, position)`` in DDP's *initial* bucket layout, which the first hook
calls see and which any fresh DDP of the same model reproduces. A residual keyed by
bucket index alone would be silently misaligned when a checkpoint is resumed: a new
DDP starts with the initial layout, whose buckets can hold the same parameters in
another order than the rebuilt ones the checkpoint was taken with.

When a bucket is so small that its sparse encoding (int64 index + value per
coordinate) would not be smaller than the dense tensor, it is allreduced densely.
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's return
# annotation against the real ``torch.futures.Future[torch.Tensor]`` object.
import logging

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gradsift.budget import Budget, HasBudget
from gradsift.checks import check_int
from gradsift.sparsify import sparsify_

__all__ = ["TopKHookState", "topk_hook", "compress_"]

log = logging.getLogger(__name__)

_INDEX_BYTES = 8  # int64 indices


class TopKHookState(HasBudget):
    """Hyper-parameters, residuals and traffic counters of ``topk_hook``.

    Args:
        density: fraction of each bucket's coordinates sent (or ``k`` per bucket).
        error_feedback: keep unsent mass in per-bucket residuals (default True).
        start_iter: iterations of plain allreduce before compressing (>= 2 with error
            feedback, since DDP rebuilds buckets after iteration 1).
        dense_if_larger: allreduce a bucket densely when sparse would not be smaller.
        process_group: the group to communicate in (default: the world).

    ``bytes_sent`` counts what this rank contributed (indices + values, or dense
    tensors), ``bytes_dense`` what plain allreduce would have contributed for the
    same buckets; ``compression_ratio`` is their quotient.
    """

    __slots__ = (
        "budget",
        "error_feedback",
        "start_iter",
        "dense_if_larger",
        "process_group",
        "iter",
        "residuals",
        "bytes_sent",
        "bytes_dense",
        "_keys",
    )

    def __init__(
        self,
        *,
        density: float | None = None,
        k: int | None = None,
        error_feedback: bool = True,
        start_iter: int = 2,
        dense_if_larger: bool = True,
        process_group=None,
    ) -> None:
        self.budget = Budget(k=k, density=density)
        start_iter = check_int("start_iter", start_iter, minimum=0)
        if error_feedback and start_iter < 2:
            raise ValueError(
                "start_iter must be >= 2 with error_feedback: DDP rebuilds its buckets after "
                f"the first iteration, so residuals from it would be misaligned (got {start_iter})"
            )
        self.error_feedback = bool(error_feedback)
        self.start_iter = start_iter
        self.dense_if_larger = bool(dense_if_larger)
        self.process_group = process_group
        self.iter = 0
        self.residuals: dict[tuple[int, int], torch.Tensor] = {}
        self.bytes_sent = 0
        self.bytes_dense = 0
        self._keys: dict[int, tuple[int, int]] = {}  # id(param) -> key, this process only

    def keys_of(self, bucket) -> list[tuple[int, int]]:
        """Residual keys of the bucket's parameters (assigned on first sight)."""
        keys = []
        for pos, p in enumerate(bucket.parameters()):
            keys.append(self._keys.setdefault(id(p), (bucket.index(), pos)))
        return keys

    @property
    def compression_ratio(self) -> float:
        """Dense bytes over bytes actually sent (1.0 before any compression)."""
        return self.bytes_dense / self.bytes_sent if self.bytes_sent else 1.0

    def state_dict(self) -> dict:
        """Everything needed to resume: counters and residuals (cloned)."""
        return {
            "iter": self.iter,
            "bytes_sent": self.bytes_sent,
            "bytes_dense": self.bytes_dense,
            "residuals": {i: r.clone() for i, r in self.residuals.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.iter = int(state["iter"])
        self.bytes_sent = int(state["bytes_sent"])
        self.bytes_dense = int(state["bytes_dense"])
        self.residuals = {tuple(key): r.clone() for key, r in state["residuals"].items()}

    def __getstate__(self):
        skip = ("process_group", "_keys")
        return {s: getattr(self, s) for s in self.__slots__ if s not in skip}

    def __setstate__(self, state):
        for s, v in state.items():
            setattr(self, s, v)
        self.process_group = None
        self._keys = {}


def compress_(state: TopKHookState, grad: torch.Tensor, keys: list, sizes: list[int]):
    """Select what a bucket sends: ``(indices, values)``; updates its residuals.

    ``grad`` (left unchanged) is the bucket's flat gradient, the concatenation of
    parameters with residual ``keys`` and ``sizes``. Conservation: ``values``
    scattered at ``indices`` plus the new residuals equals ``grad`` plus the old
    residuals exactly (``gradsift.sparsify``).
    """
    residual = _bucket_residual(state, grad, keys, sizes) if state.error_feedback else None
    idx, values = sparsify_(grad.clone(), state.budget.resolve(grad.numel()), residual=residual)
    if residual is not None:
        start = 0
        for key, size in zip(keys, sizes):
            state.residuals[key] = residual[start : start + size]
            start += size
    return idx, values


def _bucket_residual(state: TopKHookState, grad, keys, sizes) -> torch.Tensor:
    """The bucket's residuals as one flat vector (zeros where there is none yet)."""
    parts = []
    for key, size in zip(keys, sizes):
        residual = state.residuals.get(key)
        if residual is not None and residual.numel() != size:
            log.warning(
                "residual %s has %d entries, expected %d: reset", key, residual.numel(), size
            )
            residual = None
        parts.append(torch.zeros(size, dtype=grad.dtype) if residual is None else residual)
    return torch.cat(parts).to(grad.device)


def _sparse_is_smaller(state: TopKHookState, tensor: torch.Tensor) -> bool:
    k = state.budget.resolve(tensor.numel())
    return k * (_INDEX_BYTES + tensor.element_size()) < tensor.numel() * tensor.element_size()


def topk_hook(state: TopKHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average top-k compressed gradients across ranks.

    Register with ``ddp_model.register_comm_hook(TopKHookState(density=0.01), topk_hook)``.
    """
    group = state.process_group
    world = dist.get_world_size(group)
    tensor = bucket.buffer()
    dense_bytes = tensor.numel() * tensor.element_size()
    state.bytes_dense += dense_bytes
    keys = state.keys_of(bucket)  # on every call, so that keys come from the first layout
    compressing = state.iter >= state.start_iter
    if bucket.is_last():
        state.iter += 1
    if not compressing or (state.dense_if_larger and not _sparse_is_smaller(state, tensor)):
        state.bytes_sent += dense_bytes
        return default_hooks.allreduce_hook(state.process_group, bucket)
    sizes = [p.numel() for p in bucket.parameters()]
    idx, values = compress_(state, tensor, keys, sizes)
    state.bytes_sent += idx.numel() * (_INDEX_BYTES + values.element_size())
    gathered_idx = [torch.empty_like(idx) for _ in range(world)]
    gathered_val = [torch.empty_like(values) for _ in range(world)]
    futs = [
        dist.all_gather(gathered_idx, idx, group=group, async_op=True).get_future(),
        dist.all_gather(gathered_val, values, group=group, async_op=True).get_future(),
    ]

    def decode(_):
        tensor.zero_()
        tensor.index_add_(0, torch.cat(gathered_idx), torch.cat(gathered_val))
        return tensor.div_(world)

    return torch.futures.collect_all(futs).then(decode)

"""``TopK`` on sharded models (FSDP2, ``DTensor`` parameters): the gradients stay
FSDP's, the selection is global across the mesh.

``TopK`` takes this path when its parameters are ``DTensor`` s (``is_sharded``, the
one place that decides); plain tensors keep the flat-buffer path of
``gradsift.optim.grads``. ``ShardedGrads`` speaks ``GradSet``'s protocol, so the
wrapper's step is the same code:

- **State** (``residual``, DGC ``momentum``) is a ``DTensor`` like the parameter
  (``zeros_like(p)``): each rank holds only its shard, and ``state_dict`` carries
  ``DTensor`` s, which ``torch.distributed.checkpoint`` saves and reshards on load.
- **Global order.** Coordinates are numbered as in the unsharded model: parameters in
  param-group order, each full tensor row-major. A ``Shard(0)`` parameter's local rows
  are one contiguous range of that order (start = base of the parameter + first row
  times the row length), so a rank's shard is a list of ``(global start, length)``
  segments and ``gradsift.select.sharded`` selects exactly what single-process
  ``TopK`` would on the full gradient, lowest-global-index ties included (with one
  parameter dtype: single-process ``TopK`` numbers its buckets dtype by dtype, so a
  tie between parameters of two dtypes may be broken the other way).
- **Step.** On the local shards, ``u = m u + g``, ``a = r + u`` (or ``r + g``), the
  global top-k mask ``S`` of ``|a|`` across the mesh's shard group, then
  ``g <- a`` on ``S`` and 0 elsewhere, ``r <- a`` with ``S`` zeroed, ``u`` zeroed on
  ``S``, all **in place** in FSDP's gradient ``DTensor`` s (never replaced); the inner
  optimizer then steps on them as usual.

Placements: ``Shard(0)`` on one mesh dimension, ``Replicate`` on the others (FSDP2,
HSDP: replicas hold equal gradients and make equal selections within their shard
group), or ``Replicate`` everywhere (counted once, on the group's first rank, whose
mask for those parameters is then broadcast: one byte per replicated coordinate).
Other placements raise ``ValueError``. Communication per step: one all-reduce of a
finiteness flag, then the selection's (``gradsift.select.sharded.selection_bytes``);
``scope="layer"`` runs one selection per parameter.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.distributed as dist

from gradsift.checks import NonFiniteGradError
from gradsift.optim.grads import GradSet
from gradsift.select.dtensor import dtensor_layout, is_sharded
from gradsift.select.sharded import sharded_topk_mask

__all__ = ["ShardedGrads", "grad_set"]


def grad_set(params, state_names: tuple[str, ...], touched, state: dict, with_grad=None):
    """The gradients ``TopK`` manages: ``ShardedGrads`` for ``DTensor`` parameters
    (decided here only), else the flat buckets of ``GradSet`` (see its arguments)."""
    if is_sharded(params):
        return ShardedGrads(params, state_names, state)
    return GradSet(params, state_names, touched, with_grad)


class ShardedGrads:
    """``GradSet``'s protocol over ``DTensor`` parameters (see the module doc)."""

    def __init__(self, params, state_names: tuple[str, ...], state: dict):
        self.params = params
        self.state_names = state_names
        self.buckets: list = []  # no flat buffers: FSDP owns the gradients
        self.ids = {id(p) for p in params}
        self.sparse = None
        self.state = state
        self.group, self.layout = dtensor_layout(params) if params else (None, [])
        self.where = {id(p): lay for p, lay in zip(params, self.layout)}
        for p in params:
            for name in state_names:
                if name not in state[p]:
                    state[p][name] = torch.zeros_like(p)
                elif _moved(state[p][name], p):  # model.to(...) since: the state follows
                    state[p][name] = state[p][name].to(dtype=p.dtype, device=p.device)

    def stale(self) -> bool:
        """Whether a parameter changed dtype or device since (``model.to(...)``)."""
        return any(
            _moved(t, p)
            for p in self.params
            for n, t in self.state[p].items()
            if n in self.state_names
        )

    def close(self) -> set[int]:
        return self.with_grad()

    def with_grad(self) -> set[int]:
        """A sharded parameter without a gradient has ``grad`` None."""
        return {id(p) for p in self.params if p.grad is not None}

    def outside(self, params) -> list[torch.Tensor]:
        """Those of ``params`` with a gradient that ``TopK`` does not manage."""
        return [p for p in params if p.grad is not None and id(p) not in self.ids]

    def zero_outside_(self, p: torch.Tensor) -> torch.Tensor:
        return p.grad.zero_()  # refused at the step (``prepare``), zeroed or not

    def drop_absent(self) -> list[torch.Tensor]:
        """Nothing to drop: a sharded parameter without a gradient has ``grad`` None."""
        return []

    def restore_views(self, absent: list[torch.Tensor]) -> None:
        pass

    def prepare(self, others, name_of):
        """The parameters with a gradient; a non-finite one on any rank raises the
        same ``NonFiniteGradError`` on every rank, before anything is modified."""
        if others:
            raise ValueError(
                f"{name_of(others[0])} has a gradient but requires_grad=False; "
                "sharded TopK does not select it"
            )
        present = [p for p in self.params if p.grad is not None]
        # counted on the shards' device (NCCL reduces nothing on the CPU); one host sync
        device = self.params[0].device if self.params else torch.device("cpu")
        bad = torch.zeros(1, dtype=torch.int64, device=device)
        for p in present:
            bad += torch.count_nonzero(~torch.isfinite(p.grad.to_local()))
        dist.all_reduce(bad, group=self.group)
        found = int(bad)
        if found:
            raise NonFiniteGradError(
                f"the gradients hold {found} non-finite entries across ranks; nothing "
                "was modified. Use torch.amp.GradScaler or find the source of the inf/NaN."
            )
        return present, True

    def select(self, present, in_buckets: bool, budget, scope: str, momentum, own):
        """Error feedback and the global top-k, written into the gradients; None."""
        groups = [present] if scope == "global" else [[p] for p in present]
        for ps in groups:
            if ps:
                self._select(ps, budget, momentum or 0.0, own)
        return None

    def _select(self, ps, budget, momentum: float, own) -> None:
        k = budget.resolve(sum(p.numel() for p in ps))
        rank0 = dist.get_rank(self.group) == 0
        accs, parts, segments = [], [], []
        for p in ps:
            g = p.grad.to_local()
            r, u = (own(p, n) for n in ("residual", "momentum"))
            r, u = (None if t is None else t.to_local() for t in (r, u))
            added = g if u is None else u.mul_(momentum).add_(g)
            a = g if r is None else r.add_(added)
            start, n, replicated = self.where[id(p)]
            counted = rank0 or not replicated
            accs.append((g, a, r, u, replicated, counted))
            if counted:
                parts.append(a.reshape(-1))
                segments.append((start, n))
        # the widest dtype over all of them, counted here or not: every rank must
        # select on keys of the same width
        dtype = ps[0].dtype
        for _, a, *_ in accs:
            dtype = torch.promote_types(dtype, a.dtype)
        flat = torch.cat([t.to(dtype) for t in parts]) if parts else _empty(ps[0], dtype)
        mask = sharded_topk_mask(flat, k, segments=segments, group=self.group)
        self._write_back(accs, mask)

    def _write_back(self, accs, mask) -> None:
        """``g <- a`` on the mask, 0 elsewhere; ``r``, ``u`` zeroed on it; replicated
        parameters take the group's first rank's mask."""
        masks, at = [], 0
        for g, _, _, _, _, counted in accs:
            n = g.numel() if counted else 0
            masks.append(mask[at : at + n].view(g.shape) if counted else None)
            at += n
        rep = [i for i, acc in enumerate(accs) if acc[4]]
        if rep:
            shared = torch.cat([_flat_mask(masks[i], accs[i][0]) for i in rep]).to(torch.uint8)
            dist.broadcast(shared, group_src=0, group=self.group)
            at = 0
            for i in rep:
                n = accs[i][0].numel()
                masks[i] = shared[at : at + n].bool().view(accs[i][0].shape)
                at += n
        for (g, a, r, u, _, _), m in zip(accs, masks):
            if a is not g:
                g.copy_(a)
            g.masked_fill_(~m, 0)
            for state in (r, u):
                if state is not None:
                    state.masked_fill_(m, 0)

    @contextmanager
    def absent_as_none(self):
        yield

    @contextmanager
    def held(self):
        yield

    def zero_(self, set_to_none: bool) -> None:
        """Gradients to None, whatever ``set_to_none`` says: FSDP2 gives each parameter
        its gradient in the reduce-scatter, and a zero one kept would count as a
        gradient for a parameter the next backward does not reach."""
        for p in self.params:
            p.grad = None

    def nbytes(self) -> dict[str, int]:
        state = sum(
            t.to_local().numel() * t.element_size()
            for p in self.params
            for name, t in self.state[p].items()
            if name in self.state_names
        )
        return {"state": state, "workspace": 0}


def _moved(state: torch.Tensor, p) -> bool:
    return state.dtype != p.dtype or state.device != p.device


def _flat_mask(mask, g) -> torch.Tensor:
    """``mask`` flat, or zeros where this rank did not count the parameter."""
    if mask is None:
        return torch.zeros(g.numel(), dtype=torch.bool, device=g.device)
    return mask.reshape(-1)


def _empty(like, dtype) -> torch.Tensor:
    return torch.zeros(0, dtype=dtype, device=like.to_local().device)

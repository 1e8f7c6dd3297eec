"""The one error-feedback top-k core, used by ``sparsify_grads_``, ``TopK`` and the DDP
hook alike.

On flat vectors: the gradient ``g``, the residual ``r`` (error-feedback memory) and,
with DGC's momentum correction, the local velocity ``u`` with factor ``m``::

    u <- m u + g                  momentum correction (optional)
    a  = r + u   (or r + g)       error feedback: add what was held back
    S  = top_k(|a|)               gradsift.topk_indices: exact, lowest-index ties
    g <- a on S, 0 elsewhere      what is applied (or sent)
    r <- a with S zeroed          so that  g_new + r_new == a  exactly
    u <- u with S zeroed          momentum factor masking

Without error feedback ``a = g`` and the rest is dropped. References: Seide et al.
2014; Stich et al., "Sparsified SGD with Memory" (NeurIPS 2018, arXiv:1809.07599);
Lin et al., "Deep Gradient Compression" (ICLR 2018, arXiv:1712.01887), Sec. 3.2.

Two implementations compute the same selection, as torch keeps ``_single_tensor_sgd``
beside ``_multi_tensor_sgd``: ``_single_pass`` (whole-vector ops, any layout, any
device) and ``_fused_chunked`` (CPU, with a ``Workspace``), which adds, computes block
keys and zeroes the gradient chunk by chunk while the chunk is in cache, about one
pass over memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import accumulate

import torch

from gradsift.budget import Budget, check_scope
from gradsift.checks import check_float, has_nan, nan_count
from gradsift.optim.workspace import Workspace
from gradsift.select import topk_indices
from gradsift.select.exact import CHUNK
from gradsift.select.sampled import BLOCK, block_key_dtype, block_keys, topk_from_block_keys

__all__ = ["sparsify_", "sparsify_buckets_", "sparsify_grads_", "sparsify_tensors_"]


@torch.no_grad()
def sparsify_(
    grad: torch.Tensor,
    k: int,
    *,
    residual: torch.Tensor | None = None,
    velocity: torch.Tensor | None = None,
    momentum: float = 0.0,
    workspace: Workspace | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the top-k of ``grad (+ residual)`` in ``grad``, in place (see module doc).

    All tensors are flat, contiguous and alike in dtype and device. With a
    ``workspace`` on CPU the fused chunked variant runs, else the single-pass one;
    both give the same result. ``velocity`` (DGC) needs ``residual``.

    Returns ``(indices, values)`` of the kept coordinates, indices ascending.
    """
    _check_states(residual, velocity)
    src, idx, zeroed = _accumulate_and_select_(grad, k, residual, velocity, momentum, workspace)
    return _keep_(grad, src, idx, residual, velocity, zeroed)


@torch.no_grad()
def sparsify_buckets_(
    flats: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]],
    k: int,
    *,
    momentum: float = 0.0,
    workspaces: list[Workspace] | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``sparsify_`` over several flat ``(grad, residual, velocity)`` vectors (one per
    dtype, on one device) as over their concatenation, without concatenating them.

    Each vector accumulates in its own dtype and selects its top ``min(k, n_i)``;
    the global top k lies among these candidates (the global ranking restricted to
    one vector is that vector's own ranking), so the k largest candidate keys, ranked
    in the widest dtype (exact: narrower floats convert exactly) with ties to the
    lowest position in the concatenation, are the selection. Returns
    ``(indices, values)`` per vector, indices ascending.
    """
    for _, residual, velocity in flats:
        _check_states(residual, velocity)
    workspaces = workspaces or [None] * len(flats)
    picked = [
        _accumulate_and_select_(g, min(k, g.numel()), r, u, momentum, w)
        for (g, r, u), w in zip(flats, workspaces)
    ]
    dtype = _widest_dtype(flats)
    keys = torch.cat([torch.index_select(src, 0, idx).to(dtype) for src, idx, _ in picked])
    chosen = topk_indices(keys, k) if k < keys.numel() else _keep_all(keys)
    starts = list(accumulate((idx.numel() for _, idx, _ in picked), initial=0))
    bounds = torch.searchsorted(chosen, torch.tensor(starts, device=keys.device)).tolist()
    out = []
    for (g, r, u), (src, idx, zeroed), lo, hi, start in zip(
        flats, picked, bounds, bounds[1:], starts
    ):
        kept = torch.index_select(idx, 0, chosen[lo:hi] - start)
        out.append(_keep_(g, src, kept, r, u, zeroed))
    return out


def _widest_dtype(triples) -> torch.dtype:
    """The dtype every gradient of ``(grad, residual, velocity)`` triples converts to
    exactly."""
    dtype = triples[0][0].dtype
    for g, _, _ in triples:
        dtype = torch.promote_types(dtype, g.dtype)
    return dtype


def _check_states(residual, velocity) -> None:
    if velocity is not None and residual is None:
        raise ValueError("momentum correction (velocity) needs error feedback (residual)")


def _accumulate_and_select_(grad, k, residual, velocity, momentum, workspace):
    """Error feedback into the vector to select on, and its top-k indices (ascending):
    ``(src, idx, zeroed)``, ``zeroed`` where the fused pass already zeroed ``grad``.

    The chunked pass is for a CPU's caches; on a GPU each chunk would be a handful of
    launches (a thousand chunks at 1B), so whole-vector operations run there."""
    if workspace is None or k >= grad.numel() or grad.device.type != "cpu":
        src = _accumulate_(grad, residual, velocity, momentum)
        return src, _keep_all(src) if k >= src.numel() else topk_indices(src, k), False
    src = residual if residual is not None else grad
    keys = _fused_accumulate_(grad, residual, velocity, momentum, workspace)
    return src, topk_from_block_keys(src, k, keys), residual is not None


def _keep_(grad, src, idx, residual, velocity, zeroed: bool):
    """``grad <- src`` on ``idx``, 0 elsewhere; ``idx`` zeroed in the states."""
    # index_select / index_fill_ / index_copy_: on CPU several times faster than
    # advanced indexing (``src[idx]``, ``r[idx] = 0``) for a few thousand indices
    vals = torch.index_select(src, 0, idx)
    if not zeroed:
        grad.zero_()
    grad.index_copy_(0, idx, vals)
    for state in (residual, velocity):
        if state is not None:
            state.index_fill_(0, idx, 0)
    return idx, vals


def _keep_all(src: torch.Tensor) -> torch.Tensor:
    """Every index (k = N): no selection, but the same NaN policy as ``topk_indices``."""
    if has_nan(src):
        raise ValueError(f"x contains {nan_count(src)} NaN entries; top-k of NaN is undefined")
    return torch.arange(src.numel(), device=src.device)


def _accumulate_(grad, residual, velocity, momentum) -> torch.Tensor:
    """``_single_pass``: ``u = m u + g``, ``r += u or g``; returns the vector to select on."""
    added = grad
    if velocity is not None:
        added = velocity.mul_(momentum).add_(grad)
    if residual is None:
        return grad
    return residual.add_(added)


def _fused_accumulate_(grad, residual, velocity, momentum, workspace: Workspace):
    """``_fused_chunked``: the same updates as ``_accumulate_``, chunk by chunk, with the
    block keys of the result computed while the chunk is in cache; with error
    feedback the gradient chunk is then zeroed and lent as scratch. Returns the keys."""
    keys, scratch = workspace.buffers(grad, need_scratch=residual is None)
    src = grad if residual is None else residual
    nbody = keys.numel() * BLOCK
    key_dtype = block_key_dtype(grad.dtype)
    for s in range(0, grad.numel(), CHUNK):
        g = grad[s : s + CHUNK]
        end = min(s + CHUNK, nbody)
        if residual is not None:
            added = g
            if velocity is not None:
                added = velocity[s : s + CHUNK].mul_(momentum).add_(g)
            residual[s : s + CHUNK].add_(added)
        if s < nbody:
            bits = g.view(key_dtype) if residual is not None else scratch
            block_keys(src[s:end], out=keys[s // BLOCK : end // BLOCK], scratch=bits)
        if residual is not None:
            g.zero_()
    return keys


def check_momentum_correction(m) -> float | None:
    return None if m is None else check_float("momentum_correction", m, "[0, 1)")


@torch.no_grad()
def sparsify_grads_(
    params: Iterable[torch.Tensor],
    *,
    k: int | None = None,
    density: float | None = None,
    residuals: list[torch.Tensor] | None = None,
    scope: str = "global",
    velocities: list[torch.Tensor] | None = None,
    momentum_correction: float | None = None,
) -> int:
    """Keep only the top-k ``|grad (+ residual)|`` coordinates of ``params``, in place.

    The functional core of ``TopK`` for people who write their own update. Parameters
    whose ``grad`` is None are skipped (their residual is untouched); a parameter
    listed twice (a tied weight in two modules' ``parameters()``) counts once, with
    the residual and velocity of its first place; a sparse ``grad`` (an
    ``nn.Embedding(sparse=True)``'s) is replaced by its dense form, as ``TopK`` does. With
    ``residuals`` (one tensor per parameter, like it), error feedback is applied:
    ``a = grad + residual``, ``grad <- top_k(a)``, ``residual <- a - top_k(a)``. With
    ``velocities`` and ``momentum_correction=m``, DGC's momentum correction too (see
    ``gradsift.optim.error_feedback``). ``scope="layer"`` selects within each tensor.
    A ``k`` larger than the coordinates of ``params`` (with ``scope="layer"``, the
    largest tensor's) raises ``ValueError``, as in ``TopK``: every step would be dense.

    Returns the number of coordinates kept.
    """
    budget = Budget(k=k, density=density)
    scope = check_scope(scope)
    m = check_momentum_correction(momentum_correction)
    if isinstance(params, torch.Tensor):
        raise TypeError(
            "params must be an iterable of parameters (model.parameters(), or [w] for one "
            f"tensor w), got a single tensor of shape {tuple(params.shape)}"
        )
    for name, states in (("residuals", residuals), ("velocities", velocities)):
        if isinstance(states, torch.Tensor):
            raise TypeError(
                f"{name} must be a list of tensors, one per parameter, got a single tensor"
            )
    params = list(params)
    for name, states in (("residuals", residuals), ("velocities", velocities)):
        if states is not None and len(states) != len(params):
            raise ValueError(f"{name} must match params: {len(states)} vs {len(params)}")
    if (velocities is None) != (m is None):
        raise ValueError("velocities= and momentum_correction= go together")

    def state(states, i):
        return None if states is None else states[i]

    places = {}  # each parameter at its first place: a tied weight counts once
    for i, p in enumerate(params):
        places.setdefault(id(p), (i, p))
    for _, p in places.values():
        if p.grad is not None and p.grad.layout != torch.strided:
            p.grad = p.grad.to_dense()
    triples = [
        (p.grad, state(residuals, i), state(velocities, i))
        for i, p in places.values()
        if p.grad is not None
    ]
    params = [p for _, p in places.values()]
    if params:  # k beyond every coordinate given: an error, as in TopK and the hook
        n = (sum if scope == "global" else max)(p.numel() for p in params)
        budget.check_fits(n, f"the {n} coordinates of params ({scope} scope)")
    return sparsify_tensors_(triples, budget, scope=scope, momentum=m or 0.0)


def sparsify_tensors_(triples, budget: Budget, *, scope: str, momentum: float = 0.0) -> int:
    """``sparsify_`` over ``(grad, residual or None, velocity or None)`` tensors of any
    shapes and dtypes, globally (one concatenation) or per tensor; returns k kept."""
    if not triples:
        return 0
    if scope == "layer":
        return sum(_sparsify_concatenated_([t], budget, momentum) for t in triples)
    devices = {g.device for g, _, _ in triples}
    if len(devices) > 1:
        raise ValueError(f"scope='global' needs one device, got {sorted(map(str, devices))}")
    return _sparsify_concatenated_(triples, budget, momentum)


def _sparsify_concatenated_(triples, budget: Budget, momentum: float) -> int:
    dtype = _widest_dtype(triples)

    def flat(j):
        if triples[0][j] is None:
            return None
        return torch.cat([t[j].reshape(-1).to(dtype) for t in triples])

    grad, residual, velocity = flat(0), flat(1), flat(2)
    k = budget.resolve(grad.numel())
    sparsify_(grad, k, residual=residual, velocity=velocity, momentum=momentum)
    offset = 0
    for triple in triples:
        n = triple[0].numel()
        for dst, src in zip(triple, (grad, residual, velocity)):
            if dst is not None:
                dst.copy_(src[offset : offset + n].view_as(dst))
        offset += n
    return k

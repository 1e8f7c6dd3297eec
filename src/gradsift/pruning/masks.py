"""Scores to masks (``gradsift.pruning.install`` puts them into the model).

Exactly ``round(sparsity * N)`` weights are removed: the kept set is an exact top-k
of the scores (``gradsift.select.topk_mask`` with ``absolute=False``, since signed
scores such as GraSP's must not be ranked by magnitude), ties broken toward the
lowest index in the concatenation of the layers in model order. There is no
``<=``-threshold over-pruning on ties. Under a layer-wise allocation
(``gradsift.pruning.allocation``) the same top-k runs in each layer on that layer's
exact count.

Masks are monotone: weights pruned by an earlier mask are never revived.

Shuffling (Frankle, Dziugaite, Roy & Carbin, "Pruning Neural Networks at
Initialization: Why are We Missing the Mark?", ICLR 2021, arXiv:2009.08576) permutes
each layer's mask, keeping its density: the sanity check that asks whether a method
learned *which* weights matter or only *how many* per layer.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gradsift.budget import kept_count
from gradsift.checks import check_float, check_int
from gradsift.pruning.allocation import check_allocation, layer_counts
from gradsift.pruning.boolean_mask import as_bool
from gradsift.pruning.flat import shared_flat
from gradsift.pruning.keep_where import keep_where_
from gradsift.select import topk_indices, topk_mask
from gradsift.select.dtensor import is_sharded

__all__ = ["masks_from_scores", "shuffle_masks", "check_sparsity", "select"]


def check_sparsity(sparsity: float) -> float:
    return check_float("sparsity", sparsity, "[0, 1)")


def masks_from_scores(
    scores: dict[str, torch.Tensor],
    sparsity: float,
    *,
    allocation=None,
    scope: str | None = None,
    previous: dict[str, torch.Tensor] | None = None,
    min_per_layer: int = 0,
    workspace: dict | None = None,
    budget=None,
) -> dict[str, torch.Tensor]:
    """Boolean masks keeping the top scores (``True`` keeps).

    Args:
        scores: ``{name: score}``; higher keeps.
        sparsity: fraction removed, in [0, 1); ``round(sparsity * N)`` of the ``N``
            scored weights are removed.
        allocation: ``"global"`` (default: one ranking over all layers), ``"uniform"``,
            ``"er"``, ``"erk"``, ``"uniform+dense-first"`` or a callable: fixed
            per-layer counts, ranked within each layer (``gradsift.pruning.allocation``).
        scope: deprecated older name of ``allocation`` (a ``DeprecationWarning``):
            ``"global"`` is ``"global"``, ``"layer"`` is ``"uniform"``. (Not ``TopK``'s
            ``scope=``, which says where a top-k's size applies.)
        previous: masks already installed; their zeros stay zero (the count removed
            is then at least what they removed).
        min_per_layer: keep at least this many weights in every layer (the best
            scored ones), guarding against layer collapse; the total stays exact.
        workspace: a dict reused across calls (iterative pruning) to hold the flat
            score buffer: a fresh buffer of hundreds of MB page-faults on every call.
        budget: the deprecated name of ``allocation`` (a ``DeprecationWarning``).

    Memory: the scores are copied once into one flat buffer of their common dtype
    (at least float32, so float32 and float64 scores rank exactly as given), in the
    scores' device, unless they already tile one float32/float64 buffer
    (``gradsift.pruning.flat``, as the built-in criteria write them): then they are
    ranked where they lie, untouched (with ``previous`` or ``min_per_layer`` that
    needs a copy, the keys differ from the scores). The selection adds one byte
    per weight (a boolean mask) and never sorts. A weight pruned by ``previous``
    holds the dtype's lowest finite value, every live score is clamped just above it
    (a live ``-inf`` ties with the lowest finite scores), so no infinite key reaches
    the selection. A sharded model's scores (``DTensor`` s) take
    ``gradsift.pruning.sharded.sharded_masks_from_scores``.
    """
    if is_sharded(list(scores.values())):
        raise TypeError(
            "scores are DTensors (a sharded model's): use gradsift.pruning.sharded."
            "sharded_masks_from_scores(scores, sparsity) on every rank, or prune_at_init"
        )
    return select(
        scores,
        sparsity,
        allocation=check_allocation(allocation, scope=scope, budget=budget),
        previous=previous,
        min_per_layer=min_per_layer,
        workspace=workspace,
    )


def select(
    scores: dict[str, torch.Tensor],
    sparsity: float,
    *,
    allocation="global",
    previous: dict[str, torch.Tensor] | None = None,
    min_per_layer: int = 0,
    workspace: dict | None = None,
    consume: bool = False,
    floors: dict[str, int] | None = None,
) -> dict[str, torch.Tensor]:
    """``masks_from_scores`` as boolean masks; ``consume=True`` removes each score from
    ``scores`` once copied into the flat buffer (and each mask from ``previous`` once
    read), so that a caller which owns the dicts never holds the scores and their
    flat copy at once, nor the previous masks beside the new ones. ``floors``: per
    layer, in place of ``min_per_layer`` under a layer-wise allocation."""
    check_sparsity(sparsity)
    min_per_layer = check_int("min_per_layer", min_per_layer, minimum=0)
    names = list(scores)
    if not names:
        raise ValueError("scores is empty: there are no weights to rank (did params= select none?)")
    shapes = {n: scores[n].shape for n in names}
    flat = _in_place(scores, names, consume, previous is None and not min_per_layer)
    if flat is None:
        flat = _buffer(workspace, scores, names)
    alive, offset = {}, 0
    for n in names:
        part = flat[offset : offset + scores[n].numel()]
        old = None if previous is None else previous.get(n)
        alive[n] = fill_keys_(part, scores[n], old, name=f"scores[{n!r}]")
        offset += part.numel()
        if consume:
            del scores[n]
            if previous is not None:
                previous.pop(n, None)
            del old
    if allocation != "global":
        floor = min_per_layer if floors is None else floors
        counts = layer_counts(shapes, sparsity, allocation, caps=alive, floor=floor)
        return _split(flat, shapes, lambda part, n: _keep_top(part, counts[n]))
    keep = min(sum(alive.values()), kept_count(flat.numel(), sparsity))
    reserved = None
    if min_per_layer:
        sizes = [math.prod(shapes[n]) for n in names]
        reserved = _reserve_(flat, sizes, alive, min_per_layer, keep)
    mask = _keep_top(flat, keep - (0 if reserved is None else reserved.numel()))
    if reserved is not None:
        mask[reserved] = True
    return _split(mask, shapes, lambda part, n: part)


def _split(flat: torch.Tensor, shapes: dict, fn) -> dict[str, torch.Tensor]:
    """``fn(slice, name)`` of each layer's slice of ``flat``, shaped like the layer."""
    out, offset = {}, 0
    for n, shape in shapes.items():
        size = math.prod(shape)
        out[n] = fn(flat[offset : offset + size], n).view(shape)
        offset += size
    return out


def key_dtype(scores: dict) -> torch.dtype:
    """The dtype scores are ranked in: the widest floating dtype among them (at least
    float32); float64 where any is an integer or bool (float32 would round integers
    above 2**24 together)."""
    dtype = torch.float32
    for s in scores.values():
        if not s.dtype.is_floating_point:
            return torch.float64
        dtype = torch.promote_types(dtype, s.dtype)
    return dtype


def _in_place(scores: dict, names: list, owned: bool, untouched: bool) -> torch.Tensor | None:
    """The one float32/float64 buffer the scores tile (``gradsift.pruning.flat``), when
    it may be ranked where it lies: the caller gave it away (``owned``), or the keys
    would equal the scores (no dead or reserved weight and none below the live floor)."""
    flat = shared_flat(scores[n] for n in names)
    if flat is None or flat.dtype not in (torch.float32, torch.float64):
        return None
    if owned or (untouched and bool(flat.min() >= _live_floor(flat.dtype))):
        return flat
    return None


def _buffer(workspace: dict | None, scores: dict, names: list) -> torch.Tensor:
    n = sum(scores[name].numel() for name in names)
    dtype, device = key_dtype(scores), scores[names[0]].device
    buf = None if workspace is None else workspace.get("flat")
    if buf is None or buf.numel() != n or buf.device != device or buf.dtype != dtype:
        buf = torch.empty(n, dtype=dtype, device=device)
        if workspace is not None:
            workspace["flat"] = buf
    return buf


def _dead_key(dtype: torch.dtype) -> float:
    """The key of a weight pruned before: the lowest finite value of ``dtype``."""
    return torch.finfo(dtype).min


def _live_floor(dtype: torch.dtype) -> float:
    """The lowest key a live weight may have: just above ``_dead_key``."""
    np_dtype = {torch.float32: np.float32, torch.float64: np.float64}[dtype]
    return float(np.nextafter(np_dtype(torch.finfo(dtype).min), np_dtype(0)))


def fill_keys_(
    part: torch.Tensor, score: torch.Tensor, previous, name: str = "scores", *, nan_error=True
) -> int | None:
    """Write ``score``'s keys into ``part``; return how many weights are alive.
    Raises ``ValueError`` naming ``name`` on a NaN score; with ``nan_error=False``
    returns None instead (a sharded caller raises on every rank)."""
    if part.data_ptr() != score.data_ptr():  # scores ranked in place need no copy
        part.copy_(score.detach().reshape(-1))
    low = part.amin() if part.numel() else None  # one read: NaN and the floor at once
    if low is not None and bool(torch.isnan(low)):
        if not nan_error:
            return None
        raise ValueError(f"{name} contains NaN; cannot rank it")
    if low is not None and bool(low < _live_floor(part.dtype)):
        part.clamp_(min=_live_floor(part.dtype))
    if previous is None:
        return part.numel()
    if previous.shape != score.shape:
        raise ValueError(
            f"previous mask for {name} has shape {tuple(previous.shape)}, the score "
            f"{tuple(score.shape)}"
        )
    alive = as_bool(previous.detach().reshape(-1).to(part.device))
    keep_where_(part, alive, _dead_key(part.dtype))  # no key-sized temporary
    return int(torch.count_nonzero(alive))


def _keep_top(keys: torch.Tensor, keep: int) -> torch.Tensor:
    if keep == 0:
        return torch.zeros(keys.numel(), dtype=torch.bool, device=keys.device)
    return topk_mask(keys.reshape(-1), keep, absolute=False)


def _reserve_(flat: torch.Tensor, sizes: list[int], alive: dict, per_layer: int, keep: int):
    """The positions in ``flat`` of each layer's best ``per_layer`` live keys, kept
    whatever the rest holds; their keys become the dead key, so that the remaining
    ``keep - len`` are selected among the others. (Raising them to +inf instead tied
    them with +inf scores, and the lowest index won: a layer could collapse.)"""
    picked, offset = [], 0
    for size, n_alive in zip(sizes, alive.values()):
        m = min(per_layer, n_alive)
        if m:
            picked.append(topk_indices(flat[offset : offset + size], m, absolute=False) + offset)
        offset += size
    if not picked:
        return torch.zeros(0, dtype=torch.int64, device=flat.device)
    reserved = torch.cat(picked)
    if reserved.numel() > keep:
        raise ValueError(
            f"min_per_layer={per_layer} needs {reserved.numel()} weights but sparsity keeps "
            f"only {keep}"
        )
    flat[reserved] = _dead_key(flat.dtype)
    return reserved


def shuffle_masks(
    masks: dict[str, torch.Tensor],
    *,
    generator: torch.Generator | None = None,
    within: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Each layer's mask randomly permuted: same density per layer, random positions.

    ``within``: masks of an earlier pruning that ``masks`` lie inside; the positions
    are then drawn among those it keeps only (a weight pruned before stays pruned).
    """
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    out = {}
    for name, m in masks.items():
        flat = m.reshape(-1)
        earlier = None if within is None else within.get(name)
        if earlier is None:
            perm = torch.randperm(m.numel(), generator=gen, device=gen.device).to(m.device)
            out[name] = flat[perm].view_as(m).clone()
            continue
        alive = torch.nonzero(as_bool(earlier).reshape(-1).to(m.device)).squeeze(1)
        perm = torch.randperm(alive.numel(), generator=gen, device=gen.device).to(m.device)
        shuffled = torch.zeros_like(flat)
        shuffled[alive] = flat[alive][perm]
        out[name] = shuffled.view_as(m)
    return out

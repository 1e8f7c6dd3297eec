"""Layer allocation: how pruning's kept weights are spread over the layers.

(How many are kept in all is the sparsity's kept count, ``gradsift.budget.kept_count``;
"budget" is the word for a top-k's size, ``gradsift.budget.Budget``.)

``allocation="global"`` ranks every layer together (the scores decide each layer's
share); every other allocation fixes each layer's density ``d_l`` from the shapes alone
and the criterion ranks within each layer. With ``N = Σ n_l`` weights and sparsity
``s``, exactly ``K = N - round(s·N)`` are kept under every allocation:

- ``"uniform"``: ``d_l = K / N`` for every layer.
- ``"uniform+dense-first"``: the first layer (model order) dense, the rest uniform at
  ``(K - n_0) / (N - n_0)`` (refused when ``n_0 > K``).
- ``"er"`` / ``"erk"``: Erdős–Rényi(-kernel) (Evci, Gale, Menick, Castro & Elsen,
  "Rigging the Lottery: Making All Tickets Winners", ICML 2020, arXiv:1911.11134,
  Sec. 3): ``d_l = ε·p_l`` with ``p_l = (n_in + n_out) / (n_in·n_out)`` (ER: the
  channel counts of a weight shaped ``(out, in, *kernel)``) or
  ``p_l = Σ_i shape_i / Π_i shape_i`` (ERK: kernel sizes included), and ``ε`` such
  that ``Σ_l d_l·n_l = K``. A layer with ``ε·p_l > 1`` is made dense and ``ε`` is
  solved again over the other layers with the weights left after the dense ones,
  until no density exceeds 1 (the "exact ERK" rule of RigL's
  ``get_sparsities_erdos_renyi``; solving with ``K`` itself, not ``floor(s·n_l)``
  per layer, is what keeps the total exact, the point of sparseml#2159).
  Random scores under ERK are the baseline of Liu et al., "The Unreasonable
  Effectiveness of Random Pruning", ICLR 2022, arXiv:2202.02643.
- a callable ``fn(shapes, sparsity) -> {name: density}`` (``shapes``: ``{name:
  torch.Size}`` in model order): densities in [0, 1] whose kept count
  ``Σ d_l·n_l`` is ``K`` up to one weight per layer.

Counts (``layer_counts``): real quotas ``d_l·n_l``, scaled to sum to ``K``, rounded
down, and the remainder handed out one weight at a time by largest fractional part
(ties: the earlier layer), the largest-remainder rule. Caps (weights still alive
after earlier rounds) and floors (``min_per_layer``) are met by the same
water-filling as ERK's: a layer that cannot take its quota holds its cap, and the
other layers share what is left in proportion to their quotas.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

from gradsift.budget import check_scope, kept_count
from gradsift.checks import check_choice

__all__ = ["ALLOCATIONS", "check_allocation", "layer_counts", "layer_densities", "raw_er"]

ALLOCATIONS = ("global", "uniform", "er", "erk", "uniform+dense-first")

AllocationSpec = str | Callable


_SCOPE_ALLOCATION = {"global": "global", "layer": "uniform"}


def _deprecated_alias(old: str, value, allocation, message: str):
    """``allocation`` from an older keyword ``old=value`` (with a ``DeprecationWarning``
    naming ``allocation=``); both given must agree."""
    warnings.warn(message, DeprecationWarning, stacklevel=4)
    if allocation is not None and allocation != value:
        raise ValueError(f"{old} and allocation={allocation!r} disagree; give allocation= only")
    return value


def check_allocation(allocation, *, scope: str | None = None, budget=None) -> AllocationSpec:
    """``allocation`` validated (None: ``"global"``). Two older names are accepted for
    one release with a ``DeprecationWarning``, and must agree with ``allocation`` when
    both are given: ``budget`` (same values; "budget" now means only how many
    coordinates a top-k keeps, ``gradsift.budget.Budget``) and pruning's ``scope``
    (``"global"`` is ``"global"``, ``"layer"`` is ``"uniform"``; ``TopK(scope=)``,
    where each tensor selects alone, is another idea)."""
    if budget is not None:
        allocation = _deprecated_alias(
            f"budget={budget!r}",
            budget,
            allocation,
            "budget= (the layer allocation) is deprecated; use allocation= (same values)",
        )
    if scope is not None:
        implied = _SCOPE_ALLOCATION[check_scope(scope)]
        allocation = _deprecated_alias(
            f"scope={scope!r}",
            implied,
            allocation,
            f'pruning\'s scope= is deprecated; use allocation= (scope="{scope}" is '
            f'allocation="{implied}")',
        )
    if allocation is None:
        return "global"
    if callable(allocation):
        return allocation
    if not isinstance(allocation, str):
        raise TypeError(
            f"allocation must be one of {list(ALLOCATIONS)} or a callable, got {allocation!r}"
        )
    check_choice("allocation", allocation, ALLOCATIONS)
    return allocation


def raw_er(shape, *, kernel: bool) -> float:
    """RigL's raw density ``p_l`` of a weight shaped ``(out, in, *kernel)``."""
    shape = [int(d) for d in shape] or [1]  # a 0-dim parameter: one weight
    if kernel:
        return sum(shape) / math.prod(shape)
    n_out, n_in = shape[0], (shape[1] if len(shape) > 1 else 1)
    return (n_in + n_out) / (n_in * n_out)


def _erdos_renyi(sizes: dict, raw: dict, kept: int) -> dict[str, float]:
    dense: set[str] = set()
    while True:
        free = [n for n in sizes if n not in dense]
        if not free:
            return dict.fromkeys(sizes, 1.0)
        eps = (kept - sum(sizes[n] for n in dense)) / sum(raw[n] * sizes[n] for n in free)
        over = {n for n in free if eps * raw[n] > 1.0}
        if not over:  # a layer over 1 stays over as ε grows: saturating all at once is exact
            return {n: 1.0 if n in dense else eps * raw[n] for n in sizes}
        dense |= over


def layer_densities(shapes: dict, sparsity: float, allocation: AllocationSpec) -> dict[str, float]:
    """``{name: density}`` of a layer-wise allocation (``"global"`` has none: it depends
    on the scores)."""
    allocation = check_allocation(allocation)
    sizes = {n: math.prod(int(d) for d in s) for n, s in shapes.items()}
    total = sum(sizes.values())
    kept = kept_count(total, sparsity)
    if callable(allocation):
        return _checked_callable(allocation(dict(shapes), sparsity), sizes, kept)
    if allocation == "global":
        raise ValueError('allocation="global" has no per-layer densities: the scores decide them')
    if allocation == "uniform":
        return {n: kept / total for n in sizes}
    if allocation == "uniform+dense-first":
        first = next(iter(sizes))
        if sizes[first] > kept:
            raise ValueError(
                f'allocation="uniform+dense-first": the first layer {first} has {sizes[first]} '
                f"weights but sparsity={sparsity} keeps only {kept} of {total}"
            )
        rest = total - sizes[first]
        d = (kept - sizes[first]) / rest if rest else 1.0
        return {n: 1.0 if n == first else d for n in sizes}
    raw = {n: raw_er(shapes[n], kernel=allocation == "erk") for n in sizes}
    return _erdos_renyi(sizes, raw, kept)


def _checked_callable(densities, sizes: dict, kept: int) -> dict[str, float]:
    if not isinstance(densities, dict) or set(densities) != set(sizes):
        got = sorted(densities) if isinstance(densities, dict) else type(densities).__name__
        raise ValueError(f"allocation callable must return densities for {list(sizes)}, got {got}")
    out = {}
    for n in sizes:
        d = float(densities[n])
        if not 0.0 <= d <= 1.0:
            raise ValueError(f"allocation callable: density of {n} must be in [0, 1], got {d}")
        out[n] = d
    implied = sum(out[n] * sizes[n] for n in sizes)
    if abs(implied - kept) > len(sizes):
        raise ValueError(
            f"allocation callable keeps {implied:.1f} weights, but the sparsity keeps exactly "
            f"{kept}: densities must satisfy sum(d_l * n_l) = {kept} (up to rounding)"
        )
    return out


def layer_counts(
    shapes: dict,
    sparsity: float,
    allocation: AllocationSpec,
    *,
    caps: dict[str, int] | None = None,
    floor: int | dict[str, int] = 0,
) -> dict[str, int]:
    """Exact kept counts per layer under ``allocation`` (see the module docstring).

    ``caps``: at most this many kept per layer (alive weights; default the layer's
    size); the total is then ``min(K, Σ caps)``. ``floor``: at least
    ``min(floor, cap)`` per layer (``min_per_layer``), or a floor per layer.
    """
    densities = layer_densities(shapes, sparsity, allocation)
    sizes = {n: math.prod(int(d) for d in s) for n, s in shapes.items()}
    caps = {n: min(sizes[n], (caps or sizes)[n]) for n in sizes}
    total = min(kept_count(sum(sizes.values()), sparsity), sum(caps.values()))
    floors = {n: min(floor[n] if isinstance(floor, dict) else floor, caps[n]) for n in sizes}
    if sum(floors.values()) > total:
        raise ValueError(
            f"min_per_layer={floor} needs {sum(floors.values())} weights but sparsity "
            f"keeps only {total}"
        )
    quotas = _water_fill({n: densities[n] * sizes[n] for n in sizes}, caps, floors, total)
    return _largest_remainder(quotas, caps, floors, total)


def _water_fill(quotas: dict, caps: dict, floors: dict, total: int) -> dict[str, float]:
    """Real quotas ``clamp(λ·q_l, floor_l, cap_l)`` summing to ``total``: a layer at a
    bound holds it and the others share the rest in proportion to their quotas. Where
    even every layer with a quota at its cap leaves some over, the layers without a
    quota share it in proportion to their caps."""
    filled = _clamped(quotas, floors, caps, total)
    if filled is None:
        zero = [n for n in quotas if quotas[n] <= 0]
        left = total - sum(caps[n] for n in quotas if quotas[n] > 0)
        rest = _clamped({n: caps[n] for n in zero}, floors, caps, left) or {}
        filled = {n: rest[n] if n in rest else float(caps[n]) for n in quotas}
    return filled


def _clamped(weights: dict, lo: dict, hi: dict, target: float) -> dict[str, float] | None:
    """``clamp(λ·w_l, lo_l, hi_l)`` over ``weights`` with the ``λ >= 0`` at which they
    sum to ``target`` (their sum grows with ``λ``, piecewise linearly between the
    points where a layer meets a bound); None where no ``λ`` reaches it."""

    def at(lam: float) -> dict[str, float]:
        return {n: min(hi[n], max(lo[n], lam * w)) for n, w in weights.items()}

    bends = sorted({0.0} | {b[n] / w for n, w in weights.items() if w > 0 for b in (lo, hi)})
    if sum(at(bends[-1]).values()) < target:
        return None
    before = 0.0
    for bend in bends:  # the first bend at which the sum reaches the target
        if sum(at(bend).values()) >= target:
            break
        before = bend
    base = sum(at(before).values())
    mid = (before + bend) / 2  # the layers strictly within their bounds on the segment
    slope = sum(w for n, w in weights.items() if lo[n] < mid * w < hi[n])
    return at(bend if slope == 0 else before + (target - base) / slope)


def _snap(q: float) -> float:
    return float(round(q)) if abs(q - round(q)) < 1e-9 * max(1.0, q) else q


def _largest_remainder(quotas: dict, caps: dict, floors: dict, total: int) -> dict[str, int]:
    # quotas within float error of an integer (a dense layer) are that integer
    snapped = {n: _snap(q) for n, q in quotas.items()}
    counts = {n: min(caps[n], max(floors[n], math.floor(q))) for n, q in snapped.items()}
    rank = {n: i for i, n in enumerate(snapped)}
    # remainders equal up to float error are a tie, which the earlier layer wins
    order = sorted(snapped, key=lambda n: (round(math.floor(snapped[n]) - snapped[n], 9), rank[n]))
    deficit = total - sum(counts.values())
    while deficit:
        step = 1 if deficit > 0 else -1
        moved = False
        for n in order if step > 0 else reversed(order):
            if deficit and floors[n] <= counts[n] + step <= caps[n]:
                counts[n] += step
                deficit -= step
                moved = True
        if not moved:  # unreachable when floors <= total <= caps, kept as a guard
            raise RuntimeError("layer_counts: bounds leave no exact apportionment")
    return counts

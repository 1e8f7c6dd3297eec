"""Exact global top-k of a vector sharded across ranks, without gathering it.

Each rank holds a shard ``x_r`` of one long vector ``X`` and knows where its
coordinates sit in ``X`` (one global ``offset``, or several ``segments``). The result
on rank ``r`` is the set of its local positions that ``topk_indices(X, k)`` would
select: the same multiset of keys and the same **lowest-global-index ties**, so the
union over ranks is exactly the single-process selection.

The algorithm is a radix select over order keys (as in torch's ``TensorTopK.cu`` and
NVIDIA's AIR top-k: Zhang et al., "Parallel Top-K Algorithms on GPU: A Comprehensive
Study and New Methods", SC'23), with the per-block histograms merged across ranks
instead of across thread blocks:

1. **Keys.** Every float becomes a signed integer whose order is the order of ``|x|``
   (``absolute``) or of ``x``: the IEEE bits with the sign cleared, or, for signed
   order, negative floats with their magnitude bits flipped (``-0`` made ``+0`` first,
   so that the two tie). float16 and bfloat16 widen exactly to float32, so 32-bit keys
   serve all three; float64 gets 64-bit keys. The unsigned digits of ``key ^ MIN``
   (the sign bit flipped) read from the top give the same order.
2. **One digit per pass.** For ``D = 8``-bit digits ``d_p`` (4 passes for 32-bit keys,
   8 for 64-bit), each rank counts the digits of its remaining candidates into 256
   bins, the bins are summed with **one all-reduce** (``O(256)`` integers, no
   values), and every rank picks the same digit ``d*``: the largest with
   ``#{keys above} < need <= #{keys above} + hist[d*]``. Candidates narrow to that
   digit, ``need`` drops by the keys above. If the bin holds exactly ``need`` keys,
   all of them are taken and the select stops early (no ties at the cut).
3. **Ties at the cut.** After the last pass the k-th key ``v`` is known exactly. Every
   key ``> v`` is selected; of the ``t`` keys ``== v`` the lowest ``need`` global
   indices win. Each rank counts its ties per segment and **one all-gather** of
   ``(global start, tie count)`` pairs tells every rank how many ties precede each of
   its segments in global order; a segment takes ``clamp(need - before, 0, ties)``
   of its lowest tie positions.

Communication per call: at most ``passes`` all-reduces of ``256`` int64 (the first
also carries the NaN count, a count of ranks whose arguments were invalid, and checks
that every rank passed the same ``k``, key width and order) plus one all-gather of
``2 * segments`` int64 per rank (two all-gathers when a rank passes ``segments``),
independent of the vector's length. A NaN on any rank, or an invalid argument on one, raises a
``ValueError`` on every rank, after the first all-reduce,
so no rank is left waiting in a collective.

Every rank must call with the same ``k`` and ``absolute`` and a shard of the same
dtype, and shards must not overlap; they may be uneven or empty. Torch ops only: the
tensors stay on ``x``'s device (CPU with gloo, CUDA with NCCL).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gradsift.checks import check_float_tensor, check_int

__all__ = ["BINS", "sharded_topk_indices", "sharded_topk_mask", "selection_bytes"]

DIGIT = 8
BINS = 1 << DIGIT


def order_keys(x: torch.Tensor, absolute: bool) -> torch.Tensor:
    """Signed-integer keys whose order is the order of ``|x|`` (or ``x``); int32 for
    16- and 32-bit floats (widened exactly to float32), int64 for float64."""
    if x.dtype == torch.float64:
        bits, int_dtype = x.view(torch.int64), torch.int64
        mag_mask, top = 0x7FFFFFFFFFFFFFFF, 63
    else:
        bits, int_dtype = x.to(torch.float32).view(torch.int32), torch.int32
        mag_mask, top = 0x7FFFFFFF, 31
    mag = torch.bitwise_and(bits, mag_mask)
    if absolute:
        return mag
    b = torch.where(mag == 0, torch.zeros((), dtype=int_dtype, device=x.device), bits)
    return torch.bitwise_xor(b, torch.bitwise_and(b >> top, mag_mask))


def _digit(keys: torch.Tensor, shift: int, top: bool) -> torch.Tensor:
    """The unsigned 8-bit digit at ``shift`` of ``key ^ MIN`` (the top one flipped)."""
    d = torch.bitwise_and(keys >> shift, BINS - 1)
    return torch.bitwise_xor(d, BINS >> 1) if top else d


def _check_args(x, k, absolute, offset, segments):
    if x.dim() != 1:
        raise ValueError(f"x must be 1-D (a rank's flat shard), got shape {tuple(x.shape)}")
    k = _index("k", k, minimum=1)
    if segments is None:
        return k, [(0, x.numel(), _index("offset", offset, minimum=0))], False
    out, start = [], 0
    for seg in segments:
        g, n = (_index("segments", v, minimum=0) for v in seg)
        out.append((start, n, g))
        start += n
    if start != x.numel():
        raise ValueError(f"segments must cover x: their lengths sum to {start}, x has {x.numel()}")
    return k, out, True


def _index(name: str, value, *, minimum: int) -> int:
    """``check_int``, below 2**62: counts, indices and their sums over the ranks are
    int64 tensors (a larger one overflowed on this rank alone, the others waiting)."""
    value = check_int(name, value, minimum=minimum)
    if value >= 2**62:
        raise ValueError(f"{name} must be below 2**62 (an int64 index), got {value}")
    return value


def _first_pass_extras(x, k, absolute, bits, varied, rank: int, world: int, invalid):
    """The NaN count, the count of ranks with invalid arguments, then each rank's
    ``(k, bits, absolute + 2 * varied)`` in its own slot: summed over the ranks, every
    rank sees every rank's settings, and whether any passed ``segments`` (``varied``:
    the tie all-gather's length exchange must then run on every rank)."""
    nan = int(torch.count_nonzero(torch.isnan(x))) if x.numel() else 0
    slots = [0] * (3 * world)
    slots[3 * rank : 3 * rank + 3] = [k, bits, int(absolute) + 2 * int(varied)]
    return [nan, int(invalid is not None), *slots]


def _agree(extras, total: int, k: int, invalid) -> bool:
    """Raise the same error on every rank from the summed first-pass extras; a rank
    whose own arguments were invalid raises its own error (``invalid``). Returns
    whether any rank passed ``segments``."""
    nan, bad, slots = extras[0], extras[1], extras[2:]
    if invalid is not None:
        raise invalid
    if bad:
        raise ValueError(
            f"{bad} other rank(s) passed invalid arguments to the sharded selection "
            "(each raised why); this rank's were valid"
        )
    varied = any(slots[i + 2] >> 1 for i in range(0, len(slots), 3))
    settings = {(a, b, c & 1) for a, b, c in zip(slots[::3], slots[1::3], slots[2::3])}
    if len(settings) > 1:
        seen = ", ".join(
            f"(k {a}, key bits {b}, absolute {bool(c)})" for a, b, c in sorted(settings)
        )
        raise ValueError(
            "every rank must pass the same k, absolute and shard dtype (float64 vs other "
            f"floats); the ranks passed {seen}"
        )
    if nan:
        raise ValueError(f"x contains {nan} NaN entries across ranks; top-k of NaN is undefined")
    if k > total:
        raise ValueError(f"k must satisfy 1 <= k <= the global length {total}, got {k}")
    return varied


def _radix_select(keys, k, absolute, bits, x, group, invalid=None, varied=False):
    """Radix passes (see the module doc): ``(threshold, need, exact, varied)`` where
    the selection is ``keys > threshold`` plus ``need`` lowest-index ties
    ``== threshold`` when ``exact``, else ``keys >= threshold`` (an early stop, no
    ties to break); ``varied``: whether any rank passed ``segments``."""
    world = dist.get_world_size(group)
    cand, need, prefix = keys, k, 0
    passes = bits // DIGIT
    for p in range(passes):
        shift = bits - DIGIT * (p + 1)
        d = _digit(cand, shift, top=p == 0)
        hist = torch.bincount(d.to(torch.int64), minlength=BINS)
        if p == 0:
            rank = dist.get_rank(group)
            extras = _first_pass_extras(x, k, absolute, bits, varied, rank, world, invalid)
            hist = torch.cat([hist, hist.new_tensor(extras)])
        dist.all_reduce(hist, group=group)
        counts = hist[:BINS].tolist()
        if p == 0:
            varied = _agree(hist[BINS:].tolist(), sum(counts), k, invalid)
        above = 0
        for digit in range(BINS - 1, -1, -1):
            if above + counts[digit] >= need:
                break
            above += counts[digit]
        need -= above
        prefix |= digit << shift
        if counts[digit] == need or p == passes - 1:
            return _signed(prefix, bits), need, counts[digit] != need, varied
        cand = cand[d == digit]
    raise AssertionError("unreachable")


def _signed(prefix: int, bits: int) -> int:
    """The signed key of the unsigned digits ``prefix`` (``key ^ MIN``)."""
    return prefix - (1 << (bits - 1))


def _tie_mask(keys, v, need, segs, varied, group, device) -> torch.Tensor:
    """``keys == v`` restricted to the lowest ``need`` global indices over all ranks."""
    tied = keys == v
    counts = [int(torch.count_nonzero(tied[s : s + n])) for s, n, _ in segs]
    mine = [(g, c) for (_, _, g), c in zip(segs, counts) if c]
    table = _all_gather_pairs(mine, varied, group, device)
    order = sorted(table)
    chosen = torch.zeros_like(tied)
    for (s, n, g), c in zip(segs, counts):
        if not c:
            continue
        before = sum(cnt for start, cnt in order if start < g)
        take = max(0, min(need - before, c))
        if take:
            pos = torch.nonzero(tied[s : s + n]).squeeze(1)[:take] + s
            chosen[pos] = True
    return chosen


def _all_gather_pairs(pairs, varied, group, device) -> list[tuple[int, int]]:
    """All ranks' ``(global start, tie count)`` pairs: one all-gather of a fixed
    width (one segment per rank), or a length all-gather first (``varied``)."""
    world = dist.get_world_size(group)
    width = 1
    if varied:
        n = torch.tensor([len(pairs)], dtype=torch.int64, device=device)
        lengths = [torch.empty_like(n) for _ in range(world)]
        dist.all_gather(lengths, n, group=group)
        width = max(int(t) for t in lengths)
        if width == 0:
            return []
    flat = [v for pair in pairs for v in pair] + [0, 0] * (width - len(pairs))
    mine = torch.tensor(flat, dtype=torch.int64, device=device)
    out = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(out, mine, group=group)
    return [(int(t[2 * i]), int(t[2 * i + 1])) for t in out for i in range(width) if t[2 * i + 1]]


@torch.no_grad()
def sharded_topk_mask(
    x: torch.Tensor, k: int, *, offset: int = 0, segments=None, absolute: bool = True, group=None
) -> torch.Tensor:
    """Boolean mask over this rank's shard ``x`` of the global top-k (module doc).

    Args:
        x: this rank's 1-D floating shard (may be empty), CPU or CUDA.
        k: how many to select over the whole vector, ``1 <= k <=`` its global length;
            the same on every rank.
        offset: the global index of ``x[0]`` (one contiguous shard).
        segments: instead of ``offset``, ``(global start, length)`` pairs that tile
            ``x`` in order (a shard made of several ranges of the global vector, as a
            rank's rows of each FSDP-sharded parameter).
        absolute: rank by ``|x|`` (default) or by ``x``.
        group: the process group (default: the world).

    Raises ``ValueError`` on every rank for NaN anywhere, ``k`` beyond the global
    length, ranks disagreeing on ``k``, ``absolute`` or the key width, or invalid
    arguments on any rank (that rank says which, the others that it happened); a
    non-tensor ``x`` or one of another dtype raises ``TypeError`` on its rank alone.
    """
    check_float_tensor("x", x)  # (no device to meet the other ranks on without it)
    try:
        k, segs, varied = _check_args(x, k, absolute, offset, segments)
        invalid = None
    except (TypeError, ValueError) as err:  # raised after the first all-reduce
        invalid, k, segs, varied, x = err, 0, [], False, x.new_empty(0)
    x = x.contiguous()
    keys = order_keys(x, bool(absolute))
    bits = 64 if keys.dtype == torch.int64 else 32
    v, need, exact, varied = _radix_select(keys, k, bool(absolute), bits, x, group, invalid, varied)
    if not exact:
        return keys >= v
    return (keys > v) | _tie_mask(keys, v, need, segs, varied, group, x.device)


def sharded_topk_indices(
    x: torch.Tensor, k: int, *, offset: int = 0, segments=None, absolute: bool = True, group=None
) -> torch.Tensor:
    """This rank's local positions (int64, ascending) of the global top-k; arguments
    as ``sharded_topk_mask``. With one ``offset`` the global indices are
    ``result + offset``."""
    return torch.nonzero(
        sharded_topk_mask(x, k, offset=offset, segments=segments, absolute=absolute, group=group)
    ).squeeze(1)


def selection_bytes(world: int, *, passes: int = 4, segments: int = 1) -> dict[str, int]:
    """Bytes one rank contributes to the selection's collectives (upper bound: the
    select may stop before ``passes``): ``allreduce`` (``passes`` all-reduces of
    ``BINS`` int64, the first with ``2 + 3 * world`` more: the NaN count, the count of
    ranks with invalid arguments and each rank's k, key bits and absolute) and
    ``allgather`` (``2 * segments`` int64 from each rank)."""
    return {
        "allreduce": (passes * BINS + 2 + 3 * world) * 8,
        "allgather": world * 2 * segments * 8,
    }

"""Exact selection for ``gradsift.select``: the dense path, the exact stage over
candidates, and the k-th largest key by a sample bracket (private helpers)."""

from __future__ import annotations

import functools
import math

import torch

from gradsift.checks import has_nan, nan_count

DENSE_BELOW = 1 << 16  # below this size a plain torch.topk is as fast as anything
SAMPLE = 16384  # random keys used to estimate a threshold or bracket
CHUNK = 1 << 20  # elements per chunk: 4 MiB of float32 stays in cache
DEVICE_CHUNK = 1 << 26  # off the CPU: few host syncs, bounded temporaries
_SEED = 0x5EED


class NaNError(Exception):
    """Raised by the candidate filters on a NaN key; turned into ``ValueError``."""


def raise_nan(x: torch.Tensor) -> None:
    raise ValueError(f"x contains {nan_count(x)} NaN entries; top-k of NaN is undefined")


def key(x: torch.Tensor, absolute: bool) -> torch.Tensor:
    return x.abs() if absolute else x


@functools.lru_cache(maxsize=16)
def sample_positions(n: int, device: torch.device) -> torch.Tensor:
    """``SAMPLE`` fixed-seed random positions in ``range(n)``, drawn once per ``n``.

    The optimizer samples the same-sized vector every step: drawing the positions
    again each time costs more than gathering them. Read-only (shared between calls).
    """
    gen = torch.Generator().manual_seed(_SEED)
    return torch.randint(0, n, (SAMPLE,), generator=gen, device="cpu").to(device)


def exact(keys: torch.Tensor, idx: torch.Tensor | None, k: int) -> torch.Tensor:
    """Exact top-k of ``keys`` (no NaN) in ascending position order, lowest-index ties.

    ``idx`` maps positions in ``keys`` to indices of the original tensor (None means
    identity). Works on any device without a host sync.
    """
    m = keys.numel()
    if keys.device.type == "cpu" and m >= DENSE_BELOW:
        # many candidates (large k): bracket the k-th value from a sample instead of
        # a topk over all of them; same selection, lowest-index ties
        pos = torch.nonzero(top_mask(keys, k)).squeeze(1)
        return pos if idx is None else torch.index_select(idx, 0, pos)
    if 2 * k > m:  # the k-th largest is the (m - k + 1)-th smallest: a smaller topk
        kth = torch.topk(keys, m - k + 1, largest=False, sorted=False).values.max()
    else:
        kth = torch.topk(keys, k, sorted=False).values.min()
    above = keys > kth
    tied = keys == kth
    need = k - torch.count_nonzero(above)
    chosen = above | (tied & (tied.cumsum(0) <= need))
    pos = torch.nonzero_static(chosen, size=k).squeeze(1)
    return pos if idx is None else idx[pos]


def top_mask(key: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the top ``k`` of ``key`` (no NaN), lowest-index ties."""
    v = kth_largest(key, k)
    at_least = key >= v
    if int(torch.count_nonzero(at_least)) == k:  # no surplus ties at v: the usual case
        return at_least
    # surplus ties at v: keep the lowest-index ones, read only as far as needed
    chosen = torch.gt(key, v, out=at_least)  # reuses the mask: no second one
    need = k - int(torch.count_nonzero(chosen))
    chosen[equal_positions(key, v, need)] = True
    return chosen


def chunk_size(key: torch.Tensor) -> int:
    """Elements per chunk of the loops that read ``key`` a chunk at a time: cache-sized
    on the CPU; on a GPU large, since each chunk costs a host sync (``int`` of a count,
    ``nonzero``) and a 1M-element chunk takes a GPU microseconds."""
    return CHUNK if key.device.type == "cpu" else DEVICE_CHUNK


def equal_positions(key: torch.Tensor, v, need: int) -> torch.Tensor:
    """The lowest ``need`` (or fewer) positions with ``key == v``, chunk by chunk,
    stopping as soon as enough are found (a plateau is not read to its end)."""
    found, have, chunk = [], 0, chunk_size(key)
    for start in range(0, key.numel(), chunk):
        pos = torch.nonzero(key[start : start + chunk] == v).squeeze(1) + start
        found.append(pos)
        have += pos.numel()
        if have >= need:
            break
    if not found:
        return torch.zeros(0, dtype=torch.int64, device=key.device)
    return torch.cat(found)[:need]


def kth_largest(key: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest value of ``key`` (no NaN), exactly.

    Brackets it between two quantiles of a fixed sample (four standard deviations
    either side of the expected rank), then selects inside the bracket; if the
    bracket misses, a full ``kthvalue`` decides. The sample affects speed only.
    """
    n = key.numel()
    if n < DENSE_BELOW:
        return kth_full(key, k)
    lo, hi = _bracket(key, k)
    if lo == hi:  # a plateau (ties): count first, and there may be nothing to select
        above_hi = int(torch.count_nonzero(key > hi))
        if above_hi < k <= int(torch.count_nonzero(key >= lo)):
            return hi
    above_hi, inside = _split_at_bracket(key, lo, hi, _capacity(n, k))
    if above_hi < k <= above_hi + inside.numel():
        # the k-th largest overall is the (k - above_hi)-th largest in the bracket
        return kth_full(inside, k - above_hi)
    return kth_full(key, k)  # the sample's bracket missed: select over everything


def _split_at_bracket(key: torch.Tensor, lo, hi, capacity: int):
    """How many keys lie above ``hi``, and the keys with ``lo <= key <= hi``, read
    chunk by chunk (the boolean temporaries stay in cache).

    Every buffer is allocated before the loop and reused, and the bracket's keys are
    gathered into one buffer of ``capacity`` (grown if the bracket holds more): chunk
    results kept alive between the loop's temporaries would fragment the heap, which
    the C allocator then keeps resident (about 30 MB over 50M keys).
    """
    chunk = chunk_size(key)
    above_buf = torch.empty(min(chunk, key.numel()), dtype=torch.bool, device=key.device)
    between_buf = torch.empty_like(above_buf)
    inside, filled, above_hi = key.new_empty(capacity), 0, 0
    for start in range(0, key.numel(), chunk):
        c = key[start : start + chunk]
        above, between = above_buf[: c.numel()], between_buf[: c.numel()]
        # count_nonzero: .sum() of a bool tensor first copies it to int64
        above_hi += int(torch.count_nonzero(torch.gt(c, hi, out=above)))
        # lo <= c <= hi; nonzero + index_select beats boolean indexing on the CPU
        torch.ge(c, lo, out=between).logical_and_(above.logical_not_())
        pos = between.nonzero().squeeze(1)
        if filled + pos.numel() > inside.numel():
            grown = key.new_empty(max(2 * inside.numel(), filled + pos.numel()))
            grown[:filled].copy_(inside[:filled])
            inside = grown
        torch.index_select(c, 0, pos, out=inside[filled : filled + pos.numel()])
        filled += pos.numel()
    return above_hi, inside[:filled]


def _capacity(n: int, k: int) -> int:
    """About how many keys ``_bracket``'s quantiles hold, with room to spare."""
    top, bottom = _sample_ranks(n, k)
    return min(n, math.ceil(1.25 * n * (bottom - top + 1) / SAMPLE) + 1024)


def _sample_ranks(n: int, k: int) -> tuple[int, int]:
    """The sample ranks that bracket the k-th largest of ``n`` keys: four standard
    deviations either side of the expected rank ``k * SAMPLE / n``."""
    expected = k * SAMPLE / n  # sample values expected above the k-th largest
    margin = 4.0 * math.sqrt(expected * (1.0 - k / n)) + 2.0
    return math.floor(expected - margin), math.ceil(expected + margin)


def kth_full(key: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest of ``key`` by one ``kthvalue`` over all of it."""
    return torch.kthvalue(key, key.numel() - k + 1).values


def _bracket(key: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample quantiles ``lo <= hi`` expected to hold the k-th largest of ``key``."""
    n = key.numel()
    sample = torch.index_select(key, 0, sample_positions(n, key.device))
    sample = torch.sort(sample, descending=True).values
    top, bottom = _sample_ranks(n, k)
    hi = sample[top - 1] if top >= 1 else key.new_tensor(math.inf)
    lo = sample[bottom] if bottom < SAMPLE else key.new_tensor(-math.inf)
    if lo == -math.inf and k <= int(torch.count_nonzero(key > -math.inf)):
        # -inf marks dead entries (pruned weights): keep them out of the bracket
        lo = torch.nextafter(key.new_tensor(-math.inf), key.new_tensor(0.0))
    return lo, hi


def dense(x: torch.Tensor, k: int, absolute: bool) -> torch.Tensor:
    """Exact top-k of the whole of ``x`` (raises on NaN)."""
    if has_nan(x):
        raise_nan(x)
    return exact(key(x, absolute), None, k)

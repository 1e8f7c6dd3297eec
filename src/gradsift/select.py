"""Exact, fast top-k selection on one flat tensor: the kernel of gradsift.

``topk_indices(x, k)`` returns the indices of the ``k`` largest ``|x_i|`` (or ``x_i``).
It is exact: the multiset of selected keys equals ``torch.topk``'s.

Why not ``torch.topk``: on CPU, ``torch.topk`` over a 11.7M-element vector costs
~50 passes over memory. We do about two:

1. **Block keys.** View ``x`` as rows of ``B`` elements and reduce each row to its
   largest key ``m_b = max_j key(x_bj)`` (for ``|x|``: ``max(amax, -amin)``), reading
   ``x`` once and writing only ``N / B`` values.
2. **Threshold.** Estimate a threshold ``t`` from a random sample of ``x`` so that
   about ``1.3 k`` keys are ``>= t``. Only blocks with ``m_b >= t`` can hold such
   keys, so only those are gathered and filtered exactly.
3. **Exact stage.** If at least ``k`` candidates satisfy ``key >= t``, then every key
   of the top-k (and every key tied with the k-th) is among them, because all other
   keys are ``< t <=`` the k-th largest candidate. An exact selection on the
   candidates finishes the job. Otherwise ``t`` is lowered and step 2 repeats; after
   a few tries a dense ``torch.topk`` is used. The sample therefore only ever affects
   speed, never the result.

Ties: among keys equal to the k-th largest key, the **lowest indices** are chosen,
so the result is deterministic. The returned indices are sorted **ascending**.

NaN policy: any NaN in ``x`` raises ``ValueError`` (a NaN gradient or score is a bug
upstream, and silently ranking it would hide it). ``+-inf`` rank as the largest
magnitudes (or as the extremes with ``absolute=False``), as in ``torch.topk``.

The sampling-threshold idea follows the sampled selection of Shi et al.,
"Understanding Top-k Sparsification in Distributed Deep Learning" (2019,
arXiv:1911.08772) and DGC (Lin et al. 2018, arXiv:1712.01887); the block filter
and the exact tie rule are ours.
"""

from __future__ import annotations

import functools
import math

import torch

__all__ = [
    "topk_mask",
    "BLOCK",
    "CHUNK",
    "block_key_dtype",
    "block_keys",
    "topk_from_block_keys",
    "topk_indices",
]

_SHIFT = 5
BLOCK = 1 << _SHIFT  # 32 elements per block: two cache lines of float32; amax vectorises
CHUNK = 1 << 20  # elements per chunk: 4 MiB of float32 stays in cache
_SAMPLE = 16384  # random keys used to estimate the threshold
_DENSE_BELOW = 1 << 16  # below this size a plain torch.topk is as fast as anything
_RETRIES = 3
_SEED = 0x5EED


def topk_indices(x: torch.Tensor, k: int, *, absolute: bool = True) -> torch.Tensor:
    """Indices of the ``k`` largest ``|x|`` (``absolute=True``) or ``x``, exactly.

    Args:
        x: a 1-D floating tensor (float16, bfloat16, float32 or float64), CPU or CUDA.
        k: how many to select, ``1 <= k <= x.numel()``.
        absolute: rank by ``|x|`` (default) or by ``x``.

    Returns:
        An int64 tensor of ``k`` indices, sorted ascending. Among keys tied with the
        k-th largest key, the lowest indices are chosen.

    Raises:
        TypeError: ``x`` is not a floating tensor, or ``k`` is not an int.
        ValueError: ``x`` is not 1-D or is empty, ``k`` is out of range, or ``x``
            contains NaN.
    """
    _check(x, k)
    x = x.contiguous()
    if x.device.type != "cpu" or x.numel() < _DENSE_BELOW or k * 8 > x.numel():
        return _dense(x, k, absolute)
    return _sampled(x, k, absolute)


def topk_mask(x: torch.Tensor, k: int, *, absolute: bool = True) -> torch.Tensor:
    """Boolean mask of the same ``k`` entries that ``topk_indices`` selects.

    For any ``k`` (pruning keeps most weights at low sparsity, where an index list
    is as large as the tensor): the k-th largest key ``v`` is found exactly by
    bracketing it between two sample quantiles and selecting within the bracket;
    then ``key > v`` plus the lowest-index ties at ``v``.
    """
    _check(x, k)
    key = _key(x.contiguous(), absolute)
    if _has_nan(key):
        _raise_nan(x)
    return _top_mask(key, k)


def _top_mask(key: torch.Tensor, k: int) -> torch.Tensor:
    """``topk_mask`` of keys already checked for NaN."""
    v = _kth_largest(key, k)
    at_least = key >= v
    if int(torch.count_nonzero(at_least)) == k:  # no surplus ties at v: the usual case
        return at_least
    # surplus ties at v: keep the lowest-index ones (a cumsum over N would be slower)
    chosen = key > v
    need = k - int(torch.count_nonzero(chosen))
    chosen[torch.nonzero(key == v).squeeze(1)[:need]] = True
    return chosen


def _kth_largest(key: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest value of ``key`` (no NaN), exactly."""
    n = key.numel()
    if n < _DENSE_BELOW:
        return torch.kthvalue(key, n - k + 1).values
    sample = torch.index_select(key, 0, _sample_positions(n, key.device))
    sample = torch.sort(sample, descending=True).values
    expected = k * _SAMPLE / n  # sample values expected above the k-th largest
    margin = 4.0 * math.sqrt(expected * (1.0 - k / n)) + 2.0
    top, bottom = math.floor(expected - margin), math.ceil(expected + margin)
    hi = sample[top - 1] if top >= 1 else torch.tensor(math.inf, dtype=key.dtype)
    lo = sample[bottom] if bottom < _SAMPLE else torch.tensor(-math.inf, dtype=key.dtype)
    if lo == -math.inf and k <= int(torch.count_nonzero(key > -math.inf)):
        # -inf marks dead entries (pruned weights): keep them out of the bracket
        lo = torch.nextafter(torch.tensor(-math.inf, dtype=key.dtype), lo.new_tensor(0.0))
    above_hi, inside = 0, []
    for start in range(0, n, CHUNK):  # chunks keep the boolean temporaries in cache
        c = key[start : start + CHUNK]
        # count_nonzero: .sum() of a bool tensor first copies it to int64
        above_hi += int(torch.count_nonzero(c > hi))
        inside.append(c[torch.ge(c, lo).logical_and_(c <= hi)])
    inside = torch.cat(inside)
    if above_hi < k <= above_hi + inside.numel():
        # the k-th largest overall is the (k - above_hi)-th largest in the bracket
        return torch.kthvalue(inside, inside.numel() - (k - above_hi) + 1).values
    return torch.kthvalue(key, n - k + 1).values


def _check(x: torch.Tensor, k: int) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"x must have a floating dtype (float16, bfloat16, float32, float64), got {x.dtype}"
        )
    if x.dim() != 1:
        raise ValueError(f"x must be 1-D, got shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError("x must not be empty")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if not 1 <= k <= x.numel():
        raise ValueError(f"k must satisfy 1 <= k <= x.numel() = {x.numel()}, got {k}")


def _has_nan(x: torch.Tensor) -> bool:
    # A sum is NaN when any term is, and is a much faster reduction on CPU than
    # ``isnan(x).any()``. It can also be NaN from inf - inf: then count exactly.
    if x.numel() == 0 or not torch.isnan(x.sum()):
        return False
    return bool(torch.isnan(x).any())


def _raise_nan(x: torch.Tensor) -> None:
    count = int(torch.isnan(x).sum())
    raise ValueError(f"x contains {count} NaN entries; top-k of NaN is undefined")


def _key(x: torch.Tensor, absolute: bool) -> torch.Tensor:
    return x.abs() if absolute else x


def _exact(keys: torch.Tensor, idx: torch.Tensor | None, k: int) -> torch.Tensor:
    """Exact top-k of ``keys`` (in ascending position order) with lowest-index ties.

    ``idx`` maps positions in ``keys`` to indices of the original tensor (None means
    identity). Works on any device without a host sync.
    """
    m = keys.numel()
    if keys.device.type == "cpu" and m >= _DENSE_BELOW:
        # many candidates (large k): bracket the k-th value from a sample instead of
        # a topk over all of them; same selection, lowest-index ties
        # (callers have already ruled out NaN, so no second check over the keys)
        pos = torch.nonzero(_top_mask(keys, k)).squeeze(1)
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


def _dense(x: torch.Tensor, k: int, absolute: bool) -> torch.Tensor:
    if _has_nan(x):
        _raise_nan(x)
    return _exact(_key(x, absolute), None, k)


_BITS = {
    torch.float16: (torch.int16, 0x7FFF),
    torch.bfloat16: (torch.int16, 0x7FFF),
    torch.float32: (torch.int32, 0x7FFFFFFF),
    torch.float64: (torch.int64, 0x7FFFFFFFFFFFFFFF),
}


def block_key_dtype(dtype: torch.dtype, absolute: bool = True) -> torch.dtype:
    """The dtype of ``block_keys`` for an input of ``dtype``."""
    return _BITS[dtype][0] if absolute else dtype


def block_keys(
    x: torch.Tensor,
    *,
    absolute: bool = True,
    out: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
):
    """The largest key of each block of ``BLOCK`` consecutive elements of ``x``.

    Covers the first ``x.numel() // BLOCK * BLOCK`` elements. With ``absolute`` the
    keys are the IEEE bit patterns of ``|x|`` as integers (the sign bit cleared):
    for non-negative floats, integer order is float order, one ``bitwise_and`` is
    cheaper than ``amax`` and ``amin``, and NaN (whose bits exceed inf's) becomes the
    largest key, so a block holding NaN is always gathered and seen.
    ``out`` (``block_key_dtype``, ``x.numel() // BLOCK`` long) and ``scratch`` (the
    integer dtype, at least ``min(x.numel(), CHUNK)`` long) avoid allocations: fresh
    multi-MB buffers page-fault on every call, which costs more than the work here.
    Callers that produce ``x`` chunk by chunk (the optimizer's error-feedback add) call
    this on each cache-hot chunk with a slice of ``out``, then ``topk_from_block_keys``.
    """
    nblocks = x.numel() // BLOCK
    if out is None:
        out = torch.empty(nblocks, dtype=block_key_dtype(x.dtype, absolute), device=x.device)
    body = x[: nblocks * BLOCK]
    step = CHUNK  # one chunk at a time, so the bit pattern stays in cache for amax
    if absolute:
        int_dtype, mask = _BITS[x.dtype]
        if scratch is None:
            scratch = torch.empty(min(step, body.numel()), dtype=int_dtype, device=x.device)
    for s in range(0, body.numel(), step):
        part = body[s : s + step]
        if absolute:
            part = torch.bitwise_and(part.view(int_dtype), mask, out=scratch[: part.numel()])
        torch.amax(part.view(-1, BLOCK), 1, out=out[s // BLOCK : (s + part.numel()) // BLOCK])
    return out


def topk_from_block_keys(
    x: torch.Tensor, k: int, keys: torch.Tensor, *, absolute: bool = True
) -> torch.Tensor:
    """``topk_indices(x, k)`` given ``keys = block_keys(x)`` computed beforehand."""
    _check(x, k)
    if k * 8 > x.numel() or x.numel() < _DENSE_BELOW:
        return _dense(x, k, absolute)
    return _sampled(x, k, absolute, keys)


def _sample(values: torch.Tensor, k: int, absolute: bool = False):
    """Yield decreasing quantiles of ``|values|`` (or ``values``), the first expected
    to have more than ``k`` keys above it.

    Each is the r-th largest of a fixed-seed random sample, with r four standard
    deviations above the expected count of sample values above the true k-th value,
    so the first threshold falls short of ``k`` with probability ~3e-5; then r grows 4x.
    """
    n = values.numel()
    sample = _key(torch.index_select(values, 0, _sample_positions(n, values.device)), absolute)
    if sample.is_floating_point():
        sample = sample.float()  # exact upcast: float() of it is a value of the dtype
    expected = k * _SAMPLE / n
    rank = expected + 4.0 * math.sqrt(expected) + 2.0
    for _ in range(_RETRIES):
        r = min(int(math.ceil(rank)), _SAMPLE)
        yield torch.topk(sample, r, sorted=False).values.min().item()
        if r == _SAMPLE:
            return
        rank *= 4.0


@functools.lru_cache(maxsize=16)
def _sample_positions(n: int, device: torch.device) -> torch.Tensor:
    """``_SAMPLE`` fixed-seed random positions in ``range(n)``, drawn once per ``n``.

    The optimizer samples the same-sized vector every step: drawing the positions
    again each time costs more than gathering them. Read-only (shared between calls).
    """
    gen = torch.Generator().manual_seed(_SEED)
    return torch.randint(0, n, (_SAMPLE,), generator=gen).to(device)


def _to_float(t, keys: torch.Tensor, dtype: torch.dtype) -> float:
    """A block-key threshold as the float it encodes (integer keys are bit patterns)."""
    if keys.is_floating_point():
        return t
    return float(torch.tensor(t, dtype=keys.dtype).view(dtype))


def _nonzero(mask: torch.Tensor) -> torch.Tensor:
    """``torch.nonzero(mask)`` for a sparse 1-D bool mask, scanning 8x fewer elements.

    The mask is read as int64 words of 8 flags: only the non-zero words are expanded.
    With ~1% of flags set, about 1 word in 10 is non-zero, so the two ``nonzero``
    calls cover ~N/8 + N/10 elements instead of N (``nonzero`` dominates the cost).
    """
    n = mask.numel()
    if n < 4096 or n % 8 or mask.device.type != "cpu":
        return torch.nonzero(mask).squeeze(1)
    packed = mask.view(torch.int64)
    words = torch.nonzero(packed).squeeze(1)
    # index_select: much faster than advanced indexing for gathers on CPU
    flags = torch.nonzero(torch.index_select(packed, 0, words).view(torch.bool)).squeeze(1)
    return (torch.index_select(words, 0, flags >> 3) << 3) | (flags & 7)


def _at_least(keys: torch.Tensor, t: float, mask: torch.Tensor | None = None):
    """Positions and values of ``keys >= t``; raises ``_NaNError`` on a NaN key."""
    # ``~(keys < t)`` also admits NaN, which is then caught on the few survivors
    # instead of by a separate pass over every key
    mask = torch.lt(keys, t, out=None if mask is None else mask[: keys.numel()])
    pos = _nonzero(mask.logical_not_())
    vals = torch.index_select(keys, 0, pos)
    if _has_nan(vals):
        raise _NaNError
    return pos, vals


def _from_blocks(x: torch.Tensor, keys: torch.Tensor, tk, absolute: bool):
    """Indices (ascending) and keys of every ``key >= t`` (``tk``: t as a block key).

    Reads only the blocks whose largest key is ``>= tk``.
    """
    nbody = keys.numel() * BLOCK
    rows = x[:nbody].view(-1, BLOCK)
    t = _to_float(tk, keys, x.dtype)
    # ``~(m < tk)``: with float keys a NaN block (whose key is NaN) is gathered too
    blocks = torch.nonzero(torch.lt(keys, tk).logical_not_()).squeeze(1)
    pos, vals = _at_least(_key(torch.index_select(rows, 0, blocks), absolute).flatten(), t)
    tail_pos, tail_vals = _at_least(_key(x[nbody:], absolute), t)
    idx = (blocks[pos >> _SHIFT] << _SHIFT) | (pos & (BLOCK - 1))
    return torch.cat([idx, tail_pos + nbody]), torch.cat([vals, tail_vals])


def _direct(x: torch.Tensor, t: float, absolute: bool):
    """Indices (ascending) and keys of every ``key >= t``, chunk by chunk.

    Two chunk-sized buffers, reused across chunks, hold the keys and the mask: no
    N-sized allocation, and none that the allocator would hand back to the OS and
    page-fault in again on every chunk.
    """
    size = min(CHUNK, x.numel())
    key_buf = torch.empty(size, dtype=x.dtype, device=x.device) if absolute else None
    mask_buf = torch.empty(size, dtype=torch.bool, device=x.device)
    idx, vals = [], []
    for start in range(0, x.numel(), CHUNK):
        chunk = x[start : start + CHUNK]
        keys = torch.abs(chunk, out=key_buf[: chunk.numel()]) if absolute else chunk
        pos, v = _at_least(keys, t, mask_buf)
        idx.append(pos + start)
        vals.append(v)
    return torch.cat(idx), torch.cat(vals)


class _NaNError(Exception):
    pass


def _sampled(x: torch.Tensor, k: int, absolute: bool, keys=None) -> torch.Tensor:
    """Sampled threshold, then candidates, then exact; dense if every threshold fails.

    With few winners (``4k <= N / BLOCK``) the threshold is sampled from the block keys:
    if at least ``k`` blocks have a key ``>= t``, at least ``k`` elements are ``>= t``
    (each such block holds one), and only about ``k`` blocks are read. Otherwise most
    blocks hold a winner, and a threshold sampled from ``x`` filters it directly.
    """
    try:
        if 4 * k <= x.numel() // BLOCK:
            if keys is None:
                keys = block_keys(x, absolute=absolute)
            for tk in _sample(keys, k):
                idx, vals = _from_blocks(x, keys, tk, absolute)
                if idx.numel() >= k:
                    return _exact(vals, idx, k)
        else:
            for t in _sample(x, k, absolute):
                idx, vals = _direct(x, t, absolute)
                if idx.numel() >= k:
                    return _exact(vals, idx, k)
    except _NaNError:
        _raise_nan(x)
    return _dense(x, k, absolute)

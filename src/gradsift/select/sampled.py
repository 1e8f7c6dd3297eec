"""The sampled-threshold path of ``gradsift.select``: block keys, thresholds from a
fixed sample, and the compaction of the candidates at or above them (private).

The sampling-threshold idea follows Shi et al., "Understanding Top-k Sparsification
in Distributed Deep Learning" (2019, arXiv:1911.08772) and DGC (Lin et al. 2018,
arXiv:1712.01887); the block filter and the exact tie rule are ours.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from gradsift.checks import has_nan
from gradsift.select.exact import (
    CHUNK,
    DENSE_BELOW,
    SAMPLE,
    NaNError,
    dense,
    equal_positions,
    exact,
    key,
    raise_nan,
    sample_positions,
)

_SHIFT = 5
BLOCK = 1 << _SHIFT  # 32 elements per block: two cache lines of float32; amax vectorises
_RETRIES = 3

_BITS = {
    torch.float16: (torch.int16, 0x7FFF),
    torch.bfloat16: (torch.int16, 0x7FFF),
    torch.float32: (torch.int32, 0x7FFFFFFF),
    torch.float64: (torch.int64, 0x7FFFFFFFFFFFFFFF),
}


def block_key_dtype(dtype: torch.dtype, absolute: bool = True) -> torch.dtype:
    """The dtype of ``block_keys`` for an input of ``dtype``."""
    return _BITS[dtype][0] if absolute else dtype


def block_keys(x, *, absolute: bool = True, out=None, scratch=None) -> torch.Tensor:
    """The largest key of each block of ``BLOCK`` consecutive elements of ``x``.

    Covers the first ``x.numel() // BLOCK * BLOCK`` elements. With ``absolute`` the
    keys are the IEEE bit patterns of ``|x|`` as integers (the sign bit cleared):
    for non-negative floats, integer order is float order, one ``bitwise_and`` is
    cheaper than ``amax`` and ``amin``, and NaN (whose bits exceed inf's) becomes the
    largest key, so a block holding NaN is always gathered and seen.
    ``out`` (``block_key_dtype``, ``x.numel() // BLOCK`` long) and ``scratch`` (the
    integer dtype, at least ``min(x.numel(), CHUNK)`` long) avoid allocations: fresh
    multi-MB buffers page-fault on every call, which costs more than the work here.
    """
    nblocks = x.numel() // BLOCK
    if out is None:
        out = torch.empty(nblocks, dtype=block_key_dtype(x.dtype, absolute), device=x.device)
    body = x[: nblocks * BLOCK]
    if absolute:
        int_dtype, mask = _BITS[x.dtype]
        if scratch is None:
            scratch = torch.empty(min(CHUNK, body.numel()), dtype=int_dtype, device=x.device)
    for s in range(0, body.numel(), CHUNK):  # one chunk at a time: the bits stay in cache
        part = body[s : s + CHUNK]
        if absolute:
            part = torch.bitwise_and(part.view(int_dtype), mask, out=scratch[: part.numel()])
        torch.amax(part.view(-1, BLOCK), 1, out=out[s // BLOCK : (s + part.numel()) // BLOCK])
    return out


def thresholds(values: torch.Tensor, k: int, absolute: bool = False):
    """Yield decreasing quantiles of ``|values|`` (or ``values``), the first expected
    to have more than ``k`` keys above it.

    Each is the r-th largest of a fixed-seed random sample, with r four standard
    deviations above the expected count of sample values above the true k-th value,
    so the first threshold falls short of ``k`` with probability ~3e-5; then r grows 4x.
    """
    n = values.numel()
    sample = key(torch.index_select(values, 0, sample_positions(n, values.device)), absolute)
    if sample.is_floating_point():
        sample = sample.float()  # exact upcast: float() of it is a value of the dtype
    expected = k * SAMPLE / n
    rank = expected + 4.0 * math.sqrt(expected) + 2.0
    for _ in range(_RETRIES):
        r = min(int(math.ceil(rank)), SAMPLE)
        yield torch.topk(sample, r, sorted=False).values.min().item()
        if r == SAMPLE:
            return
        rank *= 4.0


def _as_float(t, keys: torch.Tensor, dtype: torch.dtype) -> float:
    """A block-key threshold as the float it encodes (integer keys are bit patterns)."""
    if keys.is_floating_point():
        return t
    return float(torch.tensor(t, dtype=keys.dtype, device="cpu").view(dtype))


def _as_key(t: float, keys: torch.Tensor, dtype: torch.dtype):
    """The block key of the float threshold ``t`` (``_as_float``'s inverse). ``t`` is a
    value of ``dtype`` or a float32 rounding of one, so it converts exactly."""
    if keys.is_floating_point():
        return t
    return int(torch.tensor(t, dtype=dtype, device="cpu").view(keys.dtype))


def nonzero_1d(mask: torch.Tensor) -> torch.Tensor:
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


def _above(keys: torch.Tensor, t: float, mask: torch.Tensor | None = None):
    """Positions and values of ``keys > t``; raises ``NaNError`` on a NaN key."""
    # ``~(keys <= t)`` also admits NaN, which is then caught on the few survivors
    # instead of by a separate pass over every key
    mask = torch.le(keys, t, out=None if mask is None else mask[: keys.numel()])
    pos = nonzero_1d(mask.logical_not_())
    vals = torch.index_select(keys, 0, pos)
    if has_nan(vals):
        raise NaNError
    return pos, vals


def _block_index(blocks: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Indices into ``x`` of positions ``pos`` in the gathered rows of ``blocks``."""
    return (blocks[pos >> _SHIFT] << _SHIFT) | (pos & (BLOCK - 1))


def _from_blocks(x: torch.Tensor, keys: torch.Tensor, tk, absolute: bool):
    """Indices (ascending) and keys of every ``key > t`` (``tk``: t as a block key).

    Reads only the blocks whose largest key is ``> tk``.
    """
    nbody = keys.numel() * BLOCK
    rows = x[:nbody].view(-1, BLOCK)
    t = _as_float(tk, keys, x.dtype)
    if math.isnan(t):  # sampled from a NaN; as bits NaN ranks above inf, so no key is
        raise NaNError  # "above" it, and the tail would pass a NaN threshold whole
    # ``~(m <= tk)``: with float keys a NaN block (whose key is NaN) is gathered too
    blocks = torch.nonzero(torch.le(keys, tk).logical_not_()).squeeze(1)
    pos, vals = _above(key(torch.index_select(rows, 0, blocks), absolute).flatten(), t)
    tail_pos, tail_vals = _above(key(x[nbody:], absolute), t)
    return torch.cat([_block_index(blocks, pos), tail_pos + nbody]), torch.cat([vals, tail_vals])


def _equal_in_blocks(x: torch.Tensor, keys: torch.Tensor, tk, need: int, absolute: bool):
    """The lowest ``need`` (or fewer) indices with ``key == t``, reading blocks whose
    largest key is ``>= tk`` in order and stopping once enough are found."""
    nbody = keys.numel() * BLOCK
    rows = x[:nbody].view(-1, BLOCK)
    t = _as_float(tk, keys, x.dtype)
    blocks = torch.nonzero(torch.ge(keys, tk)).squeeze(1)
    found, have = [], 0
    for s in range(0, blocks.numel(), CHUNK // BLOCK):
        part = blocks[s : s + CHUNK // BLOCK]
        pos = torch.nonzero(key(torch.index_select(rows, 0, part), absolute).flatten() == t)
        found.append(_block_index(part, pos.squeeze(1)))
        have += found[-1].numel()
        if have >= need:
            return torch.cat(found)[:need]
    found.append(equal_positions(key(x[nbody:], absolute), t, need - have) + nbody)
    return torch.cat(found)[:need]


def _direct(x: torch.Tensor, t: float, absolute: bool):
    """Indices (ascending) and keys of every ``key > t``, chunk by chunk.

    Two chunk-sized buffers, reused across chunks, hold the keys and the mask: no
    N-sized allocation, and none that the allocator would hand back to the OS and
    page-fault in again on every chunk.
    """
    chunk = CHUNK if x.device.type == "cpu" else x.numel()  # cache-sized on CPU only
    size = min(chunk, x.numel())
    key_buf = torch.empty(size, dtype=x.dtype, device=x.device) if absolute else None
    mask_buf = torch.empty(size, dtype=torch.bool, device=x.device)
    idx, vals = [], []
    for start in range(0, x.numel(), chunk):
        part = x[start : start + chunk]
        keys = torch.abs(part, out=key_buf[: part.numel()]) if absolute else part
        pos, v = _above(keys, t, mask_buf)
        idx.append(pos + start)
        vals.append(v)
    return torch.cat(idx), torch.cat(vals)


def _at_threshold(above, equal, k: int):
    """The exact top-k given the candidates strictly above a threshold ``t``.

    ``above = (idx, vals)`` of every ``key > t``. If there are at least ``k``, the
    k-th largest key exceeds ``t`` and the top-k is among them. Otherwise the k-th
    largest is ``t`` itself (when enough keys equal it): every key above ``t`` plus
    the lowest-index ties at ``t``, found by ``equal(need)`` with an early stop, so
    that a plateau of equal keys (all-equal data, the zeros of a pruned model) costs
    no more than reading the part of it that is kept. None when ``t`` is too high.
    """
    idx, vals = above
    if idx.numel() >= k:
        return exact(vals, idx, k)
    need = k - idx.numel()
    ties = equal(need)
    if ties.numel() < need:
        return None
    return torch.sort(torch.cat([idx, ties])).values


def _via_blocks(x: torch.Tensor, keys: torch.Tensor, tk, k: int, absolute: bool):
    """``_at_threshold`` at the block key ``tk``, reading only the blocks above it."""
    above = _from_blocks(x, keys, tk, absolute)
    equal = partial(_equal_in_blocks, x, keys, tk, absolute=absolute)
    return _at_threshold(above, equal, k)


def _equal_direct(x: torch.Tensor, t: float, need: int, absolute: bool) -> torch.Tensor:
    return equal_positions(key(x, absolute), t, need)


def sampled(x: torch.Tensor, k: int, absolute: bool, keys=None) -> torch.Tensor:
    """Sampled threshold, then candidates, then exact; dense if every threshold fails.

    Candidates are the keys strictly above the threshold ``t``, plus, when they are
    fewer than ``k``, the lowest-index keys equal to ``t`` (see ``_at_threshold``).

    With few winners (``4k <= N / BLOCK``) the threshold is sampled from the block keys:
    if at least ``k`` blocks have a key ``>= t``, at least ``k`` elements are ``>= t``
    (each such block holds one), and only about ``k`` blocks are read. With more, a
    threshold is sampled from ``x``; given the block keys (the optimizer computes them
    while the data is in cache) it still reads only the blocks that hold a key above
    it: for real gradients, whose large entries cluster by layer, a few percent of the
    blocks at density 0.01 (i.i.d. data would put a winner in a quarter of them).
    Without block keys that threshold filters ``x`` directly, as it always does off
    the CPU (on a GPU the sample, one masked pass and a small exact stage cost less
    than ``torch.topk`` over everything).
    """
    try:
        if 4 * k <= x.numel() // BLOCK and (keys is not None or x.device.type == "cpu"):
            if keys is None:
                keys = block_keys(x, absolute=absolute)
            for tk in thresholds(keys, k):
                if (chosen := _via_blocks(x, keys, tk, k, absolute)) is not None:
                    return chosen
        elif keys is not None:
            for t in thresholds(x, k, absolute):
                tk = _as_key(t, keys, x.dtype)
                if (chosen := _via_blocks(x, keys, tk, k, absolute)) is not None:
                    return chosen
        else:
            for t in thresholds(x, k, absolute):
                above = _direct(x, t, absolute)
                equal = partial(_equal_direct, x, t, absolute=absolute)
                if (chosen := _at_threshold(above, equal, k)) is not None:
                    return chosen
    except NaNError:
        raise_nan(x)
    return dense(x, k, absolute)


def topk_from_block_keys(
    x: torch.Tensor, k: int, keys: torch.Tensor, *, absolute: bool = True
) -> torch.Tensor:
    """``topk_indices(x, k)`` (arguments already checked) given ``keys = block_keys(x)``
    computed beforehand.

    Callers that produce ``x`` chunk by chunk (the error-feedback add of
    ``gradsift.optim.error_feedback``) compute the keys of each cache-hot chunk into a
    slice of ``keys``, then select here without reading ``x`` again.
    """
    if k * 8 > x.numel() or x.numel() < DENSE_BELOW:
        return dense(x, k, absolute)
    return sampled(x, k, absolute, keys)

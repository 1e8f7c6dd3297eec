"""The domain each stage of the Triton selection reads, tile by tile, in ascending
index order: stage 0 the block keys, stage 1 the elements of the candidate blocks
(or of every block, when they overflowed or the selection is not staged)."""

from __future__ import annotations

import triton
import triton.language as tl

from gradsift.select.triton.keys import _TILE, _TOTALS, load_source, order_key

__all__ = ["domain", "tile"]


@triton.jit
def tile(
    t, x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, lidx_ptr, lval_ptr, n, nblocks, count,
    dense, absolute, STAGE: tl.constexpr, MODE: tl.constexpr, BITS: tl.constexpr,
    BLOCK: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """Tile ``t`` of a stage's domain, 1-D, in ascending index order:
    ``(key, position, valid, value, g)``.

    Stage 0: the block keys (position: the block). Stage 1: the elements of the
    first ``count`` candidate blocks (of blocks ``0..count`` when ``dense``). Stage 2:
    the first ``count`` listed elements (every element when ``dense``). Positions of
    stages 1 and 2 are element indices.
    """
    i = tl.arange(0, _TILE)
    base = tl.cast(t, tl.int64) * _TILE if WIDE else t * _TILE  # t: an int when interpreted
    g = tl.zeros([_TILE], dtype=tl.float32)
    if STAGE == 0:
        pos = base + i
        valid = pos < nblocks
        key = tl.load(keys_ptr + pos, mask=valid, other=0).to(tl.uint32, bitcast=True)
        value = key
    elif STAGE == 1:
        j = base // BLOCK + i // BLOCK  # the candidate slot of each element
        live = j < count
        listed = tl.load(cand_ptr + j, mask=live & ((j * 0 + dense) == 0), other=0)
        blk = tl.where(dense != 0, j, listed.to(j.dtype))
        pos = blk * BLOCK + i % BLOCK
        valid = live & (pos < n)
        value, _, g = load_source(x_ptr, r_ptr, u_ptr, m, pos, valid, MODE)
        key = tl.where(valid, order_key(value, absolute, BITS), 0)
    else:
        j = base + i
        valid = j < count
        listed = valid & ((j * 0 + dense) == 0)
        at = tl.load(lidx_ptr + j, mask=listed, other=0)
        pos = tl.where(listed, at.to(j.dtype), j)
        direct, _, g = load_source(x_ptr, r_ptr, u_ptr, m, pos, valid & ~listed, MODE)
        value = tl.where(listed, tl.load(lval_ptr + j, mask=listed, other=0.0), direct)
        key = tl.where(valid, order_key(value, absolute, BITS), 0)
    return key, pos, valid, value, g


@triton.jit
def domain(state_ptr, n, nblocks, cap, ecap, all_, STAGE: tl.constexpr, BLOCK: tl.constexpr):
    """``(tiles, count, dense)`` of a stage: stage 1 reads the candidate blocks that
    stage 0 wrote, stage 2 the elements that stage 1 listed, each the whole vector
    when the buffer before it overflowed (or when the selection is not staged)."""
    if STAGE == 0:
        count = nblocks
        dense = all_ * 0
        tiles = tl.cdiv(nblocks, _TILE)
    elif STAGE == 1:
        total = tl.load(state_ptr + _TOTALS)
        dense = tl.where((all_ != 0) | (total > cap), 1, 0)
        count = tl.where(dense != 0, nblocks, total)
        tiles = tl.cdiv(count, _TILE // BLOCK)
    else:
        total = tl.load(state_ptr + _TOTALS + 2)
        dense = tl.where((all_ != 0) | (total > ecap), 1, 0)
        count = tl.where(dense != 0, n, total)
        tiles = tl.cdiv(count, _TILE)
    return tiles, count, dense

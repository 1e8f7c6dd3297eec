"""Order keys and the vector being selected, for the Triton selection (private).

Every element becomes a ``uint32`` key whose integer order is the order of ``|x|``
(``absolute``) or of ``x``, from the IEEE bits, as on CPU (``gradsift._topk_sampled``):

- ``|x|``: the bits with the sign cleared; for non-negative floats integer order is
  float order, and NaN (bits above inf's) sorts above inf.
- ``x``: negative floats have their magnitude bits flipped, so that signed-integer
  order is float order; ``-0`` is first made ``+0`` so that the two tie, as in floats.
- Then the signed key is moved to ``[0, 2**32)`` (``+2**15`` for 16-bit dtypes, a flip
  of the top bit for 32-bit ones). Key 0 is the bit pattern of a NaN and is given to
  padding lanes, so padding ranks below every real key and is never selected.

The vector selected on is ``x`` itself, or, for the fused error-feedback step,
``a = r + g`` or ``a = r + (m u + g)`` (Seide et al. 2014; Lin et al., "Deep Gradient
Compression", 2018, arXiv:1712.01887), rounded after each operation exactly as
``gradsift.sparsify`` does in torch (float32 arithmetic, one rounding to the dtype per
op; kernels run with ``enable_fp_fusion=False`` so that no multiply-add is contracted).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "BLOCK",
    "ROWS",
    "TILE",
    "block_keys_kernel",
    "domain_tile",
    "load_source",
    "rounded",
]

BLOCK = 32  # elements per block key, as on CPU
ROWS = 128  # blocks per program: 4096 elements, a few KiB of keys in registers
TILE = ROWS * BLOCK
# the same, as the compile-time constants that kernels may read
_BLOCK = tl.constexpr(BLOCK)
_ROWS = tl.constexpr(ROWS)
_TILE = tl.constexpr(TILE)

# int32 state: slot FLAG holds bit NAN_KEY (a NaN key) and bit BAD_GRAD (a non-finite
# gradient, fused step); slots TOTALS + 2 * stage hold a stage's (above, ties) totals
FLAG, NAN_KEY, BAD_GRAD, TOTALS = 0, 1, 2, 1
_FLAG = tl.constexpr(FLAG)
_NAN_KEY = tl.constexpr(NAN_KEY)
_BAD_GRAD = tl.constexpr(BAD_GRAD)
_TOTALS = tl.constexpr(TOTALS)


@triton.jit
def order_key(v, ABSOLUTE: tl.constexpr, BITS: tl.constexpr):
    """The uint32 order key of each float of ``v`` (see the module docstring)."""
    if BITS == 16:
        b = v.to(tl.int16, bitcast=True).to(tl.int32)  # sign-extended
        if ABSOLUTE:
            s = b & 0x7FFF
        else:
            b = tl.where((b & 0x7FFF) == 0, 0, b)
            s = b ^ ((b >> 15) & 0x7FFF)
        u = (s + 32768).to(tl.uint32)
    else:
        b = v.to(tl.int32, bitcast=True)
        if ABSOLUTE:
            s = b & 0x7FFFFFFF
        else:
            b = tl.where((b & 0x7FFFFFFF) == 0, 0, b)
            s = b ^ ((b >> 31) & 0x7FFFFFFF)
        u = s.to(tl.uint32, bitcast=True) ^ 0x80000000
    return u


@triton.jit
def rounded(x, dtype: tl.constexpr):
    """float32 ``x`` rounded to ``dtype``, to nearest even, as torch rounds.

    bfloat16 is rounded on the bits (c10::BFloat16's formula) because Triton's
    interpreter truncates instead; on a GPU the result is ``cvt.rn``'s.
    """
    if dtype == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + (((b >> 16) & 1) + 0x7FFF)) >> 16
        x = b.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif dtype != tl.float32:
        x = x.to(dtype)
    return x


@triton.jit
def load_source(x_ptr, r_ptr, u_ptr, m, idx, mask, MODE: tl.constexpr):
    """``(a, added, g)`` at ``idx``: the vector selected on, what the error-feedback
    add adds (``g``, or the new velocity ``m u + g``) and the raw ``g = x``.

    MODE 0: ``a = x``; 1: ``a = r + x``; 2: ``a = r + (m u + x)``.
    """
    g = tl.load(x_ptr + idx, mask=mask, other=0.0)
    a = g
    added = g
    if MODE == 2:
        u = tl.load(u_ptr + idx, mask=mask, other=0.0)
        u = rounded(u.to(tl.float32) * m, g.dtype)
        added = rounded(u.to(tl.float32) + g.to(tl.float32), g.dtype)
    if MODE != 0:
        r = tl.load(r_ptr + idx, mask=mask, other=0.0)
        a = rounded(r.to(tl.float32) + added.to(tl.float32), g.dtype)
    return a, added, g


@triton.jit
def raise_flags(state_ptr, a, g, mask, MODE: tl.constexpr):
    """OR into the flag slot: NaN keys, and (fused step) non-finite gradients."""
    nan = tl.max(tl.where(mask & (a != a), 1, 0))
    flags = nan * _NAN_KEY
    if MODE != 0:
        bad = tl.max(tl.where(mask & ~(tl.abs(g.to(tl.float32)) < float("inf")), 1, 0))
        flags = flags | (bad * _BAD_GRAD)
    tl.atomic_or(state_ptr + _FLAG, flags)


@triton.jit
def block_keys_kernel(
    x_ptr, r_ptr, u_ptr, m, keys_ptr, state_ptr, n, nblocks,
    MODE: tl.constexpr, ABSOLUTE: tl.constexpr, BITS: tl.constexpr,
):  # fmt: skip
    """The largest key of each block of ``BLOCK`` elements (the last one padded), and
    the flags: the one pass over every element when block keys are used."""
    rows = tl.program_id(0) * _ROWS + tl.arange(0, _ROWS)
    idx = rows[:, None] * _BLOCK + tl.arange(0, _BLOCK)[None, :]
    mask = idx < n
    a, _, g = load_source(x_ptr, r_ptr, u_ptr, m, idx, mask, MODE)
    key = tl.where(mask, order_key(a, ABSOLUTE, BITS), 0)
    tl.store(keys_ptr + rows, tl.max(key, 1).to(tl.int32, bitcast=True), mask=rows < nblocks)
    raise_flags(state_ptr, a, g, mask, MODE)


@triton.jit
def domain_blocks(state_ptr, nblocks, cap, ALL: tl.constexpr):
    """How many blocks stage 1 reads, and whether they are all of them (dense)."""
    if ALL:
        dense = nblocks >= 0
        count = nblocks
    else:
        total = tl.load(state_ptr + _TOTALS) + tl.load(state_ptr + _TOTALS + 1)
        dense = total > cap  # the candidates overflow the buffer: read everything
        count = tl.where(dense, nblocks, total)
    return count, dense


@triton.jit
def domain_tile(
    t, x_ptr, r_ptr, u_ptr, m, keys_ptr, cand_ptr, state_ptr, n, nblocks, cap,
    STAGE: tl.constexpr, ALL: tl.constexpr, MODE: tl.constexpr,
    ABSOLUTE: tl.constexpr, BITS: tl.constexpr, FLAGS: tl.constexpr,
):  # fmt: skip
    """Tile ``t`` of a stage's domain, flat, in ascending index order:
    ``(key, position, valid, value)``.

    Stage 0: the block keys (position: the block). Stage 1: the elements of the
    candidate blocks (or of every block when dense; position: the element's index).
    """
    if STAGE == 0:
        pos = t * _TILE + tl.arange(0, _TILE)
        valid = pos < nblocks
        key = tl.load(keys_ptr + pos, mask=valid, other=0).to(tl.uint32, bitcast=True)
        value = key
    else:
        count, dense = domain_blocks(state_ptr, nblocks, cap, ALL)
        j = t * _ROWS + tl.arange(0, _ROWS)
        live = j < count
        if ALL:
            blk = j
        else:
            listed = tl.load(cand_ptr + j, mask=j < tl.where(dense, 0, count), other=0)
            blk = tl.where(dense, j, listed)
        idx = blk[:, None] * _BLOCK + tl.arange(0, _BLOCK)[None, :]
        mask = live[:, None] & (idx < n)
        a, _, g = load_source(x_ptr, r_ptr, u_ptr, m, idx, mask, MODE)
        if FLAGS:
            raise_flags(state_ptr, a, g, mask, MODE)
        key = tl.reshape(tl.where(mask, order_key(a, ABSOLUTE, BITS), 0), (_TILE,))
        pos = tl.reshape(idx, (_TILE,))
        valid = tl.reshape(mask, (_TILE,))
        value = tl.reshape(a, (_TILE,))
    return key, pos, valid, value

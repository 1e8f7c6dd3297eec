"""Order keys and the vector being selected, for the Triton selection (private).

Every element becomes a ``uint32`` key whose integer order is the order of ``|x|``
(``absolute``) or of ``x``, from the IEEE bits, as on CPU (``gradsift.select.sampled``):

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
``gradsift.optim.error_feedback`` does in torch (float32 arithmetic, one rounding to the dtype per
op; kernels run with ``enable_fp_fusion=False`` so that no multiply-add is contracted).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = [
    "TILE",
    "block_keys_kernel",
    "flags_of",
    "load_source",
    "order_key",
    "rounded",
    "source_mode",
]

TILE = 4096  # elements (or block keys) per tile: a few KiB of keys in registers
_TILE = tl.constexpr(TILE)

# int64 state: slot FLAG holds bit NAN_KEY (a NaN key) and bit BAD_GRAD (a non-finite
# gradient, fused step); slots TOTALS + 2 * stage hold a stage's (above, ties) totals
FLAG, NAN_KEY, BAD_GRAD, TOTALS = 0, 1, 2, 1
_FLAG = tl.constexpr(FLAG)
_NAN_KEY = tl.constexpr(NAN_KEY)
_BAD_GRAD = tl.constexpr(BAD_GRAD)
_TOTALS = tl.constexpr(TOTALS)


@triton.jit
def order_key(v, absolute, BITS: tl.constexpr):
    """The uint32 order key of each float of ``v`` (see the module docstring);
    ``absolute`` is a run-time flag (one compiled kernel serves both orders)."""
    if BITS == 16:
        b = v.to(tl.int16, bitcast=True).to(tl.int32)  # sign-extended
        mag = b & 0x7FFF
        b = tl.where(mag == 0, 0, b)
        s = tl.where(absolute != 0, mag, b ^ ((b >> 15) & 0x7FFF))
        u = (s + 32768).to(tl.uint32)
    else:
        b = v.to(tl.int32, bitcast=True)
        mag = b & 0x7FFFFFFF
        b = tl.where(mag == 0, 0, b)
        s = tl.where(absolute != 0, mag, b ^ ((b >> 31) & 0x7FFFFFFF))
        u = s.to(tl.uint32, bitcast=True) ^ 0x80000000
    return u


@triton.jit
def rounded(x, dtype: tl.constexpr):
    """float32 ``x`` rounded to ``dtype``, to nearest even, as torch rounds.

    bfloat16 is rounded on the bits (c10::BFloat16's formula) because Triton's
    interpreter truncates instead; on a GPU the result is ``cvt.rn``'s. NaN is
    c10's ``0x7FC0`` whatever its payload: the rounding bias would carry a NaN with
    low bits of ``0x8000`` or more (a GPU's arithmetic NaN is ``0x7FFFFFFF``) into
    the sign bit, or into inf.
    """
    if dtype == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        b = (b + (((b >> 16) & 1) + 0x7FFF)) >> 16
        b = tl.where(x != x, 0x7FC0, b)
        x = b.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    elif dtype != tl.float32:
        x = x.to(dtype)
    return x


def source_mode(residual, velocity) -> int:
    """``load_source``'s MODE for the states given: 0 (``x``), 1 (``r + x``) or 2
    (``r + (m u + x)``)."""
    return 0 if residual is None else 2 if velocity is not None else 1


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
def flags_of(a, g, mask, MODE: tl.constexpr):
    """The flag bits of one tile: NaN keys, and (fused step) non-finite gradients;
    callers OR them over their tiles and into the state once."""
    nan = tl.max(tl.where(mask & (a != a), 1, 0))
    flags = nan * _NAN_KEY
    if MODE != 0:
        bad = tl.max(tl.where(mask & ~(tl.abs(g.to(tl.float32)) < float("inf")), 1, 0))
        flags = flags | (bad * _BAD_GRAD)
    return flags.to(tl.int64)


@triton.jit(do_not_specialize=["n", "nblocks", "absolute", "m"])
def block_keys_kernel(
    x_ptr, r_ptr, u_ptr, m, keys_ptr, state_ptr, n, nblocks, absolute,
    MODE: tl.constexpr, BITS: tl.constexpr, BLOCK: tl.constexpr, WIDE: tl.constexpr,
):  # fmt: skip
    """The largest key of each block of ``BLOCK`` elements (the last one padded), and
    the flags: the one pass over every element when block keys are used. One tile per
    program (a streaming read wants many programs in flight, not a loop)."""
    rows_per: tl.constexpr = _TILE // BLOCK
    t = tl.program_id(0)
    base = t.to(tl.int64) * rows_per if WIDE else t * rows_per
    rows = base + tl.arange(0, rows_per)
    idx = rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = idx < n
    a, _, g = load_source(x_ptr, r_ptr, u_ptr, m, idx, mask, MODE)
    key = tl.where(mask, order_key(a, absolute, BITS), 0)
    top = tl.max(key, 1).to(tl.int32, bitcast=True)
    tl.store(keys_ptr + rows, top, mask=rows < nblocks)
    flags = flags_of(a, g, mask, MODE)
    if flags != 0:  # rare: no atomic traffic on finite data
        tl.atomic_or(state_ptr + _FLAG, flags)

"""Wire formats for the top-k hook: ``k`` sorted indices into a vector of ``n`` and
their values, packed into one byte message of a size every rank can compute from
``(n, k)`` alone, so that one ``all_gather`` carries a whole step.

Bytes per sent coordinate (``v``: bytes per value, 4 for float32, 2 for bf16/fp16):

- ``"int64"``: ``8 + v`` (the old format: 12 with float32 values).
- ``"int32"``: ``4 + v`` (any ``n < 2^31``): 6 with 16-bit values.
- ``"local16"``: chunk-local indices, ``2 + v`` plus ``4 n / 65536 / k`` for the
  per-chunk counts: an index is its 16-bit offset within its chunk of 65,536
  coordinates, and the counts say how many fall in each chunk (indices are sorted).
- ``"bitmap"``: one bit per coordinate, ``n / (8 k) + v``: the smallest from a density
  of about 1/16 up.
- ``"auto"``: whichever of ``int32``, ``local16`` and ``bitmap`` is smallest for
  ``(n, k)`` (every rank computes the same choice).
"""

from __future__ import annotations

import math

import torch

from gradsift.checks import check_choice

__all__ = ["ENCODINGS", "VALUE_DTYPES", "choose", "message_bytes", "encode", "decode"]

ENCODINGS = ("auto", "int64", "int32", "local16", "bitmap")
VALUE_DTYPES = (None, torch.float32, torch.float16, torch.bfloat16)  # None: the gradient's
_CHUNK_BITS = 16
_CHUNK = 1 << _CHUNK_BITS


def _index_bytes(encoding: str, n: int, k: int) -> int:
    """Bytes before the values, padded to 8 so that the values stay aligned."""
    if encoding == "int64":
        size = 8 * k
    elif encoding == "int32":
        size = 4 * k
    elif encoding == "local16":
        size = 2 * k + 4 * math.ceil(n / _CHUNK)
    else:  # bitmap
        size = math.ceil(n / 8)
    return -(-size // 8) * 8


def choose(encoding: str, n: int, k: int) -> str:
    """The concrete format for ``(n, k)``: ``encoding`` itself, or the smallest."""
    check_choice("encoding", encoding, ENCODINGS)
    if encoding == "int32" and n >= 2**31:
        raise ValueError(f"encoding='int32' needs fewer than 2^31 coordinates, got {n}")
    if encoding != "auto":
        return encoding
    options = ["local16", "bitmap"] + (["int32"] if n < 2**31 else [])
    return min(options, key=lambda e: _index_bytes(e, n, k))


def message_bytes(encoding: str, n: int, k: int, value_dtype: torch.dtype) -> int:
    """The size of one rank's message (after ``choose``)."""
    return _index_bytes(encoding, n, k) + k * value_dtype.itemsize


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def encode(idx: torch.Tensor, values: torch.Tensor, n: int, encoding: str) -> torch.Tensor:
    """One uint8 message holding ascending ``idx`` (int64) and ``values``.

    The index part is padded to a multiple of 8 bytes (the values stay aligned)."""
    if encoding == "int64":
        head = _as_bytes(idx)
    elif encoding == "int32":
        head = _as_bytes(idx.to(torch.int32))
    elif encoding == "local16":
        counts = torch.bincount(idx >> _CHUNK_BITS, minlength=math.ceil(n / _CHUNK))
        offsets = idx & (_CHUNK - 1)
        offsets = (offsets - _CHUNK * (offsets >= _CHUNK // 2)).to(torch.int16)  # two's complement
        head = torch.cat([_as_bytes(counts.to(torch.int32)), _as_bytes(offsets)])
    else:
        bits = torch.zeros(math.ceil(n / 8) * 8, dtype=torch.uint8, device=idx.device)
        bits[idx] = 1
        weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=idx.device)
        head = (bits.view(-1, 8) * weights).sum(1, dtype=torch.uint8)
    pad = _index_bytes(encoding, n, idx.numel()) - head.numel()
    return torch.cat([head, head.new_zeros(pad), _as_bytes(values)])


def decode(message: torch.Tensor, n: int, k: int, encoding: str, value_dtype: torch.dtype):
    """``(idx, values)`` back from one rank's ``encode`` message."""
    head = _index_bytes(encoding, n, k)
    values = message[head:].view(value_dtype)
    raw = message[:head]
    if encoding == "int64":
        return raw.view(torch.int64), values
    if encoding == "int32":
        return raw[: 4 * k].view(torch.int32).to(torch.int64), values
    if encoding == "local16":
        nchunks = math.ceil(n / _CHUNK)
        counts = raw[: 4 * nchunks].view(torch.int32).to(torch.int64)
        offsets = raw[4 * nchunks : 4 * nchunks + 2 * k].view(torch.int16).to(torch.int64)
        offsets &= _CHUNK - 1
        chunks = torch.repeat_interleave(torch.arange(nchunks, device=raw.device), counts)
        return (chunks << _CHUNK_BITS) | offsets, values
    shifts = torch.arange(8, dtype=torch.uint8, device=raw.device)
    bits = (raw.unsqueeze(1) >> shifts) & 1
    return torch.nonzero(bits.flatten()[:n]).squeeze(1), values

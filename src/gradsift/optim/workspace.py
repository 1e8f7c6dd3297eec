"""The buffers the error-feedback core's chunked CPU pass reuses across steps."""

from __future__ import annotations

import torch

from gradsift.select.exact import CHUNK
from gradsift.select.sampled import BLOCK, block_key_dtype

__all__ = ["Workspace"]


class Workspace:
    """Buffers the fused variant reuses across calls (fresh multi-MB buffers
    page-fault on every call, which costs more than the work).

    ``keys``: one block key per ``BLOCK`` elements (sized for the largest vector
    seen; a smaller one uses its front); ``scratch``: a chunk of integer bits,
    needed only without error feedback (with it, the gradient chunk about to be
    zeroed lends its memory).
    """

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.scratch: torch.Tensor | None = None

    def buffers(self, x: torch.Tensor, need_scratch: bool):
        dtype = block_key_dtype(x.dtype)
        n = x.numel() // BLOCK
        like = (dtype, x.device)
        if (
            self.keys is None
            or self.keys.numel() < n
            or (self.keys.dtype, self.keys.device) != like
        ):
            self.keys = torch.empty(n, dtype=dtype, device=x.device)
        size = min(CHUNK, x.numel())
        s = self.scratch
        if need_scratch and (s is None or s.numel() < size or (s.dtype, s.device) != like):
            self.scratch = torch.empty(size, dtype=dtype, device=x.device)
        return self.keys[:n], self.scratch if need_scratch else None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.scratch) if t is not None)

"""A stand-in for DDP's ``GradBucket``: what the hooks' states read of one."""

from __future__ import annotations

__all__ = ["FakeBucket"]


class FakeBucket:
    """``index()`` and ``parameters()`` of a bucket, without DDP."""

    def __init__(self, index, params):
        self._index, self._params = index, params

    def index(self):
        return self._index

    def parameters(self):
        return self._params

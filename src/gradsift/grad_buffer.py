"""A set of parameters' gradients (and per-coordinate state) as one flat vector.

Backward accumulates into ``p.grad`` in place when it already exists, so pointing
each ``p.grad`` at a view of one flat buffer lets a whole-model operation read a
single vector without a copy, as DDP's ``gradient_as_bucket_view`` and Megatron's
contiguous grad buffers do. Users can still drop the views (``zero_grad`` with
``set_to_none=True``) or assign ``p.grad``: ``attach_grads_`` copies such gradients
back in and re-points them, so results stay correct and only get slower.

Per-coordinate state that lives beside the gradient (the error-feedback residual,
DGC's velocity) gets flat buffers of the same layout, so that the one sparsify core
works on whole vectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["FlatBucket", "build_buckets"]


@dataclass
class FlatBucket:
    """Parameters of one (device, dtype), their grads and state as flat vectors.

    ``state`` maps a name (``"residual"``, ``"momentum"``) to a flat buffer laid out
    like ``grad``; ``offsets[i]`` is where ``params[i]`` starts.
    """

    params: list[torch.Tensor]
    grad: torch.Tensor
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    offsets: list[int] = field(default_factory=list)

    def view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """The slice of ``flat`` that belongs to ``params[i]``, shaped like it."""
        p = self.params[i]
        return flat[self.offsets[i] : self.offsets[i] + p.numel()].view_as(p)

    def owns_grad(self, i: int) -> bool:
        """Whether ``params[i].grad`` is still the view into ``self.grad``."""
        g = self.params[i].grad
        return (
            g is not None
            and g.data_ptr() == self.grad.data_ptr() + self.offsets[i] * self.grad.element_size()
            and g.shape == self.params[i].shape
            and g.is_contiguous()
        )

    def matches(self) -> bool:
        """Whether every parameter still has the bucket's dtype and device.

        ``model.to(torch.float64)`` after the buffer was built changes them in place.
        """
        return all(p.dtype == self.grad.dtype and p.device == self.grad.device for p in self.params)

    def attach_grads_(self) -> bool:
        """Point every present ``p.grad`` at its view, copying foreign grads in.

        Returns True when every parameter of the bucket has a gradient (so the flat
        buffer is exactly the bucket's gradient), False when some are None (those
        slices are zeroed and the parameters keep ``grad=None``).
        """
        complete = True
        for i, p in enumerate(self.params):
            if self.owns_grad(i):
                continue
            view = self.view(self.grad, i)
            if p.grad is None:
                view.zero_()
                complete = False
            else:
                view.copy_(p.grad)
                p.grad = view
        return complete


def build_buckets(params: list[torch.Tensor], *, state: tuple[str, ...] = ()) -> list[FlatBucket]:
    """Group ``params`` by (device, dtype) into flat buckets with zeroed ``state``.

    Every ``p.grad`` becomes a view of its bucket's buffer (existing values are kept,
    a missing grad becomes zeros), as with ``zero_grad(set_to_none=False)``.
    """
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in params:
        groups.setdefault((p.device, p.dtype), []).append(p)
    buckets = []
    for (device, dtype), ps in groups.items():
        offsets, total = [], 0
        for p in ps:
            offsets.append(total)
            total += p.numel()
        grad = torch.zeros(total, device=device, dtype=dtype)
        flat_state = {name: torch.zeros_like(grad) for name in state}
        bucket = FlatBucket(ps, grad, flat_state, offsets)
        for i, p in enumerate(ps):  # views from the start, so backward fills the buffer
            if p.grad is not None:
                bucket.view(grad, i).copy_(p.grad)
            p.grad = bucket.view(grad, i)
        buckets.append(bucket)
    return buckets

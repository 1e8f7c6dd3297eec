"""Gradients outside ``TopK``'s flat buckets (a frozen parameter's, set by hand) that
its ``zero_grad`` zeroed in place.

Until something writes one again, it is no gradient: as a zeroed view that backward
did not reach (``gradsift.optim.grads``), it is held out of the selection and is
None while the inner optimizer steps, so a parameter's state (residual, Adam's
moments) does not move on a gradient nobody gave.
"""

from __future__ import annotations

import torch

__all__ = ["ZeroedOutside"]


class ZeroedOutside:
    """The gradients zeroed in place, each with its version counter at that time."""

    def __init__(self):
        self._held: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}

    def zero_(self, p: torch.Tensor) -> torch.Tensor:
        """``p.grad`` zeroed in place, held as no gradient until written."""
        g = p.grad.zero_()
        self._held[id(p)] = (p, g, g._version)
        return g

    def holds(self, p: torch.Tensor) -> bool:
        """Whether ``p.grad`` is one zeroed here and not written since."""
        held = self._held.get(id(p))
        return held is not None and held[1] is p.grad and held[1]._version == held[2]

    def params(self) -> list[torch.Tensor]:
        """The parameters whose gradient is held (for ``GradSet.absent``)."""
        return [p for p, _, _ in self._held.values() if self.holds(p)]

    def restore(self, p: torch.Tensor) -> bool:
        """Give ``p`` its held gradient back where it is None; whether ``p`` is held."""
        held = self._held.get(id(p))
        if held is not None and p.grad is None:
            p.grad = held[1]
        return held is not None

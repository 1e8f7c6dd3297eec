"""The hook's memory in the loss scale's units.

Under a ``torch.amp.GradScaler`` the gradients DDP hands the hook are scaled by the
loss scale ``s``, and so is what stays behind in the residual (and velocity). When
``s`` changes to ``s'`` the memory is multiplied by ``s' / s`` before it meets the
new gradients: exact with GradScaler's default growth and backoff factors (2 and
0.5), powers of two.
"""

from __future__ import annotations

__all__ = ["rescale_for_grad_scaler_"]


def rescale_for_grad_scaler_(state) -> None:
    """Keep the memory in the loss scale's units (exact for GradScaler's default factors).

    A state whose memory is in a scale's units (``state.scale`` set) but that has no
    ``grad_scaler`` (unpickled: a scaler is an object of its process) raises
    ``ValueError``: it would mix scaled memory with gradients of an unknown scale."""
    if state.grad_scaler is None and state.scale is not None:
        raise ValueError(
            f"this TopKHookState keeps its residual in a GradScaler's units (scale "
            f"{state.scale:g}) but has no grad_scaler: a pickled state leaves its scaler "
            "behind; set state.grad_scaler = scaler (the one restored with it)"
        )
    if state.grad_scaler is None or not state.grad_scaler.is_enabled():
        return
    scale = float(state.grad_scaler.get_scale())
    if state.scale is not None and scale != state.scale:
        for t in (state.residual, state.velocity):
            if t is not None:
                t.mul_(scale / state.scale)
    state.scale = scale

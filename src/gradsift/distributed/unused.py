"""Parameters that no rank used in a step, held out of the top-k hook's selection.

Under ``DistributedDataParallel(find_unused_parameters=True)``, DDP leaves the
``.grad`` of a parameter that no rank used in a step as it was and drops what a
communication hook hands back for it (the reducer copies a globally unused
parameter's bucket slot nowhere). A coordinate the selection took from such a
parameter's residual would be sent, taken out of the residual, and then lost.

With ``TopKHookState(find_unused_parameters=True)`` each rank flags the parameters
whose gradient is non-zero here, the flags are all-reduced with MAX (one collective
of an int32 per parameter), and every parameter that is zero on every rank is held
out: its residual (and velocity) are set aside before the selection and put back
after it, so its mass waits for a step that uses it, as ``TopK`` skips a parameter
without a gradient. DDP cannot be asked which parameters it found unused; a
parameter used with a gradient of exactly zero on every rank is held out as well.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["hold_out_unused_", "restore_held_"]


def hold_out_unused_(state, flat: torch.Tensor, sizes: list[int]) -> list[tuple]:
    """Set aside the memory of every parameter (``sizes``, in ``flat``'s order) whose
    gradient is zero on every rank; return what ``restore_held_`` puts back. Call with
    a finite ``flat`` and the memory in the loss scale's current units."""
    if state.residual is None or not sizes:
        return []
    parts = list(flat.split(sizes))
    norms = torch._foreach_norm(parts, float("inf"))  # one pass, no copy of the vector
    used = (torch.stack(norms) > 0).to(torch.int32)
    dist.all_reduce(used, op=dist.ReduceOp.MAX, group=state.process_group)
    state.bytes_sent += used.numel() * used.element_size()
    memory = _memory(state)
    held, offset = [], 0
    for size, was_used in zip(sizes, used.tolist()):
        if not was_used and size:
            span = slice(offset, offset + size)
            held.append((span, [t[span].clone() for t in memory]))
            for t in memory:
                t[span].zero_()
        offset += size
    return held


def restore_held_(state, held: list[tuple]) -> None:
    """Put the memory set aside by ``hold_out_unused_`` back."""
    memory = _memory(state)
    for span, saved in held:
        for t, s in zip(memory, saved):
            t[span].copy_(s)


def _memory(state) -> list[torch.Tensor]:
    """The error-feedback memory: the residual, and the velocity where there is one."""
    return [t for t in (state.residual, state.velocity) if t is not None]

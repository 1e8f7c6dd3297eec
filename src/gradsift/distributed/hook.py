"""Top-k gradient compression with error feedback as a DDP communication hook.

Deep Gradient Compression (Lin, Han, Mao, Wang & Dally, ICLR 2018, arXiv:1712.01887)
sends only the largest gradient coordinates and accumulates the rest locally
(``gradsift.distributed.state`` has the maths). The selection is over the whole
model, as ``TopK``'s: every bucket's gradient is held until DDP hands over the last
one and concatenated in one vector (in the widest of the buckets' dtypes: DDP buckets
each dtype apart); then, on every rank, in the same order:

1. a small all-gather of a header (finite flag, iteration, size, layout, and the
   state's settings that decide the collectives: ``error_feedback``,
   ``find_unused_parameters``, ``start_iter``, this step's k, wire format and
   message size, ``dense_if_larger``; one in each warm-up step too): a rank whose
   state does not match the others' is an error on every rank, and a non-finite
   gradient anywhere sends every bucket through a plain allreduce, so that
   ``GradScaler`` sees the inf/NaN on every rank and skips the step (the residuals
   are untouched);
2. if the bytes model (``gradsift.distributed.cost``) says sparse pays: one
   all-gather of every rank's encoded top-k (``gradsift.distributed.encoding``),
   scatter-added and divided by the world size; else the residual is flushed into
   a dense allreduce.

Every rank decodes the same messages, so every rank applies the same update, and
because the selection never sees DDP's bucket boundaries, a resumed run (whose fresh
DDP starts from the initial bucket layout) continues bit for bit with any number of
buckets. A failed collective raises its own error (gloo's "connection closed by
peer", a timeout) into every bucket's future, never a decoding error.

The dense path of the first ``start_iter`` iterations is torch's own
``allreduce_hook`` per bucket.

With ``DistributedDataParallel(find_unused_parameters=True)``, give the state
``find_unused_parameters=True`` too: DDP drops what the hook hands back for a
parameter that no rank used in a step, so such a parameter is held out of the step's
selection and its residual kept (``gradsift.distributed.unused``).
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's return
# annotation against the real ``torch.futures.Future[torch.Tensor]`` object.
import functools
import itertools

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from gradsift.checks import all_finite
from gradsift.distributed import encoding as wire
from gradsift.distributed.cost import sparse_pays
from gradsift.distributed.loss_scale import rescale_for_grad_scaler_
from gradsift.distributed.rounding import keep_within_
from gradsift.distributed.state import (
    TopKHookState,
    compress_,
    compress_into_,
    match_layout_,
    message_bytes,
)
from gradsift.distributed.unused import hold_out_unused_, restore_held_

__all__ = ["TopKHookState", "topk_hook", "compress_"]


def topk_hook(state: TopKHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average top-k compressed gradients across ranks.

    Register with ``ddp_model.register_comm_hook(TopKHookState(density=0.01), topk_hook)``.
    """
    tensor = bucket.buffer()
    keys = state.keys_of(bucket)  # on every call, so that keys come from the first layout
    if bucket.index() == 0:
        state._stash = []
    if state.iter < state.start_iter:
        if bucket.index() == 0:  # the ranks agree that this step is a warm-up one
            _exchange_header(state, tensor, None, dist.get_world_size(state.process_group))
        nbytes = tensor.numel() * tensor.element_size()
        state.bytes_dense += nbytes
        state.bytes_sent += nbytes
        if bucket.is_last():
            state.iter += 1
        return default_hooks.allreduce_hook(state.process_group, bucket)
    pending = torch.futures.Future()
    sizes = [p.numel() for p in bucket.parameters()]
    state._stash.append((tensor, keys, sizes, pending))
    if bucket.is_last():
        stash, state._stash = state._stash, []
        try:
            _finish(state, stash)
        except BaseException as exc:  # the real error, raised here and in every future
            for *_, fut in stash:
                if not fut.done():
                    fut.set_exception(exc)
            raise
    return pending


def _layout(stash):
    """The model's parameters in key order: ``(key, size, bucket slot, offset)``."""
    entries = []
    for slot, (_, keys, sizes, _) in enumerate(stash):
        offset = 0
        for key, size in zip(keys, sizes):
            entries.append((key, size, slot, offset))
            offset += size
    return sorted(entries)


def _finish(state: TopKHookState, stash) -> None:
    """Steps 1 and 2 of the module docstring, then every bucket's future is set."""
    group = state.process_group
    world = dist.get_world_size(group)
    entries = _layout(stash)
    parts = [stash[slot][0][off : off + size] for _, size, slot, off in entries]
    # DDP buckets each dtype apart: the vector is in the one every part converts to exactly
    dtype = functools.reduce(torch.promote_types, {p.dtype for p in parts})
    n = sum(p.numel() for p in parts)
    flat = torch.cat(parts, out=state.flat_buffer(n, dtype, parts[0].device))
    element = flat.element_size()
    state.bytes_dense += sum(p.numel() * p.element_size() for p in parts)  # DDP's own
    layout = [(key, size) for key, size, _, _ in entries]
    planned = _planned(state, n, flat.dtype)  # compared across ranks in the header
    finite = _exchange_header(state, flat, layout, world, planned)
    state.budget.check_fits(n, f"the model's {n} coordinates")  # n: the same on every rank
    state.iter += 1
    if finite and state.clip_norm is not None:  # DGC Sec. 3.3: clip before accumulating
        _clip_(state, flat, world)
    held = []
    if finite and state.find_unused_parameters:
        rescale_for_grad_scaler_(state)  # what is set aside, in the current scale's units
        held = hold_out_unused_(state, flat, [size for _, size, _, _ in entries])
    k, encoding, size = planned
    narrow = _narrow(parts, dtype)
    if not finite or (state.dense_if_larger and not sparse_pays(size, n, element, world)):
        _dense(state, flat, finite, world, narrow)
    else:
        _sparse(state, flat, k, encoding, world, narrow)
    restore_held_(state, held)
    _scatter(stash, entries, flat)


def _clip_(state: TopKHookState, flat: torch.Tensor, world: int) -> None:
    """DGC's local clipping (Sec. 3.3), ``g <- g * min(1, c / (sqrt(W) ||g||))``, with
    ``clip_grad_norm_``'s maths (its 1e-6) on the buffer itself: ``clip_grad_norm_``
    clips ``.grad`` attributes, so given the buffer it changed nothing. The norm is
    taken in float32 or wider (a float16 one overflows), the threshold in the loss
    scale's units under a ``GradScaler`` (the buffer holds scaled gradients)."""
    max_norm = state.clip_norm / world**0.5
    scaler = state.grad_scaler
    if scaler is not None and scaler.is_enabled():
        max_norm *= float(scaler.get_scale())
    norm = torch.linalg.vector_norm(flat, dtype=torch.promote_types(flat.dtype, torch.float32))
    flat.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0).to(flat.dtype))


def _digest(layout) -> int:
    digest = 0
    for i, ((a, b), size) in enumerate(layout):
        digest = (digest * 1_000_003 + (i + 1) * (a * 1009 + b) + size) % (1 << 61)
    return digest


def _planned(state: TopKHookState, n: int, dtype) -> tuple[int, str, int]:
    """This step's ``(k, encoding, message bytes)`` on the sparse path; ``k`` is -1
    where it does not fit (``check_fits`` then raises on every rank, after the
    header)."""
    try:
        state.budget.check_fits(n, "")
    except ValueError:
        return -1, "auto", -1
    k = state.budget_at(state.iter).resolve(n)
    encoding, size = message_bytes(state, n, k, dtype)
    return k, encoding, size


_WARMUP = -2  # a warm-up step's header: no size, layout or plan of its own


def _exchange_header(state: TopKHookState, flat, layout, world, planned=None) -> bool:
    """All-gather the header; raise on a mismatch; whether every rank is finite.

    The layout sent is the state's own (a loaded one) when it has one, so that a
    rank holding another model's state fails on every rank at once, not by a hang.
    Every setting that decides the collectives is compared (a rank with another
    density, wire format or warm-up length would otherwise hang or garble the
    all-gather), the warm-up steps included (``layout`` and ``planned`` None).
    """
    warm = planned is None
    k, encoding, size = planned or (_WARMUP, "auto", _WARMUP)
    header = torch.tensor(
        [
            0 if warm else int(not all_finite(flat)),
            state.iter,
            _WARMUP if warm else flat.numel(),
            _WARMUP if warm else _digest(state.layout or layout),
            int(state.error_feedback or state.residual is not None),  # a residual: one below
            -1 if state.rank is None else state.rank,
            -1 if state.world_size is None else state.world_size,
            int(state.find_unused_parameters),  # an extra collective: the same on every rank
            state.start_iter,
            k,
            wire.ENCODINGS.index(encoding),
            wire.VALUE_DTYPES.index(state.value_dtype),
            int(state.dense_if_larger),
            size,
        ],
        dtype=torch.int64,
        device=flat.device,  # NCCL gathers CUDA tensors only
    )
    gathered = [torch.empty_like(header) for _ in range(world)]
    dist.all_gather(gathered, header, group=state.process_group)
    state.bytes_sent += header.numel() * header.element_size()
    rows = torch.stack([g.cpu() for g in gathered])
    _check_owners(rows[:, 5].tolist(), rows[:, 6].tolist(), world)
    state.rank, state.world_size = dist.get_rank(state.process_group), world
    resumed = "was a rank resumed from another checkpoint?"
    same = "give every rank's state the same"
    checked = ((1, "iteration", resumed), (8, "start_iter", same), (2, "model size", resumed),
               (3, "parameter layout", resumed), (4, "error_feedback", same),
               (7, "find_unused_parameters", same), (9, "k (density, k or warm-up)", same),
               (11, "value_dtype", same), (10, "encoding", same), (12, "dense_if_larger", same),
               (13, "message size", same))  # fmt: skip
    for column, what, hint in checked:
        differ = torch.nonzero(rows[:, column] != rows[0, column]).flatten().tolist()
        if differ:
            shown = "" if column == 3 else f" ({rows[:, column].tolist()} by rank)"
            raise ValueError(
                f"top-k hook states differ across ranks in {what}: rank(s) {differ} differ "
                f"from rank 0{shown}; {hint}"
            )
    if not warm:
        match_layout_(state, flat, layout)
    return not bool(rows[:, 0].any())


def _check_owners(ranks: list[int], worlds: list[int], world: int) -> None:
    """Every rank holds a state saved by itself in a world of this size (or a fresh
    one): the same rows on every rank, so the same error on every rank."""
    others = sorted({w for w in worlds if w not in (-1, world)})
    if others:
        raise ValueError(
            f"top-k hook state saved with world size {others[0]} loaded into a world of "
            f"size {world} (saved world size by rank: {worlds}); a rank's residual is its "
            "own unsent gradient and cannot be split among another number of ranks: load "
            "it with state.load_state_dict(sd, reshard=True) to keep the counters and "
            "restart the error-feedback memory at zero"
        )
    wrong = [r for r, saved in enumerate(ranks) if saved not in (-1, r)]
    if wrong:
        held = ", ".join(f"rank {r} holds the state saved by rank {ranks[r]}" for r in wrong)
        raise ValueError(
            f"top-k hook state loaded from another rank's checkpoint on rank(s) {wrong} "
            f"({held}); the state is per rank: save state.state_dict() on every rank "
            "(e.g. to hook_rank{rank}.pt) and load each rank's own file"
        )


def _narrow(parts, dtype) -> list[tuple[int, int, torch.dtype]]:
    """``(start, end, dtype)`` of the parts narrower than the vector's ``dtype``."""
    bounds = itertools.accumulate((p.numel() for p in parts), initial=0)
    return [(a, a + p.numel(), p.dtype) for a, p in zip(bounds, parts) if p.dtype != dtype]


def _dense(state: TopKHookState, flat, finite: bool, world: int, narrow=()) -> None:
    """Plain allreduce of the mean; when finite, the residual (and velocity) go with it."""
    if finite and state.residual is not None:
        # k = n: everything is sent and the memory cleared (flat holds a = r + g)
        idx, _ = compress_into_(state, flat, flat.numel(), rounded=False)
        if narrow:
            flat.copy_(keep_within_(state.residual, idx, flat, narrow))
    flat.div_(world)
    dist.all_reduce(flat, group=state.process_group)
    state.bytes_sent += flat.numel() * flat.element_size()


def _sparse(state: TopKHookState, flat, k: int, encoding: str, world: int, narrow=()) -> None:
    """All-gather every rank's encoded top-k; ``flat`` becomes the decoded mean."""
    n, dtype = flat.numel(), flat.dtype
    idx, values = compress_into_(state, flat, k, rounded=True)
    values = keep_within_(state.residual, idx, values, narrow)
    message = wire.encode(idx, values, n, encoding)
    gathered = [torch.empty_like(message) for _ in range(world)]
    dist.all_gather(gathered, message, group=state.process_group)
    state.bytes_sent += message.numel()
    # flat is non-zero only where this rank sent, and the mean is scaled as it is
    # summed: two passes over the dense vector saved (exact for a power-of-two world)
    flat.index_fill_(0, idx, 0)
    value_dtype = values.dtype
    for m in gathered:
        i, v = wire.decode(m, n, k, encoding, value_dtype)
        flat.index_add_(0, i, v.to(dtype), alpha=1.0 / world)


def _scatter(stash, entries, flat) -> None:
    """Write ``flat`` (key order) back into each bucket's tensor and set its future."""
    pos = 0
    for _, size, slot, off in entries:
        stash[slot][0][off : off + size].copy_(flat[pos : pos + size])
        pos += size
    for tensor, _, _, fut in stash:
        fut.set_result(tensor)

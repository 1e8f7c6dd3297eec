"""torch's PowerSGD (Vogels et al. 2019, arXiv:1905.13727) as a lab run's hook state:
a compression ratio, checkpoints, and memories that follow DDP's bucket layout.

torch's ``powerSGD_hook`` keys its memories (the error feedback ``e``, the warm-start
``P`` and ``Q``) by bucket index. DDP lays its buckets out once at construction and
again after the first iteration (in the order gradients became ready), so a run
resumed from a checkpoint meets, in its first step, a layout other than the one its
memories were written in: each bucket's flat memories then land on other
parameters' coordinates, without an error. ``PowerSGDRunState`` records which
parameters each bucket holds (``layouts``) and, where a bucket's layout changes,
cuts every memory into per-parameter pieces and joins them again in the new order.
Every PowerSGD operation acts on one tensor at a time (the all-reduces are
element-wise), so a step is the same computation in any layout, bit for bit, on two
ranks; from three, the order in which gloo sums an element depends on its position
in the buffer, and a resumed run may differ in the last bits (``lab.checkpoint``).
"""

from __future__ import annotations

import math

import torch
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

__all__ = ["PowerSGDRunState", "powersgd_hook"]

_MEMORIES = {"error": "error_dict", "p": "p_memory_dict", "q": "q_memory_dict"}


class PowerSGDRunState(powerSGD_hook.PowerSGDState):
    """torch's PowerSGD state with what a gradsift run asks of every hook state:
    ``compression_ratio`` and ``state_dict``/``load_state_dict`` for checkpoints.

    ``params`` (the model's parameters, in order) lets ``powersgd_hook`` follow DDP's
    bucket layouts (see the module doc); without it the hook is torch's own.

    The ratio is torch's own count, numel before over numel after compression
    (both float32, so it is also the bytes ratio); like torch, it leaves out the
    ``start_powerSGD_iter`` plain-allreduce warm-up steps. The saved state is the
    iteration, the error feedback, the P/Q warm-start memories with their layouts and
    the sketching RNG: enough to resume bit-for-bit, in tensors a ``weights_only``
    load accepts.
    """

    def __init__(self, *args, params=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.position = None if params is None else {id(p): i for i, p in enumerate(params)}
        self.layouts: dict[int, tuple] = {}  # bucket index -> ((position, shape), ...)
        self.pending: dict[int, dict] = {}  # position -> pieces not yet in a bucket

    @property
    def compression_ratio(self) -> float:
        before, after = self.total_numel_before_compression, self.total_numel_after_compression
        return before / after if after else 1.0

    def follow(self, bucket) -> None:
        """Before torch's hook: where ``bucket``'s layout differs from the one its
        memories were written in, rewrite every memory for the new layouts."""
        if self.position is None:
            return
        index = bucket.index()
        layout = tuple((self.position[id(p)], tuple(p.shape)) for p in bucket.parameters())
        if self.layouts.get(index) == layout:
            return
        if index in self.layouts:  # DDP laid its buckets out anew: every memory moves
            for i, old in self.layouts.items():
                self._split(i, old)
            self.layouts.clear()
        self._join(index, layout)
        self.layouts[index] = layout

    def _pieces(self, layout) -> dict[str, list[tuple[int, slice]]]:
        """Where each parameter's memory lies in a bucket of ``layout``, as torch's
        hook lays it out: ``e`` in bucket order; ``P`` and ``Q`` for the compressed
        tensors only, grouped by matrix shape in order of first appearance."""
        error, groups, offset = [], {}, 0
        for pos, shape in layout:
            numel = math.prod(shape)
            error.append((pos, slice(offset, offset + numel)))
            offset += numel
            n = shape[0] if shape else 1
            m = numel // n
            rank = min(n, m, self.matrix_approximation_rank)
            if powerSGD_hook._should_compress(n, m, rank, self.min_compression_rate)[0]:
                groups.setdefault((n, m), []).append((pos, n * rank, m * rank))
        pieces = {"error": error, "p": [], "q": []}
        ends = {"p": 0, "q": 0}
        for members in groups.values():
            for pos, *sizes in members:
                for name, size in zip(("p", "q"), sizes):
                    pieces[name].append((pos, slice(ends[name], ends[name] + size)))
                    ends[name] += size
        return pieces

    def _split(self, index: int, layout) -> None:
        for name, where in self._pieces(layout).items():
            flat = getattr(self, _MEMORIES[name]).pop(index, None)
            if flat is not None:
                flat = flat.reshape(-1)
                for pos, part in where:
                    self.pending.setdefault(pos, {})[name] = flat[part].clone()

    def _join(self, index: int, layout) -> None:
        for name, where in self._pieces(layout).items():
            parts = [self.pending.get(pos, {}).get(name) for pos, _ in where]
            if where and all(t is not None for t in parts):
                getattr(self, _MEMORIES[name])[index] = torch.cat(parts)
                for pos, _ in where:
                    del self.pending[pos][name]
        self.pending = {pos: pieces for pos, pieces in self.pending.items() if pieces}

    def state_dict(self) -> dict:
        out = {attr: {k: v.clone() for k, v in getattr(self, attr).items()}
               for attr in _MEMORIES.values()}  # fmt: skip
        out["layouts"] = {i: [[pos, list(shape)] for pos, shape in lay]
                          for i, lay in self.layouts.items()}  # fmt: skip
        out["pending"] = {i: {n: t.clone() for n, t in pieces.items()}
                          for i, pieces in self.pending.items()}  # fmt: skip
        kind, keys, pos, has_gauss, gauss = self.rng.get_state()
        # int64, not numpy's uint32: a uint32 tensor does not survive pickling, which
        # gathering the ranks' states for a checkpoint does
        out["rng"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss]
        out["counters"] = [self.iter, self.total_numel_before_compression,
                           self.total_numel_after_compression]  # fmt: skip
        return out

    def load_state_dict(self, state: dict) -> None:
        for attr in _MEMORIES.values():
            setattr(self, attr, {k: v.clone() for k, v in state[attr].items()})
        self.layouts = {i: tuple((pos, tuple(shape)) for pos, shape in lay)
                        for i, lay in state.get("layouts", {}).items()}  # fmt: skip
        self.pending = {i: {n: t.clone() for n, t in pieces.items()}
                        for i, pieces in state.get("pending", {}).items()}  # fmt: skip
        kind, keys, pos, has_gauss, gauss = state["rng"]
        self.rng.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))
        (self.iter, self.total_numel_before_compression,
         self.total_numel_after_compression) = state["counters"]  # fmt: skip


def powersgd_hook(state: PowerSGDRunState, bucket):
    """torch's ``powerSGD_hook``, its memories laid out for ``bucket`` first."""
    state.follow(bucket)
    return powerSGD_hook.powerSGD_hook(state, bucket)

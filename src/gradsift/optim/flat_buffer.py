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

import functools
import weakref

import torch

__all__ = ["FlatBucket", "GradTracker", "build_buckets"]


def _dense_strides(t: torch.Tensor) -> bool:
    """Whether ``t`` covers its memory exactly once (any dim order): contiguous,
    channels_last, a transpose... Such a tensor has a flat view in memory order."""
    dims = sorted((st, size) for st, size in zip(t.stride(), t.shape) if size != 1)
    expected = 1
    for st, size in dims:
        if st != expected:
            return False
        expected *= size
    return True


class GradTracker:
    """Which parameters backward has accumulated a gradient into since ``reset``.

    A zero-filled view cannot tell "no gradient" from "a zero gradient"; torch's
    optimizers skip ``grad=None`` parameters entirely (no weight decay, no momentum),
    so the wrapper must know which parameters backward actually reached. Uses
    ``Tensor.register_post_accumulate_grad_hook``.
    """

    def __init__(self, params) -> None:
        self.touched: set[int] = set()
        self._handles = [p.register_post_accumulate_grad_hook(self._mark) for p in params]

    def _mark(self, p: torch.Tensor) -> None:
        self.touched.add(id(p))

    def reset(self) -> None:
        self.touched.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


class FlatBucket:
    """Parameters of one (device, dtype), their grads and state as flat vectors.

    ``state`` maps a name (``"residual"``, ``"momentum"``) to a flat buffer laid out
    like the gradient; ``offsets[i]`` is where ``params[i]`` starts.

    The flat gradient lives as long as something holds it: the bucket while a step
    runs (``hold_`` ... ``let_go_``), otherwise only the ``p.grad`` views. Dropping
    every view (``zero_grad(set_to_none=True)``, ``model.zero_grad()``) frees it until
    the next step allocates it again, as torch frees gradients between steps; the
    bucket keeps a weak reference only.
    """

    def __init__(self, params, grad: torch.Tensor | None, state, offsets) -> None:
        """``grad``: the zeroed flat buffer, or None where no parameter has a gradient
        yet (the first step allocates it); ``state`` buffers have its layout."""
        self.params: list[torch.Tensor] = params
        self.state: dict[str, torch.Tensor] = state
        self.offsets: list[int] = offsets
        self.data_ptrs = [p.data_ptr() for p in params]  # see ``matches``
        last = params[-1]
        self.numel = offsets[-1] + last.numel()
        self.dtype, self.device = last.dtype, last.device
        self.zero_version = -1  # ``grad._version`` when last zeroed (nothing written since)
        self.generation = 0  # buffers allocated by ``hold_`` (a new one is told from a freed one)
        self.assigned: set[int] = set()  # gradients copied in since the buffer was zeroed
        self._held: torch.Tensor | None = None
        self._ref = None if grad is None else weakref.ref(grad)
        self._views: list | None = None
        self._given: list = [None] * len(params)  # weak refs to the views given as grads

    @functools.cached_property
    def bounds(self) -> torch.Tensor:
        """``offsets`` and ``numel`` on the bucket's device: where each parameter's
        coordinates start and the last ends (made once, not a copy every step)."""
        return torch.tensor([*self.offsets, self.numel], dtype=torch.int64, device=self.device)

    @property
    def grad(self) -> torch.Tensor | None:
        """The flat gradient buffer, or None where it was freed."""
        if self._held is not None:
            return self._held
        return None if self._ref is None else self._ref()

    def hold_(self) -> torch.Tensor:
        """Hold the buffer until ``let_go_``; a freed one is allocated again
        (uninitialised: ``attach_grads_`` or ``zero_`` fill it)."""
        flat = self.grad
        if flat is None:
            flat = torch.empty(self.numel, dtype=self.dtype, device=self.device)
            self._ref, self._views = weakref.ref(flat), None
            self.zero_version, self.generation = -1, self.generation + 1
            self.assigned.clear()
        self._held = flat
        return flat

    def let_go_(self) -> None:
        """Leave the buffer to the gradient views (freed once none is left)."""
        self._held = None

    def drop_if_orphaned_(self, owned: list[bool] | None = None) -> None:
        """Drop a buffer that no ``p.grad`` views any more, so that the next step
        allocates a new one (someone else keeps it alive: their tensor must not
        change, as torch never writes a dropped gradient again). ``owned``:
        ``owns_grad`` of every parameter, where the caller has it already."""
        if owned is None:
            owned = (self.owns_grad(i) for i in range(len(self.params)))
        if self._held is None and not any(owned):
            self._ref = None

    def view(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """The slice of ``flat`` that belongs to ``params[i]``, shaped like it, with its
        strides (a channels_last weight gets a channels_last gradient: torch's
        gradient layout contract, which backward checks)."""
        p = self.params[i]
        part = flat[self.offsets[i] : self.offsets[i] + p.numel()]
        if _dense_strides(p):
            return part.as_strided(p.shape, p.stride())
        return part.view_as(p)

    def give_(self, flat: torch.Tensor, i: int) -> torch.Tensor:
        """Make ``params[i].grad`` its view of ``flat`` (remembered weakly: a view the
        user keeps after dropping it as a gradient must not be written again)."""
        view = self.view(flat, i)
        self.params[i].grad = view
        self._given[i] = weakref.ref(view)
        return view

    def _kept_elsewhere(self, flat: torch.Tensor, owned: list[bool]) -> bool:
        """Whether a view of ``flat`` given as a gradient is alive but no longer its
        parameter's gradient: someone kept it (``kept = p.grad; p.grad = None``)."""
        for i, ref in enumerate(self._given):
            if not owned[i] and ref is not None:
                view = ref()
                if view is not None and view._base is flat:
                    return True
        return False

    def owns_grad(self, i: int) -> bool:
        """Whether ``params[i].grad`` is still the view into ``self.grad``."""
        g, flat = self.params[i].grad, self.grad
        if g is None or flat is None or g._base is not flat:
            return False
        given = self._given[i]
        if given is not None and given() is g:  # the view given, unchanged: the usual case
            return True
        if self._views is None:  # (address, shape, strides) of each view, computed once
            size = flat.element_size()
            self._views = [
                (flat.data_ptr() + o * size, q.shape, self.view(flat, j).stride())
                for j, (q, o) in enumerate(zip(self.params, self.offsets))
            ]
        ptr, shape, stride = self._views[i]
        return (
            g.layout == torch.strided
            and g.data_ptr() == ptr
            and g.shape == shape
            and g.stride() == stride
        )

    def present(self, touched: set[int]) -> list[bool | None]:
        """Which parameters have a gradient this step (call before ``attach_grads_``).

        A gradient that backward reached (``touched``) or that the user assigned is
        present, also once ``attach_grads_`` copied it in (until the buffer is
        zeroed); a view of the buffer nothing wrote into since it was zeroed is not.
        None: an untouched view in a buffer written since it was zeroed, by hand in
        place or by an in-place pass over every gradient (``clip_grad_norm_``,
        ``GradScaler.unscale_``); ``GradSet.attach`` decides those (``nonzero``).
        """
        flat = self.grad
        if flat is None:  # freed: every gradient is backward's or assigned
            return [p.grad is not None for p in self.params]
        written = flat._version != self.zero_version
        out: list[bool | None] = []
        for i, p in enumerate(self.params):
            if p.grad is None:
                out.append(False)
            elif id(p) in touched or i in self.assigned or not self.owns_grad(i):
                out.append(True)
            else:
                out.append(None if written else False)
        return out

    def nonzero(self, which: list[int]) -> list[bool]:
        """Whether the gradient of each of ``params[which]`` holds a non-zero: one
        host sync for all of them."""
        return torch.stack([self.params[i].grad.any() for i in which]).tolist()

    def mark_zeroed(self) -> None:
        self.zero_version = self.grad._version
        self.assigned.clear()

    def matches(self) -> bool:
        """Whether every parameter still has the data it had when the bucket was laid
        out. ``model.to(torch.float64)``, ``model.to("cuda")`` or
        ``model.to(memory_format=torch.channels_last)`` give a parameter new data (a
        new dtype, device or strides): the views (gradients, residuals) must then be
        laid out again. One pointer per parameter: a step checks it more than once.
        """
        return all(p.data_ptr() == ptr for p, ptr in zip(self.params, self.data_ptrs))

    def attach_grads_(self) -> None:
        """Hold the buffer (``hold_``) and point every present ``p.grad`` at its view,
        copying foreign grads in; the slices of parameters whose grad is None are
        zeroed (they keep ``grad=None``).

        Where a view given as a gradient was dropped but kept by someone, the buffer
        moves: a new one takes every gradient (what was written and assigned carried
        over) and the kept view keeps the old one, which torch would never write again.
        """
        owned = [self.owns_grad(i) for i in range(len(self.params))]
        self.drop_if_orphaned_(owned)
        moved, carried = set(), None
        old = self.grad
        if old is not None and self._held is None and self._kept_elsewhere(old, owned):
            moved = {i for i, own in enumerate(owned) if own}
            carried = (old._version != self.zero_version, set(self.assigned))
            self._ref = None  # hold_ allocates the new buffer
            owned = [False] * len(self.params)
        flat = self.hold_()
        # what is written here (zeros where grad is None, copies now in ``assigned``)
        # writes no untouched view: a buffer clean before is clean after (``present``)
        clean = (flat._version == self.zero_version) if carried is None else not carried[0]
        for i, p in enumerate(self.params):
            if owned[i]:
                continue
            view = self.view(flat, i)
            if p.grad is None:
                view.zero_()
            else:  # a sparse gradient is densified: top-k reads every coordinate
                view.copy_(p.grad.to_dense() if p.grad.layout != torch.strided else p.grad)
                self.give_(flat, i)
                if i not in moved:
                    self.assigned.add(i)
        if carried is not None:
            self.assigned |= carried[1]
        if clean:
            self.zero_version = flat._version


def build_buckets(
    params: list[torch.Tensor], *, state: tuple[str, ...] = (), with_grad: set[int] | None = None
) -> list[FlatBucket]:
    """Group ``params`` by (device, dtype) into flat buckets with zeroed ``state``.

    Every existing ``p.grad`` becomes a view of its bucket's buffer (values kept); a
    missing one stays None, as in a fresh torch optimizer (``get_optimizer_state_dict``
    of ``torch.distributed.checkpoint`` initialises the state only then). The first
    step copies backward's gradients in; from then on backward fills the buffer.
    ``with_grad``: the ids of the parameters that have a gradient (None: every
    existing one); the others' views count as not written.
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
        flat_state = {name: torch.zeros(total, device=device, dtype=dtype) for name in state}
        if all(p.grad is None for p in ps):  # no buffer until the first step
            buckets.append(FlatBucket(ps, None, flat_state, offsets))
            continue
        grad = torch.zeros(total, device=device, dtype=dtype)
        bucket = FlatBucket(ps, grad, flat_state, offsets)
        for i, p in enumerate(ps):
            if p.grad is not None:
                g = p.grad.to_dense() if p.grad.layout != torch.strided else p.grad
                bucket.view(grad, i).copy_(g)
                bucket.give_(grad, i)
        bucket.mark_zeroed()
        # gradients, as assigned ones are (also when the buffers are laid out again
        # between assignment and step: a model.to(...) must not lose them)
        has = [p.grad is not None and (with_grad is None or id(p) in with_grad) for p in ps]
        bucket.assigned.update(i for i, h in enumerate(has) if h)
        buckets.append(bucket)
    return buckets

"""The gradients ``TopK`` manages: flat buckets, which gradients are present this
step, the selection over them, and zeroing.

A parameter that backward did not reach has no gradient, as in torch (where its
``grad`` is None and the optimizer skips it: no weight decay, no momentum). Here its
``grad`` is a zeroed view of the flat buffer, so ``GradTracker`` records what
backward reached, and a missing gradient is ``None`` again while the inner optimizer
steps (``absent_as_none``).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from gradsift.budget import Budget
from gradsift.checks import check_finite_grads
from gradsift.optim.error_feedback import sparsify_, sparsify_buckets_, sparsify_tensors_
from gradsift.optim.flat_buffer import FlatBucket, GradTracker, build_buckets
from gradsift.optim.workspace import Workspace
from gradsift.optim.zeroed_outside import ZeroedOutside

__all__ = ["GradSet"]


class GradSet:
    """Flat buckets (one per device and dtype) of ``params`` with ``state_names``
    buffers (residual, momentum), their workspaces and a ``GradTracker``."""

    def __init__(self, params, state_names: tuple[str, ...], touched=(), with_grad=None):
        """``touched``: what backward reached already; ``with_grad``: the ids of the
        parameters that have a gradient (``GradSet.with_grad`` of the set this one
        replaces; None: every ``grad`` that is not None)."""
        self.params = params
        self.state_names = state_names
        self.buckets: list[FlatBucket] = build_buckets(
            params, state=state_names, with_grad=with_grad
        )
        self.ids = {id(p) for p in params}
        self.workspaces = [Workspace() for _ in self.buckets]
        self.tracker = GradTracker(params)
        self.tracker.touched |= set(touched)
        self.sparse = None  # (generation, version, indices) of bucket 0 right after a step
        self.absent: list[torch.Tensor] = []
        self.zeroed = ZeroedOutside()  # outside gradients zero_grad zeroed
        self.flags: list[list[bool]] = []  # per bucket: which parameters have a gradient

    def stale(self) -> bool:
        """Whether a parameter changed dtype, device or strides since (``model.to(...)``)."""
        return not all(b.matches() for b in self.buckets)

    def close(self) -> set[int]:
        """Remove the hooks; return what backward had reached (for a rebuilt set)."""
        self.tracker.remove()
        return set(self.tracker.touched)

    def outside(self, params) -> list[torch.Tensor]:
        """Those of ``params`` with a gradient that are not in the buckets (frozen when
        the buckets were laid out, or with a gradient set by hand), but not one that
        ``zero_outside_`` zeroed and nothing wrote since (``ZeroedOutside``)."""
        held = self.zeroed.holds
        return [p for p in params if p.grad is not None and id(p) not in self.ids and not held(p)]

    def zero_outside_(self, p: torch.Tensor) -> torch.Tensor:
        return self.zeroed.zero_(p)

    def prepare(self, others: list[torch.Tensor], name_of):
        """Attach this step's gradients and check them; return the present ones.

        ``others``: parameters with a gradient that are not in the buckets (frozen,
        ``requires_grad=False``, with a gradient set by hand). Non-finite gradients
        raise before anything changes. Returns the parameters with a gradient and
        whether all of them lie in the buckets.
        """
        present = self.attach()
        flats = [b.grad for b in self.buckets] + [p.grad for p in others]
        check_finite_grads(present + others, flats, name_of)
        return present + others, not others

    def _found(self) -> list[list[bool]]:
        """Per bucket, which parameters have a gradient now (``FlatBucket.present``).

        Untouched views written in place are gradients set in place by hand when no
        gradient of the set came from backward or by assignment; otherwise (an
        in-place pass over every gradient wrote them) present only where non-zero.
        """
        found = [b.present(self.tracker.touched) for b in self.buckets]
        by_hand = not any(f is True for flags in found for f in flags)
        for b, flags in zip(self.buckets, found):
            unsure = [i for i, f in enumerate(flags) if f is None]
            if unsure:
                for i, f in zip(unsure, [True] * len(unsure) if by_hand else b.nonzero(unsure)):
                    flags[i] = f
        return found

    def with_grad(self) -> set[int]:
        """The ids of the parameters that have a gradient now, decided as ``attach``
        decides, without attaching: for the set that replaces this one (buffers laid
        out again between backward and step), which must not count the zero views
        backward did not reach. In a bucket whose parameters got new data
        (``model.to(...)``), the gradients were converted, views included: there an
        untouched one that is neither assigned since zeroed is present where non-zero.
        """
        out = set()
        for b, flags in zip(self.buckets, self._found()):
            stale = not b.matches()
            for i, (p, f) in enumerate(zip(b.params, flags)):
                if f and stale and id(p) not in self.tracker.touched and i not in b.assigned:
                    f = bool(p.grad.to_dense().any())
                if f:
                    out.add(id(p))
        return out

    def attach(self) -> list[torch.Tensor]:
        """Attach this step's gradients to the buffers and record which parameters
        have one (``flags``; ``absent``: zero views backward did not reach); return
        those parameters."""
        present, self.absent, self.flags = [], [], []
        for b, flags in zip(self.buckets, self._found()):
            b.attach_grads_()
            self.flags.append(flags)
            present += [p for p, f in zip(b.params, flags) if f]
            self.absent += [p for p, f in zip(b.params, flags) if not f and p.grad is not None]
        self.absent += self.zeroed.params()
        return present

    def select(self, present, in_buckets: bool, budget: Budget, scope: str, momentum, own):
        """Error feedback and top-k over ``present``; ``(idx, vals, k, n)`` on the flat
        path with one bucket holding every gradient (global scope), else None.

        Several buckets (dtypes) on one device holding every gradient select globally
        in place (``sparsify_buckets_``), ``scope="layer"`` on each parameter's slices;
        anything else concatenates (``sparsify_tensors_``).
        """
        devices = {b.device for b in self.buckets}
        if scope == "global" and in_buckets and len(devices) == 1:
            n = sum(self.present_count(i) for i in range(len(self.buckets)))
            if n == 0:  # no gradient at all: nothing to select
                return None
            k = budget.resolve(n)
            flats = [
                (b.grad, b.state.get("residual"), b.state.get("momentum")) for b in self.buckets
            ]
            with ExitStack() as stack:
                for i in range(len(self.buckets)):
                    stack.enter_context(self.holding_out(i))
                if len(flats) > 1:
                    sparsify_buckets_(
                        flats, k, momentum=momentum or 0.0, workspaces=self.workspaces
                    )
                    return None
                g, r, u = flats[0]
                idx, vals = sparsify_(
                    g,
                    k,
                    residual=r,
                    velocity=u,
                    momentum=momentum or 0.0,
                    workspace=self.workspaces[0],
                )
            return idx, vals, k, n
        if scope == "layer" and in_buckets:
            self._select_each(budget, momentum or 0.0)
            return None
        triples = [(p.grad, own(p, "residual"), own(p, "momentum")) for p in present]
        sparsify_tensors_(triples, budget, scope=scope, momentum=momentum or 0.0)
        return None

    def _select_each(self, budget: Budget, momentum: float) -> None:
        """``scope="layer"``: each parameter with a gradient selects alone, on its
        slices of the buffers (no copy)."""
        for b, flags, workspace in zip(self.buckets, self.flags, self.workspaces):
            r, u = b.state.get("residual"), b.state.get("momentum")
            for p, o, f in zip(b.params, b.offsets, flags):
                if f:
                    part = slice(o, o + p.numel())
                    sparsify_(
                        b.grad[part],
                        budget.resolve(p.numel()),
                        residual=None if r is None else r[part],
                        velocity=None if u is None else u[part],
                        momentum=momentum,
                        workspace=workspace,
                    )

    def present_count(self, i: int) -> int:
        """Coordinates of bucket ``i`` whose parameter has a gradient this step."""
        b = self.buckets[i]
        return sum(p.numel() for p, f in zip(b.params, self.flags[i]) if f)

    @contextmanager
    def holding_out(self, i: int):
        """Run a selection over the whole of bucket ``i`` as one over its parameters
        with a gradient only.

        A parameter without a gradient has zeros in the gradient buffer; its residual
        and velocity slices are set aside and zeroed meanwhile, so that its
        coordinates add 0, decay nothing and rank with the zeros (selected only when
        fewer than k coordinates are non-zero, where they change nothing), and put
        back afterwards, as the selection over the present gradients alone leaves
        them. ``k`` must be resolved on ``present_count(i)``.
        """
        b = self.buckets[i]
        held = [
            flat[o : o + p.numel()]
            for p, o, f in zip(b.params, b.offsets, self.flags[i])
            if not f
            for flat in b.state.values()
        ]
        saved = [t.clone() for t in held]
        for t in held:
            t.zero_()
        try:
            yield
        finally:
            for t, copy in zip(held, saved):
                t.copy_(copy)

    @contextmanager
    def absent_as_none(self):
        """``grad=None`` for parameters without a gradient while the inner optimizer
        steps (so it skips them, as it would without TopK); views back afterwards."""
        absent = self.drop_absent()
        try:
            yield
        finally:
            self.restore_views(absent)

    def drop_absent(self) -> list[torch.Tensor]:
        """This step's parameters without a gradient, their ``grad`` set to None."""
        absent, self.absent = self.absent, []
        for p in absent:
            p.grad = None
        return absent

    def restore_views(self, absent: list[torch.Tensor]) -> None:
        """Point the gradients that are still None back at their zeroed views."""
        for p in absent:
            if not self.zeroed.restore(p) and p.grad is None:
                b, i = self._where(p)
                b.give_(b.grad, i)

    def _where(self, p) -> tuple[FlatBucket, int]:
        for b in self.buckets:
            for i, q in enumerate(b.params):
                if q is p:
                    return b, i
        raise KeyError("parameter not in this set")

    @contextmanager
    def held(self):
        """A step: the buffers that ``attach`` holds are left to the gradient views
        afterwards (see ``FlatBucket``), and what backward reached is forgotten: the
        next step's gradients are the next backward's (zeroing the views elsewhere,
        ``model.zero_grad(set_to_none=False)``, resets nothing here)."""
        try:
            yield
        finally:
            for b in self.buckets:
                b.let_go_()
                b.assigned.clear()
            self.tracker.reset()

    def mark_sparse(self, idx: torch.Tensor) -> None:
        """Until bucket 0's buffer changes again, only ``idx`` may be non-zero in it."""
        b = self.buckets[0]
        self.sparse = (b.generation, b.grad._version, idx)

    def zero_(self, set_to_none: bool) -> None:
        """``set_to_none``: drop every gradient and the buffers (freed until the next
        step). Else zero the buffers (only the k selected coordinates right after a
        step that nothing touched since) and re-point assigned gradients at their
        views."""
        sparse, self.sparse = self.sparse, None
        for i, b in enumerate(self.buckets):
            if set_to_none:
                for p in b.params:
                    p.grad = None
                continue
            b.drop_if_orphaned_()
            if b.grad is None and all(p.grad is None for p in b.params):
                continue  # freed, and nothing to point at it
            flat = b.hold_()
            try:
                if i == 0 and sparse is not None and sparse[:2] == (b.generation, flat._version):
                    flat[sparse[2]] = 0
                else:
                    flat.zero_()
                b.mark_zeroed()
                for j, p in enumerate(b.params):
                    if p.grad is not None and not b.owns_grad(j):
                        b.give_(flat, j)  # an assigned grad: back to the zeroed view
            finally:
                b.let_go_()
        self.tracker.reset()

    def nbytes(self) -> dict[str, int]:
        state = sum(t.numel() * t.element_size() for b in self.buckets for t in b.state.values())
        return {"state": state, "workspace": sum(w.nbytes() for w in self.workspaces)}

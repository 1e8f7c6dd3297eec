"""Top-k sparse updates with error feedback: the ``TopK`` optimizer wrapper.

Each step keeps only the ``k`` largest-magnitude gradient coordinates across the
whole model (``scope="global"``) or within each tensor (``scope="layer"``), zeroes
the rest, and hands the sparse gradient to any ``torch.optim`` optimizer. The maths
(error feedback, DGC momentum correction) is ``gradsift.optim.error_feedback``'s; this class
holds the state and speaks ``torch.optim``'s protocol.

Only plain SGD (no momentum, no weight decay) then changes exactly the selected
coordinates. Momentum, weight decay and adaptive optimizers (Adam) act on every
coordinate, since their state or decay term is dense even when the gradient is not.
``momentum_correction=m`` implements DGC's alternative (Lin et al., "Deep Gradient
Compression", ICLR 2018, arXiv:1712.01887): the velocity is kept locally and it is
the velocity whose top-k is sent.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import torch
from torch.optim import Optimizer

from gradsift.budget import Budget, HasBudget, check_scope
from gradsift.optim.error_feedback import check_momentum_correction
from gradsift.optim.fused import fused_step_
from gradsift.optim.inner import check_inner, check_no_inner_momentum, checked_group
from gradsift.optim.sharded import grad_set
from gradsift.optim.sparse_sgd import apply_sparse_sgd_, plain_sgd
from gradsift.optim.state_dict import load_own_state, state_dict_with_own
from gradsift.optim.wrapper import OptimizerWrapper
from gradsift.select.dispatch import check_backend

__all__ = ["TopK"]

log = logging.getLogger(__name__)


class TopK(HasBudget, OptimizerWrapper):
    """Wrap a ``torch.optim`` optimizer so that each step uses only top-k gradients.

    Args:
        optimizer: the inner optimizer (SGD, Adam, ...); it does the actual update.
        k: coordinates kept per step (globally, or per tensor with ``scope="layer"``).
        density: fraction kept instead of ``k``; exactly one of the two.
        error_feedback: keep dropped gradient mass in ``state[p]["residual"]`` and add
            it back next step (default True).
        scope: ``"global"`` selects across every parameter with a gradient, counting
            shared (tied) parameters once; ``"layer"`` selects within each tensor
            (``"tensor"``, the old name, is deprecated).
        momentum_correction: DGC's momentum correction (Sec. 3.2): keep a local
            velocity ``u = m u + g`` in ``state[p]["momentum"]``, select on the
            accumulated velocity, and zero ``u`` where a coordinate was sent (momentum
            factor masking). Needs ``error_feedback`` and an inner optimizer without
            momentum, which it replaces.
        backend: ``"auto"`` (default: the fused GPU kernels for CUDA gradients when
            triton imports, else the torch path), ``"torch"`` or ``"triton"``. The fused
            plain SGD step makes no host sync: a non-finite gradient skips it, setting
            ``found_nonfinite`` (a device bool); other inner optimizers read it, raise.

    Order within a step: ``loss.backward()``, optionally ``scaler.unscale_(opt)`` and
    ``clip_grad_norm_`` (these see the raw gradient), then ``opt.step()``, which adds
    residuals, selects and calls the inner optimizer. With ``GradScaler``,
    ``scaler.step(opt)`` skips the whole step on inf/NaN, leaving residuals untouched.
    Outside GradScaler a non-finite gradient raises ``gradsift.NonFiniteGradError`` (a
    ``ValueError``) before anything is modified (the fused plain SGD step skips instead).

    Speed: gradients live in one flat buffer per (device, dtype) and each ``p.grad`` is
    a view into it from the first step on, so backward accumulates straight into the
    vector that is searched.
    ``zero_grad()`` therefore defaults to ``set_to_none=False`` (zeroing the buffer in
    one pass and keeping the views). ``set_to_none=True``, ``model.zero_grad()`` or
    assigning ``p.grad`` all stay correct: foreign gradients are copied back in at the
    next step, at the cost of that copy. Memory: dropping every gradient
    (``zero_grad(set_to_none=True)``, ``model.zero_grad()``) frees the buffer until the
    next step, as torch frees gradients, so between steps TopK holds only its
    residuals (and velocities); the default keeps one gradient's bytes through the
    forward pass, as ``set_to_none=False`` does in torch. The global selection runs in
    place on the buffers, several dtypes included (each accumulates error feedback in
    its own dtype, as a model of one dtype does); parameters without a gradient this
    step are held out of it.

    ``state_dict()`` is the inner optimizer's plus the residuals (and velocities), so
    checkpoints resume bit for bit. The inner optimizer's own state is
    ``opt.optimizer.state``. ``opt.state`` is empty until the first step or load, as
    a torch optimizer's is (``get_optimizer_state_dict`` then initialises both).
    """

    def __init__(
        self,
        optimizer: Optimizer,
        *,
        k: int | None = None,
        density: float | None = None,
        error_feedback: bool = True,
        scope: str = "global",
        momentum_correction: float | None = None,
        backend: str = "auto",
    ) -> None:
        if isinstance(optimizer, TopK):
            raise TypeError("optimizer is already a TopK: wrap the inner optimizer once")
        self.budget = Budget(k=k, density=density)
        self.scope = check_scope(scope)
        self.momentum_correction = check_momentum_correction(momentum_correction)
        check_inner(
            optimizer,
            momentum_correction=self.momentum_correction,
            error_feedback=error_feedback,
        )
        self._wrap(optimizer)
        self.backend = check_backend(backend, {p.device for p in self._params()})
        self.found_nonfinite = None
        self.fallback_steps = 0  # steps the fused GPU path did not cover
        self._fallbacks_logged: set[str] = set()
        self._fused = None
        self.error_feedback = bool(error_feedback)
        # _own_state holds residuals (velocities) from the start; ``state`` shows them
        # from the first step or load on (see the class doc)
        self._own_state: defaultdict[torch.Tensor, dict] = defaultdict(dict)
        self.state: defaultdict[torch.Tensor, dict] = defaultdict(dict)
        self._build()

    _transient = ("_grads", "_fused", "found_nonfinite")  # rebuilt after a copy

    def _after_copy(self) -> None:
        self._build()  # the residuals (and momenta) carried into new buffers

    def __repr__(self) -> str:
        ef = f"error_feedback={self.error_feedback}, scope={self.scope!r}"
        return f"TopK({self.optimizer!r}, {self.budget}, {ef})"

    def _state_names(self) -> tuple[str, ...]:
        names = ("residual",) if self.error_feedback else ()
        return names + (("momentum",) if self.momentum_correction is not None else ())

    def _params(self) -> list[torch.Tensor]:
        """Every parameter once, in param-group order (a tied weight counts once)."""
        every = {id(p): p for group in self.param_groups for p in group["params"]}
        return list(every.values())

    def _build(self) -> None:
        """Flat buffers for the trainable parameters; existing state is carried over
        (converted when ``model.to(...)`` changed a parameter's dtype or device)."""
        old = {p: {n: t.clone() for n, t in st.items()} for p, st in self._own_state.items()}
        trainable = [p for p in self._params() if p.requires_grad]
        with_grad = touched = {id(p) for p in trainable if p.grad is not None}
        if getattr(self, "_grads", None) is not None:
            # what backward reached and which gradients exist (not the zero views it
            # did not reach), and the gradients of parameters new to the set
            # (add_param_group between backward and step): no hook saw those
            new = {i for i in touched if i not in self._grads.ids}
            with_grad = self._grads.with_grad() | new
            touched = self._grads.close() | new
        # k beyond what one selection sees: an error, not a dense step; complex refused
        self.budget.check_params(trainable, self.scope, self._name)
        # FSDP2 (DTensor parameters): no flat buckets, the gradients stay FSDP's
        self._grads = grad_set(trainable, self._state_names(), touched, self._own_state, with_grad)
        self._contiguous = all(p.is_contiguous() for p in trainable)
        self._frozen = [p for p in self._params() if not p.requires_grad]  # see _refresh
        for b in self._grads.buckets:
            for i, p in enumerate(b.params):
                for name, flat in b.state.items():
                    self._own_state[p][name] = b.view(flat, i)
                    if name in old.get(p, {}):
                        self._own_state[p][name].copy_(old[p][name])

    def add_param_group(self, param_group: dict) -> None:
        param_group = checked_group(param_group, self.defaults, self.momentum_correction)
        self.optimizer.add_param_group(param_group)
        self._build()

    def _own(self, p: torch.Tensor, name: str) -> torch.Tensor | None:
        if name not in self._state_names():
            return None
        st = self._own_state[p]
        if name not in st:  # a frozen parameter given a gradient by hand
            st[name] = torch.zeros_like(p)
        return st[name]

    @torch.no_grad()
    def sparsify_(self):
        """Apply error feedback and top-k selection to the current gradients.

        Returns ``(indices, values)`` into the flat gradient on the flat path (one
        bucket holding every gradient, global scope), else None. Parameters without a
        gradient this step are held out of the selection; where fewer than k
        coordinates are non-zero, indices into their slices may come back, with 0.
        """
        self._refresh()
        with self._grads.held():
            selected = self._sparsify()
        return None if selected is None else selected[:2]

    def _refresh(self) -> None:
        """Lay the buffers out again where a parameter changed dtype, device or strides
        (``model.to(...)``), or one that was frozen when they were laid out has a
        gradient now (unfrozen: it joins a bucket, its state carried over)."""
        check_no_inner_momentum(self.param_groups, self.momentum_correction)  # schedulers
        self.state = self._own_state
        if self._grads.stale() or any(p.grad is not None and p.requires_grad for p in self._frozen):
            self._build()

    def _sparsify(self):
        others = self._grads.outside(self._params())
        present, in_buckets = self._grads.prepare(others, self._name)
        return self._grads.select(
            present, in_buckets, self.budget, self.scope, self.momentum_correction, self._own
        )

    @torch.no_grad()
    def step(self, closure=None):
        """Sparsify the gradients (see ``sparsify_``), then step the inner optimizer.

        Parameters that got no gradient are ``grad=None`` for the inner step, so it
        skips them as it would without TopK. When the inner optimizer is plain SGD (no
        momentum, weight decay or hooks) and not every coordinate is kept, the update
        is applied to the selected coordinates only: its dense step on the sparse
        gradient (up to one rounding of ``lr * g``, see ``gradsift.optim.sparse_sgd``),
        without the dense pass. A ``closure`` is passed on to the inner optimizer
        (LBFGS evaluates it several times), each evaluation followed by the selection.
        """
        self._refresh()
        with self._grads.held():
            if closure is not None:
                return self._step_with_closure(closure)
            if fused_step_(self):
                return None
            selected = self._sparsify()
            if selected is not None:  # before the inner step: one that writes p.grad
                self._grads.mark_sparse(selected[0])  # (SGD foreach nesterov) is seen
            full = selected is None or selected[2] >= selected[3]
            lrs = None if full else self._sparse_sgd_lrs()
            if lrs is not None:
                apply_sparse_sgd_(self._grads.buckets[0], lrs, *selected[:2])
            else:
                with self._grads.absent_as_none():
                    self.optimizer.step()
        return None

    def _sparse_sgd_lrs(self) -> list[float] | None:
        """The learning rate of each parameter of the first bucket, in bucket order,
        where the update may be applied to the selected coordinates only (contiguous
        parameters, plain SGD inside); None where the inner optimizer must step."""
        if not (self._contiguous and plain_sgd(self.optimizer)):
            return None
        lr_of = {id(q): g["lr"] for g in self.param_groups for q in g["params"]}
        return [lr_of[id(p)] for p in self._grads.buckets[0].params]

    def _step_with_closure(self, closure):
        """The inner step with a closure: each evaluation's gradients are selected,
        and those backward did not reach are None while the inner optimizer reads
        them (known only once the closure has run)."""
        absent = []

        def sparse_closure():
            with torch.enable_grad():
                loss = closure()
            self._sparsify()
            absent.extend(self._grads.drop_absent())
            return loss

        try:
            return self.optimizer.step(sparse_closure)
        finally:
            self._grads.restore_views(absent)

    @torch.no_grad()
    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero gradients; by default keep them as views of the flat buffer (fast).
        A sharded (FSDP2) model's become None, whatever ``set_to_none`` says."""
        if self._grads.stale():
            self._build()
        self._grads.zero_(set_to_none)
        for p in self._grads.outside(self._params()):
            p.grad = None if set_to_none else self._grads.zero_outside_(p)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes held beyond parameters and gradients: ``state``, ``workspace``."""
        return self._grads.nbytes()

    def state_dict(self) -> dict:
        """The inner optimizer's state dict, with ``residual`` (and ``momentum``) added."""
        if self._grads.stale():  # model.to(...) since the last step: the state follows
            self._build()
        return self._with_state_dict_hooks(
            lambda: state_dict_with_own(self.optimizer, self._own_state, self._state_names())
        )

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the inner optimizer, residuals and momenta (bit for bit)."""

        def load(sd: dict) -> None:
            check_no_inner_momentum(sd["param_groups"], self.momentum_correction)
            if self._grads.stale():  # into buffers of the parameters' dtype and device
                self._build()
            load_own_state(self.optimizer, self._own_state, sd, self._state_names())
            self.state = self._own_state

        self._with_load_state_dict_hooks(state_dict, load)

"""Top-k sparse updates with error feedback: the ``TopK`` optimizer wrapper.

Each step keeps only the ``k`` largest-magnitude gradient coordinates across the
whole model (``scope="global"``) or within each tensor (``scope="tensor"``), zeroes
the rest, and hands the sparse gradient to any ``torch.optim`` optimizer.

Error feedback (Seide et al. 2014; Stich et al., "Sparsified SGD with Memory",
NeurIPS 2018, arXiv:1809.07599; Lin et al., "Deep Gradient Compression", ICLR 2018,
arXiv:1712.01887) keeps what was dropped and adds it back next step:

    a_t = g_t + r_t,    s_t = top_k(a_t),    r_{t+1} = a_t - s_t,

so that ``s_t + r_{t+1} == g_t + r_t`` exactly: dropped mass is delayed, never lost.

Only plain SGD (no momentum, no weight decay) then changes exactly the selected
coordinates. Momentum, weight decay and adaptive optimizers (Adam) act on every
coordinate, since their state or decay term is dense even when the gradient is not.
``momentum_correction=m`` implements DGC's alternative: the velocity is kept locally
and it is the velocity whose top-k is sent.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, defaultdict
from collections.abc import Iterable

import torch
from torch.optim import Optimizer

from gradsift.flat import FlatBucket, build_buckets
from gradsift.select import (
    BLOCK,
    CHUNK,
    block_key_dtype,
    block_keys,
    topk_from_block_keys,
    topk_indices,
)

__all__ = ["TopK", "sparsify_grads_", "resolve_k", "plain_sgd"]

log = logging.getLogger(__name__)

_SCOPES = ("global", "tensor")


_OWN_STATE = ("residual", "momentum")  # per-parameter state TopK keeps itself


def _check_momentum_correction(m, optimizer: Optimizer, error_feedback: bool) -> None:
    if m is None:
        return
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 <= m < 1.0:
        raise ValueError(f"momentum_correction must be a float in [0, 1), got {m!r}")
    if not error_feedback:
        raise ValueError("momentum_correction needs error_feedback=True (DGC accumulates u)")
    if any(g.get("momentum", 0) for g in optimizer.param_groups):
        raise ValueError(
            "momentum_correction replaces the inner optimizer's momentum: set its momentum=0"
        )


def check_k_density(k: int | None, density: float | None) -> None:
    """Exactly one of ``k`` (a positive int) and ``density`` (in (0, 1]) is given."""
    if (k is None) == (density is None):
        raise ValueError("give exactly one of k= (coordinates kept) or density= (fraction kept)")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, int):
            raise TypeError(f"k must be an int, got {type(k).__name__}")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
    else:
        if isinstance(density, bool) or not isinstance(density, (int, float)):
            raise TypeError(f"density must be a float, got {type(density).__name__}")
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must be in (0, 1], got {density}")


def resolve_k(n: int, *, k: int | None = None, density: float | None = None) -> int:
    """Coordinates kept out of ``n``: ``min(k, n)``, or ``round(density * n)`` (>= 1)."""
    if k is not None:
        return min(k, n)
    return min(n, max(1, round(density * n)))


def _check_scope(scope: str) -> None:
    if scope not in _SCOPES:
        raise ValueError(f"scope must be one of {_SCOPES}, got {scope!r}")


@torch.no_grad()
def sparsify_grads_(
    params: Iterable[torch.Tensor],
    *,
    k: int | None = None,
    density: float | None = None,
    residuals: list[torch.Tensor] | None = None,
    scope: str = "global",
) -> int:
    """Keep only the top-k ``|grad (+ residual)|`` coordinates of ``params``, in place.

    The functional core of ``TopK`` for people who write their own update. Parameters
    whose ``grad`` is None are skipped (their residual is untouched). With
    ``residuals`` (one tensor per parameter, like it), error feedback is applied:
    ``a = grad + residual``, ``grad <- top_k(a)``, ``residual <- a - top_k(a)``.

    Returns the number of coordinates kept.
    """
    check_k_density(k, density)
    _check_scope(scope)
    params = list(params)
    if residuals is not None and len(residuals) != len(params):
        raise ValueError(f"residuals must match params: {len(residuals)} vs {len(params)}")
    pairs = [
        (p.grad, None if residuals is None else residuals[i])
        for i, p in enumerate(params)
        if p.grad is not None
    ]
    if not pairs:
        return 0
    if scope == "tensor":
        return sum(_sparsify_group_([pair], k, density) for pair in pairs)
    devices = {g.device for g, _ in pairs}
    if len(devices) > 1:
        raise ValueError(f"scope='global' needs one device, got {sorted(map(str, devices))}")
    return _sparsify_group_(pairs, k, density)


def _sparsify_group_(pairs, k, density) -> int:
    """Global top-k over a list of (grad, residual or None), via one concatenation."""
    dtype = pairs[0][0].dtype
    for g, _ in pairs:
        dtype = torch.promote_types(dtype, g.dtype)
    acc = torch.cat([g.reshape(-1).to(dtype) for g, _ in pairs])
    if pairs[0][1] is not None:
        acc += torch.cat([r.reshape(-1).to(dtype) for _, r in pairs])
    kept_k = resolve_k(acc.numel(), k=k, density=density)
    idx = topk_indices(acc, kept_k)
    kept = torch.zeros_like(acc)
    kept[idx] = acc[idx]
    acc[idx] = 0  # now the remainder a - top_k(a)
    offset = 0
    for g, r in pairs:
        n = g.numel()
        g.copy_(kept[offset : offset + n].view_as(g))
        if r is not None:
            r.copy_(acc[offset : offset + n].view_as(r))
        offset += n
    return kept_k


@torch.no_grad()
def _fused_sparsify_(grad, residual, k, keys, scratch=None):
    """Global top-k of one flat buffer, with error feedback fused into one pass.

    Chunk by chunk, while the chunk is in cache: ``r += g``, block keys of ``r`` (the
    gradient chunk, about to be zeroed, lends its memory as scratch), ``g = 0``. Then
    only the few hot blocks are read to select, and the k winners move from the
    residual to the gradient. Memory traffic: about one pass; no extra buffers but
    ``keys`` (1/32 of the gradient). Without error feedback ``scratch`` is needed.

    Returns ``(indices, values)`` of the kept coordinates, indices ascending.
    """
    src = grad if residual is None else residual
    nbody = keys.numel() * BLOCK
    key_dtype = block_key_dtype(grad.dtype)
    for s in range(0, grad.numel(), CHUNK):
        g = grad[s : s + CHUNK]
        end = min(s + CHUNK, nbody)
        if residual is not None:
            residual[s : s + CHUNK].add_(g)
            if s < nbody:
                block_keys(
                    src[s:end], out=keys[s // BLOCK : end // BLOCK], scratch=g.view(key_dtype)
                )
            g.zero_()
        elif s < nbody:
            block_keys(src[s:end], out=keys[s // BLOCK : end // BLOCK], scratch=scratch)
    idx = topk_from_block_keys(src, k, keys)
    # index_select / index_fill_ / index_copy_: on CPU several times faster than
    # advanced indexing (``src[idx]``, ``r[idx] = 0``) for a few thousand indices
    vals = torch.index_select(src, 0, idx)
    if residual is None:
        grad.zero_()
    else:
        residual.index_fill_(0, idx, 0)
    grad.index_copy_(0, idx, vals)
    return idx, vals


def plain_sgd(opt: Optimizer) -> bool:
    """Whether ``opt.step()`` is exactly ``p -= lr * grad`` with no hooks to run."""
    from torch.optim import optimizer as optimizer_module

    hooks = (
        opt._optimizer_step_pre_hooks,
        opt._optimizer_step_post_hooks,
        optimizer_module._global_optimizer_pre_hooks,
        optimizer_module._global_optimizer_post_hooks,
    )
    return (
        type(opt) is torch.optim.SGD
        and not any(hooks)
        and all(
            g["momentum"] == 0
            and g["weight_decay"] == 0
            and not g["maximize"]
            and not g.get("differentiable", False)
            and not isinstance(g["lr"], torch.Tensor)
            for g in opt.param_groups
        )
    )


def _apply_sparse_sgd_(bucket: FlatBucket, lrs: list[float], idx, vals) -> None:
    """``p -= lr * g`` on the selected coordinates only; ``idx`` is sorted ascending.

    Equal to the inner SGD step on the sparse gradient (zeros change nothing), without
    reading and writing every parameter.
    """
    bounds = torch.tensor(bucket.offsets + [bucket.grad.numel()], device=idx.device)
    cuts = torch.searchsorted(idx, bounds).tolist()
    for i, p in enumerate(bucket.params):
        lo, hi = cuts[i], cuts[i + 1]
        if lo < hi:
            local = idx[lo:hi] - bucket.offsets[i]
            p.data.view(-1).index_add_(0, local, vals[lo:hi], alpha=-lrs[i])


class TopK(Optimizer):
    """Wrap a ``torch.optim`` optimizer so that each step uses only top-k gradients.

    Args:
        optimizer: the inner optimizer (SGD, Adam, ...); it does the actual update.
        k: coordinates kept per step (globally, or per tensor with ``scope="tensor"``).
        density: fraction kept instead of ``k``; exactly one of the two.
        error_feedback: keep dropped gradient mass in ``state[p]["residual"]`` and add
            it back next step (default True).
        scope: ``"global"`` selects across every parameter with a gradient, counting
            shared (tied) parameters once; ``"tensor"`` selects within each tensor.
        momentum_correction: DGC's momentum correction (Lin et al. 2018, Sec. 3.2): keep
            a local velocity ``u = m u + g`` in ``state[p]["momentum"]``, select on the
            accumulated velocity, and zero ``u`` where a coordinate was sent (momentum
            factor masking). Needs ``error_feedback`` and an inner optimizer without
            momentum, which it replaces.

    Order within a step: ``loss.backward()``, optionally ``scaler.unscale_(opt)`` and
    ``clip_grad_norm_`` (these see the raw gradient), then ``opt.step()``, which adds
    residuals, selects and calls the inner optimizer. With ``GradScaler``,
    ``scaler.step(opt)`` skips the whole step on inf/NaN, leaving residuals untouched.
    Outside GradScaler a non-finite gradient raises ``ValueError`` before anything is
    modified.

    Speed: gradients live in one flat buffer per (device, dtype) and each ``p.grad`` is
    a view into it, so backward accumulates straight into the vector that is searched.
    ``zero_grad()`` therefore defaults to ``set_to_none=False`` (zeroing the buffer in
    one pass and keeping the views). ``set_to_none=True``, ``model.zero_grad()`` or
    assigning ``p.grad`` all stay correct: foreign gradients are copied back in at the
    next step, at the cost of that copy.

    ``state[p]["residual"]`` holds the error-feedback memory; ``state_dict()`` is the
    inner optimizer's plus these residuals, so checkpoints resume bit for bit. The
    inner optimizer's own state is ``opt.optimizer.state``.
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
    ) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer)}")
        check_k_density(k, density)
        _check_scope(scope)
        _check_momentum_correction(momentum_correction, optimizer, error_feedback)
        self.optimizer = optimizer
        self.k, self.density = k, density
        self.error_feedback = bool(error_feedback)
        self.scope = scope
        self.momentum_correction = momentum_correction
        for name in (
            "_optimizer_step_pre_hooks",
            "_optimizer_step_post_hooks",
            "_optimizer_state_dict_pre_hooks",
            "_optimizer_state_dict_post_hooks",
            "_optimizer_load_state_dict_pre_hooks",
            "_optimizer_load_state_dict_post_hooks",
        ):
            setattr(self, name, OrderedDict())
        self._patch_step_function()
        self.state: defaultdict[torch.Tensor, dict] = defaultdict(dict)
        self._build()

    # The inner optimizer owns param_groups and defaults; always read them live,
    # since its load_state_dict replaces the param_groups list.
    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict) -> None:
        self.optimizer.defaults = value

    def __repr__(self) -> str:
        size = f"k={self.k}" if self.k is not None else f"density={self.density}"
        return (
            f"TopK({self.optimizer!r}, {size}, error_feedback={self.error_feedback}, "
            f"scope={self.scope!r})"
        )

    def _params(self) -> list[torch.Tensor]:
        seen, out = set(), []
        for group in self.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def _build(self) -> None:
        old = {p: st["residual"].clone() for p, st in self.state.items() if "residual" in st}
        trainable = [p for p in self._params() if p.requires_grad]
        self._buckets: list[FlatBucket] = build_buckets(trainable, residuals=self.error_feedback)
        self._bucketed = {id(p) for p in trainable}
        self._sparse = None
        self._contiguous = all(p.is_contiguous() for p in trainable)
        self._scratch = None
        if len(self._buckets) == 1 and not self.error_feedback:
            # with error feedback the gradient chunk being zeroed serves as scratch
            g = self._buckets[0].grad
            self._scratch = torch.empty(
                min(CHUNK, g.numel()), dtype=block_key_dtype(g.dtype), device=g.device
            )
        self._keys = [
            torch.empty(
                b.grad.numel() // BLOCK, dtype=block_key_dtype(b.grad.dtype), device=b.grad.device
            )
            for b in self._buckets
        ]
        for b in self._buckets:
            for i, p in enumerate(b.params):
                if self.error_feedback:
                    self.state[p]["residual"] = b.view(b.residual, i)
                    if p in old:
                        self.state[p]["residual"].copy_(old[p])

    def add_param_group(self, param_group: dict) -> None:
        self.optimizer.add_param_group(param_group)
        self._build()

    def _residual(self, p: torch.Tensor) -> torch.Tensor:
        st = self.state[p]
        if "residual" not in st:  # a parameter that was frozen when we were built
            st["residual"] = torch.zeros_like(p)
        return st["residual"]

    def _name(self, p: torch.Tensor) -> str:
        for gi, group in enumerate(self.param_groups):
            for i, q in enumerate(group["params"]):
                if q is p:
                    names = group.get("param_names")
                    where = names[i] if names else f"param_groups[{gi}]['params'][{i}]"
                    return f"{where} (shape {tuple(p.shape)})"
        return f"parameter of shape {tuple(p.shape)}"

    def _check_finite(self, params: list[torch.Tensor]) -> None:
        # one fast reduction per bucket; the per-tensor scan runs only on failure
        if all(bool(torch.isfinite(b.grad.sum())) for b in self._buckets) and all(
            bool(torch.isfinite(p.grad.sum())) for p in params if not self._in_bucket(p)
        ):
            return
        for p in params:
            bad = int((~torch.isfinite(p.grad)).sum())
            if bad:
                raise ValueError(
                    f"gradient of {self._name(p)} has {bad} non-finite entries; nothing "
                    "was modified. Use torch.amp.GradScaler (which skips such steps) or "
                    "find the source of the inf/NaN."
                )

    def _in_bucket(self, p: torch.Tensor) -> bool:
        return id(p) in self._bucketed

    @torch.no_grad()
    def sparsify_(self):
        """Apply error feedback and top-k selection to the current gradients.

        Returns ``(indices, values)`` into the flat gradient on the fused path (one
        bucket, global scope, every gradient present), else None.
        """
        complete = [b.attach_grads_() for b in self._buckets]
        params = [p for p in self._params() if p.grad is not None]
        self._check_finite(params)
        if self.momentum_correction is not None:
            self._accumulate_momentum_(params)
        fast = (
            self.scope == "global"
            and len(self._buckets) == 1
            and complete[0]
            and len(params) == len(self._buckets[0].params)
        )
        if fast:
            b = self._buckets[0]
            k = resolve_k(b.grad.numel(), k=self.k, density=self.density)
            selected = _fused_sparsify_(b.grad, b.residual, k, self._keys[0], self._scratch)
        else:
            residuals = [self._residual(p) for p in params] if self.error_feedback else None
            sparsify_grads_(
                params, k=self.k, density=self.density, residuals=residuals, scope=self.scope
            )
            selected = None
        if self.momentum_correction is not None:
            # momentum factor masking (DGC Sec. 3.2): a sent coordinate restarts
            for p in params:
                self.state[p]["momentum"].masked_fill_(p.grad != 0, 0.0)
        return selected

    @torch.no_grad()
    def _accumulate_momentum_(self, params: list[torch.Tensor]) -> None:
        """DGC momentum correction: ``u = m u + g`` locally; ``u`` is what is selected."""
        for p in params:
            st = self.state[p]
            if "momentum" not in st:
                st["momentum"] = torch.zeros_like(p)
            st["momentum"].mul_(self.momentum_correction).add_(p.grad)
            p.grad.copy_(st["momentum"])

    def step(self, closure=None):
        """Sparsify the gradients (see ``sparsify_``), then step the inner optimizer.

        When the inner optimizer is plain SGD (no momentum, weight decay or hooks),
        the update is applied to the selected coordinates only, which is the same
        result as its dense step on the sparse gradient, without the dense pass.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        selected = self.sparsify_()
        if selected is not None and self._contiguous and plain_sgd(self.optimizer):
            lr_of = {id(q): g["lr"] for g in self.param_groups for q in g["params"]}
            b = self._buckets[0]
            _apply_sparse_sgd_(b, [lr_of[id(p)] for p in b.params], *selected)
        else:
            self.optimizer.step()
        if selected is not None:
            # until the buffer changes again, only these coordinates are non-zero
            self._sparse = (self._buckets[0].grad._version, selected[0])
        return loss

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero gradients; by default keep them as views of the flat buffer (fast).

        Right after a fused step only the k selected coordinates are non-zero; if the
        buffer's version counter shows nothing touched it since, only they are zeroed.
        """
        sparse, self._sparse = self._sparse, None
        for i, b in enumerate(self._buckets):
            if i == 0 and sparse is not None and sparse[0] == b.grad._version:
                b.grad[sparse[1]] = 0
            else:
                b.grad.zero_()
        for b in self._buckets:
            for i, p in enumerate(b.params):
                if set_to_none:
                    p.grad = None
                elif p.grad is not None and not b.owns_grad(i):
                    p.grad = b.view(b.grad, i)  # an assigned grad: back to the zeroed view
        for p in self._params():
            if p.grad is not None and not self._in_bucket(p):
                p.grad = None if set_to_none else p.grad.zero_()

    def state_dict(self) -> dict:
        """The inner optimizer's state dict, with ``residual`` (and ``momentum``) added."""
        sd = self.optimizer.state_dict()
        index = {id(p): i for i, p in enumerate(self._all_params_in_order())}
        state = dict(sd["state"])
        for p, st in self.state.items():
            own = {key: st[key].clone() for key in _OWN_STATE if key in st}
            if own:
                i = index[id(p)]
                # a new dict: the inner state_dict shares its per-param dicts with .state
                state[i] = {**state.get(i, {}), **own}
        return {
            **sd,
            "state": state,
            "topk": {
                "k": self.k,
                "density": self.density,
                "error_feedback": self.error_feedback,
                "scope": self.scope,
                "momentum_correction": self.momentum_correction,
            },
        }

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the inner optimizer, residuals and momenta (bit for bit)."""
        state = {i: dict(st) for i, st in state_dict["state"].items()}
        own = {i: {key: st.pop(key) for key in _OWN_STATE if key in st} for i, st in state.items()}
        inner = {key: v for key, v in state_dict.items() if key != "topk"}
        inner["state"] = {i: st for i, st in state.items() if st}
        self.optimizer.load_state_dict(inner)
        params = self._all_params_in_order()
        for i, saved in own.items():
            p = params[int(i)]
            for key, value in saved.items():
                if key in self.state[p]:  # the residual is a view into the flat buffer
                    self.state[p][key].copy_(value)
                else:
                    self.state[p][key] = value.to(device=p.device, dtype=p.dtype).clone()

    def _all_params_in_order(self) -> list[torch.Tensor]:
        # the order torch.optim.Optimizer.state_dict uses for its integer keys
        return [p for group in self.param_groups for p in group["params"]]

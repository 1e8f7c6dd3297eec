"""``TopKHookState``: the top-k hook's hyper-parameters, error-feedback memory and
traffic counters, and ``compress_``: what one rank sends for one step.

Per step, over the whole model seen as one vector ``g`` (all DDP buckets together,
parameters in one canonical order, so that selection and the stored state do not
depend on DDP's bucket layout), on each rank::

    g <- g * min(1, c / (sqrt(W) ||g||))      local clipping (DGC Sec. 3.3, optional)
    u <- m u + g ; a = r + u   (or a = r + g) momentum correction (optional), feedback
    S = top_k(|a|)                            gradsift.optim.error_feedback: exact
    r <- a with S zeroed ; u <- u with S zeroed
    q = round(a[S]) to value_dtype ; r[S] = a[S] - q   (the rounding error is kept)

so that ``decoded(q) + r_new == a`` exactly. The hook state follows
``powerSGDState``: ``__slots__``, dense allreduce for the first ``start_iter``
iterations. Residuals are stored as one vector keyed by the parameters'
``(bucket index, position)`` in DDP's initial layout, which any fresh DDP of the same
model reproduces; a state that does not match the model is an error, never reset.
A state serves one model: once it has run a step, a parameter it has not seen (a new
model's, in a second run in the same process) is an error, since its residual would
go into the other model's gradient. A new DDP around the same module is the same
model; to resume, load the saved state into a new ``TopKHookState``.

The state is **per rank**: each rank's residual is its own unsent gradient. The saved
state names the rank and world size that saved it, and the hook's first exchange
after a load fails every rank at once when a rank holds another rank's state, or a
state of another world size (``load_state_dict(..., reshard=True)`` takes it anyway,
restarting the error-feedback memory at zero).
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from gradsift.budget import Budget, HasBudget
from gradsift.checks import check_choice, check_float, check_int
from gradsift.distributed import encoding as wire
from gradsift.distributed.loss_scale import rescale_for_grad_scaler_
from gradsift.distributed.rounding import round_for_wire
from gradsift.distributed.warmup import check_schedule, density_at
from gradsift.optim.error_feedback import check_momentum_correction, sparsify_
from gradsift.optim.workspace import Workspace

__all__ = ["TopKHookState", "compress_", "compress_into_", "match_layout_", "message_bytes"]

_SAVED = (
    "iter", "bytes_sent", "bytes_dense", "residual", "velocity", "layout", "scale",
    "rank", "world_size",
)  # fmt: skip
# what a pickled state leaves behind: objects of this process, remade on unpickling;
# the GradScaler is the user's to set again (the hook refuses to go on without it)
_THIS_PROCESS = (
    "process_group", "grad_scaler", "_keys", "_keyed_at", "_workspace", "_stash", "_flat",
)  # fmt: skip


class TopKHookState(HasBudget):
    """Hyper-parameters, error-feedback memory and traffic counters of ``topk_hook``.

    Args:
        density: fraction of the model's coordinates sent per step (or ``k``).
        error_feedback: keep unsent mass in the residual (default True).
        start_iter: iterations of plain allreduce before compressing.
        dense_if_larger: allreduce densely when the bytes model of
            ``gradsift.distributed.cost`` says sparse would move more.
        process_group: the group to communicate in (default: the world).
        encoding: wire format, ``gradsift.distributed.encoding`` (default ``"auto"``).
        value_dtype: send values as ``torch.bfloat16``/``torch.float16`` (the rounding
            error stays in the residual; a value beyond the largest one finite in both
            the gradient's dtype and this sends at most that, the rest stays for the
            steps after) or as the gradient's dtype (None).
        momentum_correction: DGC momentum ``m``; the inner optimizer then has none.
        warmup: a density schedule, ``gradsift.distributed.warmup`` (``dgc_warmup``).
        clip_norm: DGC's local gradient clipping at ``clip_norm / sqrt(world)``.
        grad_scaler: the ``torch.amp.GradScaler`` scaling the loss: the residual is
            rescaled when its scale changes (exactly with GradScaler's default growth
            and backoff factors, 2 and 0.5: a power of two).
        find_unused_parameters: set it as DDP's: a parameter whose gradient is zero
            on every rank in a step is held out of that step's selection
            (``gradsift.distributed.unused``), since DDP drops what the hook hands back
            for a parameter no rank used.

    ``bytes_sent`` counts what this rank sent, ``bytes_dense`` what DDP's allreduce
    would have (in the parameters' dtypes); ``compression_ratio``: their quotient.

    ``rank`` and ``world_size``: those of the process that ran (or saved) the state,
    None until known. Checkpoint it per rank (``f"hook_rank{dist.get_rank()}.pt"``).
    """

    __slots__ = (
        "budget", "error_feedback", "start_iter", "dense_if_larger", "process_group",
        "encoding", "value_dtype", "momentum_correction", "warmup", "clip_norm",
        "grad_scaler", "find_unused_parameters", *_SAVED,
        "_keys", "_keyed_at", "_workspace", "_stash", "_flat",
    )  # fmt: skip

    def __init__(
        self,
        *,
        density: float | None = None,
        k: int | None = None,
        error_feedback: bool = True,
        start_iter: int = 2,
        dense_if_larger: bool = True,
        process_group=None,
        encoding: str = "auto",
        value_dtype: torch.dtype | None = None,
        momentum_correction: float | None = None,
        warmup=None,
        clip_norm: float | None = None,
        grad_scaler=None,
        find_unused_parameters: bool = False,
    ) -> None:
        self.budget = Budget(k=k, density=density)
        self.start_iter = check_int("start_iter", start_iter, minimum=0)
        self.error_feedback = bool(error_feedback)
        self.dense_if_larger = bool(dense_if_larger)
        self.process_group = process_group
        check_choice("encoding", encoding, wire.ENCODINGS)
        check_choice("value_dtype", value_dtype, wire.VALUE_DTYPES)
        self.encoding, self.value_dtype = encoding, value_dtype
        self.momentum_correction = check_momentum_correction(momentum_correction)
        if self.momentum_correction is not None and not self.error_feedback:
            raise ValueError("momentum_correction needs error_feedback=True (DGC accumulates u)")
        self.warmup = check_schedule(warmup or [])
        self.clip_norm = (
            None if clip_norm is None else check_float("clip_norm", clip_norm, "(0, inf)")
        )  # noqa: E501
        self.grad_scaler = grad_scaler
        if not isinstance(find_unused_parameters, bool):
            raise TypeError(
                f"find_unused_parameters must be True or False, got {find_unused_parameters!r}"
            )
        self.find_unused_parameters = find_unused_parameters
        self.iter, self.bytes_sent, self.bytes_dense = 0, 0, 0
        self.residual = self.velocity = self.scale = None
        self.rank: int | None = None
        self.world_size: int | None = None
        self.layout: list[tuple[tuple[int, int], int]] = []
        self._keys: dict[int, tuple] = {}  # id(param) -> (weakref, key), this process only
        self._keyed_at: int | None = None  # self.iter when the first key was assigned
        self._workspace, self._stash = Workspace(), []
        self._flat = None  # the step's concatenated gradient, reused (see flat_buffer)

    def flat_buffer(self, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A length-``n`` buffer for the concatenated gradient, kept across steps: a
        fresh 47 MB tensor page-faults on every step (cat 34 ms vs 10 ms into a kept
        buffer at ResNet-18's size, one thread)."""
        flat = self._flat
        if flat is None or flat.numel() != n or flat.dtype != dtype or flat.device != device:
            self._flat = flat = torch.empty(n, dtype=dtype, device=device)
        return flat

    def keys_of(self, bucket) -> list[tuple[int, int]]:
        """Residual keys of the bucket's parameters (assigned on first sight, in the
        first step this state runs; a parameter first seen after it is an error)."""
        keys = []
        for pos, p in enumerate(bucket.parameters()):
            seen = self._keys.get(id(p))
            if seen is None or seen[0]() is not p:  # unseen, or a dead one's id reused
                if self._keyed_at is None:
                    self._keyed_at = self.iter
                elif self.iter > self._keyed_at:
                    raise ValueError(
                        "TopKHookState already serves another model (its residuals "
                        "belong to that model's parameters): make a new TopKHookState "
                        "for each model, and to resume, load_state_dict into a new one"
                    )
                seen = self._keys[id(p)] = (weakref.ref(p), (bucket.index(), pos))
            keys.append(seen[1])
        return keys

    def budget_at(self, iteration: int) -> Budget:
        """The budget of ``iteration``: the warm-up schedule's density, else ours."""
        density = density_at(self.warmup, iteration)
        return self.budget if density is None else Budget(density=density)

    @property
    def residuals(self) -> dict[tuple[int, int], torch.Tensor]:
        """Each parameter's residual, by key (views of the one stored vector)."""
        out, offset = {}, 0
        for key, size in self.layout if self.residual is not None else []:
            out[key] = self.residual[offset : offset + size]
            offset += size
        return out

    @property
    def compression_ratio(self) -> float:
        """Dense bytes over bytes actually sent (1.0 before any compression)."""
        return self.bytes_dense / self.bytes_sent if self.bytes_sent else 1.0

    def state_dict(self) -> dict:
        """Everything needed to resume: counters, residual, velocity (cloned), and the
        ``rank`` and ``world_size`` that this state belongs to (None outside
        ``torch.distributed``)."""
        out = {name: getattr(self, name) for name in _SAVED}
        if out["rank"] is None and dist.is_available() and dist.is_initialized():
            out["rank"] = dist.get_rank(self.process_group)
            out["world_size"] = dist.get_world_size(self.process_group)
        for name in ("residual", "velocity"):
            if out[name] is not None:
                out[name] = out[name].clone()
        out["layout"] = [list(key) + [size] for key, size in self.layout]
        return out

    def load_state_dict(self, state: dict, *, reshard: bool = False) -> None:
        """Resume from ``state_dict()``, saved by this rank in a world of this size
        (else the hook's first exchange fails every rank: a rank raising here alone
        would leave the others waiting). ``reshard=True`` takes any rank's state and
        restarts the error-feedback memory at zero (counters and layout kept)."""
        if not isinstance(reshard, bool):
            raise TypeError(f"reshard must be True or False, got {reshard!r}")
        if "residuals" in state and "layout" not in state:  # gradsift 0.1's per-key format
            keys = sorted(tuple(key) for key in state["residuals"])
            parts = [state["residuals"][key] for key in keys]
            state = {
                **state,
                "layout": [[*key, r.numel()] for key, r in zip(keys, parts)],
                "residual": torch.cat([r.reshape(-1) for r in parts]) if parts else None,
            }
        for name in _SAVED:
            value = state.get(name)
            setattr(self, name, value.clone() if isinstance(value, torch.Tensor) else value)
        self.layout = [((int(a), int(b)), int(size)) for a, b, size in state.get("layout", [])]
        self.iter, self.bytes_sent, self.bytes_dense = (
            int(state[n]) for n in ("iter", "bytes_sent", "bytes_dense")
        )
        if reshard:  # memory at zero: no loss scale to keep it in either
            self.rank = self.world_size = self.residual = self.velocity = self.scale = None

    def __getstate__(self):
        return {s: getattr(self, s) for s in self.__slots__ if s not in _THIS_PROCESS}

    def __setstate__(self, state):
        for s, v in state.items():
            setattr(self, s, v)
        self.process_group = self.grad_scaler = None
        self._keys, self._keyed_at = {}, None
        self._workspace, self._stash, self._flat = Workspace(), [], None


def compress_(state: TopKHookState, grad: torch.Tensor, keys: list, sizes: list[int]):
    """Select what this rank sends for ``grad`` (left unchanged): ``(indices, values)``
    with values in ``state.value_dtype``; updates the residual (and velocity).

    ``grad`` is the concatenation of parameters with ``keys`` and ``sizes``; it must
    match the state's stored layout (a state from another model raises).
    """
    match_layout_(state, grad, [(tuple(key), int(n)) for key, n in zip(keys, sizes)])
    k = state.budget_at(state.iter).resolve(grad.numel())
    return compress_into_(state, grad.detach().clone(), k, rounded=True)


def compress_into_(state: TopKHookState, work: torch.Tensor, k: int, *, rounded: bool):
    """``compress_`` on ``work`` in place (it is left holding the sparse vector);
    ``rounded=False`` sends the values in their own dtype (the dense path)."""
    rescale_for_grad_scaler_(state)
    m = state.momentum_correction
    idx, values = sparsify_(
        work,
        k,
        residual=state.residual,
        velocity=state.velocity,
        momentum=m or 0.0,
        workspace=state._workspace,
    )
    if rounded and state.value_dtype is not None and state.value_dtype != values.dtype:
        sent = round_for_wire(values, state.value_dtype)
        if state.residual is not None:  # exact (distributed.rounding)
            state.residual.index_copy_(0, idx, values - sent.to(values.dtype))
        values = sent
    return idx, values


def match_layout_(state: TopKHookState, grad: torch.Tensor, layout: list) -> None:
    """Allocate the residual/velocity on first use; a different layout is an error."""
    if state.layout and state.layout != layout:
        raise ValueError(
            "TopKHookState does not match this model: its residuals are for "
            f"{len(state.layout)} tensors ({sum(s for _, s in state.layout)} values), the "
            f"model has {len(layout)} ({sum(s for _, s in layout)}); was it loaded from "
            "another model's checkpoint?"
        )
    state.layout = layout
    wants = {"residual": state.error_feedback, "velocity": state.momentum_correction is not None}
    for name, wanted in wants.items():
        current = getattr(state, name)
        if wanted and current is None:
            setattr(state, name, torch.zeros_like(grad))
        elif current is not None:
            setattr(state, name, current.to(device=grad.device, dtype=grad.dtype))


def message_bytes(state: TopKHookState, n: int, k: int, dtype: torch.dtype) -> tuple[str, int]:
    """The concrete wire format for this step and its size in bytes."""
    encoding = wire.choose(state.encoding, n, k)
    return encoding, wire.message_bytes(encoding, n, k, state.value_dtype or dtype)

"""Which parameters are scored and pruned, keyed by parameter name.

Names are logical: a weight pruned through ``torch.nn.utils.prune`` (stored as
``weight_orig`` with a ``weight_mask`` buffer) is still called ``"...weight"``. A
tensor that several modules hold (tied weights: ``decoder.weight =
embedding.weight``) is one weight, selected once, under the first name that selects
it; ``owners`` finds every module that holds it.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import torch
from torch import nn

from gradsift.pruning.boolean_mask import masked
from gradsift.pruning.shared import refresh_readers_

__all__ = [
    "Selector",
    "deepcopy_model",
    "owners",
    "device_of",
    "effective",
    "is_conv1d",
    "is_plain_linear",
    "leaves",
    "mask_of",
    "original",
    "param_path",
    "private_copy",
    "prunable",
]

# (name, module, parameter) -> bool
Selector = None | list | tuple | set | Callable[[str, nn.Module, torch.Tensor], bool]

_DEFAULT_TYPES = (
    nn.Linear,
    *(nn.Conv1d, nn.Conv2d, nn.Conv3d),
    *(nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d),
)
# nn.MultiheadAttention's own projection weights (its out_proj is a Linear)
_ATTENTION_WEIGHTS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")


# below this fraction of the model's parameters, the default selection warns
DEFAULT_COVERAGE = 0.5


def is_plain_linear(module: nn.Module) -> bool:
    """Whether ``module`` computes exactly ``nn.Linear.forward``: an ``nn.Linear`` (not
    a subclass) with no ``forward`` set on the instance (accelerate's and similar hooks
    set one). Only then may a criterion swap in a forward of its own that forms the
    weight's gradient differently and computes the same map."""
    return type(module) is nn.Linear and "forward" not in vars(module)


def is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is Hugging Face's ``transformers.pytorch_utils.Conv1D`` (GPT-2's
    projections): a linear map ``x @ weight + bias`` whose weight is ``(in, out)``, the
    transpose of ``nn.Linear``'s. Recognised by name and layout, without importing
    transformers."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and getattr(module, "nf", None) == weight.shape[1]
    )


def _default(module: nn.Module, attr: str) -> bool:
    if isinstance(module, nn.MultiheadAttention):
        return attr in _ATTENTION_WEIGHTS
    return attr == "weight" and (isinstance(module, _DEFAULT_TYPES) or is_conv1d(module))


def _held(module: nn.Module):
    """``(logical attribute, tensor)`` of the parameters ``module`` holds itself: a
    ``weight_orig`` is ``weight`` when pruned (a ``weight_mask`` beside it), else its
    own name (``spectral_norm`` stores a weight so)."""
    for attr, tensor in list(module.named_parameters(recurse=False)):
        base = attr[: -len("_orig")]
        yield (base if attr.endswith("_orig") and _is_pruned(module, base) else attr), tensor


def _is_pruned(module: nn.Module, attr: str) -> bool:
    """``torch.nn.utils.prune``'s layout: ``attr_orig`` and the ``attr_mask`` buffer."""
    return hasattr(module, attr + "_orig") and mask_of(module, attr) is not None


def prunable(
    model: nn.Module, params: Selector = None, *, warn: bool = True
) -> dict[str, tuple[nn.Module, str]]:
    """Map logical parameter names to ``(module, attribute)`` for the scored weights.

    ``params``: None for the weights of Linear and Conv layers, of Hugging Face's
    ``Conv1D`` (GPT-2's blocks) and the projection weights of ``nn.MultiheadAttention``
    (``in_proj_weight``; no biases, no norm layers, no embeddings unless tied to a
    selected Linear); a collection of names; or a predicate ``(name, module, tensor)
    -> bool``. A tied tensor is selected once, under the first name that selects it.
    When the default selects less than ``DEFAULT_COVERAGE`` (half) of the model's
    parameters, a ``UserWarning`` says so and names ``params=`` (``warn=False``: not).
    """
    found: dict[str, tuple[nn.Module, str]] = {}
    chosen: dict[int, str] = {}  # id(tensor) -> the name it was selected under
    seen: set[str] = set()  # every name of a selected tensor, aliases included
    for mod_name, module in model.named_modules():
        for base, tensor in _held(module):
            name = f"{mod_name}.{base}" if mod_name else base
            if id(tensor) in chosen:
                seen.add(name)
                continue
            if params is None:
                pick = _default(module, base)
            elif callable(params):
                pick = bool(params(name, module, tensor))
            else:
                pick = name in params
            if pick:
                found[name] = (module, base)
                chosen[id(tensor)] = name
                seen.add(name)
    if not callable(params) and params is not None:
        missing = sorted(set(params) - seen)
        if missing:
            raise ValueError(f"params names not found in the model: {missing}")
    if not found:
        raise ValueError("no parameters selected for scoring (params=...)")
    if params is None and warn:
        _warn_reparametrized(model)
        _warn_coverage(model, found)
    return found


def _warn_reparametrized(model: nn.Module) -> None:
    """Warn about layers of the default types whose weight is no parameter of theirs:
    computed from others (``spectral_norm``, ``weight_norm``, ``parametrize``)."""
    names = [
        name
        for name, m in model.named_modules()
        if isinstance(m, _DEFAULT_TYPES) and "weight" not in dict(_held(m))
    ]
    if names:
        warnings.warn(
            f"the weights of {names} are computed from other tensors (spectral_norm, "
            "weight_norm or torch.nn.utils.parametrize), which torch.nn.utils.prune "
            "cannot mask: they are not selected and stay dense",
            UserWarning,
            stacklevel=5,  # the user's call of score or prune_at_init
        )


def _warn_coverage(model: nn.Module, found: dict) -> None:
    total = sum(t.numel() for t in {id(t): t for _, t in _all_held(model)}.values())
    chosen = sum(original(m, a).numel() for m, a in found.values())
    if total and chosen < DEFAULT_COVERAGE * total:
        kinds = sorted(
            {type(m).__name__ for m in model.modules() for _ in _held(m)}
            - {type(m).__name__ for m, _ in found.values()}
        )
        warnings.warn(
            f"the default parameter selection (Linear, Conv*, HF Conv1D and "
            f"MultiheadAttention weights) covers {chosen} of the model's {total} "
            f"parameters ({100 * chosen / total:.1f}%); weights of {kinds} are not "
            "pruned. Pass params= (names or a predicate (name, module, tensor) -> bool) "
            "to choose them",
            UserWarning,
            stacklevel=5,  # the user's call of score or prune_at_init
        )


def _all_held(model: nn.Module):
    for module in model.modules():
        yield from _held(module)


def original(module: nn.Module, attr: str) -> torch.Tensor:
    """The trainable tensor behind ``attr`` (``attr_orig`` when pruned)."""
    return getattr(module, attr + "_orig") if _is_pruned(module, attr) else getattr(module, attr)


def mask_of(module: nn.Module, attr: str) -> torch.Tensor | None:
    """The installed ``torch.nn.utils.prune`` mask of ``attr``, if any."""
    return getattr(module, attr + "_mask", None)


def effective(module: nn.Module, attr: str) -> torch.Tensor:
    """The weight the forward pass uses: ``orig`` masked when pruned."""
    mask = mask_of(module, attr)
    w = original(module, attr)
    return w if mask is None else masked(w, mask)


def owners(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    """``id(tensor) -> [(module, attribute), ...]`` for every parameter of ``model``:
    more than one entry for a tied tensor, in model order."""
    out: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for base, tensor in _held(module):
            out.setdefault(id(tensor), []).append((module, base))
    return out


def device_of(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def param_path(model: nn.Module, module: nn.Module, attr: str) -> str:
    """The ``named_parameters`` name of the tensor behind ``module.attr`` in ``model``
    (``..._orig`` when pruned), for ``torch.func.functional_call``: for a tied tensor,
    the one name ``named_parameters`` gives it (its first), whichever module holds it."""
    tensor = original(module, attr)
    if not any(m is module for m in model.modules()):
        raise ValueError(f"module {type(module).__name__} is not part of the model")
    for name, p in model.named_parameters():
        if p is tensor:
            return name
    raise ValueError(f"{type(module).__name__}.{attr} is not a parameter of the model")


def deepcopy_model(model: nn.Module, *, share_parameters: bool = False) -> nn.Module:
    """``copy.deepcopy`` that also works on models pruned by ``torch.nn.utils.prune``.

    Pruning leaves ``module.weight = weight_orig * weight_mask`` as a non-leaf tensor
    after a forward pass, which ``deepcopy`` refuses. Those attributes are recomputed
    by the pruning pre-hook at every forward, so they are swapped for detached values
    during the copy and put back afterwards.

    ``share_parameters=True``: the copy's parameters are new ``nn.Parameter`` objects
    (their own ``requires_grad`` and ``.grad``) over the caller's storage, for a
    reader that never writes them: no second copy of the weights. So are the
    pruning masks (``*_mask`` buffers) and masked weights; other buffers (BatchNorm's
    statistics) are copied.
    """
    swapped = []
    for module in model.modules():
        for attr, value in list(vars(module).items()):
            if isinstance(value, torch.Tensor) and not value.is_leaf:
                swapped.append((module, attr, value))
                setattr(module, attr, value.detach())
    try:
        return copy.deepcopy(model, _shared(model) if share_parameters else {})
    finally:
        for module, attr, value in swapped:
            setattr(module, attr, value)


def _shared(model: nn.Module) -> dict:
    """A ``deepcopy`` memo that maps each parameter to a new ``nn.Parameter`` over its
    storage, and each mask buffer and masked weight (a plain tensor attribute beside
    its ``_orig`` parameter and ``_mask`` buffer, already detached by
    ``deepcopy_model``) to itself; any other plain tensor attribute is copied (the
    model may write it in its forward)."""
    memo: dict = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(p.detach(), requires_grad=p.requires_grad)
    for module in model.modules():
        shared = [b for n, b in module._buffers.items() if n.endswith("_mask")]
        shared += [
            v
            for n, v in vars(module).items()
            if isinstance(v, torch.Tensor)
            and n + "_orig" in module._parameters
            and n + "_mask" in module._buffers
        ]
        for t in shared:
            if t is not None:
                memo[id(t)] = t.detach()
    return memo


def private_copy(model: nn.Module, params: Selector = None, *, share_weights: bool = False):
    """A deep copy to score on (no grads, nothing requiring grad) and its targets
    ``{name: (module, attr)}``; scoring it leaves the caller's model untouched.
    ``share_weights``: parameters over the caller's storage (``deepcopy_model``), for
    a criterion that never writes them."""
    work = deepcopy_model(model, share_parameters=share_weights)
    refresh_readers_(work)  # a model pruned by torch alone: MultiheadAttention's out_proj
    for p in work.parameters():
        p.requires_grad_(False)
        p.grad = None
    return work, prunable(work, params, warn=False)


def leaves(targets: dict) -> list[torch.Tensor]:
    """The trainable tensors behind ``targets``, switched to ``requires_grad``."""
    out = [original(m, a) for m, a in targets.values()]
    for t in out:
        t.requires_grad_(True)
    return out

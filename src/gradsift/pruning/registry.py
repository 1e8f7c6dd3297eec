"""The registry of pruning criteria, and ``score``: run one on a private copy.

A criterion is a function ``fn(model, targets, data, **options) -> {name: score}``:
``model`` is a private deep copy (nothing in it requires grad), ``targets`` maps each
scored parameter's name to ``(module, attribute)`` (``gradsift.pruning.params``),
``data`` can be iterated more than once (a one-pass generator arrives replayable,
``gradsift.pruning.sampling.replayable``), and **higher score = more important =
kept**. ``register_method`` adds one by name, as
timm's optimizer registry and jaxpruner's ``register_algorithm`` do, so a user can
add a criterion without editing gradsift; each built-in lives in
``gradsift/pruning/methods/<name>.py``.

``score`` runs the criterion on a deep copy under a forked RNG, so the caller's model
(weights, buffers, train/eval mode, ``requires_grad``, ``.grad``) and the global RNG
are exactly as they were.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from gradsift.pruning.params import Selector, original, private_copy, prunable
from gradsift.pruning.sampling import replayable
from gradsift.pruning.sharded_scoring import is_sharded_model, preserved

__all__ = [
    "Method",
    "get_method",
    "list_methods",
    "method_options",
    "register_method",
    "run_criterion",
    "score",
    "scoring_rng",
    "supported_options",
]


@dataclass(frozen=True)
class Method:
    """A registered criterion and what belongs to it.

    ``defaults``: option values used when the caller gives none (on top of ``fn``'s
    own keyword defaults). ``rescorer``: optional factory
    ``rescorer(model, data, *, params, **options) -> rescore(masks) -> scores`` for
    cheap rescoring in iterative pruning. ``paper_iterations``: the pruning rounds
    its paper uses (SynFlow: 100), for harnesses that reproduce it; 1 for a criterion
    that runs its own schedule. ``takes_sparsity``: the criterion has a keyword-only
    ``sparsity`` option (it prunes in its own rounds towards that target, as FORCE
    does); ``prune_at_init`` passes it the target. ``reads_only``: the criterion
    neither changes the model nor its flags (magnitude, random), so ``score`` hands it
    the caller's model instead of a deep copy (one copy of the parameters saved).
    ``writes_weights``: the criterion may write the weights of the copy it is given
    (SynFlow linearises them); False (SNIP: it only differentiates) lets the copy's
    parameters share the caller's storage (``private_copy(share_weights=True)``).
    Registered criteria default to True, the safe side.
    ``sharded``: the criterion's form for a sharded model (FSDP2, ``DTensor``
    parameters; ``gradsift.pruning.sharded_scoring``), same signature and options, run
    on the caller's model and returning ``DTensor`` scores; None: it cannot run sharded.
    """

    name: str
    fn: Callable[..., dict]
    defaults: dict = field(default_factory=dict)
    rescorer: Callable | None = None
    paper_iterations: int = 1
    reads_only: bool = False
    writes_weights: bool = True
    sharded: Callable | None = None

    @property
    def takes_sparsity(self) -> bool:
        return "sparsity" in self.options()

    def options(self) -> list[str]:
        """The keyword options the criterion accepts."""
        sig = inspect.signature(self.fn)
        return [n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY]


_METHODS: dict[str, Method] = {}


# what score and prune_at_init take for themselves (allocation, min_per_layer and
# sparsity do reach a method that takes them: prune_at_init passes its own)
_CALLERS_OWN = {
    "params", "scope", "iterations", "schedule", "shuffle", "sanity", "generator", "budget",
}  # fmt: skip


def register_method(
    name: str,
    fn: Callable[..., dict],
    defaults: dict | None = None,
    *,
    rescorer: Callable | None = None,
    paper_iterations: int = 1,
    reads_only: bool = False,
    writes_weights: bool = True,
    sharded: Callable | None = None,
    replace: bool = False,
) -> Method:
    """Register ``fn`` as criterion ``name`` (see the module docstring for its
    signature); ``defaults`` must name keyword-only options of ``fn``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if name in _METHODS and not replace:
        raise ValueError(f"method {name!r} is already registered (pass replace=True)")
    method = Method(
        name,
        fn,
        dict(defaults or {}),
        rescorer,
        paper_iterations,
        reads_only,
        writes_weights,
        sharded,
    )
    unknown = sorted(set(method.defaults) - set(method.options()))
    if unknown:
        raise ValueError(f"defaults {unknown} are not keyword-only options of {name!r}")
    taken = sorted(set(method.options()) & _CALLERS_OWN)
    if taken:
        raise ValueError(
            f"options {taken} of {name!r} are score's or prune_at_init's own arguments, "
            "which never reach a method: rename them"
        )
    _METHODS[name] = method
    return method


def list_methods() -> list[str]:
    """Names accepted by ``score`` and ``prune_at_init``."""
    return sorted(_METHODS)


def get_method(name: str) -> Method:
    if name not in _METHODS:
        raise ValueError(f"method must be one of {list_methods()}, got {name!r}")
    return _METHODS[name]


def method_options(method: str) -> list[str]:
    """The keyword options ``method`` accepts."""
    return get_method(method).options()


def supported_options(method: str, **candidates) -> dict:
    """The subset of ``candidates`` that ``method`` accepts (for generic harnesses
    that know a seed or a class count and pass it to whichever method takes it)."""
    accepted = set(method_options(method))
    return {k: v for k, v in candidates.items() if k in accepted}


def checked_options(method: str, options: dict) -> dict:
    """``options`` over the method's registered defaults over ``fn``'s own keyword
    defaults (every option that has a value); unknown names raise."""
    entry = get_method(method)
    unknown = sorted(set(options) - set(entry.options()))
    if unknown:
        raise TypeError(
            f"method {method!r} got unknown options {unknown}; it accepts {entry.options()}"
        )
    own = {
        n: p.default
        for n, p in inspect.signature(entry.fn).parameters.items()
        if p.kind is p.KEYWORD_ONLY and p.default is not p.empty
    }
    return {**own, **entry.defaults, **options}


def score(
    model: nn.Module,
    method: str,
    data: Iterable | None = None,
    *,
    params: Selector = None,
    **options,
) -> dict[str, torch.Tensor]:
    """Score every selected weight of ``model`` with ``method``; higher = keep.

    (``run_criterion(..., warn=False)`` is the same without the default selection's
    coverage warning, for ``prune_at_init``'s rounds, which warn once themselves.)

    Args:
        model: any ``nn.Module``; it is not modified. A sharded model (FSDP2,
            ``DTensor`` parameters) is scored on its shards by the method's sharded
            form and gets ``DTensor`` scores (``gradsift.pruning.sharded_scoring``).
        method: one of ``list_methods()``.
        data: an iterable of ``(inputs, targets)`` batches (a DataLoader; a one-pass
            generator is read once and replayed, ``gradsift.pruning.sampling``).
            Needed by snip and grasp (other batches: their ``split_batch`` option,
            ``gradsift.pruning.inputs``); synflow only reads the input shape from it.
        params: which weights to score: None (Linear/Conv weights), names, or a
            predicate ``(name, module, tensor) -> bool``.
        **options: method options (``method_options(method)`` lists them), e.g.
            ``loss_fn``, ``split_batch``, ``batch_weighting`` (snip, grasp),
            ``num_batches`` (snip), ``temperature``, ``samples_per_class``,
            ``num_classes``, ``chunk_size``, ``max_batches`` (grasp), ``input_shape``
            (synflow), ``seed`` (random).

    Returns:
        ``{name: tensor shaped like the weight}``.
    """
    return run_criterion(model, method, data, params=params, options=options)


@torch.enable_grad()  # the criteria differentiate, also when called under no_grad
def run_criterion(
    model: nn.Module,
    method: str,
    data: Iterable | None = None,
    *,
    params: Selector = None,
    warn: bool = True,
    options: dict | None = None,
) -> dict[str, torch.Tensor]:
    """``score`` with the method's ``options`` as a dict (so that none of them is
    taken for ``warn``); ``warn=False`` leaves out the coverage warning."""
    entry = get_method(method)
    sharded = is_sharded_model(model)  # the one place that decides
    if sharded:
        check_shardable(entry)
    options = checked_options(method, options or {})
    data = replayable(data)
    prunable(model, params, warn=warn)  # validate names (and warn) on the caller's model
    with scoring_rng(model):
        if sharded:  # on the caller's model, put back as it was
            targets = prunable(model, params, warn=False)
            with torch.no_grad() if entry.reads_only else preserved(model):
                scores = entry.sharded(model, targets, data, **options)
        elif entry.reads_only:  # no copy and no autograd: it only reads
            targets = prunable(model, params, warn=False)
            with torch.no_grad():
                scores = entry.fn(model, targets, data, **options)
        else:
            work, targets = private_copy(model, params, share_weights=not entry.writes_weights)
            scores = entry.fn(work, targets, data, **options)
    _check_scores(method, scores, targets)
    return {name: scores[name].detach() for name in targets}


def scoring_rng(model: nn.Module):
    """A context in which scoring may draw from the global generators (the CPU's and
    those of the model's CUDA devices) and leaves them as they were."""
    devices = [d for d in {p.device for p in model.parameters()} if d.type == "cuda"]
    return torch.random.fork_rng(devices=devices)


def check_shardable(entry: Method) -> None:
    """Raise ``ValueError`` naming ``entry`` when it has no sharded form."""
    if entry.sharded is None:
        able = sorted(n for n, m in _METHODS.items() if m.sharded is not None)
        raise ValueError(
            f"method {entry.name!r} cannot score a sharded model (FSDP2, DTensor "
            f"parameters); the methods that can: {able}"
        )


def _check_scores(method: str, scores: dict, targets: dict) -> None:
    if not isinstance(scores, dict) or set(scores) != set(targets):
        got = sorted(scores) if isinstance(scores, dict) else type(scores).__name__
        raise ValueError(f"method {method!r} must return scores for {sorted(targets)}, got {got}")
    for name, (module, attr) in targets.items():
        expected = tuple(original(module, attr).shape)
        if not isinstance(scores[name], torch.Tensor):
            kind = type(scores[name]).__name__
            raise TypeError(f"method {method!r}: score of {name} must be a tensor, got {kind}")
        if tuple(scores[name].shape) != expected:
            raise ValueError(
                f"method {method!r}: score of {name} has shape {tuple(scores[name].shape)}, "
                f"expected {expected}"
            )

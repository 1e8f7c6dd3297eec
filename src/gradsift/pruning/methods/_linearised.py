"""SynFlow's linearised network, its scored weights in one flat buffer that the scores
overwrite.

``Linearised(work, targets, dtype, power, method)`` turns a private copy of the model
(``private_copy(..., share_weights=True)``: its parameters lie over the caller's
storage, which is only ever read) into the linearised network of SynFlow (Tanaka et
al. 2020, arXiv:2006.05467) or SynFlow-L2 (``power=2``, Gebhart et al. 2021,
arXiv:2101.10552): every scored weight becomes a private parameter ``φ = |θ|^power``
(times its installed mask) in one flat buffer of ``dtype``; every other parameter a
private ``|p|^power``, biases zero; BatchNorm in eval mode with its mean zeroed (and,
for ``power=2``, its eval scale squared).

``scores()`` runs one forward on ones and one backward; as each weight's gradient
``g = ∂R/∂φ`` arrives, a hook writes the score ``|θ| ⊙ g`` (``|θ| = φ^(1/power)``)
over ``φ`` itself and drops ``g``, so at most one weight's gradient is alive and the
scores come back as views of the flat buffer, which the selection ranks where they
lie. ``refill_(masks)`` rebuilds ``φ`` from the caller's weights for the next round:
so one round holds the flat buffer, one gradient and the masks, and nothing else of
the weights' size.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.nn.utils import prune

from gradsift.checks import check_shape
from gradsift.pruning.boolean_mask import as_bool
from gradsift.pruning.flat import flat_views
from gradsift.pruning.inputs import real_inputs, refuse_token_ids
from gradsift.pruning.keep_where import keep_where_
from gradsift.pruning.methods._linear_flow import scoring_forward
from gradsift.pruning.params import is_plain_linear, mask_of, original, owners

__all__ = [
    "BIASES",
    "Linearised",
    "check_reached",
    "drop_statistics_",
    "input_shape_of",
    "linearise_norm_",
]

BIASES = ("bias", "bias_orig")  # zeroed: flow only through the weights


def check_reached(method: str, missed: list[str]) -> None:
    """Raise ``ValueError`` naming the weights in ``missed``: no gradient flows to them
    from the output, so they have no synaptic flow to score."""
    if missed:
        raise ValueError(
            f"{method}: {missed} do not reach the output (no gradient flows to them), so "
            "they have no synaptic flow to score; leave them out with params="
        )


def input_shape_of(data, input_shape, split_batch, method: str) -> tuple:
    """The shape of one input (without the batch dimension) for a data-free criterion:
    ``input_shape``, or read off the first batch of ``data``."""
    if input_shape is not None:
        return check_shape("input_shape", input_shape)
    if data is None:
        raise ValueError(f"{method} needs input_shape= or data= to know the input shape")
    return tuple(real_inputs(data, method, split_batch).shape[1:])


class Linearised:
    """The linearised network over a private copy (see the module docstring)."""

    def __init__(self, work: nn.Module, targets: dict, dtype, power: int, method: str):
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"{method}: dtype must be a floating torch.dtype, got {dtype!r}")
        self.work, self.names, self.power, self.method = work, list(targets), power, method
        self.dtype = dtype
        pairs = list(targets.values())
        self.sources = [original(m, a) for m, a in pairs]  # the caller's: read only
        self.installed = [mask_of(m, a) for m, a in pairs]
        self.zero = [a in BIASES for _, a in pairs]
        device = self.sources[0].device if self.sources else torch.device("cpu")
        views = flat_views([s.shape for s in self.sources], dtype, device)
        self.phis = [nn.Parameter(v, requires_grad=False) for v in views]
        holders = owners(work)
        self.reached = [False] * len(self.phis)
        self.patched: list[nn.Linear] = []  # scoring in their own backward
        for i, ((module, attr), phi) in enumerate(zip(pairs, self.phis)):
            held = holders[id(original(module, attr))]
            for m, a in held:  # every holder of a tie
                _unprune_(m, a, phi)
            if is_plain_linear(module) and attr == "weight" and len(held) == 1:
                # no reference to self from the copy: no cycle keeping φ alive
                done = functools.partial(_reach, self.reached, self.names, method, i)
                module.forward = scoring_forward(module, power, done)
                self.patched.append(module)
        _private_rest_(work, {id(p) for p in self.phis}, dtype, power, device)
        refuse_token_ids(work, method)
        self.refill_(None)

    @torch.no_grad()
    def refill_(self, masks: dict | None) -> None:
        """``φ = |θ|^power`` of the caller's weights, zero where ``masks`` (else the
        installed masks) prune."""
        self.masks = masks  # for a rebuild (see ``scores``)
        for name, phi, src, installed, zero in zip(
            self.names, self.phis, self.sources, self.installed, self.zero
        ):
            if zero:
                phi.zero_()
                continue
            phi.copy_(src.detach()).abs_()
            if self.power == 2:
                phi.square_()
            keep = installed if masks is None else masks[name]
            if keep is not None:
                keep = as_bool(keep.detach().to(phi.device))
                keep_where_(phi, keep)

    def scores(self, input_shape) -> dict[str, torch.Tensor]:
        """``|θ| ⊙ ∂R/∂φ`` written over ``φ``; ``R`` the output sum on ones.

        A ``Linear`` scores its weight in its own backward, which holds only when the
        weight is used once: a module called twice (shared layers) or a weight read
        elsewhere in the forward fails that backward (a version or "scored twice"
        error), and the round is then redone with those modules' own forward, the
        score written once the whole gradient has accumulated (autograd sums it).
        """
        try:
            return self._scores(input_shape)
        except RuntimeError:
            if not self.patched:
                raise
            for module in self.patched:
                del module.forward  # nn.Linear.forward again
            self.patched = []
            self.refill_(self.masks)  # the failed backward wrote over part of φ
            return self._scores(input_shape)

    def _scores(self, input_shape) -> dict[str, torch.Tensor]:
        self.reached[:] = [False] * len(self.phis)
        handles = []
        for i, phi in enumerate(self.phis):
            phi.requires_grad_(True)
            hook = functools.partial(self._score_, i)
            handles.append(phi.register_post_accumulate_grad_hook(hook))
        ones = torch.ones((1, *input_shape), dtype=self.dtype, device=self._device())
        try:
            self._forward(ones).sum().backward()
        finally:
            for h in handles:
                h.remove()
            for phi in self.phis:
                phi.requires_grad_(False)
                phi.grad = None
        check_reached(self.method, [n for n, seen in zip(self.names, self.reached) if not seen])
        return dict(zip(self.names, self.phis))

    def _forward(self, ones: torch.Tensor) -> torch.Tensor:
        try:
            return self.work(ones)
        except RuntimeError as e:  # not one the rounds redo (``scores``): say why
            raise ValueError(
                f"{self.method}: the linearised network's forward failed on ones of shape "
                f"{tuple(ones.shape)} with every parameter and buffer in {self.dtype} ({e}); "
                "a model that casts inside its forward (x.float(), .half()) needs dtype= "
                "of that type, e.g. dtype=torch.float32"
            ) from e

    def _score_(self, i: int, phi: torch.Tensor) -> None:
        g, phi.grad = phi.grad, None
        if g is None:  # a ScoringLinear scored it in its backward
            return
        with torch.no_grad():
            if self.power == 2:
                phi.sqrt_()
            phi.mul_(g)
        _reach(self.reached, self.names, self.method, i)

    def _device(self) -> torch.device:
        p = next(self.work.parameters(), None)
        return p.device if p is not None else torch.device("cpu")


def _reach(reached: list, names: list, method: str, i: int) -> None:
    if reached[i]:  # a score written twice would be a product of two
        raise RuntimeError(f"{method}: {names[i]} was scored twice")
    reached[i] = True


def _unprune_(module: nn.Module, attr: str, param: nn.Parameter) -> None:
    """``module.attr = param``, dropping ``torch.nn.utils.prune``'s reparametrisation
    of ``attr`` (its mask is in ``param``: no masked copy made at every forward)."""
    for key, hook in list(module._forward_pre_hooks.items()):
        if isinstance(hook, prune.BasePruningMethod) and hook._tensor_name == attr:
            del module._forward_pre_hooks[key]
    module._parameters.pop(attr + "_orig", None)
    module._buffers.pop(attr + "_mask", None)
    module.__dict__.pop(attr, None)
    setattr(module, attr, param)


def _private_rest_(work: nn.Module, done: set[int], dtype, power: int, device) -> None:
    """Every other parameter replaced by a private ``|p|^power`` (biases: zeros) of
    ``dtype``; buffers in ``dtype``; BatchNorm's eval map linearised; eval mode."""
    made: dict[int, nn.Parameter] = {}
    for module in work.modules():
        for attr, p in list(module._parameters.items()):
            if p is None or id(p) in done:
                continue
            if id(p) not in made:
                with torch.no_grad():
                    value = p.detach().to(dtype)
                    value = torch.zeros_like(value) if attr in BIASES else value.abs() ** power
                made[id(p)] = nn.Parameter(value, requires_grad=False)
            module._parameters[attr] = made[id(p)]
        for key, buf in list(module._buffers.items()):
            if buf is not None and buf.is_floating_point():
                module._buffers[key] = buf.to(dtype)
        linearise_norm_(module, power, dtype, device)
    work.eval()


def linearise_norm_(module: nn.Module, power: int, dtype, device) -> bool:
    """BatchNorm (and InstanceNorm) in eval mode as a linear map: mean zeroed, and for
    ``power=2`` its scale ``γ/√(var+ε)`` squared (``var+ε`` squared).

    A norm without running statistics (``track_running_stats=False``) would normalise
    SynFlow's one all-ones input by that input's own statistics (variance 0: no flow,
    and scores of rounding noise); it gets those of a norm at initialisation, mean 0
    and variance 1 (in ``dtype`` on ``device``), and ``True`` is returned
    (``drop_statistics_`` takes them away)."""
    if not isinstance(module, nn.modules.batchnorm._NormBase):
        return False
    added = module.running_mean is None
    if added:
        n = module.num_features
        module.register_buffer("running_mean", torch.zeros(n, dtype=dtype, device=device))
        module.register_buffer("running_var", torch.ones(n, dtype=dtype, device=device))
        module.track_running_stats = True
    with torch.no_grad():
        module.running_mean.zero_()
        if power == 2:
            module.running_var.add_(module.eps).square_().sub_(module.eps)
    return added


def drop_statistics_(module: nn.Module) -> None:
    """Undo the statistics ``linearise_norm_`` gave a norm that had none."""
    del module._buffers["running_mean"], module._buffers["running_var"]
    module.running_mean = module.running_var = None
    module.track_running_stats = False

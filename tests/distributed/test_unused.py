"""The top-k hook under ``DistributedDataParallel(find_unused_parameters=True)``: a
parameter that no rank uses in a step keeps its residual (``gradsift.distributed.unused``).

One gloo rank in the test's process: a parameter unused on the only rank is unused
globally, the case where DDP drops what the hook hands back for it."""

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gradsift.distributed import TopKHookState, topk_hook


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 1), nn.Linear(4, 1)

    def forward(self, x, use_b: bool):
        out = self.a(x)
        return out + 100 * self.b(x) if use_b else out  # b's gradient dwarfs a's


USES_B = [True, False, False, True, False]  # b: used, unused twice, used, unused


class Scales:
    """A GradScaler stand-in whose scale is ``scales[step]``."""

    def __init__(self, scales):
        self.scales, self.step = scales, 0

    def is_enabled(self):
        return True

    def get_scale(self):
        return self.scales[self.step]


SPARSE = {"density": 0.1, "dense_if_larger": False}
# the first step sparse (b's residual builds up), then dense: the bytes model finds
# that all 10 float64 coordinates with int64 indices cost no less than the dense vector
DENSE_AFTER_ONE = {"density": 1.0, "encoding": "int64", "warmup": [(1, 0.1)]}
PATHS = {"sparse": ["sparse"] * 5, "dense": ["sparse"] + ["dense"] * 4}


def _spy_paths(monkeypatch) -> list[str]:
    """The hook's path ("sparse" or "dense") in each step, in order."""
    from gradsift.distributed import hook

    paths = []
    for name in ("_sparse", "_dense"):
        real = getattr(hook, name)

        def spy(*args, _real=real, _path=name[1:]):
            paths.append(_path)
            return _real(*args)

        monkeypatch.setattr(hook, name, spy)
    return paths


def _train(find_unused_parameters: bool, scaler=None, **options):
    """Per parameter: every step's own gradient summed, what DDP applied summed, and
    the residual left; plus b's residual after each step."""
    model = TwoBranches().double()
    state = TopKHookState(
        start_iter=0, find_unused_parameters=find_unused_parameters, grad_scaler=scaler,
        **options,
    )  # fmt: skip
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    ddp.register_comm_hook(state, topk_hook)
    params = dict(model.named_parameters())
    grads = {n: torch.zeros_like(p) for n, p in params.items()}
    applied = {n: torch.zeros_like(p) for n, p in params.items()}
    b_residuals = []
    gen = torch.Generator().manual_seed(1)
    for step, use_b in enumerate(USES_B):
        if scaler is not None:
            scaler.step = step
        x = torch.randn(8, 4, generator=gen, dtype=torch.float64)
        own = torch.autograd.grad(model(x, use_b).square().mean(), list(params.values()),
                                  allow_unused=True)  # fmt: skip
        for n, g in zip(params, own):
            grads[n] += 0 if g is None else g
        model.zero_grad(set_to_none=True)
        ddp(x, use_b).square().mean().backward()
        for n, p in params.items():
            applied[n] += 0 if p.grad is None else p.grad
        b_residuals.append(torch.cat([_residual(state, params[n]) for n in ("b.weight", "b.bias")]))
    left = {n: _residual(state, p).view_as(p) for n, p in params.items()}
    return grads, applied, left, b_residuals


def _residual(state, p):
    return state.residuals[state._keys[id(p)][1]]


@pytest.mark.parametrize("options", [SPARSE, DENSE_AFTER_ONE], ids=["sparse", "dense"])
def test_an_unused_parameter_keeps_its_residual_and_no_mass_is_lost(
    one_rank, monkeypatch, request, options
):
    paths = _spy_paths(monkeypatch)
    grads, applied, left, b_residuals = _train(True, **options)
    assert paths == PATHS[request.node.callspec.id], paths  # each path is tested
    for n in grads:  # sum of gradients == what was applied + what is still held
        torch.testing.assert_close(applied[n] + left[n], grads[n], rtol=1e-12, atol=1e-12)
    # in the steps that do not use b, its residual waits untouched
    assert b_residuals[0].abs().sum() > 0
    for step, use_b in enumerate(USES_B):
        if not use_b:
            assert torch.equal(b_residuals[step], b_residuals[step - 1]), step


def test_a_held_residual_follows_the_loss_scale(one_rank):
    """The loss scale doubles in a step that does not use b: b's residual, set aside,
    comes back in the new scale's units (rescaled before it is set aside)."""
    _, _, _, b_residuals = _train(True, Scales([1.0, 2.0, 2.0, 2.0, 2.0]), **SPARSE)
    torch.testing.assert_close(b_residuals[1], 2 * b_residuals[0], rtol=0, atol=0)
    assert torch.equal(b_residuals[2], b_residuals[1])


def test_without_the_flag_ddp_drops_what_was_selected_from_an_unused_parameter(one_rank):
    """What the flag is for: the selection takes b's residual in a step without b,
    and DDP drops it (the mass is neither applied nor held)."""
    grads, applied, left, _ = _train(False, **SPARSE)
    lost = sum((grads[n] - applied[n] - left[n]).abs().sum() for n in ("b.weight", "b.bias"))
    assert lost > 1.0


def test_find_unused_parameters_must_be_a_bool():
    with pytest.raises(TypeError, match="find_unused_parameters must be True or False"):
        TopKHookState(density=0.1, find_unused_parameters="yes")


def test_the_velocity_is_held_with_the_residual(one_rank):
    """DGC's momentum correction keeps a velocity beside the residual: both are set
    aside for a parameter with a zero gradient, and both come back."""
    from gradsift.distributed.unused import hold_out_unused_, restore_held_

    state = TopKHookState(density=0.5, momentum_correction=0.9, find_unused_parameters=True)
    state.residual, state.velocity = torch.arange(1.0, 6.0), torch.arange(11.0, 16.0)
    before = state.residual.clone(), state.velocity.clone()
    flat = torch.tensor([0.5, 0.0, 0.0, 0.0, -1.0])  # parameters of 1, 3 and 1 values
    held = hold_out_unused_(state, flat, [1, 3, 1])
    assert state.residual.tolist() == [1.0, 0.0, 0.0, 0.0, 5.0]
    assert state.velocity.tolist() == [11.0, 0.0, 0.0, 0.0, 15.0]
    restore_held_(state, held)
    assert torch.equal(state.residual, before[0]) and torch.equal(state.velocity, before[1])

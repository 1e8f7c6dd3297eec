"""Which parameters have a gradient in a ``TopK`` step, where gradients are views of
one flat buffer and a zero view cannot say "no gradient" by itself.

torch's optimizers skip a parameter whose ``grad`` is None (no weight decay, no Adam
step, no momentum); ``TopK`` must skip the same ones. The reference is the bare inner
optimizer's view of the run: a parameter the loss did not use this step has no
gradient, and Adam's step count of each parameter counts the steps that reached it.
An in-place pass over every gradient (``clip_grad_norm_`` with a factor of 1.0 here,
which changes no value) must not give the others one.
"""

import pytest
import torch
from torch import nn

from gradsift import TopK


def adam_steps(opt, p) -> int:
    st = opt.optimizer.state.get(p, {})
    return int(st["step"]) if "step" in st else 0


def gradient(step, n, dtype=torch.float32):
    return torch.randn(n, generator=torch.Generator().manual_seed(step), dtype=dtype)


@pytest.mark.parametrize("clip", [False, True])
def test_a_dtype_backward_did_not_reach_has_no_gradient(clip):
    # float32 "main" every step, float64 "side" on even steps only: two buckets, the
    # float64 one untouched by backward on odd steps
    torch.manual_seed(0)
    main = nn.Parameter(torch.randn(20))
    side = nn.Parameter(torch.randn(6, dtype=torch.float64))
    opt = TopK(torch.optim.Adam([main, side], lr=0.1), density=0.25)
    for step in range(4):
        opt.zero_grad()
        loss = (main * gradient(step, 20)).sum()
        if step % 2 == 0:
            loss = loss + (side * gradient(step, 6, torch.float64)).sum()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_([main, side], 1e9)
        opt.step()
        assert adam_steps(opt, main) == step + 1
        assert adam_steps(opt, side) == step // 2 + 1, f"step {step}"


@pytest.mark.parametrize("clip", [False, True])
def test_assigned_gradients_leave_the_unused_views_without_one(clip):
    # gradients assigned by hand (autograd.grad); b used on the first step only
    torch.manual_seed(0)
    a, b = nn.Parameter(torch.randn(12)), nn.Parameter(torch.randn(12))
    opt = TopK(torch.optim.Adam([a, b], lr=0.1), density=0.25)
    for step in range(4):
        opt.zero_grad()
        used = [a, b] if step == 0 else [a]
        loss = sum((p * gradient(10 * step + i, 12)).sum() for i, p in enumerate(used))
        for p, g in zip(used, torch.autograd.grad(loss, used)):
            p.grad = g
        if clip:
            torch.nn.utils.clip_grad_norm_([a, b], 1e9)
        opt.step()
        assert (adam_steps(opt, a), adam_steps(opt, b)) == (step + 1, 1), f"step {step}"


def test_gradients_written_in_place_by_hand_are_all_present():
    # no backward and no assignment: the views written in place are the gradients,
    # a zero one included (weight decay acts on it, as on a zero torch gradient)
    a, b = nn.Parameter(torch.ones(8)), nn.Parameter(torch.ones(8))
    opt = TopK(torch.optim.SGD([a, b], lr=0.5, weight_decay=0.1), k=2)
    opt.zero_grad()  # a first step lays the views out
    a.grad = torch.zeros(8)
    b.grad = torch.zeros(8)
    opt.step()
    for step in range(2):
        opt.zero_grad()
        a.grad.copy_(gradient(step, 8))
        b.grad.zero_()  # a zero gradient, set in place
        opt.step()
    torch.testing.assert_close(b.detach(), torch.full((8,), 0.95**3), rtol=0, atol=1e-7)


def _laid_out_again(how, opt, params):
    """Make ``opt`` lay its buffers out again before its next step: ``params[3]``,
    frozen so far, is unfrozen; or joins in a new group; or the model changes dtype."""
    if how == "unfrozen":
        params[3].requires_grad_(True)
    elif how == "new group":
        opt.add_param_group({"params": [params[3]]})
    else:  # model.to(...): every parameter and gradient converted (Adam's moments too)
        for p in params:
            p.data = p.data.double()
            if p.grad is not None:
                p.grad = p.grad.double()
            for name in ("exp_avg", "exp_avg_sq"):
                if name in opt.optimizer.state.get(p, {}):
                    opt.optimizer.state[p][name] = opt.optimizer.state[p][name].double()


@pytest.mark.parametrize("how", ["unfrozen", "new group", "converted"])
@pytest.mark.parametrize("clip", [False, True])
def test_views_backward_did_not_reach_stay_absent_when_the_buffers_are_laid_out_again(
    how, clip
):
    # "used" every step, "once" on step 0 only, "hand" by assignment on step 2, and
    # "late" (frozen or outside the optimizer until step 2, frozen throughout when
    # converted) from step 2 on; the buffers are laid out again between zero_grad and
    # backward of step 2
    torch.manual_seed(0)
    used, once, hand, late = (nn.Parameter(torch.randn(12)) for _ in range(4))
    params = [used, once, hand, late]
    late.requires_grad_(how != "unfrozen")
    groups = [used, once, hand] + ([late] if how == "unfrozen" else [])
    opt = TopK(torch.optim.Adam(groups, lr=0.1), density=0.25)
    for step in range(4):
        opt.zero_grad()
        if step == 2:
            _laid_out_again(how, opt, params)
        dtype = used.dtype
        loss = (used * gradient(step, 12, dtype)).sum()
        if step == 0:
            loss = loss + (once * gradient(10 + step, 12, dtype)).sum()
        if step >= 2:
            loss = loss + (late * gradient(20 + step, 12, dtype)).sum()
        loss.backward()
        if step == 2:
            hand.grad = gradient(30, 12, dtype)
        if clip:
            torch.nn.utils.clip_grad_norm_(params, 1e9)
        opt.step()
        counts = [adam_steps(opt, p) for p in params]
        joined = 0 if how == "converted" else max(0, step - 1)  # frozen throughout
        assert counts == [step + 1, 1, int(step >= 2), joined], f"step {step}"


def test_an_unreached_parameter_keeps_its_residual_when_the_buffers_are_laid_out_again():
    # plain SGD with error feedback: "once" leaves a residual on step 0; a parameter
    # unfrozen on step 1 lays the buffers out again; "once" has no gradient then, so
    # its residual must not be selected and applied (the parameter would move)
    once, late = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(4))
    late.requires_grad_(False)
    opt = TopK(torch.optim.SGD([once, late], lr=1.0), k=1)
    once.grad = torch.tensor([1.0, 10.0, 20.0, 30.0])
    opt.step()  # applies 30 at index 3; 1, 10, 20 stay behind
    before = once.detach().clone()
    opt.zero_grad()
    late.requires_grad_(True)
    (late * torch.tensor([0.5, 0.0, 0.0, 0.0])).sum().backward()
    opt.step()
    assert torch.equal(once.detach(), before)
    assert opt.state[once]["residual"].tolist() == [1.0, 10.0, 20.0, 0.0]
    assert late.tolist() == [-0.5, 0.0, 0.0, 0.0]

"""The fused ``TopK`` + error-feedback step (``backend="triton"``) against the torch
path, bit for bit: parameters, residuals and velocities after several steps, on CPU
through the interpreter (a small model) or on the GPU where there is one."""

import pytest
import torch

from gradsift import NonFiniteGradError, TopK
from triton_support import DEVICE, DTYPES

SHAPES = [(40, 30), (40,), (9, 40), (9,)]  # 1609 coordinates in one bucket


def params(dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).to(dtype).to(DEVICE)) for s in SHAPES]


def gradient(ps, step):
    gen = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=gen).to(p.dtype).to(DEVICE) for p in ps]


def train(backend, *, steps=range(4), dtype=torch.float32, inner=None, bad_step=None, **topk):
    """``TopK`` steps with the gradients numbered ``steps``; ``bad_step``'s holds inf."""
    ps = params(dtype)
    inner = inner or (lambda q: torch.optim.SGD(q, lr=0.1))
    opt = TopK(inner(ps), backend=backend, **topk)
    flags = []
    for step in steps:
        for p, g in zip(ps, gradient(ps, step)):
            p.grad = g
        if step == bad_step:
            ps[2].grad[1, 3] = float("inf")
        opt.step()
        flags.append(None if opt.found_nonfinite is None else bool(opt.found_nonfinite))
        opt.zero_grad()
    return ps, opt, flags


def assert_same(a, b):
    (pa, oa, _), (pb, ob, _) = a, b
    for p, q in zip(pa, pb):
        torch.testing.assert_close(p.detach().cpu(), q.detach().cpu(), rtol=0, atol=0)
        for name in ("residual", "momentum"):
            if name in ob.state[q]:
                ra, rb = oa.state[p][name].cpu(), ob.state[q][name].cpu()
                torch.testing.assert_close(ra, rb, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("density", [0.002, 0.01, 0.3])  # staged and dense selection
def test_fused_step_equals_torch_path(dtype, density):
    got = train("triton", dtype=dtype, density=density)
    assert got[2] == [False] * 4, "the fused path ran and flagged nothing"
    assert_same(got, train("torch", dtype=dtype, density=density))


@pytest.mark.parametrize("topk", [{"error_feedback": False}, {"momentum_correction": 0.9}])
def test_fused_step_without_feedback_and_with_dgc_momentum(topk):
    got = train("triton", density=0.01, **topk)
    assert got[2] == [False] * 4
    assert_same(got, train("torch", density=0.01, **topk))


@pytest.mark.parametrize("density", [0.002, 0.3])  # staged and dense selection
def test_fused_step_with_64_bit_positions_equals_torch_path(monkeypatch, density):
    """The kernels of a gradient past 2**31 elements (64-bit positions in every pass),
    run on this small one by lowering the threshold."""
    from gradsift.select.triton import topk as triton_topk

    monkeypatch.setattr(triton_topk, "WIDE_FROM", 0)
    wide, prepare = [], triton_topk.Selection.prepare

    def spy(self, *args):
        prepare(self, *args)
        wide.append(self.wide)

    monkeypatch.setattr(triton_topk.Selection, "prepare", spy)
    got = train("triton", dtype=torch.bfloat16, density=density, momentum_correction=0.9)
    assert got[2] == [False] * 4 and wide and all(wide)
    want = train("torch", dtype=torch.bfloat16, density=density, momentum_correction=0.9)
    assert_same(got, want)


def test_other_inner_optimizers_step_on_the_fused_selection():
    def adam(q):
        return torch.optim.Adam(q, lr=0.01)

    got = train("triton", density=0.01, inner=adam)
    assert got[2] == [False] * 4
    assert_same(got, train("torch", density=0.01, inner=adam))


def test_nonfinite_gradient_skips_the_step_on_the_device():
    # plain SGD: no host sync; the bad step changes nothing and raises the flag
    skipped = train("triton", steps=[0, 1, 2], density=0.01, bad_step=1)
    assert skipped[2] == [False, True, False]
    assert_same(skipped, train("torch", steps=[0, 2], density=0.01))


def test_nonfinite_gradient_raises_with_another_inner_optimizer():
    with pytest.raises(NonFiniteGradError, match="non-finite"):
        train("triton", steps=[0, 1], density=0.01, bad_step=1, inner=lambda q: torch.optim.Adam(q))


@pytest.mark.parametrize("case", [{"scope": "layer"}, {"density": 1.0}, {"dtype": torch.float64}])
def test_torch_path_where_the_fused_step_does_not_apply(case):
    dtype = case.pop("dtype", torch.float32)
    topk = {"density": 0.01, **case}

    def run(backend):
        ps = params(dtype)
        opt = TopK(torch.optim.SGD(ps, lr=0.1), backend=backend, **topk)
        for step in range(3):
            for p, g in zip(ps, gradient(ps, step)):
                p.grad = g
            opt.step()
            assert opt.found_nonfinite is None, "the torch path ran"
            opt.zero_grad()
        return ps, opt, None

    assert_same(run("triton"), run("torch"))


@pytest.mark.parametrize(
    "topk",
    [{}, {"momentum_correction": 0.9}, {"inner": "adam"}, {"error_feedback": False}],
)
def test_fused_step_holds_out_parameters_without_gradient(topk):
    # a parameter without a gradient (a different one each step, then none missing)
    # keeps the fused path: its coordinates are held out of the selection
    topk = dict(topk)
    adam = topk.pop("inner", None) == "adam"

    def run(backend):
        ps = params()
        inner = torch.optim.Adam(ps, lr=0.01) if adam else torch.optim.SGD(ps, lr=0.1)
        opt = TopK(inner, backend=backend, density=0.01, **topk)
        flags = []
        # step 1: small gradients, so that parameter 0's residual would win if it ran
        for step, (missing, scale) in enumerate([(1, 1.0), (0, 0.01), (None, 1.0), (3, 1.0)]):
            for i, (p, g) in enumerate(zip(ps, gradient(ps, step))):
                p.grad = None if i == missing else g * scale
            opt.step()
            flags.append(opt.found_nonfinite is not None)
            opt.zero_grad(set_to_none=True)
        return ps, opt, flags

    got = run("triton")
    assert got[2] == [True] * 4, "the fused path ran"
    assert_same(got, run("torch"))


def test_an_assigned_zero_gradient_stays_present_where_the_fused_step_falls_back():
    # backward fills three gradients, the fourth is assigned zeros: it has a gradient
    # (weight decay acts on it), also once the fused check re-pointed it at its view
    def run(backend):
        ps = params()
        opt = TopK(torch.optim.SGD(ps, lr=0.1, weight_decay=0.5), backend=backend, density=1.0)
        for step in range(2):
            gs = gradient(ps, step)
            sum((p * g).sum() for p, g in zip(ps[:3], gs)).backward()
            ps[3].grad = torch.zeros_like(ps[3])
            opt.step()
            assert opt.found_nonfinite is None
            assert opt.fallback_steps == (backend != "torch") * (step + 1)
            opt.zero_grad()
        return ps, opt, None

    before = params()[3].detach().clone()
    got = run("triton")
    assert not torch.equal(got[0][3].detach(), before), "weight decay must reach it"
    assert_same(got, run("torch"))


def test_fused_step_follows_a_learning_rate_schedule_without_a_new_table():
    # a scheduler changes the learning rates every step: the fused step copies them
    # into its table (the kernel reads it when it runs), keeping the layout's key, so
    # that a captured step stays valid on the GPU
    def run(backend):
        ps = params()
        groups = [{"params": ps[:2], "lr": 0.1}, {"params": ps[2:], "lr": 0.03}]
        opt = TopK(torch.optim.SGD(groups), backend=backend, density=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
        keys = []
        for step in range(4):
            for p, g in zip(ps, gradient(ps, step)):
                p.grad = g
            opt.step()
            sched.step()
            if backend == "triton":
                fused = opt._fused[1]
                keys.append((fused._table_key, fused._table[2].data_ptr()))
                assert fused._table[2].tolist() == pytest.approx(
                    [0.1 / (1 + step)] * 2 + [0.03 / (1 + step)] * 2
                )
            opt.zero_grad()
        assert len(set(keys)) <= 1, "the table was rebuilt when the learning rate changed"
        return ps, opt, None

    assert_same(run("triton"), run("torch"))


def test_backend_triton_after_the_model_left_the_gpu_raises_naming_the_backend(monkeypatch):
    # backend="triton" is checked when TopK is built; a model moved off the GPU later
    # (here: the interpreter switched off) raises the same clear error at the step,
    # not Triton's "cannot be accessed from Triton (cpu tensor?)"
    ps = params()
    opt = TopK(torch.optim.SGD(ps, lr=0.1), backend="triton", density=0.01)
    for p, g in zip(ps, gradient(ps, 0)):
        p.grad = g
    if DEVICE.type == "cuda":
        for p in ps:
            p.data, p.grad = p.data.cpu(), p.grad.cpu()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="backend='triton' needs CUDA tensors"):
        opt.step()


def test_a_step_without_backward_after_a_declined_fused_step_moves_nothing():
    # step 1 reaches the first parameter only (the others keep grad None); after
    # zero_grad a step with no backward at all: the fused step declines (no
    # gradient), having zeroed the None gradients' slices, and the torch path after
    # it must not take the untouched zero views for gradients (Adam moved them)
    def run(backend):
        ps = params()
        opt = TopK(torch.optim.Adam(ps, lr=0.1), k=7, backend=backend)
        loss = (ps[0] * gradient(ps[:1], 0)[0]).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        before = [p.detach().clone() for p in ps]
        opt.step()
        assert all(torch.equal(p, b) for p, b in zip(ps, before))
        return ps, opt, None

    assert_same(run("triton"), run("torch"))


def test_a_declined_fused_step_leaves_the_unused_views_without_gradient():
    # k = the first parameter's size: the fused step runs on step 0 (every parameter
    # used), then declines (only the first used: every coordinate kept) after it has
    # attached the gradients, copying the assigned one in; the torch path after it
    # must still see that the unused parameters have none, as backend="torch" does
    def run(backend):
        ps = params()
        opt = TopK(torch.optim.SGD(ps, lr=0.5), k=1200, backend=backend)
        for step in range(3):
            opt.zero_grad()
            used = ps if step == 0 else ps[:1]
            loss = sum((p * g).sum() for p, g in zip(used, gradient(used, step)))
            for p, g in zip(used, torch.autograd.grad(loss, used)):
                p.grad = g
            opt.step()
        assert opt.fallback_steps == (2 if backend == "triton" else 0)
        return ps, opt, None

    assert_same(run("triton"), run("torch"))

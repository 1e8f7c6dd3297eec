"""TopK and sparsify_grads_ against brute-force references."""

import copy
import gc
import weakref

import pytest
import torch
from torch import nn

from gradsift import NonFiniteGradError, TopK, sparsify_grads_
from gradsift.budget import resolve_k
from gradsift.optim.sparse_sgd import plain_sgd


class Net(nn.Module):
    """Tied weights (embedding/output), a frozen layer and an unused layer."""

    def __init__(self, dtype=torch.float64):
        super().__init__()
        self.emb = nn.Embedding(12, 8)
        self.hidden = nn.Linear(8, 8)
        self.frozen = nn.Linear(8, 8)
        self.unused = nn.Linear(8, 8)
        self.out = nn.Linear(8, 12, bias=False)
        self.out.weight = self.emb.weight  # tied
        for p in self.frozen.parameters():
            p.requires_grad_(False)
        self.to(dtype)

    def forward(self, tokens):
        h = torch.tanh(self.hidden(self.emb(tokens)))
        return self.out(self.frozen(h))


def batch(seed, n=16):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 12, (n,), generator=gen)
    return x, torch.randint(0, 12, (n,), generator=gen)


def loss_of(model, seed):
    x, y = batch(seed)
    return nn.functional.cross_entropy(model(x), y)


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def grad_of(p):
    """``p.grad``, or zeros where backward never reached ``p`` (grad None, as in torch)."""
    return torch.zeros_like(p) if p.grad is None else p.grad


def zero_grads(params):
    """``params`` with zero gradients, given before ``TopK`` lays them out as views of
    its flat buffer (it leaves a missing gradient None, as torch does): the tests
    that write gradients in place, without backward, write into those views."""
    for p in params:
        p.grad = torch.zeros_like(p)
    return params


def brute_force_topk(grads, k):
    """Reference: concatenate, stable sort by |g| (ties: lowest index), keep k."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    order = torch.sort(-flat.abs(), stable=True).indices[:k]
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask[order] = True
    return flat, mask


@pytest.mark.parametrize("k", [1, 7, 50])
def test_one_step_changes_exactly_top_k(k):
    torch.manual_seed(0)
    model = Net()
    lr = 0.1
    opt = TopK(torch.optim.SGD(model.parameters(), lr=lr), k=k, error_feedback=False)
    before = [p.detach().clone() for p in model.parameters()]
    loss_of(model, 1).backward()
    grads = [grad_of(p).clone() for p in trainable(model)]
    flat, mask = brute_force_topk(grads, k)
    opt.step()
    delta = torch.cat(
        [
            (p.detach() - b).reshape(-1)
            for p, b in zip(model.parameters(), before)
            if p.requires_grad
        ]
    )
    torch.testing.assert_close(delta, torch.where(mask, -lr * flat, 0.0), rtol=1e-12, atol=0)
    assert int((delta != 0).sum()) == k
    # the frozen layer is untouched, and p.grad now holds the sparse gradient
    names = [n for n, _ in model.named_parameters()]
    for name, p in model.frozen.named_parameters():
        assert torch.equal(p, before[names.index(f"frozen.{name}")])
    sparse = torch.cat([grad_of(p).reshape(-1) for p in trainable(model)])
    torch.testing.assert_close(sparse, torch.where(mask, flat, 0.0), rtol=0, atol=0)


def test_tensor_scope_selects_within_each_tensor():
    model = Net()
    k = 3
    opt = TopK(
        torch.optim.SGD(model.parameters(), lr=1.0), k=k, error_feedback=False, scope="layer"
    )
    loss_of(model, 2).backward()
    grads = {id(p): grad_of(p).clone() for p in trainable(model)}
    opt.step()
    for p in trainable(model):
        g = grads[id(p)]
        flat, mask = brute_force_topk([g], min(k, g.numel()))
        torch.testing.assert_close(grad_of(p).reshape(-1), torch.where(mask, flat, 0.0))


def test_k_equal_n_is_plain_sgd():
    torch.manual_seed(0)
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    n = sum(p.numel() for p in trainable(a))
    opt_a = TopK(torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9), k=n)
    opt_b = torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9)
    for step in range(5):
        for model, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            loss_of(model, step).backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_error_feedback_conserves_mass():
    torch.manual_seed(0)
    model = Net(torch.float64)
    lr = 0.01
    opt = TopK(torch.optim.SGD(model.parameters(), lr=lr), k=5)
    start = [p.detach().clone() for p in trainable(model)]
    raw_sum = [torch.zeros_like(p) for p in trainable(model)]
    for step in range(40):
        opt.zero_grad()
        loss_of(model, step).backward()
        for s, p in zip(raw_sum, trainable(model)):
            s += grad_of(p)
        opt.step()
    for p, p0, s in zip(trainable(model), start, raw_sum):
        applied = (p0 - p.detach()) / lr
        torch.testing.assert_close(applied + opt.state[p]["residual"], s, rtol=0, atol=1e-9)


@pytest.mark.parametrize("density", [0.001, 0.01])  # block-key path, direct path
@pytest.mark.parametrize("ef", [True, False])
def test_fused_path_matches_functional_reference(density, ef):
    # large enough for the sampled paths of the kernel
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(s)) for s in [(300, 301), (5,), (40_000,), (7, 3, 3)]]
    ref = [nn.Parameter(p.detach().clone()) for p in params]
    zero_grads(params)
    opt = TopK(torch.optim.SGD(params, lr=0.1), density=density, error_feedback=ef)
    residuals = [torch.zeros_like(p) for p in ref] if ef else None
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        for p, q, g in zip(params, ref, grads):
            p.grad.copy_(g)
            q.grad = g.clone()
        opt.step()
        sparsify_grads_(ref, density=density, residuals=residuals)
        with torch.no_grad():
            for q in ref:
                q -= 0.1 * q.grad
        for i, (p, q) in enumerate(zip(params, ref)):
            assert torch.equal(p.grad, q.grad)
            torch.testing.assert_close(p, q, rtol=0, atol=1e-7)
            if ef:
                assert torch.equal(opt.state[p]["residual"], residuals[i])


@pytest.mark.parametrize(
    "inner, topk",
    [
        ("sgd", {"density": 0.001}),
        ("sgd", {"density": 0.01, "momentum_correction": 0.9}),
        ("sgd", {"k": 120_000}),  # more than the present coordinates on two steps
        ("sgd-momentum", {"density": 0.01}),
        ("sgd", {"density": 0.01, "error_feedback": False}),
    ],
)
def test_flat_path_holds_out_parameters_without_gradient(monkeypatch, inner, topk):
    # a parameter without a gradient this step is held out of the flat selection (its
    # residual and velocity set aside): the same result as the selection over the
    # present gradients alone (sparsify_grads_ skips grad=None), and no concatenation
    import gradsift.optim.grads as grads_module

    def no_concatenation(*args, **kwargs):
        raise AssertionError("the flat path must run")

    monkeypatch.setattr(grads_module, "sparsify_tensors_", no_concatenation)
    torch.manual_seed(0)
    shapes = [(300, 301), (5,), (40_000,), (7, 3, 3), (20_000,)]
    params = [nn.Parameter(torch.randn(s)) for s in shapes]
    ref = [nn.Parameter(p.detach().clone()) for p in params]

    def make(ps):
        if inner == "sgd":
            return torch.optim.SGD(ps, lr=0.1)
        return torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)

    opt, ref_opt = TopK(make(params), **topk), make(ref)
    ef = topk.get("error_feedback", True)
    m = topk.get("momentum_correction")
    residuals = [torch.zeros_like(p) for p in ref] if ef else None
    velocities = [torch.zeros_like(p) for p in ref] if m else None
    budget = {key: topk[key] for key in ("k", "density") if key in topk}
    for step, missing in enumerate([None, 2, 0, None, 4, 2]):
        gen = torch.Generator().manual_seed(step)
        grads = [torch.randn(p.shape, generator=gen) for p in params]
        opt.zero_grad()
        # backward reaches every parameter but the missing one, each with gradient g
        sum((p * g).sum() for i, (p, g) in enumerate(zip(params, grads)) if i != missing).backward()
        for i, (q, g) in enumerate(zip(ref, grads)):
            q.grad = None if i == missing else g.clone()
        opt.step()
        sparsify_grads_(  # the reference: a concatenation of the present gradients
            ref, residuals=residuals, velocities=velocities, momentum_correction=m, **budget
        )
        ref_opt.step()
        for i, (p, q) in enumerate(zip(params, ref)):
            # the sparse SGD apply rounds lr * g as index_add_ does: ulps from SGD's add_
            torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=f"step {step}, {i}")
            for name, states in (("residual", residuals), ("momentum", velocities)):
                if states is not None:
                    assert torch.equal(opt.state[p][name], states[i]), (step, i, name)
        if missing is not None:
            assert params[missing].grad is not None  # the zero view is back after the step


@pytest.mark.parametrize(
    "topk",
    [{"density": 0.01}, {"density": 0.01, "momentum_correction": 0.5}, {"k": 3000}],
)
@pytest.mark.parametrize("scope", ["global", "layer"])
def test_flat_path_selects_across_dtype_buckets(monkeypatch, topk, scope):
    # float32 and float64 parameters (two buckets) select one global top-k in place,
    # as the concatenation does, parameters without a gradient held out (or each
    # parameter alone on its slices, scope="layer"); dyadic gradients keep every sum
    # exact in both dtypes
    import gradsift.optim.grads as grads_module

    def no_concatenation(*args, **kwargs):
        raise AssertionError("the flat path must run")

    monkeypatch.setattr(grads_module, "sparsify_tensors_", no_concatenation)
    torch.manual_seed(0)
    spec = [((300, 301), torch.float32), ((40_000,), torch.float64), ((7, 3, 3), torch.float32)]
    spec += [((20_000,), torch.float64)]
    params = [nn.Parameter((torch.randint(-64, 65, s) / 64).to(d)) for s, d in spec]
    ref = [nn.Parameter(p.detach().clone()) for p in params]
    opt = TopK(torch.optim.SGD(params, lr=0.5), scope=scope, **topk)
    ref_opt = torch.optim.SGD(ref, lr=0.5)
    assert len(opt._grads.buckets) == 2
    m = topk.get("momentum_correction")
    residuals = [torch.zeros_like(p) for p in ref]
    velocities = [torch.zeros_like(p) for p in ref] if m else None
    budget = {key: topk[key] for key in ("k", "density") if key in topk}
    for step, missing in enumerate([None, 1, 0, None, 3]):
        gen = torch.Generator().manual_seed(step)
        grads = [
            (torch.randint(-512, 513, p.shape, generator=gen) / 64).to(p.dtype) for p in params
        ]
        opt.zero_grad()
        sum((p * g).sum() for i, (p, g) in enumerate(zip(params, grads)) if i != missing).backward()
        for i, (q, g) in enumerate(zip(ref, grads)):
            q.grad = None if i == missing else g.clone()
        opt.step()
        sparsify_grads_(
            ref,
            residuals=residuals,
            velocities=velocities,
            momentum_correction=m,
            scope=scope,
            **budget,
        )
        ref_opt.step()
        for i, (p, q) in enumerate(zip(params, ref)):
            assert torch.equal(p, q), (step, i)
            assert torch.equal(opt.state[p]["residual"], residuals[i]), (step, i)
            if m:
                assert torch.equal(opt.state[p]["momentum"], velocities[i]), (step, i)


def _train(opt_factory, steps, model=None, opt=None, start=0):
    if model is None:
        torch.manual_seed(0)
        model = Net()
        opt = opt_factory(model)
    for step in range(start, steps):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
    return model, opt


def test_state_dict_resume_is_bit_for_bit(tmp_path):
    def factory(model):
        return TopK(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), k=9)

    full, _ = _train(factory, 10)
    half, opt = _train(factory, 5)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": half.state_dict(), "opt": opt.state_dict()}, path)
    ckpt = torch.load(path)
    assert all("residual" in st for st in ckpt["opt"]["state"].values())
    torch.manual_seed(123)
    resumed = Net()
    resumed.load_state_dict(ckpt["model"])
    opt2 = factory(resumed)
    opt2.load_state_dict(ckpt["opt"])
    # the wrapper must hold no stale references after load_state_dict
    assert opt2.param_groups is opt2.optimizer.param_groups
    _train(factory, 10, resumed, opt2, start=5)
    for p, q in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_state_dict_does_not_leak_into_inner_state():
    model = Net()
    opt = TopK(torch.optim.Adam(model.parameters(), lr=1e-3), k=5)
    loss_of(model, 0).backward()
    opt.step()
    opt.state_dict()
    assert all("residual" not in st for st in opt.optimizer.state.values())


def test_lr_scheduler_drives_the_inner_lr():
    model = Net()
    opt = TopK(torch.optim.SGD(model.parameters(), lr=1.0), k=5)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for step in range(3):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
        sched.step()
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.125)


def test_grad_scaler_skips_inf_step_and_keeps_residuals():
    torch.manual_seed(0)
    model = Net(torch.float32)
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    scaler.scale(loss_of(model, 0)).backward()
    scaler.step(opt)
    scaler.update()
    residuals = {p: opt.state[p]["residual"].clone() for p in trainable(model)}
    params = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    scaler.scale(loss_of(model, 1)).backward()
    model.hidden.weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 2.0**7
    for p in trainable(model):
        assert torch.equal(opt.state[p]["residual"], residuals[p])
    for p, q in zip(model.parameters(), params):
        assert torch.equal(p, q)


def test_non_finite_grad_raises_naming_parameter_and_modifies_nothing():
    model = Net()
    opt = TopK(torch.optim.SGD(model.named_parameters(), lr=0.1), k=5)
    loss_of(model, 0).backward()
    model.hidden.bias.grad[3] = float("nan")
    grads = [p.grad if p.grad is None else p.grad.clone() for p in trainable(model)]
    params = copy.deepcopy(list(model.parameters()))
    with pytest.raises(NonFiniteGradError, match="hidden.bias"):
        opt.step()
    for p, g in zip(trainable(model), grads):
        assert (p.grad is None) == (g is None)
        if g is not None:
            torch.testing.assert_close(p.grad, g, equal_nan=True, rtol=0, atol=0)
        assert not opt.state[p]["residual"].any()
    for p, q in zip(model.parameters(), params):
        assert torch.equal(p, q)


@pytest.mark.parametrize("how", ["set_to_none", "model_zero_grad", "assign"])
def test_dropped_views_stay_correct(how):
    # dropping every view also frees the flat buffer, as torch frees gradients
    # between steps (TopK then holds only its residuals); a gradient a user kept
    # is never written again
    torch.manual_seed(0)
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    opt_a = TopK(torch.optim.SGD(a.parameters(), lr=0.1), k=6)
    opt_b = TopK(torch.optim.SGD(b.parameters(), lr=0.1), k=6)
    kept = []
    for step in range(5):
        opt_a.zero_grad()
        loss_of(a, step).backward()
        opt_a.step()
        if how == "assign":
            opt_b.zero_grad()
            grads = torch.autograd.grad(loss_of(b, step), trainable(b), allow_unused=True)
            for p, g in zip(trainable(b), grads):
                p.grad = torch.zeros_like(p) if g is None else g
        else:
            flat = opt_b._grads.buckets[0].grad  # none before the first step
            assert (flat is None) == (step == 0), step
            ref = weakref.ref(flat if step else torch.empty(0))  # dead at once at step 0
            del flat
            if step == 3:
                kept = [(p.grad, p.grad.clone()) for p in trainable(b) if p.grad is not None]
            opt_b.zero_grad(set_to_none=True) if how == "set_to_none" else b.zero_grad()
            gc.collect()
            assert (ref() is None) == (step != 3), step
            loss_of(b, step).backward()
        opt_b.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-15)
    for g, saved in kept:
        assert torch.equal(g, saved)


def test_zero_grad_leaves_a_dropped_gradient_someone_kept_alone():
    model = Net()
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=6)
    loss_of(model, 0).backward()
    kept = model.hidden.weight.grad
    saved = kept.clone()
    model.zero_grad()  # drops every view; ``kept`` keeps the buffer alive
    opt.zero_grad()
    loss_of(model, 1).backward()
    opt.step()
    assert saved.any() and torch.equal(kept, saved)


def test_param_groups_and_mixed_dtypes():
    torch.manual_seed(0)
    w32 = nn.Parameter(torch.randn(20, dtype=torch.float32))
    w64 = nn.Parameter(torch.randn(30, dtype=torch.float64))
    opt = TopK(
        torch.optim.SGD([{"params": [w32], "lr": 1.0}, {"params": [w64], "lr": 0.5}], lr=0.1),
        k=4,
        error_feedback=False,
    )
    g32, g64 = torch.randn(20), torch.randn(30, dtype=torch.float64)
    w32.grad, w64.grad = g32.clone(), g64.clone()
    before32, before64 = w32.detach().clone(), w64.detach().clone()
    opt.step()
    flat, mask = brute_force_topk([g32.double(), g64], 4)
    torch.testing.assert_close(
        before32 - w32.detach(), torch.where(mask[:20], flat[:20], 0).float()
    )
    torch.testing.assert_close(before64 - w64.detach(), 0.5 * torch.where(mask[20:], flat[20:], 0))


def test_grad_none_params_are_skipped_with_residual_kept():
    a = nn.Parameter(torch.ones(4))
    b = nn.Parameter(torch.ones(4))
    opt = TopK(torch.optim.SGD([a, b], lr=1.0), k=1)
    a.grad = torch.tensor([0.0, 3.0, 1.0, 0.0])
    b.grad = None
    opt.zero_grad(set_to_none=True)
    a.grad = torch.tensor([0.0, 3.0, 1.0, 0.0])
    opt.step()
    assert b.grad is None and torch.equal(b, torch.ones(4))
    assert a.tolist() == [1.0, -2.0, 1.0, 1.0]
    assert opt.state[a]["residual"].tolist() == [0.0, 0.0, 1.0, 0.0]


def test_closure_is_called():
    model = Net()
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=5)

    def closure():
        opt.zero_grad()
        loss = loss_of(model, 0)
        loss.backward()
        return loss

    assert opt.step(closure) is not None


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, ValueError, "exactly one"),
        ({"k": 5, "density": 0.1}, ValueError, "exactly one"),
        ({"k": 0}, ValueError, "k must be >= 1"),
        ({"k": 2.5}, TypeError, "k must be an int"),
        ({"density": 0.0}, ValueError, r"density must be in \(0, 1\]"),
        ({"density": 1.5}, ValueError, r"density must be in \(0, 1\]"),
        ({"density": "0.1"}, TypeError, "density must be a float"),
        ({"k": 5, "scope": "layers"}, ValueError, "scope must be one of"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    model = Net()
    with pytest.raises(error, match=match):
        TopK(torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)


def test_wraps_only_optimizers():
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        TopK([nn.Parameter(torch.ones(2))], k=1)


def test_old_scope_name_still_works_with_a_warning():
    model = Net()
    with pytest.warns(DeprecationWarning, match='scope="tensor" is deprecated'):
        opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=3, scope="tensor")
    assert opt.scope == "layer"


def test_zero_grad_after_fused_step_zeroes_everything():
    # zero_grad zeroes only the selected coordinates when nothing touched the buffer
    # since the step; after another backward it must zero the whole buffer again
    torch.manual_seed(0)
    params = zero_grads([nn.Parameter(torch.randn(300, 300)), nn.Parameter(torch.randn(5000))])
    opt = TopK(torch.optim.SGD(params, lr=0.1), density=0.01)
    for p in params:
        p.grad.copy_(torch.randn_like(p))
    opt.step()
    assert sum(int((p.grad != 0).sum()) for p in params) == resolve_k(95_000, density=0.01)
    opt.zero_grad()
    assert all(not p.grad.any() for p in params)
    for p in params:
        p.grad.copy_(torch.randn_like(p))
    opt.step()
    for p in params:
        p.grad.add_(1.0)  # a new backward after the step
    opt.zero_grad()
    assert all(not p.grad.any() for p in params)


def test_plain_sgd_fast_path_equals_inner_step():
    torch.manual_seed(0)
    shapes = [(300, 301), (7,), (40_000,)]
    a = zero_grads([nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in shapes])
    b = zero_grads([nn.Parameter(p.detach().clone()) for p in a])
    opt_a = TopK(torch.optim.SGD(a, lr=0.3), density=0.01)  # fast path
    inner = torch.optim.SGD(b, lr=0.3)
    inner.register_step_pre_hook(lambda *args: None)  # a hook disables the fast path
    opt_b = TopK(inner, density=0.01)
    assert plain_sgd(opt_a.optimizer)
    assert not plain_sgd(opt_b.optimizer)
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        for p, q in zip(a, b):
            g = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.grad.copy_(g)
            q.grad.copy_(g)
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-15, atol=1e-15)


def test_zero_grad_resets_an_assigned_grad():
    a = nn.Parameter(torch.ones(4))
    opt = TopK(torch.optim.SGD([a], lr=1.0), k=1)
    a.grad = torch.full((4,), 5.0)  # a foreign tensor, not the flat-buffer view
    opt.zero_grad()
    assert torch.equal(a.grad, torch.zeros(4))
    (a * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    opt.step()
    assert a.tolist() == [1.0, 1.0, 1.0, -3.0]


def reference_dgc(params0, grads_per_step, k, lr, m):
    """Deep Gradient Compression, Alg. 1 with momentum correction and factor masking."""
    theta = torch.cat([p.reshape(-1) for p in params0]).clone()
    u = torch.zeros_like(theta)
    v = torch.zeros_like(theta)
    for grads in grads_per_step:
        g = torch.cat([x.reshape(-1) for x in grads])
        u = m * u + g
        v = v + u
        order = torch.sort(-v.abs(), stable=True).indices[:k]
        send = torch.zeros_like(v)
        send[order] = v[order]
        v[order] = 0
        u[order] = 0
        theta = theta - lr * send
    return theta


@pytest.mark.parametrize("scope_tensor_none", [False, True])
def test_momentum_correction_matches_dgc_reference(scope_tensor_none):
    torch.manual_seed(0)
    shapes = [(6, 5), (7,), (4, 3)]
    params = zero_grads([nn.Parameter(torch.randn(s, dtype=torch.float64)) for s in shapes])
    start = [p.detach().clone() for p in params]
    opt = TopK(torch.optim.SGD(params, lr=0.1), k=5, momentum_correction=0.9)
    gen = torch.Generator().manual_seed(1)
    history = []
    for _ in range(6):
        grads = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
        history.append(grads)
        if scope_tensor_none:  # foreign grads: the generic (non-fused) path
            opt.zero_grad(set_to_none=True)
            for p, g in zip(params, grads):
                p.grad = g.clone()
        else:
            for p, g in zip(params, grads):
                p.grad.copy_(g)
        opt.step()
    expected = reference_dgc(start, history, k=5, lr=0.1, m=0.9)
    got = torch.cat([p.detach().reshape(-1) for p in params])
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    sd = opt.state_dict()
    assert all({"residual", "momentum"} <= set(st) for st in sd["state"].values())


def test_momentum_correction_resume_is_bit_for_bit():
    def factory(model):
        return TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=9, momentum_correction=0.9)

    full, _ = _train(factory, 8)
    half, opt = _train(factory, 4)
    ckpt = copy.deepcopy({"model": half.state_dict(), "opt": opt.state_dict()})
    resumed = Net()
    resumed.load_state_dict(ckpt["model"])
    opt2 = factory(resumed)
    opt2.load_state_dict(ckpt["opt"])
    _train(factory, 8, resumed, opt2, start=4)
    for p, q in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"momentum_correction": 1.0}, "momentum_correction must be"),
        ({"momentum_correction": 0.9, "error_feedback": False}, "needs error_feedback"),
    ],
)
def test_momentum_correction_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TopK(torch.optim.SGD(Net().parameters(), lr=0.1), k=3, **kwargs)
    with pytest.raises(ValueError, match="set its momentum=0"):
        TopK(
            torch.optim.SGD(Net().parameters(), lr=0.1, momentum=0.9), k=3, momentum_correction=0.9
        )


def test_momentum_correction_refuses_inner_momentum_added_or_loaded_later():
    # DGC's velocity replaces the inner momentum: a group added with momentum, or a
    # state dict whose groups have it, would stack the two
    a, b = nn.Parameter(torch.randn(8)), nn.Parameter(torch.randn(8))
    opt = TopK(torch.optim.SGD([a], lr=0.1), k=2, momentum_correction=0.9)
    with pytest.raises(ValueError, match="set its momentum=0"):
        opt.add_param_group({"params": [b], "momentum": 0.9})
    assert len(opt.param_groups) == 1
    opt.add_param_group({"params": [b]})  # the inner default, 0
    sd = opt.state_dict()
    sd["param_groups"][1]["momentum"] = 0.9
    with pytest.raises(ValueError, match="set its momentum=0"):
        opt.load_state_dict(sd)
    assert [g["momentum"] for g in opt.param_groups] == [0, 0]


# --- issue 15: silent wrong results and crashes seen on real setups ---------------


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1),
        lambda ps: torch.optim.Adam(ps, lr=0.1, weight_decay=0.1),
    ],
    ids=["sgd-momentum-wd", "adam"],
)
def test_parameter_without_gradient_is_left_alone(make):
    # a layer unused in the forward (or a step with no backward at all) has no
    # gradient: the inner optimizer alone leaves it alone, and so must TopK
    torch.manual_seed(0)
    model = Net()
    opt = TopK(make(trainable(model)), k=5)
    unused = [p.detach().clone() for p in model.unused.parameters()]
    for step in range(3):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
    for p, q in zip(model.unused.parameters(), unused):
        assert torch.equal(p, q), "a parameter that never had a gradient moved"
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    opt.step()  # no backward at all since zero_grad
    for p, q in zip(model.parameters(), before):
        assert torch.equal(p, q), "a step without any gradient moved a parameter"


def test_in_place_gradients_without_backward_still_count():
    (p,) = zero_grads([nn.Parameter(torch.zeros(4))])
    opt = TopK(torch.optim.SGD([p], lr=1.0), k=1)
    p.grad.copy_(torch.tensor([0.0, 2.0, -3.0, 1.0]))  # written into the view, no backward
    opt.step()
    assert p.tolist() == [0.0, 0.0, 3.0, 0.0]


def test_model_converted_after_building_topk():
    torch.manual_seed(0)
    model = Net(torch.float32)
    ref = Net(torch.float32)
    ref.load_state_dict(model.state_dict())
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=7)
    ref_opt = TopK(torch.optim.SGD(ref.parameters(), lr=0.1), k=7)
    for m, o in ((model, opt), (ref, ref_opt)):  # one float32 step builds residuals
        o.zero_grad()
        loss_of(m, 0).backward()
        o.step()
    model.to(torch.float64)
    ref_opt.zero_grad()
    ref.to(torch.float64)
    ref_opt = TopK(torch.optim.SGD(ref.parameters(), lr=0.1), k=7)
    ref_opt.load_state_dict(opt.state_dict())  # the residuals, carried over by hand
    for step in (1, 2):
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            loss_of(m, step).backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.dtype == torch.float64 and torch.equal(p, q)
    assert all(opt.state[p]["residual"].dtype == torch.float64 for p in trainable(model))


def test_closure_reaches_an_optimizer_that_needs_it():
    torch.manual_seed(0)
    target = torch.randn(6, dtype=torch.float64)

    def run(wrap):
        w = nn.Parameter(torch.zeros(6, dtype=torch.float64))
        inner = torch.optim.LBFGS([w], lr=1.0, max_iter=5)
        opt = TopK(inner, density=1.0) if wrap else inner

        def closure():
            opt.zero_grad()
            loss = ((w - target) ** 2).sum()
            loss.backward()
            return loss

        for _ in range(2):
            opt.step(closure)
        return w.detach()

    assert torch.equal(run(True), run(False))


def test_full_density_is_the_inner_optimizer_bit_for_bit():
    torch.manual_seed(0)
    shapes = [(300, 301), (7,), (40_000,)]
    a = zero_grads([nn.Parameter(torch.randn(s)) for s in shapes])
    b = [nn.Parameter(p.detach().clone()) for p in a]
    opt_a = TopK(torch.optim.SGD(a, lr=0.3), density=1.0)
    opt_b = torch.optim.SGD(b, lr=0.3)
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        for p, q in zip(a, b):
            g = torch.randn(p.shape, generator=gen)
            p.grad.copy_(g)
            q.grad = g.clone()
        opt_a.step()
        opt_b.step()
    for p, q in zip(a, b):
        assert torch.equal(p, q)


def test_sparse_gradients_are_refused_or_densified_clearly():
    emb = nn.Embedding(10, 4, sparse=True)
    with pytest.raises(TypeError, match="SparseAdam"):
        TopK(torch.optim.SparseAdam(emb.parameters(), lr=0.1), k=3)
    opt = TopK(torch.optim.SGD(emb.parameters(), lr=1.0), k=3, error_feedback=False)
    opt.zero_grad(set_to_none=True)
    emb(torch.tensor([1, 2])).sum().backward()
    assert emb.weight.grad.is_sparse
    before = emb.weight.detach().clone()
    opt.step()  # densified: the same update a dense Embedding would get
    changed = (emb.weight != before).sum()
    assert int(changed) == 3


def test_channels_last_parameters_keep_their_gradient_layout():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    ref = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    ref.load_state_dict(conv.state_dict())
    opt = TopK(torch.optim.SGD(conv.parameters(), lr=0.1), k=20)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "gradient layout contract" warning
        conv(x).sum().backward()
    assert conv.weight.grad.stride() == conv.weight.stride()
    ref(x).sum().backward()
    flat, mask = brute_force_topk([p.grad for p in ref.parameters()], 20)
    offset = 0
    for p in ref.parameters():  # the reference: plain SGD on the brute-force top-k
        n = p.numel()
        kept = torch.where(mask[offset : offset + n], flat[offset : offset + n], 0.0)
        p.grad.copy_(kept.view_as(p))
        offset += n
    opt.step()
    ref_opt.step()
    for p, q in zip(conv.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)


def test_k_larger_than_the_model_is_an_error_naming_both_numbers():
    model = Net()
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match=rf"k=1000000000 .* {n} trainable coordinates"):
        TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=10**9)
    biggest = max(p.numel() for p in model.parameters() if p.requires_grad)
    with pytest.raises(ValueError, match=rf"k={biggest + 1} .* {biggest} .*layer scope"):
        TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=biggest + 1, scope="layer")
    TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=n)  # every coordinate: allowed


def test_k_is_checked_again_when_a_group_is_added():
    model = Net()
    first, *rest = list(model.parameters())
    opt = TopK(torch.optim.SGD(rest, lr=0.1), k=first.numel() + 1)
    opt.add_param_group({"params": [first]})  # more coordinates: still fine
    assert opt.k == first.numel() + 1


def test_a_topk_inside_a_topk_is_an_error():
    model = Net()
    inner = TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=5)
    with pytest.raises(TypeError, match="optimizer is already a TopK"):
        TopK(inner, k=5)


def test_an_optimizer_with_no_trainable_parameter_is_an_error():
    model = Net().requires_grad_(False)
    with pytest.raises(ValueError, match="optimizer has no trainable parameter"):
        TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=5)


def test_a_parameter_listed_twice_in_a_group_is_an_error():
    """torch.optim warns and updates it twice; the selection counts its coordinates
    once, so TopK's step would depend on whether k covers them (the sparse update once,
    a dense step twice): refused, naming where. A tied weight, as when a user
    concatenates module parameter lists."""
    model = Net()
    listed = [model.emb.weight, model.hidden.weight, model.hidden.bias, model.out.weight]
    assert listed[0] is listed[3]
    with pytest.warns(UserWarning, match="duplicate parameters"):
        tied = torch.optim.SGD(listed, lr=0.1)
    with pytest.raises(ValueError, match=r"param_groups\[0\] lists a parameter of shape"):
        TopK(tied, k=7)
    a, b = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(3))
    with pytest.warns(UserWarning, match="duplicate"):
        sgd = torch.optim.SGD([a, b, a], lr=1.0)
    with pytest.raises(ValueError, match=r"param_groups\[0\] lists a parameter of shape \(4,\)"):
        TopK(sgd, k=1)
    opt = TopK(torch.optim.SGD([a], lr=1.0), k=1)
    with pytest.raises(ValueError, match="new param group lists a parameter of shape \\(3,\\)"):
        opt.add_param_group({"params": (p for p in [b, b])})
    assert len(opt.param_groups) == 1 and len(opt.optimizer.param_groups) == 1
    opt.add_param_group({"params": (p for p in [b])})  # a generator is read once
    assert opt.param_groups[1]["params"] == [b]


def test_zero_grad_clears_what_the_inner_step_wrote_into_the_gradients():
    """SGD(nesterov, foreach) adds its momentum buffer into p.grad in place: zero_grad
    must then clear the whole buffer, not only the k coordinates TopK selected."""
    model = Net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, foreach=True)
    opt = TopK(sgd, k=3, backend="torch")
    for step in range(3):
        opt.zero_grad()
        for p in trainable(model):
            assert p.grad is None or not p.grad.any(), (step, p.shape)
        loss_of(model, step).backward()
        opt.step()


def test_momentum_correction_refuses_an_inner_momentum_a_scheduler_sets():
    """OneCycleLR cycles the groups' momentum by default: DGC's velocity would run
    with SGD momentum on top. The step refuses it before anything is modified."""
    model = Net()
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=3, momentum_correction=0.9)
    torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    assert opt.param_groups[0]["momentum"] > 0  # set by the scheduler
    loss_of(model, 0).backward()
    params = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match="cycle_momentum=False"):
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params))
    assert not any(st["momentum"].any() for st in opt._own_state.values())


@pytest.mark.parametrize("inner", ["sgd", "adam"])
def test_a_frozen_gradient_zero_grad_zeroed_is_no_gradient_until_written(inner):
    """A requires_grad=False parameter with a gradient set by hand lies outside the
    flat buffer. Once zero_grad() zeroed it in place (and nothing wrote it), it is
    held out as a trainable parameter's unreached view is: no step, residual kept,
    Adam's moments unmoved. Written again in place, it counts again."""
    t = nn.Parameter(torch.zeros(4))
    f = nn.Parameter(torch.zeros(4), requires_grad=False)
    make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=1.0), "adam": torch.optim.Adam}[inner]
    opt = TopK(make([t, f]), k=2, backend="torch")
    g = torch.tensor([4.0, 3.0, 2.0, 1.0])
    t.grad, f.grad = g.clone(), g * 1.01
    opt.step()
    before = [x.clone() for x in (t, f, opt.state[t]["residual"], opt.state[f]["residual"])]
    inner_state = copy.deepcopy(opt.optimizer.state[f])
    opt.zero_grad()
    opt.step()  # nothing written: neither has a gradient
    after = (t, f, opt.state[t]["residual"], opt.state[f]["residual"])
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    assert str(opt.optimizer.state[f]) == str(inner_state)
    assert f.grad is not None and not f.grad.any()  # handed back after the step
    f.grad.add_(torch.tensor([0.0, 0.0, 0.0, 100.0]))  # written again: a gradient
    opt.step()
    assert f[3] != before[1][3]

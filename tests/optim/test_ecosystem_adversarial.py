"""TopK inside the PyTorch ecosystem, against independent references.

References: the bare inner optimizer (TopK with every coordinate kept and error
feedback off must be it, bit for bit: ``test_full_density_is_the_inner_optimizer_bit_for_bit``
states the contract for SGD), or ``sparsify_grads_`` on a plain model's gradients
followed by the bare inner optimizer's step (the functional core, documented as
``TopK``'s). Schedulers, GradScaler, hooks, state dicts, swa_utils, Lightning.
"""

import copy
import io

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as sch, swa_utils

from gradsift import TopK, sparsify_grads_

EXACT = {"rtol": 0, "atol": 0}


# --- a small model and its data ------------------------------------------------------


def make_model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)


def batch(step, micro=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(7919 * micro + step)
    return torch.randn(5, 6, generator=gen, dtype=dtype), torch.randn(
        5, 3, generator=gen, dtype=dtype
    )


def loss_of(model, step, micro=0):
    x, y = batch(step, micro, model[0].weight.dtype)
    return ((model(x) - y) ** 2).mean()


def groups_of(model, spec):
    """``spec``: None (one group of every parameter) or per-group hyper-parameters,
    the parameters dealt round-robin."""
    params = list(model.parameters())
    if spec is None:
        return params
    return [{"params": params[i :: len(spec)], **hp} for i, hp in enumerate(spec)]


def assert_same_params(a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, **EXACT, msg=lambda m, name=name: f"{name}: {m}")


HYPER = ("lr", "momentum", "betas", "weight_decay", "initial_lr", "max_lr", "min_lr")


def assert_same_groups(opt, ref):
    assert len(opt.param_groups) == len(ref.param_groups)
    for g, h in zip(opt.param_groups, ref.param_groups):
        for key in HYPER:
            assert (key in g) == (key in h), key
            if key in g:
                assert g[key] == h[key], (key, g[key], h[key])


# --- LR schedulers: every one, driving TopK(density=1, no EF) == the bare optimizer ---


def _sgd_m(ps):
    return torch.optim.SGD(ps, lr=0.1, momentum=0.9)


def _adam(ps):
    return torch.optim.Adam(ps, lr=0.01)


SCHEDULERS = {
    "step": (_sgd_m, lambda o: sch.StepLR(o, step_size=2, gamma=0.5)),
    "multistep": (_sgd_m, lambda o: sch.MultiStepLR(o, milestones=[1, 3], gamma=0.3)),
    "constant": (_adam, lambda o: sch.ConstantLR(o, factor=0.25, total_iters=3)),
    "linear": (_adam, lambda o: sch.LinearLR(o, start_factor=0.1, total_iters=4)),
    "exponential": (_sgd_m, lambda o: sch.ExponentialLR(o, gamma=0.7)),
    "polynomial": (_adam, lambda o: sch.PolynomialLR(o, total_iters=5, power=2.0)),
    "cosine": (_sgd_m, lambda o: sch.CosineAnnealingLR(o, T_max=4, eta_min=1e-3)),
    "warm_restarts": (_adam, lambda o: sch.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2)),
    "lambda": (_sgd_m, lambda o: sch.LambdaLR(o, lambda e: 1.0 / (1 + e))),
    "multiplicative": (_adam, lambda o: sch.MultiplicativeLR(o, lambda e: 0.9)),
    "cyclic_momentum": (
        _sgd_m,
        lambda o: sch.CyclicLR(o, base_lr=0.01, max_lr=0.2, step_size_up=2, cycle_momentum=True),
    ),
    "onecycle_sgd_momentum": (
        _sgd_m,
        lambda o: sch.OneCycleLR(o, max_lr=0.3, total_steps=8, cycle_momentum=True),
    ),
    "onecycle_adam_betas": (
        _adam,
        lambda o: sch.OneCycleLR(o, max_lr=0.05, total_steps=8, three_phase=True),
    ),
    "sequential": (
        _sgd_m,
        lambda o: sch.SequentialLR(
            o,
            [sch.LinearLR(o, start_factor=0.2, total_iters=2), sch.ExponentialLR(o, gamma=0.8)],
            milestones=[2],
        ),
    ),
    "chained": (
        _adam,
        lambda o: sch.ChainedScheduler(
            [sch.ConstantLR(o, factor=0.5, total_iters=2), sch.ExponentialLR(o, gamma=0.9)]
        ),
    ),
    "plateau": (
        _sgd_m,
        lambda o: sch.ReduceLROnPlateau(o, mode="min", factor=0.5, patience=0, threshold=0.0),
    ),
    "swalr": (_sgd_m, lambda o: swa_utils.SWALR(o, swa_lr=0.02, anneal_epochs=3)),
}

TWO_GROUPS = [{"lr": 0.05, "momentum": 0.5}, {"lr": 0.2, "weight_decay": 0.01}]


def _run_with_scheduler(model, opt, sched, steps):
    for step in range(steps):
        opt.zero_grad()
        loss = loss_of(model, step)
        loss.backward()
        opt.step()
        if isinstance(sched, sch.ReduceLROnPlateau):
            sched.step(float(step))  # always worse: reduces every step
        else:
            sched.step()
        yield


@pytest.mark.parametrize("groups", [None, TWO_GROUPS], ids=["one_group", "two_groups"])
@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_drives_topk_exactly_as_the_bare_optimizer(name, groups):
    make_inner, make_sched = SCHEDULERS[name]
    if groups is not None and make_inner is _adam:
        groups = [{k: v for k, v in g.items() if k != "momentum"} for g in groups]
    model, ref_model = make_model(), make_model()
    opt = TopK(make_inner(groups_of(model, groups)), density=1.0, error_feedback=False)
    ref = make_inner(groups_of(ref_model, groups))
    s_opt, s_ref = make_sched(opt), make_sched(ref)
    assert_same_groups(opt.optimizer, ref)
    for _ in zip(
        _run_with_scheduler(model, opt, s_opt, 6), _run_with_scheduler(ref_model, ref, s_ref, 6)
    ):
        assert_same_groups(opt.optimizer, ref)
        assert_same_params(model, ref_model)
    assert s_opt.state_dict().keys() == s_ref.state_dict().keys()


def test_swa_averaged_model_follows_the_bare_optimizer():
    model, ref_model = make_model(), make_model()
    opt = TopK(_sgd_m(model.parameters()), density=1.0, error_feedback=False)
    ref = _sgd_m(ref_model.parameters())
    avg, ref_avg = swa_utils.AveragedModel(model), swa_utils.AveragedModel(ref_model)
    s_opt = swa_utils.SWALR(opt, swa_lr=0.05, anneal_epochs=2, anneal_strategy="linear")
    s_ref = swa_utils.SWALR(ref, swa_lr=0.05, anneal_epochs=2, anneal_strategy="linear")
    for _ in zip(
        _run_with_scheduler(model, opt, s_opt, 5), _run_with_scheduler(ref_model, ref, s_ref, 5)
    ):
        avg.update_parameters(model)
        ref_avg.update_parameters(ref_model)
    assert_same_params(avg.module, ref_avg.module)
    assert int(avg.n_averaged) == int(ref_avg.n_averaged) == 5


# --- schedulers at density < 1 with error feedback: the functional reference ----------


class Reference:
    """``sparsify_grads_`` (error feedback) on a plain model's gradients, then the
    bare inner optimizer's step."""

    def __init__(self, model, inner, *, density):
        self.model, self.inner, self.density = model, inner, density
        self.params = [p for g in inner.param_groups for p in g["params"]]
        self.res = [torch.zeros_like(p) for p in self.params]

    def sparsify(self):
        sparsify_grads_(self.params, density=self.density, residuals=self.res)

    def step(self, step, micro=1):
        self.model.zero_grad(set_to_none=True)
        for m in range(micro):
            loss_of(self.model, step, m).backward()
        self.sparsify()
        self.inner.step()

    def check(self, model, opt):
        assert_same_params(model, self.model)
        for p, r in zip([p for g in opt.param_groups for p in g["params"]], self.res):
            torch.testing.assert_close(opt.state[p]["residual"], r, **EXACT)


@pytest.mark.parametrize(
    "name", ["onecycle_sgd_momentum", "onecycle_adam_betas", "cyclic_momentum", "plateau"]
)
def test_momentum_cycling_schedulers_at_low_density_match_the_reference(name):
    make_inner, make_sched = SCHEDULERS[name]
    model, ref_model = make_model(), make_model()
    opt = TopK(make_inner(groups_of(model, None)), density=0.2, backend="torch")
    ref = Reference(ref_model, make_inner(groups_of(ref_model, None)), density=0.2)
    s_opt, s_ref = make_sched(opt), make_sched(ref.inner)
    for step in range(6):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
        ref.step(step)
        for s in (s_opt, s_ref):
            s.step(float(step)) if isinstance(s, sch.ReduceLROnPlateau) else s.step()
        assert_same_groups(opt.optimizer, ref.inner)
        ref.check(model, opt)


def test_scheduled_lr_reaches_the_plain_sgd_sparse_path():
    """Plain SGD at density < 1 takes the sparse-update path, which reads the lr from
    the param groups each step: a scheduler's change must reach it. Powers of two
    (lr and gamma) keep ``lr * g`` exact, so the result is the dense step's bit for bit."""
    model, ref_model = make_model(), make_model()
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.5), density=0.2, backend="torch")
    ref = Reference(ref_model, torch.optim.SGD(ref_model.parameters(), lr=0.5), density=0.2)
    s_opt = sch.StepLR(opt, step_size=1, gamma=0.5)
    s_ref = sch.StepLR(ref.inner, step_size=1, gamma=0.5)
    for step in range(5):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
        ref.step(step)
        s_opt.step()
        s_ref.step()
        ref.check(model, opt)


# --- hooks on the wrapper --------------------------------------------------------------


def _hook_log(opt, log):
    opt.register_step_pre_hook(lambda o, a, k: log.append(("step_pre", type(o).__name__)))
    opt.register_step_post_hook(lambda o, a, k: log.append(("step_post", type(o).__name__)))


def test_step_hooks_on_the_wrapper_run_once_around_the_whole_step():
    """Pre-hook sees the raw gradients (before residual and selection), post-hook the
    updated parameters; a pre-hook that rescales gradients acts as on the bare run."""
    model, ref_model = make_model(), make_model()
    opt = TopK(_sgd_m(model.parameters()), density=0.3, backend="torch")
    ref = Reference(ref_model, _sgd_m(ref_model.parameters()), density=0.3)
    log, seen = [], []

    def pre(o, args, kwargs):
        log.append("pre")
        seen.append([p.grad.clone() for p in model.parameters()])
        for p in model.parameters():
            p.grad.mul_(0.5)

    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(lambda o, a, k: log.append("post"))
    for step in range(3):
        opt.zero_grad()
        loss_of(model, step).backward()
        raw = [p.grad.clone() for p in model.parameters()]
        opt.step()
        for a, b in zip(seen[-1], raw):
            torch.testing.assert_close(a, b, **EXACT)
        ref_model.zero_grad(set_to_none=True)
        loss_of(ref_model, step).backward()
        for p in ref_model.parameters():
            p.grad.mul_(0.5)
        ref.sparsify()
        ref.inner.step()
        ref.check(model, opt)
    assert log == ["pre", "post"] * 3


def test_state_dict_hooks_registered_on_the_bare_optimizer_still_run():
    model = make_model()
    inner = _adam(model.parameters())
    log = []
    inner.register_state_dict_pre_hook(lambda o: log.append("sd_pre"))
    inner.register_state_dict_post_hook(lambda o, sd: log.append("sd_post"))
    opt = TopK(inner, density=0.3)
    loss_of(model, 0).backward()
    opt.step()
    opt.load_state_dict(opt.state_dict())
    assert log == ["sd_pre", "sd_post"]


def test_state_dict_hooks_registered_on_the_wrapper_run():
    def run(opt):
        log = []
        opt.register_state_dict_pre_hook(lambda o: log.append(("pre", o is opt)))

        def post(o, sd):
            log.append(("post", o is opt))
            sd["extra"] = "kept"
            return sd

        opt.register_state_dict_post_hook(post)
        sd = opt.state_dict()
        return log, sd.get("extra")

    model = make_model()
    expected = run(_adam(model.parameters()))
    assert expected == ([("pre", True), ("post", True)], "kept")
    assert run(TopK(_adam(make_model().parameters()), density=0.3)) == expected


def test_load_state_dict_hooks_registered_on_the_wrapper_run():
    """torch's documented way to adapt a checkpoint (its load_state_dict note): a
    pre-hook that returns a rewritten state dict; a post-hook told when loading ends."""

    def run(opt, model):
        loss_of(model, 0).backward()
        opt.step()
        sd = opt.state_dict()
        log = []

        def pre(o, state_dict):
            log.append("pre")
            state_dict = dict(state_dict)
            state_dict["param_groups"] = [dict(g, lr=0.125) for g in state_dict["param_groups"]]
            return state_dict

        opt.register_load_state_dict_pre_hook(pre)
        opt.register_load_state_dict_post_hook(lambda o: log.append("post"))
        opt.load_state_dict(sd)
        return log, [g["lr"] for g in opt.param_groups]

    m = make_model()
    expected = run(_adam(m.parameters()), m)
    assert expected == (["pre", "post"], [0.125])
    m = make_model()
    assert run(TopK(_adam(m.parameters()), density=0.3), m) == expected


# --- state dicts across configurations ------------------------------------------------


def _train(model, opt, start, stop, sched=None):
    for step in range(start, stop):
        opt.zero_grad()
        loss_of(model, step).backward()
        opt.step()
        if sched is not None:
            sched.step()
    return model, opt


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_checkpoint_with_a_scheduler_resumes_under_another_k_like_the_reference():
    """Save (weights_only) at density 0.2 with OneCycleLR, resume at k=7: from then on
    it is the functional reference started from the saved residuals and inner state."""
    model, opt = make_model(), None
    opt = TopK(_sgd_m(model.parameters()), density=0.2, backend="torch")
    sched = sch.OneCycleLR(opt, max_lr=0.3, total_steps=10)
    _train(model, opt, 0, 4, sched)
    ckpt = _roundtrip(
        {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
    )

    resumed = make_model(seed=5)
    resumed.load_state_dict(ckpt["model"])
    r_opt = TopK(_sgd_m(resumed.parameters()), k=7, backend="torch")
    r_sched = sch.OneCycleLR(r_opt, max_lr=0.3, total_steps=10)
    r_opt.load_state_dict(ckpt["opt"])
    r_sched.load_state_dict(ckpt["sched"])

    ref_model = make_model(seed=9)
    ref_model.load_state_dict(ckpt["model"])
    inner = _sgd_m(ref_model.parameters())
    ref_sched = sch.OneCycleLR(inner, max_lr=0.3, total_steps=10)
    inner_sd = copy.deepcopy(ckpt["opt"])
    saved_res = [inner_sd["state"][i].pop("residual") for i in range(4)]
    inner.load_state_dict(inner_sd)
    ref_sched.load_state_dict(ckpt["sched"])
    res = [r.clone() for r in saved_res]
    params = list(ref_model.parameters())
    for step in range(4, 8):
        r_opt.zero_grad()
        loss_of(resumed, step).backward()
        r_opt.step()
        r_sched.step()
        ref_model.zero_grad(set_to_none=True)
        loss_of(ref_model, step).backward()
        sparsify_grads_(params, k=7, residuals=res)
        inner.step()
        ref_sched.step()
        assert_same_groups(r_opt.optimizer, inner)
    assert_same_params(resumed, ref_model)
    for p, r in zip(resumed.parameters(), res):
        torch.testing.assert_close(r_opt.state[p]["residual"], r, **EXACT)


def test_topk_state_dict_without_error_feedback_continues_in_the_bare_optimizer():
    """TopK(density=1, no error feedback) is the bare optimizer: its checkpoint loads
    into a bare AdamW (and back) and both continue as one uninterrupted bare run."""
    full = make_model()
    full_opt = torch.optim.AdamW(full.parameters(), lr=0.01, amsgrad=True)
    _train(full, full_opt, 0, 6)

    model = make_model()
    opt = TopK(
        torch.optim.AdamW(model.parameters(), lr=0.01, amsgrad=True),
        density=1.0,
        error_feedback=False,
    )
    _train(model, opt, 0, 2)
    bare = torch.optim.AdamW(model.parameters(), lr=0.01, amsgrad=True)
    bare.load_state_dict(_roundtrip(opt.state_dict()))
    _train(model, bare, 2, 4)
    again = TopK(
        torch.optim.AdamW(model.parameters(), lr=0.01, amsgrad=True),
        density=1.0,
        error_feedback=False,
    )
    again.load_state_dict(_roundtrip(bare.state_dict()))
    _train(model, again, 4, 6)
    assert_same_params(model, full)


def test_loading_a_plain_optimizer_state_dict_replaces_the_whole_state():
    """torch's load_state_dict replaces an optimizer's whole state. Loading the bare
    Adam's checkpoint into a TopK must give the same TopK whatever that TopK did
    before: a fresh one (zero residuals) is the reference."""
    source = make_model(seed=3)
    plain = _adam(source.parameters())
    _train(source, plain, 0, 2)
    saved = {"model": source.state_dict(), "opt": plain.state_dict()}

    def resume(used_before):
        # one deserialised copy each: torch's load_state_dict keeps CPU ``step`` tensors
        # (Adam then counts them up in place)
        sd = _roundtrip(saved)
        model = make_model()
        opt = TopK(_adam(model.parameters()), density=0.2, backend="torch")
        if used_before:
            _train(model, opt, 10, 13)  # leaves residuals behind
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])
        return _train(model, opt, 2, 5)

    fresh, fresh_opt = resume(False)
    used, used_opt = resume(True)
    for p, q in zip(used.parameters(), fresh.parameters()):
        torch.testing.assert_close(
            used_opt.state[p]["residual"], fresh_opt.state[q]["residual"], **EXACT
        )
    assert_same_params(used, fresh)


def test_a_state_dict_of_other_groups_is_refused_and_changes_nothing():
    model = make_model()
    opt = TopK(_sgd_m(groups_of(model, TWO_GROUPS)), density=0.3)
    _train(model, opt, 0, 2)
    other = make_model()
    other_opt = TopK(_sgd_m(other.parameters()), density=0.3)
    _train(other, other_opt, 0, 3)
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match="parameter groups"):
        opt.load_state_dict(other_opt.state_dict())
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    for i, st in before["state"].items():
        for key, v in st.items():
            torch.testing.assert_close(after["state"][i][key], v, **EXACT)


def test_state_dict_of_groups_with_their_own_hyperparameters_round_trips():
    """Per-group lr/momentum/weight_decay survive save and load into a TopK built
    with other values, as they do for the bare optimizer."""
    model = make_model()
    opt = TopK(_sgd_m(groups_of(model, TWO_GROUPS)), density=0.3, backend="torch")
    _train(model, opt, 0, 3)
    other = TopK(_sgd_m(groups_of(make_model(), [{"lr": 9.0, "momentum": 0.0}, {"lr": 7.0}])), k=4)
    other.load_state_dict(_roundtrip(opt.state_dict()))
    bare = _sgd_m(groups_of(make_model(), [{"lr": 9.0, "momentum": 0.0}, {"lr": 7.0}]))
    bare.load_state_dict(opt.optimizer.state_dict())
    assert_same_groups(other.optimizer, bare)
    assert_same_groups(other.optimizer, opt.optimizer)


# --- inner optimizers: TopK(density=1, no EF) is each of them bit for bit -------------

INNER_MATRIX = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01),
    "adam_foreach": lambda ps: torch.optim.Adam(ps, lr=0.01, foreach=True),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.01, amsgrad=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True, maximize=True),
    "adamw_fused_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.01, fused=True, amsgrad=True),
    "sgd_nesterov": lambda ps: torch.optim.SGD(
        ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3
    ),
    "sgd_fused": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, fused=True),
    "rmsprop_centered": lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
    "adagrad": lambda ps: torch.optim.Adagrad(ps, lr=0.1, lr_decay=0.01),
    "adagrad_fused": lambda ps: torch.optim.Adagrad(ps, lr=0.1, fused=True),
    "adafactor": lambda ps: torch.optim.Adafactor(ps, lr=0.01),
    "nadam": lambda ps: torch.optim.NAdam(
        ps, lr=0.01, decoupled_weight_decay=True, weight_decay=0.01
    ),
    "radam": lambda ps: torch.optim.RAdam(ps, lr=0.01),
    "adamax": lambda ps: torch.optim.Adamax(ps, lr=0.01),
    "asgd": lambda ps: torch.optim.ASGD(ps, lr=0.01, t0=2),
    "rprop": lambda ps: torch.optim.Rprop(ps, lr=0.01),
    "adadelta": lambda ps: torch.optim.Adadelta(ps, lr=0.5),
    "sgd_tensor_lr": lambda ps: torch.optim.SGD(ps, lr=torch.tensor(0.1)),
}


@pytest.mark.parametrize("name", INNER_MATRIX)
def test_every_inner_optimizer_at_full_density_is_the_bare_one(name):
    make = INNER_MATRIX[name]
    model, ref_model = make_model(), make_model()
    opt = TopK(make(list(model.parameters())), density=1.0, error_feedback=False)
    ref = make(list(ref_model.parameters()))
    for step in range(4):
        _train(model, opt, step, step + 1)
        _train(ref_model, ref, step, step + 1)
        assert_same_params(model, ref_model)
    sd, ref_sd = opt.state_dict(), ref.state_dict()
    assert sd["param_groups"] == ref_sd["param_groups"]
    for i, st in ref_sd["state"].items():
        assert st.keys() == sd["state"][i].keys()
        for key, v in st.items():
            torch.testing.assert_close(sd["state"][i][key], v, **EXACT)


@pytest.mark.parametrize(
    "name", ["adam", "adafactor", "rmsprop_centered", "adagrad", "sgd_nesterov"]
)
def test_every_inner_optimizer_at_low_density_matches_the_reference(name):
    make = INNER_MATRIX[name]
    model, ref_model = make_model(), make_model()
    opt = TopK(make(list(model.parameters())), density=0.15, backend="torch")
    ref = Reference(ref_model, make(list(ref_model.parameters())), density=0.15)
    for step in range(4):
        _train(model, opt, step, step + 1)
        ref.step(step)
        ref.check(model, opt)


def test_capturable_inner_on_cpu_is_refused_as_the_bare_optimizer_refuses():
    model, ref_model = make_model(), make_model()
    loss_of(ref_model, 0).backward()
    with pytest.raises(AssertionError, match="capturable") as bare:
        torch.optim.AdamW(ref_model.parameters(), lr=0.01, capturable=True).step()
    opt = TopK(
        torch.optim.AdamW(model.parameters(), lr=0.01, capturable=True),
        density=1.0,
        error_feedback=False,
    )
    loss_of(model, 0).backward()
    with pytest.raises(AssertionError) as ours:
        opt.step()
    assert str(ours.value) == str(bare.value)
    assert_same_params(model, ref_model)


def _lbfgs(ps):
    return torch.optim.LBFGS(ps, lr=0.5, max_iter=4, history_size=3)


def _closure_step(model, opt, step):
    def closure():
        opt.zero_grad()
        loss = loss_of(model, step)
        loss.backward()
        return loss

    return opt.step(closure)


def test_lbfgs_at_full_density_is_the_bare_lbfgs_and_resumes():
    model, ref_model = make_model(dtype=torch.float64), make_model(dtype=torch.float64)
    opt = TopK(_lbfgs(model.parameters()), density=1.0, error_feedback=False)
    ref = _lbfgs(ref_model.parameters())
    for step in range(3):
        a, b = _closure_step(model, opt, step), _closure_step(ref_model, ref, step)
        assert torch.equal(a, b)
        assert_same_params(model, ref_model)
    # checkpoint mid-run (LBFGS keeps lists of tensors in one state entry)
    clone = make_model(seed=4, dtype=torch.float64)
    clone.load_state_dict(model.state_dict())
    c_opt = TopK(_lbfgs(clone.parameters()), density=1.0, error_feedback=False)
    c_opt.load_state_dict(_roundtrip(opt.state_dict()))
    for step in range(3, 5):
        _closure_step(clone, c_opt, step)
        _closure_step(ref_model, ref, step)
    assert_same_params(clone, ref_model)


def test_lbfgs_at_low_density_selects_on_every_evaluation():
    """The documented closure contract: each evaluation's gradient is sparsified
    (with error feedback) before LBFGS reads it. Reference: a bare LBFGS whose
    closure runs sparsify_grads_ after backward."""
    model, ref_model = make_model(dtype=torch.float64), make_model(dtype=torch.float64)
    opt = TopK(_lbfgs(model.parameters()), density=0.3, backend="torch")
    ref = _lbfgs(ref_model.parameters())
    params = list(ref_model.parameters())
    res = [torch.zeros_like(p) for p in params]
    for step in range(3):
        _closure_step(model, opt, step)

        def closure(step=step):
            ref.zero_grad()
            loss = loss_of(ref_model, step)
            loss.backward()
            sparsify_grads_(params, density=0.3, residuals=res)
            return loss

        ref.step(closure)
        assert_same_params(model, ref_model)
    for p, r in zip(model.parameters(), res):
        torch.testing.assert_close(opt.state[p]["residual"], r, **EXACT)


# --- GradScaler -----------------------------------------------------------------------


def _snapshot(opt, model):
    sd = opt.state_dict()
    state = {
        i: {k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()}
        for i, st in sd["state"].items()
    }
    return [p.detach().clone() for p in model.parameters()], state


def _assert_same_snapshot(a, b):
    for p, q in zip(a[0], b[0]):
        torch.testing.assert_close(p, q, **EXACT)
    assert a[1].keys() == b[1].keys()
    for i in a[1]:
        assert a[1][i].keys() == b[1][i].keys()
        for k in a[1][i]:
            torch.testing.assert_close(a[1][i][k], b[1][i][k], **EXACT)


INF_STEPS = {2: float("inf"), 4: float("nan")}


def _scaled_run(model, opt, steps, *, sparsify=None, zero=None, autocast=False, micro=2):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
    skipped = []
    for step in range(steps):
        zero()
        for m in range(micro):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = loss_of(model, step, m)
            scaler.scale(loss).backward()
            if step in INF_STEPS and m == micro - 1:
                model[2].weight.grad[1, 3] = INF_STEPS[step]
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        finite = all(bool(p.grad.isfinite().all()) for p in model.parameters())
        if sparsify is not None and finite:
            sparsify()
        if not finite and sparsify is None:
            before = _snapshot(opt, model)
        scaler.step(opt)
        scaler.update()
        if not finite and sparsify is None:
            _assert_same_snapshot(before, _snapshot(opt, model))  # a skipped step: untouched
            skipped.append(step)
    return scaler.get_scale(), skipped


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16_autocast"])
@pytest.mark.parametrize("inner", ["adamw_amsgrad", "sgd_nesterov", "adagrad"])
def test_grad_scaler_with_accumulation_unscale_clip_and_skipped_steps(inner, autocast):
    """Micro-batches accumulated into the kept views (zero_grad(set_to_none=False)),
    unscale_ then clip then step, an inf and a NaN step skipped: every skipped step
    leaves parameters, inner state and residuals untouched, and the run equals the
    functional reference that skips the same steps."""
    make = INNER_MATRIX[inner]
    model, ref_model = make_model(), make_model()
    opt = TopK(make(list(model.parameters())), density=0.25, backend="torch")
    ref = Reference(ref_model, make(list(ref_model.parameters())), density=0.25)
    scale, skipped = _scaled_run(
        model, opt, 6, zero=lambda: opt.zero_grad(set_to_none=False), autocast=autocast
    )
    ref_scale, _ = _scaled_run(
        ref_model,
        ref.inner,
        6,
        sparsify=ref.sparsify,
        zero=lambda: ref_model.zero_grad(set_to_none=True),
        autocast=autocast,
    )
    assert skipped == sorted(INF_STEPS) and scale == ref_scale
    ref.check(model, opt)
    for r in (opt.state[p]["residual"] for p in model.parameters()):
        assert bool(r.isfinite().all())


@pytest.mark.parametrize("inner", ["adamw_fused_amsgrad", "adam_fused", "sgd_fused"])
def test_grad_scaler_with_a_fused_inner_is_the_bare_fused_optimizer(inner):
    """A bare fused optimizer takes GradScaler's in-kernel unscale path; TopK(density=1,
    no EF) around it must still give the same parameters, state and scale."""
    make = INNER_MATRIX[inner]
    model, ref_model = make_model(), make_model()
    opt = TopK(make(list(model.parameters())), density=1.0, error_feedback=False)
    ref = make(list(ref_model.parameters()))

    def run(m, o):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        for step in range(6):
            o.zero_grad()
            scaler.scale(loss_of(m, step)).backward()
            if step == 2:
                m[0].bias.grad[0] = float("inf")
            scaler.step(o)
            scaler.update()
        return scaler.get_scale()

    assert run(model, opt) == run(ref_model, ref)
    assert_same_params(model, ref_model)
    sd, ref_sd = opt.state_dict(), ref.state_dict()
    for i, st in ref_sd["state"].items():
        for key, v in st.items():
            torch.testing.assert_close(sd["state"][i][key], v, **EXACT)


# --- parameter kinds: complex, sparse gradients, views of one another -----------------


def test_complex_parameters_at_full_density_are_the_bare_optimizer():
    def run(wrap):
        torch.manual_seed(0)
        p = nn.Parameter(torch.randn(6, 3, dtype=torch.complex64))
        opt = torch.optim.Adam([p], lr=0.1)
        if wrap:
            opt = TopK(opt, density=1.0, error_feedback=False)
        for step in range(3):
            opt.zero_grad()
            (p * torch.arange(18.0).view(6, 3).add(step)).abs().sum().backward()
            opt.step()
        return p.detach()

    torch.testing.assert_close(run(True), run(False), **EXACT)


@pytest.mark.parametrize("error_feedback", [True, False])
def test_complex_parameters_below_full_density_work_or_are_refused_clearly(error_feedback):
    """TopK accepts complex parameters at construction and at density 1; below it the
    step must either work (k coordinates changed, g_applied + r_new == g) or refuse
    with a TypeError/ValueError naming the dtype (as sparsify_grads_ and topk_indices
    do), before anything changes."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(8, dtype=torch.complex64))
    before = p.detach().clone()
    try:
        opt = TopK(torch.optim.SGD([p], lr=1.0), k=3, error_feedback=error_feedback)
        (p * torch.arange(1.0, 9.0)).abs().sum().backward()
        grad = p.grad.clone()
        opt.step()
    except (TypeError, ValueError) as e:
        assert "complex" in str(e)
        torch.testing.assert_close(p.detach(), before, **EXACT)
        return
    applied = before - p.detach()
    assert int((applied != 0).sum()) == 3
    if error_feedback:
        torch.testing.assert_close(applied + opt.state[p]["residual"], grad)


def _embedding_loss(emb, head, step, micro):
    gen = torch.Generator().manual_seed(31 * step + micro)
    idx = torch.randperm(12, generator=gen)[:9].view(3, 3)  # distinct rows: no summation order
    y = torch.randn(3, 2, generator=gen)
    return ((head(emb(idx).mean(1)) - y) ** 2).mean()


@pytest.mark.parametrize("zero", ["keep", "none"])
@pytest.mark.parametrize("inner", ["adam", "adagrad"])
def test_sparse_embedding_gradients_are_the_dense_embedding_reference(inner, zero):
    """nn.Embedding(sparse=True) under TopK: densified for the selection, so the run
    is the dense Embedding's functional reference (micro-batches accumulated)."""
    make = INNER_MATRIX[inner]

    def build(sparse):
        torch.manual_seed(0)
        return nn.Embedding(12, 5, sparse=sparse), nn.Linear(5, 2)

    emb, head = build(True)
    ref_emb, ref_head = build(False)
    params = [emb.weight, *head.parameters()]
    ref_params = [ref_emb.weight, *ref_head.parameters()]
    opt = TopK(make(params), density=0.2, backend="torch")
    ref_inner = make(ref_params)
    res = [torch.zeros_like(q) for q in ref_params]
    for step in range(4):
        opt.zero_grad(set_to_none=zero == "none")
        for micro in range(2):
            _embedding_loss(emb, head, step, micro).backward()
        opt.step()
        for q in ref_params:
            q.grad = None
        for micro in range(2):
            _embedding_loss(ref_emb, ref_head, step, micro).backward()
        sparsify_grads_(ref_params, density=0.2, residuals=res)
        ref_inner.step()
        for p, q, r in zip(params, ref_params, res):
            torch.testing.assert_close(p, q, **EXACT)
            torch.testing.assert_close(opt.state[p]["residual"], r, **EXACT)


@pytest.mark.parametrize("inner", ["sgd_pow2", "adam"])
def test_parameters_that_are_views_of_one_another(inner):
    """Two parameters sharing memory (one a slice of the other's storage): each gets
    its own gradient; the update of the shared memory is the bare optimizer's (applied
    once per parameter, in order)."""
    make = {
        "sgd_pow2": lambda ps: torch.optim.SGD(ps, lr=0.25),
        "adam": INNER_MATRIX["adam"],
    }[inner]

    def build():
        torch.manual_seed(0)
        base = torch.randn(4, 6)
        return nn.Parameter(base), nn.Parameter(base[2:])

    def loss(a, b, step):
        gen = torch.Generator().manual_seed(step)
        x = torch.randn(6, 3, generator=gen)
        return (a @ x).tanh().sum() + (b @ x).pow(2).sum()

    a, b = build()
    ra, rb = build()
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    opt = TopK(make([a, b]), density=0.3, backend="torch")
    ref = make([ra, rb])
    res = [torch.zeros_like(ra), torch.zeros_like(rb)]
    for step in range(4):
        opt.zero_grad()
        loss(a, b, step).backward()
        opt.step()
        ra.grad = rb.grad = None
        loss(ra, rb, step).backward()
        sparsify_grads_([ra, rb], density=0.3, residuals=res)
        ref.step()
        torch.testing.assert_close(a, ra, **EXACT)
        torch.testing.assert_close(b, rb, **EXACT)
    torch.testing.assert_close(a[2:], b, **EXACT)  # still one memory


# --- Lightning: TopK from configure_optimizers, checkpoint and resume ------------------


def _lightning_data():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(12, 6, generator=gen), torch.randn(12, 3, generator=gen)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)


def _lightning_module():
    pl = pytest.importorskip("lightning.pytorch")

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_model()

        def training_step(self, b, _):
            return ((self.net(b[0]) - b[1]) ** 2).mean()

        def configure_optimizers(self):
            opt = TopK(torch.optim.AdamW(self.parameters(), lr=0.01), density=0.2, backend="torch")
            return {"optimizer": opt, "lr_scheduler": sch.StepLR(opt, step_size=2, gamma=0.5)}

    return pl, Module()


def _trainer(pl, epochs):
    return pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=epochs, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, deterministic=True,
    )  # fmt: skip


def test_lightning_fit_checkpoint_and_resume_are_bit_for_bit(tmp_path):
    """2 epochs of 3 steps straight == 1 epoch, checkpoint, resume for the second; and
    both equal a plain TopK loop over the same batches (Lightning steps with a closure)."""
    import warnings

    pl, straight = _lightning_module()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # num_workers, etc.
        _trainer(pl, 2).fit(straight, _lightning_data())
        _, first = _lightning_module()
        trainer = _trainer(pl, 1)
        trainer.fit(first, _lightning_data())
        trainer.save_checkpoint(tmp_path / "half.ckpt")
        _, resumed = _lightning_module()
        with torch.no_grad():
            for p in resumed.parameters():
                p.add_(1.0)  # everything must come from the checkpoint
        trainer = _trainer(pl, 2)
        trainer.fit(resumed, _lightning_data(), ckpt_path=tmp_path / "half.ckpt")
    r_opt = trainer.optimizers[0]
    assert isinstance(r_opt, TopK)

    plain = make_model()
    opt = TopK(torch.optim.AdamW(plain.parameters(), lr=0.01), density=0.2, backend="torch")
    s = sch.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(2):
        for x, y in _lightning_data():
            opt.zero_grad()
            ((plain(x) - y) ** 2).mean().backward()
            opt.step()
        s.step()  # Lightning steps epoch-interval schedulers once per epoch
    assert_same_params(straight.net, plain)
    assert_same_params(resumed.net, plain)
    for p, q in zip(resumed.net.parameters(), plain.parameters()):
        torch.testing.assert_close(r_opt.state[p]["residual"], opt.state[q]["residual"], **EXACT)
    assert r_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_topk_checkpoint_loads_into_the_bare_inner_optimizer():
    """TopK's state dict is documented as the inner optimizer's with residuals added.
    A parameter backward never reached gets an entry holding only ``residual``; the
    bare Adam must still load it and continue as TopK(density=1, no EF) would (the
    bare optimizer by contract), from the same checkpoint."""

    def build(seed=0):
        torch.manual_seed(seed)
        a, b = nn.Linear(4, 3), nn.Linear(4, 3)
        return a, b, [*a.parameters(), *b.parameters()]

    def loss(a, b, step, use_b):
        gen = torch.Generator().manual_seed(step)
        out = a(torch.randn(2, 4, generator=gen)).sum()
        return out + b(torch.randn(2, 4, generator=gen)).sum() if use_b else out

    a, b, ps = build()
    opt = TopK(torch.optim.Adam(ps, lr=0.1), density=0.5)
    for step in range(2):
        opt.zero_grad()
        loss(a, b, step, False).backward()  # b never reached
        opt.step()
    ckpt = _roundtrip({"a": a.state_dict(), "b": b.state_dict(), "opt": opt.state_dict()})

    def resume(wrap):
        a2, b2, ps2 = build(seed=1)
        a2.load_state_dict(ckpt["a"])
        b2.load_state_dict(ckpt["b"])
        o = torch.optim.Adam(ps2, lr=0.1)
        if wrap:
            o = TopK(o, density=1.0, error_feedback=False)
        # a copy: torch's load keeps the saved CPU ``step`` tensors and counts in them
        o.load_state_dict(_roundtrip(ckpt["opt"]))
        for step in range(2, 4):
            o.zero_grad()
            loss(a2, b2, step, True).backward()
            o.step()
        return [p.detach() for p in ps2]

    for p, q in zip(resume(False), resume(True)):
        torch.testing.assert_close(p, q, **EXACT)


def test_a_group_without_inner_state_keeps_its_entries_zero_residuals_included():
    # SGD momentum on the weights only: the biases never get inner state, and a bias
    # whose residual is all zero (every coordinate sent) kept no entry, so the saved
    # dict lacked a key that the fresh template has and a strict load failed
    torch.manual_seed(0)
    lin = nn.Linear(4, 2)
    inner = torch.optim.SGD(
        [{"params": [lin.weight], "momentum": 0.9}, {"params": [lin.bias], "momentum": 0.0}],
        lr=0.1,
    )
    opt = TopK(inner, k=3)
    template = set(TopK(torch.optim.SGD(
        [{"params": [lin.weight], "momentum": 0.9}, {"params": [lin.bias]}], lr=0.1), k=3,
    ).state_dict()["state"])  # fmt: skip
    lin.weight.grad = torch.full((2, 4), 0.01)
    lin.bias.grad = torch.tensor([5.0, -5.0])  # both sent: the bias residual is zero
    opt.step()
    assert not opt.state[lin.bias]["residual"].any()
    sd = opt.state_dict()
    assert set(sd["state"]) == template == {0, 1}
    assert set(sd["state"][1]) == {"residual"}


# --- torch.compile of the whole training step ------------------------------------------


def _compiled_run(make, density, compiled, ef=True):
    torch._dynamo.reset()
    model = make_model()
    opt = make(list(model.parameters()))
    if density is not None:
        opt = TopK(opt, density=density, error_feedback=ef, backend="torch")

    def train_step(x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    fn = torch.compile(train_step, backend="eager") if compiled else train_step
    for step in range(4):
        fn(*batch(step))
    return model, opt


def test_compiled_training_step_matches_the_eager_reference():
    """forward, backward and TopK.step under one torch.compile (graph breaks and
    all): SGD with momentum at density 0.2 equals the eager functional reference."""
    model, opt = _compiled_run(_sgd_m, 0.2, True)
    ref_model = make_model()
    ref = Reference(ref_model, _sgd_m(list(ref_model.parameters())), density=0.2)
    for step in range(4):
        ref_model.zero_grad(set_to_none=True)
        x, y = batch(step)
        ((ref_model(x) - y) ** 2).mean().backward()
        ref.sparsify()
        ref.inner.step()
    ref.check(model, opt)


def test_compiled_training_step_at_full_density_is_the_compiled_bare_adam():
    model, _ = _compiled_run(_adam, 1.0, True, ef=False)
    ref_model, _ = _compiled_run(_adam, None, True)
    assert_same_params(model, ref_model)


# --- copies made after an LR scheduler was attached ------------------------------------


def _pickled(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _copy_with_scheduler_mid_training(how, wrap):
    """Train 3 steps with a scheduler, copy (model, opt, sched), train the copy 3 more:
    the original must be untouched by the copy's steps, and the copy must equal the
    original continued."""

    def build():
        model = make_model()
        opt = _sgd_m(model.parameters())
        if wrap:
            opt = TopK(opt, density=0.25, backend="torch")
        return model, opt, sch.StepLR(opt, step_size=2, gamma=0.5)

    model, opt, sched = build()
    _train(model, opt, 0, 3, sched)
    twin, twin_opt, twin_sched = how((model, opt, sched))
    loss_of(model, 99).backward()  # the original holds gradients meanwhile
    before = [p.detach().clone() for p in model.parameters()]
    _train(twin, twin_opt, 3, 6, twin_sched)
    for p, q in zip(model.parameters(), before):
        torch.testing.assert_close(p, q, **EXACT, msg="the copy's step moved the original")
    ref, ref_opt, ref_sched = build()
    _train(ref, ref_opt, 0, 6, ref_sched)
    assert_same_params(twin, ref)
    assert twin_opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]


COPIES = pytest.mark.parametrize("how", [copy.deepcopy, _pickled], ids=["deepcopy", "pickle"])


@COPIES
def test_bare_optimizer_copied_after_a_scheduler_was_attached(how):
    _copy_with_scheduler_mid_training(how, wrap=False)  # the reference behaviour


@COPIES
def test_topk_copied_after_a_scheduler_was_attached(how):
    _copy_with_scheduler_mid_training(how, wrap=True)


@pytest.mark.parametrize(
    "wrap",
    [
        False,
        True,
    ],
    ids=["bare", "topk"],
)
def test_torch_save_of_an_optimizer_with_a_step_hook(wrap):
    """README: torch.save of the optimizer works as for torch's optimizers, whose
    pickled state leaves hooks out (a hook is often a lambda or a closure)."""
    model = make_model()
    opt = _sgd_m(model.parameters())
    if wrap:
        opt = TopK(opt, density=0.25, backend="torch")
    calls = []
    opt.register_step_pre_hook(lambda o, a, k: calls.append(1))
    _train(model, opt, 0, 2)
    twin, twin_opt = _pickled((model, opt))
    _train(twin, twin_opt, 2, 4)
    _train(model, opt, 2, 4)
    assert_same_params(twin, model)
    assert len(calls) == 4  # the original's hook ran for the original's steps only


# --- torch.distributed.checkpoint's state-dict helpers (single process, no group) -------


def _dcp_resume(tmp_path, wrap):
    """The DCP recipe of torch's docs: get_state_dict -> dcp.save; a fresh model's
    get_state_dict as the template -> dcp.load -> set_state_dict; then continue."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def build(seed):
        model = make_model(seed)
        opt = _adam(model.parameters())
        return model, TopK(opt, density=0.2, backend="torch") if wrap else opt

    model, opt = build(0)
    _train(model, opt, 0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: DCP runs single-process
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=tmp_path)
        resumed, r_opt = build(5)
        msd2, osd2 = get_state_dict(resumed, r_opt)
        template = {"model": msd2, "optim": osd2}
        dcp.load(template, checkpoint_id=tmp_path)
        set_state_dict(
            resumed, r_opt, model_state_dict=template["model"], optim_state_dict=template["optim"]
        )
    _train(model, opt, 3, 5)
    _train(resumed, r_opt, 3, 5)
    assert_same_params(resumed, model)
    if wrap:
        for p, q in zip(resumed.parameters(), model.parameters()):
            torch.testing.assert_close(
                r_opt.state[p]["residual"], opt.state[q]["residual"], **EXACT
            )


def test_dcp_state_dict_helpers_resume_the_bare_optimizer(tmp_path):
    _dcp_resume(tmp_path, wrap=False)  # the reference behaviour


def test_dcp_state_dict_helpers_resume_topk(tmp_path):
    _dcp_resume(tmp_path, wrap=True)


def test_dcp_template_of_a_fresh_topk_holds_the_inner_state():
    import warnings

    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = make_model()
        bare = get_optimizer_state_dict(m, _adam(m.parameters()))
        m = make_model()
        ours = get_optimizer_state_dict(m, TopK(_adam(m.parameters()), density=0.2))
    assert ours["state"].keys() == bare["state"].keys()
    for fqn, st in bare["state"].items():
        assert set(st) <= set(ours["state"][fqn]), (fqn, sorted(ours["state"][fqn]))


@pytest.mark.parametrize("saved_shape", [(1,), (2,)])  # broadcasts to (4,), or not
def test_a_residual_of_another_shape_loads_nothing_and_names_its_entry(saved_shape):
    """A state of another model whose residual has another shape is refused before
    anything loads (``copy_`` would broadcast a (1,) residual into all four
    coordinates: four times its mass), as torch's momentum fails at the first step."""
    w, s = nn.Parameter(torch.ones(3, 4)), nn.Parameter(torch.ones(saved_shape))
    opt = TopK(torch.optim.SGD([w, s], lr=0.1, momentum=0.9), k=2, backend="torch")
    w.grad, s.grad = torch.full((3, 4), 0.5), torch.full(saved_shape, 0.01)
    opt.step()
    sd = opt.state_dict()
    w2, s2 = nn.Parameter(torch.ones(3, 4)), nn.Parameter(torch.ones(4))
    other = TopK(torch.optim.SGD([w2, s2], lr=0.1, momentum=0.9), k=2, backend="torch")
    with pytest.raises(ValueError, match=r"\['state'\]\[1\]\['residual'\] has shape"):
        other.load_state_dict(sd)
    assert other.optimizer.state_dict()["state"] == {}  # the inner optimizer loaded nothing
    assert not any(t.any() for t in other.state[s2].values())


def test_a_load_pre_hook_rewriting_an_entry_leaves_the_callers_checkpoint():
    """torch hands the pre-hooks a shallow copy of the state dict: a hook that sets an
    entry in place changes what is loaded, not the checkpoint the caller holds."""

    def run(opt, model):
        loss_of(model, 0).backward()
        opt.step()
        sd = opt.state_dict()

        def pre(o, state_dict):
            state_dict["param_groups"] = [dict(g, lr=0.5) for g in state_dict["param_groups"]]

        opt.register_load_state_dict_pre_hook(pre)
        opt.load_state_dict(sd)
        return opt.param_groups[0]["lr"], sd["param_groups"][0]["lr"]

    m = make_model()
    expected = run(_adam(m.parameters()), m)
    assert expected[0] == 0.5 and expected[1] != 0.5
    m = make_model()
    assert run(TopK(_adam(m.parameters()), density=0.3), m) == expected

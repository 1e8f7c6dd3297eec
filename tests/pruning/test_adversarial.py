"""Adversarial tests of pruning at init, each against an independent reference:
``torch.nn.utils.prune`` for magnitude, brute-force float64 autograd for SNIP and
SynFlow, exact kept counts and closed forms for the allocations."""

import copy
import io
import math
import pickle

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.nn.utils import prune

import gradsift
from gradsift.pruning import layer_counts, layer_densities
from gradsift.pruning.params import original

# ----------------------------------------------------------------------------- helpers


def kept(n: int, sparsity: float) -> int:
    return n - round(sparsity * n)


def mlp(dtype=torch.float64, bias=True, seed=0, sizes=(12, 10, 8, 3)):
    torch.manual_seed(seed)
    layers = [nn.Flatten()]
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(a, b, bias=bias))
    return nn.Sequential(*layers).to(dtype)


def linear_names(model):
    return [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, nn.Linear)]


class ConvBN(nn.Module):
    def __init__(self, bias=True):
        super().__init__()
        torch.manual_seed(1)
        self.conv = nn.Conv2d(2, 4, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4 * 5 * 5, 6, bias=bias)
        self.fc2 = nn.Linear(6, 3, bias=bias)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc2(torch.relu(self.fc1(h.flatten(1))))


def conv_data(n_batches=2, n=9, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, 2, 5, 5, generator=gen, dtype=dtype), torch.arange(n) % 3)
        for _ in range(n_batches)
    ]


def mlp_data(n_batches=2, n=9, dtype=torch.float64, seed=0, features=12):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, features, generator=gen, dtype=dtype), torch.arange(n) % 3)
        for _ in range(n_batches)
    ]


def total_kept(masks):
    return sum(int(m.sum()) for m in masks.values())


def total_size(masks):
    return sum(m.numel() for m in masks.values())


def state(model):
    """Everything scoring must leave as it was."""
    return {
        "sd": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "dtypes": {k: v.dtype for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grad": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "hooks": [
            (len(m._forward_pre_hooks), len(m._forward_hooks), len(m._backward_hooks))
            for m in model.modules()
        ],
        "forward_attrs": [("forward" in vars(m)) for m in model.modules()],
        "params": [id(p) for p in model.parameters()],
        "rng": torch.get_rng_state(),
    }


def assert_state_equal(a, b):
    assert a["sd"].keys() == b["sd"].keys()
    for k in a["sd"]:
        assert a["dtypes"][k] == b["dtypes"][k], k
        assert torch.equal(a["sd"][k], b["sd"][k]), k
    for key in ("training", "requires_grad", "hooks", "forward_attrs", "params"):
        assert a[key] == b[key], key
    for ga, gb in zip(a["grad"], b["grad"]):
        assert (ga is None) == (gb is None)
        if ga is not None:
            assert torch.equal(ga, gb)
    assert torch.equal(a["rng"], b["rng"])


def torch_global_magnitude_masks(model, names, sparsity):
    """Reference: torch's own global L1 pruning on a deep copy; float masks by name."""
    ref = copy.deepcopy(model)
    pairs = [(ref.get_submodule(n.rsplit(".", 1)[0]), n.rsplit(".", 1)[1]) for n in names]
    prune.global_unstructured(pairs, pruning_method=prune.L1Unstructured, amount=sparsity)
    return {n: getattr(m, a + "_mask").bool() for n, (m, a) in zip(names, pairs)}


# --------------------------------------------------------------- magnitude vs torch


@pytest.mark.parametrize("sparsity", [0.0, 0.1, 0.5, 0.77, 0.93])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_magnitude_matches_torch_global_l1(sparsity, dtype):
    model = mlp(dtype=dtype)  # random init: tie-free magnitudes
    names = linear_names(model)
    ref = torch_global_magnitude_masks(model, names, sparsity)
    masks = gradsift.prune_at_init(model, "magnitude", sparsity)
    assert list(masks) == names
    for n in names:
        assert masks[n].dtype == torch.bool
        assert torch.equal(masks[n], ref[n]), n
        assert masks[n] is model.get_buffer(n + "_mask")
    assert total_kept(masks) == kept(total_size(masks), sparsity)


def test_magnitude_with_ties_matches_torch_counts_and_kept_multiset():
    model = mlp(dtype=torch.float32)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():  # integer magnitudes: many exact ties
            p.copy_(torch.randint(-3, 4, p.shape, generator=gen).float())
    names = linear_names(model)
    ref = torch_global_magnitude_masks(model, names, 0.6)
    weights = {n: model.get_parameter(n).detach().clone() for n in names}
    masks = gradsift.prune_at_init(model, "magnitude", 0.6)
    ours = torch.cat([weights[n][masks[n]].abs() for n in names]).sort().values
    theirs = torch.cat([weights[n][ref[n]].abs() for n in names]).sort().values
    assert torch.equal(ours, theirs)
    assert total_kept(masks) == total_kept(ref) == kept(total_size(masks), 0.6)
    # documented tie break: lowest index in the concatenation of the layers
    flat = torch.cat([weights[n].reshape(-1).abs() for n in names])
    k = kept(flat.numel(), 0.6)
    v = flat.sort(descending=True).values[k - 1]
    expect = flat > v
    ties = (flat == v).nonzero().flatten()[: k - int(expect.sum())]
    expect[ties] = True
    assert torch.equal(torch.cat([masks[n].reshape(-1) for n in names]), expect)


def test_magnitude_all_zero_weights_keeps_exact_count_lowest_index():
    model = mlp(dtype=torch.float32, bias=False)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    masks = gradsift.prune_at_init(model, "magnitude", 0.7)
    flat = torch.cat([m.reshape(-1) for m in masks.values()])
    k = kept(flat.numel(), 0.7)
    assert int(flat.sum()) == k
    assert flat[:k].all() and not flat[k:].any()


# ------------------------------------------------------------ pruning twice / remove


def test_prune_twice_previous_masks_stay_pruned_and_counts_exact():
    model = mlp()
    first = {k: v.clone() for k, v in gradsift.prune_at_init(model, "magnitude", 0.5).items()}
    second = gradsift.prune_at_init(model, "random", 0.8)  # random would revive weights
    for n in first:
        assert not (second[n] & ~first[n]).any(), n
    assert total_kept(second) == kept(total_size(second), 0.8)
    # one pre-hook per weight however often pruned
    for n in first:
        mod = model.get_submodule(n.rsplit(".", 1)[0])
        hooks = [
            h for h in mod._forward_pre_hooks.values() if isinstance(h, prune.BasePruningMethod)
        ]
        assert len(hooks) == 1
    # previous masks count toward the target: random keeps the top random scores of
    # the live weights (reference computed from the documented seed-0 scores)
    scores = gradsift.score(mlp(), "random")
    flat = torch.cat([torch.where(first[n], scores[n], -1.0).reshape(-1) for n in first])
    top = flat.topk(kept(flat.numel(), 0.8)).indices
    expect = torch.zeros_like(flat, dtype=torch.bool)
    expect[top] = True
    assert torch.equal(torch.cat([second[n].reshape(-1) for n in first]), expect)


def test_prune_twice_with_torch_float_mask_first():
    model = mlp()
    names = linear_names(model)
    pairs = [(model.get_submodule(n.rsplit(".", 1)[0]), "weight") for n in names]
    prune.global_unstructured(pairs, pruning_method=prune.RandomUnstructured, amount=0.3)
    first = {n: m.weight_mask.clone().bool() for n, (m, _) in zip(names, pairs)}
    masks = gradsift.prune_at_init(model, "magnitude", 0.6)
    assert total_kept(masks) == kept(total_size(masks), 0.6)
    for n in names:
        assert not (masks[n].bool() & ~first[n]).any()
        assert masks[n] is model.get_buffer(n + "_mask")
    # the effective weights are the masked originals
    for n, (m, _) in zip(names, pairs):
        model(torch.zeros(1, 12, dtype=torch.float64))
        assert torch.equal(m.weight, m.weight_orig * masks[n].to(m.weight_orig.dtype))


def test_prune_remove_then_prune_again():
    model = mlp()
    gradsift.prune_at_init(model, "magnitude", 0.5)
    for n in linear_names(model):
        prune.remove(model.get_submodule(n.rsplit(".", 1)[0]), "weight")
    assert not prune.is_pruned(model)
    zeros_before = {n: model.get_parameter(n) == 0 for n in linear_names(model)}
    masks = gradsift.prune_at_init(model, "magnitude", 0.7)
    assert total_kept(masks) == kept(total_size(masks), 0.7)
    for n, z in zeros_before.items():
        assert not (masks[n] & z).any()  # removed weights are zero: pruned first
    ref = torch_global_magnitude_masks(mlp(), linear_names(model), 0.7)
    for n in masks:
        assert torch.equal(masks[n], ref[n])


# ------------------------------------------------------- state dict, deepcopy, pickle


def _pruned_convbn(method="magnitude", sparsity=0.6):
    model = ConvBN()
    masks = gradsift.prune_at_init(model, method, sparsity, conv_data())
    return model, masks


def test_state_dict_into_fresh_pruned_model_and_into_pruned_model():
    model, masks = _pruned_convbn()
    model.eval()
    x = conv_data()[0][0]
    y = model(x)
    sd = model.state_dict()
    # a fresh model given the same reparametrisation (all-ones masks), then loaded
    fresh = ConvBN()
    fresh.eval()
    gradsift.apply_masks_(fresh, {n: torch.ones_like(m) for n, m in masks.items()})
    fresh.load_state_dict(sd)
    assert torch.equal(fresh(x), y)
    # into a model pruned otherwise: masks replaced by the loaded ones
    other, _ = _pruned_convbn("random", 0.3)
    other.eval()
    other.load_state_dict(sd)
    assert torch.equal(other(x), y)
    for n in masks:
        assert torch.equal(other.get_buffer(n + "_mask"), masks[n])
    # made permanent, it loads into a plain model
    for n in masks:
        prune.remove(model.get_submodule(n.rsplit(".", 1)[0]), "weight")
    plain = ConvBN()
    plain.eval()
    plain.load_state_dict(model.state_dict())
    assert torch.equal(plain(x), y)


def test_torch_float_mask_state_dict_loads_into_boolean_masks():
    model = ConvBN()
    names = ["conv.weight", "fc1.weight", "fc2.weight"]
    pairs = [(model.get_submodule(n.split(".")[0]), "weight") for n in names]
    prune.global_unstructured(pairs, pruning_method=prune.L1Unstructured, amount=0.5)
    model.eval()
    x = conv_data()[0][0]
    y = model(x)
    ours = ConvBN()
    gradsift.prune_at_init(ours, "random", 0.2)
    ours.eval()
    ours.load_state_dict(model.state_dict())
    assert torch.equal(ours(x), y)
    for n, (m, _) in zip(names, pairs):
        assert torch.equal(ours.get_buffer(n + "_mask"), m.weight_mask.bool())


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_pruned_model_copies(how):
    model, masks = _pruned_convbn("snip")
    x = conv_data()[0][0]
    model.eval()
    with torch.no_grad():
        y = model(x)
    if how == "deepcopy":
        clone = copy.deepcopy(model)
    elif how == "pickle":
        clone = pickle.loads(pickle.dumps(model))
    else:
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        clone = torch.load(buf, weights_only=False)
    assert torch.equal(clone(x), y)
    for n in masks:
        assert torch.equal(clone.get_buffer(n + "_mask"), masks[n])
        assert clone.get_buffer(n + "_mask").data_ptr() != masks[n].data_ptr()
    # the copy trains on its own: pruned weights stay zero, the original is untouched
    before = {k: v.clone() for k, v in model.state_dict().items()}
    clone.train()
    opt = torch.optim.SGD(clone.parameters(), lr=0.5)
    for xb, yb in conv_data():
        opt.zero_grad()
        F.cross_entropy(clone(xb), yb).backward()
        opt.step()
    clone(x)
    for n in masks:
        w = clone.get_submodule(n.rsplit(".", 1)[0]).weight
        assert (w[~masks[n]] == 0).all()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


# ---------------------------------------------------------------------- training


def _train(model, opt, data, steps=3):
    for _ in range(steps):
        for x, y in data:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()


@pytest.mark.parametrize("opt_kind", ["sgd", "sgd-momentum-wd", "topk", "topk-hold"])
def test_training_keeps_pruned_weights_zero(opt_kind):
    model = ConvBN()
    data = conv_data()
    masks = gradsift.prune_at_init(model, "snip", 0.8, data)
    snap = {n: m.clone() for n, m in masks.items()}
    if opt_kind == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    elif opt_kind == "sgd-momentum-wd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    else:
        opt = gradsift.TopK(torch.optim.SGD(model.parameters(), lr=0.1), density=0.05)
    if opt_kind == "topk-hold":
        gradsift.pruning.hold_masks(opt, model, masks)
    orig_before = {n: original(*_mod_attr(model, n)).detach().clone() for n in masks}
    _train(model, opt, data)
    model(data[0][0])
    for n in masks:
        m, a = _mod_attr(model, n)
        assert torch.equal(m.get_buffer(a + "_mask"), snap[n])  # masks unchanged
        assert (getattr(m, a)[~snap[n]] == 0).all()
        if opt_kind != "sgd-momentum-wd":  # no decay: pruned originals untouched
            o = original(m, a).detach()
            if opt_kind == "topk-hold":
                assert (o[~snap[n]] == 0).all()
            else:
                assert torch.equal(o[~snap[n]], orig_before[n][~snap[n]])
        assert not torch.equal(original(m, a).detach()[snap[n]], orig_before[n][snap[n]])


def _mod_attr(model, name):
    mod, attr = name.rsplit(".", 1)
    return model.get_submodule(mod), attr


# ------------------------------------------------------------------ SNIP reference


def snip_reference(model, x, y, names):
    """|dL/dw * w| in float64 on the effective weights, train mode, one batch."""
    ref = copy.deepcopy(model).double().train()
    for n in names:
        m, a = _mod_attr(ref, n)
        if hasattr(m, a + "_orig"):
            prune.remove(m, a)
    ws = [ref.get_parameter(n) for n in names]
    loss = F.cross_entropy(ref(x.double()), y)
    gs = torch.autograd.grad(loss, ws)
    return {n: (g * w).abs().detach() for n, g, w in zip(names, gs, ws)}


def test_snip_matches_bruteforce_with_batchnorm_in_eval_mode():
    model = ConvBN().double()
    model.eval()  # SNIP scores in train mode regardless
    data = conv_data(dtype=torch.float64)
    scores = gradsift.score(model, "snip", data)
    ref = snip_reference(model, *data[0], ["conv.weight", "fc1.weight", "fc2.weight"])
    for n in ref:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=1e-14)


def test_snip_on_pruned_model_matches_bruteforce():
    model = ConvBN().double()
    data = conv_data(dtype=torch.float64)
    masks = {k: v.clone() for k, v in gradsift.prune_at_init(model, "random", 0.5).items()}
    scores = gradsift.score(model, "snip", data)
    ref = snip_reference(model, *data[0], list(masks))
    for n in ref:
        assert (scores[n][~masks[n]] == 0).all()
        torch.testing.assert_close(scores[n], ref[n] * masks[n], rtol=1e-10, atol=1e-14)


class SharedTwice(nn.Module):
    """One Linear applied twice, and a second Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.inner = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.inner(torch.tanh(self.inner(x)))))


class TiedLinear(nn.Module):
    """Two Linear layers holding one Parameter, and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.b.weight = self.a.weight
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))


@pytest.mark.parametrize("cls", [SharedTwice, TiedLinear])
def test_snip_shared_and_tied_match_bruteforce(cls):
    model = cls().double()
    data = mlp_data(features=6)
    scores = gradsift.score(model, "snip", data)
    names = list(scores)
    assert names == (
        ["inner.weight", "head.weight"] if cls is SharedTwice else ["a.weight", "head.weight"]
    )
    ref = snip_reference(model, *data[0], names)
    for n in names:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=1e-14)


def test_tied_weight_pruned_once_masked_in_both_holders_and_stays_tied():
    model = TiedLinear().double()
    data = mlp_data(features=6)
    masks = gradsift.prune_at_init(model, "magnitude", 0.5, data)
    assert list(masks) == ["a.weight", "head.weight"]
    assert total_kept(masks) == kept(36 + 18, 0.5)
    assert model.a.weight_mask is model.b.weight_mask
    assert model.a.weight_orig is model.b.weight_orig
    rep = gradsift.sparsity_report(model)
    assert [x.name for x in rep.layers] == ["a.weight", "head.weight"]
    assert rep.kept == total_kept(masks)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    _train(model, opt, data)
    model(data[0][0])
    assert torch.equal(model.a.weight, model.b.weight)
    assert (model.b.weight[~masks["a.weight"]] == 0).all()
    # pruning again keeps the tie and the previous masks
    again = gradsift.prune_at_init(model, "random", 0.8)
    assert model.a.weight_mask is model.b.weight_mask
    assert not (again["a.weight"] & ~masks["a.weight"]).any()


@pytest.mark.parametrize("holder", ["a", "b"])
@pytest.mark.parametrize("method", ["magnitude", "random"])
def test_tied_weight_pruned_by_torch_in_one_holder_stays_tied(holder, method):
    # torch.nn.utils.prune on one holder of a tied weight gives that holder a float
    # mask and the other none; pruning at init masks both alike, keeping what torch
    # pruned pruned and the requested count (it crashed for "a", untied for "b")
    model = TiedLinear()
    torch.nn.utils.prune.random_unstructured(getattr(model, holder), "weight", amount=0.5)
    before = getattr(model, holder).weight_mask.clone()
    masks = gradsift.prune_at_init(model, method, 0.6, mlp_data(features=6))
    assert total_kept(masks) == kept(36 + 18, 0.6)
    mask = masks["a.weight"].bool()  # torch's float buffer where "a" holds it
    assert not (mask & (before == 0)).any(), "what torch pruned stays pruned"
    for m in (model.a, model.b):
        assert torch.equal(m.weight_mask.bool(), mask)
    model(torch.zeros(1, 6))
    assert torch.equal(model.a.weight, model.b.weight)
    # masks given by hand: the same
    gradsift.apply_masks_(model, {"a.weight": torch.rand(6, 6) > 0.3})
    model(torch.zeros(1, 6))
    assert torch.equal(model.a.weight_mask.bool(), model.b.weight_mask.bool())
    assert torch.equal(model.a.weight, model.b.weight)


# --------------------------------------------------------------- SynFlow reference


def synflow_reference(model, names, input_shape):
    """The paper's formula: every parameter |p| (biases zero: the documented variant),
    BatchNorm in eval mode with zero mean, float64, ones input, R = sum of output,
    score |dR/dw * w|."""
    ref = copy.deepcopy(model).double().eval()
    for n in names:
        m, a = _mod_attr(ref, n)
        if hasattr(m, a + "_orig"):
            prune.remove(m, a)
    with torch.no_grad():
        for pn, p in ref.named_parameters():
            if pn.endswith("bias"):
                p.zero_()
            else:
                p.abs_()
        for m in ref.modules():
            if isinstance(m, nn.modules.batchnorm._NormBase):
                m.running_mean.zero_()
    ws = [ref.get_parameter(n) for n in names]
    r = ref(torch.ones(1, *input_shape, dtype=torch.float64)).sum()
    gs = torch.autograd.grad(r, ws)
    return {n: (g * w).abs() for n, g, w in zip(names, gs, ws)}


@pytest.mark.parametrize("train_mode", [True, False])
def test_synflow_matches_paper_formula_with_batchnorm(train_mode):
    model = ConvBN()
    with torch.no_grad():  # non-trivial running statistics
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
        model.bn.weight.uniform_(-2, 2)
    model.train(train_mode)
    before = state(model)
    scores = gradsift.score(model, "synflow", conv_data())
    assert_state_equal(before, state(model))
    ref = synflow_reference(model, list(scores), (2, 5, 5))
    for n in ref:
        assert scores[n].dtype == torch.float64
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=0)


def test_synflow_conservation_bias_free_relu():
    model = mlp(bias=False, dtype=torch.float32)
    scores = gradsift.score(model, "synflow", input_shape=(12,))
    sums = [float(s.sum()) for s in scores.values()]
    for s in sums:
        assert math.isclose(s, sums[0], rel_tol=1e-9)
    ref = synflow_reference(model, list(scores), (12,))
    for n in ref:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=0)


def iterative_synflow_reference(model, names, input_shape, sparsity, iterations):
    """SynFlow's Algorithm 1 by brute force: round i keeps density rho^(i/n) of all
    weights, ranking the live ones (tie-free), rescoring the masked model."""
    masks = {n: torch.ones_like(model.get_parameter(n), dtype=torch.bool) for n in names}
    total = sum(m.numel() for m in masks.values())
    for i in range(1, iterations + 1):
        target = sparsity if i == iterations else 1 - (1 - sparsity) ** (i / iterations)
        work = copy.deepcopy(model)
        with torch.no_grad():
            for n in names:
                work.get_parameter(n).mul_(masks[n])
        s = synflow_reference(work, names, input_shape)
        flat = torch.cat([torch.where(masks[n], s[n], -1.0).reshape(-1) for n in names])
        keep = flat.topk(total - round(target * total)).indices
        new = torch.zeros(total, dtype=torch.bool)
        new[keep] = True
        off = 0
        for n in names:
            masks[n] = new[off : off + masks[n].numel()].view_as(masks[n])
            off += masks[n].numel()
    return masks


def test_iterative_synflow_matches_bruteforce():
    model = mlp(bias=False, sizes=(8, 7, 6, 3))
    names = linear_names(model)
    ref = iterative_synflow_reference(model, names, (8,), 0.8, 4)
    masks = gradsift.prune_at_init(model, "synflow", 0.8, input_shape=(8,), iterations=4)
    for n in names:
        assert torch.equal(masks[n], ref[n]), n


# ---------------------------------------------------------- scoring leaves model alone


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = ConvBN()
        self.calls = 0
        self.body.fc1.register_forward_hook(self._count)

    def _count(self, module, args, out):
        self.calls += 1

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("method", sorted(gradsift.list_methods()))
@pytest.mark.parametrize("train_mode", [True, False])
def test_score_leaves_model_untouched(method, train_mode):
    model = ConvBN()
    model.train(train_mode)
    model.fc2.weight.requires_grad_(False)
    model.fc1.weight.grad = torch.full_like(model.fc1.weight, 0.25)
    gradsift.prune_at_init(model, "random", 0.3)  # a pruned model, too
    before = state(model)
    opts = {"samples_per_class": 2, "num_classes": 3} if method == "grasp" else {}
    if method in ("force", "iter_snip"):
        opts = {"sparsity": 0.5, "steps": 3}
    if method == "prospr":
        opts = {"steps": 2}
    scores = gradsift.score(model, method, conv_data(), **opts)
    assert_state_equal(before, state(model))
    for n, s in scores.items():
        assert s.shape == original(*_mod_attr(model, n)).shape
        assert torch.isfinite(s).all()


def test_prune_at_init_changes_only_the_reparametrisation():
    model = ConvBN()
    model.eval()
    x = conv_data()[0][0]
    bn_before = {k: v.clone() for k, v in model.bn.state_dict().items()}
    w_before = {n: model.get_parameter(n).detach().clone() for n in ["conv.weight", "fc1.weight"]}
    masks = gradsift.prune_at_init(model, "snip", 0.5, conv_data())
    assert not model.training and not model.bn.training
    for k, v in model.bn.state_dict().items():
        assert torch.equal(v, bn_before[k]), k
    for n, w in w_before.items():
        m, a = _mod_attr(model, n)
        assert torch.equal(getattr(m, a + "_orig"), w)
        assert torch.equal(getattr(m, a), torch.where(masks[n], w, 0))
    with torch.no_grad():
        model(x)
    assert torch.equal(model.bn.running_mean, bn_before["running_mean"])  # eval: untouched


# ------------------------------------------------------------------------- params=


class WithAttention(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.emb = nn.Embedding(10, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.conv = nn.Conv1d(8, 8, 1)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = self.emb(x)
        h = self.norm(h + self.attn(h, h, h, need_weights=False)[0])
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return self.out(h.mean(1))


def test_default_selection_names():
    model = WithAttention()
    masks = gradsift.prune_at_init(model, "magnitude", 0.5)
    assert list(masks) == [
        "attn.in_proj_weight",
        "attn.out_proj.weight",
        "conv.weight",
        "out.weight",
    ]
    n = sum(m.numel() for m in masks.values())
    assert n == 3 * 64 + 64 + 64 + 24
    assert total_kept(masks) == kept(n, 0.5)
    # the pruned attention uses the masked weights, out_proj included
    x = torch.randint(0, 10, (2, 5))
    ref = copy.deepcopy(model)
    for mod, attr in [
        (ref.attn, "in_proj_weight"),
        (ref.attn.out_proj, "weight"),
        (ref.conv, "weight"),
        (ref.out, "weight"),
    ]:
        prune.remove(mod, attr)
    model.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=0, atol=0)


def test_params_names_predicate_and_missing():
    model = ConvBN()
    masks = gradsift.prune_at_init(
        model, "magnitude", 0.5, params=["fc1.weight", "bn.weight", "fc2.bias"]
    )
    assert list(masks) == ["bn.weight", "fc1.weight", "fc2.bias"]  # model order
    assert not hasattr(model.conv, "weight_mask")
    assert total_kept(masks) == kept(4 + 600 + 3, 0.5)
    model2 = ConvBN()
    masks2 = gradsift.prune_at_init(
        model2, "magnitude", 0.5, params=lambda name, module, t: isinstance(module, nn.Conv2d)
    )
    assert list(masks2) == ["conv.weight", "conv.bias"]
    with pytest.raises(ValueError):
        gradsift.prune_at_init(ConvBN(), "magnitude", 0.5, params=["nope.weight"])


def test_params_selector_on_pruned_model_uses_logical_names():
    model = ConvBN()
    gradsift.prune_at_init(model, "magnitude", 0.5)
    masks = gradsift.prune_at_init(model, "magnitude", 0.7, params=["fc1.weight"])
    assert list(masks) == ["fc1.weight"]
    assert int(masks["fc1.weight"].sum()) == kept(600, 0.7)


# -------------------------------------------------------------------- allocations


def rigl_erk_densities(shapes, sparsity, kernel):
    """RigL's exact ERK, written out independently: dense layers removed until no
    density exceeds 1, with the total kept exactly k_total."""
    sizes = {n: math.prod(s) for n, s in shapes.items()}
    k_total = kept(sum(sizes.values()), sparsity)
    raw = {}
    for n, s in shapes.items():
        if kernel:
            raw[n] = sum(s) / math.prod(s)
        else:
            raw[n] = (s[0] + s[1]) / (s[0] * s[1])
    dense = set()
    while True:
        rest = [n for n in sizes if n not in dense]
        eps = (k_total - sum(sizes[n] for n in dense)) / sum(raw[n] * sizes[n] for n in rest)
        newly = [n for n in rest if eps * raw[n] > 1]
        if not newly:
            return {n: 1.0 if n in dense else eps * raw[n] for n in sizes}
        dense.update(newly)


SHAPES = {
    "c1": torch.Size([4, 2, 3, 3]),
    "c2": torch.Size([8, 4, 3, 3]),
    "f1": torch.Size([16, 72]),
    "f2": torch.Size([3, 16]),
}


@pytest.mark.parametrize("sparsity", [0.3, 0.8, 0.95, 0.999])
@pytest.mark.parametrize("allocation", ["uniform", "er", "erk", "uniform+dense-first"])
def test_layer_counts_closed_forms(allocation, sparsity):
    sizes = {n: math.prod(s) for n, s in SHAPES.items()}
    n_total = sum(sizes.values())
    k_total = kept(n_total, sparsity)
    if allocation == "uniform+dense-first" and sizes["c1"] > k_total:
        with pytest.raises(ValueError):
            layer_counts(SHAPES, sparsity, allocation)
        return
    counts = layer_counts(SHAPES, sparsity, allocation)
    assert sum(counts.values()) == k_total
    if allocation == "uniform":
        dens = {n: k_total / n_total for n in sizes}
    elif allocation == "uniform+dense-first":
        dens = {n: (k_total - sizes["c1"]) / (n_total - sizes["c1"]) for n in sizes}
        dens["c1"] = 1.0
    else:
        dens = rigl_erk_densities(SHAPES, sparsity, kernel=allocation == "erk")
    got = layer_densities(SHAPES, sparsity, allocation)
    for n in sizes:
        assert math.isclose(got[n], dens[n], rel_tol=1e-12), n
        assert 0 <= counts[n] <= sizes[n]
        assert abs(counts[n] - dens[n] * sizes[n]) < 1 + 1e-9, n


@pytest.mark.parametrize("allocation", ["uniform", "er", "erk", "uniform+dense-first"])
def test_allocation_in_prune_at_init_ranks_within_layers(allocation):
    model = ConvBN()
    names = ["conv.weight", "fc1.weight", "fc2.weight"]
    shapes = {n: model.get_parameter(n).shape for n in names}
    weights = {n: model.get_parameter(n).detach().clone() for n in names}
    counts = layer_counts(shapes, 0.7, allocation)
    masks = gradsift.prune_at_init(model, "magnitude", 0.7, allocation=allocation)
    for n in names:
        assert int(masks[n].sum()) == counts[n], n
        flat = weights[n].abs().reshape(-1)
        expect = torch.zeros_like(flat, dtype=torch.bool)
        expect[flat.topk(counts[n]).indices] = True
        assert torch.equal(masks[n].reshape(-1), expect), n


def test_uniform_allocation_with_previous_masks_caps_and_exact_total():
    model = ConvBN()
    names = ["conv.weight", "fc1.weight", "fc2.weight"]
    # prune fc2 heavily first (only fc2 selected)
    gradsift.prune_at_init(model, "magnitude", 0.9, params=["fc2.weight"])
    alive_fc2 = int(model.fc2.weight_mask.sum())
    masks = gradsift.prune_at_init(model, "random", 0.5, allocation="uniform")
    n_total = sum(m.numel() for m in masks.values())
    assert total_kept(masks) == kept(n_total, 0.5)
    assert int(masks["fc2.weight"].sum()) <= alive_fc2
    shapes = {n: masks[n].shape for n in names}
    caps = {"conv.weight": 72, "fc1.weight": 600, "fc2.weight": alive_fc2}
    expect = layer_counts(shapes, 0.5, "uniform", caps=caps)
    assert {n: int(masks[n].sum()) for n in names} == expect


# ------------------------------------------------------------------ min_per_layer


@pytest.mark.parametrize("allocation", ["global", "uniform", "erk"])
def test_min_per_layer_guarantees_and_total(allocation):
    model = mlp(dtype=torch.float32, sizes=(12, 40, 3))
    with torch.no_grad():
        model[-1].weight.mul_(1e-6)  # the head would collapse under global magnitude
    masks = gradsift.prune_at_init(model, "magnitude", 0.95, min_per_layer=5, allocation=allocation)
    assert total_kept(masks) == kept(total_size(masks), 0.95)
    for n, m in masks.items():
        assert int(m.sum()) >= 5, n
    if allocation == "global":  # the head keeps exactly its 5 largest
        head = model[-1].weight_orig.detach().abs().reshape(-1)
        expect = torch.zeros_like(head, dtype=torch.bool)
        expect[head.topk(5).indices] = True
        assert torch.equal(masks["3.weight"].reshape(-1), expect)


def test_min_per_layer_with_infinite_scores():
    scores = {"a": torch.tensor([math.inf, math.inf, 1.0]), "b": torch.tensor([0.5, 0.2])}
    masks = gradsift.masks_from_scores(scores, 0.6, min_per_layer=1)  # keeps 2 of 5
    assert total_kept(masks) == 2
    assert int(masks["a"].sum()) >= 1 and int(masks["b"].sum()) >= 1


# --------------------------------------------------------------- sparsity extremes


@pytest.mark.parametrize("method", ["magnitude", "snip", "synflow"])
def test_sparsity_zero_installs_all_ones_and_changes_nothing(method):
    model = ConvBN()
    model.eval()
    x = conv_data()[0][0]
    with torch.no_grad():
        y = model(x)
    masks = gradsift.prune_at_init(model, method, 0.0, conv_data(), iterations=5)
    assert prune.is_pruned(model)
    assert all(m.all() for m in masks.values())
    with torch.no_grad():
        assert torch.equal(model(x), y)


@pytest.mark.parametrize("sparsity", [1 - 1e-3, 1 - 1e-9, math.nextafter(1.0, 0.0)])
def test_sparsity_close_to_one_exact(sparsity):
    model = mlp()
    masks = gradsift.prune_at_init(model, "magnitude", sparsity)
    assert total_kept(masks) == kept(total_size(masks), sparsity)
    with pytest.raises(ValueError):
        gradsift.prune_at_init(mlp(), "magnitude", 1.0)


def test_sparsity_close_to_one_min_per_layer_refused():
    with pytest.raises(ValueError):
        gradsift.prune_at_init(mlp(), "magnitude", 1 - 1e-9, min_per_layer=1)


# -------------------------------------------------------------------- sanity


def test_sanity_shuffle_layer_and_global_counts():
    model = ConvBN()
    plain = gradsift.masks_from_scores(gradsift.score(ConvBN(), "magnitude"), 0.8)
    g = torch.Generator().manual_seed(7)
    masks = gradsift.prune_at_init(model, "magnitude", 0.8, sanity="shuffle-layer", generator=g)
    for n in plain:
        assert int(masks[n].sum()) == int(plain[n].sum())
        assert masks[n] is model.get_buffer(n + "_mask")
    model2 = ConvBN()
    masks2 = gradsift.prune_at_init(model2, "magnitude", 0.8, sanity="shuffle-global", generator=g)
    assert total_kept(masks2) == total_kept(plain)


def test_sanity_invert_keeps_the_smallest_magnitudes():
    model = mlp()
    names = linear_names(model)
    w = torch.cat([model.get_parameter(n).detach().abs().reshape(-1) for n in names])
    masks = gradsift.prune_at_init(model, "magnitude", 0.7, sanity="invert")
    k = kept(w.numel(), 0.7)
    expect = torch.zeros_like(w, dtype=torch.bool)
    expect[(-w).topk(k).indices] = True
    assert torch.equal(torch.cat([masks[n].reshape(-1) for n in names]), expect)


def test_sanity_reinit_permutes_each_layer_keeps_masks():
    model = mlp()
    ref = torch_global_magnitude_masks(model, linear_names(model), 0.6)
    before = {n: model.get_parameter(n).detach().clone() for n in linear_names(model)}
    masks = gradsift.prune_at_init(model, "magnitude", 0.6, sanity="reinit")
    for n in masks:
        assert torch.equal(masks[n], ref[n])
        o = original(*_mod_attr(model, n)).detach()
        assert torch.equal(o.reshape(-1).sort().values, before[n].reshape(-1).sort().values)
        assert not torch.equal(o, before[n])


@pytest.mark.parametrize("sanity", ["shuffle-layer", "shuffle-global"])
def test_sanity_shuffle_keeps_previously_pruned_weights_pruned(sanity):
    model = mlp()
    first = {k: v.clone() for k, v in gradsift.prune_at_init(model, "magnitude", 0.5).items()}
    g = torch.Generator().manual_seed(1)
    second = gradsift.prune_at_init(model, "magnitude", 0.7, sanity=sanity, generator=g)
    assert total_kept(second) == kept(total_size(second), 0.7)
    for n in first:
        assert not (second[n] & ~first[n]).any(), n


# -------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_magnitude_and_snip(dtype):
    model = mlp(dtype=dtype)
    names = linear_names(model)
    w = torch.cat([model.get_parameter(n).detach().float().abs().reshape(-1) for n in names])
    masks = gradsift.prune_at_init(model, "magnitude", 0.6)
    k = kept(w.numel(), 0.6)
    v = w.sort(descending=True).values[k - 1]
    expect = w > v
    expect[(w == v).nonzero().flatten()[: k - int(expect.sum())]] = True
    assert torch.equal(torch.cat([masks[n].reshape(-1) for n in names]), expect)
    for n in names:
        m, a = _mod_attr(model, n)
        assert m.weight_orig.dtype == dtype
    data = mlp_data(dtype=dtype)
    model2 = mlp(dtype=dtype)
    masks2 = gradsift.prune_at_init(model2, "snip", 0.6, data)
    assert total_kept(masks2) == k
    out = model2(data[0][0])
    assert out.dtype == dtype


def test_synflow_on_half_model_scores_in_float64():
    model = mlp(dtype=torch.bfloat16, bias=False)
    scores = gradsift.score(model, "synflow", mlp_data(dtype=torch.bfloat16))
    ref = synflow_reference(model, list(scores), (12,))
    for n in ref:
        assert scores[n].dtype == torch.float64
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=0)


# ---------------------------------------------------------------------- data


def test_empty_data():
    with pytest.raises(ValueError):
        gradsift.prune_at_init(mlp(), "snip", 0.5, [])
    with pytest.raises(ValueError):
        gradsift.prune_at_init(mlp(), "synflow", 0.5, iter([]))
    model = mlp()
    masks = gradsift.prune_at_init(model, "magnitude", 0.5, iter([]))
    assert total_kept(masks) == kept(total_size(masks), 0.5)


def test_failed_pruning_leaves_model_unpruned():
    model = mlp()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError):
        gradsift.prune_at_init(model, "snip", 0.5, [])
    assert not prune.is_pruned(model)
    assert {k: v for k, v in model.state_dict().items()}.keys() == sd.keys()


@pytest.mark.parametrize("method", ["snip", "iter_snip", "force"])
def test_one_pass_generator_equals_list(method):
    data = mlp_data(n_batches=3)
    opts = {"steps": 3} if method != "snip" else {}
    a = gradsift.prune_at_init(mlp(), method, 0.7, data, iterations=3, **opts)
    b = gradsift.prune_at_init(mlp(), method, 0.7, (xy for xy in data), iterations=3, **opts)
    for n in a:
        assert torch.equal(a[n], b[n]), n


def test_iterative_snip_rounds_monotone_exact():
    data = mlp_data()
    model = mlp()
    masks = gradsift.prune_at_init(model, "snip", 0.9, data, iterations=4, schedule="linear")
    assert total_kept(masks) == kept(total_size(masks), 0.9)
    # reference: SNIP in rounds, each round on the masked model (brute force)
    names = linear_names(model)
    ref_model = mlp()
    live = {n: torch.ones_like(ref_model.get_parameter(n), dtype=torch.bool) for n in names}
    total = total_size(live)
    for i in range(1, 5):
        target = 0.9 * i / 4
        work = copy.deepcopy(ref_model)
        with torch.no_grad():
            for n in names:
                work.get_parameter(n).mul_(live[n])
        s = snip_reference(work, *data[0], names)
        flat = torch.cat([torch.where(live[n], s[n], -1.0).reshape(-1) for n in names])
        new = torch.zeros(total, dtype=torch.bool)
        new[flat.topk(kept(total, target)).indices] = True
        off = 0
        for n in names:
            live[n] = new[off : off + live[n].numel()].view_as(live[n])
            off += live[n].numel()
    for n in names:
        assert torch.equal(masks[n], live[n]), n


# ----------------------------------------------------------- non-finite weights


def _nonfinite_in_pruned_slot(value):
    model = mlp()
    mask = torch.ones(10, 12, dtype=torch.bool)
    mask[0, 0] = False
    with torch.no_grad():
        model[1].weight[0, 0] = value
    gradsift.apply_masks_(model, {"1.weight": mask})
    out = model(torch.ones(1, 12, dtype=torch.float64))
    assert torch.isfinite(out).all()  # the pruned model itself is finite
    return model


def _prune_again(model, method):
    opts = {"steps": 2} if method in ("force", "iter_snip", "prospr") else {}
    if method == "grasp":
        opts = {"samples_per_class": 2, "num_classes": 3}
    masks = gradsift.prune_at_init(model, method, 0.5, mlp_data(), **opts)
    assert total_kept(masks) == kept(total_size(masks), 0.5)
    assert not masks["1.weight"][0, 0]


@pytest.mark.parametrize("value", [math.inf, math.nan])
@pytest.mark.parametrize("method", ["magnitude", "snip", "prospr"])
def test_reprune_with_nonfinite_value_in_pruned_slot(method, value):
    _prune_again(_nonfinite_in_pruned_slot(value), method)


@pytest.mark.parametrize("value", [math.inf, math.nan])
@pytest.mark.parametrize(
    "method", ["random", "synflow", "synflow_l2", "grasp", "force", "iter_snip", "ntk_sap"]
)
def test_reprune_with_nonfinite_value_in_pruned_slot_other_methods(method, value):
    _prune_again(_nonfinite_in_pruned_slot(value), method)


def test_magnitude_inf_weight_is_kept_first():
    model = mlp()
    with torch.no_grad():
        model[3].weight[2, 1] = -math.inf
    masks = gradsift.prune_at_init(model, "magnitude", 0.99)
    assert masks["3.weight"][2, 1]
    assert total_kept(masks) == kept(total_size(masks), 0.99)


# -------------------------------------------------------------------- report


def test_sparsity_report_matches_direct_count():
    model = ConvBN()
    gradsift.prune_at_init(model, "magnitude", 0.4, params=["fc1.weight"])
    masks = gradsift.prune_at_init(model, "snip", 0.75, conv_data(), allocation="erk")
    rep = gradsift.sparsity_report(model)
    assert [x.name for x in rep.layers] == list(masks)
    for layer in rep.layers:
        m, a = _mod_attr(model, layer.name)
        eff = getattr(m, a)
        assert layer.total == eff.numel()
        assert layer.kept == int(m.get_buffer(a + "_mask").sum())
        assert layer.density == layer.kept / layer.total
    assert rep.kept == total_kept(masks) == kept(rep.total, 0.75)
    assert rep.collapsed == []
    d = rep.to_dict()
    assert d["kept"] == rep.kept and d["total"] == rep.total


def test_sparsity_report_flags_collapse():
    model = mlp(sizes=(12, 40, 3))
    masks = {"1.weight": torch.ones(40, 12), "3.weight": torch.zeros(3, 40)}
    gradsift.apply_masks_(model, masks)
    rep = gradsift.sparsity_report(model)
    assert rep.collapsed == ["3.weight"]
    assert rep.kept == 480


# ---------------------------------------------------------- masks_from_scores


def test_masks_from_scores_previous_and_user_scores_untouched():
    gen = torch.Generator().manual_seed(0)
    flat = torch.randn(30, generator=gen)
    scores = {"a": flat[:12].view(3, 4), "b": flat[12:].view(18)}  # tiling one buffer
    copy_ = flat.clone()
    prev = {"a": torch.rand(3, 4, generator=gen) > 0.3, "b": torch.ones(18)}
    masks = gradsift.masks_from_scores(scores, 0.5, previous=prev)
    assert torch.equal(flat, copy_)  # user scores unchanged
    keys = torch.cat([torch.where(prev["a"], scores["a"], -math.inf).reshape(-1), flat[12:]])
    expect = torch.zeros(30, dtype=torch.bool)
    expect[keys.topk(15).indices] = True
    assert torch.equal(torch.cat([masks["a"].reshape(-1), masks["b"]]), expect)
    masks2 = gradsift.masks_from_scores(scores, 0.5)
    expect2 = torch.zeros(30, dtype=torch.bool)
    expect2[flat.topk(15).indices] = True
    assert torch.equal(torch.cat([masks2["a"].reshape(-1), masks2["b"]]), expect2)
    assert torch.equal(flat, copy_)


def test_masks_from_scores_float64_resolution():
    base = torch.tensor([1.0, 1.0 + 1e-12, 1.0 + 2e-12, 1.0 - 1e-12], dtype=torch.float64)
    masks = gradsift.masks_from_scores({"x": base}, 0.5)
    assert masks["x"].tolist() == [False, True, True, False]


# ------------------------------------------------------ FORCE / Iterative SNIP


def progressive_reference(model, names, data, sparsity, steps, revive):
    """de Jorge et al. Alg. 1 by brute force (one batch per round, tie-free)."""
    theta = {n: model.get_parameter(n).detach().clone() for n in names}
    masks = {n: torch.ones_like(theta[n], dtype=torch.bool) for n in names}
    total = sum(t.numel() for t in theta.values())
    x, y = data[0]
    for r in range(1, steps + 1):
        target = sparsity if r == steps else 1 - (1 - sparsity) ** (r / steps)
        work = copy.deepcopy(model).train()
        with torch.no_grad():
            for n in names:
                work.get_parameter(n).copy_(theta[n] * masks[n])
        ws = [work.get_parameter(n) for n in names]
        gs = torch.autograd.grad(F.cross_entropy(work(x), y), ws)
        sal = {
            n: ((theta[n] if revive else theta[n] * masks[n]) * g).abs() for n, g in zip(names, gs)
        }
        dead = -1.0 if not revive else 0.0
        flat = torch.cat([torch.where(masks[n] | revive, sal[n], dead).reshape(-1) for n in names])
        new = torch.zeros(total, dtype=torch.bool)
        new[flat.topk(kept(total, target)).indices] = True
        off = 0
        for n in names:
            masks[n] = new[off : off + masks[n].numel()].view_as(masks[n])
            off += masks[n].numel()
    return masks


@pytest.mark.parametrize("steps", [1, 4])
@pytest.mark.parametrize("method", ["iter_snip", "force"])
def test_progressive_methods_match_bruteforce(method, steps):
    data = mlp_data()
    model = mlp()
    names = linear_names(model)
    ref = progressive_reference(mlp(), names, data, 0.85, steps, revive=method == "force")
    masks = gradsift.prune_at_init(model, method, 0.85, data, steps=steps)
    for n in names:
        assert torch.equal(masks[n], ref[n]), n
    if steps == 1:  # one step is SNIP
        snip = gradsift.prune_at_init(mlp(), "snip", 0.85, data)
        for n in names:
            assert torch.equal(masks[n], snip[n]), n


# ----------------------------------------------- iterative SynFlow on a pruned model


def test_iterative_synflow_on_pruned_model_matches_bruteforce():
    model = mlp(bias=False, sizes=(8, 7, 6, 3))
    names = linear_names(model)
    gradsift.prune_at_init(model, "random", 0.3, params=names[:2])
    first = {n: model.get_buffer(n + "_mask").clone() for n in names[:2]}
    first[names[2]] = torch.ones(3, 6, dtype=torch.bool)
    # reference: rounds as in Alg. 1, the dead weights of the first pruning dead throughout
    ref_model = mlp(bias=False, sizes=(8, 7, 6, 3))
    live = dict(first)
    total = sum(m.numel() for m in live.values())
    for i in range(1, 4):
        target = 0.8 if i == 3 else 1 - 0.2 ** (i / 3)
        work = copy.deepcopy(ref_model)
        with torch.no_grad():
            for n in names:
                work.get_parameter(n).mul_(live[n])
        s = synflow_reference(work, names, (8,))
        flat = torch.cat([torch.where(live[n], s[n], -1.0).reshape(-1) for n in names])
        k = min(kept(total, target), int(sum(int(m.sum()) for m in live.values())))
        new = torch.zeros(total, dtype=torch.bool)
        new[flat.topk(k).indices] = True
        off = 0
        for n in names:
            live[n] = new[off : off + live[n].numel()].view_as(live[n])
            off += live[n].numel()
    masks = gradsift.prune_at_init(model, "synflow", 0.8, input_shape=(8,), iterations=3)
    for n in names:
        assert torch.equal(masks[n], live[n]), n


def test_synflow_params_with_batchnorm_weight_matches_formula():
    model = ConvBN()
    with torch.no_grad():
        model.bn.weight.uniform_(-2, 2)
        model.bn.running_var.uniform_(0.5, 2)
    names = ["conv.weight", "bn.weight", "fc1.weight", "fc2.weight"]
    scores = gradsift.score(model, "synflow", conv_data(), params=names)
    ref = synflow_reference(model, names, (2, 5, 5))
    for n in names:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=0)


def synflow_l2_reference(model, names, input_shape):
    """SynFlow-L2 (PX's definition): every weight squared, biases and BatchNorm means
    zero, BatchNorm's eval scale squared; score |theta| * dR2/dphi."""
    ref = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        for pn, p in ref.named_parameters():
            p.copy_(torch.zeros_like(p) if pn.endswith("bias") else p * p)
        for m in ref.modules():
            if isinstance(m, nn.modules.batchnorm._NormBase):
                m.running_mean.zero_()
                m.running_var.copy_((m.running_var + m.eps) ** 2 - m.eps)
    ws = [ref.get_parameter(n) for n in names]
    r = ref(torch.ones(1, *input_shape, dtype=torch.float64)).sum()
    gs = torch.autograd.grad(r, ws)
    return {n: (g * w.sqrt()).abs() for n, g, w in zip(names, gs, ws)}


def test_synflow_l2_matches_formula_with_batchnorm():
    model = ConvBN()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
        model.bn.weight.uniform_(-2, 2)
    scores = gradsift.score(model, "synflow_l2", conv_data())
    ref = synflow_l2_reference(model, list(scores), (2, 5, 5))
    for n in ref:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=0)


class SharedRelu(nn.Module):
    """One bias-free Linear applied twice (weight sharing across depth)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.inner = nn.Linear(6, 6, bias=False)
        self.head = nn.Linear(6, 3, bias=False)

    def forward(self, x):
        return self.head(torch.relu(self.inner(torch.relu(self.inner(x)))))


class DirectReadRelu(nn.Module):
    """A bias-free Linear called once and its weight also read directly."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc = nn.Linear(6, 6, bias=False)
        self.head = nn.Linear(6, 3, bias=False)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        return self.head(torch.relu(h @ self.fc.weight.t()))


@pytest.mark.parametrize("cls", [SharedRelu, DirectReadRelu])
@pytest.mark.parametrize("method", ["synflow", "synflow_l2"])
def test_synflow_linear_weight_used_twice(method, cls):
    model = cls()
    scores = gradsift.score(model, method, input_shape=(6,))
    ref = (synflow_reference if method == "synflow" else synflow_l2_reference)(
        model, list(scores), (6,)
    )
    for n in ref:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=0)


def test_snip_linear_weight_used_twice_matches_bruteforce():
    for cls in (SharedRelu, DirectReadRelu):
        model = cls().double()
        data = mlp_data(features=6)
        scores = gradsift.score(model, "snip", data)
        ref = snip_reference(model, *data[0], list(scores))
        for n in ref:
            torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=1e-14)


class KeywordCall(nn.Module):
    """Calls its Linear layers with the keyword nn.Linear.forward names: input=."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.fc = nn.Linear(12, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(input=torch.tanh(self.fc(input=x)))


@pytest.mark.parametrize("method", ["snip", "synflow", "synflow_l2"])
def test_linear_called_with_input_keyword(method):
    model = KeywordCall().double()
    data = mlp_data()
    scores = gradsift.score(model, method, data)
    if method == "snip":
        ref = snip_reference(model, *data[0], list(scores))
    elif method == "synflow":
        ref = synflow_reference(model, list(scores), (12,))
    else:
        ref = synflow_l2_reference(model, list(scores), (12,))
    for n in ref:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-10, atol=1e-14)


def test_keyword_call_works_for_other_methods():
    model = KeywordCall().double()
    for method in ["magnitude", "random", "force", "iter_snip", "ntk_sap", "prospr", "grasp"]:
        opts = {"steps": 2} if method in ("force", "iter_snip", "prospr") else {}
        if method == "grasp":
            opts = {"samples_per_class": 2, "num_classes": 3}
        masks = gradsift.prune_at_init(copy.deepcopy(model), method, 0.5, mlp_data(), **opts)
        assert total_kept(masks) == kept(total_size(masks), 0.5)


# ------------------------------------------------------------- integer scores


def test_masks_from_scores_integer_scores_rank_exactly():
    scores = {"x": torch.arange(20_000_000, 20_000_010)}  # e.g. ranks as scores
    masks = gradsift.masks_from_scores(scores, 0.5)
    assert masks["x"].tolist() == [False] * 5 + [True] * 5


def test_masks_from_scores_small_integer_scores():
    scores = {"x": torch.tensor([3, 1, 2, 5, 4]), "y": torch.tensor([[0, 7]])}
    masks = gradsift.masks_from_scores(scores, 0.5)  # removes round(3.5) = 4 of 7
    assert masks["x"].tolist() == [False, False, False, True, True]
    assert masks["y"].tolist() == [[False, True]]


# ----------------------------------------------------------- apply_masks_ shapes


@pytest.mark.parametrize("replace", [False, True])
def test_apply_masks_refuses_wrong_shape_on_pruned_layer(replace):
    model = mlp()
    with pytest.raises(ValueError):
        gradsift.apply_masks_(model, {"1.weight": torch.zeros(10, 1)})
    gradsift.apply_masks_(model, {"1.weight": torch.ones(10, 12)})
    try:
        gradsift.apply_masks_(model, {"1.weight": torch.zeros(10, 1)}, replace=replace)
    except (ValueError, RuntimeError):
        return
    raise AssertionError(f"accepted; kept {int(model[1].weight_mask.sum())} of 120")


# ------------------------------------------------ plain tensor attributes of the model


class PlainState(nn.Module):
    """Keeps a call counter as a plain tensor attribute (not a buffer)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(12, 3)
        self.calls = torch.zeros(())
        self.register_buffer("buffer_calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        self.buffer_calls += 1
        return self.fc(x)


@pytest.mark.parametrize("method", ["snip", "synflow", "synflow_l2"])
def test_score_does_not_touch_plain_tensor_attributes(method):
    model = PlainState().double()
    gradsift.score(model, method, mlp_data())
    assert float(model.buffer_calls) == 0
    assert float(model.calls) == 0


@pytest.mark.parametrize("method", ["grasp", "force", "iter_snip", "prospr", "ntk_sap"])
def test_score_does_not_touch_plain_tensor_attributes_full_copy(method):
    model = PlainState().double()
    opts = {"samples_per_class": 2, "num_classes": 3} if method == "grasp" else {}
    gradsift.score(model, method, mlp_data(), **opts)
    assert float(model.buffer_calls) == 0
    assert float(model.calls) == 0


# ------------------------------------------------------------------------ GraSP


def grasp_reference(model, names, data, spc, ncls, temperature=200.0):
    """theta * Hg of the mean loss over the class-balanced sample (first spc of each
    class in data order), logits / temperature; no BatchNorm, so halves do not matter."""
    xs = {c: [] for c in range(ncls)}
    for x, y in data:
        for i in range(len(y)):
            if len(xs[int(y[i])]) < spc:
                xs[int(y[i])].append(x[i])
    x = torch.stack([v for c in range(ncls) for v in xs[c]])
    y = torch.arange(ncls).repeat_interleave(spc)
    ref = copy.deepcopy(model).train()
    ws = [ref.get_parameter(n) for n in names]
    g = torch.autograd.grad(F.cross_entropy(ref(x) / temperature, y), ws, create_graph=True)
    hg = torch.autograd.grad(sum((gi * gi.detach()).sum() for gi in g), ws)
    return {n: (w * h).detach() for n, w, h in zip(names, ws, hg)}


@pytest.mark.parametrize("spc", [2, 3])
def test_grasp_matches_bruteforce(spc):
    model = mlp()
    data = mlp_data(n_batches=3, n=7)
    scores = gradsift.score(model, "grasp", data, samples_per_class=spc, num_classes=3)
    ref = grasp_reference(model, list(scores), data, spc, 3)
    for n in ref:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-9, atol=1e-18)


# ----------------------------------------------------------- more prune_at_init


def test_lower_sparsity_second_time_warns_and_keeps_masks():
    model = mlp()
    first = {k: v.clone() for k, v in gradsift.prune_at_init(model, "magnitude", 0.7).items()}
    with pytest.warns(UserWarning, match="already has"):
        second = gradsift.prune_at_init(model, "random", 0.3)
    for n in first:
        assert torch.equal(first[n], second[n])


def test_callable_allocation_exact_counts():
    masks = gradsift.prune_at_init(
        mlp(), "magnitude", 0.6, allocation=lambda shapes, s: {n: 1 - s for n in shapes}
    )
    assert {k: int(v.sum()) for k, v in masks.items()} == {
        "1.weight": 48,
        "3.weight": 32,
        "5.weight": 10,
    }
    with pytest.raises(ValueError):
        gradsift.prune_at_init(
            mlp(), "magnitude", 0.6, allocation=lambda sh, s: dict.fromkeys(sh, 1.0)
        )


def test_dataloader_all_batches_equals_one_full_batch():
    from torch.utils.data import DataLoader, TensorDataset

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(21, 12, generator=gen, dtype=torch.float64)
    y = torch.arange(21) % 3
    loader = DataLoader(TensorDataset(x, y), batch_size=8)  # 8, 8, 5
    a = gradsift.score(mlp(), "snip", loader, num_batches=None)
    b = gradsift.score(mlp(), "snip", [(x, y)])
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-12, atol=1e-16)


def test_apply_masks_copies_the_callers_boolean_mask():
    model = mlp()
    mask = torch.rand(10, 12, generator=torch.Generator().manual_seed(0)) > 0.5
    snap = mask.clone()
    gradsift.apply_masks_(model, {"1.weight": mask})
    mask.fill_(False)
    assert torch.equal(model[1].weight_mask, snap)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_pruned_attention_copy_refreshes_its_own_out_proj(how):
    model = WithAttention()
    x = torch.randint(0, 10, (4, 5))
    gradsift.prune_at_init(model, "snip", 0.5, [(x, torch.arange(4) % 3)])
    clone = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    F.cross_entropy(clone(x), torch.arange(4) % 3).backward()
    assert clone.attn.out_proj.weight_orig.grad is not None
    assert model.attn.out_proj.weight_orig.grad is None
    mask = clone.attn.out_proj.weight_mask
    assert (clone.attn.out_proj.weight_orig.grad[~mask] == 0).all()


@pytest.mark.parametrize("iterations", [1, 3])
def test_prune_at_init_train_mode_batchnorm_untouched(iterations):
    model = ConvBN()
    model.train()
    bn = {k: v.clone() for k, v in model.bn.state_dict().items()}
    masks = gradsift.prune_at_init(model, "snip", 0.8, conv_data(), iterations=iterations)
    assert model.training and model.bn.training
    for k, v in model.bn.state_dict().items():
        assert torch.equal(v, bn[k]), k
    assert total_kept(masks) == kept(total_size(masks), 0.8)


# ------------------------------------------------------------------------ ProsPr


def prospr_reference(model, names, data, steps, lr, momentum):
    """|dL(w_M)/dc| through M differentiable SGD steps on every parameter, w_0 = theta*c."""
    from torch.func import functional_call

    ref = copy.deepcopy(model).train()
    params = {n: p.detach().clone().requires_grad_(True) for n, p in ref.named_parameters()}
    cs = {n: torch.ones_like(params[n], requires_grad=True) for n in names}
    w = {n: params[n].detach() * cs[n] if n in cs else params[n] for n in params}
    velocity = {}
    x, y = data[0]
    for _ in range(steps):
        loss = F.cross_entropy(functional_call(ref, w, (x,)), y)
        gs = torch.autograd.grad(loss, list(w.values()), create_graph=True)
        new = {}
        for (n, p), g in zip(w.items(), gs):
            if momentum:
                g = velocity[n] = g if n not in velocity else momentum * velocity[n] + g
            new[n] = p - lr * g
        w = new
    meta = F.cross_entropy(functional_call(ref, w, (x,)), y)
    return {n: g.abs() for n, g in zip(names, torch.autograd.grad(meta, [cs[n] for n in names]))}


@pytest.mark.parametrize(("steps", "momentum"), [(0, 0.0), (2, 0.0), (3, 0.9)])
def test_prospr_matches_bruteforce(steps, momentum):
    model = mlp()
    data = mlp_data()
    scores = gradsift.score(model, "prospr", data, steps=steps, momentum=momentum)
    ref = prospr_reference(model, list(scores), data, steps, 0.1, momentum)
    for n in ref:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-9, atol=1e-18)


# ----------------------------------------------------------------------- NTK-SAP


def ntk_sap_reference(model, names, x_shape, epsilon=0.01, seed=0, repeats=1):
    """|sum over draws of dJ/dc| at c = 1, J = ||f(x; theta*c) - f(x; (theta+eps*delta)*c)||^2,
    theta Kaiming-normal, x and delta Gaussian, drawn from one seeded generator in the
    documented order (each target's theta, then x, then each target's delta)."""
    from torch.func import functional_call

    gen = torch.Generator().manual_seed(seed)
    ref = copy.deepcopy(model).eval()
    total = dict.fromkeys(names, 0)
    for _ in range(repeats):
        theta = {}
        for n in names:
            w = ref.get_parameter(n)
            std = math.sqrt(2.0 / (w.shape[1] * math.prod(w.shape[2:])))
            theta[n] = torch.randn(w.shape, generator=gen, dtype=w.dtype) * std
        x = torch.randn(x_shape, generator=gen, dtype=torch.float64)
        delta = {n: torch.randn(theta[n].shape, generator=gen, dtype=theta[n].dtype) for n in names}
        c = {n: torch.ones_like(theta[n], requires_grad=True) for n in names}
        f0 = functional_call(ref, {n: theta[n] * c[n] for n in names}, (x,))
        f1 = functional_call(ref, {n: (theta[n] + epsilon * delta[n]) * c[n] for n in names}, (x,))
        gs = torch.autograd.grad((f0 - f1).square().sum(), [c[n] for n in names])
        for n, g in zip(names, gs):
            total[n] = total[n] + g
    return {n: total[n].abs() for n in names}


@pytest.mark.parametrize("repeats", [1, 2])
def test_ntk_sap_matches_bruteforce(repeats):
    model = mlp()
    data = mlp_data()
    scores = gradsift.score(model, "ntk_sap", data, repeats=repeats)
    ref = ntk_sap_reference(model, list(scores), tuple(data[0][0].shape), repeats=repeats)
    for n in ref:
        torch.testing.assert_close(scores[n], ref[n], rtol=1e-9, atol=1e-18)
    masks = gradsift.prune_at_init(mlp(), "ntk_sap", 0.7, data, repeats=repeats)
    expect = gradsift.masks_from_scores(scores, 0.7)
    for n in masks:
        assert torch.equal(masks[n], expect[n])


# ---------------------------------------------------- TopK built before pruning


def test_topk_built_before_pruning_keeps_pruned_weights_zero():
    model = ConvBN()
    data = conv_data()
    opt = gradsift.TopK(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), density=0.1)
    _train(model, opt, data, steps=1)  # the flat gradient buffers are laid out
    masks = gradsift.prune_at_init(model, "snip", 0.8, data)
    snap = {n: m.clone() for n, m in masks.items()}
    assert total_kept(snap) == kept(total_size(snap), 0.8)
    _train(model, opt, data, steps=3)
    model(data[0][0])
    for n in masks:
        m, a = _mod_attr(model, n)
        assert (getattr(m, a)[~snap[n]] == 0).all()
        assert torch.equal(getattr(m, a + "_mask"), snap[n])


# ------------------------------------------------------------ deprecated aliases


def test_deprecated_scope_and_budget_aliases():
    ref = gradsift.prune_at_init(ConvBN(), "magnitude", 0.7, allocation="uniform")
    with pytest.warns(DeprecationWarning):
        a = gradsift.prune_at_init(ConvBN(), "magnitude", 0.7, scope="layer")
    with pytest.warns(DeprecationWarning):
        b = gradsift.prune_at_init(ConvBN(), "magnitude", 0.7, budget="uniform")
    for n in ref:
        assert torch.equal(a[n], ref[n]) and torch.equal(b[n], ref[n])
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError):
        gradsift.prune_at_init(ConvBN(), "magnitude", 0.7, scope="layer", allocation="erk")


def test_boolean_state_dict_loads_into_torch_float_mask_model():
    model, masks = _pruned_convbn("snip")
    model.eval()
    x = conv_data()[0][0]
    y = model(x)
    theirs = ConvBN()
    pairs = [(theirs.get_submodule(n.split(".")[0]), "weight") for n in masks]
    prune.global_unstructured(pairs, pruning_method=prune.RandomUnstructured, amount=0.1)
    theirs.eval()
    theirs.load_state_dict(model.state_dict())
    assert torch.equal(theirs(x), y)
    for n, (m, _) in zip(masks, pairs):
        assert m.weight_mask.dtype == torch.float32
        assert torch.equal(m.weight_mask.bool(), masks[n])


# ------------------------------------------------------------- under torch.no_grad


@pytest.mark.parametrize("method", ["snip", "synflow", "grasp"])
def test_prune_at_init_inside_no_grad(method):
    data = mlp_data()
    opts = {"samples_per_class": 2, "num_classes": 3} if method == "grasp" else {}
    ref = gradsift.prune_at_init(mlp(), method, 0.6, data, **opts)
    with torch.no_grad():
        masks = gradsift.prune_at_init(mlp(), method, 0.6, data, **opts)
    for n in ref:
        assert torch.equal(masks[n], ref[n])


@pytest.mark.parametrize("method", ["magnitude", "random"])
def test_prune_at_init_inside_no_grad_data_free_readers(method):
    ref = gradsift.prune_at_init(mlp(), method, 0.6)
    with torch.no_grad():
        masks = gradsift.prune_at_init(mlp(), method, 0.6)
    for n in ref:
        assert torch.equal(masks[n], ref[n])


# ------------------------------------------------------------ default conv kinds


def test_default_selection_conv1d_conv3d_grouped_match_torch():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv3d(1, 2, 2),
        nn.Flatten(2),
        nn.Conv1d(2, 4, 3, groups=2, bias=False),
        nn.Flatten(),
        nn.Linear(4 * 6, 3),
    )
    x = torch.randn(2, 1, 3, 3, 3)
    assert model(x).shape == (2, 3)
    names = ["0.weight", "2.weight", "4.weight"]
    ref = torch_global_magnitude_masks(model, names, 0.65)
    masks = gradsift.prune_at_init(model, "magnitude", 0.65)
    assert list(masks) == names
    for n in names:
        assert torch.equal(masks[n], ref[n]), n


@pytest.mark.parametrize("method", ["snip", "synflow", "grasp", "ntk_sap"])
def test_scoring_never_calls_the_callers_hooks(method):
    model = Hooked()
    opts = {"samples_per_class": 2, "num_classes": 3} if method == "grasp" else {}
    gradsift.prune_at_init(model, method, 0.5, conv_data(), **opts)
    assert model.calls == 0
    model(conv_data()[0][0])
    assert model.calls == 1

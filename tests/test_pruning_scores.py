"""Scores against independent references: autograd, hvp, closed forms."""

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call

import gradsift
from gradsift.models import VGG

torch.set_default_dtype(torch.float32)


def mlp(bias=True, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(12, 10, bias=bias),
        nn.ReLU(),
        nn.Linear(10, 8, bias=bias),
        nn.ReLU(),
        nn.Linear(8, 3, bias=bias),
    ).to(dtype)


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.frozen = nn.Linear(4 * 16, 8)
        self.fc = nn.Linear(8, 3)
        self.frozen.weight.requires_grad_(False)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.relu(self.frozen(h.flatten(1))))


def batches(n_batches=3, n=12, shape=(12,), classes=3, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randn((n, *shape), generator=gen, dtype=dtype)
        y = torch.arange(n) % classes
        out.append((x, y))
    return out


def snapshot(model):
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grad": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "rng": torch.get_rng_state(),
    }


@pytest.mark.parametrize("method", ["random", "magnitude", "snip", "grasp", "synflow"])
@pytest.mark.parametrize("train_mode", [True, False])
def test_scoring_leaves_model_untouched(method, train_mode):
    torch.manual_seed(0)
    model = BNNet().train(train_mode)
    model.fc.weight.grad = torch.full_like(model.fc.weight, 3.0)
    data = batches(2, n=9, shape=(1, 4, 4), dtype=torch.float32)
    before = snapshot(model)
    options = {"samples_per_class": 3} if method == "grasp" else {}
    scores = gradsift.score(model, method, data, **options)
    after = snapshot(model)
    for k in before["state"]:
        assert torch.equal(before["state"][k], after["state"][k]), k
    assert before["training"] == after["training"]
    assert before["requires_grad"] == after["requires_grad"]
    for a, b in zip(before["grad"], after["grad"]):
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(before["rng"], after["rng"])
    assert list(scores) == ["conv.weight", "frozen.weight", "fc.weight"]
    for name, s in scores.items():
        assert s.shape == model.get_parameter(name).shape


def test_magnitude_and_random():
    model = mlp()
    scores = gradsift.score(model, "magnitude")
    torch.testing.assert_close(scores["1.weight"], model[1].weight.abs(), rtol=0, atol=0)
    a = gradsift.score(model, "random", seed=1)
    b = gradsift.score(model, "random", seed=1)
    c = gradsift.score(model, "random", seed=2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["1.weight"], c["1.weight"])


def _flat_loss(model, names, data, temperature=1.0):
    """loss(w) over ``data`` as a function of the scored weights, for autograd refs."""
    shapes = [model.get_parameter(n).shape for n in names]

    def f(w):
        params, offset = {}, 0
        for n, s in zip(names, shapes):
            size = s.numel()
            params[n] = w[offset : offset + size].view(s)
            offset += size
        total = 0.0
        count = sum(len(y) for _, y in data)
        for x, y in data:
            out = functional_call(model, params, (x,)) / temperature
            total = total + nn.functional.cross_entropy(out, y, reduction="sum") / count
        return total

    w = torch.cat([model.get_parameter(n).detach().reshape(-1) for n in names])
    return f, w


def _unflatten(vec, model, names):
    out, offset = {}, 0
    for n in names:
        p = model.get_parameter(n)
        out[n] = vec[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return out


def test_snip_against_autograd_reference():
    model = mlp()
    data = batches(1)
    names = ["1.weight", "3.weight", "5.weight"]
    f, w = _flat_loss(model, names, data)
    g = torch.autograd.grad(f(w.requires_grad_()), w)[0]
    expected = _unflatten((g * w.detach()).abs(), model, names)
    got = gradsift.score(model, "snip", data)
    for n in names:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    ("hvp", "keep_graphs"), [("forward", False), ("double", False), ("double", True)]
)
def test_grasp_against_hvp_reference_and_sign(hvp, keep_graphs):
    model = mlp()
    data = batches(4, n=6)  # 24 samples, 8 per class
    names = ["1.weight", "3.weight", "5.weight"]
    per_class, temperature = 5, 200.0
    x, y = gradsift.pruning.class_balanced_sample(data, per_class, 3)
    f, w = _flat_loss(model, names, [(x, y)], temperature)
    leaf = w.clone().requires_grad_()
    g = torch.autograd.grad(f(leaf), leaf)[0].detach()
    _, hg = torch.autograd.functional.hvp(f, w.detach(), g)
    paper = -w.detach() * hg  # S(-θ) = -θ ⊙ Hg, the paper removes the highest
    got = gradsift.score(
        model,
        "grasp",
        data,
        samples_per_class=per_class,
        chunk_size=4,
        hvp=hvp,
        keep_graphs=keep_graphs,
    )
    expected = _unflatten(-paper, model, names)
    for n in names:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-9, atol=1e-18)


@pytest.mark.parametrize("hvp", ["forward", "double"])
def test_grasp_chunking_does_not_change_result(hvp):
    model = mlp()
    data = batches(4, n=6)
    a = gradsift.score(model, "grasp", data, samples_per_class=6, chunk_size=1, hvp=hvp)
    b = gradsift.score(model, "grasp", data, samples_per_class=6, chunk_size=1000, hvp=hvp)
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-10, atol=1e-20)


def test_grasp_keep_graphs_needs_double_backward():
    with pytest.raises(ValueError, match="keep_graphs=True needs hvp='double'"):
        gradsift.score(mlp(), "grasp", batches(4, n=6), hvp="forward", keep_graphs=True)


def test_grasp_missing_class_raises_instead_of_looping():
    model = mlp()
    data = [(torch.randn(10, 12, dtype=torch.float64), torch.zeros(10, dtype=torch.long))]
    with pytest.raises(ValueError, match=r"classes \[1, 2\]"):
        gradsift.score(model, "grasp", data, samples_per_class=2)


def _synflow_closed_form(model):
    """R = 1ᵀ |W_L| ... |W_1| 1 for a bias-free linear chain."""
    weights = [m.weight.detach().abs() for m in model if isinstance(m, nn.Linear)]
    v = torch.ones(weights[0].shape[1], dtype=torch.float64)
    for w in weights:
        v = w @ v
    return v.sum()


@pytest.mark.parametrize("bias", [False, True])
def test_synflow_conservation_closed_form(bias):
    # with default (non-zero) biases too: biases carry no flow in the linearised copy
    model = mlp(bias=bias)
    scores = gradsift.score(model, "synflow", input_shape=(12,))
    r = _synflow_closed_form(model)
    for name, s in scores.items():
        torch.testing.assert_close(s.sum(), r, rtol=1e-10, atol=0, msg=name)
        assert (s >= 0).all()


def test_synflow_conservation_with_batchnorm_vgg():
    torch.manual_seed(0)
    model = VGG(11, input_shape=(3, 8, 8), num_classes=10, batch_norm=True)
    model.train()  # scoring uses eval mode on the copy, whatever the caller's mode
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_var.uniform_(0.5, 2.0)
                m.running_mean.uniform_(-1, 1)
                m.bias.uniform_(-1, 1)
    scores = gradsift.score(model, "synflow", input_shape=(3, 8, 8))
    sums = torch.stack([s.sum() for s in scores.values()])
    torch.testing.assert_close(sums, sums[0].expand_as(sums), rtol=1e-9, atol=0)
    assert model.training


def test_synflow_needs_shape():
    with pytest.raises(ValueError, match="input_shape"):
        gradsift.score(mlp(), "synflow")


def test_data_methods_need_data_and_unknown_method():
    with pytest.raises(ValueError, match="needs data"):
        gradsift.score(mlp(), "snip")
    with pytest.raises(ValueError, match="method must be one of"):
        gradsift.score(mlp(), "l1")
    with pytest.raises(TypeError, match="unknown options"):
        gradsift.score(mlp(), "magnitude", temperature=3)
    with pytest.raises(ValueError, match="not found"):
        gradsift.score(mlp(), "magnitude", params=["nope.weight"])


def test_params_selector():
    model = mlp()
    s = gradsift.score(model, "magnitude", params=lambda n, m, p: n.endswith("bias"))
    assert list(s) == ["1.bias", "3.bias", "5.bias"]


def test_scores_of_pruned_model_use_effective_weights():
    model = mlp()
    gradsift.prune_at_init(model, "magnitude", 0.5)
    scores = gradsift.score(model, "magnitude")
    assert list(scores) == ["1.weight", "3.weight", "5.weight"]
    for name, s in scores.items():
        mask = model.get_buffer(name + "_mask")
        assert (s[mask == 0] == 0).all()


def test_list_methods():
    assert gradsift.list_methods() == ["grasp", "magnitude", "random", "snip", "synflow"]


def test_deepcopy_scoring_keeps_model_identity():
    model = mlp()
    ref = copy.deepcopy(model)
    gradsift.score(model, "grasp", batches(4, n=6), samples_per_class=2)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)


def test_grasp_agrees_with_reference_transcription():
    from gradsift.models import LeNet5
    from gradsift.reference import reference_grasp

    torch.manual_seed(0)
    model = LeNet5(input_shape=(1, 8, 8), num_classes=3).double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 1, 8, 8, generator=gen, dtype=torch.float64)
    y = torch.arange(3).repeat_interleave(4)
    ours = gradsift.score(model, "grasp", [(x, y)], samples_per_class=4, chunk_size=5)
    paper = reference_grasp(model, x, y)
    assert list(ours) == list(paper)
    for n in ours:  # the reference sums two half-batch means: 4x, and negated
        torch.testing.assert_close(-paper[n], 4 * ours[n], rtol=1e-9, atol=1e-20)


def test_synflow_rescorer_equals_scoring_the_masked_model():
    from gradsift.pruning.scores import synflow_rescorer

    model = mlp()
    rescore = synflow_rescorer(model, input_shape=(12,))
    first = rescore(None)
    masks = gradsift.masks_from_scores(first, 0.6)
    gradsift.apply_masks_(model, masks)
    again = rescore(masks)
    expected = gradsift.score(model, "synflow", input_shape=(12,))
    for n in expected:
        torch.testing.assert_close(again[n], expected[n], rtol=1e-12, atol=0)
        assert (again[n][masks[n] == 0] == 0).all()


def test_grasp_forward_and_double_agree_on_pruned_bn_convnet():
    torch.manual_seed(0)
    model = BNNet().double()
    gradsift.prune_at_init(model, "random", 0.5)
    data = batches(3, n=9, shape=(1, 4, 4), dtype=torch.float64)
    a = gradsift.score(model, "grasp", data, samples_per_class=3, hvp="forward")
    b = gradsift.score(model, "grasp", data, samples_per_class=3, hvp="double")
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-9, atol=1e-20)
        assert a[n].abs().sum() > 0


def test_grasp_sign_matches_gradient_norm_change():
    """GraSP keeps the weights whose removal would shrink the gradient norm most.

    First order: removing weight i (δ = -θ_i e_i) changes ‖g‖² by -2 θ_i (Hg)_i, so the
    highest θ ⊙ Hg (ours, kept) lowers gradient flow most when removed, and the lowest
    raises it: the paper's S(-θ) = -θ ⊙ Hg, removed highest. Checked by actually
    zeroing single weights, an independent measurement of the sign.
    """
    model = mlp(seed=3)
    data = batches(2, n=12)
    per_class = 8
    x, y = gradsift.pruning.class_balanced_sample(data, per_class, 3)
    scores = gradsift.score(model, "grasp", data, samples_per_class=per_class)
    name = "3.weight"
    s = scores[name].reshape(-1)

    def grad_norm_sq(m):
        params = [p for n, p in m.named_parameters() if n.endswith("weight")]
        loss = nn.functional.cross_entropy(m(x) / 200.0, y)
        return sum((g**2).sum() for g in torch.autograd.grad(loss, params))

    base = grad_norm_sq(model)
    for i, sign in ((int(s.argmax()), -1), (int(s.argmin()), +1)):
        m = copy.deepcopy(model)
        with torch.no_grad():
            m.get_parameter(name).view(-1)[i] = 0.0
        change = grad_norm_sq(m) - base
        assert torch.sign(change) == sign, (i, float(change), float(s[i]))
    # and GraSP keeps something that magnitude drops
    grasp = gradsift.masks_from_scores(scores, 0.5)
    magnitude = gradsift.masks_from_scores(gradsift.score(model, "magnitude"), 0.5)
    assert any(bool(((grasp[n] == 1) & (magnitude[n] == 0)).any()) for n in grasp)

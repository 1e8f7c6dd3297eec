"""GraSP against autograd's hvp, the authors' algorithm, and a direct measurement of
what its sign means."""

import copy

import pytest
import torch
from torch import nn

import gradsift
from gradsift.lab.baselines import reference_grasp
from gradsift.lab.models import LeNet5
from pruning_support import NAMES, BNNet, batches, flat_loss, mlp, unflatten


@pytest.mark.parametrize(
    ("hvp", "keep_graphs"), [("forward", False), ("double", False), ("double", True)]
)
def test_grasp_against_hvp_reference_and_sign(hvp, keep_graphs):
    model = mlp()
    data = batches(4, n=6)  # 24 samples, 8 per class
    per_class, temperature = 5, 200.0
    x, y = gradsift.pruning.class_balanced_sample(data, per_class, 3)
    f, w = flat_loss(model, NAMES, [(x, y)], temperature)
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
    expected = unflatten(-paper, model, NAMES)
    for n in NAMES:
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
    data = [(torch.randn(10, 12, dtype=torch.float64), torch.zeros(10, dtype=torch.long))]
    with pytest.raises(ValueError, match=r"classes \[1, 2\]"):
        gradsift.score(mlp(), "grasp", data, samples_per_class=2)


def test_grasp_agrees_with_reference_transcription():
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

"""GraSP against autograd's hvp, the authors' algorithm, and a direct measurement of
what its sign means."""

import copy
import warnings

import pytest
import torch
from torch import nn

import gradsift
from gradsift.lab.baselines import reference_grasp
from gradsift.lab.models import LeNet5
from pruning_support import (
    NAMES,
    BNNet,
    Encoder,
    batches,
    convnet,
    encoder_data,
    flat_loss,
    mlp,
    unflatten,
)


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


def test_grasp_reads_a_one_pass_generator_like_a_list():
    """Issue 15, case 4: the batch read to infer the class count is not lost."""
    model, data = mlp(), batches(4, n=6)
    listed = gradsift.score(model, "grasp", data, samples_per_class=2)
    once = gradsift.score(model, "grasp", (b for b in data), samples_per_class=2)
    for n in listed:
        torch.testing.assert_close(once[n], listed[n], rtol=0, atol=0)


def _endless_without_class_2(limit=100_000):
    for _ in range(limit):
        yield torch.randn(4, 12, dtype=torch.float64), torch.tensor([0, 0, 1, 1])
    raise AssertionError(f"the class search read {limit} batches without giving up")


def test_grasp_missing_class_on_an_endless_iterator_raises():
    """Issue 15, case 16: the search for a class that never comes is bounded."""
    with pytest.raises(ValueError, match=r"classes \[2\].*max_batches"):
        gradsift.score(mlp(), "grasp", _endless_without_class_2(), samples_per_class=1)


def test_grasp_double_backward_through_attention():
    """Issue 15, case 15: Hg through ``scaled_dot_product_attention`` (whose fused CPU
    kernel has no double backward) by the math backend; both Hg routes agree."""
    model, data = Encoder(), encoder_data(dtype=torch.float64)
    model.double()
    a = gradsift.score(model, "grasp", data, samples_per_class=2, hvp="double")
    b = gradsift.score(model, "grasp", data, samples_per_class=2, hvp="forward")
    assert "encoder.layers.0.self_attn.in_proj_weight" in a
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=1e-9, atol=1e-20)
        assert a[n].abs().sum() > 0, n


def _cosine(a: dict, b: dict) -> float:
    u = torch.cat([a[n].reshape(-1) for n in a])
    v = torch.cat([b[n].reshape(-1) for n in a])
    return float(u @ v / (u.norm() * v.norm()))


def _bn_cnn_sample(per_class):
    model = convnet().double()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3 * per_class, 1, 6, 6, generator=gen, dtype=torch.float64)
    y = torch.arange(3).repeat_interleave(per_class)
    return model, x, y


SPARSITIES = (0.5, 0.8, 0.9, 0.95)


@pytest.mark.parametrize(
    ("per_class", "options"),
    [
        (4, {}),  # the default: the two halves
        (4, {"chunk_size": 6}),  # chunks that are the halves: exact
        (4, {"chunk_size": 6, "keep_graphs": True}),
        (4, {"hvp": "forward"}),
        (5, {"batch_weighting": "batch"}),  # odd N: halves of 7 and 8, each mean alike
    ],
)
def test_default_grasp_is_the_two_halves_reference_on_a_batchnorm_cnn(per_class, options):
    """Issue 16: in float64 on Conv + train-mode BatchNorm + Linear, the default (and
    every setting declared exact) equals the GraSP repository's algorithm."""
    model, x, y = _bn_cnn_sample(per_class)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # none of these settings warns
        ours = gradsift.score(model, "grasp", [(x, y)], samples_per_class=per_class, **options)
    paper = reference_grasp(model, x, y)
    kept = {n: -paper[n] for n in paper}  # the reference removes its highest
    assert _cosine(ours, kept) > 0.999999
    for sparsity in SPARSITIES:
        a = gradsift.masks_from_scores(ours, sparsity)
        b = gradsift.masks_from_scores(kept, sparsity)
        assert all(torch.equal(a[n], b[n]) for n in a), sparsity


def test_grasp_chunking_that_changes_batchnorm_statistics_warns():
    model, x, y = _bn_cnn_sample(4)
    with pytest.warns(UserWarning, match=r"chunk_size=4 .* 3 chunks.* two halves of 6 and 6"):
        chunked = gradsift.score(model, "grasp", [(x, y)], samples_per_class=4, chunk_size=4)
    default = gradsift.score(model, "grasp", [(x, y)], samples_per_class=4)
    assert _cosine(chunked, default) < 0.999
    with warnings.catch_warnings():  # without BatchNorm any chunking is exact: no warning
        warnings.simplefilter("error", UserWarning)
        gradsift.score(mlp(), "grasp", batches(4, n=6), samples_per_class=2, chunk_size=4)


@pytest.mark.parametrize("batch_weighting", ["size", "batch"])
def test_grasp_batch_weighting_against_hand_computation(batch_weighting):
    """Issue 16: 15 samples in chunks of 6, 6 and 3: ``"size"`` takes g and Hg of the
    mean over the 15 samples, ``"batch"`` of the mean of the three chunk means."""
    model = mlp()
    data = batches(4, n=6)
    x, y = gradsift.pruning.class_balanced_sample(data, 5, 3)
    chunks = [(x[a:b], y[a:b]) for a, b in ((0, 6), (6, 12), (12, 15))]
    weights = [6 / 15, 6 / 15, 3 / 15] if batch_weighting == "size" else [1 / 3] * 3
    f, w = flat_loss(model, NAMES, chunks, 200.0, weights=weights)
    leaf = w.clone().requires_grad_()
    g = torch.autograd.grad(f(leaf), leaf)[0].detach()
    _, hg = torch.autograd.functional.hvp(f, w.detach(), g)
    expected = unflatten(w.detach() * hg, model, NAMES)
    got = gradsift.score(
        model,
        "grasp",
        data,
        samples_per_class=5,
        chunk_size=6,
        batch_weighting=batch_weighting,
    )
    for n in NAMES:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-9, atol=1e-18)
    with pytest.raises(ValueError, match="batch_weighting must be one of"):
        gradsift.score(model, "grasp", data, batch_weighting="sample")

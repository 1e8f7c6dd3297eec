"""SynFlow against its closed form and conservation law."""

import pytest
import torch
from torch import nn

import gradsift
from gradsift.lab.models import VGG
from gradsift.pruning.methods.synflow import synflow_rescorer
from gradsift.pruning.methods.synflow_l2 import synflow_l2_rescorer
from pruning_support import Tied, dict_data, mlp, token_data


def closed_form(model):
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
    r = closed_form(model)
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


@pytest.mark.parametrize(
    "method, rescorer", [("synflow", synflow_rescorer), ("synflow_l2", synflow_l2_rescorer)]
)
def test_rescorer_equals_scoring_the_masked_model(method, rescorer):
    model = mlp()
    rescore = rescorer(model, input_shape=(12,))
    first = rescore(None)
    masks = gradsift.masks_from_scores(first, 0.6)
    gradsift.apply_masks_(model, masks)
    again = rescore(masks)
    expected = gradsift.score(model, method, input_shape=(12,))
    for n in expected:
        torch.testing.assert_close(again[n], expected[n], rtol=1e-12, atol=0)
        assert (again[n][masks[n] == 0] == 0).all()


def test_synflow_says_that_embedding_inputs_are_not_supported():
    """Issue 15, case 15: the all-ones input is real-valued; a model whose input goes
    through ``nn.Embedding`` gets an error that says so, not an index-type error."""
    with pytest.raises(ValueError, match=r"synflow is data-free.*torch\.int64 tensor"):
        gradsift.score(Tied(), "synflow", token_data())
    shape = tuple(token_data()[0][0].shape[1:])
    with pytest.raises(ValueError, match=r"synflow.*nn\.Embedding 'embedding'.*token ids"):
        gradsift.score(Tied(), "synflow", input_shape=shape)


def test_synflow_needs_a_tensor_input_to_read_the_shape():
    with pytest.raises(TypeError, match="split_batch="):
        gradsift.score(mlp(), "synflow", dict_data())
    split = lambda b: ({k: v for k, v in b.items() if k != "labels"}, b["labels"])  # noqa: E731
    with pytest.raises(ValueError, match="pass input_shape="):
        gradsift.score(mlp(), "synflow", dict_data(), split_batch=split)


def autograd_reference(model, input_shape, power):
    """The paper's definition, step by step in float64 with autograd: a deep copy,
    weights |θ|^power, biases zero, eval mode; ``|θ| ⊙ ∂R/∂φ`` at ``φ = |θ|^power``."""
    import copy

    work = copy.deepcopy(model).double().eval()
    with torch.no_grad():
        for name, p in work.named_parameters():
            p.copy_(torch.zeros_like(p) if name.endswith("bias") else p.abs() ** power)
    ws = {n: p for n, p in work.named_parameters() if n.endswith("weight")}
    ones = torch.ones((1, *input_shape), dtype=torch.float64)
    grads = torch.autograd.grad(work(ones).sum(), list(ws.values()))
    return {n: g * (w if power == 1 else w.sqrt()) for (n, w), g in zip(ws.items(), grads)}


class Sequence(nn.Module):
    """Linear layers applied to every position of a (1, T, d) input: more than one row."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 7), nn.Linear(7, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("method, power", [("synflow", 1), ("synflow_l2", 2)])
@pytest.mark.parametrize("case", ["mlp", "sequence"])
def test_scores_equal_autograd_bit_for_bit(method, power, case):
    """The linear layers score themselves in backward (an outer product a block of rows
    at a time, or one matrix product for several rows): the same roundings as autograd."""
    torch.manual_seed(1)
    model, shape = (mlp(), (12,)) if case == "mlp" else (Sequence(), (5, 6))
    before = {n: p.clone() for n, p in model.state_dict().items()}
    scores = gradsift.score(model, method, input_shape=shape)
    expected = autograd_reference(model, shape, power)
    for n in expected:
        torch.testing.assert_close(scores[n], expected[n], rtol=0, atol=0, msg=n)
    for n, p in model.state_dict().items():  # the caller's weights were only read
        torch.testing.assert_close(p, before[n], rtol=0, atol=0)


@pytest.mark.parametrize("method, power", [("synflow", 1), ("synflow_l2", 2)])
@pytest.mark.parametrize("case", ["mlp", "sequence"])
def test_biases_of_plain_linear_layers_score_zero(method, power, case):
    """Biases carry no flow (zero in the linearised network), so a bias named in
    ``params=`` scores 0; its weight's score is the same as without it. A plain
    ``nn.Linear`` scores in its own backward, which must still pass the bias its
    gradient (it once returned none, and the bias "did not reach the output")."""
    torch.manual_seed(1)
    model, shape = (mlp(), (12,)) if case == "mlp" else (Sequence(), (5, 6))
    scores = gradsift.score(model, method, input_shape=shape, params=lambda n, m, t: True)
    expected = autograd_reference(model, shape, power)
    biases = [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert biases and set(scores) == set(expected) | set(biases)
    for n in expected:
        torch.testing.assert_close(scores[n], expected[n], rtol=0, atol=0, msg=n)
    for n in biases:
        assert scores[n].shape == model.get_parameter(n).shape and not scores[n].any()


def _normed(norm: str, tracked: bool):
    torch.manual_seed(0)
    layer = {"batch": nn.BatchNorm2d, "instance": nn.InstanceNorm2d}[norm]
    return nn.Sequential(
        nn.Conv2d(1, 4, 3), layer(4, affine=True, track_running_stats=tracked), nn.ReLU(),
        nn.Flatten(), nn.Linear(64, 3),
    )  # fmt: skip


@pytest.mark.parametrize("method", ["synflow", "synflow_l2"])
@pytest.mark.parametrize("norm", ["batch", "instance"])
def test_a_norm_without_running_statistics_scores_as_one_at_initialisation(method, norm):
    """Without running statistics a norm would normalise the all-ones input by its own
    statistics (variance 0): no flow, and scores of rounding noise of either sign. It
    scores as the same norm with fresh statistics (mean 0, variance 1), and the
    caller's norm keeps having none."""
    untracked, fresh = _normed(norm, False), _normed(norm, True)
    fresh.load_state_dict(untracked.state_dict(), strict=False)
    keys = list(untracked.state_dict())
    got = gradsift.score(untracked, method, input_shape=(1, 6, 6))
    want = gradsift.score(fresh, method, input_shape=(1, 6, 6))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
        assert (got[name] > 0).all()
    assert list(untracked.state_dict()) == keys and not untracked[1].track_running_stats


class Dangling(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        return self.used(x)


@pytest.mark.parametrize("method", ["synflow", "synflow_l2"])
def test_a_weight_that_does_not_reach_the_output_is_a_clear_error(method):
    with pytest.raises(ValueError, match=r"'unused.weight'\] do not reach the output"):
        gradsift.score(Dangling(), method, input_shape=(4,))


class CastsToFloat32(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x.float())))


@pytest.mark.parametrize("method", ["synflow", "synflow_l2"])
def test_a_model_casting_in_its_forward_is_told_to_pass_dtype(method):
    """The float64 linearised copy fails in such a forward: the error names dtype=,
    and with dtype=torch.float32 the scores equal the plain model's float32 ones."""
    model = CastsToFloat32()
    with pytest.raises(ValueError, match=r"in torch.float64 .*needs dtype= of that type"):
        gradsift.score(model, method, input_shape=(8,))
    plain = nn.Sequential(model.a, nn.ReLU(), model.b)
    got = gradsift.score(model, method, input_shape=(8,), dtype=torch.float32)
    want = gradsift.score(plain, method, input_shape=(8,), dtype=torch.float32)
    for name, key in (("a.weight", "0.weight"), ("b.weight", "2.weight")):
        torch.testing.assert_close(got[name], want[key], rtol=0, atol=0)


def test_the_linearised_network_is_freed_without_the_garbage_collector(monkeypatch):
    """Its float64 weights are the largest buffer of a SynFlow prune: nothing may hold
    them in a reference cycle once pruning returns (a cycle waits for ``gc``)."""
    import gc
    import weakref

    from gradsift.pruning.methods import _linearised

    seen = []
    init = _linearised.Linearised.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        seen.append(weakref.ref(self.phis[0]))

    monkeypatch.setattr(_linearised.Linearised, "__init__", recording)
    gc.collect()
    gc.disable()
    try:
        gradsift.prune_at_init(mlp(), "synflow", 0.5, iterations=3, input_shape=(12,))
        assert seen and all(ref() is None for ref in seen)
    finally:
        gc.enable()

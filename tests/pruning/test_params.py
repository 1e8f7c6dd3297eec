"""Which weights are scored, by name; copies of pruned models."""

import copy

import pytest
import torch

import gradsift
from gradsift.pruning.params import deepcopy_model, param_path, prunable
from pruning_support import batches, mlp


def test_default_selection_and_names():
    model = mlp()
    assert list(prunable(model)) == ["1.weight", "3.weight", "5.weight"]
    s = gradsift.score(model, "magnitude", params=lambda n, m, p: n.endswith("bias"))
    assert list(s) == ["1.bias", "3.bias", "5.bias"]
    assert list(gradsift.score(model, "magnitude", params=["3.weight"])) == ["3.weight"]
    with pytest.raises(ValueError, match="not found"):
        gradsift.score(model, "magnitude", params=["nope.weight"])
    with pytest.raises(ValueError, match="no parameters selected"):
        prunable(model, params=lambda n, m, p: False)


def test_pruned_names_stay_logical():
    model = mlp()
    gradsift.prune_at_init(model, "magnitude", 0.5)
    assert list(prunable(model)) == ["1.weight", "3.weight", "5.weight"]
    assert param_path(model, model[1], "weight") == "1.weight_orig"
    model(batches(1)[0][0]).sum().backward()  # leaves a non-leaf ``weight``
    twin = deepcopy_model(model)
    assert torch.equal(twin[1].weight_mask, model[1].weight_mask)


def test_a_copy_sharing_parameters_shares_the_weights_masks_and_masked_weights():
    """``share_parameters=True`` copies no weight-sized tensor of a pruned model, also
    after a forward pass (its masked weight is then a non-leaf tensor), and the copy's
    parameters are its own objects."""
    model = mlp()
    gradsift.prune_at_init(model, "magnitude", 0.5)
    model(torch.randn(2, 12, dtype=torch.float64))  # 1.weight is now orig * mask, non-leaf
    twin = deepcopy_model(model, share_parameters=True)
    for name in ("1", "3", "5"):
        ours, theirs = getattr(model, name), getattr(twin, name)
        for attr in ("weight_orig", "weight_mask", "weight"):
            assert getattr(theirs, attr).data_ptr() == getattr(ours, attr).data_ptr(), attr
        assert theirs.weight_orig is not ours.weight_orig
    assert not model[1].weight.is_leaf  # put back as it was


def test_scoring_keeps_model_identity():
    model = mlp()
    ref = copy.deepcopy(model)
    gradsift.score(model, "grasp", batches(4, n=6), samples_per_class=2)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)


class Conv1D(torch.nn.Module):
    """Hugging Face's ``transformers.pytorch_utils.Conv1D``, as it is written there:
    ``x @ weight + bias`` with ``weight`` shaped ``(in, out)``."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = torch.nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = torch.nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)


def test_default_selection_covers_hf_conv1d():
    torch.manual_seed(0)
    model = torch.nn.Sequential(Conv1D(16, 8), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    assert list(prunable(model)) == ["0.weight", "2.weight"]
    masks = gradsift.prune_at_init(model, "magnitude", 0.5)
    assert int(masks["0.weight"].sum()) + int(masks["2.weight"].sum()) == (128 + 48) // 2


def test_default_selection_warns_when_it_covers_less_than_half():
    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(100, 16)
            self.head = torch.nn.Linear(16, 3)

        def forward(self, ids):
            return self.head(self.emb(ids).mean(1))

    with pytest.warns(UserWarning, match=r"covers 48 of the model's 1651 .*params="):
        prunable(Tagger())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prunable(Tagger(), params=["emb.weight", "head.weight"])  # chosen: no warning
        prunable(mlp())


class Decoder(torch.nn.Module):
    """A transposed convolution between two convolutions (a U-Net's up-sampling)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.down = torch.nn.Conv2d(1, 4, 3, stride=2, padding=1)
        self.up = torch.nn.ConvTranspose2d(4, 4, 4, stride=2, padding=1)
        self.head = torch.nn.Conv2d(4, 3, 3, padding=1)

    def forward(self, x):
        h = torch.relu(self.up(torch.relu(self.down(x))))
        return self.head(h).mean((2, 3))


@pytest.mark.parametrize("method", gradsift.list_methods())
def test_default_selection_covers_transposed_convolutions(method):
    # "Conv*" as the README says: ConvTranspose weights too, by every method
    model = Decoder()
    assert list(prunable(model)) == ["down.weight", "up.weight", "head.weight"]
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(30, 1, 8, 8, generator=gen), torch.arange(30) % 3) for _ in range(2)]
    options = gradsift.pruning.supported_options(method, samples_per_class=10, num_classes=3)
    masks = gradsift.prune_at_init(model, method, 0.8, data, **options)
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.8 * total)
    assert masks["up.weight"].shape == model.up.weight.shape


@pytest.mark.filterwarnings("ignore:.*weight_norm.*is deprecated:FutureWarning")
@pytest.mark.parametrize("how", ["spectral_norm", "parametrize", "weight_norm"])
@pytest.mark.parametrize("method", ["magnitude", "snip", "synflow"])
def test_a_reparametrized_weight_is_left_dense_with_a_warning(how, method):
    """spectral_norm stores its Linear's weight as ``weight_orig`` without a mask: not
    a pruned weight (torch's ``prune.is_pruned`` says so too). A weight computed from
    other tensors is no parameter torch.nn.utils.prune can mask: warned, left out,
    and every other weight pruned with exact counts."""
    model = mlp()
    layer = model[3]
    if how == "spectral_norm":
        torch.nn.utils.spectral_norm(layer)
    elif how == "weight_norm":
        torch.nn.utils.weight_norm(layer)  # the old form: weight_g and weight_v
    else:
        torch.nn.utils.parametrize.register_parametrization(layer, "weight", torch.nn.Identity())
    before = {n: t.clone() for n, t in layer.named_parameters()}
    with pytest.warns(UserWarning, match=r"weights of \['3'\] are computed from other tensors"):
        masks = gradsift.prune_at_init(model, method, 0.5, batches(1))
    assert list(masks) == ["1.weight", "5.weight"]
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.5 * total)
    assert not torch.nn.utils.prune.is_pruned(layer)
    for n, t in layer.named_parameters():
        assert torch.equal(t, before[n]), n

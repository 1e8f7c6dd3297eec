"""Boolean mask buffers installed through ``torch.nn.utils.prune``: the same pruned
model as torch's own float masks (forward, gradients, ``prune.remove``, pruning again
with torch's methods, state dicts), at a byte per weight."""

import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import gradsift
from gradsift.pruning.boolean_mask import BooleanMask, install_, masked
from gradsift.pruning.params import deepcopy_model


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def _masks(model, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return {
        n: torch.rand(p.shape, generator=gen) > 0.5
        for n, p in model.named_parameters()
        if n.endswith("weight")
    }


def _torch_pruned(masks):
    """The reference: the same model pruned by torch's ``custom_from_mask``."""
    ref = _model()
    for name, mask in masks.items():
        module = ref.get_submodule(name.rsplit(".", 1)[0])
        prune.custom_from_mask(module, "weight", mask.float())
    return ref


def test_forward_and_gradients_equal_torchs_float_masks():
    model = _model()
    masks = _masks(model)
    gradsift.apply_masks_(model, masks)
    ref = _torch_pruned(masks)
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(2))
    out, expected = model(x), ref(x)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    out.square().sum().backward()
    expected.square().sum().backward()
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    for name, mask in masks.items():  # no gradient reaches a pruned weight
        grad = model.get_submodule(name.rsplit(".", 1)[0]).weight_orig.grad
        assert not grad[~mask].any()


def test_the_buffers_are_boolean_copies_of_the_given_masks():
    model = _model()
    masks = _masks(model)
    given = {n: m.float() for n, m in masks.items()}  # 0/1 floats are accepted too
    gradsift.apply_masks_(model, given)
    for name, mask in masks.items():
        module = model.get_submodule(name.rsplit(".", 1)[0])
        assert module.weight_mask.dtype == torch.bool
        assert module.weight_mask.element_size() == 1
        torch.testing.assert_close(module.weight_mask, mask, rtol=0, atol=0)
        assert isinstance(next(iter(module._forward_pre_hooks.values())), BooleanMask)
    assert all(b.dtype == torch.bool for n, b in model.named_buffers())
    again = _model()
    gradsift.apply_masks_(again, masks)
    for m in masks.values():  # the caller's tensors are not the model's
        m.fill_(False)
    assert int(again[0].weight_mask.sum()) == int(model[0].weight_mask.sum()) > 0


def test_torch_prune_functions_keep_working():
    model = _model()
    masks = _masks(model)
    gradsift.apply_masks_(model, masks)
    assert prune.is_pruned(model)
    # pruning again with torch's own method combines into the boolean mask
    before = model[0].weight_mask.clone()
    prune.l1_unstructured(model[0], "weight", amount=3)
    after = model[0].weight_mask
    assert not after[~before].any()  # pruned stays pruned
    assert int(after.sum()) == int(before.sum()) - 3
    x = torch.randn(2, 6)
    torch.testing.assert_close(
        model[0](x),
        nn.functional.linear(x, model[0].weight_orig * after.float(), model[0].bias),
        rtol=0,
        atol=0,
    )
    # remove makes the masked weight permanent
    prune.remove(model[2], "weight")
    assert isinstance(model[2].weight, nn.Parameter)
    assert not hasattr(model[2], "weight_mask") and not hasattr(model[2], "weight_orig")
    assert not model[2].weight[~masks["2.weight"]].any()


def test_state_dicts_load_between_boolean_and_float_masks():
    model = _model()
    masks = _masks(model)
    ref = _torch_pruned(masks)  # float masks, as torch installs them
    model = _model()
    gradsift.apply_masks_(model, {n: torch.ones_like(m) for n, m in masks.items()})
    model.load_state_dict(ref.state_dict())
    for name, mask in masks.items():
        module = model.get_submodule(name.rsplit(".", 1)[0])
        assert module.weight_mask.dtype == torch.bool
        torch.testing.assert_close(module.weight_mask, mask, rtol=0, atol=0)
    ref.load_state_dict(model.state_dict())  # and back into float buffers
    torch.testing.assert_close(ref[0].weight_mask, masks["0.weight"].float(), rtol=0, atol=0)


def test_a_pruned_model_copies_pickles_and_saves():
    model = _model()
    gradsift.apply_masks_(model, _masks(model))
    x = torch.randn(3, 6)
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        torch.testing.assert_close(twin(x), model(x), rtol=0, atol=0)
        assert twin[0].weight_mask.dtype == torch.bool
    model(x)  # the masked weights now carry autograd history
    twin = deepcopy_model(model)
    torch.testing.assert_close(twin(x), model(x), rtol=0, atol=0)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    assert torch.load(buf)["0.weight_mask"].dtype == torch.bool


def test_masked_matches_the_product():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    m = torch.rand(7, 4, generator=gen) > 0.3
    torch.testing.assert_close(masked(w, m), w * m.double(), rtol=0, atol=0)
    torch.testing.assert_close(masked(w, m.double()), w * m.double(), rtol=0, atol=0)
    assert masked(w.bfloat16(), m).dtype == torch.bfloat16


def test_install_refuses_a_wrong_mask():
    layer = nn.Linear(3, 2)
    with pytest.raises(TypeError, match="torch.bool"):
        install_(layer, "weight", torch.ones(2, 3))
    with pytest.raises(ValueError, match="shape"):
        install_(layer, "weight", torch.ones(3, 2, dtype=torch.bool))
    assert not prune.is_pruned(layer)

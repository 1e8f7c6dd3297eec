"""Properties every registered criterion must have, run for each of ``list_methods()``
(so a newly added method is tested without editing this file)."""

import copy
import io
import types

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import gradsift
from gradsift import prune_at_init
from pruning_support import BNNet, assert_same, batches, convnet, convnet_data, mlp, snapshot

METHODS = gradsift.list_methods()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("train_mode", [True, False])
def test_scoring_leaves_model_untouched(method, train_mode):
    torch.manual_seed(0)
    model = BNNet().train(train_mode)
    model.fc.weight.grad = torch.full_like(model.fc.weight, 3.0)
    data = batches(3, n=30, shape=(1, 4, 4), dtype=torch.float32)
    before = snapshot(model)
    scores = gradsift.score(model, method, data)
    assert_same(before, snapshot(model))
    assert list(scores) == ["conv.weight", "frozen.weight", "fc.weight"]
    for name, s in scores.items():
        assert s.shape == model.get_parameter(name).shape
        assert s.dtype.is_floating_point and not s.requires_grad


@pytest.mark.parametrize("method", METHODS)
def test_prune_at_init_installs_through_torch_prune(method):
    model = convnet()
    masks = prune_at_init(model, method, 0.8, convnet_data())
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.8 * total)
    assert prune.is_pruned(model)
    for name, mask in masks.items():
        module = model.get_submodule(name.rsplit(".", 1)[0])
        assert torch.equal(module.weight_mask, mask)
        torch.testing.assert_close(module.weight, module.weight_orig * module.weight_mask)
    copy.deepcopy(model)  # right after pruning, plain deepcopy works
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(loaded[0].weight_mask, model[0].weight_mask)
    x = convnet_data()[0][0]
    model(x).sum().backward()
    assert (model[4].weight_orig.grad[masks["4.weight"] == 0] == 0).all()
    # after a forward, torch's pruned ``weight`` is a non-leaf; our copy handles it
    twin = gradsift.pruning.params.deepcopy_model(model)
    assert torch.equal(twin[4].weight_mask, model[4].weight_mask)
    fresh = convnet()
    prune_at_init(fresh, "random", 0.8)
    fresh.load_state_dict(model.state_dict())
    fresh.eval(), model.eval()
    assert torch.equal(fresh(x), model(x))  # the pre-hook rebuilds weight from the state
    for module in (model[0], model[4], model[6]):
        prune.remove(module, "weight")
    assert not prune.is_pruned(model)
    assert int((model[4].weight == 0).sum()) >= int((masks["4.weight"] == 0).sum())


@pytest.mark.parametrize("method", METHODS)
def test_iterative_pruning_is_exact_for_every_method(method):
    model = convnet()
    masks = prune_at_init(model, method, 0.9, convnet_data(), iterations=3)
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.9 * total)


def _tripled(self, x):
    return nn.functional.linear(x, self.weight, self.bias) * 3.0


class Tripled(nn.Linear):
    forward = _tripled


@pytest.mark.parametrize("method", METHODS)
def test_a_forward_set_on_a_linear_instance_is_the_one_scored(method):
    """A ``forward`` set on an ``nn.Linear`` instance (as accelerate's hooks do) is the
    layer's map: the scores equal those of the same network built from a ``Linear``
    subclass with that forward. SNIP and SynFlow swap their own forward into plain
    ``Linear`` layers, and once did so over the instance's, scoring another network."""
    hooked, subclassed = mlp(), mlp()
    for i in (1, 3, 5):
        hooked[i].forward = types.MethodType(_tripled, hooked[i])
        tripled = Tripled(subclassed[i].in_features, subclassed[i].out_features)
        subclassed[i] = tripled.to(torch.float64)
    subclassed.load_state_dict(hooked.state_dict())
    data = batches(7)  # GraSP's class-balanced sample: 25 of each class
    got, want = [], []
    for model, out in ((hooked, got), (subclassed, want)):
        torch.manual_seed(0)
        out.append(gradsift.score(model, method, data))
    for name in want[0]:
        torch.testing.assert_close(got[0][name], want[0][name], rtol=0, atol=0, msg=name)

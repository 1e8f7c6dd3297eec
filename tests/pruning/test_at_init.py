"""prune_at_init: rounds, schedules, monotone masks, shuffling; transformers, already
pruned models, generators and tied weights (issue 15)."""

import pytest
import torch
from torch.nn.utils import prune

import gradsift
from gradsift import masks_from_scores, prune_at_init, shuffle_masks, sparsity_report
from gradsift.pruning import ALLOCATIONS, layer_counts
from gradsift.pruning.params import deepcopy_model, original, prunable
from pruning_support import Encoder, Tied, convnet, convnet_data, encoder_data, token_data


def test_iterative_synflow_exact_and_monotone():
    model = convnet()
    seen = []
    real = gradsift.pruning.at_init.select

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append({k: v.clone() for k, v in out.items()})
        return out

    gradsift.pruning.at_init.select = spy
    try:
        masks = prune_at_init(model, "synflow", 0.95, convnet_data(), iterations=10)
    finally:
        gradsift.pruning.at_init.select = real
    assert len(seen) == 10
    for before, after in zip(seen, seen[1:]):
        for k in before:
            assert (after[k] <= before[k]).all()
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.95 * total)
    assert not sparsity_report(model).collapsed


def test_shuffle_keeps_layer_density():
    model = convnet()
    masks = prune_at_init(
        model, "magnitude", 0.9, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    plain = masks_from_scores(gradsift.score(convnet(), "magnitude"), 0.9)
    for k in masks:
        assert int(masks[k].sum()) == int(plain[k].sum())
        assert torch.equal(model.get_buffer(k + "_mask"), masks[k])
    assert any(not torch.equal(masks[k], plain[k]) for k in masks)
    again = shuffle_masks(plain, generator=torch.Generator().manual_seed(3))
    assert all(int(again[k].sum()) == int(plain[k].sum()) for k in plain)


def _exact(masks, sparsity):
    total = sum(m.numel() for m in masks.values())
    return sum(int(m.sum()) for m in masks.values()) == total - round(sparsity * total)


@pytest.mark.parametrize("method", ["magnitude", "random", "snip", "grasp", "synflow"])
def test_pruned_transformer_encoder_trains_every_selected_weight(method):
    """Issue 15, case 1: ``nn.MultiheadAttention`` reads ``out_proj.weight`` without
    calling ``out_proj``, so the pruning pre-hook alone would leave it frozen."""
    model, data = Encoder(), encoder_data()
    options = {"samples_per_class": 2} if method == "grasp" else {}
    masks = prune_at_init(model, method, 0.5, data, **options)
    targets = prunable(model)
    assert list(masks) == list(targets)
    assert "encoder.layers.0.self_attn.in_proj_weight" in masks
    assert "encoder.layers.1.self_attn.out_proj.weight" in masks
    assert _exact(masks, 0.5)
    before = {n: original(m, a).detach().clone() for n, (m, a) in targets.items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data * 2:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for n, (m, a) in targets.items():
            grad = original(m, a).grad
            assert grad is not None, n
            assert grad[masks[n] == 1].abs().sum() > 0, n
            assert (grad[masks[n] == 0] == 0).all(), n
        opt.step()
    for n, (m, a) in targets.items():
        kept = masks[n] == 1
        assert not torch.equal(original(m, a)[kept], before[n][kept]), n
        assert torch.equal(original(m, a)[~kept], before[n][~kept]), n
    # the forward uses the current masked weights, also on the eval-mode fast paths
    permanent = deepcopy_model(model)
    for m, a in prunable(permanent).values():
        prune.remove(m, a)
    model.eval(), permanent.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(data[0][0]), permanent(data[0][0]))


@pytest.mark.parametrize("method", ["magnitude", "random", "snip", "grasp", "synflow"])
def test_repruning_a_pruned_model_installs_the_returned_exact_masks(method):
    """Issue 15, case 2: masks already installed with ``torch.nn.utils.prune`` count
    toward the target, and GraSP's zero scores of pruned weights do not outrank live
    weights with negative scores."""
    model = convnet()
    torch.manual_seed(1)
    prune.random_unstructured(model[4], "weight", amount=0.5)
    earlier = model[4].weight_mask.clone()
    options = {"samples_per_class": 5} if method == "grasp" else {}
    masks = prune_at_init(model, method, 0.6, convnet_data(), **options)
    for name, mask in masks.items():
        assert torch.equal(model.get_buffer(name + "_mask"), mask), name
    assert _exact(masks, 0.6)
    assert (masks["4.weight"] <= earlier).all()


def test_repruning_below_the_existing_sparsity_keeps_the_masks_and_warns():
    model = convnet()
    gradsift.prune_at_init(model, "magnitude", 0.8)
    earlier = {n: model.get_buffer(n + "_mask").clone() for n in prunable(model)}
    with pytest.warns(UserWarning, match="already has 80.0% of the selected weights pruned"):
        masks = prune_at_init(model, "random", 0.5)
    for n, mask in masks.items():
        assert torch.equal(mask, earlier[n]) and torch.equal(model.get_buffer(n + "_mask"), mask)


@pytest.mark.parametrize("method", ["snip", "grasp"])
def test_iterative_pruning_reads_a_one_pass_generator(method):
    """Issue 15, case 4: every round sees the batches the first round read."""
    options = {"samples_per_class": 5} if method == "grasp" else {}
    listed = prune_at_init(convnet(), method, 0.9, convnet_data(), iterations=3, **options)
    once = (b for b in convnet_data())
    got = prune_at_init(convnet(), method, 0.9, once, iterations=3, **options)
    for n in listed:
        assert torch.equal(got[n], listed[n]), n


@pytest.mark.parametrize("method", ["magnitude", "snip", "grasp"])
def test_pruning_keeps_tied_weights_tied(method):
    """Issue 15, case 5: ``decoder.weight = embedding.weight`` stays one tensor, masked
    for every module that uses it, and a weight shared by two layers counts once."""
    model, data = Tied(), token_data()
    options = {"samples_per_class": 2} if method == "grasp" else {}
    masks = prune_at_init(model, method, 0.5, data, **options)
    assert list(masks) == ["a.weight", "decoder.weight"]
    assert sum(m.numel() for m in masks.values()) == 6 * 6 + 10 * 6
    assert _exact(masks, 0.5)
    # the holders of a tied weight share one mask buffer, as they share the weight
    assert model.embedding.weight_mask is model.decoder.weight_mask
    assert model.a.weight_mask is model.b.weight_mask
    assert {"embedding.weight_mask", "decoder.weight_mask"} <= set(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in data:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        model(x)
        assert model.embedding.weight_orig is model.decoder.weight_orig
        assert torch.equal(model.embedding.weight, model.decoder.weight)
        assert torch.equal(model.a.weight, model.b.weight)
        assert (model.embedding.weight[masks["decoder.weight"] == 0] == 0).all()
    twin = deepcopy_model(model)
    twin(data[0][0])
    assert torch.equal(twin.embedding.weight, twin.decoder.weight)
    assert twin.embedding.weight_mask is twin.decoder.weight_mask
    # pruning again ANDs into the shared buffer once per holder: idempotent for 0/1
    again = {n: m.clone() for n, m in masks.items()}
    again["a.weight"].view(-1)[:3] = 0
    expected = again["a.weight"].clone()
    gradsift.apply_masks_(model, again)
    assert torch.equal(model.b.weight_mask, expected)
    assert torch.equal(model.a.weight, model.a.weight_orig * expected)


@pytest.mark.parametrize("method", ["iter_snip", "force"])
@pytest.mark.parametrize("spread", [{"allocation": "uniform"}, {"allocation": "erk"},
                                    {"min_per_layer": 40}])  # fmt: skip
def test_own_rounds_spread_the_weights_as_the_call_does(method, spread):
    # Iterative SNIP and FORCE prune in rounds of their own: each round keeps its
    # weights under the call's allocation and floor, so that the final selection
    # never has to take back a weight Iterative SNIP's rounds pruned (they ranked
    # globally, and a layer-wise allocation then revived some)
    model = convnet()
    scores = gradsift.score(model, method, convnet_data(), sparsity=0.9, steps=5, **spread)
    masks = prune_at_init(model, method, 0.9, convnet_data(), steps=5, **spread)
    assert _exact(masks, 0.9)
    expected = masks_from_scores(scores, 0.9, **spread)
    for n in masks:
        assert torch.equal(masks[n], expected[n]), n
        if method == "iter_snip":  # pruning is permanent
            assert not (masks[n] & (scores[n] < 0)).any(), n


@pytest.mark.parametrize("budget", ALLOCATIONS)
@pytest.mark.parametrize("method", gradsift.list_methods())
def test_every_method_is_exact_under_every_budget(method, budget):
    model = convnet()
    masks = prune_at_init(model, method, 0.85, convnet_data(), allocation=budget)
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.85 * total)
    if budget != "global":
        shapes = {n: m.shape for n, m in masks.items()}
        assert {n: int(m.sum()) for n, m in masks.items()} == layer_counts(shapes, 0.85, budget)
    report = sparsity_report(model)
    assert report.kept == total - round(0.85 * total)


def test_iterative_rounds_under_erk_end_on_erk_counts():
    model = convnet()
    masks = prune_at_init(model, "synflow", 0.95, convnet_data(), iterations=4, allocation="erk")
    shapes = {n: m.shape for n, m in masks.items()}
    assert {n: int(m.sum()) for n, m in masks.items()} == layer_counts(shapes, 0.95, "erk")


def test_bad_budget_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"allocation must be one of \['global', 'uniform', 'er'"):
        prune_at_init(convnet(), "magnitude", 0.5, allocation="ERK")


def test_sparsity_zero_is_a_no_op_scored_once(monkeypatch):
    import gradsift.pruning.at_init as at_init

    calls = []
    real = at_init.run_criterion
    monkeypatch.setattr(
        at_init, "run_criterion", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    x = torch.randn(4, 6)
    before = model(x)
    masks = prune_at_init(model, "magnitude", sparsity=0.0, iterations=100)
    assert all(bool(m.all()) for m in masks.values()) and prune.is_pruned(model)
    assert torch.equal(model(x), before)
    assert len(calls) == 1  # one round, not 100 rounds of keeping everything

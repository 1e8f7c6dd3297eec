"""Masks: exact counts, ties, signed scores, monotonicity, guards, torch.prune install."""

import copy
import io

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import prune

import gradsift
from gradsift import masks_from_scores, prune_at_init, shuffle_masks, sparsity_report
from gradsift.pruning.at_init import round_sparsities


def reference_masks(scores, sparsity):
    """Brute force: stable sort of the concatenation, descending; lowest index wins ties."""
    flat = torch.cat([s.reshape(-1).double() for s in scores.values()])
    keep = flat.numel() - round(sparsity * flat.numel())
    order = torch.sort(-flat, stable=True).indices[:keep]
    mask = torch.zeros_like(flat)
    mask[order] = 1
    out, offset = {}, 0
    for name, s in scores.items():
        out[name] = mask[offset : offset + s.numel()].view_as(s)
        offset += s.numel()
    return out


score_values = st.sampled_from(["normal", "ties", "negative", "zeros"])


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=5),
    sparsity=st.floats(0.0, 0.999),
    kind=score_values,
    seed=st.integers(0, 2**31 - 1),
)
def test_global_masks_match_reference(sizes, sparsity, kind, seed):
    gen = torch.Generator().manual_seed(seed)
    scores = {}
    for i, n in enumerate(sizes):
        if kind == "normal":
            s = torch.randn(n, generator=gen)
        elif kind == "ties":
            s = torch.randint(0, 3, (n,), generator=gen).float()
        elif kind == "negative":
            s = -torch.rand(n, generator=gen) * 1e-3  # GraSP-like signed, all negative
        else:
            s = torch.zeros(n)
        scores[f"l{i}.weight"] = s
    masks = masks_from_scores(scores, sparsity)
    expected = reference_masks(scores, sparsity)
    total = sum(sizes)
    assert sum(int(m.sum()) for m in masks.values()) == total - round(sparsity * total)
    for name in scores:
        torch.testing.assert_close(masks[name].double(), expected[name], rtol=0, atol=0)


def test_signed_scores_are_not_ranked_by_magnitude():
    scores = {"w": torch.tensor([-5.0, 1.0, 0.5, -0.1])}
    mask = masks_from_scores(scores, 0.5)["w"]
    assert mask.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_layer_scope_is_exact_per_layer():
    gen = torch.Generator().manual_seed(0)
    scores = {"a": torch.randn(10, 10, generator=gen), "b": torch.randn(7, generator=gen)}
    masks = masks_from_scores(scores, 0.7, scope="layer")
    assert int(masks["a"].sum()) == 100 - 70
    assert int(masks["b"].sum()) == 7 - round(0.7 * 7)


def test_previous_masks_are_monotone():
    gen = torch.Generator().manual_seed(1)
    first = {"a": torch.randn(50, generator=gen), "b": torch.randn(30, generator=gen)}
    m1 = masks_from_scores(first, 0.5)
    # new scores that favour exactly the pruned weights: they must stay pruned
    second = {k: 1.0 - m + 0.01 * torch.rand(m.shape, generator=gen) for k, m in m1.items()}
    m2 = masks_from_scores(second, 0.75, previous=m1)
    for k in m1:
        assert (m2[k] <= m1[k]).all()
    assert sum(int(m.sum()) for m in m2.values()) == 80 - 60


def test_min_per_layer_guard_keeps_every_layer_alive():
    scores = {"big": torch.arange(1000.0), "small": -torch.ones(10)}
    masks = masks_from_scores(scores, 0.99)
    assert masks["small"].sum() == 0  # collapse without the guard
    guarded = masks_from_scores(scores, 0.99, min_per_layer=2)
    assert int(guarded["small"].sum()) == 2
    assert sum(int(m.sum()) for m in guarded.values()) == 1010 - round(0.99 * 1010)
    with pytest.raises(ValueError, match="min_per_layer"):
        masks_from_scores(scores, 0.999, min_per_layer=5)


@pytest.mark.parametrize("sparsity", [-0.1, 1.0, 1.5])
def test_bad_sparsity(sparsity):
    with pytest.raises(ValueError, match=r"sparsity must be in \[0, 1\)"):
        masks_from_scores({"w": torch.ones(3)}, sparsity)


def test_nan_scores_raise():
    with pytest.raises(ValueError, match="contains NaN"):
        masks_from_scores({"w": torch.tensor([1.0, float("nan")])}, 0.5)


def net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 16),
        nn.ReLU(),
        nn.Linear(16, 3),
    )


def data():
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(12, 1, 6, 6, generator=gen), torch.arange(12) % 3) for _ in range(3)]


@pytest.mark.parametrize("method", ["random", "magnitude", "snip", "grasp", "synflow"])
def test_prune_at_init_installs_through_torch_prune(method, tmp_path):
    model = net()
    options = {"samples_per_class": 4} if method == "grasp" else {}
    masks = prune_at_init(model, method, 0.8, data(), **options)
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
    model(data()[0][0]).sum().backward()
    assert (model[4].weight_orig.grad[masks["4.weight"] == 0] == 0).all()
    # after a forward, torch's pruned ``weight`` is a non-leaf; our copy handles it
    twin = gradsift.pruning.scores.deepcopy_model(model)
    assert torch.equal(twin[4].weight_mask, model[4].weight_mask)
    fresh = net()
    prune_at_init(fresh, "random", 0.8)
    fresh.load_state_dict(model.state_dict())
    fresh.eval(), model.eval()
    x = data()[0][0]
    assert torch.equal(fresh(x), model(x))  # the pre-hook rebuilds weight from the state
    assert torch.equal(fresh[4].weight, model[4].weight)
    for module in (model[0], model[4], model[6]):
        prune.remove(module, "weight")
    assert not prune.is_pruned(model)
    assert int((model[4].weight == 0).sum()) >= int((masks["4.weight"] == 0).sum())


def test_iterative_synflow_exact_and_monotone():
    model = net()
    seen = []
    real = gradsift.pruning.at_init.masks_from_scores

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append({k: v.clone() for k, v in out.items()})
        return out

    gradsift.pruning.at_init.masks_from_scores = spy
    try:
        masks = prune_at_init(model, "synflow", 0.95, data(), iterations=10)
    finally:
        gradsift.pruning.at_init.masks_from_scores = real
    assert len(seen) == 10
    for before, after in zip(seen, seen[1:]):
        for k in before:
            assert (after[k] <= before[k]).all()
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.95 * total)
    assert not sparsity_report(model).collapsed


def test_round_sparsities():
    s = round_sparsities(0.99, 4, "exponential")
    torch.testing.assert_close(
        torch.tensor(s, dtype=torch.float64),
        1 - torch.tensor([0.01 ** (i / 4) for i in range(1, 5)], dtype=torch.float64),
    )
    assert round_sparsities(0.5, 2, "linear") == [0.25, 0.5]
    with pytest.raises(ValueError, match="schedule"):
        round_sparsities(0.5, 2, "cosine")
    with pytest.raises(ValueError, match="iterations"):
        round_sparsities(0.5, 0, "linear")


def test_shuffle_keeps_layer_density():
    model = net()
    masks = prune_at_init(
        model, "magnitude", 0.9, shuffle=True, generator=torch.Generator().manual_seed(3)
    )
    plain = masks_from_scores(gradsift.score(net(), "magnitude"), 0.9)
    for k in masks:
        assert int(masks[k].sum()) == int(plain[k].sum())
        assert torch.equal(model.get_buffer(k + "_mask"), masks[k])
    assert any(not torch.equal(masks[k], plain[k]) for k in masks)
    again = shuffle_masks(plain, generator=torch.Generator().manual_seed(3))
    assert all(int(again[k].sum()) == int(plain[k].sum()) for k in plain)


def test_sparsity_report():
    model = net()
    report = sparsity_report(model)
    assert report.density == 1.0 and not report.collapsed
    masks = {
        "0.weight": torch.zeros(4, 1, 3, 3),
        "4.weight": torch.ones(16, 144),
        "6.weight": torch.ones(3, 16),
    }
    gradsift.apply_masks_(model, masks)
    report = sparsity_report(model)
    assert report.collapsed == ["0.weight"]
    assert report.kept == 16 * 144 + 48
    assert "COLLAPSED" in str(report)
    assert report.to_dict()["layers"][0]["density"] == 0.0

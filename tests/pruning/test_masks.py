"""Masks: exact counts, ties, signed scores, monotonicity, guards."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gradsift import masks_from_scores


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


def test_uniform_allocation_is_exact_per_layer():
    gen = torch.Generator().manual_seed(0)
    scores = {"a": torch.randn(10, 10, generator=gen), "b": torch.randn(7, generator=gen)}
    masks = masks_from_scores(scores, 0.7, allocation="uniform")
    assert int(masks["a"].sum()) == 100 - 70
    assert int(masks["b"].sum()) == 7 - round(0.7 * 7)


def test_previous_masks_are_monotone():
    gen = torch.Generator().manual_seed(1)
    first = {"a": torch.randn(50, generator=gen), "b": torch.randn(30, generator=gen)}
    m1 = masks_from_scores(first, 0.5)
    # new scores that favour exactly the pruned weights: they must stay pruned
    second = {k: (~m).float() + 0.01 * torch.rand(m.shape, generator=gen) for k, m in m1.items()}
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


def test_guard_keeps_resnet20_shortcuts_alive_under_synflow():
    """Synaptic-Flow#7: SynFlow at high compression prunes ResNet 1x1 projection
    shortcuts away entirely; ``min_per_layer=1`` keeps each alive, total exact."""
    from gradsift import prune_at_init
    from gradsift.lab.models import build_model
    from gradsift.lab.studies.collapse import shortcuts

    shape, sparsity = (3, 8, 8), 1 - 1e-4
    torch.manual_seed(0)
    model = build_model("resnet20", input_shape=shape, num_classes=10)
    twin = build_model("resnet20", input_shape=shape, num_classes=10)
    twin.load_state_dict(model.state_dict())
    plain = prune_at_init(model, "synflow", sparsity, input_shape=shape, iterations=3)
    guarded = prune_at_init(
        twin, "synflow", sparsity, input_shape=shape, iterations=3, min_per_layer=1
    )
    names = shortcuts(plain)
    assert names == ["layers.3.shortcut.0.weight", "layers.6.shortcut.0.weight"]
    assert all(int(plain[n].sum()) == 0 for n in names)  # the reported failure
    assert all(int(guarded[n].sum()) >= 1 for n in names)
    assert all(int(m.sum()) >= 1 for m in guarded.values())
    total = sum(m.numel() for m in plain.values())
    for masks in (plain, guarded):
        assert sum(int(m.sum()) for m in masks.values()) == total - round(sparsity * total)

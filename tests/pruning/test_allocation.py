"""Layer-wise budgets: densities against hand computations and RigL's loop, exact
counts against a rational largest-remainder reference, the masks they give."""

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings, strategies as st

import gradsift
from gradsift import masks_from_scores
from gradsift.pruning import ALLOCATIONS, layer_counts, layer_densities
from gradsift.pruning.allocation import raw_er

# a small net: Linear 10->20, Conv 2->4 (3x3), Linear 20->2; N = 200 + 72 + 40 = 312
SHAPES = {"fc1.weight": (20, 10), "conv.weight": (4, 2, 3, 3), "fc2.weight": (2, 20)}
# ERK raw densities sum(shape)/prod(shape): 30/200, 12/72, 22/40; ER (in+out)/(in*out)
# on channels: 30/200, 6/8, 22/40


def test_raw_densities_by_hand():
    assert [raw_er(s, kernel=True) for s in SHAPES.values()] == [30 / 200, 12 / 72, 22 / 40]
    assert [raw_er(s, kernel=False) for s in SHAPES.values()] == [30 / 200, 6 / 8, 22 / 40]


def test_erk_without_saturation_by_hand():
    # s = 0.75: K = 312 - round(234) = 78; eps = 78 / (30 + 12 + 22) = 78/64, every
    # eps * p_l < 1
    d = layer_densities(SHAPES, 0.75, "erk")
    eps = 78 / 64
    expected = {"fc1.weight": eps * 0.15, "conv.weight": eps / 6, "fc2.weight": eps * 0.55}
    for name in SHAPES:
        assert d[name] == pytest.approx(expected[name], rel=1e-12)
    # quotas 36.5625, 14.625, 26.8125: floors 36 + 14 + 26 = 76, the 2 left go to the
    # largest remainders (.8125 fc2, .625 conv)
    assert layer_counts(SHAPES, 0.75, "erk") == {
        "fc1.weight": 36,
        "conv.weight": 15,
        "fc2.weight": 27,
    }


def test_erk_saturated_layer_is_dense_and_its_surplus_redistributed():
    # s = 0.5: K = 156; eps = 156/64 makes fc2 0.55 * 2.4375 = 1.34 > 1: dense (40);
    # then eps = (156 - 40) / (30 + 12) = 116/42 over fc1 and conv
    d = layer_densities(SHAPES, 0.5, "erk")
    eps = 116 / 42
    assert d["fc2.weight"] == 1.0
    assert d["fc1.weight"] == pytest.approx(0.15 * eps, rel=1e-12)
    assert d["conv.weight"] == pytest.approx(eps / 6, rel=1e-12)
    # quotas 82.857, 33.143: floors 82 + 33, the 1 left to fc1 (.857)
    assert layer_counts(SHAPES, 0.5, "erk") == {
        "fc1.weight": 83,
        "conv.weight": 33,
        "fc2.weight": 40,
    }


def test_er_saturates_in_two_rounds_by_hand():
    # s = 0.3: K = 312 - round(93.6) = 218; eps = 218/106: conv (p = 0.75) is 1.54 > 1;
    # without it eps = (218 - 72) / (30 + 22): fc2 is 1.54 > 1 too; then
    # eps = (218 - 112) / 30 for fc1 alone
    d = layer_densities(SHAPES, 0.3, "er")
    assert d["conv.weight"] == 1.0 and d["fc2.weight"] == 1.0
    assert d["fc1.weight"] == pytest.approx(0.15 * 106 / 30, rel=1e-12)
    assert layer_counts(SHAPES, 0.3, "er") == {
        "fc1.weight": 106,
        "conv.weight": 72,
        "fc2.weight": 40,
    }
    assert d == pytest.approx(rigl_reference(SHAPES, 0.3, kernel=False), rel=1e-12)


def test_uniform_and_dense_first_by_hand():
    # s = 0.3: K = 312 - round(93.6) = 218; uniform: 218/312 everywhere (not 0.7)
    assert set(layer_densities(SHAPES, 0.3, "uniform").values()) == {218 / 312}
    # dense-first: fc1 keeps 200, the others share 34 of 112: quotas 21.857, 12.143
    d = layer_densities(SHAPES, 0.25, "uniform+dense-first")
    assert d == {"fc1.weight": 1.0, "conv.weight": 34 / 112, "fc2.weight": 34 / 112}
    assert layer_counts(SHAPES, 0.25, "uniform+dense-first") == {
        "fc1.weight": 200,
        "conv.weight": 22,
        "fc2.weight": 12,
    }
    with pytest.raises(ValueError, match="first layer fc1.weight has 200 weights"):
        layer_densities(SHAPES, 0.5, "uniform+dense-first")


def test_callable_budget():
    def half_each(shapes, sparsity):
        assert list(shapes) == list(SHAPES) and sparsity == 0.5
        return dict.fromkeys(shapes, 0.5)

    assert layer_counts(SHAPES, 0.5, half_each) == {
        "fc1.weight": 100,
        "conv.weight": 36,
        "fc2.weight": 20,
    }
    with pytest.raises(ValueError, match="keeps 31.2 weights, but the sparsity keeps exactly 156"):
        layer_counts(SHAPES, 0.5, lambda shapes, s: dict.fromkeys(shapes, 0.1))
    with pytest.raises(ValueError, match=r"density of conv.weight must be in \[0, 1\]"):
        layer_counts(
            SHAPES, 0.5, lambda shapes, s: {**dict.fromkeys(shapes, 0.5), "conv.weight": 2}
        )
    with pytest.raises(ValueError, match="must return densities for"):
        layer_counts(SHAPES, 0.5, lambda shapes, s: {"fc1.weight": 0.5})


def rigl_reference(shapes, sparsity, *, kernel):
    """A transcription of RigL's ``get_sparsities_erdos_renyi`` (one saturation at a
    time, the largest raw density first), with the exact kept count as its target."""
    sizes = {n: math.prod(s) for n, s in shapes.items()}
    kept = sum(sizes.values()) - round(sparsity * sum(sizes.values()))
    dense = set()
    while True:
        rhs, divisor, raw = kept, 0.0, {}
        for n, s in shapes.items():
            if n in dense:
                rhs -= sizes[n]
            else:
                raw[n] = sum(s) / math.prod(s) if kernel else (s[0] + s[1]) / (s[0] * s[1])
                divisor += raw[n] * sizes[n]
        if not raw:
            return dict.fromkeys(shapes, 1.0)
        eps = rhs / divisor
        top = max(raw.values())
        if top * eps <= 1:
            return {n: 1.0 if n in dense else eps * raw[n] for n in shapes}
        dense |= {n for n, p in raw.items() if p == top}


shape_lists = st.lists(
    st.one_of(
        st.tuples(st.integers(1, 40), st.integers(1, 40)),
        st.tuples(st.integers(1, 12), st.integers(1, 12), st.integers(1, 3), st.integers(1, 3)),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=100, deadline=None)
@given(shapes=shape_lists, sparsity=st.floats(0.0, 0.999), kernel=st.booleans())
def test_er_erk_match_rigl_loop(shapes, sparsity, kernel):
    named = {f"l{i}": s for i, s in enumerate(shapes)}
    ours = layer_densities(named, sparsity, "erk" if kernel else "er")
    ref = rigl_reference(named, sparsity, kernel=kernel)
    for n in named:
        assert ours[n] == pytest.approx(ref[n], rel=1e-9, abs=1e-12)
        assert 0.0 <= ours[n] <= 1.0


def hamilton(quotas, total):
    """Largest remainder in exact rationals: floors, then +1 by largest remainder,
    earlier layer first on ties."""
    exact = {n: Fraction(q).limit_denominator(10**9) for n, q in quotas.items()}
    counts = {n: math.floor(q) for n, q in exact.items()}
    names = list(exact)
    order = sorted(names, key=lambda n: (-(exact[n] - counts[n]), names.index(n)))
    for n in order[: total - sum(counts.values())]:
        counts[n] += 1
    return counts


@settings(max_examples=100, deadline=None)
@given(
    shapes=shape_lists,
    sparsity=st.floats(0.0, 0.999),
    budget=st.sampled_from(["uniform", "er", "erk"]),
)
def test_counts_are_exact_and_largest_remainder(shapes, sparsity, budget):
    named = {f"l{i}": s for i, s in enumerate(shapes)}
    sizes = {n: math.prod(s) for n, s in named.items()}
    total = sum(sizes.values())
    counts = layer_counts(named, sparsity, budget)
    assert sum(counts.values()) == total - round(sparsity * total)
    d = layer_densities(named, sparsity, budget)
    quotas = {n: d[n] * sizes[n] for n in named}
    for n in named:
        assert 0 <= counts[n] <= sizes[n] and abs(counts[n] - quotas[n]) < 1
    assert counts == hamilton(quotas, total - round(sparsity * total))


@settings(max_examples=60, deadline=None)
@given(
    shapes=shape_lists,
    sparsity=st.floats(0.0, 0.999),
    budget=st.sampled_from(["uniform", "erk"]),
    fractions=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
    floor=st.integers(0, 3),
)
def test_counts_respect_caps_and_floors(shapes, sparsity, budget, fractions, floor):
    named = {f"l{i}": s for i, s in enumerate(shapes)}
    sizes = {n: math.prod(s) for n, s in named.items()}
    caps = {n: math.floor(f * sizes[n]) for n, f in zip(named, fractions)}
    kept = sum(sizes.values()) - round(sparsity * sum(sizes.values()))
    total = min(kept, sum(caps.values()))
    floors = {n: min(floor, caps[n]) for n in named}
    if sum(floors.values()) > total:
        with pytest.raises(ValueError, match="min_per_layer"):
            layer_counts(named, sparsity, budget, caps=caps, floor=floor)
        return
    counts = layer_counts(named, sparsity, budget, caps=caps, floor=floor)
    assert sum(counts.values()) == total
    assert all(floors[n] <= counts[n] <= caps[n] for n in named)


def water_filled(quotas, caps, floors, total):
    """``clamp(λ q_l, floor_l, cap_l)`` summing to ``total``, ``λ`` by bisection in
    exact rationals (quotas positive)."""
    q = {n: Fraction(v) for n, v in quotas.items()}

    def at(lam):
        return {n: min(caps[n], max(floors[n], lam * v)) for n, v in q.items()}

    lo, hi = Fraction(0), Fraction(1)
    while sum(at(hi).values()) < total:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(at(mid).values()) < total else (lo, mid)
    return {n: float(v) for n, v in at(hi).items()}


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 60), min_size=2, max_size=5),
    kept=st.floats(0.05, 0.6),
    alive=st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5),
    floor=st.integers(0, 30),
)
def test_caps_and_floors_together_water_fill_as_a_clamp(sizes, kept, alive, floor):
    """Each layer's quota is ``clamp(λ q_l, floor, cap_l)``: a layer at its cap gives
    back what the floors of others take (it held its cap, the others short)."""
    shapes = {f"l{i}": (n,) for i, n in enumerate(sizes)}
    caps = {f"l{i}": max(1, math.floor(a * n)) for i, (n, a) in enumerate(zip(sizes, alive))}
    total_n = sum(sizes)
    sparsity = 1 - kept
    total = min(total_n - round(sparsity * total_n), sum(caps.values()))
    floors = {n: min(floor, caps[n]) for n in shapes}
    if sum(floors.values()) > total:
        return
    counts = layer_counts(shapes, sparsity, "uniform", caps=caps, floor=floor)
    quotas = {n: (total_n - round(sparsity * total_n)) * shapes[n][0] / total_n for n in shapes}
    real = water_filled(quotas, caps, floors, total)
    assert counts == hamilton(real, total), (counts, real)


def test_a_capped_layer_gives_back_what_the_floors_take():
    # an already-pruned model (caps) with min_per_layer 10: layer 0 held its cap of 16
    # before the floor of layer 3 took 10, and must come down to its share, 14.49
    shapes = {"a": (7, 10), "b": (43, 2), "c": (79, 2), "d": (6, 2)}
    caps = {"a": 16, "b": 47, "c": 45, "d": 12}
    counts = layer_counts(shapes, 251 / 326, "uniform", caps=caps, floor=10)
    assert counts == {"a": 14, "b": 18, "c": 33, "d": 10}


def test_capped_layer_surplus_is_shared_in_proportion_to_quotas():
    # uniform at s = 0.5 over 100, 300, 100 weights: quotas 50, 150, 50 (K = 250). Layer
    # a has only 10 alive: the 240 left go to b and c as 150 : 50, i.e. 180 and 60
    shapes = {"a": (100,), "b": (300,), "c": (100,)}
    caps = {"a": 10, "b": 300, "c": 100}
    assert layer_counts(shapes, 0.5, "uniform", caps=caps) == {"a": 10, "b": 180, "c": 60}


def test_floor_takes_from_the_other_layers():
    # uniform at s = 0.99 over 1000 and 10 weights: K = 10, quotas 9.9 and 0.099; a
    # floor of 2 gives the small layer 2 and the big one the 8 left
    shapes = {"big": (1000,), "small": (10,)}
    assert layer_counts(shapes, 0.99, "uniform") == {"big": 10, "small": 0}
    assert layer_counts(shapes, 0.99, "uniform", floor=2) == {"big": 8, "small": 2}
    with pytest.raises(ValueError, match="min_per_layer=6 needs 12 weights"):
        layer_counts(shapes, 0.99, "uniform", floor=6)


def test_masks_rank_within_each_layer():
    gen = torch.Generator().manual_seed(0)
    scores = {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}
    masks = masks_from_scores(scores, 0.5, allocation="erk")
    counts = layer_counts(SHAPES, 0.5, "erk")
    for n, s in scores.items():
        assert int(masks[n].sum()) == counts[n]
        order = torch.sort(-s.reshape(-1), stable=True).indices[: counts[n]]
        expected = torch.zeros(s.numel(), dtype=torch.bool)
        expected[order] = True
        torch.testing.assert_close(masks[n].reshape(-1), expected, rtol=0, atol=0)


def test_pruning_scope_is_a_deprecated_alias_of_allocation():
    """Pruning's ``scope=`` ("layer": each layer pruned alone at the same density) is
    ``allocation=``'s older name, kept one release; ``TopK(scope=)`` is another idea."""
    from gradsift import prune_at_init
    from pruning_support import convnet, convnet_data

    gen = torch.Generator().manual_seed(2)
    scores = {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}
    for scope, allocation in (("layer", "uniform"), ("global", "global")):
        with pytest.warns(DeprecationWarning, match=r"scope=.*deprecated.*allocation=") as w:
            a = masks_from_scores(scores, 0.6, scope=scope)
        assert w[0].filename == __file__  # the warning points at the caller
        b = masks_from_scores(scores, 0.6, allocation=allocation)
        assert all(torch.equal(a[n], b[n]) for n in SHAPES)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="disagree"):
        masks_from_scores(scores, 0.6, scope="layer", allocation="erk")
    with pytest.warns(DeprecationWarning, match=r"allocation=\"uniform\""):
        masks = prune_at_init(convnet(), "magnitude", 0.8, convnet_data(), scope="layer")
    shapes = {n: m.shape for n, m in masks.items()}
    assert {n: int(m.sum()) for n, m in masks.items()} == layer_counts(shapes, 0.8, "uniform")


def test_budget_with_previous_masks_and_guard_stays_exact():
    gen = torch.Generator().manual_seed(3)
    scores = {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}
    first = masks_from_scores(scores, 0.5, allocation="global")
    second = masks_from_scores(scores, 0.9, allocation="erk", previous=first, min_per_layer=2)
    for n in SHAPES:
        assert (second[n] <= first[n]).all() and int(second[n].sum()) >= 2
    assert sum(int(m.sum()) for m in second.values()) == 312 - round(0.9 * 312)


@pytest.mark.parametrize("bad", ["ERK", "layer", "erk2", ""])
def test_bad_budget_lists_the_valid_ones(bad):
    assert ALLOCATIONS == ("global", "uniform", "er", "erk", "uniform+dense-first")
    listed = r"\['global', 'uniform', 'er', 'erk', 'uniform\+dense-first'\]"
    with pytest.raises(ValueError, match=f"allocation must be one of {listed}, got '{bad}'"):
        masks_from_scores({"w": torch.ones(4, 4)}, 0.5, allocation=bad)
    with pytest.raises(TypeError, match="allocation must be one of"):
        layer_densities(SHAPES, 0.5, 3)


def test_budget_keyword_still_works_with_a_deprecation_warning():
    """``budget=`` was the layer allocation's name: one release of grace."""
    from gradsift import prune_at_init
    from pruning_support import convnet, convnet_data

    gen = torch.Generator().manual_seed(3)
    scores = {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}
    with pytest.warns(DeprecationWarning, match=r"budget=.*allocation="):
        old = masks_from_scores(scores, 0.6, budget="erk")
    new = masks_from_scores(scores, 0.6, allocation="erk")
    assert all(torch.equal(old[n], new[n]) for n in SHAPES)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="disagree"):
        masks_from_scores(scores, 0.6, budget="erk", allocation="uniform")
    with pytest.warns(DeprecationWarning, match="allocation="):
        masks = prune_at_init(convnet(), "magnitude", 0.8, convnet_data(), budget="erk")
    shapes = {n: m.shape for n, m in masks.items()}
    assert {n: int(m.sum()) for n, m in masks.items()} == layer_counts(shapes, 0.8, "erk")


@pytest.mark.parametrize(
    ("widths", "sparsity", "floor"),
    [
        ([(2, 4), (27, 26), (26, 24), (21, 21)], 0.95, 0),  # layer 0 collapsed
        ([(12, 26), (20, 27), (3, 40), (8, 9), (5, 10)], 0.95, 8),
    ],
)
def test_rounds_end_at_the_one_shot_counts_of_a_layer_wise_allocation(widths, sparsity, floor):
    """Largest remainder is not monotone in the total (the Alabama paradox): an
    earlier round kept fewer in a layer than the last round's count, which it then
    capped; the last round's counts floor every round."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(i, o) for i, o in widths))
    shapes = {f"{i}.weight": m.weight.shape for i, m in enumerate(model)}
    expected = layer_counts(shapes, sparsity, "uniform", floor=floor)
    masks = gradsift.prune_at_init(
        model, "random", sparsity, allocation="uniform", iterations=100, min_per_layer=floor
    )
    assert {n: int(m.sum()) for n, m in masks.items()} == expected

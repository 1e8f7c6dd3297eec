"""Scores in one flat buffer: the views, their recognition, and the selection ranking
them where they lie (no second copy) with the same masks as from separate tensors."""

import pytest
import torch

import gradsift
from gradsift.pruning import masks as masks_module
from gradsift.pruning.flat import flat_like, flat_views, shared_flat
from gradsift.pruning.masks import select
from pruning_support import mlp


def test_views_tile_one_storage_and_have_their_own_version_counters():
    a, b = flat_views([(2, 3), (4,)], torch.float64, "cpu")
    assert a.shape == (2, 3) and b.shape == (4,) and a.dtype == torch.float64
    assert (
        b.storage_offset() == 6 and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )
    version = b._version
    a.add_(1)
    assert b._version == version  # writing one view leaves the other's autograd state alone
    flat = shared_flat([a, b.detach()])
    assert flat is not None and flat.numel() == 10
    flat.fill_(3)
    assert (a == 3).all() and (b == 3).all()


def test_tensors_that_do_not_tile_one_buffer_are_not_taken_for_one():
    a, b = flat_views([(3,), (3,)], torch.float32, "cpu")
    assert shared_flat([b, a]) is None  # out of order
    assert shared_flat([a]) is None  # not to the storage's end
    assert shared_flat([torch.zeros(3), torch.zeros(3)]) is None
    x = torch.zeros(8)
    assert shared_flat([x[:4], x[4:]]) is not None
    assert shared_flat([x[:4], x[5:]]) is None
    assert flat_like([]) == [] and shared_flat([]) is None


def _scores(seed):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(30, 20), (50,), (7, 9)]
    separate = {
        f"l{i}": torch.randn(s, generator=gen, dtype=torch.float64) for i, s in enumerate(shapes)
    }
    separate["l1"][:10] = separate["l1"][10]  # ties at the cut, across positions
    views = flat_like(separate.values())
    for v, s in zip(views, separate.values()):
        v.copy_(s)
    return separate, dict(zip(separate, views))


@pytest.mark.parametrize("consume", [False, True])
def test_select_ranks_a_flat_buffer_where_it_lies(monkeypatch, consume):
    separate, flat = _scores(0)
    previous = {
        n: (torch.rand(s.shape, generator=torch.Generator().manual_seed(1)) > 0.3)
        for n, s in separate.items()
    }
    expected = select(dict(separate), 0.7, previous=previous if consume else None)

    def no_copy(*args):
        raise AssertionError("the flat scores were copied")

    monkeypatch.setattr(masks_module, "_buffer", no_copy)
    if consume:  # given away: ranked in place even where keys differ from scores
        got = select(dict(flat), 0.7, previous=previous, consume=True)
    else:  # not given away: in place only when the keys are the scores themselves
        before = {n: v.clone() for n, v in flat.items()}
        got = select(dict(flat), 0.7)
        for n in flat:
            assert torch.equal(flat[n], before[n])  # the caller's scores are untouched
    for n in expected:
        assert torch.equal(got[n], expected[n]), n


def test_scores_that_need_new_keys_are_copied_when_not_given_away():
    separate, flat = _scores(2)
    flat["l0"][0, 0] = -torch.inf  # below the live floor: its key differs
    before = {n: v.clone() for n, v in flat.items()}
    got = select(dict(flat), 0.5)
    expected = select({n: v.clone() for n, v in before.items()}, 0.5)
    for n in flat:
        assert torch.equal(flat[n], before[n]) and torch.equal(got[n], expected[n])


@pytest.mark.parametrize("method", ["magnitude", "snip"])
def test_builtin_scores_come_in_one_flat_buffer(method):
    model = mlp()
    data = [(torch.randn(8, 12, dtype=torch.float64), torch.randint(0, 3, (8,)))]
    scores = gradsift.score(model, method, data)
    assert shared_flat(scores.values()) is not None

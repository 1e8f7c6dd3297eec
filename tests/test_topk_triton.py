"""The Triton selection against torch.topk's multiset and the brute-force reference of
test_topk (lowest-index ties), on CPU through the interpreter (small sizes: it runs
each program in numpy) or on the GPU where there is one."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gradsift import topk_indices
from gradsift.select import topk_mask
from gradsift.select.triton import topk as _topk_triton
from gradsift.select.triton.keys import FLAG, NAN_KEY, TOTALS
from gradsift.select.triton.topk import Selection
from test_topk import make, reference
from triton_support import DEVICE, DTYPES

KINDS = ["normal", "equal", "zeros", "huge", "sorted", "heavy", "negative", "ties"]


def check(x: torch.Tensor, k: int, absolute: bool = True) -> None:
    got = topk_indices(x.to(DEVICE), k, absolute=absolute, backend="triton").cpu()
    assert got.dtype == torch.int64 and got.shape == (k,)
    key = x.abs() if absolute else x
    expected = torch.topk(key.float(), k).values.sort().values
    torch.testing.assert_close(key[got].float().sort().values, expected, rtol=0, atol=0)
    torch.testing.assert_close(got, reference(x, k, absolute), rtol=0, atol=0)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 6000),
    frac=st.one_of(st.floats(0.0, 0.01), st.floats(0.0, 1.0)),  # staged and dense
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from(DTYPES),
    absolute=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_reference_property(n, frac, kind, dtype, absolute, seed):
    x = make(kind, n, torch.Generator().manual_seed(seed)).to(dtype)
    check(x, max(1, min(n, int(round(frac * n)))), absolute)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_at_the_cut_and_signed_zero(dtype):
    # the cut falls inside a class of equal keys: the lowest indices win; -0 ties +0
    x = torch.tensor([0.5, -1.0, 1.0, 0.0, -0.0, 1.0, -1.0, 0.25, 0.0] * 300).to(dtype)
    for k in (1, 2, 601, 1199, 1200, 1201, 2000):
        check(x, k)
        check(x, k, absolute=False)


def test_infinities_rank_first():
    x = torch.randn(5000, generator=torch.Generator().manual_seed(4))
    x[7], x[4000] = -float("inf"), float("inf")
    assert topk_indices(x.to(DEVICE), 2, backend="triton").tolist() == [7, 4000]
    got = topk_indices(x.to(DEVICE), 1, absolute=False, backend="triton")
    assert got.tolist() == [4000]
    check(x, 5, absolute=False)  # -inf is the smallest, never selected here


@pytest.mark.parametrize("n, k", [(10, 3), (5000, 5), (5000, 4000)])  # dense, staged, dense
@pytest.mark.parametrize("absolute", [True, False])
def test_nan_raises_with_count(n, k, absolute):
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    x[1], x[n // 2] = float("nan"), float("nan")
    with pytest.raises(ValueError, match="2 NaN"):
        topk_indices(x.to(DEVICE), k, absolute=absolute, backend="triton")
    with pytest.raises(ValueError, match="2 NaN"):
        topk_mask(x.to(DEVICE), k, absolute=absolute, backend="triton")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 40, 4999, 5000])
def test_topk_mask_matches_reference(dtype, k):
    x = make("ties", 5000, torch.Generator().manual_seed(k)).to(dtype)
    for absolute in (True, False):
        mask = topk_mask(x.to(DEVICE), k, absolute=absolute, backend="triton").cpu()
        expected = torch.zeros(5000, dtype=torch.bool)
        expected[reference(x, k, absolute)] = True
        assert mask.dtype == torch.bool and torch.equal(mask, expected)


def _run(x, k):
    sel = Selection()
    sel.run(x.to(DEVICE), k)
    return sel


def test_staged_path_filters_candidates(monkeypatch):
    # at this small N the default slack alone covers every block: shrink it
    monkeypatch.setattr(_topk_triton, "SLACK", 64)
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(0))
    sel = _run(x, 20)
    assert sel.staged and sel.cap < sel.nblocks
    candidates = int(sel.state[TOTALS]) + int(sel.state[TOTALS + 1])
    assert 20 <= candidates <= sel.cap, "stage 1 read the candidate blocks only"
    listed = int(sel.state[TOTALS + 2])
    assert 20 <= listed <= sel.ecap, "stage 2 read the listed elements only"
    torch.testing.assert_close(sel.indices.cpu(), reference(x, 20), rtol=0, atol=0)


def test_dense_fallback_when_listed_elements_overflow(monkeypatch):
    # 20 blocks of equal top keys: the candidate blocks fit, but their 640 elements
    # reaching the cut overflow a list of 3k: stage 2 reads everything, exactly
    monkeypatch.setattr(_topk_triton, "LIST_SLACK", 0)
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(7)) * 0.01
    x[32 * 100 : 32 * 120] = 1.0
    sel = _run(x, 10)
    assert int(sel.state[TOTALS]) <= sel.cap and int(sel.state[TOTALS + 2]) == 640 > sel.ecap
    torch.testing.assert_close(sel.indices.cpu(), reference(x, 10), rtol=0, atol=0)


def test_dense_fallback_when_candidates_overflow(monkeypatch):
    # every block key ties (all |x| equal): the candidates overflow any buffer below
    # N / BLOCK blocks, and the device must read every block instead, still exactly
    monkeypatch.setattr(_topk_triton, "SLACK", 0)
    x = torch.full((20_000,), -0.5)
    x[[3, 9_000]] = 2.0
    sel = _run(x, 10)
    assert sel.staged and sel.cap == 20
    assert int(sel.state[TOTALS]) + int(sel.state[TOTALS + 1]) == sel.nblocks > sel.cap
    torch.testing.assert_close(sel.indices.cpu(), reference(x, 10), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k, block", [(20, 32), (400, 8)])  # both block sizes, staged
def test_the_64_bit_kernels_select_exactly(monkeypatch, dtype, k, block):
    """Past 2**31 elements every position is 64-bit, the candidate block list too (an
    int32 list wraps past 2**31 blocks); lowering the threshold runs those kernels on
    a small input (on CPU in the interpreter; CI cannot hold 2**31 elements)."""
    monkeypatch.setattr(_topk_triton, "SLACK", 64)
    monkeypatch.setattr(_topk_triton, "WIDE_FROM", 0)
    x = make("ties", 20_000, torch.Generator().manual_seed(k)).to(dtype)
    for absolute in (True, False):
        sel = Selection()
        sel.run(x.to(DEVICE), k, absolute=absolute)
        assert sel.wide and sel.staged and sel.block == block
        assert sel.cand.dtype == torch.int64
        torch.testing.assert_close(sel.indices.cpu(), reference(x, k, absolute), rtol=0, atol=0)


def test_selection_reuses_buffers_and_flags_nan():
    sel = Selection()
    x = torch.randn(3000, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    sel.run(x, 7)
    buffers = (sel.indices, sel.small, sel.keys, sel.cand, sel.list_idx)
    x[5] = float("nan")
    sel.run(x, 7)
    assert int(sel.state[FLAG]) == NAN_KEY and sel.found_nan()
    x[5] = 0.0
    sel.run(x, 7)
    again = (sel.indices, sel.small, sel.keys, sel.cand, sel.list_idx)
    assert all(a is b for a, b in zip(buffers, again))
    assert not sel.found_nan(), "the flag is cleared on every run"
    torch.testing.assert_close(sel.indices.cpu(), reference(x.cpu(), 7), rtol=0, atol=0)


def test_float64_and_bad_backend():
    x = torch.randn(100, dtype=torch.float64)
    got = topk_indices(x, 5, backend="triton")  # float64 stays on the torch path
    torch.testing.assert_close(got, reference(x, 5), rtol=0, atol=0)
    with pytest.raises(ValueError, match="backend must be one of"):
        topk_indices(x, 5, backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        topk_mask(x, 5, backend=None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [16, 4097])
def test_signed_selection_of_a_partial_tile(dtype, n):
    # the minimal failure on an H200 with the kernels of 0.1.0 (triton 3.6): a masked
    # tl.histogram of a reshaped tile counted 12 of 16 keys in the padding's bin and
    # returned the wrong index; the interpreter never showed it (only a GPU can)
    x = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(dtype)
    for k in (1, 3, n // 2):
        check(x, k, absolute=False)
        check(x, k, absolute=True)


def test_larger_k_uses_finer_blocks_and_stays_staged():
    x = torch.randn(40_000, generator=torch.Generator().manual_seed(5))
    sel = _run(x, 400)  # 4k > N / 32 but <= N / 8
    assert sel.block == 8 and sel.staged
    torch.testing.assert_close(sel.indices.cpu(), reference(x, 400), rtol=0, atol=0)


def test_one_compilation_serves_both_orders_and_every_pass():
    # pass, phase and order are run-time arguments: a second selection of another
    # order, size and k compiles nothing new (first-call cost on a GPU)
    from gradsift.select.triton.stages import stage_kernel

    if not hasattr(stage_kernel, "device_caches"):
        pytest.skip("the interpreter compiles nothing")
    x = torch.randn(9000, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    topk_indices(x, 5, backend="triton")
    before = sum(len(c[0]) for c in stage_kernel.device_caches.values())
    topk_indices(x[:8000], 7, absolute=False, backend="triton")
    assert sum(len(c[0]) for c in stage_kernel.device_caches.values()) == before


def test_warmup_runs_both_block_sizes_staged():
    # warmup must reach the kernels a training step will use: the 32-element and
    # the 8-element staged selections (k = 2000 of 32768 was unstaged: nothing warmed)
    _topk_triton._CACHED.clear()
    _topk_triton.warmup(device=DEVICE, dtypes=(torch.float32,))
    runs = {(sel.block, sel.staged) for sel, _ in _topk_triton._CACHED.values()}
    assert runs == {(32, True), (8, True)}

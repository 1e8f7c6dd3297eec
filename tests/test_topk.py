"""topk_indices against torch.topk: exact multiset of keys, lowest-index ties, errors."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gradsift import topk_indices
from gradsift.select import (
    exact as _topk_exact,
    sampled as _topk_sampled,
    sampled as sel,
    topk_mask,
)

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def reference(x: torch.Tensor, k: int, absolute: bool = True) -> torch.Tensor:
    """Brute force: stable sort by key descending, then index ascending; take k."""
    key = x.double().abs() if absolute else x.double()
    order = torch.sort(-key, stable=True).indices  # ties keep ascending index order
    return torch.sort(order[:k]).values


def check(x: torch.Tensor, k: int, absolute: bool = True) -> None:
    got = topk_indices(x, k, absolute=absolute)
    assert got.dtype == torch.int64 and got.shape == (k,)
    assert torch.all(got[1:] > got[:-1]), "indices must be sorted ascending and unique"
    key = x.abs() if absolute else x
    expected_keys = torch.topk(key, k).values.sort().values
    torch.testing.assert_close(key[got].sort().values, expected_keys, rtol=0, atol=0)
    torch.testing.assert_close(got, reference(x, k, absolute), rtol=0, atol=0)


def make(kind: str, n: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "normal":
        return torch.randn(n, generator=gen, dtype=torch.float64)
    if kind == "equal":
        return torch.full((n,), -0.5, dtype=torch.float64)
    if kind == "zeros":
        x = torch.zeros(n, dtype=torch.float64)
        x[torch.randint(0, n, (max(1, n // 50),), generator=gen)] = 1.0
        return x
    if kind == "sparse":  # a pruned model's gradient: the cut lands on the zeros
        x = torch.zeros(n, dtype=torch.float64)
        x[torch.randint(0, n, (min(n, 30),), generator=gen)] = -2.0
        return x
    if kind == "huge":
        x = torch.randn(n, generator=gen, dtype=torch.float64) * 1e-3
        x[torch.randint(0, n, (3,), generator=gen)] = 1e30
        return x
    if kind == "sorted":
        return torch.linspace(-1, 1, n, dtype=torch.float64)
    if kind == "heavy":
        return torch.randn(n, generator=gen, dtype=torch.float64) ** 5 * 1e6
    if kind == "negative":
        return -torch.rand(n, generator=gen, dtype=torch.float64) - 1.0
    if kind == "ties":  # few distinct values: the cut lands inside a tie class
        return torch.randint(-3, 4, (n,), generator=gen).double()
    raise AssertionError(kind)


KINDS = ["normal", "equal", "zeros", "sparse", "huge", "sorted", "heavy", "negative", "ties"]


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 100_000),
    frac=st.floats(0.0, 1.0),
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from(FLOATS),
    absolute=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_topk_property(n, frac, kind, dtype, absolute, seed):
    gen = torch.Generator().manual_seed(seed)
    x = make(kind, n, gen).to(dtype)
    k = max(1, min(n, int(round(frac * n))))
    check(x, k, absolute)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [1, 1000, 3001])
def test_sampled_path_large(kind, k):
    # above _DENSE_BELOW and k*8 < n, so the sampled block path runs
    n = 200_003  # not a multiple of the block: the tail is handled
    x = make(kind, n, torch.Generator().manual_seed(k)).float()
    check(x, k)
    check(x, k, absolute=False)


def test_sampled_path_is_taken(monkeypatch):
    calls = []
    for name in ("_from_blocks", "_direct"):
        real = getattr(_topk_sampled, name)
        monkeypatch.setattr(
            _topk_sampled, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a)
        )
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(0))
    check(x, 100)
    check(x, 30_000)
    assert calls == ["_from_blocks", "_direct"], "blocks for small k, direct for large k"


@pytest.mark.parametrize("absolute", [True, False])
def test_block_keys_brute_force(absolute):
    x = torch.randn(1000 * sel.BLOCK + 7, generator=torch.Generator().manual_seed(9))
    key = x.abs() if absolute else x
    expected = key[: 1000 * sel.BLOCK].view(1000, sel.BLOCK).max(1).values
    got = sel.block_keys(x, absolute=absolute)
    if absolute:  # integer bit patterns of |x|, order-preserving
        got = got.view(torch.float32)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("k", [1, 500, 20_000])
def test_topk_from_block_keys_chunked(k):
    # the optimizer computes block keys chunk by chunk into one buffer
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(k))
    out = torch.empty(x.numel() // sel.BLOCK, dtype=sel.block_key_dtype(x.dtype))
    step = 4096 * sel.BLOCK
    for s in range(0, x.numel() // sel.BLOCK * sel.BLOCK, step):
        sel.block_keys(x[s : s + step], out=out[s // sel.BLOCK : (s + step) // sel.BLOCK])
    got = sel.topk_from_block_keys(x, k, out)
    torch.testing.assert_close(got, reference(x, k), rtol=0, atol=0)


def _chunked_keys(x: torch.Tensor, absolute: bool = True) -> torch.Tensor:
    out = torch.empty(x.numel() // sel.BLOCK, dtype=sel.block_key_dtype(x.dtype, absolute))
    step = 4096 * sel.BLOCK
    for s in range(0, x.numel() // sel.BLOCK * sel.BLOCK, step):
        part = x[s : s + step]
        sel.block_keys(part, absolute=absolute, out=out[s // sel.BLOCK : (s + step) // sel.BLOCK])
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(65_536, 250_000),
    kfrac=st.floats(0.0, 0.125),
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from(FLOATS),
    absolute=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_topk_from_block_keys_property(n, kfrac, kind, dtype, absolute, seed):
    # every k up to N/8, so both thresholds (from the block keys, from x) are taken
    x = make(kind, n, torch.Generator().manual_seed(seed)).to(dtype)
    k = max(1, int(kfrac * n))
    got = sel.topk_from_block_keys(x, k, _chunked_keys(x, absolute), absolute=absolute)
    torch.testing.assert_close(got, reference(x, k, absolute), rtol=0, atol=0)


def test_given_block_keys_large_k_reads_blocks_not_everything(monkeypatch):
    # 4k > N / BLOCK: the threshold comes from x, but with the keys at hand only the
    # blocks above it are read; without them x is filtered directly
    calls = []
    for name in ("_from_blocks", "_direct"):
        real = getattr(_topk_sampled, name)
        monkeypatch.setattr(
            _topk_sampled, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a)
        )
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(3))
    k = 30_000
    got = sel.topk_from_block_keys(x, k, _chunked_keys(x))
    torch.testing.assert_close(got, reference(x, k), rtol=0, atol=0)
    assert calls == ["_from_blocks"]
    check(x, k)
    assert calls == ["_from_blocks", "_direct"]


def _too_high(values):
    """Above every finite key: inf, or inf's bits where block keys are bit patterns (an
    integer key above those is a NaN's, which says that ``x`` holds a NaN)."""
    if values.is_floating_point():
        return math.inf
    floats = {torch.int32: torch.float32, torch.int64: torch.float64}[values.dtype]
    return int(torch.tensor(math.inf, dtype=floats).view(values.dtype))


@pytest.mark.parametrize("k", [500, 30_000])  # block path, direct path
def test_retry_when_threshold_admits_too_few(monkeypatch, k):
    # a threshold above every key admits nothing; the next (lower) ones must rescue it
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(1))
    real = _topk_sampled.thresholds
    seen = []

    def too_high_first(values, k, absolute=False):
        seen.append(values.dtype)
        yield _too_high(values)
        yield from real(values, k, absolute)

    monkeypatch.setattr(_topk_sampled, "thresholds", too_high_first)
    check(x, k)
    assert seen == [torch.int32 if k == 500 else torch.float32]


@pytest.mark.parametrize("k", [77, 30_000])
def test_dense_fallback_when_all_thresholds_fail(monkeypatch, k):
    monkeypatch.setattr(
        _topk_sampled, "thresholds", lambda values, k, a=False: iter([_too_high(values)])
    )
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(2))
    check(x, k)


@pytest.mark.parametrize("n", [10, 300_000])
@pytest.mark.parametrize("where", [0, -1, "mid"])
def test_nan_raises_with_count(n, where):
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    i = n // 2 if where == "mid" else where
    x[i] = float("nan")
    x[1] = float("nan")
    with pytest.raises(ValueError, match="2 NaN"):
        topk_indices(x, 5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("absolute", [True, False])
def test_many_nans_raise_though_the_tail_holds_k(dtype, absolute):
    """With NaN in a tenth of the entries the sampled threshold is itself NaN (as a
    block key, NaN's bits rank above inf's). It once let the ``n % 32`` tail past the
    threshold as the whole answer: a silent top-k of three tail entries."""
    n = 100_003  # a tail of 3 entries after the last whole block
    x = torch.randn(n, generator=torch.Generator().manual_seed(6)).to(dtype)
    x[: n - 3 : 10] = float("nan")
    for k in (1, 3):
        with pytest.raises(ValueError, match="10000 NaN"):
            topk_indices(x, k, absolute=absolute)


@pytest.mark.parametrize("n", [10, 300_000])
def test_inf_ranks_first(n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(4))
    x[7] = -float("inf")
    x[n - 2] = float("inf")
    assert topk_indices(x, 2).tolist() == [7, n - 2]
    assert topk_indices(x, 1, absolute=False).tolist() == [n - 2]
    # +inf and -inf in one tensor: a sum of inf - inf is NaN, yet nothing is NaN
    check(x, 5)


def test_non_contiguous_input():
    base = torch.randn(200_000, generator=torch.Generator().manual_seed(5))
    check(base[::2], 100)


@pytest.mark.parametrize(
    "x, k, error, match",
    [
        (torch.randn(5), 0, ValueError, "k must"),
        (torch.randn(5), 6, ValueError, "k must"),
        (torch.randn(5), -1, ValueError, "k must"),
        (torch.randn(5), 2.0, TypeError, "k must be an int"),
        (torch.randn(5), True, TypeError, "k must be an int"),
        (torch.randn(2, 3), 1, ValueError, "x must be 1-D"),
        (torch.randn(0), 1, ValueError, "x must not be empty"),
        (torch.arange(5), 1, TypeError, "floating dtype"),
        (torch.randn(5, dtype=torch.complex64), 1, TypeError, "floating dtype"),
        ([1.0, 2.0], 1, TypeError, "torch.Tensor"),
    ],
)
def test_bad_input(x, k, error, match):
    with pytest.raises(error, match=match):
        topk_indices(x, k)


def test_does_not_modify_input():
    x = torch.randn(300_000, generator=torch.Generator().manual_seed(6))
    before = x.clone()
    topk_indices(x, 1000)
    assert torch.equal(x, before)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(65_536, 250_000),
    kfrac=st.floats(0.0, 0.125),
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from(FLOATS),
    absolute=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_sampled_path_property(n, kfrac, kind, dtype, absolute, seed):
    x = make(kind, n, torch.Generator().manual_seed(seed)).to(dtype)
    check(x, max(1, int(kfrac * n)), absolute)


def check_mask(x: torch.Tensor, k: int, absolute: bool = True) -> None:
    mask = topk_mask(x, k, absolute=absolute)
    assert mask.dtype == torch.bool and int(mask.sum()) == k
    expected = torch.zeros(x.numel(), dtype=torch.bool)
    expected[reference(x, k, absolute)] = True
    assert torch.equal(mask, expected)


@settings(max_examples=80, deadline=None)
@given(
    n=st.sampled_from([1, 7, 1000, 70_000, 150_001]),
    frac=st.floats(0.0, 1.0),
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from(FLOATS),
    absolute=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_topk_mask_property(n, frac, kind, dtype, absolute, seed):
    x = make(kind, n, torch.Generator().manual_seed(seed)).to(dtype)
    check_mask(x, max(1, min(n, int(round(frac * n)))), absolute)


@pytest.mark.parametrize("k", [1, 5_000, 100_000, 199_999, 200_000])
def test_topk_mask_large_k(k):
    x = torch.randn(200_000, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
    check_mask(x, k)
    check_mask(x, k, absolute=False)


def test_topk_mask_bracket_fallback(monkeypatch):
    # a sample bracket that misses the k-th value must still give the exact answer,
    # through the full selection (the spy proves that path ran)
    x = torch.cat([torch.zeros(100_000), torch.arange(1.0, 100_001.0)])
    monkeypatch.setattr(_topk_exact, "_bracket", lambda key, k: (key.max(), key.max()))
    full = []
    real = _topk_exact.kth_full
    monkeypatch.setattr(
        _topk_exact, "kth_full", lambda key, k: full.append(key.numel()) or real(key, k)
    )
    check_mask(x, 150_000)
    assert full == [x.numel()], "the bracket missed, so the whole key must be selected over"
    with pytest.raises(ValueError, match="1 NaN"):
        topk_mask(torch.tensor([1.0, float("nan")]), 1)


@pytest.mark.parametrize("capacity", [1, 4_000])
def test_topk_mask_bracket_buffer_grows(monkeypatch, capacity):
    # the bracket's keys are gathered into one preallocated buffer; one that is too
    # small (a sample that underestimates the bracket) grows and loses nothing
    x = torch.randn(3 * (1 << 20) + 5, generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(_topk_exact, "_capacity", lambda n, k: capacity)
    sizes = []
    real = _topk_exact.kth_full
    monkeypatch.setattr(
        _topk_exact, "kth_full", lambda key, k: sizes.append(key.numel()) or real(key, k)
    )
    check_mask(x, 1_000_000)
    check_mask(x, 1_000_000, absolute=False)
    assert sizes and max(sizes) < x.numel(), "the bracket held the k-th value"


@pytest.mark.parametrize("k", [100, 30_000])  # block path, direct path
def test_plateau_at_the_cut_reads_only_what_it_keeps(monkeypatch, k):
    # keys tied at the cut: the lowest-index ties are found with an early stop, never
    # by materialising the whole plateau as candidates
    x = torch.zeros(1_000_000)
    x[torch.arange(7, 1_000_000, 99_991)] = 3.0  # 11 spikes, then zeros
    seen = []
    real = _topk_exact.exact
    monkeypatch.setattr(
        _topk_sampled, "exact", lambda v, i, k: seen.append(v.numel()) or real(v, i, k)
    )
    check(x, k)
    assert seen == [], "fewer than k keys above the cut: no exact stage over candidates"


def test_numpy_and_tensor_integers_are_accepted_as_k():
    import numpy as np

    x = torch.randn(100, generator=torch.Generator().manual_seed(7))
    expected = topk_indices(x, 3)
    assert torch.equal(topk_indices(x, np.int64(3)), expected)
    assert torch.equal(topk_indices(x, torch.tensor(3)), expected)


@pytest.mark.parametrize("chunk", [1_000, 1 << 26])  # many chunks; one (as on a GPU)
def test_chunked_loops_give_the_same_selection_at_any_chunk_size(monkeypatch, chunk):
    # the bracket split and the tie scan read a chunk at a time: cache-sized on CPU,
    # 64M elements elsewhere (each chunk costs a host sync on a GPU)
    assert _topk_exact.chunk_size(torch.empty(0)) == _topk_exact.CHUNK
    assert _topk_exact.chunk_size(torch.empty(0, device="meta")) == _topk_exact.DEVICE_CHUNK
    monkeypatch.setattr(_topk_exact, "chunk_size", lambda key: chunk)
    x = torch.randn(300_007, generator=torch.Generator().manual_seed(5))
    x[1000:200_000] = 0.25  # a plateau at the cut: the tie scan stops early
    for k in (1, 3_000, 150_000, 299_000):
        check_mask(x, k)
        check_mask(x, k, absolute=False)

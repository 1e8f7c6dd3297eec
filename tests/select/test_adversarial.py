"""Adversarial tests of the selection API against a float64 brute-force reference.

Reference: stable sort by key descending (``|x|`` with ``absolute=True``), ties to
the lowest index, ``-0.0`` tied with ``+0.0``; the k chosen indices, ascending.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import gradsift
from gradsift.budget import Budget, kept_count, resolve_k
from gradsift.select import topk_mask
from gradsift.select.exact import CHUNK, DENSE_BELOW

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
KERNEL_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
INF = float("inf")


def reference(x: torch.Tensor, k: int, absolute: bool = True) -> torch.Tensor:
    v = x.detach().reshape(-1).double()
    keys = ((v.abs() if absolute else v) + 0.0).numpy()  # -0.0 -> +0.0
    order = np.argsort(-keys, kind="stable")
    return torch.from_numpy(np.sort(order[:k]).astype(np.int64))


def check(x, k, absolute=True, backend="torch", mask=True):
    expected = reference(x, k, absolute)
    got = gradsift.topk_indices(x, k, absolute=absolute, backend=backend)
    assert got.dtype == torch.int64
    assert torch.equal(got, expected), (got[:10], expected[:10])
    if mask:
        m = topk_mask(x, k, absolute=absolute, backend=backend)
        assert m.dtype == torch.bool and m.shape == x.shape
        assert torch.equal(torch.nonzero(m).squeeze(1), expected)


def small_specials(dtype):
    tiny = torch.finfo(dtype).tiny
    vals = [-0.0, 0.0, -0.0, 0.0, -1.0, -0.0, tiny / 4, -tiny / 4, tiny / 2]
    vals += [-tiny / 2, INF, -INF, -INF, INF, 3.0, -3.0, tiny, -tiny]
    return torch.tensor(vals, dtype=dtype)


# ---------------------------------------------------------------- argument checks


@pytest.mark.parametrize("fn", [gradsift.topk_indices, topk_mask])
@pytest.mark.parametrize(
    "dtype",
    [torch.int64, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2],
)
def test_non_floating_dtypes_refused(fn, dtype):
    # (float8 is floating, but nothing here orders it: it failed deep inside instead)
    with pytest.raises(TypeError, match="floating dtype"):
        fn(torch.ones(8, dtype=dtype), 2)


@pytest.mark.parametrize("fn", [gradsift.topk_indices, topk_mask])
@pytest.mark.parametrize(
    "x, k",
    [
        (torch.tensor(1.0), 1),  # 0-d
        (torch.zeros(0), 1),  # empty
        (torch.zeros(0), 0),
        (torch.zeros(3, 4), 2),  # multi-dimensional: documented as 1-D only
        (torch.zeros(5), 0),
        (torch.zeros(5), 6),
        (torch.zeros(5), -1),
    ],
)
def test_shape_and_k_range_refused(fn, x, k):
    with pytest.raises(ValueError):
        fn(x, k)


@pytest.mark.parametrize("fn", [gradsift.topk_indices, topk_mask])
@pytest.mark.parametrize("k", [np.int64(3), np.uint8(3), torch.tensor(3), np.int32(3)])
def test_integer_like_k(fn, k):
    x = torch.tensor([5.0, -1.0, 0.5, -7.0, 2.0, 0.0])
    got = fn(x, k)
    if got.dtype == torch.bool:
        got = torch.nonzero(got).squeeze(1)
    assert got.tolist() == [0, 3, 4]


@pytest.mark.parametrize("k", [True, np.bool_(True), 3.0, torch.tensor(3.0), "3"])
def test_non_integer_k_refused(k):
    with pytest.raises(TypeError):
        gradsift.topk_indices(torch.ones(5), k)


def test_bool_tensor_k_refused():
    try:
        gradsift.topk_indices(torch.ones(5), torch.tensor(True))
    except TypeError:
        return
    raise AssertionError("k=torch.tensor(True) was accepted as an integer")


# ---------------------------------------------------------------- small, exact


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("absolute", [True, False])
def test_signed_zero_subnormal_inf_every_k(dtype, absolute):
    x = small_specials(dtype)
    for k in range(1, x.numel() + 1):
        check(x, k, absolute)


def test_signed_zero_ties_with_positive_zero():
    x = torch.tensor([-1.0, 0.0, -0.0, -2.0, -0.0, 0.0])
    # signed order: the zeros tie, lowest indices first
    assert gradsift.topk_indices(x, 2, absolute=False).tolist() == [1, 2]
    assert gradsift.topk_indices(x, 3, absolute=False).tolist() == [1, 2, 4]


@pytest.mark.parametrize("dtype", FLOATS)
def test_all_equal_and_k_equals_n(dtype):
    x = torch.full((37,), -2.5, dtype=dtype)
    for k in (1, 17, 36, 37):
        check(x, k, absolute=True)
        check(x, k, absolute=False)


@settings(max_examples=40, deadline=None)
@given(
    vals=st.lists(
        st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, INF, -INF, 1e-40, -1e-40]),
        min_size=1,
        max_size=80,
    ),
    dtype=st.sampled_from(FLOATS),
    absolute=st.booleans(),
    kfrac=st.floats(0, 1),
)
def test_small_heavy_ties_property(vals, dtype, absolute, kfrac):
    x = torch.tensor(vals, dtype=torch.float64).to(dtype)
    k = max(1, round(kfrac * x.numel()))
    check(x, k, absolute)


# ---------------------------------------------------------------- inputs untouched


@pytest.mark.parametrize("n", [1000, DENSE_BELOW + 1, 3 * DENSE_BELOW])
@pytest.mark.parametrize("absolute", [True, False])
def test_input_not_modified_bitwise(n, absolute):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen)
    x[::5] = -0.0
    before = x.view(torch.int32).clone()
    for k in (1, n // 64, n // 8 + 1, n // 2):
        gradsift.topk_indices(x, k, absolute=absolute)
        topk_mask(x, k, absolute=absolute)
    assert torch.equal(x.view(torch.int32), before)


def test_requires_grad_small():
    x = torch.randn(500, requires_grad=True)
    check(x, 40, absolute=True)
    check(x, 40, absolute=False)
    assert x.grad is None


@pytest.mark.parametrize(
    "fn, k, absolute",
    [
        (gradsift.topk_indices, 5, False),  # block keys: amax(out=)
        (gradsift.topk_indices, 12500, True),  # direct threshold: abs(out=)
        (gradsift.topk_indices, 50000, True),  # dense -> top_mask: index_select(out=)
        (topk_mask, 5, True),  # _split_at_bracket: index_select(out=)
    ],
)
def test_requires_grad_large(fn, k, absolute):
    x = torch.randn(100_000, generator=torch.Generator().manual_seed(0), requires_grad=True)
    got = fn(x, k, absolute=absolute)
    if got.dtype == torch.bool:
        got = torch.nonzero(got).squeeze(1)
    assert torch.equal(got, reference(x, k, absolute))


def test_non_contiguous_and_transposed_flat_views():
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(4, 3 * DENSE_BELOW + 5, generator=gen)
    for x in (base[1, ::3], base[:, 7], base.t()[9]):
        for k in {1, min(5, x.numel()), max(1, x.numel() // 40)}:
            check(x, k, absolute=True)
            check(x, k, absolute=False)


# ---------------------------------------------------------------- thresholds


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("n", [DENSE_BELOW - 1, DENSE_BELOW, DENSE_BELOW + 1, DENSE_BELOW + 31])
def test_sizes_around_the_dense_cutoff_with_ties(dtype, n):
    gen = torch.Generator().manual_seed(n)
    x = torch.randint(-3, 4, (n,), generator=gen).to(dtype)
    for k in (1, 7, n // 128, n // 9, n // 8, n // 8 + 1, n - 1):
        check(x, k, absolute=True, mask=False)
        check(x, k, absolute=False, mask=k == n // 9)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("absolute", [True, False])
def test_ties_across_chunk_boundaries(dtype, absolute):
    n = 2 * CHUNK + 45  # a tail that is not a whole block of 32
    x = torch.zeros(n, dtype=dtype)
    x[CHUNK - 3 : CHUNK + 40] = 5.0
    x[2 * CHUNK + 10 :] = 5.0
    x[::7777] = -7.0
    for k in (100, 150, 200, CHUNK // 8, n // 3):
        check(x, k, absolute, mask=k in (150, n // 3))


@pytest.mark.parametrize("absolute", [True, False])
def test_plateau_longer_than_a_chunk(absolute):
    n = 2 * CHUNK + 45
    x = torch.ones(n, dtype=torch.float16)
    x[CHUNK + 5] = 2
    for k in (CHUNK - 1, CHUNK + 7, n - 3):
        check(x, k, absolute)


def _adversarial(kind, n, dtype, gen):
    if kind == "spike":
        x = torch.full((n,), 1.0)
        x[n // 2] = 1000.0
    elif kind == "geometric":
        x = (0.9 ** torch.arange(n, dtype=torch.float64)).flip(0)
    elif kind == "clusters":
        x = torch.where(torch.rand(n, generator=gen) < 0.001, 100.0, 1e-3)
        x = x * torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    elif kind == "dead":  # pruned weights: -inf everywhere but a few
        x = torch.full((n,), -INF)
        x[::97] = 1.0
        x[5::101] = 2.0
    elif kind == "zeros":
        x = torch.zeros(n)
        x[::2] = -0.0
        x[7::1000] = -1.0
    else:  # infinities
        x = torch.full((n,), INF)
        x[::3] = -INF
    return x.to(dtype)


@pytest.mark.parametrize("kind", ["spike", "geometric", "clusters", "dead", "zeros", "infs"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_sampled_path_adversarial_distributions(kind, dtype):
    n = 200_003
    x = _adversarial(kind, n, dtype, torch.Generator().manual_seed(2))
    for k in (1, 3, 201, 2000, 4000, n // 8, n // 3):
        for absolute in (True, False):
            check(x, k, absolute, mask=k in (4000, n // 3))


# ---------------------------------------------------------------- triton (interpreter)

triton_only = pytest.mark.skipif(
    not gradsift.select.dispatch.triton_available()
    or not (torch.cuda.is_available() or gradsift.select.dispatch.interpreting()),
    reason="needs triton (CUDA or TRITON_INTERPRET=1)",
)


@triton_only
@pytest.mark.parametrize("dtype", KERNEL_FLOATS)
@pytest.mark.parametrize("absolute", [True, False])
def test_triton_specials_every_k(dtype, absolute):
    x = small_specials(dtype)
    for k in range(1, x.numel() + 1, 3):
        check(x, k, absolute, backend="triton")


@triton_only
@pytest.mark.parametrize("dtype", KERNEL_FLOATS)
@pytest.mark.parametrize("absolute", [True, False])
def test_triton_heavy_ties_staged_and_unstaged(dtype, absolute):
    n = 20_000  # 625 blocks of 32: k <= 156 staged on 32-blocks, then 8-blocks
    x = torch.randint(-2, 3, (n,), generator=torch.Generator().manual_seed(3)).to(dtype)
    x[::2] = torch.where(x[::2] == 0, -0.0, x[::2])
    for k in (1, 156, 157, 626, n - 1):
        check(x, k, absolute, backend="triton", mask=False)
    check(x, 100, absolute, backend="triton", mask=True)


@triton_only
@pytest.mark.parametrize("dtype", KERNEL_FLOATS)
def test_triton_dead_entries_signed(dtype):
    n = 20_000
    x = torch.full((n,), -INF, dtype=dtype)
    x[::97] = 1.0
    x[5::101] = -0.0
    for k in (1, 150, 300, 5000):
        check(x, k, absolute=False, backend="triton", mask=False)


@triton_only
def test_triton_requires_grad_and_input_untouched():
    x = torch.randn(3001, generator=torch.Generator().manual_seed(4), requires_grad=True)
    before = x.detach().clone()
    check(x, 37, absolute=False, backend="triton")
    assert torch.equal(x.detach(), before)


# ---------------------------------------------------------------- sparsify_grads_


def _params(dtypes, sizes, seed):
    gen = torch.Generator().manual_seed(seed)
    ps, rs = [], []
    for dt, shape in zip(dtypes, sizes):
        p = torch.nn.Parameter(torch.randn(shape, generator=gen).to(dt))
        p.grad = (3 * torch.randn(shape, generator=gen)).to(dt)
        ps.append(p)
        rs.append(torch.randn(shape, generator=gen).to(dt))
    return ps, rs


@settings(max_examples=25, deadline=None)
@given(
    dtypes=st.lists(st.sampled_from(FLOATS), min_size=1, max_size=4),
    k=st.integers(1, 400),
    scope=st.sampled_from(["global", "layer"]),
    seed=st.integers(0, 2**16),
)
def test_sparsify_conserves_mass_exactly(dtypes, k, scope, seed):
    sizes = [(3, 7), (50,), (2, 2, 5), (1,)][: len(dtypes)]
    ps, rs = _params(dtypes, sizes, seed)
    a = [(r + p.grad) for p, r in zip(ps, rs)]  # each in its own dtype
    total = sum(p.numel() for p in ps)
    limit = total if scope == "global" else max(p.numel() for p in ps)
    if k > limit:  # every step would be dense: refused, nothing touched
        with pytest.raises(ValueError, match=f"k={k} is larger than"):
            gradsift.sparsify_grads_(ps, k=k, residuals=rs, scope=scope)
        assert all(torch.equal(r + p.grad, ai) for p, r, ai in zip(ps, rs, a))
        k = limit
    kept = gradsift.sparsify_grads_(ps, k=k, residuals=rs, scope=scope)
    nonzero = 0
    for p, r, ai in zip(ps, rs, a):
        assert p.grad.dtype == ai.dtype and r.dtype == ai.dtype
        assert torch.equal(p.grad + r, ai)
        assert not ((p.grad != 0) & (r != 0)).any()
        nonzero += int((p.grad != 0).sum())
    if scope == "global":
        assert kept == min(k, total)
    else:
        assert kept == sum(min(k, p.numel()) for p in ps)
    assert nonzero <= kept


def test_sparsify_layer_scope_selects_per_tensor():
    a = torch.nn.Parameter(torch.zeros(4))
    b = torch.nn.Parameter(torch.zeros(6))
    a.grad = torch.tensor([100.0, 200.0, -300.0, 400.0])
    b.grad = torch.tensor([0.1, -0.6, 0.3, 0.5, -0.2, 0.6])
    assert gradsift.sparsify_grads_([a, b], k=2, scope="layer") == 4
    assert a.grad.tolist() == [0.0, 0.0, -300.0, 400.0]
    assert torch.equal(b.grad, torch.tensor([0.0, -0.6, 0.0, 0.0, 0.0, 0.6]))
    # global: all four from a
    a.grad = torch.tensor([100.0, 200.0, -300.0, 400.0])
    b.grad = torch.tensor([0.1, -0.6, 0.3, 0.5, -0.2, 0.6])
    assert gradsift.sparsify_grads_([a, b], k=2) == 2
    assert a.grad.tolist() == [0.0, 0.0, -300.0, 400.0] and not b.grad.any()


def test_sparsify_density_rounding_per_layer():
    ps = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 10, 100)]
    for p in ps:
        p.grad = torch.arange(1.0, p.numel() + 1)
    assert gradsift.sparsify_grads_(ps, density=0.25, scope="layer") == 1 + 2 + 25
    assert [int((p.grad != 0).sum()) for p in ps] == [1, 2, 25]


def test_sparsify_nan_leaves_everything_untouched():
    ps, rs = _params([torch.float32, torch.float16], [(10,), (10,)], 0)
    ps[1].grad[3] = float("nan")
    before = [p.grad.clone() for p in ps] + [r.clone() for r in rs]
    with pytest.raises(ValueError, match="NaN"):
        gradsift.sparsify_grads_(ps, k=3, residuals=rs)
    after = [p.grad for p in ps] + rs
    assert all(torch.equal(u.nan_to_num(), v.nan_to_num()) for u, v in zip(after, before))


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(k=0), ValueError),
        (dict(density=0.0), ValueError),
        (dict(density=1.5), ValueError),
        (dict(k=1, density=0.5), ValueError),
        (dict(), ValueError),
        (dict(k=True), TypeError),
        (dict(k=2.0), TypeError),
    ],
)
def test_sparsify_bad_budget(kwargs, error):
    p = torch.nn.Parameter(torch.zeros(5))
    p.grad = torch.ones(5)
    with pytest.raises(error):
        gradsift.sparsify_grads_([p], **kwargs)
    assert torch.equal(p.grad, torch.ones(5))


# ---------------------------------------------------------------- Budget


@pytest.mark.parametrize(
    "n, density, expected",
    [(5, 0.5, 2), (10, 0.25, 2), (3, 0.5, 2), (10, 0.35, 4), (100, 0.07, 7), (100, 0.29, 29)]
    + [(100, 0.57, 57), (10, 1e-9, 1), (7, 1.0, 7), (1, 0.01, 1)],
)
def test_resolve_density_rounds_as_documented(n, density, expected):
    # documented: round(density * n) (Python's round: halves to even), at least 1
    assert resolve_k(n, density=density) == expected == max(1, min(n, round(density * n)))


def test_budget_k_is_capped_and_check_fits_names_the_argument():
    assert Budget(k=11).resolve(10) == 10
    assert resolve_k(10, k=np.int64(3)) == 3
    with pytest.raises(ValueError, match=r"k=11 .*larger than the 10 coordinates"):
        Budget(k=11).check_fits(10, "the 10 coordinates")
    Budget(k=10).check_fits(10, "x")
    Budget(density=1.0).check_fits(1, "x")
    with pytest.raises(ValueError, match="density"):
        Budget(density=float("nan"))
    with pytest.raises(ValueError, match="k must be >= 1"):
        Budget(k=0)


@pytest.mark.parametrize(
    "n, sparsity, expected", [(5, 0.5, 3), (10, 0.25, 8), (3, 0.5, 1), (10, 0.0, 10), (10, 1.0, 0)]
)
def test_kept_count(n, sparsity, expected):
    assert kept_count(n, sparsity) == expected

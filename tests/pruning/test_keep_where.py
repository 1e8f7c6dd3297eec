"""``keep_where``/``keep_where_`` against ``torch.where``: bit for bit, with gradients."""

from unittest import mock

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gradsift.pruning import keep_where as kw
from gradsift.pruning.keep_where import keep_where, keep_where_

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
INTS = {torch.float64: torch.int64, torch.float32: torch.int32}
INTS.update({torch.float16: torch.int16, torch.bfloat16: torch.int16})


def specials(n: int, dtype, seed: int = 0) -> torch.Tensor:
    """Normal values with NaN (two payloads), -0.0, +-inf and subnormals planted."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen).to(dtype)
    bits = x.view(INTS[dtype])
    x[::7] = float("nan")
    bits[3::29] |= 1  # another NaN payload, if the value was NaN, else a last-bit change
    x[1::11] = -0.0
    x[2::13] = float("inf")
    x[4::17] = float("-inf")
    x[5::19] = torch.finfo(dtype).tiny / 4
    return x


def same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(INTS[a.dtype]), b.view(INTS[b.dtype]))


def _count_bitwise(monkeypatch) -> list:
    calls = []
    real = kw._bitwise
    monkeypatch.setattr(kw, "_bitwise", lambda *a: calls.append(a[0].numel()) or real(*a))
    return calls


@pytest.fixture
def bitwise_calls(monkeypatch):
    """Counts the integer route's calls, so that each test proves it ran; it takes
    tensors of any size here (``MIN_NUMEL`` 0)."""
    monkeypatch.setattr(kw, "MIN_NUMEL", 0)
    return _count_bitwise(monkeypatch)


def test_tensors_below_one_chunk_take_torch_where(monkeypatch):
    # the route's fixed cost exceeds torch's loop there: LeNet-5's pruned training
    # step spent a third of its time in it
    calls = _count_bitwise(monkeypatch)
    for n in (1000, kw.MIN_NUMEL - 1):
        x = torch.randn(n, requires_grad=True)
        keep = torch.rand(n) > 0.5
        keep_where(x, keep).backward(torch.randn(n))
        keep_where_(x.detach().clone(), keep)
    assert calls == []
    x = torch.randn(kw.MIN_NUMEL, requires_grad=True)
    keep_where(x, torch.rand(kw.MIN_NUMEL) > 0.5).backward(torch.randn(kw.MIN_NUMEL))
    assert calls == [kw.MIN_NUMEL] * 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 1000, kw.CHUNK + 3])
def test_equals_torch_where_bit_for_bit(dtype, n, bitwise_calls):
    x = specials(n, dtype).reshape(-1, 1) if n else specials(n, dtype)
    keep = torch.rand(x.shape, generator=torch.Generator().manual_seed(1)) > 0.4
    same_bits(keep_where(x, keep), torch.where(keep, x, 0))
    for value in (0.0, -3.5, float(torch.finfo(dtype).min)):
        ref = torch.where(keep, x, torch.tensor(value, dtype=dtype))
        y = x.clone()
        assert keep_where_(y, keep, value) is y
        same_bits(y, ref)
    assert len(bitwise_calls) == 4


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 3 * kw.CHUNK // 2),
    dtype=st.sampled_from(DTYPES),
    density=st.floats(0.0, 1.0),
    value=st.sampled_from([0.0, -0.0, 1.0, -1e4, float("inf")]),
    seed=st.integers(0, 2**31 - 1),
)
def test_matches_torch_where_property(n, dtype, density, value, seed):
    x = specials(n, dtype, seed)
    keep = torch.rand(n, generator=torch.Generator().manual_seed(seed)) < density
    want = torch.where(keep, x, torch.tensor(value, dtype=dtype))
    with mock.patch.object(kw, "MIN_NUMEL", 0):  # the integer route at every size
        same_bits(keep_where_(x.clone(), keep, value), want)


def test_boolean_target_and_other_layouts_fall_back_to_torch(bitwise_calls):
    mask = torch.rand(50, 40) > 0.5
    keep = torch.rand(50, 40) > 0.5
    assert torch.equal(keep_where_(mask.clone(), keep), mask & keep)
    x = specials(2000, torch.float32).reshape(40, 50).t()  # not contiguous
    same_bits(keep_where(x, keep), torch.where(keep, x, 0))
    y = x.clone()  # contiguous target, broadcast mask
    same_bits(keep_where_(y, keep[:1].expand(50, 40)), torch.where(keep[:1], x, 0))
    assert bitwise_calls == []


def grads(fn, x, keep):
    """Value, gradient and second derivative of ``sum(fn(x, keep) ** 3)``."""
    x = x.detach().requires_grad_()
    out = fn(x, keep)
    (g,) = torch.autograd.grad(out.pow(3).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    (plain,) = torch.autograd.grad(fn(x, keep).mul(2.0).sum(), x)
    return out.detach(), g.detach(), h, plain


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gradients_first_and_second_equal_torch_where(dtype, bitwise_calls):
    x = torch.randn(300, 7, dtype=dtype, generator=torch.Generator().manual_seed(5))
    keep = torch.rand(300, 7, generator=torch.Generator().manual_seed(6)) > 0.5
    got = grads(keep_where, x, keep)
    want = grads(lambda t, m: torch.where(m, t, 0), x, keep)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert len(bitwise_calls) >= 3  # two forwards and the plain backward


def test_forward_mode_and_torch_func():
    x = torch.randn(64, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    keep = torch.rand(64, 5, generator=torch.Generator().manual_seed(3)) > 0.5
    t = torch.randn(64, 5, dtype=torch.float64)
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        out = keep_where(fwad.make_dual(x, t), keep)
        torch.testing.assert_close(fwad.unpack_dual(out).tangent, torch.where(keep, t, 0))
    _, jvp = torch.func.jvp(lambda v: keep_where(v, keep), (x,), (t,))
    torch.testing.assert_close(jvp, torch.where(keep, t, 0), rtol=0, atol=0)
    g = torch.func.grad(lambda v: keep_where(v, keep).square().sum())(x)
    torch.testing.assert_close(g, torch.where(keep, 2 * x, 0), rtol=0, atol=0)

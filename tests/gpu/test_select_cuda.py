"""The selection on a real GPU: beyond 2**31 elements, CUDA graph capture, and the
default backend. Skipped where torch sees no CUDA device (CI has none); the Triton
tests of ``tests/test_topk_triton.py`` run here too, compiled instead of interpreted."""

import pytest
import torch
import triton
import triton.language as tl

from gradsift import topk_indices
from gradsift.select import dispatch
from gradsift.select.triton.radix import histogram

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (CI runs on CPU only)"
)


def reference_big(x: torch.Tensor, k: int) -> torch.Tensor:
    """Lowest-index ties at the cut, counted chunk by chunk (no nonzero over 2**31)."""
    key = x.abs()
    v = torch.topk(key, k).values[-1]
    above, ties = [], []
    for s in range(0, key.numel(), 1 << 30):
        c = key[s : s + (1 << 30)]
        above.append(torch.nonzero(c > v).squeeze(1) + s)
        ties.append(torch.nonzero(c == v).squeeze(1) + s)
    above, ties = torch.cat(above), torch.cat(ties)
    return torch.sort(torch.cat([above, ties[: k - above.numel()]])).values


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_beyond_2_31_elements_planted_values_found(dtype):
    n = 2**31 + 2**24
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, generator=gen, device="cuda", dtype=dtype)
    planted = torch.tensor([5, 2**31 - 1, 2**31, 2**31 + 12345, n - 1], device="cuda")
    x[planted] = torch.tensor([60.0, -61.0, 62.0, -63.0, 64.0], device="cuda", dtype=dtype)
    got = topk_indices(x, 1000)
    assert set(planted.tolist()) <= set(got.tolist())
    torch.testing.assert_close(got, reference_big(x, 1000), rtol=0, atol=0)
    top = topk_indices(x, 5)
    assert top.tolist() == sorted(planted.tolist())


def test_a_selection_of_fixed_shape_is_captured_and_replayed():
    from gradsift.select.triton.topk import Selection

    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(3_000_000, generator=gen, device="cuda")
    sel = Selection()
    sel.run(x, 3000)  # compiles and allocates outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sel.run(x, 3000)
    for seed in (2, 3):
        x.copy_(torch.randn(x.numel(), generator=gen.manual_seed(seed), device="cuda"))
        graph.replay()
        expected = torch.sort(torch.topk(x.abs(), 3000).indices).values
        torch.testing.assert_close(sel.indices, expected, rtol=0, atol=0)


def test_auto_is_the_default_and_picks_triton_on_cuda():
    x = torch.randn(10, device="cuda")
    assert dispatch.use_triton(x, "auto") == dispatch.triton_available()
    assert not dispatch.use_triton(x.double(), "auto")
    assert not dispatch.use_triton(x.cpu(), "auto")


@pytest.mark.parametrize("absolute", [True, False])
def test_torch_path_on_cuda_is_exact(absolute):
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(5_000_000, generator=gen, device="cuda").to(torch.bfloat16)  # many ties
    for k in (1, 5000, 50_000, 2_000_000):
        got = topk_indices(x, k, absolute=absolute, backend="torch")
        want = topk_indices(x.cpu(), k, absolute=absolute)
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@triton.jit
def _histogram_of_a_reshaped_tile(d_ptr, n, p, out_ptr):
    # at module scope: a kernel resolves the helpers it calls through its globals
    idx = tl.arange(0, 128)[:, None] * 32 + tl.arange(0, 32)[None, :]
    valid2 = idx < n
    d2 = tl.load(d_ptr + idx, mask=valid2, other=0).to(tl.uint32)
    key = tl.reshape(d2 << 24, (4096,))
    valid = tl.reshape(valid2, (4096,))
    prefix = tl.full([], 0, tl.uint32)
    tl.store(out_ptr + tl.arange(0, 256), histogram(key, valid, prefix, p, 32))


def test_histogram_helper_on_a_tile_reshaped_from_2d():
    # the root cause of the signed-selection bug on triton 3.6 / sm_90: tl.histogram's
    # mask= paired with the wrong lanes of a tile reshaped from 2-D (12 of 16 valid
    # keys landed in bin 0). gradsift's helper never passes mask=; it must count
    # exactly on such a tile too.
    gen = torch.Generator().manual_seed(5)
    for n in (16, 1000, 4096):
        d = torch.randint(1, 256, (4096,), generator=gen, dtype=torch.int32)
        out = torch.zeros(256, dtype=torch.int32, device="cuda")
        _histogram_of_a_reshaped_tile[(1,)](d.cuda(), n, 0, out)
        expected = torch.bincount(d[:n].long(), minlength=256).int()
        torch.testing.assert_close(out.cpu(), expected, rtol=0, atol=0)

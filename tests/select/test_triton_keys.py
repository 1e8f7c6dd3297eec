"""``select.triton.keys.rounded``: float32 to bfloat16 as torch rounds, on the bits.

The rounding is written on the bits (the interpreter truncates a cast), so its special
cases are this code's own: NaN of any payload, the carry into the exponent at float32's
top, ties to even, subnormals and signed zero. On a GPU every arithmetic NaN is
``0x7FFFFFFF``, whose rounding bias once carried into the sign bit and gave ``-0.0``.
"""

import torch
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import triton_support  # noqa: F401  (the interpreter where there is no GPU)
from gradsift.select.triton.keys import rounded  # noqa: E402
from triton_support import DEVICE

BITS = [
    0x7FFFFFFF, 0xFFFFFFFF, 0x7FFF8001, 0x7FC00000, 0xFFC00000, 0x7F800001,  # NaN
    0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x7F7F7FFF,  # inf, the carry into inf, max
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF,  # ties to even, just off them
    0x00000001, 0x00008000, 0x00018000, 0x80000000, 0x00000000,  # subnormal, zeros
]  # fmt: skip


@triton.jit
def _round_kernel(x_ptr, out_ptr, n, block: tl.constexpr):
    i = tl.arange(0, block)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    tl.store(out_ptr + i, rounded(x, tl.bfloat16), mask=i < n)


def test_rounding_to_bfloat16_equals_torchs_on_every_special_case():
    x = torch.tensor(BITS, dtype=torch.int64).to(torch.int32).view(torch.float32)
    out = torch.empty(len(BITS), dtype=torch.bfloat16, device=DEVICE)
    _round_kernel[(1,)](x.to(DEVICE), out, len(BITS), block=32)
    want = x.to(torch.bfloat16)
    got = out.cpu()
    nan = torch.isnan(want)
    lost = [hex(b) for b, g, w in zip(BITS, got.tolist(), nan.tolist()) if w and g == g]
    assert torch.equal(torch.isnan(got), nan), f"NaN rounded to a number: {lost}"
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))

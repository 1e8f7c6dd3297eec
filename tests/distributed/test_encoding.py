"""Wire formats: every encoding decodes to exactly what was encoded, sizes are what
the docs say, and "auto" picks the smallest."""

import torch
from hypothesis import given, settings, strategies as st

from gradsift.distributed.encoding import ENCODINGS, choose, decode, encode, message_bytes


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300_000),
    frac=st.floats(0.0, 1.0),
    encoding=st.sampled_from([e for e in ENCODINGS if e != "auto"]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**31 - 1),
)
def test_round_trip(n, frac, encoding, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    k = max(1, min(n, round(frac * n)))
    idx = torch.sort(torch.randperm(n, generator=gen)[:k]).values
    values = torch.randn(k, generator=gen).to(dtype)
    message = encode(idx, values, n, encoding)
    assert message.dtype == torch.uint8 and message.numel() == message_bytes(encoding, n, k, dtype)
    got_idx, got_values = decode(message, n, k, encoding, dtype)
    assert torch.equal(got_idx, idx) and torch.equal(got_values, values)


def test_bytes_per_coordinate():
    n = 11_689_512  # ResNet-18
    for density, at_most in ((0.01, 6), (0.001, 6)):
        k = round(density * n)
        best = choose("auto", n, k)
        assert message_bytes(best, n, k, torch.bfloat16) / k <= at_most
        assert message_bytes("int64", n, k, torch.float32) / k >= 12
        sizes = {e: message_bytes(e, n, k, torch.bfloat16) for e in ENCODINGS if e != "auto"}
        assert sizes[best] == min(sizes.values())
    assert choose("auto", 1000, 500) == "bitmap"  # high density: one bit per coordinate

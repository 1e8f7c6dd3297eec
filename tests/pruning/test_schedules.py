"""Sparsity schedules: exponential and linear rounds ending on the target."""

import pytest
import torch

from gradsift.pruning.schedules import round_sparsities


def test_round_sparsities():
    s = round_sparsities(0.99, 4, "exponential")
    torch.testing.assert_close(
        torch.tensor(s, dtype=torch.float64),
        1 - torch.tensor([0.01 ** (i / 4) for i in range(1, 5)], dtype=torch.float64),
    )
    assert round_sparsities(0.5, 2, "linear") == [0.25, 0.5]
    with pytest.raises(ValueError, match="schedule"):
        round_sparsities(0.5, 2, "cosine")
    with pytest.raises(ValueError, match="iterations"):
        round_sparsities(0.5, 0, "linear")

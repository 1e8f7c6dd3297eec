"""GraSP's class-balanced sample."""

import pytest
import torch

from gradsift.pruning import class_balanced_sample


def test_class_balanced_sample_in_class_order():
    data = [(torch.arange(6.0).view(6, 1), torch.tensor([2, 0, 1, 0, 2, 1])) for _ in range(2)]
    x, y = class_balanced_sample(data, 2, 3)
    assert y.tolist() == [0, 0, 1, 1, 2, 2]
    assert x.flatten().tolist() == [1.0, 3.0, 2.0, 5.0, 0.0, 4.0]


def test_missing_class_names_it():
    data = [(torch.zeros(4, 1), torch.tensor([0, 0, 1, 1]))]
    with pytest.raises(ValueError, match=r"classes \[2\] \(found \[0\]\)"):
        class_balanced_sample(data, 1, 3)
    with pytest.raises(ValueError, match="samples_per_class must be >= 1"):
        class_balanced_sample(data, 0, 3)

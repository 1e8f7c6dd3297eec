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


def test_missing_class_on_an_endless_iterator_raises():
    """Issue 15, case 16: an iterator without ``len`` is searched for a bounded number
    of batches (``max_batches``), then the missing classes are named."""

    def endless(limit=100_000):
        for _ in range(limit):
            yield torch.zeros(4, 1), torch.tensor([0, 0, 1, 1])
        raise AssertionError(f"the class search read {limit} batches without giving up")

    with pytest.raises(ValueError, match=r"classes \[2\] \(found \[0\]\) in 1000 batches"):
        class_balanced_sample(endless(), 1, 3)
    with pytest.raises(ValueError, match=r"in 7 batches.*max_batches"):
        class_balanced_sample(endless(), 1, 3, max_batches=7)
    data = [(torch.zeros(4, 1), torch.tensor([0, 0, 1, 1]))] * 3 + [
        (torch.ones(2, 1), torch.tensor([2, 2]))
    ]
    x, y = class_balanced_sample(data, 1, 3)  # a list is read to its end
    assert y.tolist() == [0, 1, 2] and x.flatten().tolist() == [0.0, 0.0, 1.0]

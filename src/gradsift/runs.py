"""One experiment run (data, model, prune, train -> a result record), and sweeps of
them that resume: finished runs are skipped and each result is saved atomically."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field

import torch

from gradsift.data import load_dataset
from gradsift.io import atomic_write_json, read_json
from gradsift.models import build_model
from gradsift.pruning import prune_at_init, sparsity_report
from gradsift.train import TrainConfig, train

__all__ = ["RunSpec", "prune_for_run", "prune_for_spec", "run_one", "run_sweep", "load_results"]

log = logging.getLogger(__name__)


@dataclass
class RunSpec:
    """Everything that defines one run; ``key()`` identifies it for resuming."""

    model: str = "lenet5"
    dataset: str = "digits"
    method: str | None = None  # None: no pruning
    sparsity: float = 0.0
    iterations: int = 1
    shuffle: bool = False
    seed: int = 0
    train: TrainConfig = field(default_factory=TrainConfig)
    data_root: str | None = None

    def key(self) -> str:
        t = self.train
        return (
            f"{self.model}|{self.dataset}|{self.method}|{self.sparsity:g}|{self.iterations}|"
            f"{int(self.shuffle)}|{self.seed}|{t.epochs}|{t.density}|{t.k}|"
            f"{int(t.error_feedback)}|{t.lr:g}|{t.batch_size}"
        )


def prune_for_run(
    model,
    ds,
    method: str,
    sparsity: float,
    *,
    iterations: int = 1,
    seed: int = 0,
    shuffle: bool = False,
) -> dict:
    """Prune ``model`` at init on ``ds``'s training set as every run does; the masks.

    One definition for ``run_one``, data-parallel training and ``gradsift prune``:
    seeded batches of 128, GraSP on 10 samples per class (digits' train split holds at
    least 120 of each), random scores and mask shuffling seeded by ``seed``.
    """
    batches = torch.utils.data.DataLoader(
        ds.train,
        batch_size=128,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    options: dict = {}
    if method == "grasp":
        options = {"samples_per_class": 10, "num_classes": ds.num_classes}
    elif method == "random":
        options = {"seed": seed}
    return prune_at_init(
        model,
        method,
        sparsity,
        batches,
        iterations=iterations,
        shuffle=shuffle,
        generator=torch.Generator().manual_seed(seed),
        **options,
    )


def prune_for_spec(model: torch.nn.Module, ds, spec: RunSpec) -> None:
    """``prune_for_run`` with ``spec``'s method, sparsity, iterations, seed and shuffle
    (nothing when ``spec.method`` is None): the pruning of every training run."""
    if spec.method is not None:
        prune_for_run(
            model,
            ds,
            spec.method,
            spec.sparsity,
            iterations=spec.iterations,
            seed=spec.seed,
            shuffle=spec.shuffle,
        )


def run_one(spec: RunSpec, *, progress: bool = False) -> dict:
    """Build, prune (if ``spec.method``), train and evaluate; return a flat record."""
    torch.manual_seed(spec.seed)
    ds = load_dataset(spec.dataset, root=spec.data_root, seed=0)
    model = build_model(spec.model, input_shape=ds.input_shape, num_classes=ds.num_classes)
    start = time.perf_counter()
    prune_for_spec(model, ds, spec)
    prune_seconds = time.perf_counter() - start
    report = sparsity_report(model)
    cfg = TrainConfig(**{**asdict(spec.train), "seed": spec.seed})
    result = train(model, ds.train, ds.test, cfg, progress=progress)
    return {
        "key": spec.key(),
        "model": spec.model,
        "dataset": spec.dataset,
        "method": spec.method or "unpruned",
        "sparsity": spec.sparsity,
        "iterations": spec.iterations,
        "shuffle": spec.shuffle,
        "seed": spec.seed,
        "grad_density": cfg.density if cfg.density is not None else 1.0,
        "error_feedback": cfg.error_feedback,
        "epochs": cfg.epochs,
        "kept": report.kept,
        "total": report.total,
        "collapsed": report.collapsed,
        "test_accuracy": result["test_accuracy"],
        "test_loss": result["test_loss"],
        "history": result["history"],
        "prune_seconds": prune_seconds,
        "seconds": prune_seconds + result["seconds"],
    }


def load_results(path) -> list[dict]:
    data = read_json(path, default={"runs": []})
    return data.get("runs", [])


def run_sweep(specs: list[RunSpec], path, *, progress: bool = False, on_result=None):
    """Run every spec not already in ``path``; rewrite ``path`` atomically after each.

    Returns all results (old and new). Interrupting leaves ``path`` valid JSON holding
    every finished run, so the same call resumes where it stopped.
    """
    results = load_results(path)
    done = {r["key"] for r in results}
    for spec in specs:
        if spec.key() in done:
            log.info("skip finished run %s", spec.key())
            continue
        record = run_one(spec, progress=progress)
        results.append(record)
        done.add(record["key"])
        atomic_write_json(path, {"runs": results})
        if on_result is not None:
            on_result(record)
    return results

"""Accuracy vs sparsity on the embedded digits: LeNet-5, every method, 3 seeds, real
and layer-wise shuffled masks (Frankle et al. 2021, arXiv:2009.08576)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from gradsift.lab.specs import RunSpec
from gradsift.lab.studies.common import accuracy_cell, paper_rounds, study_runs, training_result
from gradsift.lab.tables import Column, render
from gradsift.lab.training import TrainConfig

METHODS = ["random", "magnitude", "snip", "grasp", "synflow"]


def accuracy(out: Path, *, quick: bool = False, jobs: int = 1):
    from gradsift.lab.plots import plot_accuracy_vs_sparsity

    sparsities = [0.5, 0.9] if quick else [0.5, 0.8, 0.9, 0.95, 0.98, 0.99]
    seeds = [0] if quick else [0, 1, 2]
    epochs = 1 if quick else 15
    specs = [
        RunSpec(
            method=m,
            sparsity=s,
            seed=seed,
            shuffle=shuffle,
            iterations=paper_rounds(m, quick),
            train=TrainConfig(epochs=epochs),
        )
        for m in METHODS
        for s in sparsities
        for seed in seeds
        for shuffle in (False, True)
    ]
    runs = study_runs(specs, out / "accuracy_runs.json", jobs=jobs)
    plot_accuracy_vs_sparsity(
        runs, out / "accuracy.png", title="LeNet-5 on digits (dashed: layer-wise shuffled masks)"
    )
    cells = defaultdict(list)
    for r in runs:
        cells[(r["method"], r["shuffle"], r["sparsity"])].append(r)
    table = []
    for m in METHODS:
        for shuffle in (False, True):
            row = [m + (" (shuffled)" if shuffle else "")]
            for s in sparsities:
                row.append(accuracy_cell(cells[(m, shuffle, s)]))
            table.append(row)
    columns = [Column(0, "method")]
    columns += [Column(i + 1, f"{100 * s:g}%") for i, s in enumerate(sparsities)]
    result = training_result("accuracy", quick, epochs, seeds, runs)
    return result, render(table, columns, markdown=True)

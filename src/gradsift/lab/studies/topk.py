"""Dense vs top-k sparse training, with and without error feedback: the MLP
(LeNet-300-100) on the embedded digits, unpruned, 3 seeds."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from gradsift.lab.specs import RunSpec
from gradsift.lab.studies.common import accuracy_cell, mean_accuracy, study_runs, training_result
from gradsift.lab.tables import Column, render
from gradsift.lab.training import TrainConfig


def topk(out: Path, *, quick: bool = False, jobs: int = 1):
    from gradsift.lab.plots import plot_bars

    seeds = [0] if quick else [0, 1, 2]
    epochs = 1 if quick else 20
    configs = [(None, True)] + [(d, ef) for d in (0.1, 0.01, 0.001) for ef in (True, False)]
    specs = [
        RunSpec(
            model="mlp", seed=seed, train=TrainConfig(epochs=epochs, density=d, error_feedback=ef)
        )
        for d, ef in configs
        for seed in seeds
    ]
    runs = study_runs(specs, out / "topk_runs.json", jobs=jobs)
    cells = defaultdict(list)
    for r in runs:
        cells[(r["grad_density"], r["error_feedback"])].append(r)
    labels, means, table = [], [], []
    for d, ef in configs:
        records = cells[(1.0 if d is None else d, ef)]
        label = "dense" if d is None else f"{100 * d:g}%" + (" +EF" if ef else " no EF")
        labels.append(label.replace(" ", "\n", 1))
        means.append(mean_accuracy(records))
        table.append([label, accuracy_cell(records)])
    plot_bars(
        labels,
        means,
        out / "topk.png",
        ylabel="test accuracy (%)",
        title=f"MLP on digits, {epochs} epochs: top-k gradient density",
        ymin=0.0 if quick else 90.0,
    )
    result = training_result("topk", quick, epochs, seeds, runs)
    columns = [Column(0, "gradients"), Column(1, "test accuracy (%)")]
    return result, render(table, columns, markdown=True)

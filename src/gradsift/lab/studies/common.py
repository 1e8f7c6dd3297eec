"""What the studies share: the machine line, training-study JSON, mean ± std, accuracy cells."""

from __future__ import annotations

import platform
import statistics

import torch

from gradsift.lab.records import diverged
from gradsift.lab.runs import run_sweep
from gradsift.pruning import get_method

__all__ = [
    "machine",
    "training_result",
    "mean_std",
    "mean_accuracy",
    "accuracy_cell",
    "diverged_note",
    "paper_rounds",
    "study_runs",
]


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )


def training_result(study: str, quick: bool, epochs: int, seeds: list, runs: list) -> dict:
    """The JSON of a training study: its runs without per-epoch histories."""
    runs = [{k: v for k, v in r.items() if k != "history"} for r in runs]
    return {
        "study": study,
        "quick": quick,
        "epochs": epochs,
        "seeds": seeds,
        "runs": runs,
        "machine": machine(),
    }


def mean_std(values) -> tuple[float, float]:
    return statistics.mean(values), (statistics.pstdev(values) if len(values) > 1 else 0.0)


def mean_accuracy(records) -> float:
    """Mean test accuracy of the runs, in %."""
    return statistics.mean(100 * r["test_accuracy"] for r in records)


def accuracy_cell(records, *, error: bool = False) -> str:
    """Mean ± std of the runs' test accuracy (or error) in %, naming how many diverged:
    a diverged run's accuracy is a constant-output network's, not a result. One run
    is its value alone (no spread to show)."""
    if not records:
        return ""
    values = [100 * r["test_accuracy"] for r in records]
    mean, std = mean_std([100 - v for v in values] if error else values)
    spread = f" ± {std:.1f}" if len(records) > 1 else ""
    return f"{mean:.1f}{spread}" + diverged_note(records)


def diverged_note(records) -> str:
    """`` (n of m diverged)`` where some of ``records`` diverged, else empty."""
    bad = sum(diverged(r) for r in records)
    return f" ({bad} of {len(records)} diverged)" if bad else ""


def paper_rounds(method: str, quick: bool) -> int:
    """The pruning rounds of ``method``'s paper (SynFlow: 100); two in a quick form."""
    paper = get_method(method).paper_iterations
    return min(paper, 2) if quick else paper


def study_runs(specs: list, path, *, jobs: int = 1, on_result=None) -> list[dict]:
    """``run_sweep``, returning only the runs of ``specs``: a study's (or a sweep's)
    table, plot and JSON average what it asked for, not every run its results file
    holds (a ``--quick`` study shares the folder of the full one, sweeps share
    ``--out``'s default)."""
    asked = {s.key() for s in specs}
    runs = run_sweep(specs, path, jobs=jobs, on_result=on_result)
    return [r for r in runs if r["key"] in asked]

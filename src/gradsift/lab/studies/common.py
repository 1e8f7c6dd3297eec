"""What the studies share: the machine line, training-study JSON, mean ± std."""

from __future__ import annotations

import platform
import statistics

import torch

from gradsift.pruning import get_method

__all__ = ["machine", "training_result", "mean_std", "paper_rounds"]


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


def paper_rounds(method: str, quick: bool) -> int:
    """The pruning rounds of ``method``'s paper (SynFlow: 100); two in a quick form."""
    paper = get_method(method).paper_iterations
    return min(paper, 2) if quick else paper

"""Sparsity schedules for pruning in rounds.

Round ``i`` of ``n`` keeps density ``ρ^(i/n)`` (``"exponential"``: SynFlow, Tanaka et
al. 2020, arXiv:2006.05467, Alg. 1; FORCE's ``exp`` mode, de Jorge et al. 2021,
arXiv:2006.09081) or removes ``s·i/n`` (``"linear"``); the last round lands exactly
on the target.
"""

from __future__ import annotations

from gradsift.checks import check_choice, check_int

__all__ = ["SCHEDULES", "round_sparsities"]

SCHEDULES = ("exponential", "linear")


def round_sparsities(sparsity: float, iterations: int, schedule: str) -> list[float]:
    """Target sparsity after each round; the last is exactly ``sparsity``."""
    check_choice("schedule", schedule, SCHEDULES)
    iterations = check_int("iterations", iterations, minimum=1)
    density = 1.0 - sparsity
    out = []
    for i in range(1, iterations + 1):
        if schedule == "exponential":
            out.append(1.0 - density ** (i / iterations))
        else:
            out.append(sparsity * i / iterations)
    out[-1] = sparsity
    return out

"""Benchmarks as ratios measured in one run: ours vs baselines on the same inputs.

Each is ``(function, columns)`` by name, for ``gradsift bench NAME`` and the speed
study alike. Ratios are what to read; absolute times depend on the machine.
"""

from gradsift.lab.bench import (
    ddp_step,
    iteration,
    methods,
    prune_memory,
    scoring,
    selection,
    sharded_bytes,
    step,
    ties,
)

BENCHES = {
    "select": (selection.bench_select, selection.COLUMNS),
    "step": (step.bench_step, step.COLUMNS),
    "score": (scoring.bench_score, scoring.COLUMNS),
    "ddp": (ddp_step.bench_ddp, ddp_step.COLUMNS),
    "methods": (methods.bench_methods, methods.COLUMNS),
    "ties": (ties.bench_ties, ties.COLUMNS),
    "iteration": (iteration.bench_iteration, iteration.COLUMNS),
    "prune-memory": (prune_memory.bench_prune_memory, prune_memory.COLUMNS),
    "sharded": (sharded_bytes.bench_sharded_bytes, sharded_bytes.COLUMNS),
}

__all__ = ["BENCHES"]

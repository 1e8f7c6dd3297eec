"""Every benchmark of ``gradsift bench`` in one study; ``--quick`` runs every one
of them on tiny sizes with one repeat (the DDP bench with two of its hooks)."""

from __future__ import annotations

from pathlib import Path

from gradsift.lab.bench import BENCHES
from gradsift.lab.bench.prune_memory import ANCHOR
from gradsift.lab.studies.common import machine
from gradsift.lab.tables import render

_QUICK = {
    "select": {"sizes": (200_000,), "repeats": 1},
    "step": {"shapes": [(300, 301), (5,), (40_000,)], "repeats": 1},
    "score": {"model": "lenet5", "samples_per_class": 2, "input_shape": (3, 8, 8), "repeats": 1},
    "ddp": {
        "model": "mlp",
        "steps": 5,
        "batch": 4,
        "variants": ("allreduce", "top-k 0.001 compact"),
    },
    "ties": {"n": 200_000, "repeats": 1, "shapes": [(300, 301), (5,), (40_000,)]},
    "methods": {
        "input_shape": (3, 8, 8),
        "batch_size": 8,
        "methods": ["snip", "synflow"],
        "iterations": 2,
    },
    "iteration": {"repeats": 1, "warmup": 1},
    "prune-memory": {"cases": (ANCHOR, "magnitude", "synflow"), "width": 256, "depth": 2},
    "sharded": {"sizes": (100_000,)},
}


def speed(out: Path, *, quick: bool = False):
    from gradsift.lab.plots import plot_bars

    results = {}
    md = []
    for name, (bench, columns) in BENCHES.items():
        results[name] = bench(**(_QUICK[name] if quick else {}))
        md.append(render(results[name], columns, markdown=True))
    select = results["select"]
    plot_bars(
        [f"select\nN={r['n'] / 1e6:g}M\nk={r['k']}" for r in select],
        [r["speedup_vs_topk"] for r in select],
        out / "speed.png",
        ylabel="torch.topk time / ours",
        title="Exact top-k: speed-up over torch.topk(x.abs(), k)",
    )
    return {"study": "speed", "quick": quick, **results, "machine": machine()}, "\n".join(md)

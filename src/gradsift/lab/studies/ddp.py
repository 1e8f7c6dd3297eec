"""Distributed top-k where bandwidth is the bottleneck (a private network namespace
with a shaped loopback, ``gradsift.lab.shaping``):

1. step time and bytes of every communication (``gradsift bench ddp``) for a
   ResNet-18-sized CIFAR net at 100 Mbit/s, 1 Gbit/s and 10 Gbit/s, two gloo ranks;
2. time to accuracy on the embedded digits at 100 Mbit/s, two ranks: dense
   allreduce, top-k 1% with DGC's recipe (``topk-dgc``), PowerSGD rank 4, and the
   same training in one process (no communication), 3 seeds, 20 epochs each; and the
   two compressors again at twice the epochs, since what a user compares is the wall
   time to the dense run's final accuracy, not the epochs (each of their steps costs a
   fraction of a dense one at this bandwidth).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from gradsift.lab.bench.ddp_step import COLUMNS, VARIANTS, bench_ddp
from gradsift.lab.launch import spawn
from gradsift.lab.runs import run_one
from gradsift.lab.shaping import rate_gbit, run_shaped
from gradsift.lab.specs import RunSpec
from gradsift.lab.studies.common import accuracy_cell, machine
from gradsift.lab.tables import Column, columns, render
from gradsift.lab.training import TrainConfig

_FULL = {
    "rates": ["100mbit", "1gbit", "10gbit"],
    "bench": {"model": "resnet18", "steps": 13, "batch": 8, "variants": list(VARIANTS)},
    "train_rate": "100mbit",
    "epochs": 20,
    "long_epochs": 40,
    "seeds": [0, 1, 2],
}
_QUICK = {
    "rates": ["1gbit"],
    "bench": {
        "model": "mlp",
        "steps": 5,
        "batch": 4,
        "variants": ["allreduce", "top-k 0.01 compact"],
    },
    "train_rate": "1gbit",
    "epochs": 1,
    "long_epochs": 2,
    "seeds": [0],
}
COMMS = ["allreduce", "topk-dgc", "powersgd"]


def _spec(comm: str | None, seed: int, epochs: int) -> RunSpec:
    density = 0.01 if comm == "topk-dgc" else None
    return RunSpec(
        model="mlp", seed=seed, train=TrainConfig(epochs=epochs, density=density, comm=comm)
    )


def train_runs(comms: list, seeds: list, epochs: int, long_epochs: int | None = None) -> list:
    """Every (comm, seed) on two ranks for ``epochs``, each seed in one process (comm
    "one process"), and every compressor (not allreduce) again for ``long_epochs``."""
    compressors = [c for c in comms if c != "allreduce"] if long_epochs else []
    records = []
    for seed in seeds:
        records.append({**run_one(_spec(None, seed, epochs)), "comm": "one process"})
        for comm in comms:
            records.append({**spawn(_spec(comm, seed, epochs), 2), "comm": comm})
        for comm in compressors:
            label = f"{comm}, {long_epochs} epochs"
            records.append({**spawn(_spec(comm, seed, long_epochs), 2), "comm": label})
    return records


def _step_seconds(record: dict) -> float:
    steps = math.ceil(1348 / record["world_size"] / 64)  # digits' training split, batch 64
    return record["history"][-1]["train_seconds"] / (len(record["history"]) * steps)


def _time_to(record: dict, target: float) -> float | None:
    """Training seconds until the test accuracy first reaches ``target``."""
    for h in record["history"]:
        if h["accuracy"] >= target:
            return h["train_seconds"]
    return None


def _summary(records: list[dict]) -> list[dict]:
    """One row per comm; "s to dense final acc" pairs each run with the allreduce run
    of its seed and is empty unless every seed got there."""
    dense = {r["seed"]: r for r in records if r["comm"] == "allreduce"}
    by_comm = defaultdict(list)
    for r in records:
        by_comm[r["comm"]].append(r)
    rows = []
    for comm, runs in by_comm.items():
        reach = [_time_to(r, dense[r["seed"]]["test_accuracy"]) for r in runs]
        rows.append(
            {
                "comm": comm,
                "epochs": len(runs[0]["history"]),
                "accuracy": accuracy_cell(runs),
                "step_ms": 1e3 * statistics.mean(_step_seconds(r) for r in runs),
                "train_s": statistics.mean(r["history"][-1]["train_seconds"] for r in runs),
                "to_dense_final_s": None if None in reach else statistics.mean(reach),
                "reached": f"{len(reach) - reach.count(None)} of {len(reach)}",
            }
        )
    return rows


SUMMARY = columns(
    """
    comm              communication
    epochs            epochs
    accuracy          test accuracy (%)
    step_ms           ms per step           .1f
    train_s           training s            .1f
    to_dense_final_s  s to dense final acc  .2f
    reached           seeds reaching it
    """
)


def ddp(out: Path, *, quick: bool = False):
    setting = _QUICK if quick else _FULL
    bench = [r for rate in setting["rates"] for r in bench_ddp(bandwidth=rate, **setting["bench"])]
    comms = COMMS[:2] if quick else COMMS
    kwargs = {k: setting[k] for k in ("seeds", "epochs", "long_epochs")} | {"comms": comms}
    records = run_shaped(setting["train_rate"], f"{__name__}:train_runs", kwargs)
    summary = _summary(records)
    _plot(bench, out / "ddp.png")
    result = {
        "study": "ddp",
        "quick": quick,
        "bench": bench,
        "train_rate": setting["train_rate"],
        "runs": [
            {k: v for k, v in r.items() if k != "history"} | {"history": r["history"]}
            for r in records
        ],
        "summary": summary,
        "machine": machine(),
    }
    link = [Column(lambda r: r.get("bandwidth"), "link")]
    md = (
        render(bench, link + COLUMNS, markdown=True)
        + "\n"
        + render(summary, SUMMARY, markdown=True)
    )
    return result, md


def _plot(rows: list[dict], path) -> None:
    from gradsift.lab.plots import figure, save

    plt = figure()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for hook in dict.fromkeys(r["hook"] for r in rows):
        points = sorted(
            (rate_gbit(r["bandwidth"]), r["step_ms"])
            for r in rows
            if r["hook"] == hook and "step_ms" in r
        )
        ax.plot(*zip(*points), marker="o", label=hook)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("emulated loopback bandwidth (Gbit/s)")
    ax.set_ylabel("median step time (ms)")
    ax.set_title("Two gloo ranks: step time vs bandwidth")
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=7)
    save(fig, path)
    plt.close(fig)

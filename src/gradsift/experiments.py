"""The studies behind ``docs/results.md``; each writes JSON, a PNG and a Markdown table.

``gradsift experiment NAME [--quick] [--out DIR]``; ``--quick`` is a reduced form of
the same code path that the tests run.

1. ``collapse``: layer collapse vs compression (Tanaka et al. 2020, arXiv:2006.05467,
   Fig. 1 setting: VGG-16-BN, CIFAR-100 shapes, no training).
2. ``accuracy``: accuracy vs sparsity on the embedded digits, every method, 3 seeds,
   plus layer-wise shuffled masks (Frankle et al. 2021, arXiv:2009.08576).
3. ``topk``: dense vs top-k sparse training, with and without error feedback.
4. ``speed``: the select, step, score and ddp benchmarks.
"""

from __future__ import annotations

import logging
import platform
import statistics
from collections import defaultdict
from pathlib import Path

import torch

from gradsift.data import loader, random_data
from gradsift.io import atomic_write_bytes, atomic_write_json
from gradsift.models import build_model
from gradsift.pruning import masks_from_scores, prune_at_init, score
from gradsift.runs import RunSpec, run_sweep
from gradsift.train import TrainConfig

__all__ = ["STUDIES", "run_study"]

log = logging.getLogger(__name__)

# log10 of the largest compression before layer collapse, read off Tanaka et al. Fig. 1
PAPER_COLLAPSE = {"random": 3.25, "magnitude": 2.75, "snip": 3.5, "grasp": 3.5, "synflow": 6.0}


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )


def _collapsed(masks: dict) -> list[str]:
    return [name for name, m in masks.items() if not bool(m.any())]


def collapse(out: Path, *, quick: bool = False) -> dict:
    """Largest compression with no layer fully pruned, per method, with/without guard."""
    if quick:
        model_name, shape, classes, per_class, iters, decades = "vgg11_bn", (3, 8, 8), 10, 4, 5, 3
    else:
        model_name, shape, classes, per_class, iters, decades = (
            "vgg16_bn",
            (3, 32, 32),
            100,
            10,
            100,
            6,
        )
    torch.manual_seed(0)
    model = build_model(model_name, input_shape=shape, num_classes=classes)
    data = loader(
        random_data(shape, classes, per_class=per_class).train, batch_size=256, shuffle=True
    )
    exponents = [i / 4 for i in range(4 * decades + 1)]
    options = {
        "snip": {},
        "grasp": {"samples_per_class": per_class, "num_classes": classes},
        "random": {},
        "magnitude": {},
    }
    rows = []
    for method in ["random", "magnitude", "snip", "grasp", "synflow"]:
        scores = None if method == "synflow" else score(model, method, data, **options[method])
        for guard in (0, 1):
            for e in exponents:
                sparsity = 1.0 - 10.0**-e
                unguarded = [
                    r
                    for r in rows
                    if r["method"] == method and not r["guard"] and r["log10_compression"] == e
                ]
                if method == "synflow" and guard and not unguarded[0]["collapsed_layers"]:
                    # masks are monotone, so no layer was empty in any round either: the
                    # guard never engaged and the 100-round run would repeat exactly
                    rows.append({**unguarded[0], "guard": True})
                    continue
                if method == "synflow":
                    work = build_model(model_name, input_shape=shape, num_classes=classes)
                    work.load_state_dict(model.state_dict())
                    masks = prune_at_init(
                        work,
                        "synflow",
                        sparsity,
                        iterations=iters,
                        input_shape=shape,
                        min_per_layer=guard,
                    )
                else:
                    masks = masks_from_scores(scores, sparsity, min_per_layer=guard)
                bad = _collapsed(masks)
                rows.append(
                    {
                        "method": method,
                        "guard": bool(guard),
                        "log10_compression": e,
                        "kept": int(sum(int(m.sum()) for m in masks.values())),
                        "collapsed_layers": bad,
                    }
                )
                log.info("%s guard=%d 10^%.2f: %d collapsed", method, guard, e, len(bad))
    summary = []
    for method in PAPER_COLLAPSE:
        entry = {"method": method, "paper": PAPER_COLLAPSE[method]}
        for guard in (False, True):
            mine = [r for r in rows if r["method"] == method and r["guard"] == guard]
            ok = 0.0
            for r in mine:  # the last compression before the first collapse
                if r["collapsed_layers"]:
                    break
                ok = r["log10_compression"]
            entry["guarded" if guard else "ours"] = ok
        summary.append(entry)
    result = {
        "study": "collapse",
        "quick": quick,
        "model": model_name,
        "input_shape": shape,
        "classes": classes,
        "synflow_iterations": iters,
        "rows": rows,
        "summary": summary,
        "machine": _machine(),
    }
    _plot_collapse(rows, exponents, out / "collapse.png", model_name)
    md = _table(
        ["method", "paper (log10)", "ours (log10)", "ours, min_per_layer=1"],
        [[s["method"], s["paper"], s["ours"], s["guarded"]] for s in summary],
    )
    return result, md


def _plot_collapse(rows, exponents, path, model_name):
    from gradsift.plots import _figure, _save

    plt = _figure()
    fig, ax = plt.subplots(figsize=(7, 4))
    for method in PAPER_COLLAPSE:
        mine = [r for r in rows if r["method"] == method and not r["guard"]]
        ax.plot(
            [r["log10_compression"] for r in mine],
            [len(r["collapsed_layers"]) for r in mine],
            marker="o",
            label=method,
        )
        ax.axvline(PAPER_COLLAPSE[method], ls=":", lw=0.8, color=ax.lines[-1].get_color())
    ax.set_xlabel("log10 compression (dotted: paper's collapse point)")
    ax.set_ylabel("layers fully pruned")
    ax.set_title(f"Layer collapse, {model_name}, no guard")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)


def _training_result(study: str, quick: bool, epochs: int, seeds: list, runs: list) -> dict:
    """The JSON of a training study: its runs without per-epoch histories."""
    runs = [{k: v for k, v in r.items() if k != "history"} for r in runs]
    return {
        "study": study,
        "quick": quick,
        "epochs": epochs,
        "seeds": seeds,
        "runs": runs,
        "machine": _machine(),
    }


def _mean_std(values):
    return statistics.mean(values), (statistics.pstdev(values) if len(values) > 1 else 0.0)


def accuracy(out: Path, *, quick: bool = False) -> dict:
    """Digits, LeNet-5: accuracy vs sparsity for every method, real and shuffled masks."""
    from gradsift.plots import plot_accuracy_vs_sparsity

    sparsities = [0.5, 0.9] if quick else [0.5, 0.8, 0.9, 0.95, 0.98, 0.99]
    seeds = [0] if quick else [0, 1, 2]
    epochs = 1 if quick else 15
    methods = ["random", "magnitude", "snip", "grasp", "synflow"]
    specs = [
        RunSpec(
            method=m,
            sparsity=s,
            seed=seed,
            shuffle=shuffle,
            iterations=(2 if quick else 100) if m == "synflow" else 1,
            train=TrainConfig(epochs=epochs),
        )
        for m in methods
        for s in sparsities
        for seed in seeds
        for shuffle in (False, True)
    ]
    runs = run_sweep(specs, out / "accuracy_runs.json")
    plot_accuracy_vs_sparsity(
        runs, out / "accuracy.png", title="LeNet-5 on digits (dashed: layer-wise shuffled masks)"
    )
    cells = defaultdict(list)
    for r in runs:
        cells[(r["method"], r["shuffle"], r["sparsity"])].append(100 * r["test_accuracy"])
    header = ["method"] + [f"{100 * s:g}%" for s in sparsities]
    table = []
    for m in methods:
        for shuffle in (False, True):
            row = [m + (" (shuffled)" if shuffle else "")]
            for s in sparsities:
                mean, std = _mean_std(cells[(m, shuffle, s)])
                row.append(f"{mean:.1f} ± {std:.1f}")
            table.append(row)
    return _training_result("accuracy", quick, epochs, seeds, runs), _table(header, table)


def topk(out: Path, *, quick: bool = False) -> dict:
    """Digits, the MLP (LeNet-300-100) unpruned: dense vs top-k at 10/1/0.1%, +/- EF."""
    from gradsift.plots import plot_bars

    seeds = [0] if quick else [0, 1, 2]
    epochs = 1 if quick else 20
    configs = [(None, True)] + [(d, ef) for d in (0.1, 0.01, 0.001) for ef in (True, False)]
    specs = [
        RunSpec(
            model="mlp",
            seed=seed,
            train=TrainConfig(epochs=epochs, density=d, error_feedback=ef),
        )
        for d, ef in configs
        for seed in seeds
    ]
    runs = run_sweep(specs, out / "topk_runs.json")
    cells = defaultdict(list)
    for r in runs:
        cells[(r["grad_density"], r["error_feedback"])].append(100 * r["test_accuracy"])
    labels, means, table = [], [], []
    for d, ef in configs:
        mean, std = _mean_std(cells[(1.0 if d is None else d, ef)])
        label = "dense" if d is None else f"{100 * d:g}%" + (" +EF" if ef else " no EF")
        labels.append(label.replace(" ", "\n", 1))
        means.append(mean)
        table.append([label, f"{mean:.1f} ± {std:.1f}"])
    plot_bars(
        labels,
        means,
        out / "topk.png",
        ylabel="test accuracy (%)",
        title=f"MLP on digits, {epochs} epochs: top-k gradient density",
        ymin=0.0 if quick else 90.0,
    )
    result = _training_result("topk", quick, epochs, seeds, runs)
    return result, _table(["gradients", "test accuracy (%)"], table)


def speed(out: Path, *, quick: bool = False) -> dict:
    """The four benchmarks; quick runs them on small sizes with one repeat."""
    from gradsift import bench
    from gradsift.plots import plot_bars

    if quick:
        select = bench.bench_select(sizes=(200_000,), repeats=1)
        step = []
        score_rows = []
        ddp = []
    else:
        select = bench.bench_select()
        step = bench.bench_step()
        score_rows = bench.bench_score()
        ddp = bench.bench_ddp()
    labels = [f"select\nN={r['n'] / 1e6:g}M\nk={r['k']}" for r in select]
    ratios = [r["speedup_vs_topk"] for r in select]
    plot_bars(
        labels,
        ratios,
        out / "speed.png",
        ylabel="torch.topk time / ours",
        title="Exact top-k: speed-up over torch.topk(x.abs(), k)",
    )
    md = _table(
        ["N", "k", "ours ms", "topk ms", "abs pass ms", "topk/ours", "ours/abs"],
        [
            [
                r["n"],
                r["k"],
                f"{r['ours_ms']:.2f}",
                f"{r['torch_topk_ms']:.1f}",
                f"{r['abs_pass_ms']:.2f}",
                f"{r['speedup_vs_topk']:.1f}",
                f"{r['ours_over_abs_pass']:.1f}",
            ]
            for r in select
        ],
    )
    if step:
        md += "\n" + _table(
            [
                "density",
                "k",
                "TopK+EF ms",
                "dense SGD ms",
                "naive ms",
                "ours/dense",
                "naive/ours",
                "(extra - residual)/params",
            ],
            [
                [
                    r["density"],
                    r["k"],
                    f"{r['topk_ef_ms']:.2f}",
                    f"{r['dense_sgd_ms']:.2f}",
                    f"{r['naive_ms']:.1f}",
                    f"{r['ours_over_dense']:.2f}",
                    f"{r['naive_over_ours']:.1f}",
                    f"{r['other_extra_over_param_bytes']:.3f}",
                ]
                for r in step
            ],
        )
    if score_rows:
        md += "\n" + _table(
            ["GraSP", "chunk", "keep_graphs", "seconds", "peak MiB", "time/ref", "memory/ref"],
            [
                [
                    r["method"],
                    r["chunk_size"],
                    "yes" if r.get("keep_graphs") else "",
                    f"{r['seconds']:.2f}",
                    f"{r['peak_bytes'] / 2**20:.0f}",
                    f"{r['time_over_reference']:.2f}",
                    f"{r['memory_over_reference']:.2f}",
                ]
                for r in score_rows
            ],
        )
    if ddp:
        md += "\n" + _table(
            ["hook", "step ms", "time/allreduce", "KiB sent/step", "dense/sent"],
            [
                [
                    "allreduce" if r["density"] is None else f"top-k {r['density']:g}",
                    f"{r['step_ms']:.1f}",
                    f"{r['time_over_allreduce']:.2f}",
                    ""
                    if r["bytes_sent_per_step"] is None
                    else f"{r['bytes_sent_per_step'] / 1024:.1f}",
                    f"{r.get('compression', 1.0):.1f}",
                ]
                for r in ddp
            ],
        )
    result = {
        "study": "speed",
        "quick": quick,
        "select": select,
        "step": step,
        "score": score_rows,
        "ddp": ddp,
        "machine": _machine(),
    }
    return result, md


STUDIES = {"collapse": collapse, "accuracy": accuracy, "topk": topk, "speed": speed}


def run_study(name: str, out, *, quick: bool = False, command: str = "") -> dict:
    """Run one study; write ``NAME.json`` and ``NAME.md`` (and its PNG) under ``out``."""
    if name not in STUDIES:
        raise ValueError(f"study must be one of {sorted(STUDIES)}, got {name!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result, md = STUDIES[name](out, quick=quick)
    result["command"] = command
    atomic_write_json(out / f"{name}.json", result)
    header = f"<!-- generated by: {command} -->\n" if command else ""
    atomic_write_bytes(out / f"{name}.md", (header + md).encode())
    return result

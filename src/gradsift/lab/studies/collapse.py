"""Layer collapse vs compression (Tanaka et al. 2020, arXiv:2006.05467, Fig. 1 setting:
VGG-16-BN, CIFAR-100 shapes, no training), per method, with and without the
``min_per_layer=1`` guard."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from gradsift import masks_from_scores, prune_at_init, score
from gradsift.lab.data import loader, random_data
from gradsift.lab.models import build_model
from gradsift.lab.studies.common import machine
from gradsift.lab.tables import Column, render
from gradsift.pruning import get_method, supported_options

log = logging.getLogger(__name__)

# log10 of the largest compression before layer collapse in each of the authors' three
# runs (seeds 3, 1003, 2003), from the Synaptic-Flow repository's own result files
# (Results/data/0520_2020_cifar100_lottery_vgg16_bn{,_run2,_run3}/compression-*-100.pkl:
# the last compression before a prunable layer has density 0). Every run there prunes
# for 100 epochs (rounds), whatever the method.
PAPER_COLLAPSE = {
    "random": (2.75, 3.75, 3.5),
    "magnitude": (2.75, 2.75, 2.75),
    "snip": (3.75, 3.5, 3.5),
    "grasp": (3.5, 3.75, 3.5),
    "synflow": (6.0, 6.0, 5.75),
}

_FULL = ("vgg16_bn", (3, 32, 32), 100, 10, 100, 6)
_QUICK = ("vgg11_bn", (3, 8, 8), 10, 4, 5, 3)


def _collapsed(masks: dict) -> list[str]:
    return [name for name, m in masks.items() if not bool(m.any())]


def _rows(method, model, data, setting, exponents) -> list[dict]:
    """Every (guard, compression) for one method; iterative methods prune in rounds."""
    model_name, shape, classes, per_class, iters, _ = setting
    iterative = get_method(method).paper_iterations > 1
    options = supported_options(
        method, samples_per_class=per_class, num_classes=classes, input_shape=shape
    )
    scores = None if iterative else score(model, method, data, **options)
    rows = []
    for guard in (0, 1):
        for e in exponents:
            unguarded = [r for r in rows if not r["guard"] and r["log10_compression"] == e]
            if iterative and guard and not unguarded[0]["collapsed_layers"]:
                # masks are monotone, so no layer was empty in any round either: the
                # guard never engaged and the rounds would repeat exactly
                rows.append({**unguarded[0], "guard": True})
                continue
            sparsity = 1.0 - 10.0**-e
            if iterative:
                work = build_model(model_name, input_shape=shape, num_classes=classes)
                work.load_state_dict(model.state_dict())
                masks = prune_at_init(
                    work, method, sparsity, data, iterations=iters, min_per_layer=guard, **options
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
    return rows


def _summary(rows) -> list[dict]:
    summary = []
    for method in PAPER_COLLAPSE:
        entry = {"method": method, "paper": list(PAPER_COLLAPSE[method])}
        for guard in (False, True):
            ok = 0.0
            for r in (r for r in rows if r["method"] == method and r["guard"] == guard):
                if r["collapsed_layers"]:  # the last compression before the first collapse
                    break
                ok = r["log10_compression"]
            entry["guarded" if guard else "ours"] = ok
        summary.append(entry)
    return summary


def collapse(out: Path, *, quick: bool = False):
    setting = _QUICK if quick else _FULL
    model_name, shape, classes, per_class, iters, decades = setting
    torch.manual_seed(0)
    model = build_model(model_name, input_shape=shape, num_classes=classes)
    data = loader(
        random_data(shape, classes, per_class=per_class).train, batch_size=256, shuffle=True
    )
    exponents = [i / 4 for i in range(4 * decades + 1)]
    rows = [r for m in PAPER_COLLAPSE for r in _rows(m, model, data, setting, exponents)]
    summary = _summary(rows)
    result = {
        "study": "collapse",
        "quick": quick,
        "model": model_name,
        "input_shape": shape,
        "classes": classes,
        "synflow_iterations": iters,
        "rows": rows,
        "summary": summary,
        "machine": machine(),
    }
    _plot(rows, out / "collapse.png", model_name)
    columns = [
        Column("method", "method"),
        Column(lambda r: " / ".join(f"{v:.2f}" for v in r["paper"]), "authors' 3 runs (log10)"),
        Column("ours", "ours (log10)"),
        Column("guarded", "ours, min_per_layer=1"),
    ]
    return result, render(summary, columns, markdown=True)


def _plot(rows, path, model_name):
    from gradsift.lab.plots import figure, save

    plt = figure()
    fig, ax = plt.subplots(figsize=(7, 4))
    for method in PAPER_COLLAPSE:
        mine = [r for r in rows if r["method"] == method and not r["guard"]]
        ax.plot(
            [r["log10_compression"] for r in mine],
            [len(r["collapsed_layers"]) for r in mine],
            marker="o",
            label=method,
        )
        for v in sorted(set(PAPER_COLLAPSE[method])):
            ax.axvline(v, ls=":", lw=0.8, color=ax.lines[-1].get_color())
    ax.set_xlabel("log10 compression (dotted: the authors' runs' collapse points)")
    ax.set_ylabel("layers fully pruned")
    ax.set_title(f"Layer collapse, {model_name}, no guard")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)
    plt.close(fig)

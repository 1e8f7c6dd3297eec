"""Layer collapse vs compression (Tanaka et al. 2020, arXiv:2006.05467, Fig. 1 setting:
VGG-16-BN, CIFAR-100 shapes, no training), for every registered method, with and
without the ``min_per_layer=1`` guard; and ResNet-20 on CIFAR-10 shapes, whose 1x1
projection shortcuts are what SynFlow was reported to prune away entirely
(Synaptic-Flow issue #7).

Each method runs as its registry entry says: a criterion with its own schedule (a
``sparsity`` option) or the paper's rounds (``paper_iterations > 1``) prunes afresh at
every compression; any other is scored once and its scores cut at each compression.
At compression 1 (sparsity 0) no method runs: every weight is kept.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from gradsift import list_methods, masks_from_scores, prune_at_init, score
from gradsift.lab.atomic import atomic_write_json, read_json
from gradsift.lab.data import loader, random_data
from gradsift.lab.models import build_model
from gradsift.lab.studies.common import machine
from gradsift.lab.tables import Column, columns, render
from gradsift.pruning import get_method, supported_options
from gradsift.pruning.params import original, prunable

log = logging.getLogger(__name__)

# log10 of the largest compression before layer collapse in each of the authors' three
# runs (seeds 3, 1003, 2003; VGG-16-BN on CIFAR-100, Tanaka et al. Fig. 1), from the
# Synaptic-Flow repository's own result files
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
# methods the authors did not run have no paper value


@dataclass(frozen=True)
class Setting:
    """One network of the study: its inputs, the data the data-driven methods see, the
    rounds of an iterative method and how many decades of compression it spans."""

    model: str
    input_shape: tuple
    classes: int
    per_class: int
    iterations: int
    decades: float
    paper: bool  # Tanaka et al. Fig. 1's network: compare with PAPER_COLLAPSE
    step: float = 0.25  # decades between compressions
    # a method that prunes afresh at every compression (its own schedule, or rounds)
    # costs a whole pruning run per point: it gets this coarser grid
    afresh_step: float = 0.25
    steps: int | None = None  # FORCE/Iterative SNIP steps; None: the paper's 60
    batch: int = 256  # images per batch a one-shot method reads
    afresh_batch: int = 256  # ... and a method that prunes afresh (each step or round)

    def exponents(self, afresh: bool = False) -> list[float]:
        step = self.afresh_step if afresh else self.step
        return [i * step for i in range(round(self.decades / step) + 1)]


# ResNet-20 stops at 10^4: it has 270k weights in 22 layers, and min_per_layer=1 needs
# at least one weight per layer. On VGG-16 one FORCE or Iterative SNIP run at the
# paper's 60 steps of a 256-image batch takes 6-7 minutes on 2 cores, and every
# compression is a fresh run: the methods that prune afresh get whole decades, 20
# steps and 64-image batches (NTK-SAP's noise batch too), so that the study with every
# method takes about half an hour instead of several hours.
_AFRESH = {"steps": 20, "afresh_batch": 64}
_FULL = (
    Setting("vgg16_bn", (3, 32, 32), 100, 10, 100, 6, True, afresh_step=1.0, **_AFRESH),
    Setting("resnet20", (3, 32, 32), 10, 10, 100, 4, False, afresh_step=0.5, **_AFRESH),
)
_QUICK = (
    # batches of 8: CPU convolution backward at 1x1 and 2x2 maps costs 10x its forward
    Setting("vgg11_bn", (3, 8, 8), 10, 4, 3, 2, True,
            step=0.5, afresh_step=1.0, steps=3, batch=8, afresh_batch=8),
    Setting("resnet20", (3, 8, 8), 10, 1, 5, 3, False, step=0.5, afresh_step=1.0, steps=3),
)  # fmt: skip


# methods that differentiate through training steps keep every step's graph: ProsPr's
# three steps of VGG-16 on 256 images ran out of 24 GiB; they read the smaller batch
_UNROLLED = {"prospr"}


def shortcuts(masks: dict) -> list[str]:
    """The 1x1 convolutions among ``masks`` (ResNet projection shortcuts)."""
    return [n for n, m in masks.items() if m.dim() == 4 and tuple(m.shape[2:]) == (1, 1)]


def _prunes_afresh(method: str) -> bool:
    entry = get_method(method)
    return entry.paper_iterations > 1 or "sparsity" in entry.options()


def _all_kept(model) -> dict:
    """The masks at compression 1 without running a method: a whole pruning run of a
    method that prunes afresh (minutes for FORCE on VGG-16) would keep them anyway."""
    return {n: torch.ones_like(original(m, a), dtype=torch.bool)
            for n, (m, a) in prunable(model, warn=False).items()}  # fmt: skip


def _masks(method, model, data, setting, sparsity, guard, options, scores):
    if scores is not None:
        return masks_from_scores(scores, sparsity, min_per_layer=guard)
    work = build_model(setting.model, input_shape=setting.input_shape, num_classes=setting.classes)
    work.load_state_dict(model.state_dict())
    iterations = setting.iterations if get_method(method).paper_iterations > 1 else 1
    return prune_at_init(
        work, method, sparsity, data, iterations=iterations, min_per_layer=guard, **options
    )


def _rows(method, model, data, setting: Setting) -> list[dict]:
    """Every (guard, compression) of one method on one network; ``data`` maps a batch
    size to a seeded loader of the setting's inputs."""
    options = supported_options(
        method,
        samples_per_class=setting.per_class,
        num_classes=setting.classes,
        input_shape=setting.input_shape,
        **({} if setting.steps is None else {"steps": setting.steps}),
    )
    afresh = _prunes_afresh(method)
    small = afresh or method in _UNROLLED
    data = data(batch_size=setting.afresh_batch if small else setting.batch)
    scores = None if afresh else score(model, method, data, **options)
    rows = []
    for guard in (0, 1):
        for e in setting.exponents(afresh):
            unguarded = [r for r in rows if not r["guard"] and r["log10_compression"] == e]
            if afresh and guard and not unguarded[0]["collapsed_layers"]:
                # masks are monotone, so no layer was empty in any round either: the
                # guard never engaged and the rounds would repeat exactly
                rows.append({**unguarded[0], "guard": True})
                continue
            if e == 0:  # compression 1, sparsity 0: every method keeps every weight
                masks = _all_kept(model)
            else:
                sparsity = 1.0 - 10.0**-e
                masks = _masks(method, model, data, setting, sparsity, guard, options, scores)
            bad = [n for n, m in masks.items() if not bool(m.any())]
            rows.append(
                {
                    "model": setting.model,
                    "method": method,
                    "guard": bool(guard),
                    "log10_compression": e,
                    "kept": int(sum(int(m.sum()) for m in masks.values())),
                    "collapsed_layers": bad,
                    "shortcut_layers": len(shortcuts(masks)),
                    "collapsed_shortcuts": [n for n in shortcuts(masks) if n in bad],
                }
            )
            log.info("%s %s guard=%d 10^%.2f: %d empty", setting.model, method, guard, e, len(bad))
    return rows


def _last_alive(rows, key: str) -> float:
    """The largest compression before the first row whose ``key`` list is non-empty."""
    ok = 0.0
    for r in rows:
        if r[key]:
            break
        ok = r["log10_compression"]
    return ok


def _summary(rows, settings) -> list[dict]:
    summary = []
    for setting in settings:
        for method in list_methods():
            mine = [r for r in rows if r["model"] == setting.model and r["method"] == method]
            plain = [r for r in mine if not r["guard"]]
            guarded = [r for r in mine if r["guard"]]
            paper = setting.paper and method in PAPER_COLLAPSE
            entry = {
                "model": setting.model,
                "method": method,
                "paper": list(PAPER_COLLAPSE[method]) if paper else None,
                "ours": _last_alive(plain, "collapsed_layers"),
                "guarded": _last_alive(guarded, "collapsed_layers"),
            }
            if mine and mine[0]["shortcut_layers"]:
                entry["shortcuts"] = _last_alive(plain, "collapsed_shortcuts")
                entry["shortcuts_guarded"] = _last_alive(guarded, "collapsed_shortcuts")
            summary.append(entry)
    return summary


def _runs(row) -> str | None:
    return None if row["paper"] is None else " / ".join(f"{v:.2f}" for v in row["paper"])


SUMMARY_COLUMNS = (
    columns(
        """
    model               model
    method              method
    """
    )
    + [Column(_runs, "authors' 3 runs (log10)")]
    + columns(
        """
    ours                ours (log10)
    guarded             ours, min_per_layer=1
    shortcuts           shortcuts alive to (log10)
    shortcuts_guarded   shortcuts alive to, guarded
    """
    )
)


def _cached_rows(cache: Path, method, model, batches, setting: Setting) -> list[dict]:
    """``_rows`` of one (network, method), kept in ``cache`` as soon as they exist, so
    that an interrupted study resumes at the next method; rows from another setting
    are recomputed. Delete the file to recompute everything."""
    done = read_json(cache, {})
    key = f"{setting.model}/{method}"
    if key in done and done[key]["setting"] == json.loads(json.dumps(asdict(setting))):
        return done[key]["rows"]
    torch.manual_seed(0)  # random draws of a method do not depend on those before it
    rows = _rows(method, model, batches, setting)
    done = read_json(cache, {})
    done[key] = {"setting": asdict(setting), "rows": rows}
    atomic_write_json(cache, done)
    return rows


def collapse(out: Path, *, quick: bool = False):
    settings = _QUICK if quick else _FULL
    cache = Path(out) / ("collapse_rows_quick.json" if quick else "collapse_rows.json")
    rows = []
    for setting in settings:
        torch.manual_seed(0)
        model = build_model(
            setting.model, input_shape=setting.input_shape, num_classes=setting.classes
        )
        data = random_data(setting.input_shape, setting.classes, per_class=setting.per_class)
        batches = partial(loader, data.train, shuffle=True)
        for method in list_methods():
            rows += _cached_rows(cache, method, model, batches, setting)
    summary = _summary(rows, settings)
    result = {
        "study": "collapse",
        "quick": quick,
        "settings": [asdict(s) for s in settings],
        "rows": rows,
        "summary": summary,
        "machine": machine(),
    }
    _plot(rows, settings, out / "collapse.png")
    return result, render(summary, SUMMARY_COLUMNS, markdown=True)


def _plot(rows, settings, path):
    from gradsift.lab.plots import figure, save

    plt = figure()
    fig, axes = plt.subplots(1, len(settings), figsize=(7 * len(settings), 4), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for i, method in enumerate(list_methods()):
            mine = [
                r
                for r in rows
                if r["model"] == setting.model and r["method"] == method and not r["guard"]
            ]
            color = f"C{i % 10}"
            ax.plot(
                [r["log10_compression"] for r in mine],
                [len(r["collapsed_layers"]) for r in mine],
                marker="o",
                label=method,
                color=color,
            )
            for v in sorted(set(PAPER_COLLAPSE.get(method, ()) if setting.paper else ())):
                ax.axvline(v, ls=":", lw=0.8, color=color)
        ax.set_xlabel("log10 compression (dotted: the authors' runs' collapse points)")
        ax.set_ylabel("layers fully pruned")
        ax.set_title(f"Layer collapse, {setting.model}, no guard")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, path)
    plt.close(fig)

"""``gradsift demo``: the two jobs, each compared where the comparison says something.

1. Pruning at init: every method at each ``--sparsities`` level, trained with dense
   updates, so that the mask alone makes the difference, against the unpruned net.
2. Top-k sparse updates: the unpruned net trained with the top ``--density`` of its
   gradient coordinates, with and without error feedback, against dense updates.

The printed summary says what each number means and flags the runs that fall far
below the unpruned net, with the reason this setting gives them.
"""

from __future__ import annotations

from gradsift.lab.runs import run_many, usable_cores
from gradsift.lab.specs import RunSpec
from gradsift.lab.tables import percent
from gradsift.lab.training import TrainConfig

__all__ = ["plot_demo", "run_demo", "summary"]

FAR_BELOW = 10.0  # points of accuracy under the unpruned net that the summary explains


def run_demo(methods, sparsities, density, epochs, seed, report=print, jobs=None):
    """The runs, as ``{"unpruned": row, "pruned": {(method, s): row}, "topk": {...}}``;
    ``jobs`` runs at a time, each in its own single-threaded process (default: the
    cores this process may use, at most 4: a LeNet-5 on 8x8 images leaves a second
    thread little to do, a second process a whole run)."""

    def spec(method=None, sparsity=0.0, **train):
        cfg = TrainConfig(epochs=epochs, seed=seed, **train)
        return RunSpec(method=method, sparsity=sparsity, seed=seed, train=cfg)

    plan = [("unpruned", None, "unpruned, dense updates", spec())]
    plan += [
        ("pruned", (m, s), f"{m} at {percent(s)} sparsity, dense updates", spec(m, s))
        for s in sparsities
        for m in methods
    ]
    plan += [
        (
            "topk",
            f,
            f"top-{density:g} gradients, error feedback {f}",
            spec(density=density, error_feedback=f),
        )
        for f in (True, False)
    ]
    out = {"pruned": {}, "topk": {}}
    jobs = min(4, usable_cores()) if jobs is None else jobs
    records = run_many([p[-1] for p in plan], jobs=jobs, in_order=True)
    for (part, slot, label, _), r in zip(plan, records):
        if slot is None:
            out[part] = r
        else:
            out[part][slot] = r
        report(f"  {label}: {_pct(r)}")
    return out


def _pct(r: dict) -> str:
    return f"{100 * r['test_accuracy']:.1f}%"


def summary(res, methods, sparsities, density) -> list[str]:
    """What the numbers mean, in sentences."""
    base = 100 * res["unpruned"]["test_accuracy"]
    lines = [
        f"Unpruned LeNet-5 ({res['unpruned']['total']:,} prunable weights), dense updates: "
        f"{base:.1f}% test accuracy. Chance is 10%.",
        "",
        "1. Pruning at init (the mask alone differs; every run has dense updates):",
    ]
    for s in sparsities:
        accs = {m: 100 * res["pruned"][m, s]["test_accuracy"] for m in methods}
        best = max(accs, key=accs.get)
        kept = res["pruned"][methods[0], s]["kept"]
        close = [m for m in methods if accs[m] >= base - FAR_BELOW]
        lines.append(
            f"   {percent(s)} sparsity ({kept:,} weights kept): {len(close)} of {len(methods)} "
            f"methods within {FAR_BELOW:g} points of unpruned; best {best} {accs[best]:.1f}%."
        )
        low = sorted((m for m in methods if m not in close), key=accs.get)
        for m in low:
            lines.append(f"     {m} {accs[m]:.1f}%: {_why(m, s, res, sparsities, base)}")
    dense = 100 * res["unpruned"]["test_accuracy"]
    ef, no_ef = (100 * res["topk"][f]["test_accuracy"] for f in (True, False))
    ratio = res["topk"][True].get("compression_ratio", 0)
    lines += [
        "",
        f"2. Top-k sparse updates (unpruned net, {percent(density)} of gradient coordinates "
        "per step):",
        f"   with error feedback {ef:.1f}%, without {no_ef:.1f}%, dense updates {dense:.1f}%.",
        "   Error feedback keeps what a step drops in a residual and adds it back later, so "
        "no gradient is lost, only delayed"
        + (f"; the update moved {ratio:.0f}x fewer values." if ratio > 1 else "."),
    ]
    return lines


def _why(method: str, sparsity: float, res, sparsities, base: float) -> str:
    milder = [s for s in sparsities if s < sparsity]
    fine_milder = milder and all(
        100 * res["pruned"][method, s]["test_accuracy"] >= base - FAR_BELOW for s in milder
    )
    if res["pruned"][method, sparsity].get("collapsed"):
        return "a layer lost all its weights (layer collapse): no signal passes."
    reasons = {
        "random": "a random mask keeps the same fraction of every layer, so the small "
        "first convolution is left with very few weights; the net trains slowly.",
        "grasp": "GraSP ranks weights by how their removal changes gradient flow, not by "
        "how well they fit; on this tiny net it trails the other criteria.",
        "iter_snip": "its many rounds of pruning and re-scoring leave a mask that trains "
        "slowly here.",
    }
    why = reasons.get(method, "this mask leaves a thin path through the net, slow to train.")
    if fine_milder:
        why = f"fine at {percent(max(milder))}, short of weights at {percent(sparsity)}: " + why
    return why + " More --epochs narrow the gap."


def plot_demo(res: dict, methods: list, sparsities: list, density: float, path) -> None:
    """The demo's two panels: accuracy of each method's pruned net at each sparsity,
    and of top-k updates with and without error feedback, beside the dense net's."""
    from gradsift.lab.plots import plot_hbars

    pct = {key: 100 * r["test_accuracy"] for key, r in res["pruned"].items()}
    dense = 100 * res["unpruned"]["test_accuracy"]
    labels = ["unpruned (reference)", *methods]
    series = {f"{percent(s)} sparsity": [dense] + [pct[m, s] for m in methods] for s in sparsities}
    # one sparsity draws no legend: the title names it
    at = f" to {percent(sparsities[0])} sparsity" if len(sparsities) == 1 else ""
    topk = ["dense updates", "top-k + error feedback", "top-k, no error feedback"]
    topk_acc = [dense] + [100 * res["topk"][f]["test_accuracy"] for f in (True, False)]
    plot_hbars(
        [
            (f"1. pruned at init{at}, dense updates", labels, series),
            (f"2. unpruned, top {percent(density)} gradient coordinates", topk,
             {"unpruned": topk_acc}),
        ],
        path,
        xlabel="test accuracy (%) on digits, LeNet-5",
    )  # fmt: skip

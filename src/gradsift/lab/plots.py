"""PNG plots of results (matplotlib, optional extra ``gradsift[plots]``)."""

from __future__ import annotations

import io
import statistics
from collections import defaultdict

from gradsift.lab.atomic import atomic_write_bytes

__all__ = ["plot_accuracy_vs_sparsity", "plot_bars", "plot_hbars", "have_matplotlib", "run_label"]


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


_STYLES = {
    None: "-",
    "shuffle-layer": "--",
    "reinit": ":",
    "invert": "-.",
    "shuffle-global": (0, (1, 1)),
}


def _variant(r: dict) -> str | None:
    return r.get("sanity") or ("shuffle-layer" if r.get("shuffle") else None)


def run_label(r: dict) -> str:
    """``method [allocation] (variant)``: what a curve of runs has in common."""
    label = r["method"]
    if r.get("allocation", "global") != "global":
        label += f" [{r['allocation']}]"
    variant = _variant(r)
    if variant == "shuffle-layer":
        label += " (shuffled)"
    elif variant:
        label += f" ({variant})"
    return label


def _accuracy_axes(ax, runs: list[dict], title: str) -> None:
    groups: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    style = {}
    for r in runs:
        groups[run_label(r)][r["sparsity"]].append(100 * r["test_accuracy"])
        style[run_label(r)] = (r["method"], _variant(r))
    methods = sorted({m for m, _ in style.values()})
    colors = {m: f"C{i % 10}" for i, m in enumerate(methods)}  # a method and its variants
    for label in sorted(groups):
        method, variant = style[label]
        xs = sorted(groups[label])
        ax.errorbar(
            [1 - x for x in xs],
            [statistics.mean(groups[label][x]) for x in xs],
            yerr=[statistics.pstdev(groups[label][x]) for x in xs],
            label=label,
            marker="o" if variant is None else ".",
            capsize=3,
            linestyle=_STYLES.get(variant, "--"),
            color=colors[method],
            alpha=1.0 if variant is None else 0.55,
        )
    kept = sorted({1 - r["sparsity"] for r in runs})
    if len(kept) == 1:  # one sparsity: give the log axis a width
        ax.set_xlim(2 * kept[0], 0.5 * kept[0])
        ax.set_xscale("log")
    else:
        ax.set_xscale("log")
        ax.invert_xaxis()
    ax.set_xticks(kept, [f"{k:g}" for k in kept])  # the densities run, not log decades
    ax.minorticks_off()
    ax.set_xlabel("fraction of weights kept (1 - sparsity)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6 if len(groups) > 12 else 8)
    if title:
        ax.set_title(title, fontsize=10)


def plot_accuracy_vs_sparsity(runs: list[dict], path, *, title: str = "", panel=None) -> None:
    """Mean test accuracy vs sparsity per method (x: density, log), std error bars;
    a method's sanity variants share its colour, dashed. ``panel``: a function of a
    run naming its subplot (two to a row), titled by that name."""
    plt = figure()
    panels: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        panels[panel(r) if panel else title].append(r)
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4.5 * rows), squeeze=False)
    for ax, (name, members) in zip(axes.flat, panels.items()):
        _accuracy_axes(ax, members, name)
    if panel and title:
        fig.suptitle(title)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)


def plot_bars(
    labels: list[str], values: list[float], path, *, ylabel: str, title: str = "", ymin=0.0
):
    """One bar per label, value printed on top."""
    plt = figure()
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(labels, values, color="#4c72b0")
    for bar, v in zip(bars, values):
        ax.annotate(
            f"{v:.1f}", (bar.get_x() + bar.get_width() / 2, v), ha="center", va="bottom", fontsize=9
        )
    ax.set_ylabel(ylabel)
    top = max(values + [1.0])
    ax.set_ylim(ymin, top + (top - ymin) * 0.12)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    save(fig, path)
    plt.close(fig)


def plot_hbars(panels: list[tuple[str, list[str], dict[str, list[float]]]], path, *, xlabel):
    """Horizontal grouped bars, one panel per ``(title, row labels, {series: values})``:
    labels on the y axis never collide, each value is printed at its bar's end."""
    plt = figure()
    heights = [len(labels) * max(1, len(series)) for _, labels, series in panels]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(8, 0.22 * sum(heights) + 1.2 * len(panels)),
        gridspec_kw={"height_ratios": heights}, squeeze=False,
    )  # fmt: skip
    for ax, (title, labels, series) in zip(axes[:, 0], panels):
        width = 0.8 / len(series)
        for j, (name, values) in enumerate(series.items()):
            ys = [i + (j - (len(series) - 1) / 2) * width for i in range(len(labels))]
            bars = ax.barh(ys, values, height=width, label=name, color=f"C{j}")
            for bar, v in zip(bars, values):
                y = bar.get_y() + bar.get_height() / 2
                ax.text(v + 1, y, f"{v:.1f}", va="center", fontsize=7)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 112)
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)

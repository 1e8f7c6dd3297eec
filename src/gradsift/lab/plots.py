"""PNG plots of results (matplotlib, optional extra ``gradsift[plots]``)."""

from __future__ import annotations

import io
import statistics
from collections import defaultdict

from gradsift.lab.atomic import atomic_write_bytes

__all__ = ["plot_accuracy_vs_sparsity", "plot_bars", "have_matplotlib"]


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


def plot_accuracy_vs_sparsity(runs: list[dict], path, *, title: str = "") -> None:
    """Mean test accuracy vs sparsity per method (x: density, log), std error bars."""
    plt = figure()
    groups: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        label = r["method"] + (" (shuffled)" if r.get("shuffle") else "")
        groups[label][r["sparsity"]].append(100 * r["test_accuracy"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    methods = sorted({label.split(" ")[0] for label in groups})
    colors = {m: f"C{i}" for i, m in enumerate(methods)}  # a method and its shuffle: one
    for label in sorted(groups):
        xs = sorted(groups[label])
        means = [statistics.mean(groups[label][x]) for x in xs]
        stds = [statistics.pstdev(groups[label][x]) for x in xs]
        shuffled = "shuffled" in label
        ax.errorbar(
            [1 - x for x in xs],
            means,
            yerr=stds,
            label=label,
            marker="o",
            capsize=3,
            linestyle="--" if shuffled else "-",
            color=colors[label.split(" ")[0]],
            alpha=0.55 if shuffled else 1.0,
        )
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("fraction of weights kept (1 - sparsity)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
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

"""Density warm-up for the top-k hook: DGC's schedule (Lin et al., "Deep Gradient
Compression", ICLR 2018, arXiv:1712.01887, Sec. 3.4) sends more in the first epochs,
"exponentially increasing the sparsity from 75% to 99.9% in four epochs".

A schedule is a list of ``(iterations, density)`` ranges, one after the other from
the first iteration of training: ``[(100, 0.25), (100, 0.0625)]`` is density 0.25 for
iterations 0-99, 0.0625 for 100-199, and the hook's own ``density`` (or ``k``) after.
"""

from __future__ import annotations

from gradsift.checks import check_float, check_int

__all__ = ["dgc_warmup", "check_schedule", "density_at"]


def dgc_warmup(
    density: float, iterations_per_epoch: int, *, epochs: int = 4, start: float = 0.25
) -> list[tuple[int, float]]:
    """DGC's ramp: one epoch each at ``start * r^e``, ``e = 0 .. epochs-1``, with ``r``
    such that the epoch after reaches ``density``: for the paper's four epochs to 0.001,
    0.25, 0.0629, 0.0158, 0.0040 (``r`` = 0.2515; the paper's ramp divides by 4 each
    epoch, 0.25, 0.0625, 0.0156, 0.0039, and jumps to 0.001)."""
    density = check_float("density", density, "(0, 1]")
    iterations_per_epoch = check_int("iterations_per_epoch", iterations_per_epoch, minimum=1)
    epochs = check_int("epochs", epochs, minimum=1)
    ratio = (density / check_float("start", start, "(0, 1]")) ** (1.0 / epochs)
    return [(iterations_per_epoch, start * ratio**e) for e in range(epochs)]


def check_schedule(schedule) -> list[tuple[int, float]]:
    out = []
    for item in schedule:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"warmup must hold (iterations, density) pairs, got {item!r}")
        iterations = check_int("warmup iterations", item[0], minimum=1)
        out.append((iterations, check_float("warmup density", item[1], "(0, 1]")))
    return out


def density_at(schedule: list[tuple[int, float]], iteration: int) -> float | None:
    """The schedule's density at ``iteration``, or None past its end."""
    end = 0
    for iterations, density in schedule:
        end += iterations
        if iteration < end:
            return density
    return None

"""When sending top-k pays: a bytes model of one step with the world size.

A ring allreduce of ``n`` elements of ``b`` bytes sends and receives about
``2 (W-1)/W * n b`` bytes per rank. All-gathering sparse messages of ``s`` bytes sends
and receives ``(W-1) s`` per rank: every rank receives every other rank's top-k. So
sparse moves fewer bytes iff

    (W-1) s < 2 (W-1)/W * n b      <=>      s < 2 n b / W,

a crossover density ``d* = 2 b / (W c)`` for ``c`` bytes per sent coordinate: with
float32 gradients and 6-byte coordinates, 0.67 at W = 2 and 0.17 at W = 8; with the
old 12-byte coordinates half that. Past it, the hook allreduces densely (the rule
also holds at W = 1, where neither moves bytes and sparse is taken below
``2 n b``). Latency terms (ring allreduce: ``2 (W-1)`` messages, all-gather ``W-1``)
favour sparse further and are left out, so the rule errs toward dense.
"""

from __future__ import annotations

__all__ = ["sparse_pays", "crossover_density"]


def sparse_pays(message_bytes: int, n: int, element_bytes: int, world: int) -> bool:
    """Whether all-gathering ``message_bytes`` per rank moves fewer bytes than a ring
    allreduce of ``n`` elements of ``element_bytes``, with ``world`` ranks."""
    return message_bytes * world < 2 * n * element_bytes


def crossover_density(element_bytes: int, coordinate_bytes: float, world: int) -> float:
    """The density above which dense allreduce moves fewer bytes."""
    return 2 * element_bytes / (world * coordinate_bytes)

"""Call a function in a fresh spawned process and return its result: a measurement
(peak RSS, a cold start) that must see nothing of this process's memory or caches.

An exception in the child is raised here, and a child that dies (killed, out of
memory) raises ``BrokenProcessPool`` at once: neither leaves the caller waiting.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

__all__ = ["in_fresh_process"]


def in_fresh_process(fn, *args):
    """``fn(*args)`` in a new spawned process (``fn`` and ``args`` must pickle)."""
    context = multiprocessing.get_context("spawn")  # fork would copy this process's memory
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(fn, *args).result()

"""Worker processes (data-parallel ranks, a sweep's workers) forked from a server that
has imported torch once, instead of each spawned and importing it anew.

A spawned process imports torch and gradsift before it runs anything: about 2 s each
on a 2-core machine, and two ranks starting at once take about 4 s. With Python's
``forkserver`` start method, a server process imports ``PRELOAD`` once, when the
first worker starts, and every worker is then a fork of it (a two-rank digits run of
one epoch: 5.7 s spawned, 2.4 s forked from the server; the quick ddp study's bench
and runs: 37 s -> 23 s). The server has imported modules and run nothing: no thread
pool in use, CUDA not initialised, so a fork of it is as clean as a spawned process
(torch documents ``forkserver`` for CUDA workers). A fork inherits the server's
environment, from when the server started; ``adopt_environ`` gives the worker the
environment of the process that started it, as a spawned one has. What is read only
as a process starts (glibc's ``MALLOC_*`` tunables) is the server's: set it before
the first worker starts (on the command line, say). Where there is no fork server
(Windows), workers are spawned.

The benches' peak-memory measurements stay in spawned processes
(``gradsift.lab.bench.fresh_process``): a fork of the server read a few MB more peak
RSS (GraSP on LeNet-5: 19.3 MB against 16.2 MB spawned), which would shift the
published figures.
"""

from __future__ import annotations

import multiprocessing
import os

__all__ = ["PRELOAD", "adopt_environ", "context"]

PRELOAD = ("torch", "torch.distributed", "gradsift.lab.launch", "gradsift.lab.runs")


def context() -> multiprocessing.context.BaseContext:
    """The ``forkserver`` context with ``PRELOAD`` (``spawn`` where there is none)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # read once, when the server starts
    return ctx


def adopt_environ(environ: dict) -> None:
    """Make ``os.environ`` ``environ``: a worker's first act, given its starter's."""
    os.environ.clear()
    os.environ.update(environ)

"""Worker processes (data-parallel ranks, a sweep's workers) forked from a server
that has imported torch once, instead of each spawned and importing it anew.

A spawned process imports torch and gradsift before it runs anything: about 2 s each
on a 2-core machine, and two ranks starting at once take about 4 s. With Python's
``forkserver`` start method, a server process imports ``PRELOAD`` once, when the
first worker starts, and every worker is then a fork of it (a two-rank digits run of
one epoch: 5.7 s spawned, 2.4 s forked from the server; the quick ddp study 37 s ->
23 s). The server has imported modules and run nothing: no thread pool in use, CUDA
not initialised, so a fork of it is as clean as a spawned process (torch documents
``forkserver`` for CUDA workers). A fork inherits the server's environment, from when
the server started; ``in_environ`` gives the worker the environment of the process
that started it, as a spawned one has. Where there is no fork server (Windows),
workers are spawned.
"""

from __future__ import annotations

import multiprocessing
import os

__all__ = ["PRELOAD", "context", "in_environ"]

PRELOAD = ("torch", "torch.distributed", "gradsift.lab.launch", "gradsift.lab.runs")


def context() -> multiprocessing.context.BaseContext:
    """The ``forkserver`` context with ``PRELOAD`` (``spawn`` where there is none)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # read once, when the server starts
    return ctx


def in_environ(environ: dict, fn, *args):
    """``fn(*args)`` with ``os.environ`` made ``environ`` first (a worker's entry)."""
    os.environ.clear()
    os.environ.update(environ)
    return fn(*args)

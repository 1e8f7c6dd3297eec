"""gloo worlds of CPU ranks that serve one multi-rank test after another.

Starting a rank (a fork of the lab's server, ``gradsift.lab.processes``, then importing
the FSDP stack and joining a process group) costs seconds on a 2-core machine, and the
sharded tests need about fifty worlds: a world of each size is therefore started once
and kept. Each call runs ``target(rank, world, *extra)`` on every rank and collects
the results by rank.

- Before each call a rank's random state is put back to what it was when the rank
  started, so a call sees what a freshly started process would.
- A world whose call failed (an error on any rank, a timeout, a rank that died) is
  killed, and the next call starts a new one: ranks left inside a collective must not
  serve another test.
- A rank that dies by a signal without a result (torch's gloo aborted a rank now and
  then on this machine: "malloc(): unaligned tcache chunk detected", once in about 25
  runs of one test, not reproduced in isolation) gets the call run once more on a new
  world; a second death, an error or a timeout fails the test.
"""

from __future__ import annotations

import atexit
import queue as queue_module
import random
import time
import traceback

import torch
import torch.distributed as dist

from gradsift.lab import processes

__all__ = ["rank_results", "run_world"]


def run_world(target, world: int, *extra, deadline_s: float = 120) -> dict:
    """``target(rank, world, *extra)`` on ``world`` gloo ranks: ``{rank: result}``, a
    rank's exception as the string ``"error: ..."``, and ``"timeout"`` or ``"died"``
    keys where no result came."""
    results = _call(target, world, extra, deadline_s)
    if "died" in results:
        results = _call(target, world, extra, deadline_s)
    return results


def rank_results(results: dict, world: int) -> list:
    """``run_world``'s results in rank order, failing on a timeout or a rank's error."""
    assert "timeout" not in results and "died" not in results, results
    out = [results[r] for r in range(world)]
    for r in out:
        assert not (isinstance(r, str) and r.startswith("error")), r
    return out


_LIVE: dict[int, _World] = {}


def _call(target, world: int, extra: tuple, deadline_s: float) -> dict:
    if world not in _LIVE:
        _LIVE[world] = _World(world)
    results = _LIVE[world].call(target, extra, deadline_s)
    failed = set(results) != set(range(world)) or any(
        isinstance(v, str) and v.startswith("error") for v in results.values()
    )
    if failed:
        _LIVE.pop(world).kill()
    return results


@atexit.register
def _close_all() -> None:
    while _LIVE:
        _LIVE.popitem()[1].close()


class _World:
    def __init__(self, size: int) -> None:
        from gradsift.lab.launch import free_port

        ctx = processes.context()
        self.size = size
        self.inboxes = [ctx.Queue() for _ in range(size)]
        self.outbox = ctx.Queue()
        port = free_port()
        self.procs = [
            ctx.Process(target=_serve, args=(r, size, port, box, self.outbox), daemon=True)
            for r, box in enumerate(self.inboxes)
        ]
        for p in self.procs:
            p.start()

    def call(self, target, extra: tuple, deadline_s: float) -> dict:
        for box in self.inboxes:
            box.put((target, extra))
        results, deadline = {}, time.monotonic() + deadline_s
        while len(results) < self.size:
            try:
                rank, value = self.outbox.get(timeout=1.0)
                results[rank] = value
                continue
            except queue_module.Empty:
                pass
            dead = [r for r, p in enumerate(self.procs) if p.exitcode is not None]
            if dead:
                code = self.procs[dead[0]].exitcode
                results["died"] = f"rank {dead[0]} died without a result (exit code {code})"
                break
            if time.monotonic() > deadline:
                missing = self.size - len(results)
                results["timeout"] = f"no result within {deadline_s}s from {missing} ranks"
                break
        return results

    def close(self) -> None:
        """Let every rank leave its process group and exit."""
        for box in self.inboxes:
            box.put(None)
        for p in self.procs:
            p.join(timeout=5)
        self.kill()

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(timeout=5)
        for q in (*self.inboxes, self.outbox):
            q.cancel_join_thread()  # what a killed rank never read is dropped
            q.close()


def _serve(rank: int, world: int, port: int, inbox, outbox) -> None:
    """A rank's loop: join the group, then run each call until told to stop (None)."""
    from ddp_workers import init

    init(rank, world, port)
    start = torch.get_rng_state(), random.getstate()
    try:
        while (task := inbox.get()) is not None:
            target, extra = task
            torch.set_rng_state(start[0])
            random.setstate(start[1])
            try:
                outbox.put((rank, target(rank, world, *extra)))
            except Exception as e:  # reported to the test, which fails on it
                outbox.put((rank, f"error: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        dist.destroy_process_group()

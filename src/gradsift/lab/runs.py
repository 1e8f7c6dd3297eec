"""One experiment run (data, model, prune, train -> a ``RunRecord`` of
``gradsift.lab.records``), on one process or as one rank of a data-parallel run, and
sweeps of runs that resume: finished runs are skipped and each result is saved
atomically."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict

import torch

from gradsift import prune_at_init, sparsity_report
from gradsift.lab import processes
from gradsift.lab.atomic import atomic_write_json, locked_folder
from gradsift.lab.comm import dense_ratio
from gradsift.lab.data import load_dataset, loader
from gradsift.lab.models import build_model
from gradsift.lab.parallel import ddp_setup, fsdp_setup
from gradsift.lab.records import RunRecord, diverged, load_results
from gradsift.lab.specs import RunSpec
from gradsift.lab.training import TrainConfig, single_process_setup, train_run
from gradsift.pruning import hold_masks, supported_options

__all__ = ["prune_for_run", "run_many", "run_one", "run_sweep", "usable_cores"]

log = logging.getLogger(__name__)


def prune_for_run(
    model,
    ds,
    method: str,
    sparsity: float,
    *,
    iterations: int = 1,
    seed: int = 0,
    shuffle: bool = False,
    allocation: str = "global",
    sanity: str | None = None,
) -> dict:
    """Prune ``model`` at init on ``ds``'s training set as every run does; the masks.

    Seeded batches of 128; every option the method takes from what a run knows
    (``seed``, ``num_classes``, and 10 samples per class: digits' train split holds at
    least 120 of each); ``allocation`` and the ``sanity`` variant (or ``shuffle``, its
    older form) as ``prune_at_init`` takes them, their randomness seeded by ``seed``.
    """
    batches = loader(ds.train, batch_size=128, shuffle=True, seed=seed)
    options = supported_options(method, seed=seed, num_classes=ds.num_classes, samples_per_class=10)
    return prune_at_init(
        model,
        method,
        sparsity,
        batches,
        iterations=iterations,
        allocation=allocation,
        shuffle=shuffle,
        sanity=sanity,
        generator=torch.Generator().manual_seed(seed),
        **options,
    )


def run_one(
    spec: RunSpec, *, rank: int = 0, world: int = 1, checkpoint_dir=None, progress: bool = False
) -> dict | None:
    """Build, prune (if ``spec.method``), train and evaluate; rank 0 returns the record.

    With ``world > 1`` the process group must exist (``gradsift.lab.launch``); the
    model is then trained with DDP, or sharded with FSDP2 when ``spec.train.fsdp``
    (and then pruned on its shards, the masks held by ``gradsift.pruning.hold_masks``).
    """
    torch.manual_seed(spec.seed)  # the same initial model on every rank
    ds = load_dataset(spec.dataset, root=spec.data_root, seed=0)
    model = build_model(spec.model, input_shape=ds.input_shape, num_classes=ds.num_classes)
    cfg = TrainConfig(**{**asdict(spec.train), "seed": spec.seed})
    sharded = world > 1 and cfg.fsdp
    setup = fsdp_setup(model, ds.train, cfg, rank, world) if sharded else None
    start = time.perf_counter()
    masks = _prune_spec(model, ds, spec) if spec.method is not None else None
    prune_seconds = time.perf_counter() - start
    if sharded and masks is not None:  # pruned shards: kept at zero while training
        hold_masks(setup.optimizer, model, masks)
    if world > 1 and not sharded:
        setup = ddp_setup(model, ds.train, cfg, rank, world)
    elif world == 1:
        setup = single_process_setup(model, ds.train, cfg)
    setup.run = spec.key()
    result = train_run(setup, cfg, ds.test, checkpoint_dir=checkpoint_dir, progress=progress)
    report = sparsity_report(model)  # a collective on a sharded model
    if rank != 0:
        return None
    return RunRecord.of(
        spec,
        world_size=world,
        kept=report.kept,
        total=report.total,
        collapsed=report.collapsed,
        test_accuracy=result["test_accuracy"],
        test_loss=result["test_loss"],
        history=result["history"],
        prune_seconds=prune_seconds,
        seconds=prune_seconds + result["seconds"],
        compression_ratio=(
            setup.hook_state.compression_ratio if setup.hook_state else dense_ratio(cfg, model)
        ),
        grad_density=None if cfg.k is None else cfg.k / _trainable(model),
        diverged=diverged(result),
        sharded=sharded,
    ).to_dict()


def _trainable(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _prune_spec(model, ds, spec: RunSpec) -> dict:
    """``prune_for_run`` as ``spec`` says (on a sharded model: its shards)."""
    return prune_for_run(
        model,
        ds,
        spec.method,
        spec.sparsity,
        iterations=spec.iterations,
        seed=spec.seed,
        allocation=spec.allocation,
        sanity=spec.variant,
    )


def run_sweep(specs: list[RunSpec], path, *, progress: bool = False, on_result=None, jobs: int = 1):
    """Run every spec not already in ``path``; rewrite ``path`` atomically after each.

    Returns all results (old and new). Interrupting leaves ``path`` valid JSON holding
    every finished run, so the same call resumes where it stopped. ``jobs > 1`` runs
    that many single-threaded worker processes (the small models of the studies use
    cores better one run per core than one run on all of them); results are then
    saved in the order they finish. Each save re-reads ``path`` under a lock of its
    folder, so that two sweeps writing to one file keep each other's runs.
    """
    results = load_results(path)
    done = {r["key"] for r in results}
    todo = list({s.key(): s for s in specs if s.key() not in done}.values())
    log.info("%d of %d runs already in %s", len(specs) - len(todo), len(specs), path)
    for record in run_many(todo, jobs=jobs, progress=progress):
        with locked_folder(os.path.dirname(os.path.abspath(path))):
            results = load_results(path)
            if all(r["key"] != record["key"] for r in results):
                results.append(record)
            atomic_write_json(path, {"runs": results})
        if on_result is not None:
            on_result(record)
    return results


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the platform has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _worker_init(environ: dict) -> None:
    processes.adopt_environ(environ)
    torch.set_num_threads(1)


def run_many(specs: list[RunSpec], *, jobs: int = 1, progress: bool = False, in_order=False):
    """Each spec's record (``run_one``), in this process or in ``jobs`` single-threaded
    worker processes; as they finish, or in the order of ``specs`` with ``in_order``.

    In workers, a run that fails cancels the runs still waiting; without ``in_order``
    the runs already under way are finished and yielded first (a sweep saves them),
    then the first failure is raised."""
    if jobs == 1 or len(specs) <= 1:
        yield from (run_one(spec, progress=progress) for spec in specs)
        return
    with ProcessPoolExecutor(
        min(jobs, len(specs)),
        mp_context=processes.context(),  # not fork, which would copy torch's thread pools
        initializer=_worker_init,
        initargs=(dict(os.environ),),
    ) as pool:
        futures = [pool.submit(run_one, spec) for spec in specs]
        failure = None
        try:
            for f in futures if in_order else as_completed(futures):
                if f.cancelled():
                    continue
                try:
                    record = f.result()
                except Exception as exc:  # noqa: BLE001 - raised once the others are in
                    if in_order:
                        raise
                    failure = failure or exc
                    for g in futures:
                        g.cancel()
                    continue
                yield record
            if failure is not None:
                raise failure
        finally:
            for f in futures:
                f.cancel()

"""What each ``gradsift`` command does (the parser is in ``gradsift.lab.cli``)."""

from __future__ import annotations

import argparse
import io
import os
import shlex
from functools import partial
from pathlib import Path

from gradsift.lab.atomic import atomic_write_bytes, atomic_write_json
from gradsift.lab.option_checks import check_bench, check_fsdp, check_train, check_training
from gradsift.lab.tables import Column, columns, percent, render

__all__ = ["demo", "prune", "train", "sweep", "experiment", "bench"]

def _feedback(row: dict) -> str | None:
    """Whether a top-k run kept its unsent gradient (blank for dense updates, whose
    records say grad density 1)."""
    if row.get("grad_density") in (None, 1.0):
        return None
    return "yes" if row.get("error_feedback") else "no"


RUN_COLUMNS = [
    *columns(
        """
        method         method        s
        sparsity       sparsity      g
        grad_density   grad density  g
        """
    ),
    Column(_feedback, "error feedback"),
    *columns(
        """
        test_accuracy  test acc      .4f
        seconds        seconds       .1f
        """
    ),
]


def _spec(args: argparse.Namespace, **overrides):
    from gradsift.lab.specs import RunSpec
    from gradsift.lab.training import TrainConfig

    cfg = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        density=args.density,
        error_feedback=args.error_feedback,
        seed=getattr(args, "seed", 0),  # a sweep names its seeds in overrides
        device=args.device,
        comm=getattr(args, "comm", None),
        fsdp=getattr(args, "fsdp", False),
    )
    fields = dict(
        model=args.model,
        dataset=args.dataset,
        method=getattr(args, "method", None),  # a sweep names methods in overrides
        sparsity=_sparsity(args) if getattr(args, "method", None) else 0.0,
        iterations=args.iterations,
        seed=getattr(args, "seed", 0),
        train=cfg,
        data_root=args.data_root,
        allocation=getattr(args, "allocation", "global"),  # a sweep names them in overrides
        sanity=getattr(args, "sanity", None),
    )
    fields.update(overrides)
    return RunSpec(**fields)


def _sparsity(args: argparse.Namespace) -> float:
    return 0.9 if args.sparsity is None else args.sparsity  # --sparsity's default


def demo(args: argparse.Namespace) -> int:
    from gradsift import list_methods
    from gradsift.lab.demo import plot_demo, run_demo, summary
    from gradsift.lab.plots import have_matplotlib

    out, methods, sparsities = Path(args.out), list_methods(), args.sparsities
    print(
        "gradsift demo: LeNet-5 on the embedded digits (1,797 8x8 images), "
        f"{args.epochs} epochs per run: (1) pruned at init by each method at "
        f"{', '.join(percent(s) for s in sparsities)} sparsity, (2) trained with the top "
        f"{percent(args.density)} of gradient coordinates per step; results in {out}/"
    )
    res = run_demo(methods, sparsities, args.density, args.epochs, args.seed, jobs=args.jobs)
    rows = [res["unpruned"], *res["pruned"].values(), *res["topk"].values()]
    print()
    print(render(rows, RUN_COLUMNS))
    print()
    print("\n".join(summary(res, methods, sparsities, args.density)))
    atomic_write_json(out / "results.json", {"command": "gradsift demo", "runs": rows})
    print(f"\nwrote {out / 'results.json'}")
    if not have_matplotlib():
        print("matplotlib not installed: no plot (pip install 'gradsift[plots]')")
        return 0
    plot_demo(res, methods, sparsities, args.density, out / "demo.png")
    print(f"wrote {out / 'demo.png'}")
    return 0


def prune(args: argparse.Namespace) -> int:
    import torch

    from gradsift import sparsity_report
    from gradsift.lab.data import load_dataset
    from gradsift.lab.models import build_model
    from gradsift.lab.runs import prune_for_run

    torch.manual_seed(args.seed)
    ds = load_dataset(args.dataset, root=args.data_root)
    model = build_model(args.model, input_shape=ds.input_shape, num_classes=ds.num_classes)
    model.to(args.device)
    masks = prune_for_run(
        model,
        ds,
        args.method,
        _sparsity(args),
        iterations=args.iterations,
        seed=getattr(args, "seed", 0),
        allocation=args.allocation,
        sanity=args.sanity,
    )
    report = sparsity_report(model)
    print(report)
    if report.collapsed:
        print(f"warning: layer collapse in {report.collapsed}")
    if args.out:
        out = Path(args.out)
        atomic_write_json(out / "report.json", report.to_dict())
        buf = io.BytesIO()
        torch.save(masks, buf)
        atomic_write_bytes(out / "masks.pt", buf.getvalue())
        print(f"wrote {out / 'report.json'} and {out / 'masks.pt'}")
    return 0


def train(args: argparse.Namespace) -> int:
    from gradsift.lab import launch
    from gradsift.lab.runs import run_one

    ckpt = args.checkpoint
    if args.fsdp:
        check_fsdp(args, launch.under_torchrun())
    check_train(args, launch.under_torchrun())  # before any rank starts
    if launch.under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        record = launch.run_rank(_spec(args), rank=rank, world=world, checkpoint_dir=ckpt)
        if record is None:
            return 0
    elif args.nproc > 1:
        record = launch.spawn(_spec(args), args.nproc, checkpoint_dir=ckpt)
    else:
        record = run_one(_spec(args), checkpoint_dir=ckpt, progress=True)
    print(render([record], RUN_COLUMNS))
    if record.get("sharded"):
        print(f"sharded with FSDP2 on {record['world_size']} ranks, top-k across the shards")
    elif record["world_size"] > 1:
        print(f"gradient traffic: {record['compression_ratio']:.1f}x less than allreduce")
    if args.out:
        path = Path(args.out) / "result.json"
        atomic_write_json(path, record)
        print(f"wrote {path}")
    return 0


def sweep(args: argparse.Namespace) -> int:
    from gradsift import list_methods
    from gradsift.lab.plots import have_matplotlib, plot_accuracy_vs_sparsity
    from gradsift.lab.studies.common import study_runs

    check_training(args)
    methods = args.methods or list_methods()
    unknown = sorted(set(methods) - set(list_methods()))
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {list_methods()}")
    # ``--shuffle`` and ``--sanity shuffle-layer`` are one run: run_sweep skips the twin
    variants = [None] + (["shuffle-layer"] if args.shuffle else []) + args.sanity
    specs = [
        _spec(args, method=m, sparsity=s, seed=seed, allocation=a, sanity=v)
        for m in methods
        for s in args.sparsities
        for seed in args.seeds
        for a in args.allocations
        for v in variants
    ]
    out = Path(args.out)
    path = out / "results.json"

    def report(r):
        allocation = "" if r["allocation"] == "global" else f" allocation {r['allocation']}"
        sanity = f" {r['sanity']}" if r["sanity"] else ""
        print(
            f"  {r['method']:>9} sparsity {r['sparsity']:.3f} seed {r['seed']}"
            f"{allocation}{sanity}: acc {r['test_accuracy']:.4f}"
        )

    runs = study_runs(specs, path, on_result=report, jobs=args.jobs)
    print(f"{len(runs)} runs of this sweep in {path}")
    if have_matplotlib():
        plot_accuracy_vs_sparsity(
            runs, out / "accuracy_vs_sparsity.png", title=f"{args.model} on {args.dataset}"
        )
        print(f"wrote {out / 'accuracy_vs_sparsity.png'}")
    return 0


def experiment(args: argparse.Namespace) -> int:
    from gradsift.lab.studies import run_study

    command = f"gradsift experiment {args.study}" + (" --quick" if args.quick else "")
    out = args.out or ("gradsift-quick" if args.quick else "docs/results")
    if args.out is not None:
        command += f" --out {shlex.quote(str(out))}"  # re-runnable in a shell
    if args.jobs != 1:
        command += f" --jobs {args.jobs}"
    run_study(args.study, out, quick=args.quick, command=command, jobs=args.jobs)
    print((Path(out) / f"{args.study}.md").read_text())
    print(f"wrote {out}/{args.study}.json, .md and .png")
    return 0


def _gpu_bench(args: argparse.Namespace):
    """The GPU form of ``bench select|step`` with its device bound (it checks it)."""
    from gradsift.lab.bench.gpu import GPU_BENCHES

    if args.what not in GPU_BENCHES:
        raise ValueError(f"--device {args.device} is for bench {' or '.join(GPU_BENCHES)}")
    run, columns = GPU_BENCHES[args.what]
    return partial(run, device=args.device), columns


def _given(args: argparse.Namespace, *names: str) -> dict:
    """The options given on the command line; the bench's own defaults stand for the rest."""
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def bench(args: argparse.Namespace) -> int:
    from gradsift.lab.bench import BENCHES

    check_bench(args)
    run, columns = BENCHES[args.what]
    if args.what == "iteration":
        run = partial(run, device=args.device)
    elif args.device != "cpu" and args.what != "prune-memory":
        run, columns = _gpu_bench(args)
    if args.what == "ddp":
        ddp = _given(args, "model", "steps", "batch")
        rows = [r for rate in args.bandwidth or [None] for r in run(bandwidth=rate, **ddp)]
        columns = [Column(lambda r: r.get("bandwidth", "unshaped"), "link"), *columns]
    else:
        options = _given(args, "repeats", "sizes")
        if args.what == "prune-memory":
            options.update(device=args.device, **_given(args, "network", "width", "depth"))
        rows = run(**options)
    print(render(rows, columns))
    if args.json:
        atomic_write_json(args.json, {"benchmark": args.what, "rows": rows})
    return 0

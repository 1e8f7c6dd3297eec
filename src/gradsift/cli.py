"""The ``gradsift`` command line: demo, prune, train, sweep, bench."""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys

from gradsift.io import atomic_write_bytes, atomic_write_json

__all__ = ["main", "build_parser"]


def _print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """Print ``rows`` as an aligned table of ``(key, header, format)`` columns."""
    cells = [[h for _, h, _ in columns]]
    cells += [[format(r[key], fmt) for key, _, fmt in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    for j, line in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)))
        if j == 0:
            print("  ".join("-" * w for w in widths))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


_RUN_COLUMNS = [
    ("method", "method", "s"),
    ("sparsity", "sparsity", ".2f"),
    ("grad_density", "grad density", "g"),
    ("test_accuracy", "test acc", ".4f"),
    ("seconds", "seconds", ".1f"),
]


def _spec(args: argparse.Namespace, **overrides):
    from gradsift.runs import RunSpec
    from gradsift.train import TrainConfig

    cfg = TrainConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        density=args.density,
        error_feedback=args.error_feedback,
        seed=args.seed,
        device=args.device,
    )
    fields = dict(
        model=args.model,
        dataset=args.dataset,
        method=args.method,
        sparsity=args.sparsity if args.method else 0.0,
        iterations=args.iterations,
        seed=args.seed,
        train=cfg,
        data_root=args.data_root,
    )
    fields.update(overrides)
    return RunSpec(**fields)


def _cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gradsift.plots import have_matplotlib
    from gradsift.pruning import list_methods
    from gradsift.runs import RunSpec, run_one
    from gradsift.train import TrainConfig

    out = Path(args.out)
    print(
        f"gradsift demo: LeNet-5 on the embedded digits (1,797 8x8 images), pruned at "
        f"init to {args.sparsity:.0%} sparsity, trained with top-{args.density:g} "
        f"gradients + error feedback; results in {out}/"
    )
    rows = []
    dense = TrainConfig(epochs=args.epochs, density=None, seed=args.seed)
    sparse = TrainConfig(epochs=args.epochs, density=args.density, seed=args.seed)
    plan = [(None, dense)] + [(m, sparse) for m in [None, *list_methods()]]
    for method, cfg in plan:
        spec = RunSpec(
            method=method, sparsity=args.sparsity if method else 0.0, seed=args.seed, train=cfg
        )
        rows.append(run_one(spec, progress=True))
        r = rows[-1]
        print(
            f"  {r['method']:>9}, gradient density {r['grad_density']:g}: "
            f"test accuracy {r['test_accuracy']:.4f}"
        )
    print()
    _print_table(rows, _RUN_COLUMNS)
    atomic_write_json(out / "results.json", {"command": "gradsift demo", "runs": rows})
    print(f"\nwrote {out / 'results.json'}")
    if have_matplotlib():
        _plot_demo(rows, out / "demo.png")
        print(f"wrote {out / 'demo.png'}")
    else:
        print("matplotlib not installed: no plot (pip install 'gradsift[plots]')")
    return 0


def _plot_demo(rows: list[dict], path) -> None:
    from gradsift.plots import plot_bars

    plot_bars(
        [f"{r['method']}\ndensity {r['grad_density']:g}" for r in rows],
        [100 * r["test_accuracy"] for r in rows],
        path,
        ylabel="test accuracy (%)",
        title="LeNet-5 on digits: pruned at init, trained with top-k sparse gradients",
    )


def _cmd_prune(args: argparse.Namespace) -> int:
    from pathlib import Path

    import torch

    from gradsift.data import load_dataset
    from gradsift.models import build_model
    from gradsift.pruning import sparsity_report
    from gradsift.runs import prune_for_run

    torch.manual_seed(args.seed)
    ds = load_dataset(args.dataset, root=args.data_root)
    model = build_model(args.model, input_shape=ds.input_shape, num_classes=ds.num_classes)
    model.to(args.device)
    masks = prune_for_run(
        model, ds, args.method, args.sparsity, iterations=args.iterations, seed=args.seed
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


def _cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gradsift import ddp_train
    from gradsift.runs import run_one

    if ddp_train.under_torchrun():
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        record = ddp_train.train_ddp(_spec(args), rank=rank, world=world, out=args.out)
        if record is None:
            return 0
    elif args.nproc > 1:
        record = ddp_train.spawn(_spec(args), args.nproc, out=args.out)
    else:
        record = run_one(_spec(args), progress=True)
    _print_table([record], _RUN_COLUMNS)
    if "compression_ratio" in record:
        print(f"gradient traffic: {record['compression_ratio']:.1f}x less than allreduce")
    if args.out:
        path = Path(args.out) / "result.json"
        atomic_write_json(path, record)
        print(f"wrote {path}")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gradsift.plots import have_matplotlib, plot_accuracy_vs_sparsity
    from gradsift.pruning import list_methods
    from gradsift.runs import run_sweep

    methods = args.methods or list_methods()
    unknown = sorted(set(methods) - set(list_methods()))
    if unknown:
        raise ValueError(f"--methods: unknown {unknown}; choose from {list_methods()}")
    specs = [
        _spec(args, method=m, sparsity=s, seed=seed, shuffle=shuffle)
        for m in methods
        for s in args.sparsities
        for seed in args.seeds
        for shuffle in ([False, True] if args.shuffle else [False])
    ]
    out = Path(args.out)
    path = out / "results.json"

    def report(r):
        print(
            f"  {r['method']:>9} sparsity {r['sparsity']:.3f} seed {r['seed']}"
            f"{' shuffled' if r['shuffle'] else ''}: acc {r['test_accuracy']:.4f}"
        )

    runs = run_sweep(specs, path, on_result=report)
    print(f"{len(runs)} runs in {path}")
    if have_matplotlib():
        plot_accuracy_vs_sparsity(
            runs, out / "accuracy_vs_sparsity.png", title=f"{args.model} on {args.dataset}"
        )
        print(f"wrote {out / 'accuracy_vs_sparsity.png'}")
    return 0


def _cmd_experiment(args: argparse.Namespace) -> int:
    from gradsift.experiments import run_study

    command = f"gradsift experiment {args.study}" + (" --quick" if args.quick else "")
    if args.out != "docs/results":
        command += f" --out {args.out}"
    run_study(args.study, args.out, quick=args.quick, command=command)
    from pathlib import Path

    print((Path(args.out) / f"{args.study}.md").read_text())
    print(f"wrote {args.out}/{args.study}.json, .md and .png")
    return 0


_BENCH_COLUMNS = {
    "select": [
        ("n", "N", "d"),
        ("k", "k", "d"),
        ("ours_ms", "ours ms", ".2f"),
        ("torch_topk_ms", "topk(|x|) ms", ".2f"),
        ("abs_pass_ms", "abs pass ms", ".2f"),
        ("speedup_vs_topk", "topk/ours", ".1f"),
        ("ours_over_abs_pass", "ours/abs", ".1f"),
    ],
    "step": [
        ("density", "density", "g"),
        ("k", "k", "d"),
        ("topk_ef_ms", "TopK+EF ms", ".2f"),
        ("dense_sgd_ms", "dense SGD ms", ".2f"),
        ("naive_ms", "naive ms", ".1f"),
        ("ours_over_dense", "ours/dense", ".2f"),
        ("naive_over_ours", "naive/ours", ".1f"),
        ("other_extra_over_param_bytes", "extra-residual/params", ".3f"),
    ],
    "score": [
        ("method", "method", "s"),
        ("model", "model", "s"),
        ("samples", "samples", "d"),
        ("chunk_size", "chunk", "d"),
        ("keep_graphs", "keep_graphs", ""),
        ("seconds", "seconds", ".2f"),
        ("peak_mib", "peak MiB", ".0f"),
        ("time_over_reference", "time/ref", ".2f"),
        ("memory_over_reference", "mem/ref", ".2f"),
    ],
    "ddp": [
        ("label", "hook", "s"),
        ("step_ms", "step ms", ".1f"),
        ("time_over_allreduce", "time/allreduce", ".2f"),
        ("sent_kib", "KiB sent/step", ".1f"),
        ("dense_kib", "KiB dense/step", ".1f"),
        ("compression", "dense/sent", ".1f"),
    ],
}


def _bench_rows(args: argparse.Namespace) -> list[dict]:
    from gradsift import bench

    if args.what == "select":
        sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
        return bench.bench_select(**({"sizes": sizes} if sizes else {}), repeats=args.repeats)
    if args.what == "step":
        return bench.bench_step(repeats=args.repeats)
    if args.what == "score":
        rows = bench.bench_score(repeats=args.repeats)
        for r in rows:
            r["peak_mib"] = r["peak_bytes"] / 2**20
        return rows
    rows = bench.bench_ddp()
    for r in rows:
        r["label"] = "allreduce" if r["density"] is None else f"top-k {r['density']:g}"
        r["sent_kib"] = (r["bytes_sent_per_step"] or float("nan")) / 1024
        r["dense_kib"] = (r["bytes_dense_per_step"] or float("nan")) / 1024
        r.setdefault("compression", 1.0)
    return rows


def _cmd_bench(args: argparse.Namespace) -> int:
    rows = _bench_rows(args)
    _print_table(rows, _BENCH_COLUMNS[args.what])
    if args.json:
        atomic_write_json(args.json, {"benchmark": args.what, "rows": rows})
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit code 2) instead of usage + message."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _fraction(low_open: bool, high_open: bool, what: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number, got {text!r}") from None
        low_ok = value > 0 if low_open else value >= 0
        high_ok = value < 1 if high_open else value <= 1
        if not (low_ok and high_ok):
            lo, hi = "(" if low_open else "[", ")" if high_open else "]"
            raise argparse.ArgumentTypeError(f"{what} must be in {lo}0, 1{hi}, got {text}")
        return value

    return parse


_sparsity = _fraction(False, True, "sparsity")
_density = _fraction(True, False, "density")


def _list_of(parse):
    def parse_list(text: str):
        return [parse(t) for t in text.split(",") if t.strip()]

    return parse_list


def _add_common(p: argparse.ArgumentParser, *, method_required: bool = False) -> None:
    from gradsift.data import list_datasets
    from gradsift.models import list_models
    from gradsift.pruning import list_methods

    p.add_argument("--model", default="lenet5", choices=list_models())
    p.add_argument("--dataset", default="digits", choices=list_datasets())
    p.add_argument("--data-root", help="folder holding cifar-10-batches-py/ etc.")
    p.add_argument(
        "--method",
        required=method_required,
        choices=list_methods(),
        help="pruning-at-init method (default: no pruning)",
    )
    p.add_argument("--sparsity", type=_sparsity, default=0.9, help="fraction pruned")
    p.add_argument(
        "--iterations",
        type=_positive_int,
        default=1,
        help="prune in this many rounds (SynFlow uses 100)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", help="output folder")


def _add_training(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=_positive_int, default=10)
    p.add_argument("--batch-size", type=_positive_int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument(
        "--density",
        type=_density,
        default=None,
        help="gradient density for top-k updates (default: dense)",
    )
    p.add_argument(
        "--no-error-feedback",
        dest="error_feedback",
        action="store_false",
        help="drop unselected gradient mass instead of keeping it",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gradsift",
        description="Gradient-signal sparsity: top-k sparse updates and pruning at init.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    d = sub.add_parser("demo", help="the main job: prune + top-k train on digits")
    d.add_argument("--out", default="gradsift-demo", help="output folder")
    d.add_argument("--sparsity", type=_sparsity, default=0.9)
    d.add_argument("--density", type=_density, default=0.01)
    d.add_argument("--epochs", type=_positive_int, default=20)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(func=_cmd_demo)

    p = sub.add_parser("prune", help="prune a model at init and report per-layer density")
    _add_common(p, method_required=True)
    p.set_defaults(func=_cmd_prune)

    t = sub.add_parser("train", help="(prune and) train one model")
    _add_common(t)
    _add_training(t)
    t.add_argument(
        "--nproc", type=_positive_int, default=1, help="data-parallel processes (gloo on CPU)"
    )
    t.set_defaults(func=_cmd_train)

    w = sub.add_parser("sweep", help="methods x sparsities x seeds, resumable")
    _add_common(w)
    _add_training(w)
    w.add_argument(
        "--methods", type=_list_of(str), default=None, help="comma-separated methods (default: all)"
    )
    w.add_argument("--sparsities", type=_list_of(_sparsity), default=[0.5, 0.9, 0.98])
    w.add_argument("--seeds", type=_list_of(int), default=[0, 1, 2])
    w.add_argument(
        "--shuffle", action="store_true", help="also run each with layer-wise shuffled masks"
    )
    w.set_defaults(func=_cmd_sweep, out="gradsift-sweep")

    e = sub.add_parser("experiment", help="regenerate a study of docs/results.md")
    e.add_argument("study", choices=["collapse", "accuracy", "topk", "speed"])
    e.add_argument("--quick", action="store_true", help="a reduced form (for tests)")
    e.add_argument("--out", default="docs/results", help="output folder")
    e.set_defaults(func=_cmd_experiment)

    b = sub.add_parser("bench", help="measure speed as ratios against baselines")
    b.add_argument("what", choices=["select", "step", "score", "ddp"], help="what to benchmark")
    b.add_argument("--repeats", type=_positive_int, default=7, help="timed calls per entry")
    b.add_argument("--sizes", help="comma-separated N values (select)")
    b.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    b.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, FileNotFoundError) as exc:
        print(f"gradsift: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``gradsift`` command line: demo, prune, train, sweep, experiment, bench.

Bad arguments and bad input exit with code 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys

from gradsift.lab import commands
from gradsift.lab.arg_types import (
    Renamed as _Renamed,
    allocation as _allocation,
    checked as _checked,
    density as _density,
    device as _device,
    list_of as _list_of,
    lr as _lr,
    positive_int as _positive_int,
    sanity as _sanity,
    seed as _seed,
    sparsity as _sparsity,
)
from gradsift.lab.comm import COMMS
from gradsift.lab.launch import RankFailedError
from gradsift.lab.option_checks import check_folders
from gradsift.lab.shaping import check_rate

__all__ = ["main", "build_parser"]


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults in ``--help``, except None and on/off flags (where they only confuse)."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (exit code 2) instead of usage + message, the
    defaults in ``--help``, and ``-v`` accepted after the subcommand too."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _command(sub, name: str, help: str) -> argparse.ArgumentParser:  # noqa: A002
    """A subcommand; ``-v`` works after it too (SUPPRESS: it never resets the top one)."""
    p = sub.add_parser(name, help=help)
    p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    return p


def _add_common(
    p: argparse.ArgumentParser, *, method_required: bool = False, sweep: bool = False
) -> None:
    from gradsift import list_methods
    from gradsift.lab.data import list_datasets
    from gradsift.lab.models import list_models

    p.add_argument("--model", default="lenet5", choices=list_models(), help="network")
    p.add_argument("--dataset", default="digits", choices=list_datasets(), help="data set")
    p.add_argument("--data-root", help="folder holding cifar-10-batches-py/ etc.")
    if not sweep:  # a sweep takes --methods, --sparsities, --seeds (the singular as aliases)
        p.add_argument("--seed", type=_seed, default=0, help="seeds the model, data order, pruning")
        p.add_argument(
            "--method",
            required=method_required,
            choices=list_methods(),
            help="pruning-at-init method" + ("" if method_required else " (default: none)"),
        )
        p.add_argument("--sparsity", type=_sparsity, help="fraction pruned (default: 0.9)")
        p.add_argument(
            "--allocation",
            "--budget",
            type=_allocation,
            default="global",
            action=_Renamed,
            help="how the kept weights are spread over layers: global, uniform, er, erk, "
            "uniform+dense-first (--budget: its deprecated name)",
        )
        p.add_argument(
            "--sanity",
            type=_sanity,
            default=None,
            help="sanity-check variant: reinit, invert, shuffle-layer, shuffle-global",
        )
    p.add_argument(
        "--iterations",
        type=_positive_int,
        default=1,
        help="prune in this many rounds (SynFlow uses 100)",
    )
    ranks = " (NCCL with --nproc)" if not (method_required or sweep) else ""
    p.add_argument("--device", type=_device, default="cpu", help="cpu or cuda" + ranks)
    p.add_argument("--out", help="output folder")


def _add_training(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=_positive_int, default=10, help="training epochs")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="per process")
    p.add_argument("--lr", type=_lr, default=0.05, help="SGD learning rate (cosine schedule)")
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


def _demo_parser(sub) -> None:
    d = _command(sub, "demo", help="the main job: prune + top-k train on digits")
    d.add_argument("--out", default="gradsift-demo", help="output folder")
    d.add_argument(
        "--sparsities",
        "--sparsity",
        type=_list_of(_sparsity),
        default=[0.8, 0.9],
        help="comma-separated fractions pruned at init",
    )
    d.add_argument("--density", type=_density, default=0.01, help="gradient density")
    d.add_argument("--epochs", type=_positive_int, default=20, help="training epochs")
    d.add_argument("--seed", type=_seed, default=0, help="seeds everything")
    _add_jobs(
        d,
        "runs at a time, each in its own single-threaded process (default: the "
        "cores this process may use, at most 4)",
        default=None,
    )
    d.set_defaults(func=commands.demo)


def _train_parsers(sub) -> None:
    p = _command(sub, "prune", help="prune a model at init and report per-layer density")
    _add_common(p, method_required=True)
    p.set_defaults(func=commands.prune)

    t = _command(sub, "train", help="(prune and) train one model")
    _add_common(t)
    _add_training(t)
    t.add_argument("--nproc", "--ranks", type=_positive_int, default=1, help="ranks (gloo on CPU)")
    t.add_argument("--fsdp", action="store_true", help="with --nproc: FSDP2, TopK across shards")
    t.add_argument(
        "--comm",
        choices=COMMS,
        help="gradient communication with --nproc (default: topk with --density, else allreduce)",
    )
    t.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="checkpoint every epoch into DIR; resume from it if present",
    )
    t.set_defaults(func=commands.train)

    w = _command(sub, "sweep", help="methods x sparsities x seeds, resumable")
    _add_common(w, sweep=True)
    _add_training(w)
    w.add_argument(
        "--methods",
        "--method",
        type=_list_of(str),
        default=None,
        help="comma-separated methods (default: all)",
    )
    w.add_argument(
        "--sparsities",
        "--sparsity",
        type=_list_of(_sparsity),
        default=[0.5, 0.9, 0.98],
        help="comma-separated",
    )
    w.add_argument("--seeds", "--seed", type=_list_of(_seed), default=[0, 1, 2], help="a,b,...")
    w.add_argument(
        *("--allocations", "--allocation", "--budgets", "--budget"),
        type=_list_of(_allocation),
        default=["global"],
        action=_Renamed,
        help="comma-separated layer allocations (--budgets: deprecated)",
    )
    w.add_argument(
        "--shuffle", action="store_true", help="also run each with layer-wise shuffled masks"
    )
    w.add_argument(
        "--sanity",
        type=_list_of(_sanity),
        default=[],
        help="also run each with these comma-separated sanity variants "
        "(reinit, invert, shuffle-layer, shuffle-global)",
    )
    _add_jobs(w, "runs at a time, each in its own single-threaded process")
    w.set_defaults(func=commands.sweep, out="gradsift-sweep")


def _add_jobs(p: argparse.ArgumentParser, help: str, default: int | None = 1) -> None:
    p.add_argument("--jobs", type=_positive_int, default=default, help=help)


def _study_parsers(sub) -> None:
    from gradsift.lab.bench import BENCHES
    from gradsift.lab.models import list_models
    from gradsift.lab.studies import STUDIES

    e = _command(sub, "experiment", help="regenerate a study of docs/results.md")
    e.add_argument("study", choices=list(STUDIES))
    e.add_argument("--quick", action="store_true", help="a reduced form (for tests)")
    e.add_argument(
        "--out",
        help="output folder (default: docs/results; with --quick, gradsift-quick, so that a "
        "reduced form never overwrites the committed results)",
    )
    _add_jobs(
        e,
        "training runs at a time, each in its own single-threaded process (accuracy, topk, mnist)",
    )
    e.set_defaults(func=commands.experiment)

    b = _command(sub, "bench", help="measure speed as ratios against baselines")
    b.add_argument("what", choices=list(BENCHES), help="what to benchmark")
    b.add_argument(
        "--repeats", type=_positive_int, help="timed calls per entry (default: the bench's own)"
    )
    b.add_argument(
        "--sizes", type=_list_of(_positive_int), help="comma-separated N (select, sharded)"
    )
    b.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    b.add_argument(
        "--device",
        type=_device,
        default="cpu",
        help="select, step, iteration: 'cuda' times them on a GPU (CUDA events); "
        "prune-memory: 'cuda' measures torch.cuda.max_memory_allocated",
    )
    b.add_argument(
        "--bandwidth",
        type=_list_of(_checked(check_rate)),
        help="ddp: comma-separated emulated loopback rates (100mbit,1gbit,10gbit; needs root)",
    )
    b.add_argument("--model", choices=list_models(), help="ddp: the network (resnet18)")
    b.add_argument("--steps", type=_positive_int, help="ddp: steps (13; 3 untimed)")
    b.add_argument("--batch", type=_positive_int, help="ddp: batch per rank (8)")
    net = "prune-memory: an MLP (default) or a GPT-2 from a config (transformers; GPT-2-XL)"
    b.add_argument("--network", choices=("mlp", "gpt2"), help=net)
    width = "prune-memory: the MLP's width (4096) or GPT-2's n_embd (1600)"
    b.add_argument("--width", type=_positive_int, help=width)
    depth = "prune-memory: the MLP's Linear layers (4) or GPT-2's n_layer (48)"
    b.add_argument("--depth", type=_positive_int, help=depth)
    b.set_defaults(func=commands.bench)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gradsift",
        description="Gradient-signal sparsity: top-k sparse updates and pruning at init.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _demo_parser(sub)
    _train_parsers(sub)
    _study_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        check_folders(args)
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, OSError, ImportError) as exc:
        print(f"gradsift: error: {exc}", file=sys.stderr)
        return 2
    except RankFailedError as exc:
        print(f"gradsift: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

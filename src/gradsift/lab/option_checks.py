"""The combinations of command-line options a command refuses, before any work or
any rank starts: an option the command would ignore is an error naming it, never a
run recorded as if it had been applied."""

from __future__ import annotations

import argparse
import os

__all__ = ["check_bench", "check_folders", "check_fsdp", "check_train", "check_training"]


def check_train(args: argparse.Namespace, torchrun: bool) -> None:
    """Options that would be ignored are errors: pruning ones without ``--method``, a
    ``--comm`` without ranks, a density its communication does not use."""
    from gradsift.lab.comm import check_density

    pruning = {
        "--sparsity": args.sparsity is not None,
        "--allocation": args.allocation != "global",
        "--sanity": args.sanity is not None,
        "--iterations": args.iterations != 1,
    }
    if args.method is None and any(pruning.values()):
        named = ", ".join(k for k, given in pruning.items() if given)
        raise ValueError(f"{named} prune at init: add --method (or leave them out)")
    if args.comm is not None and args.nproc < 2 and not torchrun:
        raise ValueError("--comm is the gradient communication between ranks: add --nproc N")
    check_density(args.comm, args.density)
    check_training(args)
    if args.comm == "topk-dgc" and not args.error_feedback:
        raise ValueError("--comm topk-dgc is DGC's recipe, with error feedback: use --comm topk")


def check_training(args: argparse.Namespace) -> None:
    """The training options of ``train`` and ``sweep``: ``--no-error-feedback`` is for
    top-k training only."""
    if not args.error_feedback and args.density is None:
        raise ValueError(
            "--no-error-feedback is for top-k training: add --density (or leave it out)"
        )


def check_folders(args: argparse.Namespace) -> None:
    """``--out`` and ``--checkpoint`` name folders and ``--json`` a file: where the
    path cannot be one, an error before any work (it failed when the results were
    written, after training or the benchmark)."""
    for option in ("out", "checkpoint"):
        path = getattr(args, option, None)
        if path and os.path.exists(path) and not os.path.isdir(path):
            raise ValueError(f"--{option}: {path} is a file, not a folder")
    path = getattr(args, "json", None)
    if path:
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):  # the nearest that exists: made into folders
            parent = os.path.dirname(parent)
        if os.path.isdir(path):
            raise ValueError(f"--json: {path} is a folder, not a file")
        if not os.path.isdir(parent):
            raise ValueError(f"--json: {parent} is a file, not a folder")


def check_fsdp(args: argparse.Namespace, torchrun: bool) -> None:
    """``--fsdp`` needs several ranks and neither a DDP communication nor a checkpoint;
    pruning there needs a method with a sharded form, global allocation, no sanity
    variant (``gradsift.prune_at_init`` on a sharded model)."""
    from gradsift.pruning import get_method

    if args.method is not None and get_method(args.method).sharded is None:
        raise ValueError(f"--method {args.method} cannot score a sharded model (--fsdp)")
    if args.method is not None and args.allocation != "global":
        raise ValueError(f"--allocation {args.allocation}: --fsdp prunes with global only")
    if args.method is not None and args.sanity is not None:
        raise ValueError(f"--sanity {args.sanity} is not supported with --fsdp")
    if args.nproc < 2 and not torchrun:
        raise ValueError("--fsdp shards over several ranks: add --nproc N (N >= 2) or torchrun")
    if args.comm is not None:
        raise ValueError("--comm is DDP's gradient communication; --fsdp trains with TopK")
    if args.checkpoint:
        raise ValueError("--checkpoint is not supported with --fsdp yet")


def check_bench(args: argparse.Namespace) -> None:
    """An option the benchmark would ignore is an error naming the ones that take it."""
    from gradsift.lab.bench import BENCHES
    from gradsift.lab.bench.ddp_step import WARMUP_STEPS

    takers = {
        "--sizes": (args.sizes, ("select", "sharded")),
        "--repeats": (args.repeats, tuple(b for b in BENCHES if b != "ddp")),
        "--bandwidth": (args.bandwidth, ("ddp",)),
        "--model": (args.model, ("ddp",)),
        "--steps": (args.steps, ("ddp",)),
        "--batch": (args.batch, ("ddp",)),
        "--network": (args.network, ("prune-memory",)),
        "--width": (args.width, ("prune-memory",)),
        "--depth": (args.depth, ("prune-memory",)),
    }
    for option, (value, benches) in takers.items():
        if value is not None and args.what not in benches:
            raise ValueError(f"{option} is for bench {' or '.join(benches)}, not {args.what}")
    if args.steps is not None and args.steps <= WARMUP_STEPS:
        raise ValueError(
            f"--steps {args.steps}: the first {WARMUP_STEPS} are not timed; give at least "
            f"{WARMUP_STEPS + 1}"
        )

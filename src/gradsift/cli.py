"""The ``gradsift`` command line: demo, prune, train, sweep, bench."""

from __future__ import annotations

import argparse
import logging
import sys

from gradsift.io import atomic_write_json

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


def _cmd_bench(args: argparse.Namespace) -> int:
    from gradsift import bench

    if args.what == "select":
        sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
        rows = bench.bench_select(**({"sizes": sizes} if sizes else {}), repeats=args.repeats)
        _print_table(
            rows,
            [
                ("n", "N", "d"),
                ("k", "k", "d"),
                ("ours_ms", "ours ms", ".2f"),
                ("torch_topk_ms", "topk(|x|) ms", ".2f"),
                ("abs_pass_ms", "abs pass ms", ".2f"),
                ("speedup_vs_topk", "topk/ours", ".1f"),
                ("ours_over_abs_pass", "ours/abs", ".1f"),
            ],
        )
    elif args.what == "step":
        rows = bench.bench_step(repeats=args.repeats)
        _print_table(
            rows,
            [
                ("density", "density", "g"),
                ("k", "k", "d"),
                ("topk_ef_ms", "TopK+EF ms", ".2f"),
                ("dense_sgd_ms", "dense SGD ms", ".2f"),
                ("naive_ms", "naive ms", ".1f"),
                ("ours_over_dense", "ours/dense", ".2f"),
                ("naive_over_ours", "naive/ours", ".1f"),
                ("other_extra_over_param_bytes", "extra-residual/params", ".3f"),
            ],
        )
    elif args.what == "score":
        rows = bench.bench_score(repeats=args.repeats)
        for r in rows:
            r["peak_mib"] = r["peak_bytes"] / 2**20
        _print_table(
            rows,
            [
                ("method", "method", "s"),
                ("model", "model", "s"),
                ("samples", "samples", "d"),
                ("chunk_size", "chunk", "d"),
                ("seconds", "seconds", ".2f"),
                ("peak_mib", "peak MiB", ".0f"),
                ("time_over_reference", "time/ref", ".2f"),
                ("memory_over_reference", "mem/ref", ".2f"),
            ],
        )
    if args.json:
        atomic_write_json(args.json, {"benchmark": args.what, "rows": rows})
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gradsift",
        description="Gradient-signal sparsity: top-k sparse updates and pruning at init.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="measure speed as ratios against baselines")
    b.add_argument("what", choices=["select", "step", "score"], help="what to benchmark")
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

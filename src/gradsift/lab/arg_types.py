"""argparse ``type`` functions for the ``gradsift`` command line: each turns a bad
value into argparse's one-line error (exit code 2), most by calling the library's own
check so that the CLI and the API reject the same values with the same words."""

from __future__ import annotations

import argparse
import sys

from gradsift.checks import check_float

__all__ = [
    "checked",
    "number",
    "positive_int",
    "list_of",
    "Renamed",
    "allocation",
    "sanity",
    "device",
    "sparsity",
    "density",
    "lr",
    "seed",
]


def checked(check, *args):
    """An argparse ``type`` from a library check: its ValueError is argparse's error."""

    def parse(text: str):
        try:
            return check(*args, text)
        except (ValueError, TypeError) as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def number(name: str, interval: str):
    def check(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {text!r}") from None
        return check_float(name, value, interval)

    return checked(check)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def list_of(parse):
    """Comma-separated values of ``parse``; a bad item is argparse's one-line error
    saying what was expected (``int`` alone would say 'invalid parse_list value')."""
    expected = {int: "an integer", float: "a number"}.get(parse)

    def parse_list(text: str):
        values = []
        for item in (t for t in text.split(",") if t.strip()):
            try:
                values.append(parse(item))
            except (ValueError, TypeError) as exc:
                why = f"expected {expected}" if expected else str(exc)
                raise argparse.ArgumentTypeError(f"{why}, got {item!r}") from None
        if not values:  # '' or ',' would mean nothing (or, for --methods, everything)
            raise argparse.ArgumentTypeError(f"expected at least one value, got {text!r}")
        return values

    return parse_list


sparsity = number("sparsity", "[0, 1)")
density = number("density", "(0, 1]")
lr = number("lr", "(0, 3.4e38]")  # float32's range: SGD multiplies float32 weights by it


def seed(text: str) -> int:
    """A seed ``torch.manual_seed`` takes: an integer in [0, 2**63 - 1]."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**63 - 1], got {text}")
    return value


def allocation(text: str) -> str:
    from gradsift.pruning.allocation import check_allocation

    return checked(check_allocation)(text)


def sanity(text: str) -> str:
    from gradsift.pruning.sanity import check_sanity

    checked(check_sanity)(text)
    return text


def device(text: str) -> str:
    """A device this torch can use: ``cpu`` (also spelled ``cpu:0``), ``cuda``,
    ``cuda:1`` ..."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(
            f"not a torch device: {text!r} (cpu, cuda, cuda:0, ...)"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(
            f"{text!r}: CUDA is not available (this torch build or machine has no GPU)"
        )
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: gradsift runs on cpu or cuda devices")
    return "cpu" if device.type == "cpu" else text  # cpu:0 is the CPU, not a GPU bench


class Renamed(argparse.Action):
    """``store``, and a warning on stderr when an option is given by its deprecated
    name (any spelling with ``budget`` in it: the layer allocation's older name)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string and "budget" in option_string:
            sys.stderr.write(
                f"gradsift: warning: {option_string} is deprecated; use "
                f"{self.option_strings[0]} (same values)\n"
            )
        setattr(namespace, self.dest, values)

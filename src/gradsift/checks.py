"""The small argument and tensor checks every module shares, written once.

User input is checked with these (never ``assert``, which ``python -O`` removes), and
each error names the argument and what it may be.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch

__all__ = [
    "FLOAT_DTYPES",
    "NonFiniteGradError",
    "check_float_tensor",
    "all_finite",
    "check_choice",
    "check_finite_grads",
    "check_float",
    "check_int",
    "has_nan",
    "nan_count",
]


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (any ``operator.index``-able integer, never a bool).

    Raises ``TypeError`` for a non-integer and ``ValueError`` below ``minimum``.
    """
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_float(name: str, value, interval: str) -> float:
    """``value`` as a ``float`` inside ``interval``, written like ``"(0, 1]"``.

    The bounds may be ``inf``. NaN lies in no interval, so it is always refused.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's too
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    lo, hi = (float(b) for b in interval[1:-1].split(","))
    try:
        float(value)
    except OverflowError:  # an int past any float
        too_large = "an int too large for a float"
        raise ValueError(f"{name} must be in {interval}, got {too_large}") from None
    low_ok = value > lo if interval[0] == "(" else value >= lo
    high_ok = value < hi if interval[-1] == ")" else value <= hi
    if not (low_ok and high_ok) or math.isnan(value):
        raise ValueError(f"{name} must be in {interval}, got {value}")
    return float(value)


def check_shape(name: str, value) -> tuple[int, ...]:
    """``value`` as a shape: a tuple (or list, ``torch.Size``) of ints >= 1."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of ints like (3, 32, 32), got {value!r}")
    return tuple(check_int(f"{name}[{i}]", v, minimum=1) for i, v in enumerate(value))


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_float_tensor(name: str, x) -> None:
    """Raise ``TypeError`` unless ``x`` is a tensor of a dtype in ``FLOAT_DTYPES``
    (``Tensor.is_floating_point`` also admits the float8 types, which no kernel here
    orders)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must have a floating dtype (float16, bfloat16, float32, float64), "
            f"got {x.dtype}"
        )


def check_choice(name: str, value, choices) -> None:
    """``value`` is one of ``choices`` (the message lists them)."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def has_nan(x: torch.Tensor) -> bool:
    """Whether ``x`` holds a NaN, usually in one fast reduction.

    A sum is NaN when any term is, and ``sum`` is a much faster reduction on CPU than
    ``isnan(x).any()``. A NaN sum can also come from ``inf - inf``: then look exactly.
    """
    if x.numel() == 0 or not torch.isnan(x.sum()):
        return False
    return bool(torch.isnan(x).any())


def nan_count(x: torch.Tensor) -> int:
    return int(torch.count_nonzero(torch.isnan(x)))


def all_finite(x: torch.Tensor) -> bool:
    """Whether every entry of ``x`` is finite; one reduction unless the sum is not.

    A finite sum proves every term finite; a non-finite one may be overflow of finite
    terms, so only then is every entry inspected.
    """
    if x.numel() == 0 or bool(torch.isfinite(x.sum())):
        return True
    return bool(torch.isfinite(x).all())


class NonFiniteGradError(ValueError):
    """A step met an inf or NaN gradient (or error-feedback sum) outside
    ``torch.amp.GradScaler`` and modified nothing: parameters, residuals and inner
    state are as before the step. Catch it to skip the step as GradScaler would."""


def check_finite_grads(params, flats, name_of) -> None:
    """Raise ``NonFiniteGradError`` naming the first of ``params`` whose gradient is not finite.

    ``flats``: tensors that together hold every gradient (flat buffers), checked first
    with one fast reduction each; the per-parameter scan runs only on failure.
    """
    if all(map(all_finite, flats)):
        return
    for p in params:
        bad = int((~torch.isfinite(p.grad)).sum())
        if bad:
            raise NonFiniteGradError(
                f"gradient of {name_of(p)} has {bad} non-finite entries; nothing was "
                "modified. Use torch.amp.GradScaler (which skips such steps) or find the "
                "source of the inf/NaN."
            )

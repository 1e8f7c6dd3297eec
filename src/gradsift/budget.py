"""How many coordinates to keep: "k or density", validated once, resolved per size.

``Budget(k=1000)`` keeps ``min(k, n)`` of ``n`` coordinates; ``Budget(density=0.01)``
keeps ``round(density * n)``, at least one. The optimizer, ``sparsify_grads_`` and
the DDP hook all take their budget through this one type.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from gradsift.checks import check_choice, check_float, check_int

__all__ = ["Budget", "HasBudget", "SCOPES", "check_scope", "kept_count", "resolve_k"]

SCOPES = ("global", "layer")  # one selection over all tensors, or one per tensor


@dataclass(frozen=True)
class Budget:
    """Exactly one of ``k`` (a positive int) and ``density`` (in (0, 1])."""

    k: int | None = None
    density: float | None = None

    def __post_init__(self) -> None:
        if (self.k is None) == (self.density is None):
            raise ValueError(
                "give exactly one of k= (coordinates kept) or density= (fraction kept)"
            )
        if self.k is not None:
            object.__setattr__(self, "k", check_int("k", self.k, minimum=1))
        else:
            object.__setattr__(self, "density", check_float("density", self.density, "(0, 1]"))

    def resolve(self, n: int) -> int:
        """Coordinates kept out of ``n``: ``min(k, n)``, or ``round(density * n)`` (>= 1)."""
        if self.k is not None:
            return min(self.k, n)
        return min(n, max(1, round(self.density * n)))

    def check_fits(self, n: int, what: str) -> None:
        """A ``k`` larger than the ``n`` coordinates it selects from (``what``) is an
        error: every step would be dense without a word."""
        if self.k is not None and self.k > n:
            raise ValueError(
                f"k={self.k} is larger than {what}: every step would be dense; give "
                f"k <= {n}, or density= (density=1.0 keeps every coordinate)"
            )

    def check_params(self, params, scope: str, name_of) -> None:
        """``check_fits`` for ``params`` selected in ``scope``; a complex parameter is
        refused (``TypeError`` naming it via ``name_of``) unless every coordinate is
        kept: the top-k of complex gradients by modulus is not implemented."""
        sizes = [p.numel() for p in params]
        if not sizes:
            return
        n = sum(sizes) if scope == "global" else max(sizes)
        self.check_fits(n, f"the {n} trainable coordinates ({scope} scope)")
        keeps_all = all(self.resolve(m) >= m for m in ([n] if scope == "global" else sizes))
        complex_ = [p for p in params if p.is_complex()]
        if complex_ and not keeps_all:
            raise TypeError(
                f"{name_of(complex_[0])} is {complex_[0].dtype}: top-k selection of complex "
                "gradients is not supported; keep every coordinate (density=1.0) or train "
                "the real and imaginary parts as real parameters (torch.view_as_real)"
            )

    def __str__(self) -> str:
        return f"k={self.k}" if self.k is not None else f"density={self.density}"


class HasBudget:
    """``k`` and ``density`` read-only from ``self.budget``, for classes that keep one."""

    __slots__ = ()

    @property
    def k(self) -> int | None:
        return self.budget.k

    @property
    def density(self) -> float | None:
        return self.budget.density


def resolve_k(n: int, *, k: int | None = None, density: float | None = None) -> int:
    """``Budget(k=k, density=density).resolve(n)``."""
    return Budget(k=k, density=density).resolve(n)


def check_scope(scope: str) -> str:
    """Where a budget applies: ``"global"`` or ``"layer"``. The old optimizer name
    ``"tensor"`` still means ``"layer"`` (each tensor alone), with a warning."""
    if scope == "tensor":
        warnings.warn(
            'scope="tensor" is deprecated; use scope="layer" (each tensor selects alone)',
            DeprecationWarning,
            stacklevel=3,
        )
        return "layer"
    check_choice("scope", scope, SCOPES)
    return scope


def kept_count(n: int, sparsity: float) -> int:
    """Of ``n`` weights pruned to ``sparsity``, how many are kept: ``n - round(sparsity * n)``
    (exactly ``round(sparsity * n)`` removed; the one place pruning computes it)."""
    return n - round(sparsity * n)

"""Budget: "k or density" validated once and resolved per size; the scope names; the
kept count of a sparsity, computed in this one module."""

import ast
from pathlib import Path

import pytest

from gradsift.budget import Budget, check_scope, kept_count, resolve_k


def test_resolve():
    assert resolve_k(1000, density=0.001) == 1
    assert resolve_k(1000, density=0.0001) == 1  # at least one
    assert resolve_k(1000, k=5000) == 1000  # at most n
    assert resolve_k(1000, density=0.25) == 250
    assert str(Budget(k=3)) == "k=3" and str(Budget(density=0.5)) == "density=0.5"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, ValueError, "exactly one"),
        ({"k": 5, "density": 0.1}, ValueError, "exactly one"),
        ({"k": 0}, ValueError, "k must be >= 1"),
        ({"k": 2.5}, TypeError, "k must be an int"),
        ({"k": True}, TypeError, "k must be an int"),
        ({"density": 0.0}, ValueError, r"density must be in \(0, 1\]"),
        ({"density": 1.5}, ValueError, r"density must be in \(0, 1\]"),
        ({"density": "0.1"}, TypeError, "density must be a float"),
    ],
)
def test_bad_budget(kwargs, error, match):
    with pytest.raises(error, match=match):
        Budget(**kwargs)


def test_scope_names():
    assert check_scope("global") == "global" and check_scope("layer") == "layer"
    with pytest.warns(DeprecationWarning):
        assert check_scope("tensor") == "layer"
    with pytest.raises(ValueError, match="scope must be one of"):
        check_scope("model")


def test_kept_count():
    assert kept_count(1000, 0.9) == 100 and kept_count(7, 0.7) == 7 - round(0.7 * 7)
    assert kept_count(10, 0.0) == 10


SRC = Path(__file__).resolve().parents[1] / "src" / "gradsift"
FRACTIONS = {"sparsity", "density", "s", "d"}


def _count_spellings(path: Path) -> list[str]:
    """``round(...)``/``int(...)`` of a product naming a sparsity or density: a kept
    count or a k spelled out instead of ``kept_count`` / ``Budget.resolve``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("round", "int")):
            continue
        for arg in node.args:
            if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Mult):
                names = {getattr(n, "id", getattr(n, "attr", None)) for n in ast.walk(arg)}
                if names & FRACTIONS:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_kept_counts_and_k_are_computed_only_in_budget_py():
    """One place for "how many are kept": every other module calls ``kept_count``
    (pruning) or ``Budget.resolve`` / ``resolve_k`` (top-k), library and lab alike."""
    assert _count_spellings(SRC / "budget.py"), "the scan must see budget.py's own spelling"
    others = [p for p in sorted(SRC.rglob("*.py")) if p != SRC / "budget.py"]
    assert [hit for p in others for hit in _count_spellings(p)] == []

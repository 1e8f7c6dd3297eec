"""Budget: "k or density" validated once and resolved per size; the scope names."""

import pytest

from gradsift.budget import Budget, check_scope, resolve_k


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

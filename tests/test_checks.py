"""The shared argument and tensor checks."""

import numpy as np
import pytest
import torch

from gradsift.checks import all_finite, check_choice, check_float, check_int, has_nan, nan_count


def test_check_int_accepts_integers_and_refuses_bools_and_floats():
    assert check_int("k", 3) == 3
    assert check_int("k", np.int64(7)) == 7 and type(check_int("k", np.int64(7))) is int
    for bad in (True, 2.5, "3", None):
        with pytest.raises(TypeError, match="k must be an int"):
            check_int("k", bad)
    with pytest.raises(ValueError, match="k must be >= 1, got 0"):
        check_int("k", 0, minimum=1)


@pytest.mark.parametrize(
    "interval, inside, outside",
    [
        ("(0, 1]", [1e-9, 0.5, 1.0], [0.0, 1.5, -1.0]),
        ("[0, 1)", [0.0, 0.999], [1.0, -1e-9]),
        ("(0, inf)", [1e-9, 1e30], [0.0, float("inf")]),
    ],
)
def test_check_float_intervals(interval, inside, outside):
    for v in inside:
        assert check_float("x", v, interval) == v
        assert check_float("x", np.float32(v), interval) == float(np.float32(v))  # numpy's
    for v in outside + [float("nan"), 10**400, -(10**400)]:  # an int past any float too
        with pytest.raises(ValueError, match=rf"x must be in \{interval[0]}"):
            check_float("x", v, interval)
    with pytest.raises(TypeError, match="x must be a float"):
        check_float("x", "0.5", interval)
    with pytest.raises(TypeError, match="x must be a float"):
        check_float("x", True, interval)


def test_check_choice_lists_the_choices():
    check_choice("scope", "global", ("global", "layer"))
    with pytest.raises(ValueError, match=r"scope must be one of \['global', 'layer'\], got 'x'"):
        check_choice("scope", "x", ("global", "layer"))


def test_nan_probe_and_finite_check():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    assert not has_nan(x) and all_finite(x) and nan_count(x) == 0
    y = x.clone()
    y[3] = float("nan")
    assert has_nan(y) and not all_finite(y) and nan_count(y) == 1
    z = x.clone()
    z[0], z[1] = float("inf"), -float("inf")  # the sum is NaN, yet nothing is NaN
    assert not has_nan(z) and not all_finite(z)
    big = torch.full((4,), 3e38)  # the sum overflows, yet every entry is finite
    assert all_finite(big)
    assert not has_nan(torch.empty(0)) and all_finite(torch.empty(0))

"""Density warm-up schedules."""

import pytest

from gradsift.distributed import TopKHookState, dgc_warmup
from gradsift.distributed.warmup import density_at


def test_dgc_ramp_matches_the_paper():
    schedule = dgc_warmup(0.001, iterations_per_epoch=10)
    assert [it for it, _ in schedule] == [10, 10, 10, 10]
    densities = [d for _, d in schedule]
    assert densities[0] == 0.25
    for a, b in zip(densities, densities[1:] + [0.001]):
        assert b / a == pytest.approx((0.001 / 0.25) ** 0.25)


def test_densities_per_iteration():
    state = TopKHookState(density=0.001, warmup=[(3, 0.5), (2, 0.1)])
    got = [state.budget_at(i).density for i in range(7)]
    assert got == [0.5, 0.5, 0.5, 0.1, 0.1, 0.001, 0.001]
    assert density_at([], 0) is None
    assert TopKHookState(k=5, warmup=[(1, 0.5)]).budget_at(1).k == 5

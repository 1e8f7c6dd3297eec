"""The bytes model of "send dense or sparse", at its crossover."""

import pytest

from gradsift.distributed import crossover_density, sparse_pays


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_crossover(world):
    n, element, per_coordinate = 1_000_000, 4, 6
    d = crossover_density(element, per_coordinate, world)
    assert d == pytest.approx(2 * element / (world * per_coordinate))
    below, above = int(0.99 * d * n), int(1.01 * d * n) + 1
    assert sparse_pays(below * per_coordinate, n, element, world)
    assert not sparse_pays(above * per_coordinate, n, element, world)
    # the crossover falls as ranks are added: each receives every other's top-k
    assert crossover_density(element, per_coordinate, 2 * world) == pytest.approx(d / 2)

"""Global pruning masks chosen on FSDP2 shards equal the unsharded model's."""

import pytest

import fsdp_workers as workers
from sharded_workers import run_world


@pytest.mark.parametrize(
    "world, sparsity, coarse", [(2, 0.8, False), (3, 0.9, True), (2, 0.5, True)]
)
def test_sharded_magnitude_masks_equal_single_process(world, sparsity, coarse):
    results = run_world(workers.pruning_masks, world, sparsity, coarse)
    assert "timeout" not in results, results
    for rank in range(world):
        assert results[rank] == [True] * len(results[rank]) and results[rank], results[rank]

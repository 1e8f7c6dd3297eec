"""Measurements that more than one test of the lab reads, made once a session."""

import pytest

from gradsift.lab.bench.iteration import bench_iteration
from gradsift.lab.bench.prune_memory import bench_prune_memory
from gradsift.lab.bench.sharded_bytes import bench_sharded_bytes
from gradsift.lab.studies.speed import _QUICK


@pytest.fixture(scope="session")
def quick_iteration_rows():
    """``bench iteration``'s rows with the speed study's ``--quick`` arguments (about
    13 s on a 2-core CPU): its own test checks them, the quick speed study reports
    them."""
    return bench_iteration(**_QUICK["iteration"])


@pytest.fixture(scope="session")
def quick_prune_memory_rows():
    """``bench prune-memory``'s rows with the quick arguments (a fresh process per
    case, about 8 s): its own test checks them, the quick speed study reports them."""
    return bench_prune_memory(**_QUICK["prune-memory"])


@pytest.fixture(scope="session")
def quick_sharded_rows():
    """``bench sharded``'s rows with the quick arguments (two gloo ranks): its own
    test checks them, the quick speed study reports them."""
    return bench_sharded_bytes(**_QUICK["sharded"])

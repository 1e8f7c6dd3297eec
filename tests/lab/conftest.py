"""Measurements that more than one test of the lab reads, made once a session."""

import pytest

from gradsift.lab.bench.iteration import bench_iteration
from gradsift.lab.studies.speed import _QUICK


@pytest.fixture(scope="session")
def quick_iteration_rows():
    """``bench iteration``'s rows with the speed study's ``--quick`` arguments (about
    13 s on a 2-core CPU): its own test checks them, the quick speed study reports
    them."""
    return bench_iteration(**_QUICK["iteration"])

"""``gradsift bench ddp``'s two ranks: one that dies is reported, not waited for."""

import pytest

from gradsift.lab.bench.ddp_step import bench_ddp
from gradsift.lab.launch import RankFailedError


def test_a_rank_that_dies_raises_instead_of_hanging():
    # rank 0 builds the unknown model outside the per-variant error rows, and dies
    with pytest.raises(RankFailedError, match="rank 0 failed"):
        bench_ddp(model="no-such-model", variants=[], steps=4)

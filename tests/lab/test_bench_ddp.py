"""``gradsift bench ddp``'s ranks: one that dies is reported, not waited for, and
does not take the other variants' rows with it."""

import pytest

from gradsift.lab.bench.ddp_step import bench_ddp


def test_an_unknown_model_is_one_clear_error_before_any_rank_starts():
    with pytest.raises(ValueError, match="model must be one of"):
        bench_ddp(model="no-such-model", variants=["allreduce"], steps=4)


def test_a_variant_whose_rank_aborts_is_an_error_row_and_the_others_still_run():
    # torch 2.13's PowerSGD hook at batch 1 aborts a rank natively in gloo
    # ("collective mismatch"); before each variant had its own processes, this
    # ended the whole benchmark with RankFailedError and no rows at all
    rows = bench_ddp(model="resnet18", steps=4, batch=1, variants=["PowerSGD rank 4", "allreduce"])
    by_hook = {r["hook"]: r for r in rows}
    assert "died (SIGABRT)" in by_hook["PowerSGD rank 4"].get("error", ""), by_hook
    assert by_hook["allreduce"]["step_ms"] > 0
    assert by_hook["one process, no communication"]["step_ms"] > 0

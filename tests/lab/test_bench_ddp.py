"""``gradsift bench ddp``'s ranks: one that dies is reported, not waited for, and
does not take the other variants' rows with it."""

import pytest
import torch

from ddp_workers import ABORTS, abort_after_variant, abort_in_variant, bench_variants
from gradsift.lab.bench.ddp_step import VARIANTS, _no_comm, _two_ranks, bench_ddp
from worlds import rank_results, run_world


def test_every_variant_measures_its_row_on_two_ranks():
    names = list(VARIANTS)
    for rows in rank_results(run_world(bench_variants, 2, names), 2):
        assert [r["hook"] for r in rows] == names
        for r in rows:
            assert r["step_ms"] > 0 and r["bytes_per_step"] > 0, r
            assert ("bytes_per_coordinate" in r) == r["hook"].startswith("top-k"), r


def test_an_unknown_model_is_one_clear_error_before_any_rank_starts():
    with pytest.raises(ValueError, match="model must be one of"):
        bench_ddp(model="no-such-model", variants=["allreduce"], steps=4)


def test_a_variant_whose_rank_aborts_is_an_error_row_and_the_others_still_run():
    # a rank that dies natively (os.abort, as a hook crashing inside gloo would):
    # before each variant had its own processes, this ended the whole benchmark
    # with RankFailedError and no rows at all. The abort is made on purpose, so the
    # outcome does not depend on whether some third-party hook crashes today.
    rows = _two_ranks("mlp", [ABORTS, "allreduce"], 4, 1, job=abort_in_variant)
    by_hook = {r["hook"]: r for r in rows}
    assert "died (SIGABRT)" in by_hook[ABORTS].get("error", ""), by_hook
    assert by_hook["allreduce"]["step_ms"] > 0
    assert by_hook["one process, no communication"]["step_ms"] > 0


def test_a_rank_that_dies_after_the_row_was_measured_keeps_the_row():
    # torch's gloo teardown aborts now and then ("terminate called without an active
    # exception"); the row, written once every timed collective is done, is kept
    rows = _two_ranks("mlp", ["allreduce"], 4, 1, job=abort_after_variant)
    assert rows[0]["step_ms"] > 0 and "error" not in rows[0], rows
    assert "rank 1 died (SIGABRT)" in rows[0]["teardown_error"]


def test_the_no_communication_row_leaves_the_callers_threads_and_random_state():
    # it runs in the calling process (a user's, or the shaped namespace's)
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    row = _no_comm("mlp", 4, 1)
    assert row["hook"] == "one process, no communication" and row["step_ms"] > 0
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.get_num_threads() == threads

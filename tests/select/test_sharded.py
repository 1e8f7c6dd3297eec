"""Exact global top-k across gloo ranks equals ``topk_indices`` on the whole vector.

Every multi-process test runs under a hard deadline and kills its processes."""

import pytest
import torch

import sharded_workers as workers
from gradsift.select.sharded import order_keys, selection_bytes
from worlds import rank_results, run_world


@pytest.mark.parametrize("world", [2, 3])
def test_union_over_ranks_equals_single_process_topk(world):
    for per_rank in rank_results(run_world(workers.select_cases, world), world):
        for case, (union, ref) in enumerate(per_rank):
            assert union == ref, f"case {case}"


@pytest.mark.parametrize("world", [2, 3])
def test_nan_on_one_rank_raises_on_every_rank(world):
    for message in rank_results(run_world(workers.nan_case, world), world):
        assert message.startswith("ValueError") and "NaN" in message, message


@pytest.mark.parametrize("case", ["k", "huge_k", "huge_offset", "shape", "segments"])
def test_invalid_arguments_on_one_rank_raise_on_every_rank(case):
    # the invalid rank raised alone and the other waited in the all-reduce
    messages = rank_results(run_world(workers.invalid_case, 2, case, deadline_s=30), 2)
    assert messages[0].startswith("ValueError") and "other rank" in messages[0], messages
    assert messages[1].startswith("ValueError") and "other rank" not in messages[1], messages


def test_interleaved_segments_keep_lowest_global_ties():
    for per_rank in rank_results(run_world(workers.segments_case, 2), 2):
        for union, ref in per_rank:
            assert union == ref


@pytest.mark.parametrize("world", [2, 3])
def test_offset_on_one_rank_and_segments_on_another_agree(world):
    for per_rank in rank_results(run_world(workers.mixed_offset_and_segments, world), world):
        for union, ref in per_rank:
            assert union == ref


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("absolute", [True, False])
def test_order_keys_order_like_the_floats(dtype, absolute):
    x = torch.tensor([-float("inf"), -3.0, -1.0, -0.0, 0.0, 1e-30, 0.5, 1.0, 3.0, float("inf")])
    x = x.to(dtype)
    keys = order_keys(x, absolute)
    ref = x.abs() if absolute else x
    for i in range(len(x)):
        for j in range(len(x)):
            assert (keys[i] < keys[j]) == (ref[i] < ref[j]), (x[i], x[j])
            assert (keys[i] == keys[j]) == (ref[i] == ref[j]), (x[i], x[j])


def test_selection_bytes_are_independent_of_the_vector():
    b = selection_bytes(2)
    # 4 passes of 256 bins, the NaN and invalid-rank counts and 2 ranks' (k, key
    # bits, absolute)
    assert b == {"allreduce": (4 * 256 + 2 + 3 * 2) * 8, "allgather": 2 * 2 * 8}

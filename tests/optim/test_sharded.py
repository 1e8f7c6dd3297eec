"""``TopK`` on FSDP2 models (DTensor parameters) over gloo ranks on CPU.

Every multi-process test runs under a hard deadline and kills its processes."""

import pytest
import torch

import fsdp_workers as workers
from worlds import rank_results, run_world


@pytest.mark.parametrize(
    "world, kw",
    [
        (2, {"density": 0.1}),
        (3, {"density": 0.1}),
        (2, {"k": 7, "momentum_correction": 0.9}),
        (2, {"density": 0.05, "scope": "layer"}),
        (2, {"density": 0.1, "error_feedback": False}),
    ],
)
def test_step_equals_single_process_topk_on_the_full_gradient(world, kw):
    for report in rank_results(run_world(workers.step_matches_single_process, world, kw), world):
        for step, (same_params, same_state, kept, names) in enumerate(report):
            assert same_params, f"step {step}: parameters differ"
            assert same_state, f"step {step}: {names} differ"
            assert kept > 0


def test_a_nonfinite_gradient_on_one_rank_raises_on_every_rank_and_modifies_nothing():
    reports = rank_results(run_world(workers.nonfinite_on_one_rank, 2), 2)
    for message, unchanged in reports:
        assert message is not None and "hold 1 non-finite entries across ranks" in message
        assert unchanged


def _equal(a, b):
    return a == b  # lists of floats: exact


@pytest.mark.parametrize("load_world", [2, 3])
def test_distributed_checkpoint_resumes_bit_for_bit(tmp_path, load_world):
    path = str(tmp_path / "ckpt")
    saved = rank_results(run_world(workers.checkpoint_save, 2, path), 2)
    (at_save, at_end) = saved[0]
    assert torch.tensor(at_save[1][0]).abs().sum() > 0, "residuals must be non-trivial"
    loaded = rank_results(run_world(workers.checkpoint_load, load_world, path), load_world)
    for after_load, after_more in loaded:
        assert _equal(after_load, at_save), "the loaded state differs from the saved one"
        if load_world == 2:  # the same gradients: the same run
            assert _equal(after_more, at_end), "the resumed run differs"

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


@pytest.mark.parametrize(
    "case, inner", [("unreached", "sgd"), ("unreached", "adam"), ("to64", "sgd")]
)
def test_unreached_parameters_and_a_late_conversion_match_single_process(case, inner):
    # "unreached": opt.zero_grad() kept zero DTensor gradients, which then counted as
    # gradients of a layer the next backward did not reach; "to64": the residuals
    # stayed float32 after model.to(torch.float64)
    reports = rank_results(run_world(workers.unreached_or_converted, 2, case, inner), 2)
    for report in reports:
        for step, (same_params, same_residuals) in enumerate(report):
            assert same_params and same_residuals, f"step {step}"


def test_checkpoint_keys_agree_across_ranks_with_a_group_without_inner_state(tmp_path):
    # whether an entry's residual was all zero was read on each rank's shard alone,
    # so the ranks could save different keys (dcp.save failed); and a bias (no inner
    # state) whose residual was zero lost its entry, so the strict load failed
    reports = rank_results(run_world(workers.checkpoint_mixed_groups, 2, str(tmp_path)), 2)
    (keys0, resumed0, any0), (keys1, resumed1, any1) = reports
    assert keys0 == keys1
    assert len(keys0) == 6 and all("residual" in names for _, names in keys0)
    assert resumed0 and resumed1
    assert any0 and any1

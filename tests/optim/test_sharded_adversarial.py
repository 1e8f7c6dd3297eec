"""Adversarial tests of ``TopK`` and pruning on sharded models (FSDP2 / ``DTensor``
parameters) over gloo ranks on CPU, against references independent of gradsift's
selection (see ``sharded_adversarial_workers``).

The first test pins that ``TopK.step`` and ``zero_grad`` work on a sharded model at
all (``ShardedGrads`` once lacked a method of ``GradSet``'s protocol)."""

import pytest
import torch

import sharded_adversarial_workers as workers
from worlds import rank_results, run_world

F32, F64 = torch.float32, torch.float64
# uneven on 3 ranks: 5 rows (2, 2, 1), 2 rows (rank 2 empty), 1 row (ranks 1, 2
# empty), a 3-D tensor, 1-D tensors
SHAPES = [(5, 3), (2, 4), (1,), (7,), (3, 2, 2), (4,)]


def _all_true(report):
    return all(all(step[:4]) and step[4] == step[5] for step in report)


def test_topk_step_and_zero_grad_on_fsdp2_model_work():
    for errors in rank_results(run_world(workers.plain_step, 2), 2):
        assert errors == [None, None], errors


def test_step_with_a_closure_on_fsdp2_equals_the_plain_step():
    for plain, with_closure in rank_results(run_world(workers.closure_step, 2), 2):
        assert not isinstance(plain, str), plain
        assert with_closure == plain, with_closure if isinstance(with_closure, str) else ""


def test_uneven_shards_ties_and_options_equal_an_independent_reference():
    """Hand-made Shard(0) DTensors on 3 ranks (empty shards, k above any rank's shard,
    coarse gradients: ties at the cut across ranks): after each step the sent
    gradient, residual and parameters equal a float64-ranked, lowest-index-ties
    single-process reference, and residual_after + sent == residual_before + g."""
    f16, bf16 = torch.float16, torch.bfloat16
    cfgs = [
        dict(shapes=SHAPES, dtypes=[F32] * 6, kw=dict(k=7)),
        dict(shapes=SHAPES, dtypes=[F32] * 6, kw=dict(k=30)),  # > every local shard
        dict(shapes=SHAPES, dtypes=[F32] * 6, kw=dict(density=0.3, scope="layer")),
        dict(shapes=SHAPES, dtypes=[F32] * 6, kw=dict(k=5, momentum_correction=0.9)),
        dict(shapes=SHAPES, dtypes=[F32] * 6, kw=dict(density=0.2, error_feedback=False)),
        # no gradient for some parameters on some steps, one frozen parameter
        dict(shapes=SHAPES, dtypes=[F32] * 6, kw=dict(k=6), steps=4,
             absent={1: [0, 2], 2: [3]}, frozen=[4]),
        # mixed dtypes in one global selection
        dict(shapes=SHAPES, dtypes=[F64, F64, F32, F32, bf16, f16], kw=dict(k=9), coarse=False),
        dict(shapes=SHAPES, dtypes=[F64, F64, F32, F32, bf16, f16], kw=dict(k=9)),
    ]  # fmt: skip
    for per_rank in rank_results(run_world(workers.manual_cases, 3, cfgs), 3):
        for cfg, report in zip(cfgs, per_rank):
            assert not isinstance(report, str), report
            assert _all_true(report), (cfg["kw"], report)


def test_replicated_parameters_beside_shards_equal_the_reference():
    """Replicate-everywhere DTensors beside Shard(0) ones (counted once), float32."""
    cfgs = [
        dict(shapes=SHAPES[:4], dtypes=[F32] * 4, placements=["shard", "rep", "shard", "rep"],
             kw=dict(k=7)),
        dict(shapes=SHAPES[:4], dtypes=[F32] * 4, placements=["shard", "rep", "shard", "rep"],
             kw=dict(density=0.3, scope="layer"), steps=2),
    ]  # fmt: skip
    for per_rank in rank_results(run_world(workers.manual_cases, 2, cfgs), 2):
        for cfg, report in zip(cfgs, per_rank):
            assert not isinstance(report, str), report
            assert _all_true(report), (cfg["kw"], report)


def test_replicated_float64_parameter_beside_float32_shards():
    cfg = dict(
        shapes=SHAPES[:4],
        dtypes=[F32, F64, F32, F32],
        placements=["shard", "rep", "shard", "shard"],
        kw=dict(k=7),
        steps=2,
        timeout_s=3,  # the hang shows as a gloo timeout within seconds
    )
    for (report,) in rank_results(run_world(workers.manual_cases, 2, [cfg]), 2):
        assert not isinstance(report, str), report[:300]
        assert _all_true(report), report


def test_select_refuses_a_key_width_mix_on_two_ranks():
    # documented: "Raises ValueError on every rank for ... ranks disagreeing on ... the
    # key width"; the true top 3 of 1..20 are rank 0's positions 7, 8, 9
    for message in rank_results(run_world(workers.disagreeing_ranks, 2, "dtype"), 2):
        assert message.startswith("ValueError: every rank must pass the same"), message


def test_select_refuses_disagreeing_k_on_every_rank():
    for message in rank_results(run_world(workers.disagreeing_ranks, 3, "k"), 3):
        assert message.startswith("ValueError: every rank must pass the same"), message


def test_fsdp2_uneven_model_equals_single_process_topk():
    """An FSDP2 model of 5-, 2- and 3-row layers on 3 ranks vs single-process TopK fed
    the same full gradient, bit for bit: AdamW with two accumulated micro-batches
    (zero_grad(set_to_none=False)), SGD momentum + weight decay with scope="layer"
    and reshard_after_forward=False, DGC momentum correction with set_to_none=True;
    a StepLR scheduler on each."""
    cfgs = [
        dict(inner="adamw", kw=dict(density=0.2), micro=2),
        dict(inner="sgdm", kw=dict(k=4, scope="layer"), reshard=False),
        dict(inner="sgd", kw=dict(k=6, momentum_correction=0.8), micro=2, set_to_none=True),
    ]
    for per_rank in rank_results(run_world(workers.fsdp_vs_single_cases, 3, cfgs), 3):
        for cfg, report in zip(cfgs, per_rank):
            assert not isinstance(report, str), report
            for step, (same_p, same_g, same_s, names) in enumerate(report):
                assert same_p and same_g and same_s, (cfg, step, report)
                assert "residual" in names


RESUME = [
    dict(api="plain", inner="sgd", kw=dict(k=5, momentum_correction=0.9)),
    dict(api="dsd", inner="sgd", kw=dict(density=0.2)),
    dict(api="dsd", inner="adamw", kw=dict(density=0.2)),
]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("resume"))
    return rank_results(run_world(workers.resume_cases, 2, root, RESUME), 2)


def _check_resume(resumed, i):
    for per_rank in resumed:
        result = per_rank[i]
        assert not isinstance(result, str), result[-600:]
        saved, end, loaded, after = result
        assert loaded == saved, "the loaded state differs from the saved one"
        assert after == end, "steps 3-4 after the load differ from the uninterrupted run"


def test_resume_with_dgc_momentum_through_dcp_is_bit_for_bit(resumed):
    """opt.state_dict() -> dcp.save after step 2; fresh model and TopK (other
    weights) -> dcp.load -> load_state_dict: residual and DGC velocity restored,
    steps 3-4 equal the uninterrupted run."""
    _check_resume(resumed, 0)


def test_resume_through_get_set_optimizer_state_dict(resumed):
    _check_resume(resumed, 1)


def test_resume_with_adamw_through_the_readme_dcp_recipe(resumed):
    """The README's recipe (get/set_optimizer_state_dict around dcp.save/load) with
    AdamW: moments, step and residuals restored, steps 3-4 as uninterrupted."""
    _check_resume(resumed, 2)


def test_dsd_template_of_a_fresh_topk_lists_the_inner_state():
    for bare, wrapped in rank_results(run_world(workers.dsd_template_keys, 2), 2):
        assert bare and all(v == ["exp_avg", "exp_avg_sq", "step"] for v in bare.values())
        for fqn, names in bare.items():
            assert set(names) <= set(wrapped[fqn]), (fqn, wrapped[fqn])


def test_pruning_uneven_conv_model_on_three_ranks_equals_single_process():
    """Conv and Linear weights of 5, 2, 3 and 2 rows on 3 ranks (empty shards), ties
    at the cut (weights on a 1/8 grid), iterative rounds: every sharded method's
    masks and pruned weights equal the unsharded ones, with exactly
    n - round(sparsity * n) kept."""
    cases = [
        ("magnitude", F32, 0.7, {}, True),
        ("random", F32, 0.6, {"seed": 4}, False),
        ("snip", F32, 0.5, {}, True),
        ("synflow", F64, 0.75, {"iterations": 3}, True),
        ("magnitude", F32, 0.9, {"iterations": 2}, True),
    ]
    for per_rank in rank_results(run_world(workers.prune_uneven, 3, cases), 3):
        for case, result in zip(cases, per_rank):
            assert not isinstance(result, str), (case, result)
            same, kept, expected_kept, weights = result
            assert same and all(same.values()), (case, same)
            assert kept == expected_kept, (case, kept, expected_kept)
            assert weights, case

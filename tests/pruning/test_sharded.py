"""Global pruning masks chosen on FSDP2 shards equal the unsharded model's."""

import pytest

import fsdp_workers as workers
from worlds import rank_results, run_world


@pytest.mark.parametrize(
    "world, sparsity, coarse", [(2, 0.8, False), (3, 0.9, True), (2, 0.5, True)]
)
def test_sharded_magnitude_masks_equal_single_process(world, sparsity, coarse):
    results = run_world(workers.pruning_masks, world, sparsity, coarse)
    assert "timeout" not in results and "died" not in results, results
    for rank in range(world):
        assert results[rank] == [True] * len(results[rank]) and results[rank], results[rank]


import torch  # noqa: E402

import prune_fsdp_workers as prune_workers  # noqa: E402


@pytest.mark.parametrize(
    "world, method, dtype, hsdp, options",
    [
        (2, "magnitude", torch.float32, False, {}),
        (3, "magnitude", torch.float32, False, {}),
        (2, "random", torch.float32, False, {"seed": 3}),
        (3, "random", torch.float32, False, {"seed": 3}),
        (2, "snip", torch.float32, False, {}),
        (3, "snip", torch.float32, False, {}),
        (2, "synflow", torch.float64, False, {}),
        (3, "synflow", torch.float64, False, {}),
        (3, "synflow", torch.float32, False, {}),
        (2, "synflow", torch.float64, False, {"iterations": 3}),
        (2, "snip", torch.float32, True, {}),
        (2, "synflow", torch.float64, True, {}),
    ],
)
def test_prune_at_init_on_fsdp2_equals_single_process(world, method, dtype, hsdp, options):
    for untouched, same_scores, same_masks, same_weights, kept, placements in rank_results(
        run_world(prune_workers.masks_equal, world, method, dtype, hsdp, options), world
    ):
        assert untouched, "score changed the sharded model"
        assert same_scores, "the scores differ from the single-process ones"
        assert same_masks and all(same_masks), same_masks
        assert same_weights, "the pruned shards differ from the pruned unsharded weights"
        assert kept == round((1 - prune_workers.SPARSITY) * (20 * 64 + 64 * 64 + 64 * 5))
        assert placements == (["(Replicate(), Shard(dim=0))"] if hsdp else ["(Shard(dim=0),)"])


@pytest.mark.parametrize("world, method", [(2, "magnitude"), (3, "random")])
def test_replicated_parameters_are_ranked_once(world, method):
    for same, placements in rank_results(
        run_world(prune_workers.replicated_masks, world, method), world
    ):
        assert same and all(same), same
        assert placements == "(Replicate(),)"


def test_a_model_left_unsharded_by_a_forward_is_pruned_on_its_shards():
    for same, kinds in rank_results(run_world(prune_workers.after_a_forward, 2), 2):
        assert same and all(same)
        assert kinds == ["DTensor"]


def test_methods_and_options_without_a_sharded_form_refuse_before_any_work():
    """And masks_from_scores on a sharded model's DTensor scores names the sharded
    selection (it crashed deep in the flat buffer's storage)."""
    for messages, untouched in rank_results(run_world(prune_workers.refusals, 2), 2):
        assert "'grasp' cannot score a sharded model" in messages[0], messages[0]
        assert "allocation='uniform' is not supported on a sharded model" in messages[1]
        assert "use gradsift.pruning.sharded.sharded_masks_from_scores" in messages[2]
        assert untouched


@pytest.mark.parametrize(
    "hold, closure", [(True, None), (False, None), (True, "position"), (True, "keyword")]
)
def test_hold_masks_keeps_pruned_weights_zero_under_topk(hold, closure):
    for revived, residual, moved in rank_results(
        run_world(prune_workers.train_keeps_masks, 2, hold, closure), 2
    ):
        assert moved > 0
        if hold:
            assert revived == 0, f"{revived} pruned weights came back"
            assert residual == 0, f"TopK kept a residual on {residual} pruned weights"
        else:  # the checks above can fail: without the hold, TopK revives some
            assert revived > 0 and residual > 0


def test_a_nan_score_on_one_rank_raises_on_every_rank():
    for message in rank_results(run_world(prune_workers.nan_score_on_one_rank, 2), 2):
        assert message == "scores['3.weight'] contains NaN; cannot rank it", message


def test_weights_the_output_does_not_reach_score_as_single_process():
    for same, zero, message in rank_results(run_world(prune_workers.unreached_weights, 2), 2):
        assert same and all(same) and zero, same
        assert "synflow: ['unused.weight'] do not reach the output" in message, message


def test_sharded_synflow_ranks_overflowing_flow_as_single_process():
    for same in rank_results(run_world(prune_workers.synflow_overflow, 3), 3):
        assert same and all(same), same


class _PositionEmbedded(torch.nn.Module):
    """An embedding fed ids made inside the model: SynFlow's real input never reaches
    it as ids, so it may be scored."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.pos, self.fc, self.out = (
            torch.nn.Embedding(4, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3),
        )  # fmt: skip

    def forward(self, x):
        h = self.fc(x) + self.pos(torch.arange(4, device=x.device))
        return self.out(torch.relu(h)).mean(1)


def test_sharded_synflow_leaves_no_hook_behind(one_rank):
    """Scoring leaves the model as it was, its hooks included: the sharded SynFlow
    scores the model itself, and its guard on embeddings (an error for token ids)
    once stayed on the caller's embedding, one more at every call."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import gradsift

    model = _PositionEmbedded().double()
    mesh = init_device_mesh("cpu", (1,))
    for layer in (model.fc, model.out, model.pos, model):
        fully_shard(layer, mesh=mesh)
    hooks = [dict(m._forward_pre_hooks) for m in model.modules()]
    for _ in range(2):
        gradsift.score(model, "synflow", input_shape=(4, 8))
    assert [dict(m._forward_pre_hooks) for m in model.modules()] == hooks


def test_sharded_synflow_gives_a_norm_without_statistics_fresh_ones(one_rank):
    """As single-process SynFlow: a BatchNorm without running statistics scores as one
    with mean 0 and variance 1 (the sharded form scores the model itself, so the
    statistics it lends are taken away after)."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import gradsift

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8, track_running_stats=False),
        torch.nn.ReLU(), torch.nn.Linear(8, 3),
    ).double()  # fmt: skip
    want = gradsift.score(copy.deepcopy(model), "synflow", input_shape=(6,))
    keys = list(model.state_dict())
    mesh = init_device_mesh("cpu", (1,))
    for layer in (model[0], model[3], model):
        fully_shard(layer, mesh=mesh)
    got = gradsift.score(model, "synflow", input_shape=(6,))
    for name in want:
        torch.testing.assert_close(got[name].full_tensor(), want[name], rtol=0, atol=0)
    assert list(model.state_dict()) == keys and model[1].running_mean is None

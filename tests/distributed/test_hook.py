"""The top-k DDP communication hook: unit tests, and 2 gloo processes over loopback.

Every multi-process test runs under a hard deadline, so a failure can never hang CI:
most on the kept 2-rank world of ``worlds``; those whose ranks die, raise or set
their own timeouts on purpose in processes of their own (``run_two``), killed after.
"""

import queue as queue_module

import pytest
import torch

import ddp_workers as dist_workers
from gradsift.lab import processes
from gradsift.lab.launch import free_port
from worlds import rank_results, run_world

DEADLINE_S = 120


def run_two(target, *extra, expect=2):
    ctx = processes.context()
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, 2, port, q, *extra)) for r in range(2)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in range(expect):
            results.append(q.get(timeout=DEADLINE_S))
    except queue_module.Empty:
        pytest.fail(f"{target.__name__}: no result within {DEADLINE_S}s")
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return sorted(results, key=lambda r: r[0])


def test_density_one_reproduces_allreduce():
    for rank, diffs in rank_results(run_world(dist_workers.equivalence, 2), 2):
        assert max(diffs) <= 1e-6, (rank, diffs)


def test_low_density_keeps_ranks_identical_and_learns():
    results = rank_results(run_world(dist_workers.low_density, 2), 2)
    for rank, identical, acc, _ratio, nres in results:
        assert identical, f"rank {rank} diverged"
        assert acc > 0.8, acc
        assert nres >= 1
    assert results[0][2] == results[1][2]
    assert results[0][3] > 5  # bytes: much less than allreduce


def test_resume_from_checkpoint_is_bit_for_bit():
    for rank, equal, residual_norm in rank_results(run_world(dist_workers.resume, 2), 2):
        assert residual_norm > 0, "the checkpoint must carry non-trivial residuals"
        assert equal, f"rank {rank}: resumed run differs"


def test_dead_rank_fails_the_other_with_an_error():
    [(rank, message, seconds)] = run_two(dist_workers.dies, expect=1)
    assert rank == 0
    assert message != "no error"
    assert seconds < 60, message
    # gloo's own error reaches the caller, never a decoding error of a failed gather
    assert "IndexError" not in message and "index" not in message.lower(), message


@pytest.mark.parametrize("cap_mb, buckets", [(25.0, 1), (0.012, 2), (0.006, 4)])
def test_resume_is_bit_for_bit_with_any_bucket_count(cap_mb, buckets):
    for rank, equal, per_step, _ in rank_results(
        run_world(dist_workers.resume_buckets, 2, cap_mb), 2
    ):
        assert per_step == buckets, f"the model should fill {buckets} buckets, got {per_step}"
        assert equal, f"rank {rank}: resumed run differs with {buckets} buckets"


def test_grad_scaler_skips_an_inf_step_on_every_rank():
    for rank, r in rank_results(run_world(dist_workers.scaler_skip, 2), 2):
        assert r["skipped"] and r["residual_kept"], (rank, r)
        assert r["scale"] == 2.0**9 and r["identical"] and r["moved_after"], (rank, r)


def test_momentum_correction_matches_dgc_on_two_ranks():
    for rank, diff in rank_results(run_world(dist_workers.dgc_two_ranks, 2), 2):
        assert diff < 1e-12, (rank, diff)


def test_a_rank_with_another_models_state_fails_every_rank_at_once():
    """Another model's state, or a state that holds unused parameters out (one more
    collective) on one rank only, or keeps a residual (the hold-out's collective runs
    only with one) on one rank only, or resumed on one rank only (the other in its
    warm-up), or with another density, wire format or warm-up length (a hang, a
    killed rank or a garbled decode before): one error on every rank, not a hang.
    Every case runs on one pair of ranks, one after the other."""
    results = run_two(dist_workers.mismatched_states)
    for rank, cases in results:
        assert [how for how, *_ in cases] == dist_workers.MISMATCHES
        for how, message, seconds in cases:
            assert "ValueError" in message and "differ across ranks" in message, (how, message)
            if how == "resumed":
                assert "in iteration" in message and "resumed" in message, message
            elif how != "model":
                assert f"in {how}" in message and "the same" in message, (how, message)
            assert seconds < 10, (rank, how, seconds)


def test_loading_rank_0s_state_on_rank_1_fails_every_rank_at_once():
    results = run_two(dist_workers.another_ranks_state, "rank 0's")
    for rank, message, seconds, names in results:
        assert names == (rank, 2), names  # the saved state names its rank and world size
        assert "ValueError" in message and "saved by rank 0" in message, (rank, message)
        assert "rank(s) [1]" in message, (rank, message)
        assert seconds < 10, (rank, seconds)


def test_a_state_of_another_world_size_fails_every_rank_unless_resharded():
    for rank, message, seconds, _ in run_two(dist_workers.another_ranks_state, "world 4"):
        assert "ValueError" in message and "world size 4" in message, (rank, message)
        assert "reshard=True" in message and seconds < 10, (rank, message)
    for rank, message, _, _ in run_two(dist_workers.another_ranks_state, "reshard"):
        assert message == "no error", (rank, message)


def test_a_rank_that_raises_fails_the_other_with_an_error():
    [(rank, message, seconds)] = run_two(dist_workers.raises, expect=1)
    assert rank == 0 and message != "no error" and seconds < 60, message


def test_hook_on_one_rank_equals_the_topk_wrapper(one_rank):
    """The same maths, one implementation: DDP + hook (momentum correction, inner SGD
    without momentum) vs TopK(SGD, momentum_correction) in one process."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from gradsift import TopK
    from gradsift.distributed import TopKHookState, topk_hook

    a, b = dist_workers.small_model().double(), dist_workers.small_model().double()
    ddp = DistributedDataParallel(a)
    ddp.register_comm_hook(TopKHookState(k=30, momentum_correction=0.9, start_iter=0), topk_hook)
    opt_a = torch.optim.SGD(ddp.parameters(), lr=0.1)
    opt_b = TopK(torch.optim.SGD(b.parameters(), lr=0.1), k=30, momentum_correction=0.9)
    for step in range(6):
        x, y = dist_workers.batch(0, step)
        for model, opt in ((ddp, opt_a), (b, opt_b)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.double()), y).backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-15)


def test_hook_k_larger_than_the_model_is_an_error_naming_both_numbers(one_rank):
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from gradsift.distributed import TopKHookState, topk_hook

    model = dist_workers.small_model()
    n = sum(p.numel() for p in model.parameters())
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(TopKHookState(k=10**9, start_iter=0), topk_hook)
    x, y = dist_workers.batch(0, 0)
    with pytest.raises(ValueError, match=rf"k=1000000000 .* the model's {n} coordinates"):
        nn.functional.cross_entropy(ddp(x), y).backward()


class TwoDtypes(torch.nn.Module):
    """A float64 layer and a float32 one: DDP gives each dtype buckets of its own."""

    def __init__(self, wide_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(20, 32), torch.nn.Linear(32, 5)
        (self.a if wide_first else self.b).double()

    def forward(self, x):
        h = torch.relu(self.a(x.to(self.a.weight.dtype)))
        return self.b(h.to(self.b.weight.dtype)).double()


@pytest.mark.parametrize("wide_first", [True, False])
def test_hook_keeps_every_dtype_of_a_mixed_model_exact(one_rank, wide_first):
    """At density 1 on one rank the hook hands back each gradient unchanged: the
    model's vector is in the widest dtype (it was the first bucket's, which rounded
    the float64 layer's gradient to float32 in one of the two orders)."""
    from torch.nn.parallel import DistributedDataParallel

    from gradsift.distributed import TopKHookState, topk_hook

    plain, hooked = TwoDtypes(wide_first), DistributedDataParallel(TwoDtypes(wide_first))
    hooked.register_comm_hook(TopKHookState(density=1.0, start_iter=0), topk_hook)
    x, y = dist_workers.batch(0, 0)
    for model in (plain, hooked):
        torch.nn.functional.cross_entropy(model(x), y).backward()
    for p, q in zip(plain.parameters(), hooked.parameters()):
        assert q.grad.dtype == p.dtype
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0)


def test_a_state_that_served_another_model_is_an_error(one_rank):
    """Residuals belong to one model's parameters: a state reused for a new model (a
    notebook's second run, say) would add the old model's residual to the new one's
    gradient. Re-wrapping the same module in a new DDP keeps serving it."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from gradsift.distributed import TopKHookState, topk_hook

    state = TopKHookState(k=5, start_iter=0)
    x, y = dist_workers.batch(0, 0)
    first = dist_workers.small_model()
    for ddp in (DistributedDataParallel(first), DistributedDataParallel(first)):
        ddp.register_comm_hook(state, topk_hook)
        for _ in range(2):
            nn.functional.cross_entropy(ddp(x), y).backward()
    assert state.iter == 4 and state.residual.abs().sum() > 0
    second = DistributedDataParallel(dist_workers.small_model())
    second.register_comm_hook(state, topk_hook)
    with pytest.raises(ValueError, match="TopKHookState already serves another model"):
        nn.functional.cross_entropy(second(x), y).backward()

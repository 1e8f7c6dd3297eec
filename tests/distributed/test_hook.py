"""The top-k DDP communication hook: unit tests, and 2 gloo processes over loopback.

Every multi-process test runs under a hard deadline and kills its processes when it
passes, so a failure can never hang CI.
"""

import multiprocessing as mp
import queue as queue_module

import pytest
import torch

import ddp_workers as dist_workers
from gradsift.distributed import TopKHookState, compress_
from gradsift.lab.launch import free_port

DEADLINE_S = 120


def run_two(target):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, 2, port, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in range(2 if target is not dist_workers.dies else 1):
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
    for rank, diffs in run_two(dist_workers.equivalence):
        assert max(diffs) <= 1e-6, (rank, diffs)


def test_low_density_keeps_ranks_identical_and_learns():
    results = run_two(dist_workers.low_density)
    for rank, identical, acc, _ratio, nres in results:
        assert identical, f"rank {rank} diverged"
        assert acc > 0.8, acc
        assert nres >= 1
    assert results[0][2] == results[1][2]
    assert results[0][3] > 5  # bytes: much less than allreduce


def test_resume_from_checkpoint_is_bit_for_bit():
    for rank, equal, residual_norm in run_two(dist_workers.resume):
        assert residual_norm > 0, "the checkpoint must carry non-trivial residuals"
        assert equal, f"rank {rank}: resumed run differs"


def test_dead_rank_fails_the_other_with_an_error():
    [(rank, message, seconds)] = run_two(dist_workers.dies)
    assert rank == 0
    assert message != "no error"
    assert seconds < 60, message


def test_compress_conserves_mass_exactly():
    state = TopKHookState(density=0.1)
    gen = torch.Generator().manual_seed(0)
    total_in = torch.zeros(500, dtype=torch.float64)
    total_sent = torch.zeros(500, dtype=torch.float64)
    for _ in range(20):
        g = torch.randn(500, generator=gen, dtype=torch.float64)
        keys, sizes = [(0, 0), (0, 1)], [300, 200]
        zero = torch.zeros(500, dtype=torch.float64)
        before = torch.cat([state.residuals[k] for k in keys]) if state.residuals else zero
        idx, vals = compress_(state, g, keys, sizes)
        assert idx.numel() == 50
        sent = torch.zeros_like(g).index_add_(0, idx, vals)
        after = torch.cat([state.residuals[k] for k in keys])
        torch.testing.assert_close(sent + after, g + before, rtol=0, atol=0)
        total_in += g
        total_sent += sent
    after = torch.cat([state.residuals[k] for k in keys])
    torch.testing.assert_close(total_sent + after, total_in, rtol=0, atol=1e-12)


def test_compress_resets_residual_when_size_changes():
    state = TopKHookState(k=2)
    compress_(state, torch.randn(10), [(0, 0)], [10])
    idx, _ = compress_(state, torch.randn(7), [(0, 0)], [7])
    assert idx.numel() == 2 and state.residuals[(0, 0)].shape == (7,)


def test_state_dict_round_trip():
    state = TopKHookState(density=0.1)
    compress_(state, torch.randn(100), [(0, 0)], [100])
    state.iter, state.bytes_sent, state.bytes_dense = 7, 10, 400
    other = TopKHookState(density=0.1)
    other.load_state_dict(state.state_dict())
    assert (other.iter, other.bytes_sent, other.bytes_dense) == (7, 10, 400)
    assert torch.equal(other.residuals[(0, 0)], state.residuals[(0, 0)])
    assert other.compression_ratio == 40.0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "exactly one"),
        ({"density": 0.1, "start_iter": 1}, "start_iter must be >= 2"),
        ({"density": 0.1, "start_iter": -1}, "start_iter must be >= 0"),
        ({"density": 2.0}, "density must be in"),
    ],
)
def test_bad_state_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TopKHookState(**kwargs)

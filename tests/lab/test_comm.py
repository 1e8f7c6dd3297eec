"""The named gradient communications: each builds the hook it names, with DGC's
recipe for ``topk-dgc``, and a bad name or a missing density fails clearly."""

import io

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from bucket_support import FakeBucket
from gradsift.distributed import TopKHookState, topk_hook
from gradsift.lab import cli
from gradsift.lab.comm import COMMS, make_hook
from gradsift.lab.powersgd import powersgd_hook


def test_allreduce_is_ddp_own_and_keeps_momentum():
    assert make_hook("allreduce", momentum=0.9) == (None, None, 0.9)


def test_torch_hooks():
    assert make_hook("fp16")[1] is default_hooks.fp16_compress_hook
    state, hook, _ = make_hook("powersgd")
    assert hook is powersgd_hook and state.matrix_approximation_rank == 4


def test_topk_keeps_float32_values_and_the_inner_momentum():
    state, hook, momentum = make_hook("topk", density=0.01, momentum=0.9)
    assert hook is topk_hook and isinstance(state, TopKHookState)
    assert state.density == 0.01 and state.value_dtype is None and momentum == 0.9


def test_topk_dgc_moves_momentum_into_the_hook():
    state, hook, momentum = make_hook(
        "topk-dgc", density=0.01, momentum=0.9, iterations_per_epoch=5
    )
    assert hook is topk_hook and momentum == 0.0  # the inner SGD must not apply it twice
    assert state.momentum_correction == 0.9 and state.value_dtype == torch.bfloat16
    assert state.warmup is not None


def test_topk_dgc_needs_a_density():
    with pytest.raises(ValueError, match="needs a density"):
        make_hook("topk-dgc")


def test_unknown_comm():
    with pytest.raises(ValueError, match="comm must be one of"):
        make_hook("gossip")


def test_cli_offers_exactly_the_named_comms(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--comm", "gossip"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert all(c in err for c in COMMS)


def test_powersgd_state_reports_its_compression_and_round_trips():
    """A run records every hook's ratio and checkpoints every hook's state: torch's
    PowerSGDState has neither, so the lab's must add both (read from torch's own
    counters, dense numel over numel sent, both float32)."""
    state, _, _ = make_hook("powersgd")
    assert state.compression_ratio == 1.0  # nothing compressed yet
    state.total_numel_before_compression, state.total_numel_after_compression = 800, 100
    state.iter = 7
    state.error_dict[0] = torch.arange(4.0)
    state.p_memory_dict[0] = torch.ones(2, 4)
    state.q_memory_dict[0] = torch.full((2, 4), 3.0)
    assert state.compression_ratio == 8.0
    saved = state.state_dict()
    buf = io.BytesIO()
    torch.save(saved, buf)  # what a checkpoint does, then loads with weights_only=True
    buf.seek(0)
    fresh, _, _ = make_hook("powersgd")
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.iter == 7 and fresh.compression_ratio == 8.0
    for name in ("error_dict", "p_memory_dict", "q_memory_dict"):
        mine, theirs = getattr(state, name), getattr(fresh, name)
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert (fresh.rng.get_state()[1] == state.rng.get_state()[1]).all()


def test_powersgd_state_survives_pickling():
    # a checkpoint of several ranks gathers their states with gather_object (pickle):
    # the generator's keys were a uint32 tensor, which torch cannot unpickle
    import pickle

    state, _, _ = make_hook("powersgd")
    state.rng.random(5)  # somewhere in the stream
    fresh, _, _ = make_hook("powersgd")
    fresh.load_state_dict(pickle.loads(pickle.dumps(state.state_dict())))
    assert (fresh.rng.random(3) == state.rng.random(3)).all()


def test_powersgd_memories_follow_a_new_bucket_layout():
    """DDP lays its buckets out anew after the first iteration (and a resumed run
    starts in the initial layout): each parameter's error, P and Q pieces must move
    with it. Rank 4; A and C share a shape (one group in torch's P/Q order), the bias
    is not compressed."""
    a, bias, b, c = (
        torch.nn.Parameter(torch.zeros(s)) for s in [(20, 30), (20,), (30, 40), (20, 30)]
    )
    state, _, _ = make_hook("powersgd", params=[a, bias, b, c])
    # torch's layout for [A, bias, B, C]: e in that order; P/Q by shape group: A, C, B
    e = {"A": 600, "bias": 20, "B": 1200, "C": 600}
    p = {"A": 20 * 4, "C": 20 * 4, "B": 30 * 4}
    q = {"A": 30 * 4, "C": 30 * 4, "B": 40 * 4}

    def pieces(sizes, order, base):
        return {k: base + 1000 * i + torch.arange(float(sizes[k])) for i, k in enumerate(order)}

    err, ps, qs = (
        pieces(e, ["A", "bias", "B", "C"], 0),
        pieces(p, "ACB", 1e5),
        pieces(q, "ACB", 2e5),
    )
    state.error_dict[0] = torch.cat([err[k] for k in ("A", "bias", "B", "C")])
    state.p_memory_dict[0] = torch.cat([ps[k] for k in "ACB"])
    state.q_memory_dict[0] = torch.cat([qs[k] for k in "ACB"])
    saved = {
        n: getattr(state, n)[0].clone() for n in ("error_dict", "p_memory_dict", "q_memory_dict")
    }
    state.follow(FakeBucket(0, [a, bias, b, c]))  # the layout the memories were written in
    assert torch.equal(state.error_dict[0], saved["error_dict"])
    state.follow(FakeBucket(0, [c, b, bias, a]))  # rebuilt in gradient-ready order
    assert torch.equal(state.error_dict[0], torch.cat([err[k] for k in ("C", "B", "bias", "A")]))
    assert torch.equal(state.p_memory_dict[0], torch.cat([ps[k] for k in "CAB"]))
    assert torch.equal(state.q_memory_dict[0], torch.cat([qs[k] for k in "CAB"]))
    state.follow(FakeBucket(0, [a, bias, b, c]))  # and back: exactly what was there
    for name, t in saved.items():
        assert torch.equal(getattr(state, name)[0], t), name
    assert not state.pending

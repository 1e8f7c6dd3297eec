"""TopKHookState and compress_: exact conservation (also with 16-bit values), the
layout check, loss-scale tracking, state dicts, arguments."""

import pytest
import torch

from bucket_support import FakeBucket
from gradsift.distributed import TopKHookState, compress_

KEYS, SIZES = [(0, 0), (0, 1)], [300, 200]


def _residual(state):
    return torch.cat([state.residuals[k] for k in KEYS]) if state.residuals else None


@pytest.mark.parametrize(
    "dtype, value_dtype",
    [
        (torch.float64, None),
        (torch.float32, torch.bfloat16),
        (torch.float32, torch.float16),
        (torch.float64, torch.float32),
        (torch.bfloat16, torch.float16),  # 65504 is no bfloat16: 65280 is the top of both
        (torch.float16, torch.bfloat16),  # 65440..65504 round to bfloat16's 65536
        (torch.float16, torch.float32),
    ],
)
def test_compress_conserves_mass_exactly(dtype, value_dtype):
    state = TopKHookState(density=0.1, value_dtype=value_dtype)
    gen = torch.Generator().manual_seed(0)
    total_in = torch.zeros(500, dtype=torch.float64)
    total_sent = torch.zeros(500, dtype=torch.float64)
    top = torch.finfo(dtype).max
    for step in range(20):
        before = _residual(state)
        before = torch.zeros(500, dtype=dtype) if before is None else before.clone()
        scale = (1.0, 10.0, 1e2, 1e3, 1e4, 4e4)[step % 6]  # 4e4: around float16's top
        g = torch.randn(500, generator=gen, dtype=torch.float64) * scale
        room = 0.99 * top - before.double().abs()  # r + g stays finite in float16
        g = torch.minimum(torch.maximum(g, -room), room).to(dtype)
        idx, vals = compress_(state, g, KEYS, SIZES)
        assert idx.numel() == 50 and vals.dtype == (value_dtype or dtype)
        sent = torch.zeros_like(g).index_add_(0, idx, vals.to(dtype))  # decoded
        assert torch.isfinite(sent).all() and torch.isfinite(_residual(state)).all()
        torch.testing.assert_close(sent + _residual(state), before + g, rtol=0, atol=0)
        total_in += g.double()
        total_sent += sent.double()
    if dtype == torch.float64:
        torch.testing.assert_close(total_sent + _residual(state), total_in, rtol=1e-12, atol=1e-9)


def test_fp16_values_beyond_its_range_stay_behind_exactly():
    # past twice float16's top a value sends the largest multiple of its spacing
    # within it (1e9: spacing 64, 65472); it sent nothing, so it was selected again
    # and again and never delivered
    state = TopKHookState(k=3, value_dtype=torch.float16)
    g = torch.tensor([1e5, -7e4, 1e9, 0.5])
    idx, vals = compress_(state, g, [(0, 0)], [4])
    assert idx.tolist() == [0, 1, 2]
    assert vals.float().tolist() == [65504.0, -65504.0, 65472.0]
    assert state.residual.tolist() == [1e5 - 65504.0, -7e4 + 65504.0, 1e9 - 65472.0, 0.5]


def test_a_value_beyond_the_wire_is_delivered_over_the_steps_after():
    # 3e5 a step on one coordinate, float16 on the wire: 65504 goes out each step and
    # the residual holds the rest, exactly (sent + residual == what came in)
    state = TopKHookState(k=1, value_dtype=torch.float16)
    sent = 0.0
    for step in range(1, 6):
        idx, vals = compress_(state, torch.tensor([3e5, 0.0]), [(0, 0)], [2])
        assert idx.tolist() == [0] and vals.item() == 65504.0
        sent += vals.item()
        assert sent + state.residual[0].item() == 3e5 * step


@pytest.mark.parametrize(
    "dtype, value_dtype, g, sent",
    [  # 65280 is the largest value finite in float16 and bfloat16 alike
        (torch.bfloat16, torch.float16, [65504, -1.3e5, 3e5, 0.5], [65280, -65280, 63488]),
        (torch.float16, torch.bfloat16, [65504, -65440, 65000, 0.5], [65280, -65280, 65024]),
    ],
)
def test_between_16_bit_dtypes_the_top_of_both_is_sent(dtype, value_dtype, g, sent):
    """What lies above the top of both dtypes stays behind; above twice it the value
    sends the largest multiple of its spacing within the top (bfloat16's 299008:
    spacing 2048, 63488), so the difference is exact; below the top the value is
    rounded as usual."""
    state = TopKHookState(k=3, value_dtype=value_dtype)
    g = torch.tensor(g, dtype=torch.float64).to(dtype)
    idx, vals = compress_(state, g, [(0, 0)], [4])
    assert idx.tolist() == [0, 1, 2] and vals.double().tolist() == sent
    want = g.double()
    want[:3] -= torch.tensor(sent, dtype=torch.float64)
    assert state.residual.double().tolist() == want.tolist()


def test_a_state_of_another_model_is_refused():
    state = TopKHookState(k=2)
    compress_(state, torch.randn(10), [(0, 0)], [10])
    with pytest.raises(ValueError, match="does not match this model"):
        compress_(state, torch.randn(7), [(0, 0)], [7])


def test_residual_follows_the_loss_scale():
    class Scaler:  # the two calls the state makes of torch.amp.GradScaler
        scale = 1024.0

        def is_enabled(self):
            return True

        def get_scale(self):
            return self.scale

    scaler = Scaler()
    state = TopKHookState(k=1, grad_scaler=scaler)
    compress_(state, torch.tensor([4.0, 2048.0]), [(0, 0)], [2])
    assert state.residual.tolist() == [4.0, 0.0]
    scaler.scale = 512.0  # an overflow halved it: the memory is halved with it
    compress_(state, torch.tensor([1.0, 0.0]), [(0, 0)], [2])
    assert state.residual.tolist() == [0.0, 0.0] and state.scale == 512.0


def test_state_dict_round_trip_and_the_old_format():
    state = TopKHookState(density=0.1, momentum_correction=0.9)
    compress_(state, torch.randn(100), [(0, 0)], [100])
    state.iter, state.bytes_sent, state.bytes_dense = 7, 10, 400
    other = TopKHookState(density=0.1, momentum_correction=0.9)
    other.load_state_dict(state.state_dict())
    assert (other.iter, other.bytes_sent, other.bytes_dense) == (7, 10, 400)
    assert torch.equal(other.residuals[(0, 0)], state.residuals[(0, 0)])
    assert torch.equal(other.velocity, state.velocity) and other.velocity.any()
    assert other.compression_ratio == 40.0
    old = {
        "iter": 3,
        "bytes_sent": 1,
        "bytes_dense": 2,
        "residuals": {(0, 1): torch.ones(2), (0, 0): torch.zeros(3)},
    }
    other.load_state_dict(old)
    assert other.layout == [((0, 0), 3), ((0, 1), 2)]
    assert other.residual.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({}, ValueError, "exactly one"),
        ({"density": 0.1, "start_iter": -1}, ValueError, "start_iter must be >= 0"),
        ({"density": 2.0}, ValueError, "density must be in"),
        ({"density": 0.1, "encoding": "zip"}, ValueError, "encoding must be one of"),
        ({"density": 0.1, "value_dtype": torch.int8}, ValueError, "value_dtype must be one of"),
        (
            {"density": 0.1, "momentum_correction": 0.9, "error_feedback": False},
            ValueError,
            "needs error_feedback",
        ),
        ({"density": 0.1, "warmup": [(0, 0.5)]}, ValueError, "warmup iterations must be >= 1"),
        ({"density": 0.1, "clip_norm": 0.0}, ValueError, r"clip_norm must be in \(0, inf\)"),
    ],
)
def test_bad_state_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        TopKHookState(**kwargs)


def test_reshard_keeps_the_counters_and_restarts_the_memory():
    state = TopKHookState(density=0.1, momentum_correction=0.9)
    compress_(state, torch.randn(100), [(0, 0)], [100])
    saved = {**state.state_dict(), "iter": 5, "rank": 3, "world_size": 4}
    assert state.state_dict()["rank"] is None  # no process group: rank unknown
    other = TopKHookState(density=0.1, momentum_correction=0.9)
    other.load_state_dict(saved)
    assert (other.rank, other.world_size) == (3, 4)  # the hook checks them
    other.load_state_dict(saved, reshard=True)
    assert other.iter == 5 and other.layout == [((0, 0), 100)]
    assert other.residual is None and other.velocity is None and other.rank is None
    with pytest.raises(TypeError, match="reshard must be True or False"):
        other.load_state_dict(saved, reshard="yes")


def test_reshard_drops_the_loss_scale_and_loaded_keys_match_list_keys():
    """A resharded state's memory is zero, so it is in no loss scale's units: it runs
    without the GradScaler it was saved with. Keys given as lists (as state_dict
    writes them) match after a load as before it."""
    scaled = TopKHookState(density=0.2, grad_scaler=torch.amp.GradScaler("cpu"))
    keys = [[0, 0], [0, 1]]
    compress_(scaled, torch.randn(6), keys, [4, 2])
    other = TopKHookState(density=0.2)
    other.load_state_dict(scaled.state_dict(), reshard=True)
    assert other.scale is None
    compress_(other, torch.randn(6), keys, [4, 2])  # no "has no grad_scaler" error
    again = TopKHookState(density=0.2)
    again.load_state_dict(other.state_dict())
    compress_(again, torch.randn(6), keys, [4, 2])  # not "does not match this model"


def test_keys_come_from_the_first_step_and_a_reused_id_is_a_new_parameter():
    import weakref

    state = TopKHookState(k=1)
    a, b = torch.zeros(3), torch.zeros(2)
    assert state.keys_of(FakeBucket(0, [a, b])) == [(0, 0), (0, 1)]
    state.iter += 1  # a step later DDP has rebuilt its buckets: the keys stay
    assert state.keys_of(FakeBucket(0, [b, a])) == [(0, 1), (0, 0)]
    # a tensor at the id of a dead one (CPython reuses ids) is not that one
    c, dead = torch.zeros(3), torch.zeros(3)
    state._keys[id(c)] = (weakref.ref(dead), (0, 0))
    del dead
    with pytest.raises(ValueError, match="already serves another model"):
        state.keys_of(FakeBucket(0, [c, b]))

"""Adversarial tests of the top-k DDP hook against independent references."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import hook_adversarial_workers as W  # noqa: N812
from gradsift.distributed import TopKHookState, compress_, encoding as wire
from worlds import rank_results, run_world

F16MAX = torch.finfo(torch.float16).max

CONFIGS = {
    "int64-start1": dict(density=0.05, encoding="int64", start_iter=1),
    "int32-bf16": dict(density=0.05, encoding="int32", value_dtype=torch.bfloat16),
    "local16-fp16-momentum": dict(
        density=0.02, encoding="local16", value_dtype=torch.float16, momentum=0.9, start_iter=0
    ),
    "bitmap": dict(density=0.3, encoding="bitmap", start_iter=0),
    "auto-warmup": dict(density=0.001, start_iter=1, warmup=[(2, 0.5), (1, 0.01)], steps=5),
    "dense-if-larger": dict(density=0.9, encoding="int64", start_iter=0),
    "no-dense-switch": dict(density=0.9, encoding="int64", start_iter=0, dense_if_larger=False),
    "no-ef": dict(density=0.01, ef=False, start_iter=0),
    "ties": dict(density=0.003, start_iter=0, ties=True, encoding="int32"),
    "buckets": dict(density=0.01, start_iter=1, cap_mb=0.01, min_buckets=2),
    "nan-rank1": dict(density=0.01, start_iter=0, nan_at=2, steps=4),
    "unused-on-rank1": dict(density=0.01, start_iter=0, unused=True),
    # find_unused_parameters on the state: a parameter one rank uses is used (not held)
    "unused-on-rank1-held": dict(density=0.01, start_iter=0, unused=True, hold=True),
    "scaler": dict(density=0.01, start_iter=0, scaler=True, nan_at=2, steps=5),
    "scaler-held": dict(density=0.01, start_iter=0, scaler=True, nan_at=2, steps=5, hold=True),
}


@pytest.fixture(scope="module")
def reference_results():
    res = rank_results(run_world(W.check_configs, 2, list(CONFIGS.values()), deadline_s=60), 2)
    return {name: [r[i] for r in res] for i, name in enumerate(CONFIGS)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_hook_matches_independent_reference_bit_for_bit(reference_results, name):
    """Averaged gradients, residuals and velocities, every step, on both ranks."""
    for rank, (problems, modes) in enumerate(reference_results[name]):
        assert problems == [], (name, rank, modes, problems)


def test_reference_took_the_expected_paths(reference_results):
    modes = {name: r[0][1] for name, r in reference_results.items()}
    assert modes["int64-start1"][:2] == ["start", "sparse4124"]
    assert modes["auto-warmup"] == ["start", "sparse41238", "sparse825", "sparse82", "sparse82"]
    assert set(modes["dense-if-larger"]) == {"dense"}
    assert set(modes["no-dense-switch"]) == {"sparse74228"}
    assert modes["nan-rank1"][2] == "nonfinite"
    assert modes["scaler"][2] == "nonfinite"


@pytest.mark.parametrize(("how", "cap_mb"), [("state_dict", 25), ("pickle", 0.01)])
def test_resume_bit_for_bit(how, cap_mb):
    for equal, nres, it in rank_results(run_world(W.resume, 2, how, cap_mb, deadline_s=60), 2):
        assert nres > 0 and it == 6
        assert equal


def test_clip_norm_clips_the_local_gradient():
    res = rank_results(
        run_world(W.check_configs, 2, [dict(density=1.0, start_iter=0, clip=1e-3)], deadline_s=60),
        2,
    )
    for ((problems, _modes),) in res:
        assert problems == [], problems


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_clip_norm_takes_the_norm_in_the_gradients_precision_or_float32(dtype):
    # the norm was asked for in float32, which torch refuses for a float64 input:
    # every float64 model's first compressed step raised
    from gradsift.distributed.hook import _clip_

    state = TopKHookState(density=0.5, clip_norm=1.0)
    flat = torch.arange(1.0, 9.0, dtype=torch.float64).to(dtype)
    norm = flat.double().norm()
    want = (flat.double() * (1 / math.sqrt(2) / (norm + 1e-6))).to(dtype)
    _clip_(state, flat, 2)
    tol = {torch.float64: 1e-15, torch.float32: 1e-6, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(flat, want, rtol=tol, atol=0)


# ---- wire formats (no process group needed) ----


def _roundtrip(n, idx, encoding, vdtype=torch.float32):
    idx = torch.tensor(sorted(set(idx)), dtype=torch.int64)
    k = idx.numel()
    values = torch.arange(1, k + 1, dtype=torch.float32).to(vdtype)
    chosen = wire.choose(encoding, n, k)
    msg = wire.encode(idx, values, n, chosen)
    assert msg.dtype == torch.uint8
    assert msg.numel() == wire.message_bytes(chosen, n, k, vdtype)
    assert msg.numel() == W.ref_message_bytes(encoding, n, k, values.element_size())
    i, v = wire.decode(msg.clone(), n, k, chosen, vdtype)
    assert torch.equal(i, idx), (n, encoding)
    assert torch.equal(v, values)


EDGE_N = [1, 7, 8, 9, 65535, 65536, 65537, 2 * 65536, 2 * 65536 + 3]


@pytest.mark.parametrize("encoding", ["int64", "int32", "local16", "bitmap", "auto"])
@pytest.mark.parametrize("n", EDGE_N)
def test_wire_edges(encoding, n):
    _roundtrip(n, [], encoding)  # k = 0
    _roundtrip(n, [0], encoding)
    _roundtrip(n, [n - 1], encoding)
    _roundtrip(n, [0, n - 1], encoding, torch.bfloat16)
    ends = {0, n - 1, 32767 % n, 32768 % n, 65535 % n, 65536 % n, (65536 + 32768) % n}
    _roundtrip(n, sorted(ends), encoding, torch.float16)
    if n <= 65537:
        _roundtrip(n, range(n), encoding)  # k = n


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 3 * 65536 + 5),
    data=st.data(),
    encoding=st.sampled_from(["int64", "int32", "local16", "bitmap", "auto"]),
    vdtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
)
def test_wire_roundtrip_property(n, data, encoding, vdtype):
    idx = data.draw(st.lists(st.integers(0, n - 1), max_size=min(n, 300)))
    _roundtrip(n, idx, encoding, vdtype)


# ---- compress_ (one rank, no communication) ----


@pytest.mark.parametrize("vd", [None, torch.float16, torch.bfloat16])
def test_compress_conserves_mass_exactly(vd):
    gen = torch.Generator().manual_seed(0)
    state = TopKHookState(density=0.1, value_dtype=vd, momentum_correction=None)
    sizes, keys = [300, 700], [(0, 0), (0, 1)]
    old = torch.zeros(1000)
    for step in range(4):
        g = torch.randn(1000, generator=gen) * 10.0 ** torch.randint(-9, 6, (1000,), generator=gen)
        if vd is torch.float16 and step == 2:
            g[:5] = torch.tensor([7e4, -1.2e5, 2.5e5, 6e-8, 1e-9])
        keep = g.clone()
        idx, values = compress_(state, g, keys, sizes)
        assert torch.equal(g, keep)  # left unchanged
        assert values.dtype == (vd or torch.float32)
        sent = torch.zeros(1000)
        sent[idx] = values.float()
        assert torch.isfinite(sent).all()
        assert torch.equal(sent + state.residual, old + g), step
        want = W.ref_topk(old + g, 100)
        assert torch.equal(idx, want)
        old = state.residual.clone()


def test_compress_fp16_overflow_policy():
    state = TopKHookState(k=4, value_dtype=torch.float16)
    g = torch.tensor([7e4, -1.2e5, 2.5e5, 1.0, 0.5])
    idx, values = compress_(state, g, [(0, 0)], [5])
    assert idx.tolist() == [0, 1, 2, 3]
    assert values.float().tolist() == [F16MAX, -F16MAX, F16MAX, 1.0]
    assert state.residual.tolist() == [7e4 - F16MAX, -1.2e5 + F16MAX, 2.5e5 - F16MAX, 0.0, 0.5]


def test_state_dict_and_pickle_carry_residual_and_velocity():
    import pickle

    a = TopKHookState(density=0.2, momentum_correction=0.5, value_dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(1)
    compress_(a, torch.randn(50, generator=gen), [(0, 0)], [50])
    b = TopKHookState(density=0.2, momentum_correction=0.5, value_dtype=torch.bfloat16)
    b.load_state_dict(a.state_dict())
    c = pickle.loads(pickle.dumps(a))
    g = torch.randn(50, generator=gen)
    outs = [compress_(s, g, [(0, 0)], [50]) for s in (a, b, c)]
    for (i, v), s in zip(outs[1:], (b, c)):
        assert torch.equal(i, outs[0][0]) and torch.equal(v, outs[0][1])
        assert torch.equal(s.residual, a.residual) and torch.equal(s.velocity, a.velocity)
    assert not math.isclose(float(a.velocity.abs().sum()), 0.0)


def test_an_unpickled_state_without_its_grad_scaler_refuses_to_go_on():
    """A GradScaler is an object of its process: pickling the state leaves it behind.
    Its residual is in the scale's units, so stepping on without the scaler (no
    rescaling when the scale changes) is refused until it is set again."""
    import pickle

    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    a = TopKHookState(density=0.2, grad_scaler=scaler)
    gen = torch.Generator().manual_seed(1)
    compress_(a, torch.randn(50, generator=gen), [(0, 0)], [50])
    c = pickle.loads(pickle.dumps(a))
    assert c.grad_scaler is None and c.scale == 2.0**10
    with pytest.raises(ValueError, match="has no grad_scaler: a pickled state leaves its"):
        compress_(c, torch.randn(50, generator=gen), [(0, 0)], [50])
    c.grad_scaler = scaler
    compress_(c, torch.randn(50, generator=gen), [(0, 0)], [50])


def test_a_float16_bucket_beside_a_float32_one_gets_no_inf_and_loses_nothing():
    """The hook's vector (and residual) is float32 when a float16 parameter sits beside
    a float32 one: what it sends for the float16 one is capped below 65504 (the rest
    kept), since the mean is written back into the float16 bucket. bytes_dense counts
    what DDP's allreduce sends: 2 + 4 bytes a step, not 4 + 4."""
    for report in rank_results(run_world(W.mixed_dtypes_past_float16, 2, deadline_s=60), 2):
        for case, (sent, residual, dense_bytes, _) in report.items():
            assert all(math.isfinite(h) and abs(h) <= 65504 for h, _ in sent), (case, sent)
            total = sum(h + f for h, f in sent) + sum(residual)
            assert total == 3 * 4e4 + 5e4, (case, sent, residual)  # every rank alike
            assert dense_bytes == 6, case
        assert report[("None", True)][3] != report[("None", False)][3]  # two paths taken

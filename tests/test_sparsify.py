"""The one error-feedback core: the fused chunked variant equals the single-pass one,
mass is conserved exactly, and DGC's momentum correction matches a transcription."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from gradsift import sparsify_grads_
from gradsift.optim.error_feedback import sparsify_, sparsify_buckets_
from gradsift.optim.workspace import Workspace


def _vectors(n, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen, dtype=dtype) for _ in range(3)]


@pytest.mark.parametrize("n", [1000, 70_001, 300_007])  # dense path, sampled paths + tails
@pytest.mark.parametrize("k_frac", [0.001, 0.03])  # block-key path, direct path
@pytest.mark.parametrize("state", ["none", "residual", "velocity"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_equals_single_pass(n, k_frac, state, dtype):
    k = max(1, int(k_frac * n))
    g, r, u = _vectors(n, n, dtype)
    runs = []
    for workspace in (None, Workspace()):
        grad = g.clone()
        residual = None if state == "none" else r.clone()
        velocity = u.clone() if state == "velocity" else None
        idx, vals = sparsify_(
            grad, k, residual=residual, velocity=velocity, momentum=0.9, workspace=workspace
        )
        runs.append((idx, vals, grad, residual, velocity))
    for a, b in zip(*runs):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("workspace", [None, Workspace()])
def test_conservation_is_exact(workspace):
    g, r, _ = _vectors(200_000, 1, torch.float32)
    total = r + g  # the one rounding: the error-feedback add itself
    grad, residual = g.clone(), r.clone()
    idx, vals = sparsify_(grad, 500, residual=residual, workspace=workspace)
    assert torch.equal(grad + residual, total)  # disjoint supports: no rounding
    assert int(torch.count_nonzero(grad)) == 500 and torch.equal(grad[idx], vals)
    assert not residual[idx].any()
    order = torch.sort(-total.abs(), stable=True).indices[:500]
    assert torch.equal(torch.sort(order).values, idx)


def test_velocity_needs_residual():
    g = torch.randn(10)
    with pytest.raises(ValueError, match="needs error feedback"):
        sparsify_(g, 2, velocity=torch.zeros(10), momentum=0.9)


def test_sparsify_grads_momentum_matches_dgc_transcription():
    """Lin et al. 2018 Alg. 1: u = m u + g; v = v + u; send top-k(v); zero v and u there."""
    gen = torch.Generator().manual_seed(0)
    shapes, k, m = [(6, 5), (7,)], 4, 0.9
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.float64)) for s in shapes]
    residuals = [torch.zeros_like(p) for p in params]
    velocities = [torch.zeros_like(p) for p in params]
    u = torch.zeros(37, dtype=torch.float64)
    v = torch.zeros(37, dtype=torch.float64)
    for _ in range(5):
        grads = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        sparsify_grads_(
            params, k=k, residuals=residuals, velocities=velocities, momentum_correction=m
        )
        u = m * u + torch.cat([g.reshape(-1) for g in grads])
        v = v + u
        order = torch.sort(-v.abs(), stable=True).indices[:k]
        send = torch.zeros_like(v)
        send[order] = v[order]
        v[order] = 0
        u[order] = 0
        got = torch.cat([p.grad.reshape(-1) for p in params])
        torch.testing.assert_close(got, send, rtol=0, atol=0)
        torch.testing.assert_close(torch.cat([r.reshape(-1) for r in residuals]), v, rtol=0, atol=0)
        torch.testing.assert_close(
            torch.cat([x.reshape(-1) for x in velocities]), u, rtol=0, atol=0
        )


def test_sparsify_grads_arguments():
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.tensor([1.0, -3.0, 2.0, 0.5])
    with pytest.raises(ValueError, match="go together"):
        sparsify_grads_([p], k=1, residuals=[torch.zeros(4)], momentum_correction=0.9)
    with pytest.raises(ValueError, match="residuals must match"):
        sparsify_grads_([p], k=1, residuals=[])
    assert sparsify_grads_([p], k=2) == 2
    assert p.grad.tolist() == [0.0, -3.0, 2.0, 0.0]


def test_a_bare_tensor_for_params_is_an_error():
    w = torch.nn.Parameter(torch.ones(3, 4))
    w.grad = torch.ones(3, 4)
    with pytest.raises(TypeError, match=r"params must be an iterable of parameters.*\[w\]"):
        sparsify_grads_(w, k=2)
    with pytest.raises(TypeError, match="residuals must be a list of tensors"):
        sparsify_grads_([w], k=2, residuals=torch.zeros(3, 4))
    assert sparsify_grads_([w], k=2) == 2


def _bucket_case(sizes, dtypes, seed, ties):
    """Flat (grad, residual, velocity) per bucket. Dyadic values whose sums and halves
    are exact in float32, so that accumulating in each vector's own dtype or in the
    widest is the same; small integers plant ties across the vectors."""
    gen = torch.Generator().manual_seed(seed)
    high = 5 if ties else 2**10
    return [
        [(torch.randint(-high, high + 1, (n,), generator=gen) / 64).to(dtype) for _ in range(3)]
        for n, dtype in zip(sizes, dtypes)
    ]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 3000), min_size=2, max_size=3),
    dtypes=st.lists(st.sampled_from([torch.float32, torch.float64]), min_size=3, max_size=3),
    k_frac=st.floats(0.0, 1.0),
    state=st.sampled_from(["none", "residual", "velocity"]),
    ties=st.booleans(),
    workspace=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_buckets_select_as_their_concatenation(sizes, dtypes, k_frac, state, ties, workspace, seed):
    # several flat vectors select the global top-k in place, as sparsify_ on their
    # concatenation: same indices (lowest-index ties across vectors), values, states
    total = sum(sizes)
    _check_buckets(
        sizes, dtypes, max(1, min(total, round(k_frac * total))), state, ties, workspace, seed
    )


@pytest.mark.parametrize("k", [300, 9000])  # block keys, direct; 70_001 takes the sampled path
@pytest.mark.parametrize("state", ["residual", "velocity"])
def test_large_buckets_select_as_their_concatenation(k, state):
    sizes, dtypes = [5, 70_001, 300_007], [torch.float64, torch.float32, torch.float32]
    for ties, workspace in ((False, True), (True, True), (False, False)):
        _check_buckets(sizes, dtypes, k, state, ties, workspace, seed=k)


def _check_buckets(sizes, dtypes, k, state, ties, workspace, seed):
    case = _bucket_case(sizes, dtypes, seed, ties)
    wide = torch.float64 if torch.float64 in dtypes[: len(sizes)] else torch.float32
    flats, cat = [], []
    for g, r, u in case:
        flats.append(
            (
                g.clone(),
                None if state == "none" else r.clone(),
                u.clone() if state == "velocity" else None,
            )
        )
    for j in range(3):
        parts = [f[j] for f in flats]
        cat.append(None if parts[0] is None else torch.cat([t.to(wide) for t in parts]))
    ref_idx, ref_vals = sparsify_(cat[0], k, residual=cat[1], velocity=cat[2], momentum=0.5)
    got = sparsify_buckets_(
        flats, k, momentum=0.5, workspaces=[Workspace() if workspace else None for _ in flats]
    )
    start = 0
    for (idx, vals), (g, r, u), n in zip(got, flats, sizes):
        inside = (ref_idx >= start) & (ref_idx < start + n)
        assert torch.equal(idx, ref_idx[inside] - start)
        assert torch.equal(vals.to(wide), ref_vals[inside])
        for t, ref in zip((g, r, u), cat):
            if t is not None:
                assert torch.equal(t.to(wide), ref[start : start + n])
        start += n


def test_buckets_of_narrow_dtypes_rank_exactly_in_the_widest():
    # a bfloat16 value and a float32 value differing below bfloat16's precision
    a = torch.tensor([1.0, 0.0], dtype=torch.bfloat16)
    b = torch.tensor([0.0, 1.0 + 2**-20], dtype=torch.float32)
    got = sparsify_buckets_([(a.clone(), None, None), (b.clone(), None, None)], 1)
    assert got[0][0].numel() == 0 and got[1][0].tolist() == [1]
    got = sparsify_buckets_([(b.clone(), None, None), (a.clone(), None, None)], 1)
    assert got[0][0].tolist() == [1] and got[1][0].numel() == 0


def test_a_parameter_listed_twice_counts_once():
    """A tied weight reached through two modules: one selection over it, with the
    residual of its first place; it once selected from both copies and wrote the
    second's unselected copy back (k=1 kept 3.0 in the count and sent nothing)."""
    w, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2))
    w.grad, b.grad = torch.tensor([0.1, 3.0, 0.2, 0.3]), torch.tensor([1.0, -2.0])
    residuals = [torch.zeros(4), torch.zeros(2), torch.full((4,), 7.0)]
    assert sparsify_grads_([w, b, w], k=2, residuals=residuals) == 2
    assert w.grad.tolist() == [0.0, 3.0, 0.0, 0.0] and b.grad.tolist() == [0.0, -2.0]
    torch.testing.assert_close(residuals[0], torch.tensor([0.1, 0.0, 0.2, 0.3]))
    assert residuals[1].tolist() == [1.0, 0.0] and residuals[2].tolist() == [7.0] * 4
    w.grad = torch.tensor([0.1, 3.0, 0.2, 0.3])
    assert sparsify_grads_([w, w], k=1) == 1 and w.grad.tolist() == [0.0, 3.0, 0.0, 0.0]


def test_a_sparse_gradient_is_selected_in_its_dense_form():
    emb = torch.nn.Embedding(6, 2, sparse=True)
    emb(torch.tensor([1, 4, 1])).sum().backward()
    assert emb.weight.grad.layout == torch.sparse_coo
    dense = emb.weight.grad.to_dense()
    residual = [torch.zeros(6, 2)]
    assert sparsify_grads_(emb.parameters(), k=3, residuals=residual) == 3
    assert emb.weight.grad.layout == torch.strided
    torch.testing.assert_close(emb.weight.grad + residual[0], dense, rtol=0, atol=0)
    assert int((emb.weight.grad != 0).sum()) == 3

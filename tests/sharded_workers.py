"""Worker functions for the multi-rank sharded tests (spawned: must be importable)."""

import torch
import torch.distributed as dist

from gradsift.select import topk_indices
from gradsift.select.sharded import sharded_topk_indices


def split(x, sizes):
    """Contiguous shards of ``x`` with their offsets."""
    out, start = [], 0
    for n in sizes:
        out.append((x[start : start + n], start))
        start += n
    return out


def select_cases(rank, world):
    """Each case: the global vector, the shard sizes, k, absolute. Returns, per case,
    this rank's global indices and the single-process reference."""
    cases = []
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(1000, generator=gen)
    cases.append((x, even(1000, world), 37, True))
    cases.append((x, even(1000, world), 37, False))
    cases.append((x.to(torch.float64), even(1000, world), 100, True))
    cases.append((x.to(torch.bfloat16), even(1000, world), 50, True))
    cases.append((x.to(torch.float16), even(1000, world), 500, False))
    # ties at the cut spanning ranks: many equal magnitudes, signs mixed, and -0/+0
    ties = torch.tensor([1.0, -1.0, 0.5, 2.0, -0.0, 0.0] * 50)
    cases.append((ties, even(300, world), 70, True))
    cases.append((ties, even(300, world), 3, False))
    cases.append((torch.zeros(90), even(90, world), 10, True))
    # k larger than one shard, uneven shards, and an empty shard
    sizes = [0] + even(600, world - 1) if world > 1 else [600]
    cases.append((torch.randn(600, generator=gen), sizes, 450, True))
    cases.append(
        (
            torch.randn(600, generator=gen),
            [590] + [10 // (world - 1)] * (world - 1) if world > 1 else [600],
            20,
            True,
        )
    )
    cases.append((torch.tensor([float("inf"), -float("inf"), 3.0] * 20), even(60, world), 41, True))
    out = []
    for vec, sizes, k, absolute in cases:
        shard, offset = split(vec, sizes)[rank]
        mine = sharded_topk_indices(shard, k, offset=offset, absolute=absolute) + offset
        gathered = [None] * world
        dist.all_gather_object(gathered, mine.tolist())
        union = sorted(i for g in gathered for i in g)
        ref = topk_indices(vec, k, absolute=absolute).tolist()
        out.append((union, ref))
    return out


def even(n, world):
    return [n // world + (1 if r < n % world else 0) for r in range(world)]


def nan_case(rank, world):
    """A NaN on the last rank only: every rank must raise the same ValueError."""
    x = torch.randn(10)
    if rank == world - 1:
        x[3] = float("nan")
    try:
        sharded_topk_indices(x, 5, offset=10 * rank)
    except ValueError as e:
        return f"ValueError: {e}"
    return "no error"


def invalid_case(rank, world, case):
    """The last rank's arguments are invalid (``case``); the others' are fine."""
    x, k, kw = torch.randn(10), 5, {"offset": 10 * rank}
    if rank == world - 1:
        if case == "k":
            k = 0
        elif case == "huge_k":  # past int64 where the ranks' settings are summed
            k = 2**63
        elif case == "huge_offset":
            x, kw = torch.ones(10), {"offset": 2**63}  # ties at the cut: the tie gather
        elif case == "shape":
            x = x.reshape(2, 5)
        else:
            kw = {"segments": [(10 * rank, 4)]}  # covers 4 of the 10
    try:
        sharded_topk_indices(x, k, **kw)
    except ValueError as e:
        return f"ValueError: {e}"
    return "no error"


def segments_case(rank, world):
    """Interleaved segments (a rank's rows of each parameter) with ties across them."""
    gen = torch.Generator().manual_seed(3)
    a = torch.round(torch.randn(12, 5, generator=gen) * 2)
    b = torch.round(torch.randn(7, 3, generator=gen) * 2)
    vec = torch.cat([a.reshape(-1), b.reshape(-1)])
    parts, segs, base = [], [], 0
    for t in (a, b):
        rows = even(t.shape[0], world)
        start = sum(rows[:rank])
        local = t[start : start + rows[rank]].reshape(-1)
        parts.append(local)
        segs.append((base + start * t.shape[1], local.numel()))
        base += t.numel()
    shard = torch.cat(parts)
    results = []
    for k in (1, 9, 40, vec.numel()):
        local = sharded_topk_indices(shard, k, segments=segs)
        glob = [_to_global(int(i), segs) for i in local]
        gathered = [None] * world
        dist.all_gather_object(gathered, glob)
        results.append((sorted(i for g in gathered for i in g), topk_indices(vec, k).tolist()))
    return results


def _to_global(i, segs):
    for g, n in segs:
        if i < n:
            return g + i
        i -= n
    raise IndexError(i)


def mixed_offset_and_segments(rank, world):
    """Rank 0 passes ``offset``, the others ``segments`` (each valid alone), ties at the
    cut: the union is the lowest-index ties (the length all-gather of varied segments
    once ran on the segment ranks alone, a collective mismatch that aborted them)."""
    x = torch.ones(2)
    results = []
    for k in (1, 2 * world - 1):
        if rank == 0:
            local = sharded_topk_indices(x, k, offset=0)
        else:
            local = sharded_topk_indices(x, k, segments=[(2 * rank, 1), (2 * rank + 1, 1)])
        gathered = [None] * world
        dist.all_gather_object(gathered, [2 * rank + int(i) for i in local])
        results.append((sorted(i for g in gathered for i in g), list(range(k))))
    return results

"""Workers for the FSDP2 tests on gloo ranks (spawned: must be importable)."""

import copy

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ddp_workers import batch, small_model
from gradsift import NonFiniteGradError, TopK


def sharded_model(world, seed=0):
    """``small_model`` and an unsharded copy of its initial weights."""
    model = small_model(seed)
    ref = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, ref


def topk_pair(model, ref, **kw):
    def make(m):
        return TopK(torch.optim.SGD(m.parameters(), lr=0.1), **kw)

    return make(model), make(ref)


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def step_matches_single_process(rank, world, kw):
    """Sharded TopK vs single-process TopK fed the same (averaged) full gradient:
    parameters and residuals compared bit for bit after each of 3 steps."""
    model, ref = sharded_model(world)
    opt, ref_opt = topk_pair(model, ref, **kw)
    # the sharded path lets the inner SGD step densely (p - lr * g with g zero off the
    # selection); a no-op hook makes the single-process reference do the same instead
    # of its sparse index_add_, which may round the product differently (1 ulp)
    ref_opt.optimizer.register_step_pre_hook(lambda *args: None)
    report = []
    for step in range(3):
        x, y = batch(rank, step)
        F.cross_entropy(model(x), y).backward()
        grads = [full(p.grad) for p in model.parameters()]
        for q, g in zip(ref.parameters(), grads):
            q.grad = g.clone()
        opt.step()
        ref_opt.step()
        same_params = all(
            torch.equal(full(p.detach()), q.detach())
            for p, q in zip(model.parameters(), ref.parameters())
        )
        names = [n for n in ("residual", "momentum") if n in opt.state[next(model.parameters())]]
        same_state = all(
            torch.equal(full(opt.state[p][n]), ref_opt.state[q][n])
            for p, q in zip(model.parameters(), ref.parameters())
            for n in names
        )
        kept = sum(int(torch.count_nonzero(full(p.grad))) for p in model.parameters())
        report.append((same_params, same_state, kept, names))
        opt.zero_grad()
        ref_opt.zero_grad()
    return report


def train_steps(model, opt, rank, steps, start=0, batch_of=None):
    """``steps`` TopK steps on this rank's batches (``batch_of(rank, step)``)."""
    for step in range(start, start + steps):
        x, y = (batch_of or batch)(rank, step)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _snapshot(model, opt):
    """Full parameters and residuals as lists (tensors do not survive the queue once
    the process that made them exits)."""
    params = [full(p.detach()).tolist() for p in model.parameters()]
    residuals = [full(opt.state[p]["residual"]).tolist() for p in model.parameters()]
    return params, residuals


def nonfinite_on_one_rank(rank, world):
    """A NaN in rank 1's shard of one gradient: every rank's step raises the same
    error, and nothing (parameters, residuals, gradients) is modified on any rank."""
    model, _ = sharded_model(world)
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), density=0.1)
    train_steps(model, opt, rank, 1)  # residuals exist
    x, y = batch(rank, 1)
    F.cross_entropy(model(x), y).backward()
    if rank == 1:
        next(model.parameters()).grad.to_local().view(-1)[0] = float("nan")
    before = _snapshot(model, opt), [full(p.grad).tolist() for p in model.parameters()]
    try:
        opt.step()
        message = None
    except NonFiniteGradError as e:
        message = str(e)
    after = _snapshot(model, opt), [full(p.grad).tolist() for p in model.parameters()]
    return message, str(before) == str(after)  # str: NaN != NaN, its text is equal


def checkpoint_save(rank, world, path):
    """Train 2 steps, save with torch.distributed.checkpoint, train 2 more; the
    snapshots at the save and at the end."""
    import torch.distributed.checkpoint as dcp

    model, _ = sharded_model(world)
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), density=0.1)
    train_steps(model, opt, rank, 2)
    dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=path)
    saved = _snapshot(model, opt)
    train_steps(model, opt, rank, 2, start=2)
    return saved, _snapshot(model, opt)


def checkpoint_load(rank, world, path):
    """Load the checkpoint (any world size); the snapshot after loading, and after 2
    more steps."""
    import torch.distributed.checkpoint as dcp

    model, _ = sharded_model(world, seed=1)  # other weights: the load must replace them
    opt = TopK(torch.optim.SGD(model.parameters(), lr=0.1), density=0.1)
    sd = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(sd, checkpoint_id=path)
    model.load_state_dict(sd["model"])
    opt.load_state_dict(sd["optim"])
    loaded = _snapshot(model, opt)
    train_steps(model, opt, rank, 2, start=2)
    return loaded, _snapshot(model, opt)


def pruning_masks(rank, world, sparsity, coarse):
    """Global masks from magnitude scores on the shards vs ``masks_from_scores`` on
    the unsharded model; ``coarse`` rounds the scores so that ties cross ranks."""
    from gradsift.pruning import masks_from_scores
    from gradsift.pruning.sharded import sharded_masks_from_scores

    model, ref = sharded_model(world)

    def magnitude(p):
        return (p.detach() * 4).round().abs() if coarse else p.detach().abs()

    scores = {n: magnitude(p) for n, p in model.named_parameters() if n.endswith("weight")}
    masks = sharded_masks_from_scores(scores, sparsity)
    ref_scores = {n: magnitude(p) for n, p in ref.named_parameters() if n.endswith("weight")}
    expected = masks_from_scores(ref_scores, sparsity)
    return [torch.equal(full(masks[n]), expected[n]) for n in expected]


class TwoHeads(torch.nn.Module):
    """Two linear heads on one input; ``use_b=False`` leaves ``b`` out of the loss."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 5), torch.nn.Linear(6, 3)

    def forward(self, x, use_b=True):
        out = self.a(x).square().sum()
        return out + self.b(x).square().sum() if use_b else out


def unreached_or_converted(rank, world, case, inner):
    """Sharded TopK vs single-process TopK on the same batches, 4 steps:
    ``case="unreached"``: ``b`` is used at step 0 only, and TopK's default
    ``zero_grad()`` runs between steps; ``"to64"``: both models are converted to
    float64 after their TopK was built. Per step: parameters and residuals equal."""
    torch.manual_seed(0)
    ref = TwoHeads().to(torch.float64 if case == "unreached" else torch.float32)
    model = copy.deepcopy(ref)
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model.a, mesh=mesh)
    fully_shard(model.b, mesh=mesh)
    fully_shard(model, mesh=mesh)

    def make(m):
        params = list(m.parameters())
        adam = torch.optim.Adam(params, lr=0.01) if inner == "adam" else None
        return TopK(adam or torch.optim.SGD(params, lr=0.1), density=0.3)

    opt, ref_opt = make(model), make(ref)
    ref_opt.optimizer.register_step_pre_hook(lambda *args: None)  # dense SGD, as sharded
    if case == "to64":
        model.to(torch.float64)
        ref.to(torch.float64)
    gen = torch.Generator().manual_seed(3)
    report = []
    for step in range(4):
        x = torch.randn(4, 6, generator=gen, dtype=torch.float64)
        use_b = case != "unreached" or step == 0
        model(x, use_b).backward()
        ref(x, use_b).backward()  # the same x on every rank: FSDP's mean is exact
        opt.step()
        ref_opt.step()
        pairs = list(zip(model.parameters(), ref.parameters()))
        report.append(
            (
                all(torch.equal(full(p.detach()), q.detach()) for p, q in pairs),
                all(
                    torch.equal(full(opt.state[p]["residual"]), ref_opt.state[q]["residual"])
                    for p, q in pairs
                ),
            )
        )
        opt.zero_grad()
        ref_opt.zero_grad()
    return report


def checkpoint_mixed_groups(rank, world, path):
    """SGD momentum on the weights only (the biases keep no inner state), saved and
    loaded with ``get/set_optimizer_state_dict``: this rank's keys, whether the run
    resumed equals the uninterrupted one, and ``_holds_nonzero`` of a DTensor whose
    only non-zero lies on rank 0."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.tensor import Shard, distribute_tensor

    from gradsift.optim.state_dict import _holds_nonzero

    def build(seed):
        model, _ = sharded_model(world, seed)
        groups = [
            {"params": [p for n, p in model.named_parameters() if n.endswith("weight")],
             "momentum": 0.9},
            {"params": [p for n, p in model.named_parameters() if n.endswith("bias")]},
        ]  # fmt: skip
        return model, TopK(torch.optim.SGD(groups, lr=0.1), density=0.3)

    model, opt = build(0)
    train_steps(model, opt, rank, 1)
    osd = get_optimizer_state_dict(model, opt)
    keys = sorted((k, tuple(sorted(v))) for k, v in osd["state"].items())
    dcp.save({"model": model.state_dict(), "optim": osd}, checkpoint_id=path)
    train_steps(model, opt, rank, 2, start=1)
    model2, opt2 = build(1)
    sd = {"model": model2.state_dict(), "optim": get_optimizer_state_dict(model2, opt2)}
    dcp.load(sd, checkpoint_id=path)
    model2.load_state_dict(sd["model"])
    set_optimizer_state_dict(model2, opt2, sd["optim"])
    train_steps(model2, opt2, rank, 2, start=1)
    resumed = _snapshot(model2, opt2) == _snapshot(model, opt)
    mesh = next(model.parameters()).device_mesh
    t = distribute_tensor(torch.tensor([1.0, 0.0, 0.0, 0.0]), mesh, [Shard(0)])
    return keys, resumed, _holds_nonzero(t)

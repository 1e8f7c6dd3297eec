"""Workers for pruning FSDP2 models on gloo ranks (spawned: must be importable).

Every reference is computed in the same worker process (same threads, same kernels)
on an unsharded copy of the same initial model, fed the same batch."""

import copy

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import gradsift
from ddp_workers import batch

SPARSITY = 0.8


def bn_model(seed=0, dtype=torch.float32):
    """A small MLP with a BatchNorm (buffers that SNIP's train-mode forward moves)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(20, 64),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 5),
    ).to(dtype)


def shard(model, world, hsdp=False):
    """``fully_shard`` on every layer with parameters and on the root; ``hsdp``: a
    (replicate=world, shard=1) mesh, so placements are (Replicate, Shard(0))."""
    if hsdp:
        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def state(model):
    """Everything scoring must leave as it was, as full tensors."""
    return {
        "params": [full(p.detach()).clone() for p in model.parameters()],
        "grads": [None if p.grad is None else full(p.grad).clone() for p in model.parameters()],
        "buffers": [b.clone() for b in model.buffers()],
        "modes": [m.training for m in model.modules()],
        "flags": [p.requires_grad for p in model.parameters()],
        "fsdp": [  # how FSDP reduces gradients (scoring sums them exactly for a while)
            (g.gradient_divide_factor, g.force_sum_reduction_for_comms)
            for m in model.modules()
            if hasattr(m, "_get_fsdp_state")
            for g in m._get_fsdp_state()._fsdp_param_groups
        ],
    }


def same_state(a, b):
    def eq(x, y):
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))

    return all(
        all(eq(x, y) for x, y in zip(a[k], b[k]))
        if k in ("params", "grads", "buffers")
        else a[k] == b[k]
        for k in a
    )


def masks_equal(rank, world, method, dtype, hsdp, options):
    """``score`` leaves the sharded model as it was and its scores equal the
    single-process ones bit for bit; so do ``prune_at_init``'s masks and pruned
    weights (same init, same batch)."""
    ref = bn_model(dtype=dtype)
    model = shard(copy.deepcopy(ref), world, hsdp)
    x, y = batch(0, 0)  # the same batch on every rank
    data = [(x.to(dtype), y)]
    for m in (model, ref):  # existing .grad to keep; the same BatchNorm statistics
        F.cross_entropy(m(data[0][0]), y).backward()
    before = state(model)
    ref_options = dict(options)
    if method == "synflow":
        ref_options["dtype"] = dtype  # the sharded one computes in the model's dtype
    scored = {k: v for k, v in options.items() if k != "iterations"}  # a pruning option
    scores = gradsift.score(model, method, data, **scored)
    ref_scored = {k: v for k, v in ref_options.items() if k != "iterations"}
    ref_scores = gradsift.score(ref, method, data, **ref_scored)
    same_scores = all(torch.equal(full(scores[n]), ref_scores[n]) for n in ref_scores)
    untouched = same_state(before, state(model))
    placements = sorted({str(s.placements) for s in scores.values()})
    for p in model.parameters():
        p.grad = None
    masks = gradsift.prune_at_init(model, method, SPARSITY, data, **options)
    expected = gradsift.prune_at_init(ref, method, SPARSITY, data, **ref_options)
    same_masks = [torch.equal(full(masks[n]), expected[n].float()) for n in expected]
    ref_weights = dict(ref.named_parameters())
    same_weights = [
        torch.equal(full(p.detach()), _effective(ref, n, ref_weights))
        for n, p in model.named_parameters()
    ]
    kept = sum(int(full(m).sum()) for m in masks.values())
    return untouched, same_scores, same_masks, all(same_weights), kept, placements


def _effective(ref, name, ref_weights):
    if name in ref_weights:
        return ref_weights[name].detach()
    module_name, attr = name.rsplit(".", 1)
    return getattr(ref.get_submodule(module_name), attr).detach()


def replicated_masks(rank, world, method):
    """A layer whose parameters are ``Replicate`` DTensors beside ``Shard(0)`` layers
    (no forward: magnitude and random only read the weights)."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    ref = bn_model()
    model = copy.deepcopy(ref)
    mesh = init_device_mesh("cpu", (world,))
    for i, layer in enumerate(model):
        if i == 3:
            for attr in ("weight", "bias"):
                t = getattr(layer, attr).detach()
                setattr(layer, attr, nn.Parameter(distribute_tensor(t, mesh, [Replicate()])))
        elif any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    masks = gradsift.prune_at_init(model, method, SPARSITY)
    expected = gradsift.prune_at_init(ref, method, SPARSITY)
    same = [torch.equal(full(masks[n]), expected[n].float()) for n in expected]
    return same, str(masks["3.weight"].placements)


def refusals(rank, world):
    """Methods and options without a sharded form raise before any work."""
    model = shard(bn_model(), world)
    before = state(model)
    data = [batch(0, 0)]
    out = []
    for method, kw in (("grasp", {}), ("magnitude", {"allocation": "uniform"})):
        try:
            gradsift.prune_at_init(model, method, SPARSITY, data, **kw)
            out.append("no error")
        except ValueError as e:
            out.append(str(e))
    try:  # a sharded model's scores: the sharded selection, named
        gradsift.masks_from_scores(gradsift.score(model, "magnitude"), SPARSITY)
        out.append("no error")
    except TypeError as e:
        out.append(str(e))
    return out, same_state(before, state(model))


def train_keeps_masks(rank, world, hold, closure=None):
    """Prune an FSDP2 model, train 4 TopK steps: with ``hold_masks`` the pruned
    weights stay zero and TopK's residual holds nothing on them; the kept weights
    move. ``closure``: the gradients are made inside ``opt.step`` by a closure passed
    by position (``"position"``) or by keyword (``"keyword"``)."""
    model = shard(bn_model(), world)
    masks = gradsift.prune_at_init(model, "magnitude", 0.5)
    opt = gradsift.TopK(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), density=0.1)
    if hold:
        gradsift.pruning.hold_masks(opt, model, masks)
    start = {n: full(p.detach()).clone() for n, p in model.named_parameters()}
    for step in range(4):
        x, y = batch(rank, step)

        def loss(x=x, y=y):
            out = F.cross_entropy(model(x), y)
            out.backward()
            return out

        if closure == "position":
            opt.step(loss)
        elif closure == "keyword":
            opt.step(closure=loss)
        else:
            loss()
            opt.step()
        opt.zero_grad()
    params = dict(model.named_parameters())
    revived = sum(
        int(torch.count_nonzero(full(params[n].detach())[full(m) == 0])) for n, m in masks.items()
    )
    residual = sum(
        int(torch.count_nonzero(full(opt.state[params[n]]["residual"])[full(m) == 0]))
        for n, m in masks.items()
    )
    moved = sum(int(torch.count_nonzero(full(params[n].detach()) != start[n])) for n in masks)
    return revived, residual, moved


def nan_score_on_one_rank(rank, world):
    """A NaN weight in the last rank's rows of a layer: magnitude pruning raises the
    same ``ValueError`` on every rank (the others once waited in a collective)."""
    model = bn_model()
    with torch.no_grad():
        model[3].weight[-1, 0] = float("nan")
    model = shard(model, world)
    try:
        gradsift.prune_at_init(model, "magnitude", SPARSITY)
        return "no error"
    except ValueError as e:
        return str(e)


class _WithUnused(nn.Module):
    """A Linear that ``forward`` never uses."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.unused, self.b = nn.Linear(20, 8), nn.Linear(8, 8), nn.Linear(8, 5)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def unreached_weights(rank, world):
    """SNIP scores a weight the loss does not reach 0, as single-process; SynFlow
    says it cannot score it, as single-process (both once crashed on its None grad)."""
    ref = _WithUnused().double()
    model = copy.deepcopy(ref)
    mesh = init_device_mesh("cpu", (world,))
    for m in (model.a, model.unused, model.b, model):
        fully_shard(m, mesh=mesh)
    x, y = batch(0, 0)
    data = [(x.double(), y)]
    snip = gradsift.score(model, "snip", data)
    want = gradsift.score(ref, "snip", data)
    same = [torch.equal(full(snip[n]), want[n]) for n in want]
    try:
        gradsift.score(model, "synflow", input_shape=(20,))
        message = "no error"
    except ValueError as e:
        message = str(e)
    return same, bool(want["unused.weight"].eq(0).all()), message


def synflow_overflow(rank, world):
    """float32 SynFlow whose activations overflow to inf: the masks equal
    single-process SynFlow with ``dtype=torch.float32`` (the other ranks' zero share
    once multiplied inf activations into NaN)."""
    def make():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
        with torch.no_grad():
            m[0].weight.fill_(1e20)
            m[1].weight.fill_(1e20)
        return m

    want = gradsift.prune_at_init(make(), "synflow", 0.5, input_shape=(4,), dtype=torch.float32)
    model = make()
    mesh = init_device_mesh("cpu", (world,))
    for m in (*model, model):
        fully_shard(m, mesh=mesh)
    got = gradsift.prune_at_init(model, "synflow", 0.5, input_shape=(4,))
    return [torch.equal(full(got[n]).bool(), want[n]) for n in want]


def after_a_forward(rank, world):
    """``fully_shard`` on the root only and a forward without backward, which leaves
    its parameters unsharded (full tensors, not DTensors), then magnitude pruning:
    whether the masks equal the unsharded model's, their types, and whether the model
    then trains a step (torch.nn.utils.prune had been installed on FSDP's temporary
    full tensors: reading the parameters after the reshard crashed the process)."""
    model = bn_model()
    ref = copy.deepcopy(model)
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))
    x, y = batch(0, 0)
    with torch.no_grad():
        model(x)
    masks = gradsift.prune_at_init(model, "magnitude", SPARSITY)
    expected = gradsift.prune_at_init(ref, "magnitude", SPARSITY)
    same = [torch.equal(full(masks[n]).bool(), expected[n]) for n in expected]
    F.cross_entropy(model(x), y).backward()
    return same, sorted({type(m).__name__ for m in masks.values()})

"""Workers for tests/optim/test_sharded_adversarial.py (spawned ranks: importable).

References are independent of gradsift's selection: the error-feedback step is redone
on the full tensors in one process (same dtype arithmetic), the top-k chosen by a
stable float64 sort of ``-|a|`` (lowest global index wins ties), the update by
``torch.optim`` on plain tensors. Every worker returns plain Python values."""

import copy
import traceback

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import gradsift
from fsdp_workers import train_steps


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def resolve(n, k=None, density=None):
    if k is not None:
        return min(k, n)
    return min(n, max(1, round(density * n)))


def ref_topk_mask(a_list, k):
    """Masks (per tensor) of the global top-k of |a| over the concatenation, ranked in
    float64 (exact for every float dtype), ties to the lowest global index."""
    flat = torch.cat([a.reshape(-1).to(torch.float64) for a in a_list])
    order = torch.sort(-flat.abs(), stable=True).indices[:k]
    m = torch.zeros(flat.numel(), dtype=torch.bool)
    m[order] = True
    out, at = [], 0
    for a in a_list:
        out.append(m[at : at + a.numel()].view(a.shape))
        at += a.numel()
    return out


class RefEF:
    """Single-process error feedback (+ DGC momentum correction) on full tensors."""

    def __init__(self, fulls, *, k=None, density=None, ef=True, scope="global", momentum=None):
        self.k, self.density, self.ef, self.scope, self.m = k, density, ef, scope, momentum
        self.r = [torch.zeros_like(f) for f in fulls] if ef else None
        self.u = [torch.zeros_like(f) for f in fulls] if momentum is not None else None

    def step(self, grads):
        """``grads``: full gradient per parameter or None (absent). Returns the sent
        gradients (None where absent) and the accumulated ``a`` per parameter."""
        idx = [i for i, g in enumerate(grads) if g is not None]
        acc = {}
        for i in idx:
            g = grads[i]
            added = g if self.u is None else self.u[i].mul_(self.m).add_(g)
            acc[i] = added.clone() if self.r is None else self.r[i] + added
        groups = [idx] if self.scope == "global" else [[i] for i in idx]
        sent = [None] * len(grads)
        for grp in groups:
            if not grp:
                continue
            k = resolve(sum(acc[i].numel() for i in grp), self.k, self.density)
            masks = ref_topk_mask([acc[i] for i in grp], k)
            for i, m in zip(grp, masks):
                a = acc[i]
                sent[i] = torch.where(m, a, torch.zeros_like(a))
                if self.r is not None:
                    self.r[i] = torch.where(m, torch.zeros_like(a), a)
                if self.u is not None:
                    self.u[i] = torch.where(m, torch.zeros_like(a), self.u[i])
        return sent, acc


def _catch(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - reported to the test
        return f"error: {type(e).__name__}: {e}\n{traceback.format_exc()}"


# ---------------------------------------------------------------------------------
# TopK on hand-made DTensor parameters (uneven Shard(0), Replicate, mixed dtypes)


def _dtensor_params(mesh, fulls, placements):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    out = []
    for f, pl in zip(fulls, placements):
        place = [Shard(0)] if pl == "shard" else [Replicate()]
        out.append(nn.Parameter(distribute_tensor(f.clone(), mesh, place)))
    return out


def _grad_like(p, g):
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(g.clone(), p.device_mesh, p.placements)


def _mesh(world, timeout_s=None):
    """A 1-D CPU mesh; with ``timeout_s`` over a group with that timeout (a hang then
    shows as an error within seconds, not the default group's 30 s)."""
    if timeout_s is None:
        return init_device_mesh("cpu", (world,))
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return DeviceMesh.from_group(group, "cpu")


def manual_case(rank, world, cfg):
    """One configuration: ``cfg`` has shapes, dtypes, placements, TopK kwargs, steps,
    ``absent`` {step: [param index]}, ``frozen`` [param index], ``coarse``. Per step:
    (sent equal, residual equal, params equal, mass conserved, kept count)."""
    mesh = _mesh(world, cfg.get("timeout_s"))
    gen = torch.Generator().manual_seed(cfg.get("seed", 0))
    shapes, dtypes = cfg["shapes"], cfg["dtypes"]
    placements = cfg.get("placements", ["shard"] * len(shapes))
    fulls = [torch.randn(s, generator=gen).to(d) for s, d in zip(shapes, dtypes)]
    params = _dtensor_params(mesh, fulls, placements)
    frozen = set(cfg.get("frozen", []))
    for i in frozen:
        params[i].requires_grad_(False)
    kw = dict(cfg["kw"])
    lr = 0.1
    opt = gradsift.TopK(torch.optim.SGD(params, lr=lr), **kw)
    ref_p = [f.clone() for f in fulls]
    trainable = [i for i in range(len(shapes)) if i not in frozen]
    ref = RefEF(
        [fulls[i] for i in trainable],
        k=kw.get("k"),
        density=kw.get("density"),
        ef=kw.get("error_feedback", True),
        scope=kw.get("scope", "global"),
        momentum=kw.get("momentum_correction"),
    )
    report = []
    for step in range(cfg.get("steps", 3)):
        absent = set(cfg.get("absent", {}).get(step, []))
        grads = []
        for i, (s, d) in enumerate(zip(shapes, dtypes)):
            g = torch.randn(s, generator=gen)
            if cfg.get("coarse", True):
                g = (g * 2).round() / 2  # many equal magnitudes: ties at the cut
            grads.append(None if (i in absent or i in frozen) else g.to(d))
        for p, g in zip(params, grads):
            p.grad = None if g is None else _grad_like(p, g)
        r_before = {
            i: full(opt.state[params[i]]["residual"]).clone()
            for i in trainable
            if ref.r is not None and "residual" in opt.state[params[i]]
        }
        opt.step()
        sent, acc = ref.step([grads[i] for i in trainable])
        for j, i in enumerate(trainable):
            if sent[j] is not None:
                ref_p[i].add_(sent[j], alpha=-lr)
        same_sent, same_r, mass = True, True, True
        for j, i in enumerate(trainable):
            p = params[i]
            if sent[j] is None:
                same_sent &= p.grad is None
                continue
            got = full(p.grad)
            same_sent &= torch.equal(got, sent[j])
            if ref.r is not None:
                res = full(opt.state[p]["residual"])
                same_r &= torch.equal(res, ref.r[j])
                # exact conservation on the sharded run itself (no DGC velocity):
                # residual_after + sent == residual_before + g
                if ref.u is None and i in r_before:
                    mass &= torch.equal(res + got, r_before[i] + grads[i])
        same_p = all(torch.equal(full(p.detach()), q) for p, q in zip(params, ref_p))
        kept = sum(int(torch.count_nonzero(full(p.grad))) for p in params if p.grad is not None)
        ref_kept = sum(int(torch.count_nonzero(s)) for s in sent if s is not None)
        report.append((bool(same_sent), bool(same_r), bool(same_p), bool(mass), kept, ref_kept))
        opt.zero_grad(set_to_none=True)
    return report


def fsdp_vs_single_cases(rank, world, cfgs):
    return [_catch(fsdp_vs_single, rank, world, cfg) for cfg in cfgs]


def manual_cases(rank, world, cfgs):
    return [_catch(manual_case, rank, world, cfg) for cfg in cfgs]


def plain_step(rank, world):
    """TopK over an FSDP2 model: one step and one zero_grad, exactly as the README
    shows, without any help. The error text, or None."""
    model = _fsdp(_uneven_model(0), world)
    opt = gradsift.TopK(torch.optim.SGD(model.parameters(), lr=0.1), density=0.1)
    x, y = _batch(rank, 0)
    F.cross_entropy(model(x), y).backward()
    out = []
    for call in (opt.step, opt.zero_grad):
        try:
            call()
            out.append(None)
        except Exception as e:  # noqa: BLE001
            out.append(f"{type(e).__name__}: {e}")
    return out


# ---------------------------------------------------------------------------------
# TopK on FSDP2 models with uneven shapes


def _uneven_model(seed, dtype=torch.float32):
    """Rows not divisible by 2 or 3; a layer of 2 rows (an empty shard on rank 2)."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 2), nn.Tanh(), nn.Linear(2, 3)
    ).to(dtype)


def _fsdp(model, world, reshard=True):
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def _batch(rank, step, dtype=torch.float32):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 7, generator=gen).to(dtype), torch.randint(0, 3, (6,), generator=gen)


def _inner(kind, params):
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)
    if kind == "sgdm":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01)
    return torch.optim.SGD(params, lr=0.1)


def fsdp_vs_single(rank, world, cfg):
    """FSDP2 TopK vs single-process TopK fed the same (FSDP-reduced) full gradient,
    with ``micro`` backward passes accumulated per step (zero_grad(set_to_none=False)),
    an LR scheduler, the inner optimizer ``cfg['inner']``. Per step: params equal,
    state equal, sent gradients equal."""
    dtype = cfg.get("dtype", torch.float32)
    ref = _uneven_model(0, dtype)
    model = _fsdp(copy.deepcopy(ref), world, cfg.get("reshard", True))
    kw = cfg["kw"]
    opt = gradsift.TopK(_inner(cfg["inner"], model.parameters()), **kw)
    ref_opt = gradsift.TopK(_inner(cfg["inner"], ref.parameters()), **kw)
    ref_opt.optimizer.register_step_pre_hook(lambda *a: None)  # dense SGD, as sharded
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (opt, ref_opt)]
    report = []
    for step in range(cfg.get("steps", 3)):
        for micro in range(cfg.get("micro", 1)):
            x, y = _batch(rank, 10 * step + micro, dtype)
            F.cross_entropy(model(x), y).backward()
        for q, p in zip(ref.parameters(), model.parameters()):
            q.grad = full(p.grad).clone()
        opt.step()
        ref_opt.step()
        for s in scheds:
            s.step()
        same_p = all(
            torch.equal(full(p.detach()), q.detach())
            for p, q in zip(model.parameters(), ref.parameters())
        )
        same_g = all(
            torch.equal(full(p.grad), q.grad) for p, q in zip(model.parameters(), ref.parameters())
        )
        names = sorted({n for p in model.parameters() for n in opt.state[p]})
        same_s = all(
            torch.equal(full(opt.state[p][n]), ref_opt.state[q][n])
            for p, q in zip(model.parameters(), ref.parameters())
            for n in ("residual", "momentum")
            if n in opt.state[p]
        )
        report.append((same_p, same_g, same_s, names))
        opt.zero_grad(set_to_none=cfg.get("set_to_none", False))
        ref_opt.zero_grad(set_to_none=cfg.get("set_to_none", False))
    return report


# ---------------------------------------------------------------------------------
# Checkpoints: save after 2 steps, load into a fresh world, steps 3-4


def _train(model, opt, rank, steps, start=0):
    train_steps(model, opt, rank, steps, start, batch_of=_batch)


def _snap(model, opt):
    params = [full(p.detach()).tolist() for p in model.parameters()]
    state = [
        [full(v).tolist() for n, v in sorted(opt.state[p].items())] for p in model.parameters()
    ]
    inner = [
        [
            (n, full(v).tolist() if torch.is_tensor(v) else v)
            for n, v in sorted(opt.optimizer.state[p].items())
        ]
        for p in model.parameters()
    ]
    return params, state, inner


def _make_opt(model, cfg):
    return gradsift.TopK(_inner(cfg["inner"], model.parameters()), **cfg["kw"])


# ---------------------------------------------------------------------------------
# The selection's argument agreement (a short-timeout group: a hang shows as an error)


def disagreeing_ranks(rank, world, case):
    """``sharded_topk_mask`` with ranks disagreeing on the key width (float64 on rank 0,
    float32 elsewhere) or on ``k``: the error (type and text) each rank gets."""
    from datetime import timedelta

    import torch.distributed as dist

    from gradsift.select.sharded import sharded_topk_mask

    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=4))
    x = torch.arange(1.0, 11.0) + 10 * (world - 1 - rank)  # the top 3: rank 0's last
    k = 3
    if case == "dtype":
        x = x.to(torch.float64 if rank == 0 else torch.float32)
    else:  # k: 2, 4, 3 on three ranks (rank 2's k is the mean)
        k = [2, 4, 3][rank]
    try:
        mask = sharded_topk_mask(x, k, offset=10 * rank, group=group)
        return f"no error, mask {mask.nonzero().squeeze(1).tolist()}"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e)[:200]}"


def dsd_template_keys(rank, world):
    """``get_optimizer_state_dict`` of a fresh optimizer (the template ``dcp.load``
    fills): the per-parameter state names for a bare AdamW and for TopK(AdamW)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    out = []
    for wrap in (False, True):
        model = _fsdp(_uneven_model(0), world)
        opt = _inner("adamw", model.parameters())
        if wrap:
            opt = gradsift.TopK(opt, density=0.2)
        osd = get_optimizer_state_dict(model, opt)
        out.append({fqn: sorted(st) for fqn, st in osd["state"].items()})
    return out


# ---------------------------------------------------------------------------------
# Pruning an FSDP2 model with uneven shards (a tensor of fewer rows than ranks)


def conv_model(seed=0, dtype=torch.float32, coarse=False):
    """Conv weights of 5 and 2 output channels, a Linear of 3 rows and one of 2: shards
    uneven on 2 and 3 ranks, some empty. ``coarse``: weights on a 1/8 grid, so that
    magnitudes tie across ranks at the cut."""
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(3, 5, 3),
        nn.ReLU(),
        nn.Conv2d(5, 2, 3),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(2 * 4 * 4, 3),
        nn.Tanh(),
        nn.Linear(3, 2),
    ).to(dtype)
    if coarse:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_((p * 8).round() / 8)
    return model


def prune_uneven(rank, world, cases):
    """Per case ``(method, dtype, sparsity, options, coarse)``: the sharded masks equal
    the unsharded ones, the pruned weights too, and the kept count is exact."""
    from gradsift.budget import kept_count

    out = []
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3, 8, 8, generator=gen)
    y = torch.randint(0, 2, (6,), generator=gen)
    for method, dtype, sparsity, options, coarse in cases:
        ref = conv_model(0, dtype, coarse)
        model = _fsdp(copy.deepcopy(ref), world)
        data = [(x.to(dtype), y)]
        ref_options = dict(options)
        if method == "synflow":
            ref_options["dtype"] = dtype
        try:
            masks = gradsift.prune_at_init(model, method, sparsity, data, **options)
        except Exception as e:  # noqa: BLE001
            out.append(f"error: {type(e).__name__}: {e}")
            continue
        expected = gradsift.prune_at_init(ref, method, sparsity, data, **ref_options)
        same = {n: torch.equal(full(masks[n]), expected[n].float()) for n in expected}
        n_total = sum(full(m).numel() for m in masks.values())
        kept = sum(int(full(m).sum()) for m in masks.values())
        ref_w = {n: p.detach() for n, p in ref.named_parameters()}
        weights = []
        for n, p in model.named_parameters():
            w = ref_w.get(n)
            if w is None:  # pruned in ref: weight_orig * weight_mask
                mod, attr = n.rsplit(".", 1)
                w = getattr(ref.get_submodule(mod), attr).detach()
            weights.append(torch.equal(full(p.detach()), w))
        out.append((same, kept, kept_count(n_total, sparsity), all(weights)))
    return out


# ---------------------------------------------------------------------------------
# Resume: save after step 2, load into fresh objects, steps 3-4 vs the uninterrupted run


def _load_into_fresh(rank, world, path, cfg):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    model = _fsdp(_uneven_model(1), world)  # other weights: the load must replace them
    opt = _make_opt(model, cfg)
    if cfg["api"] == "plain":
        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        dcp.load(sd, checkpoint_id=path)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
    else:
        sd = {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}
        dcp.load(sd, checkpoint_id=path)
        model.load_state_dict(sd["model"])
        set_optimizer_state_dict(model, opt, sd["optim"])
    loaded = _snap(model, opt)
    _train(model, opt, rank, 2, start=2)
    return loaded, _snap(model, opt)


def resume_cases(rank, world, root, cfgs):
    """Per cfg (``api``: "plain" opt.state_dict() or "dsd" get/set_optimizer_state_dict;
    ``inner``; ``kw``): (snapshot at the save, at the end of the uninterrupted run,
    after loading, after 2 more steps), or the error."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    out = []
    for i, cfg in enumerate(cfgs):
        path = f"{root}/ckpt{i}"

        def run(cfg=cfg, path=path):
            model = _fsdp(_uneven_model(0), world)
            opt = _make_opt(model, cfg)
            _train(model, opt, rank, 2)
            if cfg["api"] == "plain":
                osd = opt.state_dict()
            else:
                osd = get_optimizer_state_dict(model, opt)
            dcp.save({"model": model.state_dict(), "optim": osd}, checkpoint_id=path)
            saved = _snap(model, opt)
            _train(model, opt, rank, 2, start=2)
            end = _snap(model, opt)
            loaded, resumed = _load_into_fresh(rank, world, path, cfg)
            return saved, end, loaded, resumed

        out.append(_catch(run))
    return out


def closure_step(rank, world):
    """``opt.step(closure)`` on an FSDP2 model vs the same step without a closure
    (SGD: the closure is evaluated once): parameters equal, or the error."""

    out = []
    for use_closure in (False, True):
        model = _fsdp(_uneven_model(0), world)
        opt = gradsift.TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=4)
        x, y = _batch(rank, 0)

        def closure(model=model, opt=opt, x=x, y=y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss

        try:
            if use_closure:
                opt.step(closure)
            else:
                closure()
                opt.step()
            out.append([full(p.detach()).tolist() for p in model.parameters()])
        except Exception as e:  # noqa: BLE001
            out.append(f"{type(e).__name__}: {e}")
    return out

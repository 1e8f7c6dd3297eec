"""Workers for tests/distributed/test_hook_adversarial.py (spawned: must be importable).

Each worker runs DDP with ``topk_hook`` wrapped by a recording hook that captures the
local (pre-hook) bucket contents and the initial bucket layout, and checks, on every
rank, the averaged gradients and the residual against an independent reference that
sees every rank's local gradient (all-gathered between steps).
"""

import io
import math
import pickle

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

from gradsift.budget import Budget
from gradsift.distributed import TopKHookState, topk_hook


class Rec:
    """The hook state passed to ``recording_hook``: the real state and what was seen."""

    def __init__(self, state, inject=None):
        self.state = state
        self.keys = {}  # id(param) -> (bucket index, position) of the first layout
        self.local = {}  # id(param) -> this rank's pre-hook gradient
        self.inject = inject  # callable(bucket) run before the real hook, or None
        self.scale = None
        self.buckets = set()


def recording_hook(rec, bucket):
    for pos, p in enumerate(bucket.parameters()):
        rec.keys.setdefault(id(p), (bucket.index(), pos))
    rec.buckets.add(bucket.index())
    if rec.inject is not None:
        rec.inject(bucket)
    buf, off = bucket.buffer(), 0
    for p in bucket.parameters():
        rec.local[id(p)] = buf[off : off + p.numel()].clone()
        off += p.numel()
    if rec.state.grad_scaler is not None:
        rec.scale = float(rec.state.grad_scaler.get_scale())
    return topk_hook(rec.state, bucket)


class Wide(nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(20, 256), nn.Tanh(), nn.Linear(256, 300))
        self.extra = nn.Linear(3, 3) if extra else None

    def forward(self, x, use_extra=False):
        out = self.body(x)
        if use_extra:
            out = out + self.extra(x[:, :3]).sum()
        return out


def wide_model(seed=0, extra=False):
    """82,476 parameters: more than one 65,536-coordinate chunk of ``local16``;
    ``extra``: a layer used only when the forward asks (find_unused_parameters)."""
    torch.manual_seed(seed)
    return Wide(extra)


def data(rank, step, ties=False):
    gen = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(8, 20, generator=gen)
    if ties:
        x = torch.randint(-2, 3, (8, 20), generator=gen).float()
    return x


def loss_of(model, x, ties=False, use_extra=False):
    out = model(x, use_extra)
    return out.sum() if ties else (out**2).mean()


def ordered(rec, params, values):
    """``values`` (by id(param)) concatenated in the order of the first layout's keys."""
    ps = sorted(params, key=lambda p: rec.keys[id(p)])
    return torch.cat([values[id(p)].reshape(-1) for p in ps])


def _pad8(b):
    return -(-b // 8) * 8


def ref_message_bytes(encoding, n, k, vbytes):
    index = {
        "int64": 8 * k,
        "int32": 4 * k,
        "local16": 2 * k + 4 * math.ceil(n / 65536),
        "bitmap": math.ceil(n / 8),
    }
    if encoding == "auto":
        encoding = min(("local16", "bitmap", "int32"), key=lambda e: _pad8(index[e]))
    return _pad8(index[encoding]) + k * vbytes


def ref_k(cfg, iteration, n):
    density, end = cfg.get("density"), 0
    for its, d in cfg.get("warmup", []):
        end += its
        if iteration < end:
            density = d
            break
    return min(n, max(1, round(density * n)))


def ref_topk(a, k):
    """Indices of the k largest |a|, ties to the lowest index, ascending."""
    order = torch.sort(-a.abs(), stable=True).indices[:k]
    return torch.sort(order).values


class Reference:
    """Every rank's error-feedback memory, kept independently of the library."""

    def __init__(self, cfg, n, world):
        self.cfg, self.n, self.world = cfg, n, world
        self.res = [torch.zeros(n) for _ in range(world)] if cfg.get("ef", True) else None
        m = cfg.get("momentum")
        self.vel = [torch.zeros(n) for _ in range(world)] if m is not None else None
        self.scale = None
        self.modes = []

    def step(self, iteration, gs, scale=None):
        cfg, n, world = self.cfg, self.n, self.world
        if iteration < cfg.get("start_iter", 2):
            self.modes.append("start")
            return sum(g / world for g in gs)
        if not all(bool(torch.isfinite(g).all()) for g in gs):
            self.modes.append("nonfinite")
            return sum(g / world for g in gs)
        if scale is not None:
            if self.scale is not None and scale != self.scale:
                for t in (self.res or []) + (self.vel or []):
                    t.mul_(scale / self.scale)
            self.scale = scale
        if cfg.get("clip") is not None:
            # DGC Sec. 3.3 with clip_grad_norm_'s 1e-6, in float32 tensor arithmetic
            c = cfg["clip"] / math.sqrt(world)
            gs = [g * (c / (torch.linalg.vector_norm(g) + 1e-6)).clamp(max=1.0) for g in gs]
        a = []
        for r, g in enumerate(gs):
            u = g
            if self.vel is not None:
                u = self.vel[r].mul_(cfg["momentum"]).add_(g)
            a.append(self.res[r].add_(u) if self.res is not None else g.clone())
        k = ref_k(cfg, iteration, n)
        vd = cfg.get("value_dtype")
        size = ref_message_bytes(cfg.get("encoding", "auto"), n, k, 2 if vd else 4)
        if cfg.get("dense_if_larger", True) and not size * world < 2 * n * 4:
            self.modes.append("dense")
            out = sum(x / world for x in a)  # before a (the residuals) is cleared
            for t in (self.res or []) + (self.vel or []):
                t.zero_()
            return out
        self.modes.append(f"sparse{k}")
        total = torch.zeros(n)
        for r, x in enumerate(a):
            idx = ref_topk(x, k)
            vals = x[idx]
            q = vals.to(vd).float() if vd is not None else vals
            s = torch.zeros(n)
            s[idx] = q
            total = total + s
            if self.res is not None:
                self.res[r][idx] = vals - q
            if self.vel is not None:
                self.vel[r][idx] = 0
        return total / world


def make_state(cfg, scaler=None):
    return TopKHookState(
        density=cfg["density"],
        error_feedback=cfg.get("ef", True),
        start_iter=cfg.get("start_iter", 2),
        dense_if_larger=cfg.get("dense_if_larger", True),
        encoding=cfg.get("encoding", "auto"),
        value_dtype=cfg.get("value_dtype"),
        momentum_correction=cfg.get("momentum"),
        warmup=cfg.get("warmup"),
        clip_norm=cfg.get("clip"),
        grad_scaler=scaler,
        find_unused_parameters=cfg.get("hold", False),
    )


def _gather(t):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return out


def check_configs(rank, world, configs):
    """For each config: problems found (strings) and the modes the reference took."""
    out = []
    for cfg in configs:
        out.append(_check_one(rank, world, cfg))
    return out


def _check_one(rank, world, cfg):
    ties = cfg.get("ties", False)
    model = wide_model(extra=cfg.get("unused", False))
    scaler = None
    if cfg.get("scaler"):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=1)
    state = make_state(cfg, scaler)
    inject = None
    nan_at = cfg.get("nan_at")
    step_box = [0]
    if nan_at is not None:

        def inject(bucket):
            if rank == 1 and step_box[0] == nan_at and bucket.index() == 0:
                bucket.buffer()[3] = float("nan") if not scaler else float("inf")

    rec = Rec(state, inject)
    ddp = DDP(
        model,
        bucket_cap_mb=cfg.get("cap_mb", 25),
        find_unused_parameters=cfg.get("unused", False),
    )
    ddp.register_comm_hook(rec, recording_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    ref = Reference(cfg, n, world)
    problems = []
    for step in range(cfg.get("steps", 4)):
        step_box[0] = step
        opt.zero_grad(set_to_none=False)
        use_extra = cfg.get("unused", False) and rank == 0
        loss = loss_of(ddp, data(rank, step, ties), ties, use_extra)
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        local = ordered(rec, params, rec.local)
        got = ordered(rec, params, {id(p): p.grad for p in params})
        want = ref.step(state.iter - 1, _gather(local), rec.scale)
        if not torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)):
            d = (got - want).abs().nan_to_num(0).max()
            problems.append(f"step {step} ({ref.modes[-1]}): averaged grad differs, max {d}")
        has_res = state.residual is not None and ref.res is not None
        if has_res and not torch.equal(state.residual, ref.res[rank]):
            d = (state.residual - ref.res[rank]).abs().max()
            problems.append(f"step {step}: residual differs, max {d}")
        if state.velocity is not None and not torch.equal(state.velocity, ref.vel[rank]):
            problems.append(f"step {step}: velocity differs")
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    if len(rec.buckets) < cfg.get("min_buckets", 1):
        problems.append(f"only {len(rec.buckets)} buckets")
    return problems, ref.modes


def _train(ddp, opt, model, rank, steps, scaler=None):
    for step in steps:
        opt.zero_grad()
        loss = loss_of(ddp, data(rank, step))
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def resume(rank, world, how, cap_mb):
    """Train 6 steps straight vs 3 + save (state_dict via torch.save, or pickle) + 3."""
    cfg = dict(
        density=0.01,
        start_iter=1,
        value_dtype=torch.bfloat16,
        momentum=0.9,
        warmup=[(3, 0.2)],
        encoding="local16",
    )

    def fresh(model_state=None):
        model = wide_model()
        if model_state is not None:
            model.load_state_dict(model_state)
        ddp = DDP(model, bucket_cap_mb=cap_mb)
        state = make_state(cfg)
        ddp.register_comm_hook(state, topk_hook)
        return model, ddp, state, torch.optim.SGD(ddp.parameters(), lr=1e-2)

    model, ddp, state, opt = fresh()
    straight = _train(ddp, opt, model, rank, range(6))
    model, ddp, state, opt = fresh()
    _train(ddp, opt, model, rank, range(3))
    if how == "state_dict":
        buf = io.BytesIO()
        torch.save({"hook": state.state_dict(), "model": model.state_dict()}, buf)
        buf.seek(0)
        ck = torch.load(buf, weights_only=False)
        model2, ddp2, state2, opt2 = fresh(ck["model"])
        state2.load_state_dict(ck["hook"])
        # the fresh state's own hyper-parameters, the saved memory and counters
    else:
        blob = pickle.dumps((state, model.state_dict()))
        loaded, model_sd = pickle.loads(blob)
        model2 = wide_model()
        model2.load_state_dict(model_sd)
        ddp2 = DDP(model2, bucket_cap_mb=cap_mb)
        ddp2.register_comm_hook(loaded, topk_hook)
        opt2 = torch.optim.SGD(ddp2.parameters(), lr=1e-2)
        state2 = loaded
    nres = float(state2.residual.abs().sum())
    resumed = _train(ddp2, opt2, model2, rank, range(3, 6))
    return torch.equal(straight, resumed), nres, state2.iter


class _Mixed(nn.Module):
    """One float16 and one float32 coordinate, their gradients given by the input."""

    def __init__(self):
        super().__init__()
        self.h = nn.Parameter(torch.zeros(1, dtype=torch.float16))
        self.f = nn.Parameter(torch.zeros(1))

    def forward(self, gh, gf):
        return (self.h.double() * gh).sum() + (self.f.double() * gf).sum()


def mixed_dtypes_past_float16(rank, world):
    """A float16 and a float32 coordinate in one float32 vector, the float16 one's
    residual past 65504 by the second step: sparse (k = 1) and dense (k = n from the
    second step on), per value dtype. Returns per case the gradients handed back
    (float16, float32) by step, the residual at the end, bytes_dense per step and
    bytes_sent."""
    out = {}
    for vd in (None, torch.bfloat16):
        for dense in (False, True):
            model = _Mixed()
            state = TopKHookState(k=1, start_iter=0, value_dtype=vd, dense_if_larger=False)
            ddp = DDP(model)
            ddp.register_comm_hook(state, topk_hook)
            sent = []
            for step, (gh, gf) in enumerate([(4e4, 5e4), (4e4, 0.0), (4e4, 0.0)]):
                if dense and step == 1:  # k = n: the dense path, on the residual of step 0
                    state.budget, state.dense_if_larger = Budget(k=2), True
                model.zero_grad(set_to_none=True)
                ddp(torch.tensor([gh], dtype=torch.float64), torch.tensor([gf])).backward()
                sent.append((float(model.h.grad), float(model.f.grad)))
            out[(str(vd), dense)] = (
                sent, state.residual.tolist(), state.bytes_dense / 3, state.bytes_sent
            )
    return out

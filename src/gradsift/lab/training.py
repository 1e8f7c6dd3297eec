"""The one training loop (``fit``) and what it needs: the optimizer, the schedule,
evaluation. Single-process training, data-parallel training and the DDP benchmark
all run through ``fit``; ``train_run`` adds evaluation and checkpoint/resume."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn

from gradsift import NonFiniteGradError, TopK
from gradsift.lab import checkpoint as ckpt
from gradsift.lab.data import loader

__all__ = ["TrainConfig", "Setup", "fit", "train_run", "evaluate", "make_optimizer"]

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """What a training run does. ``density``/``k`` None means dense updates."""

    epochs: int = 10
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    density: float | None = None
    k: int | None = None
    error_feedback: bool = True
    schedule: str = "cosine"  # or "none"
    seed: int = 0
    device: str = "cpu"
    comm: str | None = None  # data-parallel: gradsift.lab.comm.COMMS (None: by density)
    fsdp: bool = False  # several ranks: shard the model with FSDP2 instead of DDP

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def sparse(self) -> bool:
        return self.density is not None or self.k is not None


def make_optimizer(model: nn.Module, cfg: TrainConfig, *, topk: bool = True):
    """SGD with momentum, wrapped in ``TopK`` when ``cfg`` is sparse and ``topk``
    (data-parallel runs sparsify in the communication hook instead)."""
    params = [p for p in model.parameters() if p.requires_grad]
    sgd = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if not (topk and cfg.sparse):
        return sgd
    return TopK(sgd, density=cfg.density, k=cfg.k, error_feedback=cfg.error_feedback)


def make_scheduler(opt, cfg: TrainConfig):
    """Cosine annealing over the epochs (stepped once per epoch), or None."""
    if cfg.schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, cfg.epochs))
    if cfg.schedule != "none":
        raise ValueError(f"schedule must be 'cosine' or 'none', got {cfg.schedule!r}")
    return None


@torch.no_grad()
def evaluate(model: nn.Module, dataset, *, device="cpu", batch_size: int = 512) -> dict:
    """Accuracy and mean cross-entropy of ``model`` on ``dataset`` (eval mode)."""
    was_training = model.training
    model.eval()
    correct, total, loss = 0, 0, 0.0  # summed on the device (float64), read once
    for x, y in loader(dataset, batch_size=batch_size, shuffle=False):
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss = loss + F.cross_entropy(out, y, reduction="sum").double()
        correct = correct + (out.argmax(1) == y).sum()
        total += y.numel()
    model.train(was_training)
    return {"accuracy": int(correct) / total, "loss": float(loss) / total}


def _progress(iterable, enabled: bool, desc: str):
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is an optional extra
        return iterable
    return tqdm(iterable, desc=desc, leave=False, disable=None)  # None: off when not a tty


def fit(
    forward: nn.Module,
    optimizer,
    data,
    *,
    epochs: int,
    start_epoch: int = 0,
    device="cpu",
    scheduler=None,
    loss_fn=F.cross_entropy,
    on_epoch=None,
    on_step=None,
    progress: bool = False,
) -> None:
    """Epochs ``start_epoch .. epochs-1`` of zero_grad / forward / backward / step.

    ``data``: a DataLoader (a ``DistributedSampler`` gets ``set_epoch``). The
    scheduler steps once per epoch; ``on_step()`` runs after every step and
    ``on_epoch(epoch, mean_train_loss)`` after every epoch, the mean over every rank's
    samples where a process group runs (one all-reduce an epoch).

    A step that ``TopK`` skips on a non-finite gradient (dense SGD would write NaN
    weights and go on) makes the epoch's training loss NaN: the run diverged there,
    and every rank goes on taking the same steps.
    """
    for epoch in _progress(range(start_epoch, epochs), progress, "epochs"):
        if hasattr(data.sampler, "set_epoch"):
            data.sampler.set_epoch(epoch)
        # summed in float64 on the loss's device (the sums a Python float made, bit for
        # bit): one host sync an epoch, not one a step
        total, count = torch.zeros((), dtype=torch.float64, device=device), 0
        for x, y in data:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = loss_fn(forward(x), y)
            loss.backward()
            skipped = _step(optimizer)
            total = total + loss.detach().double() * y.numel()
            if skipped is not False:  # no host sync: a device bool from the fused step
                total = total.masked_fill(torch.as_tensor(skipped, device=device), math.nan)
            count += y.numel()
            if on_step is not None:
                on_step()
        if scheduler is not None:
            scheduler.step()
        if on_epoch is not None:
            on_epoch(epoch, _mean_over_ranks(total, count))


def _step(optimizer):
    """``optimizer.step()``; whether ``TopK`` skipped it on a non-finite gradient: True
    where it raised ``NonFiniteGradError`` (modifying nothing), the fused GPU step's
    ``found_nonfinite`` device bool, or False."""
    try:
        optimizer.step()
    except NonFiniteGradError:
        return True
    found = getattr(optimizer, "found_nonfinite", None)
    return False if found is None else found


def _mean_over_ranks(total: torch.Tensor, count: int) -> float:
    """``total / count`` summed over the ranks of the process group (this rank's alone
    without one): each rank's own mean would be one shard's loss."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        n = torch.tensor(float(count), dtype=total.dtype, device=total.device)
        both = torch.stack([total, n])
        dist.all_reduce(both)
        total, count = both[0], int(both[1].item())
    return total.item() / count if count else 0.0


@dataclass
class Setup:
    """One process's part of a run: what ``train_run`` drives and checkpoints.

    ``model`` is evaluated and saved; ``forward`` is what trains (the model itself, or
    its ``DistributedDataParallel`` wrapper); ``hook_state`` is the DDP hook's state;
    ``eval_all_ranks``: evaluation is a collective (FSDP2), not rank 0's alone.
    """

    model: nn.Module
    forward: nn.Module
    optimizer: object
    scheduler: object
    data: object
    device: str = "cpu"
    rank: int = 0
    world: int = 1
    hook_state: object = None
    eval_all_ranks: bool = False  # a sharded model: every rank takes part in evaluation
    run: str | None = None  # the run's key (RunSpec.key): a checkpoint of another is refused


def _warn_if_diverged(history: list) -> None:
    """Warn once, at the first epoch whose training loss is not finite: the run goes
    on (every rank must take the same steps), but nothing it reports from there is
    the accuracy of a trained network."""
    losses = [h["train_loss"] for h in history]
    if not math.isfinite(losses[-1]) and all(math.isfinite(x) for x in losses[:-1]):
        log.warning(
            "training diverged at epoch %d (train loss %s): a loss or gradient is no "
            "longer finite; lower the learning rate",
            len(losses),
            losses[-1],
        )


def train_run(
    setup: Setup, cfg: TrainConfig, test_set, *, checkpoint_dir=None, progress=False
) -> dict:
    """``fit`` for ``cfg.epochs`` with rank 0 evaluating after every epoch; with
    ``checkpoint_dir``, resume from its checkpoint and write one after every epoch.

    Returns ``{"test_accuracy", "test_loss", "history", "seconds"}`` (rank 0's
    metrics; other ranks get None for them).
    """
    state = ckpt.restore(checkpoint_dir, setup) if checkpoint_dir else None
    history = state["history"] if state else []
    previous = state["seconds"] if state else 0.0
    start = time.perf_counter()
    # training wall time so far, evaluation and checkpoints excluded (resumes included)
    clock = {"train": history[-1].get("train_seconds", 0.0) if history else 0.0, "mark": start}

    def on_epoch(epoch: int, train_loss: float) -> None:
        clock["train"] += time.perf_counter() - clock["mark"]
        evaluates = setup.rank == 0 or setup.eval_all_ranks
        metrics = evaluate(setup.model, test_set, device=setup.device) if evaluates else {}
        history.append(
            {
                "epoch": epoch + 1,
                "train_loss": train_loss,
                "train_seconds": clock["train"],
                **metrics,
            }
        )
        log.info("epoch %d: train loss %.4f, test %s", epoch + 1, train_loss, metrics)
        _warn_if_diverged(history)
        if checkpoint_dir:
            seconds = previous + time.perf_counter() - start
            ckpt.save(checkpoint_dir, setup, epoch + 1, history, seconds)
        clock["mark"] = time.perf_counter()

    fit(
        setup.forward,
        setup.optimizer,
        setup.data,
        epochs=cfg.epochs,
        start_epoch=len(history),
        device=setup.device,
        scheduler=setup.scheduler,
        on_epoch=on_epoch,
        progress=progress,
    )
    final = history[-1] if history else {}
    if (setup.rank == 0 or setup.eval_all_ranks) and not history:
        final = evaluate(setup.model, test_set, device=setup.device)
    return {
        "test_accuracy": final.get("accuracy"),
        "test_loss": final.get("loss"),
        "history": history,
        "seconds": previous + time.perf_counter() - start,
    }


def single_process_setup(model: nn.Module, train_set, cfg: TrainConfig) -> Setup:
    """Seeded as every single-process run: model on ``cfg.device``, SGD (+ TopK),
    the schedule and a shuffling loader seeded by ``cfg.seed``."""
    torch.manual_seed(cfg.seed)
    model.to(cfg.device).train()
    opt = make_optimizer(model, cfg)
    data = loader(train_set, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    return Setup(model, model, opt, make_scheduler(opt, cfg), data, device=cfg.device)


def train(model: nn.Module, train_set, test_set, cfg: TrainConfig, **kwargs) -> dict:
    """Train ``model`` in this process (see ``train_run`` for the result)."""
    return train_run(single_process_setup(model, train_set, cfg), cfg, test_set, **kwargs)

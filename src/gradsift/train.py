"""One plain train/evaluate loop, shared by the command line and the experiments."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from gradsift.data import loader
from gradsift.optim import TopK

__all__ = ["TrainConfig", "train", "evaluate", "make_optimizer"]

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    """What ``train`` does. ``density``/``k`` None means dense updates."""

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

    def to_dict(self) -> dict:
        return asdict(self)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """SGD with momentum, wrapped in ``TopK`` when a density or k is set."""
    params = [p for p in model.parameters() if p.requires_grad]
    sgd = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.density is None and cfg.k is None:
        return sgd
    return TopK(sgd, density=cfg.density, k=cfg.k, error_feedback=cfg.error_feedback)


@torch.no_grad()
def evaluate(model: nn.Module, dataset, *, device="cpu", batch_size: int = 512) -> dict:
    """Accuracy and mean cross-entropy of ``model`` on ``dataset`` (eval mode)."""
    was_training = model.training
    model.eval()
    correct, total, loss = 0, 0, 0.0
    for x, y in loader(dataset, batch_size=batch_size, shuffle=False):
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss += float(F.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(1) == y).sum())
        total += y.numel()
    model.train(was_training)
    return {"accuracy": correct / total, "loss": loss / total}


def _progress(iterable, enabled: bool, desc: str):
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is an optional extra
        return iterable
    return tqdm(iterable, desc=desc, leave=False, disable=None)  # None: off when not a tty


def train(
    model: nn.Module, train_set, test_set, cfg: TrainConfig, *, progress: bool = False
) -> dict:
    """Train ``model`` with SGD (+ TopK) for ``cfg.epochs``; return the history.

    Returns ``{"test_accuracy", "test_loss", "history": [...], "seconds"}``.
    """
    torch.manual_seed(cfg.seed)
    model.to(cfg.device).train()
    opt = make_optimizer(model, cfg)
    sched = None
    if cfg.schedule == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, cfg.epochs))
    elif cfg.schedule != "none":
        raise ValueError(f"schedule must be 'cosine' or 'none', got {cfg.schedule!r}")
    data = loader(train_set, batch_size=cfg.batch_size, shuffle=True, seed=cfg.seed)
    history, start = [], time.perf_counter()
    for epoch in _progress(range(cfg.epochs), progress, "epochs"):
        total, count = 0.0, 0
        for x, y in data:
            x, y = x.to(cfg.device), y.to(cfg.device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item() * y.numel()
            count += y.numel()
        if sched is not None:
            sched.step()
        metrics = evaluate(model, test_set, device=cfg.device)
        history.append({"epoch": epoch + 1, "train_loss": total / count, **metrics})
        log.info(
            "epoch %d: train loss %.4f, test acc %.4f",
            epoch + 1,
            total / count,
            metrics["accuracy"],
        )
    final = history[-1] if history else evaluate(model, test_set, device=cfg.device)
    return {
        "test_accuracy": final["accuracy"],
        "test_loss": final["loss"],
        "history": history,
        "seconds": time.perf_counter() - start,
    }

"""Lightning: ``TopKHookCallback`` registers the top-k DDP communication hook.

Lightning's own ``DDPStrategy(ddp_comm_hook=...)`` registers a hook only on CUDA, so
on CPU (gloo) ranks the model would train with dense allreduce without a word. This
callback registers it in ``on_fit_start``, after the strategy has wrapped the model
in ``DistributedDataParallel``, on CPU and CUDA alike, and hands the hook the
``GradScaler`` of Lightning's float16 mixed precision (``precision="16-mixed"``), so
that the residual is kept in the loss scale's units and ``clip_norm`` is read in them
(a state given its own ``grad_scaler`` keeps it), and under a strategy with
``find_unused_parameters=True`` sets the state's own, so that a parameter no rank used
in a step keeps its residual. It also checkpoints the hook's
per-rank state inside Lightning's one checkpoint file: ``state_dict`` gathers every
rank's state (Lightning calls it on every rank), ``load_state_dict`` takes this
rank's own.
"""

from __future__ import annotations

import warnings

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from gradsift.distributed import TopKHookState, topk_hook

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    from pytorch_lightning import Callback

__all__ = ["TopKHookCallback"]


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TopKHookCallback(Callback):
    """``Trainer(strategy="ddp", callbacks=[TopKHookCallback(TopKHookState(density=0.01))])``.

    Args:
        state: the hook's state (its ``iter``, ``compression_ratio`` and residuals are
            read from it after ``fit``).
        hook: the communication hook (default ``gradsift.distributed.topk_hook``).
    """

    def __init__(self, state: TopKHookState, hook=topk_hook) -> None:
        if not isinstance(state, TopKHookState):
            raise TypeError(f"state must be a TopKHookState, got {type(state).__name__}")
        self.state, self.hook = state, hook

    def on_fit_start(self, trainer, pl_module) -> None:
        model = trainer.strategy.model
        if self.state.grad_scaler is None:  # "16-mixed" scales the loss: follow its scale
            self.state.grad_scaler = getattr(trainer.precision_plugin, "scaler", None)
        if isinstance(model, DistributedDataParallel):
            # DDP drops the hook's values for a parameter no rank used: hold those out
            self.state.find_unused_parameters |= bool(model.find_unused_parameters)
            model.register_comm_hook(self.state, self.hook)
        else:
            warnings.warn(
                f"TopKHookCallback: the model is not DistributedDataParallel "
                f"({type(model).__name__}; strategy {type(trainer.strategy).__name__}): "
                "no communication hook registered, gradients are not compressed",
                stacklevel=2,
            )

    def state_dict(self) -> dict:
        own = self.state.state_dict()
        own = {k: v.cpu() if hasattr(v, "cpu") else v for k, v in own.items()}
        rank, world = _world()
        ranks = [own]
        if world > 1:
            ranks = [None] * world
            dist.all_gather_object(ranks, own)
        return {"ranks": ranks}

    def load_state_dict(self, state_dict: dict) -> None:
        rank, world = _world()
        ranks = state_dict["ranks"]
        if len(ranks) != world:  # the same on every rank: every rank raises
            raise ValueError(
                f"TopKHookCallback: the checkpoint holds the hook states of {len(ranks)} "
                f"ranks, this run has {world}"
            )
        self.state.load_state_dict(ranks[rank])

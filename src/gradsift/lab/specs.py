"""What defines one run of the lab (``RunSpec``) and the key that finds it again in a
results file."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from gradsift.lab.training import TrainConfig

__all__ = ["RunSpec"]


@dataclass
class RunSpec:
    """Everything that defines one run; ``key()`` identifies it for resuming."""

    model: str = "lenet5"
    dataset: str = "digits"
    method: str | None = None  # None: no pruning
    sparsity: float = 0.0
    iterations: int = 1
    shuffle: bool = False
    seed: int = 0
    train: TrainConfig = field(default_factory=TrainConfig)
    data_root: str | None = None
    allocation: str = "global"  # the layer allocation, gradsift.pruning.ALLOCATIONS
    sanity: str | None = None  # a name of gradsift.pruning.SANITY

    @property
    def variant(self) -> str | None:
        """The sanity variant, ``shuffle=True`` being ``"shuffle-layer"``."""
        if self.shuffle and self.sanity not in (None, "shuffle-layer"):
            raise ValueError(f"shuffle=True is sanity='shuffle-layer', not {self.sanity!r}")
        return "shuffle-layer" if self.shuffle else self.sanity

    def key(self) -> str:
        """Layer-wise shuffling keeps its old slot, and an allocation or another variant
        appears only when set, so the keys of older results still match."""
        t = self.train
        variant = self.variant
        # spelled "budget=", the allocation's name when these keys were first written:
        # results files hold these keys, and a sweep skips the runs whose keys it finds
        extra = (f"|budget={self.allocation}" if self.allocation != "global" else "") + (
            f"|sanity={variant}" if variant not in (None, "shuffle-layer") else ""
        )
        # the optimizer's other settings and the device, where not the defaults (runs
        # that set them once shared a key with the default run's, whose result a sweep
        # then reused)
        default = TrainConfig()
        for name in ("momentum", "weight_decay", "schedule", "device"):
            value = getattr(t, name)
            if value != getattr(default, name):
                extra += f"|{name}={_exact(value) if isinstance(value, float) else value}"
        if self.data_root is not None:  # another folder is other data (CIFAR's)
            extra += f"|data_root={os.path.abspath(self.data_root)}"
        return (
            f"{self.model}|{self.dataset}|{self.method}|{_exact(self.sparsity)}|{self.iterations}|"
            f"{int(variant == 'shuffle-layer')}|{self.seed}|{t.epochs}|{t.density}|{t.k}|"
            f"{int(t.error_feedback)}|{_exact(t.lr)}|{t.batch_size}"
            + (f"|{t.comm}" if t.comm else "")
            + ("|fsdp" if t.fsdp else "")
            + extra
        )


def _exact(x: float) -> str:
    """``x`` as the keys always wrote it (``:g``) where that is exact, else in full
    (``repr``): 0.999999 and 0.99999944 are different runs."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))

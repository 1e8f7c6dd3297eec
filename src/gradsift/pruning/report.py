"""Per-layer density of a pruned model, and the layer-collapse check.

A layer whose weights are all pruned disconnects the network: nothing flows past
it, whatever the other layers keep (Tanaka et al. 2020, arXiv:2006.05467, Sec. 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from gradsift.pruning.install import held_mask
from gradsift.pruning.params import Selector, original, owners, prunable

__all__ = ["sparsity_report", "SparsityReport", "LayerDensity"]


@dataclass(frozen=True)
class LayerDensity:
    name: str
    total: int
    kept: int

    @property
    def density(self) -> float:
        return self.kept / self.total if self.total else 0.0


@dataclass(frozen=True)
class SparsityReport:
    layers: list[LayerDensity] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(layer.total for layer in self.layers)

    @property
    def kept(self) -> int:
        return sum(layer.kept for layer in self.layers)

    @property
    def density(self) -> float:
        return self.kept / self.total if self.total else 0.0

    @property
    def collapsed(self) -> list[str]:
        """Layers with every weight pruned."""
        return [layer.name for layer in self.layers if layer.kept == 0]

    def to_dict(self) -> dict:
        return {
            "total": self.total,
            "kept": self.kept,
            "density": self.density,
            "collapsed": self.collapsed,
            "layers": [
                {"name": x.name, "total": x.total, "kept": x.kept, "density": x.density}
                for x in self.layers
            ],
        }

    def __str__(self) -> str:
        width = max([len(x.name) for x in self.layers] + [5])
        lines = [f"{'layer':<{width}}  {'kept':>10}  {'total':>10}  density"]
        for x in self.layers:
            flag = "  COLLAPSED" if x.kept == 0 else ""
            lines.append(f"{x.name:<{width}}  {x.kept:>10}  {x.total:>10}  {x.density:.4f}{flag}")
        lines.append(f"{'all':<{width}}  {self.kept:>10}  {self.total:>10}  {self.density:.4f}")
        return "\n".join(lines)


def sparsity_report(model: nn.Module, *, params: Selector = None) -> SparsityReport:
    """Kept/total weights per prunable layer (default: Linear and Conv weights).

    A masked weight counts its mask, a tied one what any of its holders prunes (as
    ``prune_at_init`` reads it). A weight without a mask counts its nonzero weights:
    after ``prune.remove`` the zeros are the pruning. A sharded model (FSDP2,
    ``DTensor`` weights: masks multiplied into the shards, ``gradsift.pruning.sharded``)
    counts its nonzero weights too, a collective: call it on every rank."""
    layers, holders = [], owners(model)
    for name, (module, attr) in prunable(model, params, warn=False).items():
        w = original(module, attr)
        mask = held_mask(holders[id(w)])
        total = w.numel()
        if hasattr(w, "full_tensor"):  # a DTensor: the global count of nonzeros
            kept = int((w.detach() != 0).sum().full_tensor())
        else:
            kept = int(torch.count_nonzero(w if mask is None else mask))
        layers.append(LayerDensity(name, total, kept))
    return SparsityReport(layers)

"""Pruning at initialization: criteria (a registry, one file each), layer
allocation, masks, installation through ``torch.nn.utils.prune``, sanity checks,
reports."""

from gradsift.pruning import methods  # noqa: F401  (registers the built-in criteria)
from gradsift.pruning.allocation import ALLOCATIONS, layer_counts, layer_densities
from gradsift.pruning.at_init import prune_at_init
from gradsift.pruning.install import apply_masks_
from gradsift.pruning.masks import masks_from_scores, shuffle_masks
from gradsift.pruning.registry import (
    get_method,
    list_methods,
    method_options,
    register_method,
    score,
    supported_options,
)
from gradsift.pruning.report import SparsityReport, sparsity_report
from gradsift.pruning.sampling import class_balanced_sample
from gradsift.pruning.sanity import SANITY
from gradsift.pruning.sharded import hold_masks

BUDGETS = ALLOCATIONS  # the older name, kept for one release

__all__ = [
    "ALLOCATIONS",
    "BUDGETS",
    "SANITY",
    "SparsityReport",
    "apply_masks_",
    "class_balanced_sample",
    "get_method",
    "hold_masks",
    "layer_counts",
    "layer_densities",
    "list_methods",
    "masks_from_scores",
    "method_options",
    "prune_at_init",
    "register_method",
    "score",
    "shuffle_masks",
    "sparsity_report",
    "supported_options",
]

"""Pruning at initialization: scores, masks, installation, reports."""

from gradsift.pruning.at_init import prune_at_init
from gradsift.pruning.masks import apply_masks_, masks_from_scores, shuffle_masks
from gradsift.pruning.report import SparsityReport, sparsity_report
from gradsift.pruning.scores import class_balanced_sample, list_methods, score

__all__ = [
    "SparsityReport",
    "apply_masks_",
    "class_balanced_sample",
    "list_methods",
    "masks_from_scores",
    "prune_at_init",
    "score",
    "shuffle_masks",
    "sparsity_report",
]

"""gradsift: gradient-signal sparsity for PyTorch.

Global top-k sparse updates with error feedback, and pruning at initialization
(SNIP, GraSP, SynFlow) installed through ``torch.nn.utils.prune``. This package is
the library; ``gradsift.lab`` is the command line and experiment harness built on it.
"""

from gradsift.optim import NonFiniteGradError, TopK, sparsify_grads_
from gradsift.pruning import (
    apply_masks_,
    list_methods,
    masks_from_scores,
    prune_at_init,
    register_method,
    score,
    shuffle_masks,
    sparsity_report,
)
from gradsift.select import topk_indices

__version__ = "0.1.0"

__all__ = [
    "NonFiniteGradError",
    "TopK",
    "__version__",
    "apply_masks_",
    "list_methods",
    "masks_from_scores",
    "prune_at_init",
    "register_method",
    "score",
    "shuffle_masks",
    "sparsify_grads_",
    "sparsity_report",
    "topk_indices",
]

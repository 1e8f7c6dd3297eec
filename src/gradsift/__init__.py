"""gradsift: gradient-signal sparsity for PyTorch.

Global top-k sparse updates with error feedback, and pruning at initialization
(SNIP, GraSP, SynFlow) installed through ``torch.nn.utils.prune``.
"""

from gradsift.optim import TopK, sparsify_grads_
from gradsift.select import topk_indices

__version__ = "0.1.0"

__all__ = ["TopK", "sparsify_grads_", "topk_indices", "__version__"]

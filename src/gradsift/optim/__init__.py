"""Sparse updates: the ``TopK`` optimizer wrapper and the error-feedback core.

- ``topk``: the ``TopK`` wrapper (``torch.optim`` protocol, state, dispatch to the
  fused GPU step).
- ``error_feedback``: ``sparsify_grads_`` and the functional core on tensors;
  ``workspace``: the buffers its chunked CPU pass reuses.
- ``grads``: the step's gradients as flat buckets; ``flat_buffer``: the buckets.
- ``sparse_sgd``: the sparse SGD update; ``state_dict``: the state merge.
"""

from gradsift.checks import NonFiniteGradError
from gradsift.optim.error_feedback import sparsify_grads_
from gradsift.optim.topk import TopK

__all__ = ["NonFiniteGradError", "TopK", "sparsify_grads_"]

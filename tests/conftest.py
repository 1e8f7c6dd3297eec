"""Set before any test module imports triton (torch.compile's tests import it too):
without a GPU, Triton's kernels run in its CPU interpreter. Triton reads the setting
when a kernel is decorated, so it must be in place before the first import."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

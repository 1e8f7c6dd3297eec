"""Shared set-up for the Triton tests: run the kernels on the GPU when there is one,
else on CPU tensors through Triton's interpreter (``conftest.py`` sets it before
anything imports triton; set here again for scripts that import this directly).

Triton is a test dependency (the ``dev`` extra installs it): a missing triton fails
these tests loudly instead of skipping them, while the library itself never needs it.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402,F401  (fails loudly where the dev extra was not installed)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float16, torch.bfloat16, torch.float32]

"""Which selection backend runs, and whether the optional Triton one can (private).

``backend="torch"`` (the default everywhere) is the plain PyTorch path: the sampled
block kernel on CPU, a ``torch.topk``-based exact selection on CUDA. ``backend="triton"``
runs the GPU kernels of ``gradsift._topk_triton`` and ``gradsift._sparsify_triton``.
They are opt-in because no GPU benchmark has shown them faster yet.

Triton is an optional dependency (``pip install 'gradsift[gpu]'``), imported only when
``backend="triton"`` is asked for. Its kernels need CUDA tensors, or CPU tensors under
Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is imported), which is
how the tests run them on machines without a GPU.
"""

from __future__ import annotations

import importlib
import os

import torch

from gradsift.checks import check_choice

__all__ = [
    "BACKENDS",
    "DTYPES",
    "check_backend",
    "fused_step_",
    "interpreting",
    "require_triton",
    "use_triton",
]

BACKENDS = ("torch", "triton")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the kernels handle
INSTALL_HINT = "pip install 'gradsift[gpu]' (or pip install triton)"


def check_backend(backend, devices=()) -> str:
    """``backend`` validated against ``BACKENDS``; ``"triton"`` also for ``devices``."""
    check_choice("backend", backend, BACKENDS)
    if backend == "triton":
        for device in set(devices):
            require_triton(device)
    return backend


def fused_step_(opt) -> bool:
    """``TopK.step``'s fused GPU kernels (``gradsift._sparsify_triton``, imported on
    first use); False where they do not apply and the torch path must run."""
    from gradsift._sparsify_triton import triton_step_

    return triton_step_(opt)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def require_triton(device: torch.device) -> None:
    """Raise unless Triton is installed and can run on ``device``.

    Raises:
        ImportError: triton is not installed (the message says how to install it).
        ValueError: ``device`` is not CUDA and the interpreter is off.
    """
    try:
        importlib.import_module("triton")
    except ImportError as exc:
        raise ImportError(f"backend='triton' needs triton: {INSTALL_HINT}") from exc
    if torch.device(device).type != "cuda" and not interpreting():
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got device {device}; use backend='torch' "
            "(or set TRITON_INTERPRET=1 before importing triton to run it on CPU, slowly)"
        )


def use_triton(x: torch.Tensor, backend) -> bool:
    """Whether ``backend`` (checked) sends ``x`` to the Triton kernels; float64 never
    goes (the torch path gives the same result)."""
    if check_backend(backend) != "triton":
        return False
    require_triton(x.device)
    return x.dtype in DTYPES

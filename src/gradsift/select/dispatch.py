"""Which selection backend runs: decided here, and only here, from the tensor's
device and dtype and from what is installed.

- ``"auto"`` (the default everywhere): the Triton kernels (``gradsift.select.triton``)
  for CUDA tensors of float16, bfloat16 or float32 when triton imports; the torch
  path otherwise (the sampled block kernel on CPU, a sampled threshold with an exact
  finish on other devices).
- ``"torch"``: the torch path, always.
- ``"triton"``: the Triton kernels, or an error saying why they cannot run
  (float64 stays on the torch path: the result is the same).

Triton is optional (``pip install 'gradsift[gpu]'``) and imported only when a
decision needs it. Its kernels need CUDA tensors, or CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1`` set before triton is imported), which is how the
tests run them on machines without a GPU; ``"auto"`` never sends CPU tensors there.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

from gradsift.checks import check_choice

__all__ = [
    "BACKENDS",
    "DTYPES",
    "check_backend",
    "interpreting",
    "require_triton",
    "triton_available",
    "use_triton",
]

BACKENDS = ("auto", "torch", "triton")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # what the kernels handle
INSTALL_HINT = "pip install 'gradsift[gpu]' (or pip install triton)"


def check_backend(backend, devices=()) -> str:
    """``backend`` validated against ``BACKENDS``; ``"triton"`` also for ``devices``."""
    check_choice("backend", backend, BACKENDS)
    if backend == "triton":
        for device in set(devices):
            require_triton(device)
    return backend


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def triton_available() -> bool:
    """Whether triton imports (checked once)."""
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def require_triton(device: torch.device) -> None:
    """Raise unless Triton is installed and can run on ``device``.

    Raises:
        ImportError: triton is not installed (the message says how to install it).
        ValueError: ``device`` is not CUDA and the interpreter is off.
    """
    if not triton_available():
        raise ImportError(f"backend='triton' needs triton: {INSTALL_HINT}")
    if torch.device(device).type != "cuda" and not interpreting():
        raise ValueError(
            f"backend='triton' needs CUDA tensors, got device {device}; use backend='auto' "
            "(or set TRITON_INTERPRET=1 before importing triton to run it on CPU, slowly)"
        )


def use_triton(x: torch.Tensor, backend) -> bool:
    """Whether ``backend`` (checked) sends ``x`` to the Triton kernels.

    ``"auto"``: CUDA tensors of a kernel dtype when triton imports. ``"triton"``:
    every tensor of a kernel dtype (raising where triton cannot run). float64 never
    goes: the torch path gives the same result.
    """
    backend = check_backend(backend)
    if backend == "torch" or x.dtype not in DTYPES:
        return False
    if backend == "auto":
        return x.device.type == "cuda" and triton_available()
    require_triton(x.device)
    return True

"""Set before any test module imports triton (torch.compile's tests import it too):
without a GPU, Triton's kernels run in its CPU interpreter. Triton reads the setting
when a kernel is decorated, so it must be in place before the first import."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def one_rank():
    """A one-process gloo world in the test's own process (DDP over one rank)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()

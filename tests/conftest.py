"""Set before any test module imports triton (torch.compile's tests import it too):
without a GPU, Triton's kernels run in its CPU interpreter. Triton reads the setting
when a kernel is decorated, so it must be in place before the first import.

Property tests draw the same examples on every run (hypothesis profile
``deterministic``, the default: a red run on a fresh machine is a red run on yours);
``python -m pytest --hypothesis-profile=explore`` draws new ones each run."""

import os

import pytest
import torch
from hypothesis import settings

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile("deterministic")


@pytest.fixture
def one_rank():
    """A one-process gloo world in the test's own process (DDP over one rank)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()

"""The error-feedback core on a real GPU. Skipped where torch sees no CUDA device (CI
has none)."""

import pytest
import torch

from gradsift.optim.error_feedback import sparsify_
from gradsift.optim.workspace import Workspace

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (CI runs on CPU only)"
)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_whole_vector_pass_on_the_gpu_equals_the_cpus_chunked_one(momentum):
    # the chunked pass is for a CPU's caches: on a GPU a workspace stays unused and
    # the whole-vector pass gives the CPU's result bit for bit
    gen = torch.Generator().manual_seed(0)
    n, k = 3_000_011, 3000
    g, r, u = (torch.randn(n, generator=gen) for _ in range(3))
    velocity = None if momentum == 0.0 else u
    on_gpu = [t.cuda() for t in (g, r, u)]
    workspace = Workspace()
    got = sparsify_(
        on_gpu[0], k, residual=on_gpu[1], velocity=None if velocity is None else on_gpu[2],
        momentum=momentum, workspace=workspace,
    )  # fmt: skip
    assert workspace.keys is None
    want = sparsify_(g, k, residual=r, velocity=velocity, momentum=momentum, workspace=Workspace())
    for a, b in zip((*got, *on_gpu), (*want, g, r, u)):
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)

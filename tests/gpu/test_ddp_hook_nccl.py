"""The top-k DDP hook over NCCL on one GPU (a one-rank world): NCCL takes CUDA tensors
only, so every buffer the hook exchanges must be on the gradients' device (its
header was once a CPU tensor). Skipped where torch sees no CUDA device (CI has none)."""

import pytest
import torch
import torch.distributed as dist

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or not dist.is_nccl_available(),
    reason="needs a CUDA GPU and NCCL (CI runs on CPU only)",
)


@pytest.fixture
def nccl_rank():
    dist.init_process_group("nccl", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("unused", [False, True], ids=["", "find_unused_parameters"])
def test_the_hook_trains_over_nccl_as_the_topk_wrapper_does(nccl_rank, unused):
    """Over NCCL the hook runs (header, sparse all-gather; with find_unused_parameters
    the used-flags' all-reduce, every parameter used here) and does the maths of
    ``TopK(SGD)`` with error feedback in one process (equal up to float32 rounding)."""
    from torch.nn.parallel import DistributedDataParallel

    from gradsift import TopK
    from gradsift.distributed import TopKHookState, topk_hook

    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    b = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    b.load_state_dict(a.state_dict())
    a, b = a.cuda(), b.cuda()
    ddp = DistributedDataParallel(a, device_ids=[0], find_unused_parameters=unused)
    state = TopKHookState(k=30, start_iter=0, find_unused_parameters=unused)
    ddp.register_comm_hook(state, topk_hook)
    opt_a = torch.optim.SGD(ddp.parameters(), lr=0.1)
    opt_b = TopK(torch.optim.SGD(b.parameters(), lr=0.1), k=30)
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(16, 20, generator=gen).cuda()
        y = torch.randint(0, 5, (16,), generator=gen).cuda()
        for model, opt in ((ddp, opt_a), (b, opt_b)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert state.iter == 4 and state.residual.device.type == "cuda"
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)

"""A rank the lab starts (a fork of its server, ``gradsift.lab.processes``) uses CUDA
and NCCL, even when the starting process has CUDA up already (a notebook's would):
the server is a fresh interpreter, so no fork carries an initialised CUDA context.
Skipped where torch sees no CUDA device (CI has none)."""

from pathlib import Path

import pytest
import torch

import ddp_workers
from gradsift.lab import launch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (CI runs on CPU only)"
)


def test_a_started_rank_runs_nccl_on_the_gpu_after_the_caller_initialised_cuda(tmp_path):
    torch.zeros(1, device="cuda")  # the caller's CUDA context is up before any rank starts
    out = tmp_path / "sum"
    launch.run_processes(ddp_workers.nccl_one_rank, (launch.free_port(), str(out)), 1)
    assert Path(out).read_text() == "6.0"

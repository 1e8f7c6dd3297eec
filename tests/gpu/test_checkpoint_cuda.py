"""The lab's checkpoint on a real GPU: a resumed run's draws on the device continue
where they stopped. Skipped where torch sees no CUDA device (CI has none)."""

import pytest
import torch

from gradsift.lab import checkpoint
from gradsift.lab.data import digits
from gradsift.lab.models import build_model
from gradsift.lab.training import TrainConfig, single_process_setup

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (CI runs on CPU only)"
)


def test_the_devices_generator_resumes_where_it_stopped(tmp_path):
    cfg = TrainConfig(epochs=1, device="cuda")
    setup = single_process_setup(build_model("mlp", input_shape=(64,)), digits().train, cfg)
    torch.cuda.manual_seed(123)
    checkpoint.save(tmp_path, setup, 1, [], 0.0)
    want = torch.rand(1000, device="cuda")  # what the run drew next (dropout masks, ...)
    torch.cuda.manual_seed(456)  # a new process: another state
    checkpoint.restore(tmp_path, setup)
    torch.testing.assert_close(torch.rand(1000, device="cuda"), want, rtol=0, atol=0)

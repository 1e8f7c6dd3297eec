"""Checkpoint/resume of a single-process run: interrupted and resumed equals
uninterrupted, bit for bit (model, TopK residuals, schedule, data order)."""

import dataclasses

import pytest
import torch

from checkpoint_support import saved, stopped_after_save, untimed
from gradsift.lab import checkpoint
from gradsift.lab.data import digits
from gradsift.lab.models import build_model
from gradsift.lab.runs import run_one
from gradsift.lab.specs import RunSpec
from gradsift.lab.training import TrainConfig, single_process_setup


def spec():
    return RunSpec(
        model="mlp", method="snip", sparsity=0.5, train=TrainConfig(epochs=3, density=0.05)
    )


def test_interrupted_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    full = run_one(spec(), checkpoint_dir=tmp_path / "full")
    stopped_after_save(monkeypatch, lambda: run_one(spec(), checkpoint_dir=tmp_path / "cut"))
    assert saved(tmp_path / "cut")["epoch"] == 1
    resumed = run_one(spec(), checkpoint_dir=tmp_path / "cut")
    a, b = saved(tmp_path / "full"), saved(tmp_path / "cut")
    assert a["epoch"] == b["epoch"] == 3
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    residuals = [st["residual"] for st in b["optimizer"]["state"].values()]
    assert residuals and any(r.any() for r in residuals)
    assert untimed(resumed["history"]) == untimed(full["history"])
    assert resumed["test_accuracy"] == full["test_accuracy"]


def test_checkpoint_of_another_world_size_is_refused(tmp_path):
    run_one(RunSpec(model="mlp", train=TrainConfig(epochs=1)), checkpoint_dir=tmp_path)
    payload = saved(tmp_path)
    payload["world"] = 2
    torch.save(payload, tmp_path / checkpoint.FILENAME)
    with pytest.raises(ValueError, match="written by 2 processes"):
        run_one(RunSpec(model="mlp", train=TrainConfig(epochs=2)), checkpoint_dir=tmp_path)


def _digits_setup(device: str):
    cfg = TrainConfig(epochs=1, device=device)
    return single_process_setup(build_model("mlp", input_shape=(64,)), digits().train, cfg)


def test_a_cuda_runs_device_generator_is_saved_and_restored(tmp_path, monkeypatch):
    """A run on a CUDA device resumes its draws there (dropout) where they stopped: the
    device's generator is saved beside the CPU's. Shown here with torch.cuda's two RNG
    calls stood in for; ``tests/gpu/test_checkpoint_cuda.py`` has the real device."""
    generators = {"cuda:1": torch.tensor([3, 1, 4], dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda d: generators[str(d)].clone())
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda s, d: generators.__setitem__(str(d), s.clone())
    )
    setup = dataclasses.replace(_digits_setup("cpu"), device="cuda:1")
    checkpoint.save(tmp_path, setup, 1, [], 0.0)
    assert torch.equal(saved(tmp_path)["ranks"][0]["cuda_rng"], torch.tensor([3, 1, 4]).byte())
    generators["cuda:1"] = torch.tensor([9, 9, 9], dtype=torch.uint8)  # drawn on
    checkpoint.restore(tmp_path, setup)
    assert generators["cuda:1"].tolist() == [3, 1, 4]


def test_a_cpu_run_touches_no_cuda_generator(tmp_path, monkeypatch):
    def refuse(*args):
        raise AssertionError("a CPU run read or set a CUDA generator")

    monkeypatch.setattr(torch.cuda, "get_rng_state", refuse)
    monkeypatch.setattr(torch.cuda, "set_rng_state", refuse)
    setup = _digits_setup("cpu")
    checkpoint.save(tmp_path, setup, 1, [], 0.0)
    assert saved(tmp_path)["ranks"][0]["cuda_rng"] is None
    checkpoint.restore(tmp_path, setup)

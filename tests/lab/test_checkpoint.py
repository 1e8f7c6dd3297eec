"""Checkpoint/resume of a single-process run: interrupted and resumed equals
uninterrupted, bit for bit (model, TopK residuals, schedule, data order)."""

import pytest
import torch

from checkpoint_support import saved, stopped_after_save, untimed
from gradsift.lab import checkpoint
from gradsift.lab.runs import run_one
from gradsift.lab.specs import RunSpec
from gradsift.lab.training import TrainConfig


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

"""Checkpoint/resume of a single-process run: interrupted and resumed equals
uninterrupted, bit for bit (model, TopK residuals, schedule, data order)."""

import pytest
import torch

from gradsift.lab import checkpoint
from gradsift.lab.runs import RunSpec, run_one
from gradsift.lab.training import TrainConfig


def spec():
    return RunSpec(
        model="mlp", method="snip", sparsity=0.5, train=TrainConfig(epochs=3, density=0.05)
    )


def saved(directory):
    return torch.load(directory / checkpoint.FILENAME, weights_only=True)


def test_interrupted_run_resumes_bit_for_bit(tmp_path, monkeypatch):
    full = run_one(spec(), checkpoint_dir=tmp_path / "full")
    real = checkpoint.save

    def save_then_stop(directory, setup, epoch, history, seconds):
        real(directory, setup, epoch, history, seconds)
        if epoch == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run_one(spec(), checkpoint_dir=tmp_path / "cut")
    assert saved(tmp_path / "cut")["epoch"] == 1
    monkeypatch.setattr(checkpoint, "save", real)
    resumed = run_one(spec(), checkpoint_dir=tmp_path / "cut")
    a, b = saved(tmp_path / "full"), saved(tmp_path / "cut")
    assert a["epoch"] == b["epoch"] == 3
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    residuals = [st["residual"] for st in b["optimizer"]["state"].values()]
    assert residuals and any(r.any() for r in residuals)
    untimed = [{k: v for k, v in h.items() if k != "train_seconds"} for h in resumed["history"]]
    assert untimed == [
        {k: v for k, v in h.items() if k != "train_seconds"} for h in full["history"]
    ]
    assert resumed["test_accuracy"] == full["test_accuracy"]


def test_checkpoint_of_another_world_size_is_refused(tmp_path):
    run_one(RunSpec(model="mlp", train=TrainConfig(epochs=1)), checkpoint_dir=tmp_path)
    payload = saved(tmp_path)
    payload["world"] = 2
    torch.save(payload, tmp_path / checkpoint.FILENAME)
    with pytest.raises(ValueError, match="written by 2 processes"):
        run_one(RunSpec(model="mlp", train=TrainConfig(epochs=2)), checkpoint_dir=tmp_path)

"""Helpers of the lab's resume tests: read a run's checkpoint, compare histories
without their timings, and stop a run right after a given epoch's checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gradsift.lab import checkpoint


def saved(directory) -> dict:
    """The checkpoint a run wrote into ``directory``."""
    return torch.load(Path(directory) / checkpoint.FILENAME, weights_only=True)


def untimed(history: list[dict]) -> list[dict]:
    """A run's history without ``train_seconds`` (the one field a resume may change)."""
    return [{k: v for k, v in h.items() if k != "train_seconds"} for h in history]


def stopped_after_save(monkeypatch, run, epoch: int = 1) -> None:
    """Call ``run()`` with the checkpoint of ``epoch`` saved and then a
    ``KeyboardInterrupt`` raised, as a job killed right after saving; later runs save
    as usual."""
    real = checkpoint.save

    def save_then_stop(directory, setup, at, history, seconds):
        real(directory, setup, at, history, seconds)
        if at == epoch:
            raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(checkpoint, "save", real)

"""One run's record, and the options a run passes to whichever method takes them."""

import dataclasses

from gradsift.lab import runs
from gradsift.lab.runs import RunRecord, RunSpec, run_one
from gradsift.lab.training import TrainConfig


def test_record_has_every_field_once():
    record = run_one(
        RunSpec(model="mlp", method="grasp", sparsity=0.5, train=TrainConfig(epochs=1))
    )
    assert list(record) == [f.name for f in dataclasses.fields(RunRecord)]
    assert record["world_size"] == 1 and record["compression_ratio"] == 1.0
    assert record["total"] - record["kept"] == round(0.5 * record["total"])
    assert len(record["history"]) == 1


def test_prune_for_run_passes_only_supported_options(monkeypatch):
    seen = {}

    def spy(model, method, sparsity, data, **kwargs):
        seen[method] = set(kwargs) - {"iterations", "shuffle", "generator"}
        return {}

    monkeypatch.setattr(runs, "prune_at_init", spy)
    ds = runs.load_dataset("digits")
    for method in ("grasp", "random", "snip", "synflow", "magnitude"):
        runs.prune_for_run(None, ds, method, 0.5)
    assert seen == {
        "grasp": {"samples_per_class", "num_classes"},
        "random": {"seed"},
        "snip": set(),
        "synflow": set(),
        "magnitude": set(),
    }

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
        seen[method] = set(kwargs) - {"iterations", "shuffle", "generator", "allocation", "sanity"}
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


def test_budget_and_sanity_reach_prune_at_init_and_the_record(monkeypatch):
    seen = []
    real = runs.prune_at_init

    def spy(*args, **kwargs):
        seen.append({k: kwargs[k] for k in ("allocation", "sanity", "shuffle")})
        return real(*args, **kwargs)

    monkeypatch.setattr(runs, "prune_at_init", spy)
    spec = RunSpec(
        model="mlp",
        method="snip",
        sparsity=0.9,
        budget="erk",
        sanity="invert",
        train=TrainConfig(epochs=1),
    )
    record = run_one(spec)
    assert seen == [{"allocation": "erk", "sanity": "invert", "shuffle": False}]
    assert record["budget"] == "erk" and record["sanity"] == "invert"
    assert record["total"] - record["kept"] == round(0.9 * record["total"])


def test_keys_of_older_results_still_match():
    old = RunSpec(method="snip", sparsity=0.9, shuffle=True)
    assert old.key() == "lenet5|digits|snip|0.9|1|1|0|10|None|None|1|0.05|64"
    assert RunSpec(method="snip", sparsity=0.9, sanity="shuffle-layer").key() == old.key()
    assert RunSpec(method="snip", sparsity=0.9).key().endswith("|0.05|64")
    erk = RunSpec(method="snip", sparsity=0.9, budget="erk", sanity="reinit").key()
    assert erk.endswith("|0.05|64|budget=erk|sanity=reinit")


def test_sweep_in_worker_processes_matches_one_process(tmp_path):
    def spec(method, seed):
        return RunSpec(
            model="mlp", method=method, sparsity=0.5, seed=seed, train=TrainConfig(epochs=1)
        )

    specs = [spec("magnitude", 0), spec("random", 0), spec("magnitude", 1), spec("random", 0)]
    serial = runs.run_sweep(specs, tmp_path / "serial.json")
    parallel = runs.run_sweep(specs, tmp_path / "parallel.json", jobs=2)
    assert len(parallel) == 3, "a repeated spec runs once"

    def by_key(records):
        return {r["key"]: r for r in records}

    serial, parallel = by_key(serial), by_key(parallel)
    assert set(parallel) == set(serial)
    for key, r in parallel.items():
        assert (r["kept"], r["seed"], r["method"]) == (
            serial[key]["kept"],
            serial[key]["seed"],
            serial[key]["method"],
        )
        assert abs(r["history"][-1]["train_loss"] - serial[key]["history"][-1]["train_loss"]) < 1e-4
    assert len(runs.run_sweep(specs, tmp_path / "parallel.json", jobs=2)) == 3  # resumed


def test_diverged_is_read_from_older_records_too():
    """Records written before the field existed: a non-finite loss anywhere marks them."""
    from gradsift.lab.runs import diverged

    ok = {"test_loss": 0.3, "history": [{"train_loss": 1.0}, {"train_loss": 0.5}]}
    assert not diverged(ok)
    assert diverged({**ok, "test_loss": float("nan")})
    assert diverged({**ok, "history": [{"train_loss": float("inf")}, {"train_loss": 0.5}]})
    assert diverged({**ok, "diverged": True})

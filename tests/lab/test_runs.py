"""One run's record, and the options a run passes to whichever method takes them."""

import dataclasses
import json

import pytest

from gradsift.lab import runs
from gradsift.lab.records import RunRecord, diverged, load_results
from gradsift.lab.runs import run_one
from gradsift.lab.specs import RunSpec
from gradsift.lab.training import TrainConfig


def test_record_has_every_field_once():
    record = run_one(
        RunSpec(model="mlp", method="grasp", sparsity=0.5, train=TrainConfig(epochs=1))
    )
    assert list(record) == [f.name for f in dataclasses.fields(RunRecord)]
    assert record["world_size"] == 1 and record["compression_ratio"] == 1.0
    assert record["total"] - record["kept"] == round(0.5 * record["total"])
    assert len(record["history"]) == 1


OUTCOME = dict(
    world_size=2,
    kept=10,
    total=100,
    collapsed=[],
    test_accuracy=0.5,
    test_loss=0.7,
    history=[],
    prune_seconds=0.0,
    seconds=1.0,
)


def test_record_of_a_spec_says_what_the_spec_says():
    dense = RunRecord.of(RunSpec(model="mlp"), **OUTCOME)
    assert (dense.method, dense.grad_density, dense.shuffle, dense.sanity) == (
        "unpruned",
        1.0,
        False,
        None,
    )
    assert dense.key == RunSpec(model="mlp").key() and dense.world_size == 2
    spec = RunSpec(
        method="snip",
        sparsity=0.9,
        shuffle=True,
        allocation="erk",
        seed=3,
        train=TrainConfig(epochs=4, density=0.01, error_feedback=False),
    )
    record = RunRecord.of(spec, **OUTCOME, sharded=True)
    assert (record.method, record.sparsity, record.seed, record.allocation) == (
        "snip",
        0.9,
        3,
        "erk",
    )
    assert (record.shuffle, record.sanity, record.sharded) == (True, "shuffle-layer", True)
    assert (record.grad_density, record.error_feedback, record.epochs) == (0.01, False, 4)
    with pytest.raises(TypeError, match="kept"):
        RunRecord.of(spec, **{k: v for k, v in OUTCOME.items() if k != "kept"})


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


def test_allocation_and_sanity_reach_prune_at_init_and_the_record(monkeypatch):
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
        allocation="erk",
        sanity="invert",
        train=TrainConfig(epochs=1),
    )
    record = run_one(spec)
    assert seen == [{"allocation": "erk", "sanity": "invert", "shuffle": False}]
    assert record["allocation"] == "erk" and record["sanity"] == "invert"
    assert "budget" not in record
    assert record["total"] - record["kept"] == round(0.9 * record["total"])


def test_run_many_in_order_yields_the_specs_order_from_worker_processes():
    """The first run is the slowest, so it finishes last; ``in_order`` still yields it
    first, each record the one of its spec."""
    specs = [
        RunSpec(model="mlp", train=TrainConfig(epochs=e), seed=seed)
        for e, seed in ((6, 0), (1, 1), (1, 2))
    ]
    got = list(runs.run_many(specs, jobs=2, in_order=True))
    assert [r["key"] for r in got] == [s.key() for s in specs]
    assert [len(r["history"]) for r in got] == [6, 1, 1]


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


def test_a_failing_run_in_a_worker_keeps_the_runs_already_running(tmp_path):
    """One worker's run fails at once while the other trains: the sweep raises that
    error, but only after saving the run that was already under way (it was thrown
    away, to be rerun on resume)."""
    slow = RunSpec(model="mlp", train=TrainConfig(epochs=3))
    bad = RunSpec(model="mlp", dataset="no-such-dataset")
    later = RunSpec(model="mlp", seed=1, train=TrainConfig(epochs=1))
    path = tmp_path / "sweep.json"
    with pytest.raises(ValueError, match="dataset must be one of"):
        runs.run_sweep([slow, bad, later], path, jobs=2)
    saved = [r["key"] for r in load_results(path)]
    assert slow.key() in saved and bad.key() not in saved


def test_diverged_is_read_from_older_records_too():
    """Records written before the field existed: a non-finite loss anywhere marks them."""

    ok = {"test_loss": 0.3, "history": [{"train_loss": 1.0}, {"train_loss": 0.5}]}
    assert not diverged(ok)
    assert diverged({**ok, "test_loss": float("nan")})
    assert diverged({**ok, "history": [{"train_loss": float("inf")}, {"train_loss": 0.5}]})
    assert diverged({**ok, "diverged": True})


# a record as the code before the rename wrote it: the allocation under "budget"
OLD_RECORD = """{
  "key": "lenet5|digits|snip|0.9|1|0|0|10|None|None|1|0.05|64|budget=erk",
  "model": "lenet5", "dataset": "digits", "method": "snip", "sparsity": 0.9,
  "iterations": 1, "shuffle": false, "seed": 0, "world_size": 1, "grad_density": 1.0,
  "error_feedback": true, "epochs": 10, "kept": 6170, "total": 61706, "collapsed": [],
  "test_accuracy": 0.9, "test_loss": 0.4, "history": [], "prune_seconds": 0.1,
  "seconds": 1.0, "compression_ratio": 1.0, "budget": "erk", "sanity": null,
  "diverged": false
}"""


def _record(spec: RunSpec) -> dict:
    """A record of today's form for ``spec``."""
    fields = {k: v for k, v in json.loads(OLD_RECORD).items() if k != "budget"}
    return RunRecord(**{**fields, "key": spec.key(), "allocation": spec.allocation}).to_dict()


def _old_results(tmp_path):
    """A results file of the old code: one ERK run, and one run written before the
    allocation was recorded at all (global)."""
    old = json.loads(OLD_RECORD)
    older = {k: v for k, v in old.items() if k != "budget"}
    older["key"] = old["key"].removesuffix("|budget=erk")
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": [old, older]}))
    return path


def test_old_records_load_into_allocation_and_show_in_tables_and_plots(tmp_path):
    from gradsift.lab.plots import run_label
    from gradsift.lab.studies.mnist import _cells

    erk, plain = load_results(_old_results(tmp_path))
    assert (erk["allocation"], plain["allocation"]) == ("erk", "global")
    assert "budget" not in erk and "budget" not in plain
    assert RunRecord(**erk).allocation == "erk"  # every field of today's record, none extra
    assert run_label(erk) == "snip [erk]" and run_label(plain) == "snip"
    cells = _cells([erk, plain])
    assert cells[("lenet5", "snip", "erk", None, 0.9)] == [erk]


def test_sweep_resumes_over_old_records(tmp_path, monkeypatch):
    path = _old_results(tmp_path)
    ran = []

    def fake(spec, **kw):
        ran.append(spec.key())
        return _record(spec)

    monkeypatch.setattr(runs, "run_one", fake)
    erk = RunSpec(method="snip", sparsity=0.9, allocation="erk")
    glob = RunSpec(method="snip", sparsity=0.9)
    new = RunSpec(method="snip", sparsity=0.9, allocation="uniform")
    results = runs.run_sweep([erk, glob, new], path)
    assert ran == [new.key()], "the two old runs are found and skipped"
    assert [r["allocation"] for r in results] == ["erk", "global", "uniform"]
    reloaded = load_results(path)
    assert reloaded == results and all("budget" not in r for r in reloaded)
    assert runs.run_sweep([erk, glob, new], path) == results and len(ran) == 1


def test_two_sweeps_into_one_file_keep_each_others_runs(tmp_path, monkeypatch):
    # each sweep read the file once and rewrote it from its own list: the one that
    # wrote last dropped the other's finished runs
    path = tmp_path / "results.json"
    mine = [RunSpec(method="snip", sparsity=s) for s in (0.5, 0.9)]
    theirs = RunSpec(method="random", sparsity=0.5)

    def fake(spec, **kw):
        if spec is mine[1]:  # the other sweep saves a run while this one trains
            path.write_text(json.dumps({"runs": load_results(path) + [_record(theirs)]}))
        return _record(spec)

    monkeypatch.setattr(runs, "run_one", fake)
    results = runs.run_sweep(mine, path)
    keys = [r["key"] for r in load_results(path)]
    assert keys == [mine[0].key(), theirs.key(), mine[1].key()]
    assert [r["key"] for r in results] == keys


@pytest.mark.parametrize("allocation", ["global", "erk"])
def test_new_record_round_trips(tmp_path, monkeypatch, allocation):
    spec = RunSpec(method="snip", sparsity=0.9, allocation=allocation)
    record = _record(spec)
    monkeypatch.setattr(runs, "run_one", lambda spec, **kw: record)
    path = tmp_path / "results.json"
    assert runs.run_sweep([spec], path) == [record]
    assert "budget" not in json.loads(path.read_text())["runs"][0]
    assert load_results(path) == [record]
    assert RunRecord(**load_results(path)[0]).to_dict() == record


def test_a_run_that_keeps_k_coordinates_records_their_density():
    """``TrainConfig(k=...)`` trains with TopK(k): the record's grad density is k over
    the trainable coordinates (it said 1.0, a dense run's)."""
    from gradsift.lab.models import build_model

    spec = RunSpec(model="mlp", train=TrainConfig(epochs=1, k=50))
    record = runs.run_one(spec)
    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    assert record["grad_density"] == 50 / sum(p.numel() for p in model.parameters())


def test_fp16_communication_records_half_the_bytes():
    """fp16's hook has no state that counts bytes; it sends 2 of a float32's 4."""
    from gradsift.lab.comm import dense_ratio
    from gradsift.lab.models import build_model

    model = build_model("mlp", input_shape=(1, 8, 8), num_classes=10)
    assert dense_ratio(TrainConfig(comm="fp16"), model) == 2.0
    assert dense_ratio(TrainConfig(comm="fp16"), model.double()) == 4.0
    assert dense_ratio(TrainConfig(comm="allreduce"), model) == 1.0

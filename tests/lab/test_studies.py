"""The --quick form of every study runs and writes valid JSON, Markdown and a PNG."""

import copy
import importlib
import json
from functools import partial

import pytest
import torch

import gradsift
from gradsift.lab import cli
from gradsift.lab.bench import BENCHES
from gradsift.lab.studies.speed import _QUICK

PNG = b"\x89PNG\r\n\x1a\n"
# the package's ``ddp`` is the study function, which hides its module
DDP_QUICK = importlib.import_module("gradsift.lab.studies.ddp")._QUICK


def _measured(name, rows):
    """A stand-in for bench ``name`` that returns ``rows``, measured with the quick
    arguments, which it checks it is given."""

    def bench(**kwargs):
        assert kwargs == _QUICK[name]
        return copy.deepcopy(rows)

    return bench


@pytest.mark.parametrize(
    "study", ["collapse", "accuracy", "topk", "speed", "ddp", "agreement", "mnist"]
)
def test_quick_study(study, tmp_path, capsys, monkeypatch, request):
    if study == "speed":
        # rows measured by the benches' own tests, once (iteration, prune-memory: fresh
        # processes; sharded: two ranks; 25 s saved here); the ddp bench's two-rank
        # rows are measured for real by the ddp study below
        for name in ("iteration", "prune-memory", "sharded"):
            measured = request.getfixturevalue(f"quick_{name.replace('-', '_')}_rows")
            monkeypatch.setitem(BENCHES, name, (_measured(name, measured), BENCHES[name][1]))
        ddp_rows = [{"hook": h, "step_ms": 1.0} for h in _QUICK["ddp"]["variants"]]

        def ddp(**kwargs):
            assert kwargs == _QUICK["ddp"]
            return [*ddp_rows, {"hook": "one process, no communication", "step_ms": 1.0}]

        monkeypatch.setitem(BENCHES, "ddp", (ddp, BENCHES["ddp"][1]))
    # mnist: its eleven training runs two at a time (a study's --jobs path; 5 s less here)
    jobs = ["--jobs", "2"] if study == "mnist" else []
    assert cli.main(["experiment", study, "--quick", "--out", str(tmp_path), *jobs]) == 0
    data = json.loads((tmp_path / f"{study}.json").read_text())
    assert data["study"] == study and data["quick"] is True
    command = " ".join(["gradsift experiment", study, "--quick --out", str(tmp_path), *jobs])
    assert data["command"] == command
    md = (tmp_path / f"{study}.md").read_text()
    # speed: select, step, score, ddp, ties, methods, iteration, prune-memory, sharded;
    # ddp: its bench and time to accuracy;
    # mnist: one per network, sanity, SNIP
    tables = {"speed": 9, "ddp": 2, "mnist": 4}.get(study, 1)
    assert sum(line.startswith("|---") for line in md.splitlines()) == tables
    png = next(tmp_path.glob("*.png")).read_bytes()
    assert png.startswith(PNG) and len(png) > 1000
    if study == "collapse":
        rows = data["rows"]
        # the guard keeps every layer alive at every compression
        assert not any(r["collapsed_layers"] for r in rows if r["guard"])
        assert any(r["collapsed_layers"] for r in rows if not r["guard"])
        models = [s["model"] for s in data["settings"]]
        assert models == ["vgg11_bn", "resnet20"]
        # every registered method, on each network, from its registry entry alone
        assert [(s["model"], s["method"]) for s in data["summary"]] == [
            (m, method) for m in models for method in gradsift.list_methods()
        ]
        for s in data["summary"]:
            top = max(r["log10_compression"] for r in rows if r["model"] == s["model"])
            assert s["guarded"] == top
        resnet = [s for s in data["summary"] if s["model"] == "resnet20"]
        assert all(s["shortcuts_guarded"] == 3.0 for s in resnet)
        assert any(r["collapsed_shortcuts"] for r in rows if not r["guard"])
        assert all(r["shortcut_layers"] == 2 for r in rows if r["model"] == "resnet20")
    if study == "accuracy":
        keys = {(r["method"], r["sparsity"], r["shuffle"]) for r in data["runs"]}
        assert len(keys) == 5 * 2 * 2
    if study == "mnist":
        runs = data["runs"]
        assert {r["dataset"] for r in runs} == {"mnist5k"}
        assert {r["model"] for r in runs} == {"lenet300_100", "lenet5_caffe"}
        pruned = [r for r in runs if r["method"] != "unpruned"]
        assert {(r["allocation"], r["sanity"]) for r in pruned if r["model"] == "lenet300_100"} == {
            ("global", None),
            ("erk", None),
            ("global", "reinit"),
            ("global", "invert"),
            ("global", "shuffle-layer"),
        }
        assert all(r["total"] - r["kept"] == round(r["sparsity"] * r["total"]) for r in pruned)
        # the dense network's accuracy stands under 0%, not under the first sparsity
        lines = md.splitlines()
        header = next(line for line in lines if line.startswith("| method | allocation |"))
        dense = next(line for line in lines if line.startswith("| dense |"))
        assert header.startswith("| method | allocation | 0% | ")
        cells = [cell.strip() for cell in dense.strip("|").split("|")]
        assert cells[2] and not any(cells[3:]), cells
        assert "| snip (invert) | global |" in md and "SNIP erk error (%)" in md
    if study == "speed":
        assert data["select"] and data["step"] and data["score"] and data["ddp"]
        assert {r["method"] for r in data["score"]} == {"reference", "ours"}
        assert all(r["topk_ef_ms"] > 0 for r in data["step"])
        assert {r["case"].split(" ")[0] for r in data["ties"]} == {"select", "TopK"}
        assert [r["method"] for r in data["methods"]] == ["snip", "synflow"]
    if study == "agreement":  # the rows that must agree (issue 16) do; chunking warns
        rows = data["rows"]
        same = [r["gradsift"] for r in rows if r["cosine"] > 0.999999 and r["jaccard_0.01"] == 1]
        assert same == [
            "GraSP default",
            "GraSP chunk_size=10",
            "GraSP chunks 8/8/4, batch_weighting=batch",
            "SNIP default",
            "SNIP num_batches=None, batch_weighting=batch",
        ]
        assert rows[1]["warned"] and not rows[0]["warned"]
    if study == "topk":
        assert {(r["grad_density"], r["error_feedback"]) for r in data["runs"]} == {
            (1.0, True),
            (0.1, True),
            (0.1, False),
            (0.01, True),
            (0.01, False),
            (0.001, True),
            (0.001, False),
        }
    if study == "ddp":
        assert {r["bandwidth"] for r in data["bench"]} == {"1gbit"}
        hooks = [r["hook"] for r in data["bench"]]
        assert hooks == [*DDP_QUICK["bench"]["variants"], "one process, no communication"]
        assert all("step_ms" in r for r in data["bench"]), data["bench"]
        assert all(r["step_ms"] > 0 and r["bytes_per_step"] > 0 for r in data["bench"][:-1])
        assert {r["comm"] for r in data["runs"]} == {
            "one process",
            "allreduce",
            "topk-dgc",
            "topk-dgc, 2 epochs",
        }
        long = next(r for r in data["runs"] if r["comm"] == "topk-dgc, 2 epochs")
        assert len(long["history"]) == 2
        assert all(
            r["world_size"] == (1 if r["comm"] == "one process" else 2) for r in data["runs"]
        )
        assert all(s["step_ms"] > 0 for s in data["summary"])


def _digits_record(comm, seed, accuracies, step_s, world=2):
    history = [
        {"accuracy": a, "train_seconds": step_s * 11 * (e + 1), "train_loss": 0.1}
        for e, a in enumerate(accuracies)
    ]
    return {
        "comm": comm,
        "seed": seed,
        "world_size": world,
        "history": history,
        "test_accuracy": accuracies[-1],
        "test_loss": 0.1,
    }


def test_time_to_dense_accuracy_pairs_each_run_with_its_seeds_dense_run():
    from gradsift.lab.studies.ddp import _summary

    records = [
        _digits_record("allreduce", 0, [0.90, 0.95, 0.97], 0.030),
        _digits_record("allreduce", 1, [0.90, 0.96, 0.98], 0.030),
        # seed 1's 0.97 is below its own dense run's 0.98: not reached in 3 epochs
        _digits_record("topk-dgc", 0, [0.80, 0.97, 0.97], 0.006),
        _digits_record("topk-dgc", 1, [0.80, 0.95, 0.97], 0.006),
        _digits_record("topk-dgc, 6 epochs", 0, [0.8, 0.9, 0.97, 0.97, 0.97, 0.97], 0.006),
        _digits_record("topk-dgc, 6 epochs", 1, [0.8, 0.9, 0.95, 0.96, 0.98, 0.99], 0.006),
    ]
    rows = {r["comm"]: r for r in _summary(records)}
    dense, short, long = rows["allreduce"], rows["topk-dgc"], rows["topk-dgc, 6 epochs"]
    assert (dense["epochs"], short["epochs"], long["epochs"]) == (3, 3, 6)
    torch.testing.assert_close(dense["step_ms"], 30.0)
    torch.testing.assert_close(long["step_ms"], 6.0)
    torch.testing.assert_close(dense["to_dense_final_s"], 0.030 * 11 * 3)
    assert short["to_dense_final_s"] is None and short["reached"] == "1 of 2"
    # seed 0 at epoch 3, seed 1 at epoch 5
    torch.testing.assert_close(long["to_dense_final_s"], 0.006 * 11 * (3 + 5) / 2)
    assert long["reached"] == "2 of 2"


def test_a_cell_with_diverged_runs_says_how_many():
    from gradsift.lab.studies.common import accuracy_cell

    ok = {"test_accuracy": 0.9, "test_loss": 0.3, "history": [{"train_loss": 0.4}]}
    bad = {"test_accuracy": 0.078, "test_loss": float("nan"), "history": [{"train_loss": 0.4}]}
    assert accuracy_cell([ok, ok]) == "90.0 ± 0.0"
    assert accuracy_cell([ok, bad, bad]) == "35.2 ± 38.7 (2 of 3 diverged)"
    assert accuracy_cell([]) == ""
    assert accuracy_cell([ok]) == "90.0"  # one run: no spread to show, not "± 0.0"
    assert accuracy_cell([bad]) == "7.8 (1 of 1 diverged)"


def test_an_interrupted_collapse_study_resumes_at_the_next_method(tmp_path, monkeypatch):
    # the package's ``collapse`` is the study function, which hides its module
    study = importlib.import_module("gradsift.lab.studies.collapse")
    methods = ["random", "synflow"]  # one scored once, one pruned afresh (rounds)
    monkeypatch.setattr(study, "list_methods", lambda: methods)
    whole, _ = study.collapse(tmp_path / "whole", quick=True)
    cache = tmp_path / "whole" / "collapse_rows_quick.json"
    done = json.loads(cache.read_text())
    assert sorted(done) == sorted(f"{s.model}/{m}" for s in study._QUICK for m in methods)
    # as if killed during ResNet-20's synflow: only that one is recomputed
    del done["resnet20/synflow"]
    (tmp_path / "part").mkdir()
    (tmp_path / "part" / cache.name).write_text(json.dumps(done))
    computed = []
    real = study._rows
    monkeypatch.setattr(study, "_rows", lambda m, *a: computed.append(m) or real(m, *a))
    resumed, _ = study.collapse(tmp_path / "part", quick=True)
    assert computed == ["synflow"]
    assert resumed["rows"] == whole["rows"] and resumed["summary"] == whole["summary"]


@pytest.mark.parametrize("method", ["force", "snip"])  # pruned afresh, scored once
def test_collapse_at_compression_1_runs_no_method_and_keeps_every_weight(method, monkeypatch):
    study = importlib.import_module("gradsift.lab.studies.collapse")
    setting = study._QUICK[1]  # ResNet-20 on 8x8 inputs
    sparsities = []
    for name, position in (("prune_at_init", 2), ("masks_from_scores", 1)):
        real = getattr(study, name)

        def recorded(*args, real=real, position=position, **kwargs):
            sparsities.append(args[position])
            return real(*args, **kwargs)

        monkeypatch.setattr(study, name, recorded)
    torch.manual_seed(0)
    model = study.build_model(setting.model, input_shape=setting.input_shape, num_classes=10)
    data = study.random_data(setting.input_shape, 10, per_class=setting.per_class)
    rows = study._rows(method, model, partial(study.loader, data.train), setting)
    weights = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    first = [r for r in rows if r["log10_compression"] == 0]
    assert [r["guard"] for r in first] == [False, True]
    assert all(r["kept"] == sum(w.numel() for w in weights) for r in first)
    assert not any(r["collapsed_layers"] for r in first)
    assert sparsities and min(sparsities) >= 1 - 10**-0.5  # the next compression's


def test_a_sanity_cell_with_a_diverged_run_says_so():
    """A variant's gap to its method is a mean over seeds: a diverged run in it (a
    constant-output network's accuracy) turns a loss into a gain, so it is named."""
    from gradsift.lab.studies.mnist import Plan, sanity_table

    plan = Plan("lenet300_100", "LeNet-300-100", 1, 0.05, (0.98,), ("invert",), (0.98,))
    ok = [{"test_accuracy": a, "history": []} for a in (0.90, 0.92)]
    bad = {"test_accuracy": 0.078, "history": [], "diverged": True}
    inverted = [{"test_accuracy": a, "history": []} for a in (0.88, 0.89, 0.87)]
    cells = {
        ("lenet300_100", "grasp", "global", None, 0.98): [*ok, bad],
        ("lenet300_100", "grasp", "global", "invert", 0.98): inverted,
        ("lenet300_100", "snip", "global", None, 0.98): ok,
        ("lenet300_100", "snip", "global", "invert", 0.98): inverted[:2],
    }
    table = sanity_table([plan], ["grasp", "snip"], cells)
    assert "| grasp | +24.7 (1 of 6 diverged) |" in table, table
    assert "| snip | -2.5 |" in table, table

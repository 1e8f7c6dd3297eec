"""Adversarial tests of the lab against independent references: atomic files,
bit-for-bit resume (TopK with error feedback and momentum correction, dropout RNG,
the DDP hooks' state), argument errors, tiny benchmarks, study tables, sweeps,
unicode paths and ``--help``.

Tests marked ``xfail(strict=True)`` document bugs: each fails today for the reason
given and will start passing (and so fail the suite, strict) once the bug is fixed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from checkpoint_support import saved, stopped_after_save, untimed
from cli_support import run_cli
from gradsift import TopK
from gradsift.lab import checkpoint, cli, runs
from gradsift.lab.atomic import atomic_write_json, read_json
from gradsift.lab.data import digits, load_dataset, loader
from gradsift.lab.records import RunRecord, load_results
from gradsift.lab.specs import RunSpec
from gradsift.lab.training import Setup, TrainConfig, make_scheduler, train_run

# --------------------------------------------------------------------------- helpers


def temporaries(folder: Path) -> list[str]:
    return [p.name for p in Path(folder).rglob("*") if p.name.endswith(".tmp")]


def assert_same_tree(a, b, where="state"):
    """Nested dicts/lists/tensors equal bit for bit (tensors with ``torch.equal``)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            assert_same_tree(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


DS = digits()


def fake_record(spec: RunSpec, accuracy: float = 0.5) -> dict:
    """A record of today's form for ``spec`` without training (for sweep logic)."""
    return RunRecord.of(
        spec,
        world_size=1,
        kept=10,
        total=100,
        collapsed=[],
        test_accuracy=accuracy,
        test_loss=0.5,
        history=[{"epoch": 1, "train_loss": 0.5, "accuracy": accuracy, "loss": 0.5}],
        prune_seconds=0.0,
        seconds=0.0,
    ).to_dict()


# ------------------------------------------------------------------ atomic writes


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_keyboard_interrupt_mid_write_keeps_the_old_file_and_no_temporary(
    tmp_path, monkeypatch, where
):
    """A Ctrl-C anywhere in the write: the old bytes stay, no ``.tmp`` is left."""
    path = tmp_path / "résultats d'été" / "r.json"
    atomic_write_json(path, {"old": [1, 2, 3]})
    before = path.read_bytes()

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "write":
        real_fdopen = os.fdopen

        class Half:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[: len(data) // 2])
                self.f.flush()
                raise KeyboardInterrupt

            def __getattr__(self, name):
                return getattr(self.f, name)

        monkeypatch.setattr(os, "fdopen", lambda *a, **k: Half(real_fdopen(*a, **k)))
    else:
        monkeypatch.setattr(os, where, interrupt)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_json(path, {"new": "x" * 10_000})
    monkeypatch.undo()
    assert path.read_bytes() == before and read_json(path) == {"old": [1, 2, 3]}
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.json"]


def test_concurrent_writers_never_show_a_torn_file(tmp_path):
    """Two writers and a reader on one path: every read is one writer's whole JSON."""
    path = tmp_path / "shared.json"
    payloads = {w: {"writer": w, "blob": str(w) * 20_000} for w in (0, 1)}
    atomic_write_json(path, payloads[0])
    bad, stop = [], threading.Event()

    def write(w):
        for _ in range(60):
            atomic_write_json(path, payloads[w])

    def read():
        while not stop.is_set():
            data = read_json(path)
            if data not in payloads.values():
                bad.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(w,)) for w in (0, 1)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert not bad
    assert read_json(path) in payloads.values()
    assert [p.name for p in tmp_path.iterdir()] == ["shared.json"]


# ------------------------------------------------------------- bit-for-bit resume


class DropoutNet(nn.Module):
    """Dropout makes every step draw from the global RNG: a resume must restore it."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(), nn.Linear(64, 48), nn.ReLU(), nn.Dropout(0.3), nn.Linear(48, 10)
        )

    def forward(self, x):
        return self.net(x)


CFG = TrainConfig(epochs=3, batch_size=128, lr=0.1, momentum=0.0, seed=5)


def dropout_topk_setup():
    """TopK with error feedback and DGC momentum correction over a dropout net, a
    seeded shuffling loader and the cosine schedule, built as a fresh process would."""
    torch.manual_seed(1)
    model = DropoutNet().train()
    sgd = torch.optim.SGD(model.parameters(), lr=CFG.lr, weight_decay=1e-4)
    opt = TopK(sgd, density=0.05, error_feedback=True, momentum_correction=0.9)
    data = loader(DS.train, batch_size=CFG.batch_size, shuffle=True, seed=CFG.seed)
    return Setup(model, model, opt, make_scheduler(opt, CFG), data)


class StopAtStep:
    """A training forward pre-hook: KeyboardInterrupt at the ``n``-th training step
    (mid-epoch: the partial epoch is lost and must be redone exactly)."""

    def __init__(self, n):
        self.n, self.count = n, 0

    def __call__(self, module, args):
        if module.training:
            self.count += 1
            if self.count == self.n:
                raise KeyboardInterrupt


def test_resume_after_a_mid_epoch_interrupt_is_bit_for_bit_with_topk_mc_and_dropout(tmp_path):
    full_setup = dropout_topk_setup()
    full = train_run(full_setup, CFG, DS.test, checkpoint_dir=tmp_path / "full")
    steps_per_epoch = len(full_setup.data)
    assert steps_per_epoch >= 3

    # cut 1: in the middle of epoch 2 (the checkpoint holds epoch 1)
    cut = dropout_topk_setup()
    cut.model.register_forward_pre_hook(StopAtStep(steps_per_epoch + 2))
    with pytest.raises(KeyboardInterrupt):
        train_run(cut, CFG, DS.test, checkpoint_dir=tmp_path / "cut")
    assert saved(tmp_path / "cut")["epoch"] == 1
    # cut 2: after the resumed run has done one more step of epoch 2
    cut = dropout_topk_setup()
    cut.model.register_forward_pre_hook(StopAtStep(1))
    with pytest.raises(KeyboardInterrupt):
        train_run(cut, CFG, DS.test, checkpoint_dir=tmp_path / "cut")
    resumed_setup = dropout_topk_setup()
    resumed = train_run(resumed_setup, CFG, DS.test, checkpoint_dir=tmp_path / "cut")

    a, b = saved(tmp_path / "full"), saved(tmp_path / "cut")
    assert a["epoch"] == b["epoch"] == 3
    for key in ("model", "optimizer", "scheduler", "ranks"):
        assert_same_tree(a[key], b[key], key)
    assert_same_tree(full_setup.model.state_dict(), resumed_setup.model.state_dict(), "live")
    assert_same_tree(
        full_setup.optimizer.state_dict(), resumed_setup.optimizer.state_dict(), "live opt"
    )
    states = list(b["optimizer"]["state"].values())
    assert any(s["residual"].any() for s in states), "error feedback was exercised"
    assert any(
        t.any() for s in states for name, t in s.items() if "veloc" in name or "moment" in name
    ), f"momentum correction was exercised: {sorted(states[0])}"
    assert untimed(full["history"]) == untimed(resumed["history"])
    assert full["test_accuracy"] == resumed["test_accuracy"]
    # the global RNG (dropout) continues where the uninterrupted run's does
    assert torch.equal(a["ranks"][0]["rng"], b["ranks"][0]["rng"])


@pytest.fixture
def gloo_world_of_one():
    """A one-rank gloo group in this process: DDP and its comm hooks, no spawn."""
    import torch.distributed as dist

    from gradsift.lab.launch import free_port

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "comm",
    [
        "topk-dgc",
        "powersgd",
    ],
)
def test_ddp_hook_state_resumes_bit_for_bit(tmp_path, monkeypatch, gloo_world_of_one, comm):
    """The DDP comm hook's state (top-k residual, DGC velocity and warm-up counter;
    PowerSGD's error feedback, P/Q memories and sketching RNG) through the checkpoint."""
    from gradsift.lab.models import build_model
    from gradsift.lab.parallel import ddp_setup

    cfg = TrainConfig(epochs=3, batch_size=256, density=0.05, comm=comm, seed=2)

    def setup():
        torch.manual_seed(2)
        model = build_model("mlp", input_shape=DS.input_shape, num_classes=10)
        return ddp_setup(model, DS.train, cfg, 0, 1)

    full_setup = setup()
    full = train_run(full_setup, cfg, DS.test, checkpoint_dir=tmp_path / "full")
    stopped_after_save(
        monkeypatch, lambda: train_run(setup(), cfg, DS.test, checkpoint_dir=tmp_path / "cut")
    )
    resumed_setup = setup()
    resumed = train_run(resumed_setup, cfg, DS.test, checkpoint_dir=tmp_path / "cut")
    a, b = saved(tmp_path / "full"), saved(tmp_path / "cut")
    for key in ("model", "optimizer", "scheduler", "ranks"):
        assert_same_tree(a[key], b[key], key)
    hook = b["ranks"][0]["hook"]
    tensors = [
        t
        for v in hook.values()
        for t in (v.values() if isinstance(v, dict) else [v])
        if isinstance(t, torch.Tensor)
    ]
    assert any(t.any() for t in tensors if t.is_floating_point()), "hook memory exercised"
    assert untimed(full["history"]) == untimed(resumed["history"])
    assert full_setup.hook_state.compression_ratio == resumed_setup.hook_state.compression_ratio


def test_plain_sgd_resume_via_the_cli_with_unicode_and_space_paths(tmp_path, capsys):
    """``gradsift train --checkpoint DIR --out DIR`` under a unicode path with spaces:
    a finished checkpoint is resumed (no epoch redone), the result equals the first."""
    ck, out = tmp_path / "ck ü ß 東京", tmp_path / "out é ñ"
    argv = ["train", "--model", "mlp", "--epochs", "2", "--batch-size", "256", "--seed", "3"]
    assert cli.main([*argv, "--checkpoint", str(ck), "--out", str(out)]) == 0
    first = json.loads((out / "result.json").read_text())
    assert saved(ck)["epoch"] == 2
    mtime = (ck / checkpoint.FILENAME).stat().st_mtime_ns
    assert cli.main([*argv, "--checkpoint", str(ck), "--out", str(out)]) == 0
    again = json.loads((out / "result.json").read_text())
    assert (ck / checkpoint.FILENAME).stat().st_mtime_ns == mtime, "no epoch was redone"
    assert untimed(again["history"]) == untimed(first["history"])
    assert again["test_accuracy"] == first["test_accuracy"]
    assert not temporaries(tmp_path)
    capsys.readouterr()


def test_a_checkpoint_of_another_configuration_is_not_resumed_silently(tmp_path, capsys):
    ck = tmp_path / "ck"
    base = ["train", "--model", "mlp", "--epochs", "1", "--batch-size", "256"]
    assert cli.main([*base, "--density", "0.05", "--checkpoint", str(ck)]) == 0
    sparse_acc = saved(ck)["history"][-1]["accuracy"]
    code, err = run_cli([*base, "--checkpoint", str(ck), "--out", str(tmp_path)], capsys)
    if code == 0:  # accepted: then it must at least be the dense run's own result
        record = json.loads((tmp_path / "result.json").read_text())
        dense = runs.run_one(RunSpec(model="mlp", train=TrainConfig(epochs=1, batch_size=256)))
        assert record["grad_density"] == 1.0
        assert record["test_accuracy"] == dense["test_accuracy"] != sparse_acc
    else:
        assert code == 2 and len(err) == 1 and "checkpoint" in err[0], err


def test_a_checkpoint_of_another_model_is_a_one_line_error(tmp_path, capsys):
    ck = str(tmp_path / "ck")
    base = ["train", "--epochs", "1", "--batch-size", "256", "--checkpoint", ck]
    assert cli.main([*base, "--model", "mlp"]) == 0
    capsys.readouterr()
    code, err = run_cli([*base, "--model", "lenet5"], capsys)
    assert code == 2 and len(err) == 1 and "checkpoint" in err[0], err


# ----------------------------------------------------------------- argument errors


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "iteration", "--device", "bogus", "--repeats", "1"],
        ["bench", "prune-memory", "--device", "bogus", "--width", "8", "--depth", "1"],
        pytest.param(
            ["bench", "iteration", "--device", "cuda", "--repeats", "1"],
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs no GPU"),
        ),
        pytest.param(
            ["bench", "prune-memory", "--device", "cuda", "--width", "8", "--depth", "1"],
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs no GPU"),
        ),
    ],
    ids=["iteration-bogus", "prune-memory-bogus", "iteration-cuda", "prune-memory-cuda"],
)
def test_bench_device_errors_are_one_line_naming_the_device(argv, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2 and len(err) == 1 and "device" in err[0].lower(), (code, err[-3:])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "select", "--device", "bogus"], "--device"),
        (["bench", "score", "--device", "cuda"], "--device"),
        (["bench", "select", "--sizes", "5,0"], "--sizes"),
        (["bench", "select", "--repeats", "-1"], "--repeats"),
        (["bench", "ddp", "--bandwidth", "fast"], "--bandwidth"),
        (["bench", "nothing"], "invalid choice"),
        (["experiment", "nothing"], "invalid choice"),
        (["sweep", "--sparsities", "0.5,1"], "--sparsities"),
        (["sweep", "--allocations", "global,nope"], "--allocations"),
        (["sweep", "--sanity", "invert,nope"], "--sanity"),
        (["train", "--batch-size", "0"], "--batch-size"),
        (["train", "--epochs", "1.5"], "--epochs"),
        (["train", "--fsdp"], "--fsdp"),
        (["train", "--nproc", "2", "--fsdp", "--checkpoint", "x"], "--checkpoint"),
        (["demo", "--density", "2"], "density"),
        (["prune"], "--method"),
        (["train", "--no-such-flag"], "--no-such-flag"),
    ],
)
def test_bad_arguments_are_one_line_exit_2_without_work(argv, message, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2 and len(err) == 1 and message in err[0], (code, err[-3:])


def test_topk_dgc_without_density_is_refused_before_any_rank_starts(monkeypatch, capsys):
    from gradsift.lab import launch

    started = []

    def no_spawn(fn, args, nproc):
        started.append(nproc)
        raise launch.RankFailedError("rank 0 failed: (processes were started)")

    monkeypatch.setattr(launch, "run_processes", no_spawn)
    code, err = run_cli(["train", "--comm", "topk-dgc", "--nproc", "2", "--model", "mlp"], capsys)
    assert started == [], "ranks were started for a bad argument combination"
    assert code == 2 and len(err) == 1 and "density" in err[0], (code, err)


@pytest.mark.parametrize("content", ['{"runs": [1]}', '{"runs": [{"a": 1}]}', '{"runs": [null]}'])
def test_a_results_file_with_bad_runs_is_a_one_line_error_naming_it(
    tmp_path, monkeypatch, capsys, content
):
    (tmp_path / "results.json").write_text(content)
    monkeypatch.setattr(runs, "run_one", lambda spec, **kw: fake_record(spec))
    argv = ["sweep", "--methods", "magnitude", "--sparsities", "0.5", "--seeds", "0"]
    code, err = run_cli([*argv, "--model", "mlp", "--out", str(tmp_path)], capsys)
    assert code == 2 and len(err) == 1 and str(tmp_path / "results.json") in err[0], (code, err)
    assert (tmp_path / "results.json").read_text() == content, "the file is left as it was"


def test_a_bad_seed_in_a_list_says_integer(capsys):
    code, err = run_cli(["sweep", "--seeds", "0,x"], capsys)
    assert code == 2 and len(err) == 1 and "--seeds" in err[0]
    assert "parse_list" not in err[0] and "int" in err[0], err


def _subcommands(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_help_of_every_subcommand(capsys):
    """Every subcommand (read from the parser itself) prints its help and exits 0."""
    subs = _subcommands(cli.build_parser())
    assert {"demo", "prune", "train", "sweep", "experiment", "bench"} <= set(subs)
    for name, sub in subs.items():
        with pytest.raises(SystemExit) as exc:
            cli.build_parser().parse_args([name, "--help"])
        out = capsys.readouterr().out
        assert exc.value.code == 0 and out.startswith(f"usage: gradsift {name}"), name
        for action in sub._actions:  # every option is documented
            for option in action.option_strings:
                assert option in out, (name, option)
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and all(name in out for name in subs), out


# ------------------------------------------------------------------------ benches


def test_bench_select_tiny_ratios_are_of_times_measured_in_the_same_run(tmp_path, capsys):
    path = tmp_path / "bénch résults" / "select.json"
    argv = ["bench", "select", "--device", "cpu", "--sizes", "700,3000"]
    assert cli.main([*argv, "--repeats", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    rows = json.loads(path.read_text())["rows"]
    assert [(r["n"], r["k"]) for r in rows] == [(700, 1), (700, 7), (700, 700), (3000, 3),
                                               (3000, 30), (3000, 1000)]  # fmt: skip
    for r in rows:
        assert r["speedup_vs_topk"] == pytest.approx(r["torch_topk_ms"] / r["ours_ms"])
        assert r["ours_over_abs_pass"] == pytest.approx(r["ours_ms"] / r["abs_pass_ms"])
        assert f"{r['speedup_vs_topk']:.1f}" in out
    assert "topk/ours" in out and not temporaries(tmp_path)


def test_bench_step_and_ties_on_tiny_shapes_report_ratios_of_their_own_rounds():
    """The functions behind ``bench step`` and ``bench ties`` (whose CLI has no size
    option) at tiny sizes: every row is there, the selection rows' ratio is of the
    two times of the same row."""
    from gradsift.lab.bench.step import bench_step
    from gradsift.lab.bench.ties import bench_ties

    shapes = [(30, 31), (7,), (400,)]
    step = bench_step(repeats=3, shapes=shapes)
    assert [r["density"] for r in step] == [0.001, 0.01]
    for r in step:
        assert r["n"] == 30 * 31 + 7 + 400 and 1 <= r["k"] <= r["n"]
        assert r["ours_over_dense"] > 0
        assert r["naive_over_ours"] > 0
    ties = bench_ties(n=20_000, repeats=1, shapes=shapes)
    assert {r["case"].split(" ")[0] for r in ties} == {"select", "TopK"}
    for r in ties:
        if r["case"].startswith("select"):
            assert r["ours_over_base"] == pytest.approx(r["ours_ms"] / r["baseline_ms"])


# ------------------------------------------------------------- sweeps and studies


def test_distinct_sparsities_are_distinct_runs_of_a_sweep(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "run_one", lambda spec, **kw: fake_record(spec))
    sparsities = [1 - 10**-6, 1 - 10**-6.25]  # 0.999999 and 0.99999944
    specs = [RunSpec(model="mlp", method="magnitude", sparsity=s) for s in sparsities]
    results = runs.run_sweep(specs, tmp_path / "results.json")
    assert sorted(r["sparsity"] for r in results) == sorted(sparsities)


def test_runs_on_other_data_folders_are_distinct_runs(tmp_path, monkeypatch):
    """Two CIFAR folders are two datasets: a sweep (and a checkpoint) must not take
    one's result for the other's. A folder given for an embedded dataset is refused."""
    monkeypatch.setattr(runs, "run_one", lambda spec, **kw: fake_record(spec))
    specs = [RunSpec(model="mlp", dataset="cifar10", data_root=str(tmp_path / d)) for d in "ab"]
    results = runs.run_sweep(specs, tmp_path / "results.json")
    assert len(results) == 2 and results[0]["key"] != results[1]["key"]
    monkeypatch.chdir(tmp_path)
    assert RunSpec(data_root="a").key() == RunSpec(data_root=str(tmp_path / "a")).key()
    with pytest.raises(ValueError, match="--data-root is for .*'digits' is embedded"):
        load_dataset("digits", root=str(tmp_path))


def test_rerun_of_a_finished_sweep_redoes_nothing_and_reorders_nothing(tmp_path, monkeypatch):
    calls = []

    def fake(spec, **kw):
        calls.append(spec.key())
        return fake_record(spec, accuracy=0.1 * len(calls))

    monkeypatch.setattr(runs, "run_one", fake)
    specs = [
        RunSpec(model="mlp", method=m, sparsity=s, seed=seed, sanity=v)
        for m in ("magnitude", "random")
        for s in (0.5, 0.9)
        for seed in (0, 1)
        for v in (None, "invert")
    ]
    path = tmp_path / "a b" / "results.json"
    first = runs.run_sweep(specs, path)
    assert len(calls) == len(specs) == len({s.key() for s in specs})
    calls.clear()
    assert runs.run_sweep(list(reversed(specs)), path) == first and calls == []
    # a new spec runs alone and is appended; the file is the returned list
    extra = RunSpec(model="mlp", method="magnitude", sparsity=0.7)
    after = runs.run_sweep([*specs, extra], path)
    assert calls == [extra.key()] and after[:-1] == first
    assert load_results(path) == after and not temporaries(tmp_path)


def _topk_study(out, monkeypatch, accuracy):
    from gradsift.lab.studies import run_study

    monkeypatch.setattr(runs, "run_one", lambda spec, **kw: fake_record(spec, accuracy(spec)))
    result = run_study("topk", out, quick=True, command="x")
    return result, (Path(out) / "topk.md").read_text()


def test_a_study_table_holds_only_its_own_runs(tmp_path, monkeypatch):
    def acc(spec):
        return 0.9

    clean, clean_md = _topk_study(tmp_path / "clean", monkeypatch, acc)
    # the same folder after a full (20-epoch, 3-seed) run of the study: other keys
    other = tmp_path / "after full"
    other.mkdir()
    full = [
        fake_record(RunSpec(model="mlp", seed=s, train=TrainConfig(epochs=20)), 0.1)
        for s in (0, 1, 2)
    ]
    (other / "topk_runs.json").write_text(json.dumps({"runs": full}))
    mixed, mixed_md = _topk_study(other, monkeypatch, acc)
    assert len(mixed["runs"]) == len(clean["runs"])
    assert mixed_md == clean_md


def test_topk_quick_study_is_reproducible_and_a_rerun_trains_nothing(tmp_path, monkeypatch):
    """The real quick ``topk`` study twice from scratch: the same table and runs; then
    a rerun in a finished folder trains nothing and writes the same table."""
    from gradsift.lab.studies import run_study

    a = run_study("topk", tmp_path / "a", quick=True, command="c")
    b = run_study("topk", tmp_path / "b", quick=True, command="c")
    assert (tmp_path / "a" / "topk.md").read_text() == (tmp_path / "b" / "topk.md").read_text()

    def stable(result):
        keep = ("key", "test_accuracy", "test_loss", "kept", "total", "compression_ratio")
        return sorted(tuple(r[k] for k in keep) for r in result["runs"])

    assert stable(a) == stable(b) and len(a["runs"]) == 7
    monkeypatch.setattr(runs, "run_one", lambda *a, **k: pytest.fail("retrained a run"))
    c = run_study("topk", tmp_path / "a", quick=True, command="c")
    assert stable(c) == stable(a)
    assert (tmp_path / "a" / "topk.md").read_text() == (tmp_path / "b" / "topk.md").read_text()
    assert not temporaries(tmp_path)


def test_recorded_study_command_reruns_with_a_spaced_out_folder(tmp_path, monkeypatch, capsys):
    import gradsift.lab.studies as studies

    seen = {}

    def fake_study(name, out, *, quick, command, jobs):
        seen["command"] = command
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.md").write_text("table\n")
        return {}

    monkeypatch.setattr(studies, "run_study", fake_study)
    out = str(tmp_path / "my results")
    assert cli.main(["experiment", "topk", "--quick", "--out", out]) == 0
    capsys.readouterr()
    argv = shlex.split(seen["command"])
    assert argv[0] == "gradsift"
    again = cli.build_parser().parse_args(argv[1:])
    assert again.out == out and again.study == "topk" and again.quick


def test_prune_out_in_a_unicode_folder_matches_an_independent_count(tmp_path, capsys):
    out = tmp_path / "pruned → ü 1"
    argv = ["prune", "--model", "mlp", "--method", "magnitude", "--sparsity", "0.75"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    masks = torch.load(out / "masks.pt", weights_only=True)
    total = sum(m.numel() for m in masks.values())
    kept = sum(int(m.sum()) for m in masks.values())
    assert (report["total"], report["kept"]) == (total, kept)
    assert total - kept == round(0.75 * total)
    # magnitude keeps the largest |w| of the seeded initial model (ties aside)
    from gradsift.lab.models import build_model

    torch.manual_seed(0)
    model = build_model("mlp", input_shape=DS.input_shape, num_classes=10)
    weights = {n: p.detach() for n, p in model.named_parameters() if n in masks}
    assert set(weights) == set(masks)
    flat = torch.cat([w.abs().flatten() for w in weights.values()])
    cut = flat.sort(descending=True).values[kept - 1]
    for name, w in weights.items():
        assert bool((w.abs()[masks[name]] >= cut).all()), name
        assert bool((w.abs()[~masks[name]] <= cut).all()), name
    assert not temporaries(tmp_path)

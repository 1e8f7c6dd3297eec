"""The command line end to end on tiny settings."""

import json
import os
import subprocess
import sys

import pytest
import torch

import gradsift
from cli_support import run_cli
from gradsift.lab import cli, plots, runs
from gradsift.pruning import layer_counts

PNG = b"\x89PNG\r\n\x1a\n"


def test_demo_writes_table_json_and_png(tmp_path, capsys, monkeypatch):
    panels, real = [], plots.plot_hbars

    def plot(p, *args, **kwargs):
        panels.extend(p)
        return real(p, *args, **kwargs)

    monkeypatch.setattr(plots, "plot_hbars", plot)
    argv = ["demo", "--out", str(tmp_path), "--epochs", "1", "--sparsity", "0.9"]
    assert cli.main([*argv, "--density", "0.004"]) == 0
    out = capsys.readouterr().out
    assert "test acc" in out and "synflow" in out and "error feedback" in out
    assert "0.4% of gradient coordinates" in out  # not "0%"
    assert [title for title, *_ in panels] == [
        "1. pruned at init to 90% sparsity, dense updates",  # one sparsity: no legend
        "2. unpruned, top 0.4% gradient coordinates",
    ]
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["method"] for r in data["runs"]} == {"unpruned", *gradsift.list_methods()}
    png = (tmp_path / "demo.png").read_bytes()
    assert png.startswith(PNG) and len(png) > 1000


def test_prune_command(tmp_path, capsys):
    assert (
        cli.main(
            [
                "prune",
                "--method",
                "synflow",
                "--sparsity",
                "0.5",
                "--iterations",
                "3",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["total"] - report["kept"] == round(0.5 * report["total"])
    assert (tmp_path / "masks.pt").stat().st_size > 0
    assert "features.0.weight" in capsys.readouterr().out


def test_train_command(tmp_path):
    assert (
        cli.main(
            [
                "train",
                "--method",
                "snip",
                "--sparsity",
                "0.5",
                "--epochs",
                "1",
                "--density",
                "0.1",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["grad_density"] == 0.1 and 0.0 <= record["test_accuracy"] <= 1.0


def _sweep_args(tmp_path):
    return [
        "sweep",
        "--methods",
        "magnitude,random",
        "--sparsities",
        "0.5,0.8",
        "--seeds",
        "0",
        "--epochs",
        "1",
        "--out",
        str(tmp_path),
    ]


def test_sweep_resumes_and_plots(tmp_path, monkeypatch):
    assert cli.main(_sweep_args(tmp_path)) == 0
    first = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert len(first) == 4
    png = (tmp_path / "accuracy_vs_sparsity.png").read_bytes()
    assert png.startswith(PNG) and len(png) > 1000
    calls = []
    monkeypatch.setattr(runs, "run_one", lambda spec, **kw: calls.append(spec))
    assert cli.main(_sweep_args(tmp_path)) == 0
    assert calls == [], "finished runs must be skipped"
    # another sweep into the same folder plots and counts its own runs only
    monkeypatch.undo()
    plotted = []
    monkeypatch.setattr(plots, "plot_accuracy_vs_sparsity", lambda rs, *a, **k: plotted.append(rs))
    other = [*_sweep_args(tmp_path), "--methods", "magnitude", "--sparsities", "0.5"]
    other += ["--seeds", "1"]
    assert cli.main(other) == 0
    assert [(r["method"], r["seed"]) for r in plotted[0]] == [("magnitude", 1)]
    assert len(json.loads((tmp_path / "results.json").read_text())["runs"]) == 5


def test_interrupted_sweep_leaves_valid_json(tmp_path, monkeypatch):
    real = runs.run_one
    count = []

    def flaky(spec, **kw):
        count.append(spec)
        if len(count) == 2:
            raise KeyboardInterrupt
        return real(spec, **kw)

    monkeypatch.setattr(runs, "run_one", flaky)
    assert cli.main(_sweep_args(tmp_path)) == 130
    data = json.loads((tmp_path / "results.json").read_text())
    assert len(data["runs"]) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(runs, "run_one", real)
    assert cli.main(_sweep_args(tmp_path)) == 0
    assert len(json.loads((tmp_path / "results.json").read_text())["runs"]) == 4


def test_bench_select_json(tmp_path, capsys):
    path = tmp_path / "b.json"
    assert (
        cli.main(["bench", "select", "--sizes", "70000", "--repeats", "1", "--json", str(path)])
        == 0
    )
    rows = json.loads(path.read_text())["rows"]
    assert {r["k"] for r in rows} == {70, 700, 1000}
    assert "topk/ours" in capsys.readouterr().out


@pytest.mark.parametrize(
    "what, argv, expected",
    [
        ("ddp", ["--steps", "5", "--batch", "2"], {"bandwidth": None, "steps": 5, "batch": 2}),
        ("ddp", [], {"bandwidth": None}),  # the bench's own defaults
        ("prune-memory", ["--network", "gpt2"], {"device": "cpu", "network": "gpt2"}),
        ("prune-memory", [], {"device": "cpu"}),
    ],
)
def test_bench_passes_the_options_given(what, argv, expected, monkeypatch, capsys):
    from gradsift.lab.bench import BENCHES

    seen = []
    monkeypatch.setitem(BENCHES, what, (lambda **kw: seen.append(kw) or [], []))
    assert cli.main(["bench", what, *argv]) == 0
    assert seen == [expected]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--sparsity", "1.5"], "sparsity must be in [0, 1)"),
        (["train", "--density", "0"], "density must be in (0, 1]"),
        (["train", "--model", "alexnet"], "invalid choice"),
        (["prune", "--method", "l1"], "invalid choice"),
        (["sweep", "--methods", "snip,l1"], "unknown ['l1']"),
        (
            ["prune", "--method", "snip", "--budget", "ERK"],
            "allocation must be one of ['global', 'uniform', 'er', 'erk', 'uniform+dense-first']",
        ),
        (["sweep", "--budgets", "erk,bogus"], "allocation must be one of ['global', 'uniform'"),
        (["train", "--sanity", "shuffle"], "sanity must be one of ['reinit', 'invert'"),
        (["train", "--dataset", "cifar10"], "needs --data-root"),
        (["train", "--dataset", "cifar10", "--data-root", "/nonexistent"], "never downloads"),
        (["experiment", "collapse", "--jobs", "2"], "--jobs is for the studies"),
        (["sweep", "--jobs", "0"], "jobs"),
        (["sweep", "--sparsities", ""], "expected at least one value, got ''"),
        (["sweep", "--methods", ","], "expected at least one value, got ','"),  # not all ten
        (["demo", "--sparsities", ""], "expected at least one value"),
        (["bench", "step", "--sizes", "1000"], "--sizes is for bench select or sharded, not step"),
        (["bench", "score", "--width", "8"], "--width is for bench prune-memory, not score"),
        (["bench", "select", "--model", "mlp"], "--model is for bench ddp, not select"),
        (["bench", "ddp", "--repeats", "3"], "--repeats is for bench select or"),
        (["bench", "select", "--steps", "5"], "--steps is for bench ddp, not select"),
        (["bench", "step", "--batch", "4"], "--batch is for bench ddp, not step"),
        (["bench", "score", "--network", "gpt2"], "--network is for bench prune-memory, not score"),
        (["bench", "ddp", "--model", "vgg"], "argument --model: invalid choice: 'vgg'"),
        # options that would be ignored, and recorded as if applied
        (["train", "--sparsity", "0.5"], "--sparsity prune at init: add --method"),
        (["train", "--sanity", "invert", "--allocation", "erk"], "--allocation, --sanity prune"),
        (["train", "--comm", "topk"], "--comm is the gradient communication between ranks"),
        (["train", "--comm", "topk", "--nproc", "2"], "comm='topk' needs a density"),
        (["train", "--comm", "fp16", "--nproc", "2", "--density", "0.1"], "sends dense"),
        (["train", "--comm", "topk-dgc", "--nproc", "2", "--density", "0.1",
          "--no-error-feedback"], "topk-dgc is DGC's recipe, with error feedback"),
        (["train", "--no-error-feedback"], "--no-error-feedback is for top-k training"),
        # refused before any rank starts (a rank raised it, exit 1)
        (["train", "--fsdp", "--nproc", "2", "--method", "grasp"],
         "--method grasp cannot score a sharded model (--fsdp)"),
        (["train", "--fsdp", "--nproc", "2", "--method", "snip", "--allocation", "erk"],
         "--allocation erk: --fsdp prunes with global only"),
        (["train", "--fsdp", "--nproc", "2", "--method", "snip", "--sanity", "invert"],
         "--sanity invert is not supported with --fsdp"),
        (["train", "--nproc", "2", "--comm", "fp16", "--no-error-feedback"], "for top-k"),
        (["train", "--out", __file__], "--out: " + __file__ + " is a file, not a folder"),
        (["train", "--checkpoint", __file__], "--checkpoint: "),
        (["prune", "--method", "snip", "--out", __file__], "is a file, not a folder"),
        (["sweep", "--no-error-feedback"], "--no-error-feedback is for top-k training"),
        (["train", "--data-root", os.path.dirname(__file__)], "'digits' is embedded"),
        (["bench", "ddp", "--steps", "3"], "--steps 3: the first 3 are not timed"),
        (["bench", "select", "--json", os.path.dirname(__file__)], "--json: "),
        (["bench", "select", "--json", __file__ + "/x/rows.json"], "is a file, not a folder"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2 and len(err) == 1 and message in err[0], err


def test_a_bad_argument_in_a_real_process_is_one_line_and_exit_2():
    """``python -m gradsift`` as a shell runs it: the entry point, not ``cli.main``."""
    proc = subprocess.run(
        [sys.executable, "-m", "gradsift", "train", "--sparsity", "1.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "sparsity must be in [0, 1)" in lines[0], proc.stderr


def _cifar_folder(root, content: bytes):
    folder = root / "cifar-10-batches-py"
    folder.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (folder / name).write_bytes(content)
    return str(root)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"this is not a pickle", "data_batch_1"),
        (b"", "data_batch_1"),
        (__import__("pickle").dumps([1, 2, 3]), "data_batch_1"),
        (__import__("pickle").dumps({b"labels": [0]}), "data_batch_1"),
    ],
    ids=["garbage", "empty", "list", "no-data"],
)
def test_bad_cifar_folder_is_one_line_naming_the_file(tmp_path, capsys, content, message):
    root = _cifar_folder(tmp_path, content)
    code, err = run_cli(
        ["prune", "--method", "magnitude", "--dataset", "cifar10", "--data-root", root], capsys
    )
    assert code == 2 and len(err) == 1 and message in err[0] and "CIFAR" in err[0], err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--device", "bogus"], "--device"),
        (["train", "--device", "cuda"], "CUDA"),
        (["bench", "select", "--sizes", "10,-5"], "positive integer"),
        (["train", "--lr", "nan"], "lr must be in (0, 3.4e38]"),
        (["train", "--lr", "-1"], "lr must be in (0, 3.4e38]"),
        (["train", "--lr", "1e39"], "lr must be in (0, 3.4e38]"),  # SGD's overflow before
        (["train", "--seed", "9" * 23], "argument --seed: must be an integer in [0, 2**63 - 1]"),
        (["sweep", "--seeds", "1,-2"], "argument --seeds/--seed: must be an integer in"),
    ],
)
def test_more_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("content", ['{"runs": [', "[1, 2]", '{"runs": 3}'])
def test_bad_results_file_names_it(tmp_path, capsys, content):
    (tmp_path / "results.json").write_text(content)
    code, err = run_cli(_sweep_args(tmp_path), capsys)
    assert code == 2 and len(err) == 1 and str(tmp_path / "results.json") in err[0], err


def test_verbose_after_the_subcommand_and_defaults_in_help(capsys, tmp_path):
    args = cli.build_parser().parse_args(["prune", "--method", "snip", "-v"])
    assert args.verbose
    assert not cli.build_parser().parse_args(["prune", "--method", "snip"]).verbose
    assert cli.build_parser().parse_args(["-v", "prune", "--method", "snip"]).verbose
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train", "--help"])
    assert "(default: 0.05)" in capsys.readouterr().out


def test_sweep_singular_flags_are_used_not_ignored():
    args = cli.build_parser().parse_args(
        ["sweep", "--method", "snip", "--sparsity", "0.7", "--seed", "5"]
    )
    assert args.methods == ["snip"] and args.sparsities == [0.7] and args.seeds == [5]
    assert not hasattr(args, "seed")  # (it was a second option, ignored: --seeds ran)


def test_a_file_that_is_no_gradsift_checkpoint_is_one_line(tmp_path, capsys):
    torch.save({"something": 1}, tmp_path / "checkpoint.pt")
    argv = ["train", "--model", "mlp", "--epochs", "1", "--checkpoint", str(tmp_path)]
    code, err = run_cli(argv, capsys)
    assert code == 2 and len(err) == 1 and "is not a gradsift checkpoint" in err[0], err


@pytest.mark.parametrize("option", ["--allocation", "--budget"])
def test_prune_with_an_allocation_and_a_sanity_variant(tmp_path, capsys, option):
    argv = ["prune", "--method", "snip", "--sparsity", "0.9", option, "erk"]
    assert cli.main([*argv, "--sanity", "invert", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert ("--budget is deprecated; use --allocation" in err) == (option == "--budget")
    report = json.loads((tmp_path / "report.json").read_text())
    masks = torch.load(tmp_path / "masks.pt")
    shapes = {n: m.shape for n, m in masks.items()}
    assert {x["name"]: x["kept"] for x in report["layers"]} == layer_counts(shapes, 0.9, "erk")


def test_sweep_over_allocations_and_sanity_variants(tmp_path, monkeypatch):
    specs = []
    monkeypatch.setattr(runs, "run_one", lambda spec, **kw: specs.append(spec) or _fake(spec))
    argv = ["sweep", "--methods", "snip", "--sparsities", "0.8,0.9", "--seeds", "0"]
    argv += ["--allocations", "global,erk", "--shuffle", "--sanity", "shuffle-layer,invert"]
    assert cli.main([*argv, "--out", str(tmp_path)]) == 0
    got = [(s.sparsity, s.allocation, s.variant) for s in specs]
    variants = (None, "shuffle-layer", "invert")  # --shuffle and shuffle-layer: one run
    assert got == [(s, b, v) for s in (0.8, 0.9) for b in ("global", "erk") for v in variants]


def _fake(spec):
    return {
        "key": spec.key(),
        "method": spec.method,
        "sparsity": spec.sparsity,
        "seed": spec.seed,
        "allocation": spec.allocation,
        "sanity": spec.variant,
        "shuffle": spec.variant == "shuffle-layer",
        "test_accuracy": 0.5,
    }


@pytest.mark.parametrize("quick", [False, True])
def test_a_quick_experiment_never_writes_over_the_committed_results(tmp_path, monkeypatch, quick):
    from gradsift.lab import studies

    written = []

    def study(name, out, *, quick, command, jobs):
        written.append((str(out), command))
        (tmp_path / out).mkdir(parents=True, exist_ok=True)
        (tmp_path / out / f"{name}.md").write_text("table")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(studies, "run_study", study)
    assert cli.main(["experiment", "topk", *(["--quick"] if quick else [])]) == 0
    out = "gradsift-quick" if quick else "docs/results"
    assert written == [(out, "gradsift experiment topk" + " --quick" * quick)]

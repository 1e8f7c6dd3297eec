"""Data-parallel runs end to end: ``gradsift train --nproc 2`` (2 gloo processes),
its checkpoint/resume, and the torchrun path. A command run as a process of its own
runs under a deadline; one run from the test's process (``run_cli``, whose ranks fork
from its warm server) under its ranks' gloo timeouts."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from cli_support import run_cli
from gradsift.lab import checkpoint

DEADLINE_S = 240
TRAIN = ["train", "--model", "lenet5", "--method", "snip", "--sparsity", "0.5", "--density", "0.05"]


def gradsift(*args, timeout=DEADLINE_S):
    proc = subprocess.run(
        [sys.executable, "-m", "gradsift", *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _interrupt_after_first_checkpoint(args, directory):
    """Start ``gradsift args``; kill its whole process group once a checkpoint exists."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gradsift", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + DEADLINE_S
    path = directory / checkpoint.FILENAME
    try:
        while not path.exists():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within the deadline"
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_train_nproc_2_writes_one_record_and_resumes_as_if_uninterrupted(tmp_path, capsys):
    """The uninterrupted and the resumed runs are started from this process (its fork
    server is warm: 9 s less); the interrupted one is a process of its own to kill."""
    args = [*TRAIN, "--epochs", "3", "--batch-size", "8", "--nproc", "2"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert run_cli([*args, "--checkpoint", str(full), "--out", str(tmp_path)], capsys)[0] == 0
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["world_size"] == 2 and record["method"] == "snip"
    # 2 of its steps dense warm-up: well above 1, far below a compressed step's 33
    assert record["compression_ratio"] > 2 and 0.0 <= record["test_accuracy"] <= 1.0
    assert len(record["history"]) == 3
    _interrupt_after_first_checkpoint([*args, "--checkpoint", str(cut)], cut)
    interrupted = torch.load(cut / checkpoint.FILENAME, weights_only=True)
    assert interrupted["epoch"] < 3, "the run must have been cut short"
    assert run_cli([*args, "--checkpoint", str(cut)], capsys)[0] == 0
    a = torch.load(full / checkpoint.FILENAME, weights_only=True)
    b = torch.load(cut / checkpoint.FILENAME, weights_only=True)
    assert a["epoch"] == b["epoch"] == 3
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    for ra, rb in zip(a["ranks"], b["ranks"]):
        assert ra["hook"]["layout"] == rb["hook"]["layout"]
        assert ra["hook"]["residual"].any() and torch.equal(
            ra["hook"]["residual"], rb["hook"]["residual"]
        )
    assert [h["accuracy"] for h in a["history"]] == [h["accuracy"] for h in b["history"]]


def test_torchrun_path(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "gradsift",
        ]
        + [*TRAIN, "--epochs", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["world_size"] == 2 and record["compression_ratio"] > 2


def test_every_rank_waits_for_the_others_before_tearing_down(monkeypatch):
    from gradsift.lab import launch

    calls = []
    monkeypatch.setattr(launch, "init_process_group", lambda *a: calls.append("init"))
    monkeypatch.setattr(launch, "run_one", lambda spec, **kw: calls.append("run") or {"r": 1})
    monkeypatch.setattr(launch.dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(launch.dist, "destroy_process_group", lambda: calls.append("destroy"))
    assert launch.run_rank(launch.RunSpec(), rank=1, world=2) is None
    assert calls == ["init", "run", "barrier", "destroy"]


def test_a_failing_rank_is_named_in_one_line():
    import ddp_workers
    from gradsift.lab import launch

    start = time.monotonic()
    with pytest.raises(
        launch.RankFailedError, match=r"^rank 1 failed: ValueError: bad input on rank 1$"
    ):
        launch.run_processes(ddp_workers.fail_on_rank_one, (launch.free_port(),), 2)
    assert time.monotonic() - start < 30, "the other rank must be stopped, not waited for"


def test_train_nproc_2_with_powersgd(tmp_path, capsys):
    dense = TRAIN[: TRAIN.index("--density")]  # PowerSGD takes no top-k density
    argv = [*dense, "--epochs", "1", "--nproc", "2", "--comm", "powersgd", "--out", str(tmp_path)]
    assert run_cli(argv, capsys)[0] == 0  # from this process, whose fork server is warm
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["world_size"] == 2 and record["compression_ratio"] > 1


def _run_rank_threads(monkeypatch, *, cpus: int, world: int, omp=None):
    """The thread count ``run_rank`` sets (None: it leaves torch's alone)."""
    from gradsift.lab import launch

    threads = []
    monkeypatch.setattr(launch, "init_process_group", lambda *a: None)
    monkeypatch.setattr(launch, "run_one", lambda spec, **kw: {"r": 1})
    monkeypatch.setattr(launch.dist, "barrier", lambda: None)
    monkeypatch.setattr(launch.dist, "destroy_process_group", lambda: None)
    monkeypatch.setattr(launch.os, "cpu_count", lambda: cpus)
    monkeypatch.setattr(launch.torch, "set_num_threads", threads.append)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    launch.run_rank(launch.RunSpec(), rank=0, world=world)
    return threads[-1] if threads else None


def test_local_ranks_share_the_cores_instead_of_each_taking_all(monkeypatch):
    # two ranks of two threads each on two cores made a digits step 5x slower
    # (allreduce 17 ms instead of 3.5 ms); torchrun sets OMP_NUM_THREADS=1 for this
    assert _run_rank_threads(monkeypatch, cpus=2, world=2) == 1
    assert _run_rank_threads(monkeypatch, cpus=16, world=4) == 4
    assert _run_rank_threads(monkeypatch, cpus=2, world=8) == 1


def test_a_thread_count_the_user_set_is_kept(monkeypatch):
    assert _run_rank_threads(monkeypatch, cpus=16, world=2, omp="3") is None


def test_train_fsdp_on_2_ranks_keeps_the_pruned_weights_at_zero(tmp_path):
    args = ["train", "--model", "lenet5", "--method", "magnitude", "--sparsity", "0.5"]
    args += ["--density", "0.05", "--epochs", "1", "--fsdp", "--ranks", "2"]
    proc = gradsift(*args, "--out", str(tmp_path), timeout=120)
    assert "sharded with FSDP2 on 2 ranks" in proc.stdout
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["world_size"] == 2 and record["sharded"] and record["key"].endswith("|fsdp")
    # counted as nonzero weights after training: the held masks kept the pruned ones at 0
    assert record["kept"] == record["total"] - round(0.5 * record["total"])
    assert 0.0 <= record["test_accuracy"] <= 1.0 and len(record["history"]) == 1


def test_train_fsdp_needs_several_ranks(capsys):
    code, err = run_cli(["train", "--fsdp", "--epochs", "1"], capsys)
    assert code == 2 and len(err) == 1 and "--fsdp shards over several ranks" in err[0], err

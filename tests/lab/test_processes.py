"""Ranks and workers start from the fork server, under their starter's environment."""

import multiprocessing
from pathlib import Path

import pytest

import ddp_workers
from gradsift.lab import launch, processes


@pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here"
)
def test_a_rank_sees_the_environment_of_when_it_was_started(tmp_path, monkeypatch):
    """The server keeps the environment of its own start; a rank must not: a variable
    set after the server started reaches the next ranks, one removed does not."""
    name, out = "GRADSIFT_TEST_PROCESSES", str(tmp_path / "env")
    monkeypatch.setenv(name, "before")
    launch.run_processes(ddp_workers.write_environ, (name, out), 2)  # the server runs now
    assert processes.context().get_start_method() == "forkserver"
    monkeypatch.setenv(name, "after")
    launch.run_processes(ddp_workers.write_environ, (name, out), 2)
    assert [Path(f"{out}{r}").read_text() for r in range(2)] == ["after", "after"]
    monkeypatch.delenv(name)
    launch.run_processes(ddp_workers.write_environ, (name, out), 2)
    assert [Path(f"{out}{r}").read_text() for r in range(2)] == ["unset", "unset"]

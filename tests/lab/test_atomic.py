"""Atomic result files."""

import json
import os
import stat

import pytest

from gradsift.lab.atomic import atomic_write_bytes, atomic_write_json, locked_folder, read_json


def test_write_and_read(tmp_path):
    path = tmp_path / "sub" / "r.json"
    assert read_json(path, default={"runs": []}) == {"runs": []}
    atomic_write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1} and read_json(path) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


def test_a_failed_write_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "r.json"
    atomic_write_json(path, {"a": 1})

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(path, b"{}")
    assert read_json(path) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left


@pytest.mark.parametrize("where", ["os.chmod", "os.stat", "os.replace"])
def test_a_failed_write_closes_its_file(tmp_path, monkeypatch, where):
    """Whatever step fails, the temporary file is closed and removed (a descriptor
    left open by each failed write would add up over a long sweep)."""
    path = tmp_path / "r.json"
    atomic_write_json(path, {"a": 1})
    real, fds = getattr(os, where.split(".")[1]), set(os.listdir("/proc/self/fd"))

    def boom(*args, **kwargs):
        if where != "os.stat" or str(args[0]) == str(path):  # stat: the old file's mode
            raise PermissionError("not allowed")
        return real(*args, **kwargs)

    monkeypatch.setattr(where, boom)
    with pytest.raises(PermissionError, match="not allowed"):
        atomic_write_bytes(path, b"{}")
    monkeypatch.undo()
    assert set(os.listdir("/proc/self/fd")) == fds
    assert read_json(path) == {"a": 1} and [p.name for p in tmp_path.iterdir()] == ["r.json"]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_new_file_gets_the_mode_open_would_give(tmp_path, umask):
    old = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "r.json", {"a": 1})
        with open(tmp_path / "plain.json", "w") as f:
            f.write("{}")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "r.json").stat().st_mode)
    assert mode == 0o666 & ~umask == stat.S_IMODE((tmp_path / "plain.json").stat().st_mode)


def test_rewriting_a_file_keeps_its_mode_as_open_would(tmp_path):
    path = tmp_path / "r.json"
    atomic_write_json(path, {"a": 1})
    os.chmod(path, 0o640)
    atomic_write_json(path, {"a": 2})
    assert stat.S_IMODE(path.stat().st_mode) == 0o640 and read_json(path) == {"a": 2}


def test_a_locked_folder_makes_another_process_wait(tmp_path):
    # another process (loading atomic.py alone: no torch to import) says it is ready,
    # then takes the same lock and prints the time it got it: after it was released
    import subprocess
    import sys
    import time

    import gradsift.lab.atomic as atomic

    folder = tmp_path / "out"
    script = (
        "import importlib.util, sys, time\n"
        "spec = importlib.util.spec_from_file_location('atomic', sys.argv[1])\n"
        "atomic = importlib.util.module_from_spec(spec); spec.loader.exec_module(atomic)\n"
        "print('ready', flush=True)\n"
        "with atomic.locked_folder(sys.argv[2]):\n    print(time.time(), flush=True)"
    )
    argv = [sys.executable, "-c", script, atomic.__file__, str(folder)]
    with locked_folder(folder):
        assert folder.is_dir()
        other = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert other.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # it waits for the lock meanwhile
        released = time.time()
    took = float(other.stdout.readline())
    other.wait(timeout=60)
    assert took >= released

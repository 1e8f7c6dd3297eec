"""Atomic result files."""

import json

import pytest

from gradsift.lab.atomic import atomic_write_bytes, atomic_write_json, read_json


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

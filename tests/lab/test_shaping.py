"""Bandwidth emulation: rates parse, missing tools fail in one line, and a shaped
namespace really runs at its rate (a byte probe over 127.0.0.1)."""

import os
import shutil

import pytest

from gradsift.lab import shaping


def test_rates_parse_to_gbit():
    assert shaping.rate_gbit("100mbit") == pytest.approx(0.1)
    assert shaping.rate_gbit("1gbit") == 1.0
    assert shaping.rate_gbit("2.5gbit") == 2.5
    assert shaping.rate_gbit("800kbit") == pytest.approx(8e-4)


@pytest.mark.parametrize("bad", ["1gb", "fast", "", "10 gbit", 100])
def test_bad_rate_is_a_value_error(bad):
    with pytest.raises(ValueError, match="tc rate like"):
        shaping.check_rate(bad)


def test_missing_tools_are_named_and_nothing_runs_unshaped(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else "/bin/x")
    with pytest.raises(ValueError, match="tc not found"):
        shaping.run_shaped("1gbit", "gradsift.lab.shaping:send_bytes", {"nbytes": 10})


def test_a_failing_function_inside_fails_in_one_line():
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("tc") is None:
        with pytest.raises(ValueError, match="cannot emulate bandwidth"):
            shaping.run_shaped("1gbit", "gradsift.lab.shaping:send_bytes", {"nbytes": 10})
        return
    with pytest.raises(ValueError, match="shaped run at 1gbit failed: .*nope"):
        shaping.run_shaped("1gbit", "gradsift.lab.shaping:send_bytes", {"nope": 1})


def test_shaped_loopback_runs_at_its_rate():
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("tc") is None:
        with pytest.raises(ValueError, match="cannot emulate bandwidth"):
            shaping.run_shaped("100mbit", "gradsift.lab.shaping:send_bytes", {"nbytes": 10})
        return
    nbytes = 3_000_000
    fast = shaping.send_bytes(nbytes)
    slow = shaping.run_shaped("100mbit", "gradsift.lab.shaping:send_bytes", {"nbytes": nbytes})
    assert slow["rate"] == "100mbit" and fast["rate"] is None
    assert slow["lo_bytes"] >= nbytes
    # 3 MB at 100 Mbit/s is 0.24 s, less the 512 kB burst: at least 0.15 s
    assert slow["seconds"] > 0.15 > fast["seconds"]

"""Measurements in a fresh process: a child's result, error or death reaches the
caller at once (a GraSP peak measurement whose child failed had waited ten minutes
for a result that never came, then raised a bare ``queue.Empty``)."""

import os
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from gradsift.lab.bench import scoring
from gradsift.lab.bench.fresh_process import in_fresh_process


def _pid_and_sum(*xs):
    return os.getpid(), sum(xs)


def _die():
    os._exit(3)


def test_the_result_comes_from_another_process():
    pid, total = in_fresh_process(_pid_and_sum, 1, 2, 3)
    assert pid != os.getpid() and total == 6


def _sees(name):
    from gradsift.lab.bench import memory

    return hasattr(memory, name), os.environ.get(name)


def test_the_child_sees_none_of_this_processs_memory_and_all_of_its_environment(
    monkeypatch,
):
    """What this process set at run time is not in the child (not a fork of it), but
    its environment is, as it is now (a fork server started earlier keeps the older
    one, as ``gradsift.lab.processes`` says)."""
    from gradsift.lab.bench import memory

    name = "GRADSIFT_TEST_FRESH"
    in_fresh_process(_pid_and_sum)  # a child (and any server) before the variable is set
    monkeypatch.setattr(memory, name, 1, raising=False)
    monkeypatch.setenv(name, "here")
    assert in_fresh_process(_sees, name) == (False, "here")


def test_a_dead_child_raises_at_once():
    start = time.monotonic()
    with pytest.raises(BrokenProcessPool):
        in_fresh_process(_die)
    assert time.monotonic() - start < 60


def test_a_failing_grasp_peak_measurement_raises_its_error():
    start = time.monotonic()
    with pytest.raises(ValueError, match="no_such_model"):
        scoring._peaks([("ours", None, False)], "no_such_model", 1, (3, 8, 8))
    assert time.monotonic() - start < 60

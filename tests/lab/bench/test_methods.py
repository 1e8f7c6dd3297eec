"""``gradsift bench methods`` at tiny sizes, for correctness only (never its timings)."""

import pytest
from torch.nn.utils import prune

import gradsift
from gradsift.lab.bench import BENCHES, methods as bench
from gradsift.lab.tables import render
from gradsift.pruning import register_method
from gradsift.pruning.params import effective
from gradsift.pruning.registry import _METHODS


@pytest.fixture
def cheap_methods():
    """Stand-ins, cheap at any size: one with its own schedule, one with paper rounds."""

    def targeted(model, targets, data=None, *, sparsity: float = 0.5):
        return _magnitude(model, targets)

    register_method("bench_targeted", targeted)
    register_method("bench_rounds", _magnitude, paper_iterations=3)
    yield ["snip", "bench_targeted", "bench_rounds"]
    del _METHODS["bench_targeted"], _METHODS["bench_rounds"]


def _magnitude(model, targets, data=None):
    return {name: effective(m, a).abs() for name, (m, a) in targets.items()}


def test_bench_methods_prunes_fresh_copies_with_each_methods_rounds(monkeypatch, cheap_methods):
    calls = []
    real = bench.prune_at_init

    def spy(model, method, sparsity, data, **kw):
        calls.append((method, prune.is_pruned(model), kw["iterations"], len(data[0][1])))
        return real(model, method, sparsity, data, **kw)

    monkeypatch.setattr(bench, "prune_at_init", spy)
    names = cheap_methods
    rows = bench.bench_methods(2, input_shape=(3, 8, 8), batch_size=16, methods=names)
    assert [r["method"] for r in rows] == names
    paper = {"snip": 1, "bench_targeted": 1, "bench_rounds": 3}
    assert {r["method"]: r["iterations"] for r in rows} == paper
    assert [r["own_schedule"] for r in rows] == ["", "yes", ""]
    # one warm-up and two timed calls each, every one on an unpruned copy
    assert sorted(calls) == sorted((m, False, paper[m], 16) for m in names for _ in range(3))
    for r in rows:
        assert r["method_ms"] > 0 and r["step_ms"] > 0 and r["method_over_step"] > 0
    assert "method/step" in render(rows, bench.COLUMNS)
    assert BENCHES["methods"] == (bench.bench_methods, bench.COLUMNS)


def test_the_default_is_every_method_and_grasp_finds_its_classes(monkeypatch):
    seen = []

    def untimed(cases, repeats):
        seen.append(cases)
        return {name: [1.0] * repeats for name in cases}

    monkeypatch.setattr(bench, "interleaved_ms", untimed)
    rows = bench.bench_methods(1, input_shape=(3, 8, 8), batch_size=8)
    assert [r["method"] for r in rows] == gradsift.list_methods()
    cases = seen[0]
    cases["grasp"][0]()
    cases["grasp"][1]()  # 25 samples of each of 10 classes across batches of 8

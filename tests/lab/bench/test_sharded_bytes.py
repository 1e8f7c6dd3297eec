"""``gradsift bench sharded``: the selection's bytes per rank, counted on 2 gloo ranks."""

from gradsift.lab.bench import BENCHES
from gradsift.lab.bench.sharded_bytes import COLUMNS, bench_sharded_bytes
from gradsift.lab.cli import main
from gradsift.select.sharded import BINS, selection_bytes


def test_counts_stay_within_the_cost_model(quick_sharded_rows):
    rows = quick_sharded_rows  # sizes=(100_000,), densities=(0.001, 0.1), world=2
    assert [(r["n"], r["k"]) for r in rows] == [(100_000, 100), (100_000, 10_000)]
    bound = selection_bytes(2)["allreduce"]
    for r in rows:
        # one all-reduce of 257-260 int64 per 8-bit pass, at most 4 passes for float32
        assert BINS * 8 < r["allreduce_bytes"] <= bound and r["allreduce_bytes"] % 8 == 0
        assert r["gradient_bytes"] == 400_000 and r["ratio"] > 40
    assert BENCHES["sharded"] == (bench_sharded_bytes, COLUMNS)


def test_command_prints_the_table(quick_sharded_rows, capsys, monkeypatch):
    calls = []

    def run(**options):
        calls.append(options)
        return quick_sharded_rows

    monkeypatch.setitem(BENCHES, "sharded", (run, COLUMNS))
    assert main(["bench", "sharded", "--sizes", "50000"]) == 0
    assert calls == [{"sizes": [50_000]}]
    assert "all-reduce B/rank" in capsys.readouterr().out

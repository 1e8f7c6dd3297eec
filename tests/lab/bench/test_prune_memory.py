"""``gradsift bench prune-memory`` on a small MLP: every case runs in its own process
and reports time and memory in multiples of the parameter bytes."""

from gradsift.lab.bench.prune_memory import ANCHOR, bench_prune_memory
from gradsift.lab.cli import main


def test_prune_memory_rows():
    rows = bench_prune_memory(1, cases=(ANCHOR, "magnitude", "synflow"), width=256, depth=2)
    assert [r["case"] for r in rows] == [ANCHOR, "magnitude", "synflow"]
    assert rows[2]["iterations"] == 10
    for r in rows:
        assert r["seconds"] > 0 and r["param_bytes"] == 2 * 256 * 256 * 4
        assert r["extra_peak"] >= r["retained"] - 1e-9
    assert rows[0]["over_anchor"] == 1.0


def test_prune_memory_command(capsys, monkeypatch):
    import gradsift.lab.bench.prune_memory as pm

    monkeypatch.setattr(pm, "CASES", (ANCHOR, "magnitude"))
    monkeypatch.setattr(pm.bench_prune_memory, "__defaults__", (1,))
    monkeypatch.setattr(pm.bench_prune_memory, "__kwdefaults__", {
        "cases": (ANCHOR, "magnitude"), "width": 4096, "depth": 2, "sparsity": 0.9,
        "device": "cpu",
    })  # fmt: skip
    assert main(["bench", "prune-memory", "--repeats", "1", "--width", "128"]) == 0
    out = capsys.readouterr().out
    assert "magnitude" in out and "time/anchor" in out

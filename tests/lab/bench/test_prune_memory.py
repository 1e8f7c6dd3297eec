"""``gradsift bench prune-memory`` on a small MLP: every case runs in its own process
and reports time and memory in multiples of the parameter bytes."""

import math

import pytest

from gradsift.lab.bench.prune_memory import ANCHOR, COLUMNS, TRAIN_STEP, bench_prune_memory
from gradsift.lab.cli import main


def test_prune_memory_rows(quick_prune_memory_rows):
    rows = quick_prune_memory_rows  # cases=(ANCHOR, "magnitude", "synflow"), width=256, depth=2
    assert [r["case"] for r in rows] == [ANCHOR, "magnitude", "synflow"]
    assert rows[2]["iterations"] == 10
    for r in rows:
        assert r["seconds"] > 0 and r["param_bytes"] == 2 * 256 * 256 * 4
        assert r["extra_peak"] >= r["retained"] - 1e-9
    assert rows[0]["over_anchor"] == 1.0


def test_prune_memory_command(capsys, monkeypatch):
    """The command hands its options to the bench and prints the table (the bench's
    own rows, from fresh processes, are the tests above and the quick speed study's)."""
    import gradsift.lab.bench as bench

    calls = []
    row = {"iterations": 1, "seconds": 0.5, "over_anchor": 1.0, "extra_peak": 1.25,
           "masks_peak": 1.0, "retained": 1.25, "param_bytes": 4096, "note": ""}  # fmt: skip

    def run(**options):
        calls.append(options)
        return [{**row, "case": ANCHOR}, {**row, "case": "magnitude"}]

    monkeypatch.setitem(bench.BENCHES, "prune-memory", (run, COLUMNS))
    assert main(["bench", "prune-memory", "--repeats", "1", "--width", "128"]) == 0
    assert calls == [{"repeats": 1, "device": "cpu", "width": 128}]
    out = capsys.readouterr().out
    assert "magnitude" in out and "time/anchor" in out and "1.25" in out


def test_prune_memory_on_a_gpt2_from_a_config(monkeypatch):
    """The transformer table's cases on a two-layer GPT-2, one of each kind: the anchor
    (``global_unstructured`` on Conv1D weights and a tied output projection), a
    data-driven method that prunes, a method that cannot use token ids and says so in
    the row's note (the criteria's own refusals are tested in ``tests/pruning``), and a
    training step, the yardstick. Each case runs in this process: a fresh one imports
    transformers, 7 s a case here, and the fresh processes are the MLP test's."""
    pytest.importorskip("transformers")
    import gradsift.lab.bench.prune_memory as pm
    from gradsift.pruning import at_init

    monkeypatch.setattr(pm, "in_fresh_process", lambda fn, *args: fn(*args))
    # a case probes the installation of masks by patching it, for its process's life
    monkeypatch.setattr(at_init, "install_masks_", at_init.install_masks_)
    cases = (ANCHOR, "snip", "synflow", TRAIN_STEP)
    rows = bench_prune_memory(1, cases=cases, network="gpt2", width=64, depth=2)
    by = {r["case"]: r for r in rows}
    # the selected weights: 2 blocks x (attn 64x192 + proj 64x64 + fc 64x256 + proj 256x64)
    # and the tied output projection (50257 x 64), float32
    param_bytes = 4 * (2 * (64 * 192 + 64 * 64 + 2 * 64 * 256) + 50257 * 64)
    assert {r["param_bytes"] for r in rows} == {param_bytes}
    for case in (ANCHOR, "snip", TRAIN_STEP):
        assert by[case]["seconds"] > 0 and by[case]["note"] == "", case
    assert by["synflow"]["iterations"] == 100 and math.isnan(by["synflow"]["seconds"])
    assert "token ids" in by["synflow"]["note"]


def test_prune_memory_refuses_an_unknown_network():
    with pytest.raises(ValueError, match="network must be one of"):
        bench_prune_memory(1, network="vgg")

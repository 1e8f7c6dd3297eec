"""``gradsift bench iteration`` on CPU: the lab's models stand in, every row is timed
and TopK's rows are set against the faster dense step of the same optimizer."""

import pytest

from gradsift.lab.bench.iteration import TinyLM


def test_rows_on_cpu(quick_iteration_rows):
    rows = quick_iteration_rows
    by = {(r["model"].split()[0], r["variant"]) for r in rows}
    assert ("ResNet-18", "TopK(SGD) 0.001") in by and ("ResNet-18", "SGD fused") in by
    assert any(v == "TopK(AdamW) 0.01" for _, v in by)
    for r in rows:
        assert r["iter_ms"] > 0 and r["fallback_steps"] == 0
        if "TopK" not in r["variant"]:
            assert r["over_dense"] >= 1.0 - 1e-12
    assert min(r["over_dense"] for r in rows if "TopK" not in r["variant"]) == pytest.approx(1.0)


def test_tiny_lm_ties_its_head_to_its_embedding():
    model = TinyLM()
    assert model.head.weight is model.embed.weight

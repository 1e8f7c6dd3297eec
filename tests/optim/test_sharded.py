"""``TopK`` on FSDP2 models (DTensor parameters) over gloo ranks on CPU.

Every multi-process test runs under a hard deadline and kills its processes."""

import pytest

import fsdp_workers as workers
from sharded_workers import run_world


def _results(results, world):
    assert "timeout" not in results, results
    out = [results[r] for r in range(world)]
    for r in out:
        assert not (isinstance(r, str) and r.startswith("error")), r
    return out


@pytest.mark.parametrize(
    "world, kw",
    [
        (2, {"density": 0.1}),
        (3, {"density": 0.1}),
        (2, {"k": 7, "momentum_correction": 0.9}),
        (2, {"density": 0.05, "scope": "layer"}),
        (2, {"density": 0.1, "error_feedback": False}),
    ],
)
def test_step_equals_single_process_topk_on_the_full_gradient(world, kw):
    for report in _results(run_world(workers.step_matches_single_process, world, kw), world):
        for step, (same_params, same_state, kept, names) in enumerate(report):
            assert same_params, f"step {step}: parameters differ"
            assert same_state, f"step {step}: {names} differ"
            assert kept > 0

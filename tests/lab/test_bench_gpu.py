"""``gradsift bench select|step --device cuda``: refused clearly without CUDA, and the
rows it would print, run here on CPU tensors through the Triton interpreter."""

import pytest
import torch

from gradsift.lab import cli
from gradsift.lab.bench.gpu import bench_select_gpu, bench_step_gpu
from triton_support import DEVICE


def _exit_code(argv) -> int:
    """``cli.main``'s exit code, argparse's own (SystemExit) included."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("what", ["select", "step", "iteration", "prune-memory"])
def test_device_cuda_without_cuda_exits_2(what, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _exit_code(["bench", what, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device" in err and "CUDA is not available" in err


@pytest.mark.parametrize("argv", [["score", "--device", "cuda"], ["select", "--device", "tpu"]])
def test_device_only_for_select_and_step(argv, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU: score refuses it
    assert _exit_code(["bench", *argv]) == 2
    assert "--device" in capsys.readouterr().err


def test_select_rows():
    rows = bench_select_gpu(sizes=(6000,), repeats=1, device=str(DEVICE))
    assert [(r["n"], r["k"]) for r in rows] == [(6000, 6), (6000, 60)]
    for r in rows:
        assert r["topk_over_auto"] == pytest.approx(r["torch_topk_ms"] / r["auto_ms"])


def test_step_rows():
    rows = bench_step_gpu(sizes=(4000,), repeats=1, device=str(DEVICE))
    assert [(r["n"], r["density"], r["k"]) for r in rows] == [(4000, 0.001, 4), (4000, 0.01, 40)]
    assert all(r["fused_sgd_ms"] > 0 and r["triton_ms"] > 0 for r in rows)


def test_cpu_0_is_the_cpu_bench(monkeypatch, capsys):
    """``--device cpu:0`` names the CPU: the CPU bench runs (not the GPU form on CPU
    tensors, and not a refusal for score)."""
    import gradsift.lab.commands as commands

    monkeypatch.setattr(commands, "_gpu_bench", lambda args: pytest.fail("GPU bench"))
    monkeypatch.setattr("gradsift.lab.bench.BENCHES", {"score": (lambda **kw: [], [])})
    assert _exit_code(["bench", "score", "--device", "cpu:0", "--repeats", "1"]) == 0

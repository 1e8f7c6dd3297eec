"""Triton is optional: without it the library imports and runs (the torch path), and
asking for ``backend="triton"`` says how to install it. Run in a fresh interpreter
where importing triton fails, as on a machine that never installed it."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["triton"] = None  # import triton -> ImportError
    import torch
    import gradsift
    from gradsift import TopK, topk_indices

    x = torch.tensor([0.1, -3.0, 2.0, 0.5])
    assert topk_indices(x, 2).tolist() == [1, 2]
    p = torch.nn.Parameter(torch.zeros(4))
    opt = TopK(torch.optim.SGD([p], lr=1.0), k=1)
    p.grad = x.clone()
    opt.step()
    assert p.detach().tolist() == [0.0, 3.0, 0.0, 0.0]
    for call in (lambda: topk_indices(x, 2, backend="triton"),
                 lambda: TopK(torch.optim.SGD([p], lr=1.0), k=1, backend="triton")):
        try:
            call()
        except ImportError as exc:
            assert "pip install" in str(exc), exc
        else:
            raise AssertionError("backend='triton' without triton must raise")
    assert "triton" not in {m.split(".")[0] for m in sys.modules if sys.modules[m]}
    print("ok")
    """
)


def test_library_works_without_triton():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]

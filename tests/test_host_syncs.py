"""No host synchronisation in the steady state of the GPU paths, checked on CPU.

A GPU runs ahead of the Python that launches its work until something needs a value
back on the host: ``Tensor.item()`` and every ``bool``/``int``/``float`` of a tensor
(``aten._local_scalar_dense``), ``tolist``, ``numpy``, and the ops whose output shape
depends on the data (``nonzero``, ``masked_select``, indexing with a boolean mask,
``unique``, ``repeat_interleave`` without ``output_size``, ...). On a GPU each one
stalls the step; inside a CUDA graph capture it is an error. A CPU cannot show the
stall, but it can show the call: the Triton paths run here through the interpreter
(same Python glue, same torch calls), under a dispatch mode that records every op
that would wait for a CUDA device.

The fused ``TopK`` step has none (the NaN flag stays on the device,
``TopK.found_nonfinite``); ``topk_indices`` reads that flag once, as it documents.
"""

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradsift import TopK
from gradsift.select import topk_indices, topk_mask
from test_sparsify_triton import gradient, params
from triton_support import DEVICE

# ops that make the host wait for a CUDA device (their result is a host value, or
# its shape depends on the data)
WAITING = {
    "aten._local_scalar_dense.default",
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten.is_nonzero.default",
    "aten.equal.default",
    "aten.allclose.default",
    "aten.unique_consecutive.default",
    "aten._unique.default",
    "aten._unique2.default",
    "aten.unique_dim.default",
    "aten.repeat_interleave.Tensor",
    "aten.bincount.default",
}


def _boolean_index(func, args) -> bool:
    """Indexing with a boolean mask (``x[mask]``, ``x[mask] = v``): a nonzero inside."""
    if str(func) not in ("aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default"):
        return False
    return any(i is not None and i.dtype == torch.bool for i in args[1])


class Waits(TorchDispatchMode):
    """Records ``(op, shapes)`` of every call that would wait for a CUDA device."""

    def __init__(self, waits: list) -> None:
        super().__init__()
        self.waits = waits

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in WAITING or _boolean_index(func, args):
            shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
            self.waits.append((str(func), shapes))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def recorded(monkeypatch):
    """The waits of the block: dispatched ops, and ``tolist``/``numpy`` (which read
    memory without dispatching an op)."""
    waits = []
    for name in ("tolist", "numpy"):
        real = getattr(torch.Tensor, name)

        def read(t, *args, name=name, real=real, **kwargs):
            waits.append((name, [tuple(t.shape)]))
            return real(t, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)
    with Waits(waits):
        yield waits
    monkeypatch.undo()


def steady_step(monkeypatch, inner, steps=2, missing=None, **topk):
    """The waits of the last of ``steps`` fused steps (the first allocates and builds
    the parameter table, the scheduler's new rate is copied into it before the
    second; ``missing``: that parameter has no gradient from step 1 on)."""
    ps = params()
    opt = TopK(inner(ps), backend="triton", **topk)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    for step in range(steps):
        for i, (p, g) in enumerate(zip(ps, gradient(ps, step))):
            p.grad = None if i == missing and step >= 1 else g
        if step < steps - 1:
            opt.step()
        else:
            with recorded(monkeypatch) as waits:
                opt.step()
        sched.step()  # a new learning rate every step
        opt.zero_grad()
    assert opt.fallback_steps == 0 and opt.found_nonfinite is not None, "the fused step ran"
    return waits, opt


def sgd(ps):
    return torch.optim.SGD(ps, lr=0.1)


@pytest.mark.parametrize(
    "topk",
    [
        {"density": 0.01},
        {"density": 0.3},  # unstaged selection
        {"density": 0.01, "momentum_correction": 0.9},
        {"density": 0.01, "error_feedback": False},
        {"density": 0.01, "missing": 1},  # held out of the selection
    ],
)
def test_fused_sgd_step_never_waits_for_the_device(monkeypatch, topk):
    waits, opt = steady_step(monkeypatch, sgd, **topk)
    assert waits == []
    assert opt.found_nonfinite.device == DEVICE and not bool(opt.found_nonfinite)


def test_fused_step_with_adam_reads_the_flag_once(monkeypatch):
    # Adam must not step on a non-finite sum: the flag is read once before it runs.
    # Adam's own reads of its step counts are not device reads: without capturable=True
    # torch keeps them on the CPU
    waits, opt = steady_step(monkeypatch, lambda ps: torch.optim.Adam(ps, lr=0.01), density=0.01)
    steps = {s["step"].data_ptr() for s in opt.optimizer.state.values()}
    assert all(s.device.type == "cpu" for st in opt.optimizer.state.values() for s in [st["step"]])
    assert len(steps) == 4
    assert [op for op, shapes in waits if shapes != [()]] == []
    assert len(waits) == 1 + len(steps), waits


@pytest.mark.parametrize("select", [topk_indices, topk_mask])
def test_selection_reads_the_nan_flag_once(monkeypatch, select):
    x = torch.randn(20_000, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    select(x, 40, backend="triton")  # buffers allocated
    with recorded(monkeypatch) as waits:
        select(x, 40, backend="triton")
    assert waits == [("aten._local_scalar_dense.default", [()])]


def test_the_recorder_sees_what_waits(monkeypatch):
    # the recorder itself: each of these would stall a GPU
    x = torch.arange(6.0)
    with recorded(monkeypatch) as waits:
        x.sum().item(), bool(x[0]), x.nonzero(), x[x > 2], x.tolist(), x.unique()
        x[x > 4] = 0.0
        x.sum() + x  # and these would not
    ops = [op for op, _ in waits]
    assert ops == [
        "aten._local_scalar_dense.default",
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten.index.Tensor",
        "tolist",
        "aten._unique2.default",
        "aten.index_put_.default",
    ], ops

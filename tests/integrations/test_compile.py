"""gradsift under ``torch.compile``: a compiled model, and a compiled ``opt.step``,
give TopK's eager result."""

import pytest
import torch

import gradsift


def _run(compile_model, compile_step, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = gradsift.TopK(torch.optim.SGD(model.parameters(), lr=0.1), k=20)
    forward = torch.compile(model, backend="eager") if compile_model else model
    step = torch.compile(opt.step, backend="eager") if compile_step else opt.step
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=gen), torch.randint(0, 4, (8,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(forward(x), y).backward()
        step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("compile_model, compile_step", [(True, False), (True, True)])
def test_compiled_model_and_step_match_eager(compile_model, compile_step):
    torch._dynamo.reset()
    for a, b in zip(_run(False, False), _run(compile_model, compile_step)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)

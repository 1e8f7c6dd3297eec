"""Small networks and data for the pruning tests (importable: tests/ is on the path)."""

import torch
from torch import nn
from torch.func import functional_call

NAMES = ["1.weight", "3.weight", "5.weight"]  # the scored weights of ``mlp()``


def mlp(bias=True, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(12, 10, bias=bias),
        nn.ReLU(),
        nn.Linear(10, 8, bias=bias),
        nn.ReLU(),
        nn.Linear(8, 3, bias=bias),
    ).to(dtype)


class BNNet(nn.Module):
    """Conv + BatchNorm + a frozen Linear + a Linear head, 3 classes, 1x4x4 inputs."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.frozen = nn.Linear(4 * 16, 8)
        self.fc = nn.Linear(8, 3)
        self.frozen.weight.requires_grad_(False)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(torch.relu(self.frozen(h.flatten(1))))


def batches(n_batches=3, n=12, shape=(12,), classes=3, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n_batches):
        x = torch.randn((n, *shape), generator=gen, dtype=dtype)
        y = torch.arange(n) % classes
        out.append((x, y))
    return out


def convnet():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 16),
        nn.ReLU(),
        nn.Linear(16, 3),
    )


def convnet_data(n_batches=3, n=30):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(n, 1, 6, 6, generator=gen), torch.arange(n) % 3) for _ in range(n_batches)]


def snapshot(model):
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grad": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "rng": torch.get_rng_state(),
    }


def assert_same(before, after):
    for k in before["state"]:
        assert torch.equal(before["state"][k], after["state"][k]), k
    assert before["training"] == after["training"]
    assert before["requires_grad"] == after["requires_grad"]
    for a, b in zip(before["grad"], after["grad"]):
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(before["rng"], after["rng"])


def flat_loss(model, names, data, temperature=1.0):
    """loss(w) over ``data`` as a function of the scored weights, for autograd refs."""
    shapes = [model.get_parameter(n).shape for n in names]

    def f(w):
        params, offset = {}, 0
        for n, s in zip(names, shapes):
            params[n] = w[offset : offset + s.numel()].view(s)
            offset += s.numel()
        count = sum(len(y) for _, y in data)
        total = 0.0
        for x, y in data:
            out = functional_call(model, params, (x,)) / temperature
            total = total + nn.functional.cross_entropy(out, y, reduction="sum") / count
        return total

    w = torch.cat([model.get_parameter(n).detach().reshape(-1) for n in names])
    return f, w


def unflatten(vec, model, names):
    out, offset = {}, 0
    for n in names:
        p = model.get_parameter(n)
        out[n] = vec[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return out

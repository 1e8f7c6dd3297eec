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


def convnet(hidden: int = 16):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 3),
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


def flat_loss(model, names, data, temperature=1.0, weights=None):
    """loss(w) over ``data`` as a function of the scored weights, for autograd refs:
    the mean over all samples, or ``Σ_b weights[b] * (batch b's mean loss)``."""
    shapes = [model.get_parameter(n).shape for n in names]

    def f(w):
        params, offset = {}, 0
        for n, s in zip(names, shapes):
            params[n] = w[offset : offset + s.numel()].view(s)
            offset += s.numel()
        count = sum(len(y) for _, y in data)
        total = 0.0
        for b, (x, y) in enumerate(data):
            out = functional_call(model, params, (x,)) / temperature
            if weights is None:
                total = total + nn.functional.cross_entropy(out, y, reduction="sum") / count
            else:
                total = total + weights[b] * nn.functional.cross_entropy(out, y)
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


class Encoder(nn.Module):
    """A small ``nn.TransformerEncoder`` classifier: 2 layers, width 8, 2 heads."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.encoder(x).mean(1))


def encoder_data(n_batches=2, n=6, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(n, 4, 8, generator=gen, dtype=dtype), torch.arange(n) % 3)
        for _ in range(n_batches)
    ]


class Tied(nn.Module):
    """Token ids -> logits with two ties: ``decoder.weight = embedding.weight`` (a
    language model's tied head) and ``b.weight = a.weight`` (two Linear layers)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embedding = nn.Embedding(10, 6)
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.b.weight = self.a.weight
        self.decoder = nn.Linear(6, 10, bias=False)
        self.decoder.weight = self.embedding.weight

    def forward(self, ids):
        h = torch.relu(self.b(torch.relu(self.a(self.embedding(ids)))))
        return self.decoder(h).mean(1)


def token_data(n_batches=2, n=20, classes=10):
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randint(0, 10, (n, 5), generator=gen), torch.arange(n) % classes)
        for _ in range(n_batches)
    ]


class DictModel(nn.Module):
    """A Hugging Face style model: keyword tensors in, ``{"logits": ...}`` out (its
    arguments in another order than the batch's keys)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 6), nn.ReLU())
        self.classifier = nn.Linear(6, 3)

    def forward(self, attention_mask, input_ids):
        h = self.body(input_ids)
        h = (h * attention_mask[..., None]).sum(1) / attention_mask.sum(1, keepdim=True)
        return {"logits": self.classifier(h)}


def dict_data(n_batches=2, n=6):
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n_batches):
        mask = torch.ones(n, 5)
        mask[:, 3:] = (torch.rand(n, 2, generator=gen) > 0.5).float()
        ids = torch.randint(0, 10, (n, 5), generator=gen)
        out.append({"input_ids": ids, "attention_mask": mask, "labels": torch.arange(n) % 3})
    return out

"""The networks ``gradsift bench prune-memory`` prunes: what is built, the batch, the
loss and the weights a pruning selects (``torch.nn.utils.prune``'s anchor prunes the
same ones).

- ``mlp``: ``depth`` layers ``Linear(width, width)`` with ReLU between (the issue's
  50M-weight MLP at width 4096 and depth 3; four layers, 67M, by default), a batch
  of 64 Gaussian inputs and 10 classes.
- ``gpt2``: Hugging Face's GPT-2 built from a config with random init (``transformers``
  must import), ``n_embd=width``, ``n_layer=depth``, ``n_head=width // 64``: by
  default GPT-2-XL's shape (1600, 48: about 1.5B parameters), a batch of 2 x 128
  token ids, next-token cross-entropy. Its default selection is the blocks'
  ``Conv1D`` weights and the (tied) output projection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

__all__ = ["NETWORKS", "Workload", "build"]

NETWORKS = {"mlp": (4096, 4), "gpt2": (1600, 48)}  # default (width, depth)


@dataclass
class Workload:
    model: nn.Module
    data: list  # [(inputs, targets)]
    loss_fn: object  # (output, targets) -> loss
    input_shape: tuple  # one input without the batch dimension

    def loss(self) -> torch.Tensor:
        x, y = self.data[0]
        return self.loss_fn(self.model(x), y)


def build(network: str, width: int, depth: int, device: str) -> Workload:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    if network == "mlp":
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        model = nn.Sequential(*layers[:-1]).to(device)
        x = torch.randn(64, width, generator=gen).to(device)
        return Workload(model, [(x, (torch.arange(64) % 10).to(device))], F.cross_entropy, (width,))
    if network == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_embd=width, n_layer=depth, n_head=max(1, width // 64))
        model = GPT2LMHeadModel(config).to(device)
        ids = torch.randint(0, config.vocab_size, (2, 128), generator=gen).to(device)
        return Workload(model, [(ids, ids)], _next_token_loss, (128,))
    raise ValueError(f"network must be one of {sorted(NETWORKS)}, got {network!r}")


def _next_token_loss(output, ids: torch.Tensor) -> torch.Tensor:
    logits = output.logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))

"""The README's library examples run as written."""

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_topk_and_pruning_examples_run():
    blocks = python_blocks()
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 64, generator=gen), torch.randint(0, 10, (8,), generator=gen))]
    topk_example, pruning_example = blocks[0], blocks[1]
    namespace = {"batches": batches}
    exec(compile(topk_example, "README-topk", "exec"), namespace)
    assert namespace["opt"].state[namespace["model"][0].weight]["residual"].shape == (128, 64)
    namespace = {}
    exec(compile(pruning_example, "README-pruning", "exec"), namespace)
    kept = sum(int(m.sum()) for m in namespace["masks"].values())
    total = sum(m.numel() for m in namespace["masks"].values())
    assert total - kept == round(0.9 * total)

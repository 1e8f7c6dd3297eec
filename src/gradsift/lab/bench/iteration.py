"""``gradsift bench iteration [--device cuda|cpu]``: a whole training iteration
(``zero_grad(set_to_none=True)``, forward and backward, under bf16 autocast on a
GPU, then ``step``) with dense steps against ``TopK`` at densities 0.1% and 1%, on
models no one here wrote where their libraries import: torchvision's ResNet-50 (SGD)
and Hugging Face's GPT-2 small with its tied embedding (SGD and AdamW). Elsewhere,
and on CPU, the lab's ResNet-18 and a small tied-embedding transformer stand in at
small sizes.

Per row: the median iteration time (CUDA events on a GPU), its ratio to the faster
dense step of the same optimizer, the peak memory (``torch.cuda.max_memory_allocated``
on a GPU), the extra peak over that dense step, and how many of TopK's steps fell
back from the fused GPU step to the torch path.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from gradsift import TopK
from gradsift.lab.models import build_model
from gradsift.lab.tables import columns

__all__ = ["COLUMNS", "bench_iteration"]

DENSITIES = (0.001, 0.01)

COLUMNS = columns(
    """
    model            model
    variant          step
    iter_ms          iteration ms    .2f
    over_dense       /dense          .3f
    peak_mib         peak MiB        .0f
    extra_peak_mib   extra MiB       .0f
    fallback_steps   fallbacks       d
    """
)


class TinyLM(nn.Module):
    """A small causal transformer whose output head is tied to its embedding."""

    def __init__(self, vocab=1000, dim=128, layers=2, heads=4, seq=64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.seq = seq

    def forward(self, ids):
        mask = nn.Transformer.generate_square_subsequent_mask(ids.shape[1], device=ids.device)
        return self.head(self.body(self.embed(ids) + self.pos[: ids.shape[1]], mask=mask))


def _vision(dev):
    """(name, make_model, batch) of the vision model."""
    if dev.type == "cuda":
        try:
            import torchvision

            return "ResNet-50 (torchvision), 64x224", torchvision.models.resnet50, (64, 224)
        except Exception:  # noqa: BLE001 - torchvision absent or broken beside this torch
            pass
    return "ResNet-18 (lab), 16x32", lambda: build_model("resnet18"), (16, 32)


def _language(dev):
    """(name, make_model, (batch, sequence, vocabulary)) of the language model."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel

        if dev.type == "cuda":
            config, shape = GPT2Config(), (8, 512)
            name = "GPT-2 small (transformers), 8x512"
        else:
            config, shape = GPT2Config(n_layer=2, n_embd=128, n_head=4), (2, 64)
            name = "GPT-2 2x128 (transformers), 2x64"
        make = lambda: GPT2LMHeadModel(config)  # noqa: E731
        return name, make, (*shape, config.vocab_size), True
    except Exception:  # noqa: BLE001 - transformers absent
        return "tied transformer (lab), 4x64", TinyLM, (4, 64, 1000), False


def _optimizers(kind: str):
    """(variant, make(params) -> optimizer) for a model's rows."""
    sgd = lambda ps, **kw: torch.optim.SGD(ps, lr=1e-3, **kw)  # noqa: E731
    adamw = lambda ps, **kw: torch.optim.AdamW(ps, lr=1e-4, **kw)  # noqa: E731
    inners = [("SGD", sgd)] + ([("AdamW", adamw)] if kind == "language" else [])
    for name, inner in inners:
        yield f"{name} fused", name, lambda ps, inner=inner: inner(ps, fused=True)
        yield f"{name} foreach", name, lambda ps, inner=inner: inner(ps, foreach=True)
        for d in DENSITIES:

            def topk(ps, inner=inner, d=d):
                return TopK(inner(ps, foreach=True), density=d)

            yield f"TopK({name}) {d:g}", name, topk


def _time_iterations(step, dev, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def _rows_of(model_name, make_model, batch_fn, loss_fn, kind, dev, repeats, warmup):
    torch.manual_seed(0)
    start = make_model().to(dev).state_dict()
    rows = []
    for variant, family, make_opt in _optimizers(kind):
        model = make_model().to(dev)
        model.load_state_dict(start)
        opt = make_opt([p for p in model.parameters() if p.requires_grad])
        x, y = batch_fn()

        def step(model=model, opt=opt, x=x, y=y):
            opt.zero_grad(set_to_none=True)  # torch's default; TopK frees its buffer
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                loss = loss_fn(model, x, y)
            loss.backward()
            opt.step()

        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        row = {"model": model_name, "variant": variant, "family": family}
        row["iter_ms"] = _time_iterations(step, dev, repeats, warmup)
        if dev.type == "cuda":
            row["peak_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20
        row["fallback_steps"] = getattr(opt, "fallback_steps", 0)
        rows.append(row)
        del model, opt, step
    for r in rows:
        dense = [d for d in rows if d["family"] == r["family"] and "TopK" not in d["variant"]]
        fastest = min(dense, key=lambda d: d["iter_ms"])
        r["over_dense"] = r["iter_ms"] / fastest["iter_ms"]
        if "peak_mib" in r:
            r["extra_peak_mib"] = r["peak_mib"] - fastest["peak_mib"]
    return rows


def bench_iteration(device: str = "cpu", repeats: int = 20, warmup: int = 3) -> list[dict]:
    """Rows per (model, step) as in the module docstring; each row's median of
    ``repeats`` timed iterations after ``warmup`` untimed ones."""
    dev = torch.device(device)
    name, make, (batch, side) = _vision(dev)

    def images():
        x = torch.randn(batch, 3, side, side, device=dev)
        return x, torch.randint(0, 10, (batch,), device=dev)

    def classify(model, x, y):
        return nn.functional.cross_entropy(model(x).float(), y)

    rows = _rows_of(name, make, images, classify, "vision", dev, repeats, warmup)
    name, make, (batch, seq, vocab), hf = _language(dev)

    def tokens():
        ids = torch.randint(0, vocab, (batch, seq), device=dev)
        return ids, ids

    def lm_loss(model, ids, labels):
        if hf:
            return model(input_ids=ids, labels=labels).loss
        logits = model(ids)[:, :-1].float()
        return nn.functional.cross_entropy(logits.reshape(-1, vocab), labels[:, 1:].reshape(-1))

    return rows + _rows_of(name, make, tokens, lm_loss, "language", dev, repeats, warmup)

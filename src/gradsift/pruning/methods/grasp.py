"""GraSP: Wang, Zhang & Grosse, "Picking Winning Tickets Before Training by Preserving
Gradient Flow", ICLR 2020, arXiv:2002.07376.

Score ``θ ⊙ Hg`` over a class-balanced sample, logits divided by a temperature, with
``g = ∇L`` and ``H`` the Hessian of the loss. The paper removes the highest
``S(-θ) = -θ ⊙ Hg``; we return ``θ ⊙ Hg`` so that, as for every method, higher keeps.

Scored in **train mode**: BatchNorm normalises with the statistics of the samples
that go through the network together, as in the GraSP repository (which scores the
network as it would train; in eval mode, with the running statistics of an untrained
network, the scores are unrelated: ``docs/results.md`` §5). By default those are the
reference's: the sample's two halves, so that the default reproduces the GraSP
repository's ``GraSP()`` on BatchNorm networks.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from gradsift.checks import check_choice, check_float, check_int
from gradsift.pruning.inputs import forward, index, num_samples, split, to_device
from gradsift.pruning.methods._hvp import (
    Chunk,
    add_,
    batch_stats_only_,
    gradient,
    hvp_double,
    hvp_forward,
    math_attention,
)
from gradsift.pruning.params import device_of, effective, leaves, original, param_path
from gradsift.pruning.registry import register_method
from gradsift.pruning.sampling import (
    BATCH_WEIGHTINGS,
    batch_weight,
    class_balanced_sample,
    need_data,
)


def grasp(
    model,
    targets,
    data=None,
    *,
    loss_fn=F.cross_entropy,
    temperature: float = 200.0,
    samples_per_class: int = 25,
    num_classes: int | None = None,
    chunk_size: int | None = None,
    batch_weighting: str = "size",
    reinit_linear: bool = False,
    hvp: str = "double",
    keep_graphs: bool = False,
    split_batch=None,
    max_batches: int | None = None,
):
    """θ ⊙ Hg over a class-balanced sample, logits divided by ``temperature``.

    The sample (``samples_per_class`` of each class, in class order) goes through the
    network in chunks: by default (``chunk_size=None``) its two halves, the first
    ``N // 2`` samples and the rest, as the GraSP repository does. ``g = ∇L`` and
    ``Hg`` are taken of ``L = Σ_c w_c L_c / Σ_c w_c``, ``L_c`` a chunk's mean loss:
    ``batch_weighting="size"`` (default) weights a chunk by its number of samples, so
    ``L`` is the mean over the sample (the paper's loss); ``"batch"`` weights chunks
    equally, as the GraSP repository sums its two halves' means and the Synaptic-Flow
    repository its batches' (a constant factor, no change in ranking). With an even
    ``N`` (every configuration of the GraSP repository) the halves are equal and both
    weightings give the reference's scores; ``"batch"`` matches it for odd ``N`` too.

    ``chunk_size=c`` bounds memory by chunks of ``c`` samples. Without BatchNorm that
    is exact under ``"size"`` weighting (the chunks' shares add up to the sample's
    mean). With BatchNorm in train mode each chunk is normalised with its own
    statistics, which changes the scores (``docs/results.md`` §5 measures how much),
    so a ``chunk_size`` whose chunks are not the two halves warns.

    ``hvp="double"`` (default) takes Hg reverse-over-reverse, like the reference;
    ``hvp="forward"`` forward-over-reverse: the same values, an independent route that
    the tests cross-check, slower on CPU. Attention runs on the math backend of
    ``scaled_dot_product_attention``, the one with a double backward.

    Memory for time: the Hg pass needs each chunk's ``create_graph`` gradient, which
    the g pass could have built. By default only the last chunk's is kept from the g
    pass (used first, so no more memory is alive than for any other chunk); the rest
    are recomputed. ``keep_graphs=True`` keeps every chunk's (``hvp="double"`` only):
    no recomputation, but the whole sample's graph is alive at once
    (``docs/results.md`` §4 measures both).

    Data: targets are class indices, one per sample; ``split_batch`` turns other
    batches into ``(inputs, targets)`` (``gradsift.pruning.inputs``), and the
    class search reads at most ``max_batches`` batches (see
    ``gradsift.pruning.class_balanced_sample``). A model whose output is not a tensor
    needs ``num_classes=`` and ``temperature=1`` (divide the logits in ``loss_fn``).
    """
    need_data(data, "grasp")
    _check_options(hvp, keep_graphs, batch_weighting, chunk_size, temperature, num_classes)
    _check_targets(data, split_batch)
    if num_classes is None:
        num_classes = _infer_classes(model, data, split_batch)
    if reinit_linear:  # the reference code's option: xavier-normal Linear weights
        for m, a in targets.values():
            if isinstance(m, nn.Linear):
                with torch.no_grad():
                    nn.init.xavier_normal_(original(m, a))
    x, y = class_balanced_sample(
        data,
        samples_per_class,
        num_classes,
        device_of(model),
        split_batch=split_batch,
        max_batches=max_batches,
    )
    model.train()
    batch_stats_only_(model)
    chunks = _chunks(model, x, y, chunk_size, batch_weighting)

    def loss(out, chunk: Chunk):
        if not isinstance(out, torch.Tensor) and temperature != 1:
            raise ValueError(
                f"grasp divides the model's output by temperature={temperature}, but the "
                f"model returns a {type(out).__name__}; pass temperature=1 and divide the "
                "logits by the temperature in loss_fn"
            )
        logits = out / temperature if isinstance(out, torch.Tensor) else out
        return loss_fn(logits, chunk.y) * chunk.share

    with math_attention():
        hg = _hessian_gradient(model, targets, loss, chunks, hvp, keep_graphs)
    return {name: effective(m, a).detach() * h for (name, (m, a)), h in zip(targets.items(), hg)}


def _check_options(hvp, keep_graphs, batch_weighting, chunk_size, temperature, classes) -> None:
    check_choice("hvp", hvp, ("forward", "double"))
    check_float("temperature", temperature, "(0, inf)")  # 0: NaN scores; < 0 flips logits
    if classes is not None:
        check_int("num_classes", classes, minimum=1)
    if keep_graphs and hvp != "double":
        raise ValueError("keep_graphs=True needs hvp='double' (it keeps create_graph graphs)")
    check_choice("batch_weighting", batch_weighting, BATCH_WEIGHTINGS)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)


def _chunks(model, x, y, chunk_size, batch_weighting) -> list[Chunk]:
    """The sample's chunks with their shares; a warning where BatchNorm statistics
    would differ from the reference's two halves."""
    n = y.numel()
    halves = [0, n // 2, n] if n > 1 else [0, n]
    if chunk_size is None:
        bounds = halves
    else:
        bounds = list(range(0, n, chunk_size)) + [n]
        if bounds != halves and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
        ):
            warnings.warn(
                f"grasp: chunk_size={chunk_size} puts the {n} samples through the network "
                f"in {len(bounds) - 1} chunks, each normalised by train-mode BatchNorm with "
                f"its own statistics, instead of the GraSP reference's two halves of "
                f"{n // 2} and {n - n // 2}: the scores differ from the reference's "
                "(leave chunk_size=None to reproduce it)",
                UserWarning,
                stacklevel=2,
            )
    sizes = [b - a for a, b in zip(bounds, bounds[1:])]
    weights = [batch_weight(s, batch_weighting) for s in sizes]
    total = sum(weights)
    return [
        Chunk(index(x, slice(a, b)), y[a:b], w / total)
        for a, b, w in zip(bounds, bounds[1:], weights)
    ]


def _hessian_gradient(model, targets, loss, chunks, hvp, keep_graphs):
    """``Hg`` of the loss over all chunks (see ``grasp``)."""
    ws = leaves(targets)
    keep = [hvp == "double" and (keep_graphs or i == len(chunks) - 1) for i in range(len(chunks))]
    g, kept = gradient(model, ws, loss, chunks, keep)
    hg = [torch.zeros_like(t) for t in ws]
    for i in reversed(range(len(chunks))):  # kept graphs first, each freed once used
        grads, kept[i] = kept[i], None
        if grads is not None:
            add_(hg, hvp_double(model, ws, loss, chunks[i], g, grads))
    names = [param_path(model, m, a) for m, a in targets.values()]
    for chunk, k in zip(chunks, keep):
        if k:
            continue
        if hvp == "forward":
            add_(hg, hvp_forward(model, names, ws, loss, chunk, g))
        else:
            add_(hg, hvp_double(model, ws, loss, chunk, g))
    return hg


def _check_targets(data, split_batch) -> None:
    """GraSP's class-balanced sample needs one class index per sample: refuse other
    targets (per-token labels of a language model) before any work."""
    first = next(iter(data), None)
    if first is None:
        raise ValueError("data yielded no batches")
    _, y = split(first, split_batch)
    if not isinstance(y, torch.Tensor) or y.dim() != 1 or y.is_floating_point():
        shape = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        raise ValueError(
            "grasp draws a class-balanced sample and needs targets that are one class "
            f"index per sample (an integer tensor shaped (batch,)), got {shape}; per-token "
            "targets (a language model's) are not supported: score such models with snip, "
            "force, iter_snip, prospr, magnitude or random"
        )


def _infer_classes(model, data, split_batch) -> int:
    """The width of the model's output on one sample of the first batch (read again by
    the class search: ``score`` hands criteria data that can be iterated again)."""
    first = next(iter(data), None)
    if first is None:
        raise ValueError("data yielded no batches")
    x, y = split(first, split_batch)
    was_training = model.training
    model.eval()  # one sample: BatchNorm1d cannot take batch statistics of it
    with torch.no_grad():
        out = forward(model, to_device(index(x, slice(0, 1)), device_of(model)))
    model.train(was_training)
    if not isinstance(out, torch.Tensor) or num_samples(y) < 1:
        raise ValueError(
            f"grasp cannot read the class count from a model output of type "
            f"{type(out).__name__}; pass num_classes="
        )
    return int(out.shape[-1])


register_method("grasp", grasp)

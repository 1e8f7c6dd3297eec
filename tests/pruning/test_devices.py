"""Guards against tensors made on the CPU for a model elsewhere, runnable on the CPU.

A cpu/cuda mix cannot happen on a CPU-only machine. Of the two things that caused it
in pruning, a tensor factory called without the input's device is checked over the
whole package in ``tests/test_device_following.py``; here, an infinite key reaching
the selection (the sampled bracket of ``gradsift.select`` turned a ``-inf`` key into
a ``nextafter`` of a CPU constant and a CUDA value). ``test_cuda.py`` runs every
method on a GPU.
"""

import torch

import gradsift
from gradsift.pruning import masks as masks_module


def test_no_infinite_key_reaches_the_selection(monkeypatch):
    seen = []
    real = masks_module.topk_mask

    def spy(keys, k, **kw):
        seen.append(bool(torch.isinf(keys).any()))
        return real(keys, k, **kw)

    monkeypatch.setattr(masks_module, "topk_mask", spy)
    gen = torch.Generator().manual_seed(0)
    scores = {"a": torch.randn(100_000, generator=gen), "b": torch.randn(50, generator=gen)}
    scores["b"][0] = -torch.inf  # a live -inf score: kept below every finite one
    first = gradsift.masks_from_scores(scores, 0.5)
    second = gradsift.masks_from_scores(scores, 0.55, previous=first)
    for budget in ("global", "uniform"):
        gradsift.masks_from_scores(scores, 0.6, previous=second, allocation=budget)
    assert seen and not any(seen)
    assert int(second["b"][0]) == 0
    total = sum(s.numel() for s in scores.values())
    assert sum(int(m.sum()) for m in second.values()) == total - round(0.55 * total)
    for name in scores:
        assert (second[name] <= first[name]).all()


def test_scores_and_masks_follow_the_models_dtype_and_device():
    """On the CPU the device cannot mix; the dtype can: float64 models score in float64."""
    from pruning_support import convnet, convnet_data

    model = convnet().double()
    data = [(x.double(), y) for x, y in convnet_data()]
    for method in gradsift.list_methods():
        scores = gradsift.score(model, method, data)
        masks = gradsift.masks_from_scores(scores, 0.9)
        for name, s in scores.items():
            assert s.device == model.get_parameter(name).device, (method, name)
            if method != "random":
                assert s.dtype == torch.float64, (method, name, s.dtype)
            assert masks[name].device == s.device

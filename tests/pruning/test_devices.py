"""Guards against tensors made on the CPU for a model elsewhere, runnable on the CPU.

A cpu/cuda mix cannot happen on a CPU-only machine, so these check the two things
that caused it: a tensor factory in ``gradsift.pruning`` called without the input's
device (and not moved to it), and an infinite key reaching the selection (the
sampled bracket of ``gradsift.select`` turned a ``-inf`` key into a ``nextafter`` of a
CPU constant and a CUDA value). ``test_cuda.py`` runs every method on a GPU.
"""

import ast
import pathlib

import torch

import gradsift
from gradsift.pruning import masks as masks_module

SOURCES = [
    *sorted(pathlib.Path(gradsift.pruning.__file__).parent.rglob("*.py")),
    pathlib.Path(gradsift.__file__).parent / "budget.py",
    pathlib.Path(gradsift.__file__).parent / "checks.py",
]
FACTORIES = {
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "eye",
    "rand", "randn", "randint", "randperm",
}  # fmt: skip


def _placed(node: ast.Call, parents: dict) -> bool:
    """The factory call names a device, or its value is moved with ``.to(...)`` or
    copied into an existing tensor (``t.copy_(...)``) within the same expression."""
    if any(kw.arg == "device" for kw in node.keywords):
        return True
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.Call) and child in parent.args:
            func = parent.func
            return isinstance(func, ast.Attribute) and func.attr == "copy_"
        if isinstance(parent, ast.Attribute) and parent.attr == "to":
            return True
        if not isinstance(parent, (ast.Attribute, ast.Call)):
            return False
        child, parent = parent, parents.get(parent)
    return False


def test_no_tensor_factory_in_pruning_ignores_the_device():
    unplaced = []
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        parents = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for node in ast.walk(tree):
            func = node.func if isinstance(node, ast.Call) else None
            if (
                isinstance(func, ast.Attribute)
                and func.attr in FACTORIES
                and isinstance(func.value, ast.Name)
                and func.value.id == "torch"
                and not _placed(node, parents)
            ):
                unplaced.append(f"{path.name}:{node.lineno} torch.{func.attr}")
    assert not unplaced, f"tensors made without the input's device: {unplaced}"


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

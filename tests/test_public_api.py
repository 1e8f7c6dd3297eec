"""The public names users and scripts rely on: each exists and is what it claims."""

import inspect

import torch

import gradsift
import gradsift.distributed
import gradsift.select

LIBRARY = [
    "NonFiniteGradError",
    "TopK",
    "__version__",
    "apply_masks_",
    "list_methods",
    "masks_from_scores",
    "prune_at_init",
    "register_method",
    "score",
    "shuffle_masks",
    "sparsify_grads_",
    "sparsity_report",
    "topk_indices",
]


def test_library_names():
    assert sorted(gradsift.__all__) == sorted(LIBRARY)
    for name in LIBRARY:
        assert hasattr(gradsift, name), f"gradsift.{name} is in __all__ but missing"
    assert issubclass(gradsift.TopK, torch.optim.Optimizer)
    assert issubclass(gradsift.NonFiniteGradError, ValueError)
    assert set(gradsift.list_methods()) >= {"grasp", "magnitude", "random", "snip", "synflow"}
    assert set(gradsift.list_methods()) >= {"force", "iter_snip", "ntk_sap", "prospr", "synflow_l2"}
    for fn in ("topk_indices", "score", "prune_at_init", "sparsify_grads_", "masks_from_scores"):
        assert callable(getattr(gradsift, fn)), fn
    params = inspect.signature(gradsift.TopK).parameters
    assert [n for n, p in params.items() if p.kind is p.KEYWORD_ONLY] == [
        "k",
        "density",
        "error_feedback",
        "scope",
        "momentum_correction",
        "backend",
    ]
    for fn in (gradsift.topk_indices, gradsift.select.topk_mask, gradsift.TopK):
        assert inspect.signature(fn).parameters["backend"].default == "auto", fn


def test_distributed_names():
    assert sorted(gradsift.distributed.__all__) == [
        "TopKHookState",
        "compress_",
        "crossover_density",
        "dgc_warmup",
        "sparse_pays",
        "topk_hook",
    ]
    state = gradsift.distributed.TopKHookState(density=0.1)
    assert state.density == 0.1 and state.k is None
    assert callable(gradsift.distributed.topk_hook)

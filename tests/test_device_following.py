"""Every tensor the library makes follows its inputs' device, shown on a CPU-only machine.

A GPU run fails when a library function makes a tensor on the CPU for CUDA inputs
(issue 27: Iterative SNIP and SynFlow crashed in ``nextafter`` of a CPU constant and a
CUDA value). CI has no GPU, so these tests make the same mistake visible on CPU: the
inputs are built on the CPU, then the library runs with the *default* device set to
``meta``. A factory called without the inputs' device now makes a meta tensor, and
mixing it with the CPU inputs raises ("Tensor on device meta is not on the expected
device cpu"), or reading it raises ("Cannot copy out of meta tensor"). A tensor made
deliberately on the host (a seeded CPU generator's draw, then moved) names
``device="cpu"``. Not every mix raises: torch 2.13 lets an in-place op take a meta
operand (``x.mul_(m)`` on a CPU ``x``), so ``test_no_tensor_factory_ignores_the_device``
also reads the package's sources for the mistake itself; ``tests/pruning/test_cuda.py``
and ``tests/gpu`` run on a GPU.
"""

import ast
import importlib.util
import pathlib
import warnings

import pytest
import torch
from torch import nn

import gradsift
from gradsift import TopK, masks_from_scores, prune_at_init, sparsify_grads_, topk_indices
from gradsift.distributed import TopKHookState, compress_, encoding as wire
from gradsift.pruning.sanity import SANITY
from gradsift.select import topk_mask
from gradsift.select.exact import CHUNK
from pruning_support import DictModel, convnet, dict_data

HAS_TRITON = importlib.util.find_spec("triton") is not None


def on_meta_default(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with tensors made without a device landing on ``meta``."""
    with torch.device("meta"):
        return fn(*args, **kwargs)


def reference_topk(x: torch.Tensor, k: int, absolute: bool) -> torch.Tensor:
    """Indices of the top ``k``, lowest-index ties, ascending (float64 brute force)."""
    key = (x.abs() if absolute else x).double()
    order = torch.sort(-key, stable=True).indices[:k]
    return torch.sort(order).values


# dense, sampled, and chunked (a whole chunk and a part of one)
@pytest.mark.parametrize("n", [1_000, 100_000, CHUNK + CHUNK // 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("absolute", [True, False])
def test_selection_makes_nothing_off_the_input_device(n, dtype, absolute):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen).to(dtype)
    for k in (1, n // 100, n // 2):
        idx = on_meta_default(topk_indices, x, k, absolute=absolute)
        assert idx.device == x.device
        torch.testing.assert_close(idx, reference_topk(x, k, absolute), rtol=0, atol=0)
        mask = on_meta_default(topk_mask, x, k, absolute=absolute)
        assert mask.device == x.device and int(mask.sum()) == k


def test_selection_nan_error_makes_nothing_off_the_input_device():
    x = torch.randn(100_000)
    x[7] = float("nan")
    with pytest.raises(ValueError, match="1 NaN"):
        on_meta_default(topk_indices, x, 10)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (the dev extra)")
def test_triton_selection_makes_nothing_off_the_input_device():
    import triton_support  # noqa: F401  (the interpreter where there is no GPU)

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40_000, generator=gen).to(triton_support.DEVICE)
    for absolute in (True, False):
        idx = on_meta_default(topk_indices, x, 400, absolute=absolute, backend="triton")
        torch.testing.assert_close(
            idx.cpu(), reference_topk(x.cpu(), 400, absolute), rtol=0, atol=0
        )


def _mlp(dtype=torch.float32, frozen=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    model[2].to(dtype)
    if frozen:  # a parameter without a gradient this step
        model[0].bias.requires_grad_(False)
    return model


def _forward(model, x):
    h = model[1](model[0](x))
    return model[2](h.to(model[2].weight.dtype)).float()


def _inner(name):
    return {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
        "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
    }[name]


STEPS = {
    "sgd": ("sgd", {}, {}),
    "sgd-momentum": ("sgd-momentum", {}, {}),
    "momentum-correction": ("sgd", {"momentum_correction": 0.9}, {}),
    "layer": ("sgd", {"scope": "layer"}, {}),
    "adamw": ("adamw", {}, {}),
    "no-feedback": ("sgd", {"error_feedback": False}, {}),
    "two-dtypes": ("sgd", {}, {"dtype": torch.float64}),
    "frozen-bias": ("sgd", {}, {"frozen": True}),
}
if HAS_TRITON:
    STEPS["triton-fused"] = ("sgd", {"backend": "triton", "momentum_correction": 0.9}, {})


@pytest.mark.parametrize("case", list(STEPS))
def test_topk_step_makes_nothing_off_the_parameters_device(case):
    if case.startswith("triton"):
        import triton_support  # noqa: F401  (the interpreter where there is no GPU)
    inner, options, model_options = STEPS[case]
    model = _mlp(**model_options)
    opt = TopK(_inner(inner)(model.parameters()), density=0.01, **options)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(16, 64, generator=gen) for _ in range(3)]

    def train():
        for x in batches:
            opt.zero_grad()
            _forward(model, x).square().mean().backward()
            opt.step()
        return opt.state_dict()

    state = on_meta_default(train)
    on_meta_default(opt.load_state_dict, state)
    for p in model.parameters():
        assert p.device.type == "cpu" and torch.isfinite(p).all()
    for s in opt.state.values():
        for v in s.values():
            assert not isinstance(v, torch.Tensor) or v.device.type == "cpu"


def test_sparsify_grads_makes_nothing_off_the_grads_device():
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(100_000, generator=gen), torch.randn(50, 30, generator=gen).double()]
    params, expected = [], []
    for out in (params, expected):
        for g in grads:
            out.append(nn.Parameter(torch.zeros_like(g)))
            out[-1].grad = g.clone()
    sparsify_grads_(expected, density=0.01)
    assert on_meta_default(sparsify_grads_, params, density=0.01) == 1015
    for p, e in zip(params, expected):
        assert e.grad.count_nonzero() < e.numel()  # something was dropped
        torch.testing.assert_close(p.grad, e.grad, rtol=0, atol=0)


@pytest.mark.parametrize("encoding", [e for e in wire.ENCODINGS if e != "auto"])
def test_hook_compression_makes_nothing_off_the_grads_device(encoding):
    gen = torch.Generator().manual_seed(0)
    grad = torch.randn(200_000, generator=gen)
    state = TopKHookState(density=0.01, momentum_correction=0.9, value_dtype=torch.bfloat16)
    idx, values = on_meta_default(compress_, state, grad, [(0, 0)], [grad.numel()])
    message = on_meta_default(wire.encode, idx, values, grad.numel(), encoding)
    back, sent = on_meta_default(
        wire.decode, message, grad.numel(), idx.numel(), encoding, values.dtype
    )
    torch.testing.assert_close(back, idx, rtol=0, atol=0)
    torch.testing.assert_close(sent, values, rtol=0, atol=0)


@pytest.mark.parametrize("unused", [False, True], ids=["", "find_unused_parameters"])
def test_the_ddp_hook_makes_nothing_off_the_grads_device(one_rank, unused):
    """The whole hook in a one-rank DDP world (its header's all-gather included: NCCL
    refuses a CPU buffer for CUDA gradients), bit for bit the run made without meta;
    with find_unused_parameters, the flags' all-reduce too."""
    from torch.nn.parallel import DistributedDataParallel

    from gradsift.distributed import topk_hook

    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(16, 64, generator=gen) for _ in range(4)]

    def on_meta_hook(state, bucket):
        return on_meta_default(topk_hook, state, bucket)

    params = []
    for hook in (topk_hook, on_meta_hook):
        model = DistributedDataParallel(_mlp(), find_unused_parameters=unused)
        # a dense step, then sparse
        state = TopKHookState(density=0.01, start_iter=1, find_unused_parameters=unused)
        model.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in batches:
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        params.append([p.detach() for p in model.parameters()])
    for got, want in zip(*params):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_masks_from_scores_makes_nothing_off_the_scores_device():
    gen = torch.Generator().manual_seed(0)
    scores = {"a.weight": torch.randn(100_000, generator=gen), "b.weight": torch.randn(50, 8)}
    first = on_meta_default(masks_from_scores, scores, 0.5)
    for allocation in ("global", "uniform", "erk"):
        masks = on_meta_default(
            masks_from_scores, scores, 0.6, previous=first, allocation=allocation
        )
        assert all(m.device.type == "cpu" for m in masks.values())
        assert sum(int(m.sum()) for m in masks.values()) == 100_400 - round(0.6 * 100_400)


def _iterations(method):
    return 1 if gradsift.pruning.get_method(method).paper_iterations == 1 else 3


@pytest.mark.parametrize("method", gradsift.list_methods())
def test_every_method_makes_nothing_off_the_models_device(method):
    model = convnet(hidden=64)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(60, 1, 6, 6, generator=gen), torch.arange(60) % 3) for _ in range(2)]
    masks = on_meta_default(
        prune_at_init, model, method, 0.9, data, iterations=_iterations(method), min_per_layer=2
    )
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.9 * total)
    assert all(m.device.type == "cpu" for m in masks.values())


@pytest.mark.parametrize("method", ["snip", "grasp", "force", "prospr"])
def test_dict_batches_make_nothing_off_the_models_device(method):
    model = DictModel()

    def split(batch):
        return {k: v for k, v in batch.items() if k != "labels"}, batch["labels"]

    def loss(out, y):
        return nn.functional.cross_entropy(out["logits"], y)

    options = gradsift.pruning.supported_options(
        method, split_batch=split, loss_fn=loss, temperature=1.0, num_classes=3, samples_per_class=2
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # DictModel's coverage warning
        on_meta_default(prune_at_init, model, method, 0.5, dict_data(), **options)


@pytest.mark.parametrize("sanity", list(SANITY))
def test_sanity_variants_make_nothing_off_the_models_device(sanity):
    model = convnet(hidden=64)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(30, 1, 6, 6, generator=gen), torch.arange(30) % 3)]
    on_meta_default(prune_at_init, model, "snip", 0.8, data, sanity=sanity, generator=gen)


PACKAGE = pathlib.Path(gradsift.__file__).parent
# made on the host by design: benchmark inputs, datasets, and a model's shape probe
HOST_SIDE = ("lab/bench/", "lab/data.py", "lab/models.py")
SOURCES = [
    p for p in sorted(PACKAGE.rglob("*.py"))
    if not p.relative_to(PACKAGE).as_posix().startswith(HOST_SIDE)
]  # fmt: skip
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


def test_no_tensor_factory_ignores_the_device():
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
                unplaced.append(f"{path.relative_to(PACKAGE)}:{node.lineno} torch.{func.attr}")
    assert not unplaced, f"tensors made without the input's device: {unplaced}"

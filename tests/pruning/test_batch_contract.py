"""One batch contract for every criterion (``gradsift.pruning.inputs``): each prunes a
dict-input model, a ``TransformerEncoderLayer`` model and a tied Embedding + Linear
model exactly, under every batch form, or refuses in one clear error."""

import warnings

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import gradsift
from gradsift import prune_at_init
from gradsift.pruning import supported_options
from pruning_support import DictModel, Encoder, Tied, dict_data, encoder_data, token_data

METHODS = gradsift.list_methods()
DATA_FREE = {"synflow", "synflow_l2", "ntk_sap"}  # real-valued inputs of their own
SPARSITY = 0.5


def split(batch):
    return {k: v for k, v in batch.items() if k != "labels"}, batch["labels"]


def logits_loss(out, y):
    return F.cross_entropy(out["logits"], y)


def cases():
    """``(model factory, data, options)`` per batch form."""
    pairs = [split(b) for b in dict_data()]  # (dict inputs, labels)
    return {
        "dict+split_batch": (
            DictModel,
            dict_data(),
            {"split_batch": split, "loss_fn": logits_loss},
        ),
        "(dict, labels)": (DictModel, pairs, {"loss_fn": logits_loss}),
        "encoder": (Encoder, encoder_data(), {}),
        "tied": (Tied, token_data(), {}),
    }


def refuses(method, case) -> bool:
    return method in DATA_FREE and case != "encoder"


@pytest.mark.parametrize("case", list(cases()))
@pytest.mark.parametrize("method", METHODS)
def test_every_method_prunes_every_batch_form_exactly_or_refuses(method, case):
    factory, data, options = cases()[case]
    model = factory()
    options = supported_options(
        method, **options, temperature=1.0, num_classes=3, samples_per_class=2
    )
    if case == "tied":
        options = supported_options(method, num_classes=10, samples_per_class=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the coverage warning of DictModel
        if refuses(method, case):
            with pytest.raises(ValueError, match=rf"{method}.*(token ids|data-free)"):
                prune_at_init(model, method, SPARSITY, data, **options)
            assert not torch.nn.utils.prune.is_pruned(model)
            return
        masks = prune_at_init(model, method, SPARSITY, data, **options)
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(SPARSITY * total)
    x, _ = data[0] if not isinstance(data[0], dict) else split(data[0])
    out = model(**x) if isinstance(x, dict) else model(x)  # the pruned model still runs
    logits = out["logits"] if isinstance(out, dict) else out
    assert torch.isfinite(logits).all()


def test_tied_weights_are_one_weight_in_every_criterion():
    for method in sorted(set(METHODS) - DATA_FREE):
        options = supported_options(method, num_classes=10, samples_per_class=2)
        scores = gradsift.score(Tied(), method, token_data(), **options)
        assert list(scores) == ["a.weight", "decoder.weight"], method


def test_grasp_refuses_per_token_targets_before_any_work():
    data = [(x, torch.zeros_like(x)) for x, _ in token_data()]  # a label per token
    with pytest.raises(ValueError, match=r"grasp.*one class index per sample.*\(20, 5\)"):
        gradsift.score(Tied(), "grasp", data, num_classes=10)

"""Hugging Face GPT-2 and BERT (small configs, random init, nothing downloaded): the
default selection covers their blocks (GPT-2's ``Conv1D``), and every criterion prunes
them exactly from dict batches or refuses in one clear error. Skips without
``transformers``."""

import warnings

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

import gradsift
from gradsift import prune_at_init
from gradsift.pruning import supported_options
from gradsift.pruning.params import prunable

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install)")

METHODS = gradsift.list_methods()
DATA_FREE = {"synflow", "synflow_l2", "ntk_sap"}
VOCAB, SEQ, BATCH = 128, 8, 6


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=0, eos_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


def bert(vocab=VOCAB):
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, num_labels=3,
    )  # fmt: skip
    return transformers.BertForSequenceClassification(config)


def batches(n_batches=2, labels="class"):
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n_batches):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
        y = torch.arange(BATCH) % 3 if labels == "class" else ids
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": y})
    return out


def split(batch):
    return {k: v for k, v in batch.items() if k != "labels"}, batch["labels"]


def classification_loss(out, y):
    return F.cross_entropy(out.logits, y)


def lm_loss(out, y):  # next-token prediction, one target per token
    logits = out.logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1))


def test_gpt2_default_selection_covers_its_conv1d_blocks():
    model = gpt2()
    names = list(prunable(model))
    assert "transformer.h.0.attn.c_attn.weight" in names
    assert "transformer.h.1.mlp.c_proj.weight" in names
    assert names[-1] == "lm_head.weight"  # tied to the embedding: selected once
    selected = sum(model.get_parameter(n).numel() for n in names)
    assert selected > 0.5 * sum(p.numel() for p in model.parameters())
    masks = prune_at_init(model, "magnitude", 0.9)
    assert int(masks["transformer.h.0.attn.c_attn.weight"].sum()) < 32 * 96


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("arch", ["gpt2", "bert"])
def test_every_method_prunes_hf_models_exactly_or_refuses(method, arch):
    model = gpt2() if arch == "gpt2" else bert()
    data = batches(labels="token" if arch == "gpt2" else "class")
    loss = lm_loss if arch == "gpt2" else classification_loss
    options = supported_options(
        method, split_batch=split, loss_fn=loss, temperature=1.0, num_classes=3,
        samples_per_class=2,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # BERT: the coverage warning
        if method in DATA_FREE or (method == "grasp" and arch == "gpt2"):
            pattern = "per-token" if method == "grasp" else "data-free"
            with pytest.raises(ValueError, match=rf"{method}.*{pattern}"):
                prune_at_init(model, method, 0.9, data, **options)
            return
        masks = prune_at_init(model, method, 0.9, data, **options)
    total = sum(m.numel() for m in masks.values())
    assert sum(int(m.sum()) for m in masks.values()) == total - round(0.9 * total)
    x, _ = split(data[0])
    assert torch.isfinite(model(**x).logits).all()


def test_bert_default_selection_warns_that_embeddings_are_left_out():
    with pytest.warns(UserWarning, match=r"covers .*Embedding.*params="):
        prunable(bert(vocab=4096))  # its word embeddings: most of the parameters

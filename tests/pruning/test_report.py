"""Per-layer density and the collapse flag."""

import torch

import gradsift
from gradsift import sparsity_report
from pruning_support import convnet


def test_sparsity_report():
    model = convnet()
    report = sparsity_report(model)
    assert report.density == 1.0 and not report.collapsed
    masks = {
        "0.weight": torch.zeros(4, 1, 3, 3),
        "4.weight": torch.ones(16, 144),
        "6.weight": torch.ones(3, 16),
    }
    gradsift.apply_masks_(model, masks)
    report = sparsity_report(model)
    assert report.collapsed == ["0.weight"]
    assert report.kept == 16 * 144 + 48
    assert "COLLAPSED" in str(report)
    assert report.to_dict()["layers"][0]["density"] == 0.0


def test_a_tied_weight_counts_what_any_holder_prunes_and_removed_masks_their_zeros():
    """An Embedding tied to a Linear decoder, pruned through the Embedding: reported
    under the decoder's name, it is the same pruned tensor. After prune.remove the
    zeros are the pruning (a collapsed layer stays collapsed)."""
    from torch import nn
    from torch.nn.utils import prune

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.dec = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
            self.dec.weight = self.emb.weight

    torch.manual_seed(0)
    tied = Tied()
    prune.custom_from_mask(tied.emb, "weight", torch.arange(40).view(10, 4) % 2 == 0)
    report = sparsity_report(tied)
    assert [(x.name, x.kept, x.total) for x in report.layers] == [("dec.weight", 20, 40)]
    model = convnet()
    gradsift.apply_masks_(model, {"0.weight": torch.zeros(4, 1, 3, 3)})
    prune.remove(model[0], "weight")
    assert sparsity_report(model).collapsed == ["0.weight"]

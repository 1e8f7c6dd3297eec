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

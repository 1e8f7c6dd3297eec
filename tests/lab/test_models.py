"""Every model builds and trains a step."""

import pytest
import torch

from gradsift.lab.models import build_model, list_models


@pytest.mark.parametrize("name", list_models())
@pytest.mark.parametrize("shape, classes", [((1, 8, 8), 10), ((3, 32, 32), 100)])
def test_model_forward_backward(name, shape, classes):
    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=classes)
    x = torch.randn(2, *shape)
    out = model(x)
    assert out.shape == (2, classes)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_unknown_model():
    with pytest.raises(ValueError, match="model must be one of"):
        build_model("alexnet")

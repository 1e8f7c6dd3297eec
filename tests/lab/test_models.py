"""Every model builds and trains a step."""

import pytest
import torch

from gradsift.lab.models import build_model, list_models


@pytest.mark.parametrize("name", list_models())
@pytest.mark.parametrize("shape, classes", [((1, 8, 8), 10), ((3, 32, 32), 100)])
def test_model_forward_backward(name, shape, classes):
    torch.manual_seed(0)
    if name == "lenet5_caffe" and shape[1] < 16:
        with pytest.raises(ValueError, match="at least 16x16"):
            build_model(name, input_shape=shape, num_classes=classes)
        return
    model = build_model(name, input_shape=shape, num_classes=classes)
    x = torch.randn(2, *shape)
    out = model(x)
    assert out.shape == (2, classes)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_unknown_model():
    with pytest.raises(ValueError, match="model must be one of"):
        build_model("alexnet")


def _weights(model):
    return [tuple(m.weight.shape) for m in model.modules() if hasattr(m, "weight")]


def test_snip_lenets_on_mnist_shapes():
    lenet300 = build_model("lenet300_100", input_shape=(1, 28, 28), num_classes=10)
    assert _weights(lenet300) == [(300, 784), (100, 300), (10, 100)]
    assert sum(p.numel() for p in lenet300.parameters()) == 266_200 + 410
    caffe = build_model("lenet5_caffe", input_shape=(1, 28, 28), num_classes=10)
    assert _weights(caffe) == [(20, 1, 5, 5), (50, 20, 5, 5), (500, 800), (10, 500)]
    assert sum(p.numel() for p in caffe.parameters()) == 430_500 + 580
    # Caffe's LeNet: a ReLU after fc 500 only
    assert sum(isinstance(m, torch.nn.ReLU) for m in caffe.modules()) == 1

"""A small model zoo: MLP (LeNet-300-100), LeNet-5, LeNet-5-Caffe, CIFAR
VGG-11/16/19 (with/without BatchNorm), CIFAR ResNet-20/32. Each takes ``input_shape``
(C, H, W) and ``num_classes`` so it runs on 8x8 digits as well as on 32x32 CIFAR
(LeNet-5-Caffe, unpadded, needs at least 16x16).

- LeNet-5: LeCun, Bottou, Bengio & Haffner, "Gradient-based learning applied to
  document recognition", Proc. IEEE 1998.
- LeNet-300-100 and LeNet-5-Caffe: the MNIST networks of Lee, Ajanthan & Torr,
  "SNIP: Single-shot Network Pruning based on Connection Sensitivity", ICLR 2019,
  arXiv:1810.02340, Table 2 (after Han et al. 2015, arXiv:1506.02626).
- VGG: Simonyan & Zisserman, "Very Deep Convolutional Networks for Large-Scale Image
  Recognition", 2014, arXiv:1409.1556 (CIFAR variant: one linear classifier after
  global pooling, as used in the SNIP/GraSP/SynFlow experiments).
- ResNet-20/32: He, Zhang, Ren & Sun, "Deep Residual Learning for Image
  Recognition", 2015, arXiv:1512.03385, Sec. 4.2 (CIFAR-10 networks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

__all__ = [
    "build_model",
    "init_weights_",
    "list_models",
    "MLP",
    "LeNet5",
    "LeNet5Caffe",
    "VGG",
    "CifarResNet",
    "CifarResNet18",
]


class MLP(nn.Module):
    """Fully connected ReLU network (LeNet-300-100 by default)."""

    def __init__(self, input_shape=(1, 28, 28), num_classes=10, hidden=(300, 100)):
        super().__init__()
        dims = [int(torch.tensor(input_shape).prod())] + list(hidden)
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(dims[-1], num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def _flat_size(features: nn.Module, input_shape) -> int:
    with torch.no_grad():
        return int(features(torch.zeros(1, *input_shape)).numel())


class LeNet5(nn.Module):
    """Two 5x5 conv + max-pool stages and three linear layers (padding keeps 8x8 valid)."""

    def __init__(self, input_shape=(1, 28, 28), num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(input_shape[0], 6, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(_flat_size(self.features, input_shape), 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


class LeNet5Caffe(nn.Module):
    """Caffe's LeNet as SNIP prunes it: conv 20@5x5, max-pool 2, conv 50@5x5, max-pool
    2, fc 500 + ReLU, fc 10, no padding (28x28 -> 4x4x50 = 800 features) and, as in
    Caffe's ``lenet_train_test.prototxt`` and SNIP's code, no ReLU after the convs."""

    def __init__(self, input_shape=(1, 28, 28), num_classes=10):
        super().__init__()
        side = min(input_shape[1:])
        if ((side - 4) // 2 - 4) // 2 < 1:
            raise ValueError(
                f"lenet5_caffe has no padding and needs inputs of at least 16x16, "
                f"got {tuple(input_shape[1:])}"
            )
        self.features = nn.Sequential(
            nn.Conv2d(input_shape[0], 20, 5),
            nn.MaxPool2d(2),
            nn.Conv2d(20, 50, 5),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(_flat_size(self.features, input_shape), 500),
            nn.ReLU(),
            nn.Linear(500, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


_VGG = {
    11: [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    16: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    19: [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M"]
    + [512, 512, 512, 512, "M", 512, 512, 512, 512, "M"],
}


class VGG(nn.Module):
    """CIFAR VGG: 3x3 convs (+BatchNorm), max-pools while the map is >= 2 pixels."""

    def __init__(self, depth=16, input_shape=(3, 32, 32), num_classes=10, batch_norm=True):
        super().__init__()
        if depth not in _VGG:
            raise ValueError(f"depth must be one of {sorted(_VGG)}, got {depth}")
        layers: list[nn.Module] = []
        channels, size = input_shape[0], min(input_shape[1:])
        for v in _VGG[depth]:
            if v == "M":
                if size >= 2:  # small inputs (8x8 digits) skip the late pools
                    layers.append(nn.MaxPool2d(2))
                    size //= 2
                continue
            layers.append(nn.Conv2d(channels, v, 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(v))
            layers.append(nn.ReLU(inplace=True))
            channels = v
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:  # option B: projection shortcut
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class _StagedResNet(nn.Module):
    """A 3x3 stem, then stages of ``n`` basic blocks with ``widths`` channels (each
    stage after the first halves the resolution), global pooling and a linear head."""

    def __init__(self, widths, n, input_shape, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(input_shape[0], widths[0], 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for stage, cout in enumerate(widths):
            for i in range(n):
                blocks.append(_BasicBlock(cin, cout, 2 if stage and i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.layers(torch.relu(self.bn(self.conv(x))))))


class CifarResNet(_StagedResNet):
    """ResNet-(6n+2) for CIFAR: three stages of n basic blocks, 16/32/64 channels.
    Where a stage changes width the shortcut is a 1x1 projection (He et al.'s option
    B; their CIFAR nets use option A, zero padding): 272,474 parameters at depth 20."""

    def __init__(self, depth=20, input_shape=(3, 32, 32), num_classes=10, width=16):
        if (depth - 2) % 6:
            raise ValueError(f"depth must be 6n+2 (20, 32, 44, 56, ...), got {depth}")
        super().__init__((width, 2 * width, 4 * width), (depth - 2) // 6, input_shape, num_classes)


class CifarResNet18(_StagedResNet):
    """ResNet-18 for 32x32 inputs (3x3 stem, no max-pool; four stages of two basic
    blocks, 64-512 channels): 11.2M parameters, the usual CIFAR variant of He et al."""

    def __init__(self, input_shape=(3, 32, 32), num_classes=10):
        super().__init__((64, 128, 256, 512), 2, input_shape, num_classes)


_MODELS: dict[str, Callable[..., nn.Module]] = {
    "mlp": MLP,
    "lenet300_100": lambda **kw: MLP(hidden=(300, 100), **kw),
    "lenet5": LeNet5,
    "lenet5_caffe": LeNet5Caffe,
    "vgg11": lambda **kw: VGG(11, batch_norm=False, **kw),
    "vgg11_bn": lambda **kw: VGG(11, batch_norm=True, **kw),
    "vgg16": lambda **kw: VGG(16, batch_norm=False, **kw),
    "vgg16_bn": lambda **kw: VGG(16, batch_norm=True, **kw),
    "vgg19": lambda **kw: VGG(19, batch_norm=False, **kw),
    "vgg19_bn": lambda **kw: VGG(19, batch_norm=True, **kw),
    "resnet20": lambda **kw: CifarResNet(20, **kw),
    "resnet32": lambda **kw: CifarResNet(32, **kw),
    "resnet18": CifarResNet18,
}


def init_weights_(model: nn.Module) -> nn.Module:
    """Kaiming-normal Conv/Linear weights (He et al. 2015, arXiv:1502.01852), zero
    biases, unit BatchNorm: the initialisation of the SNIP/GraSP/SynFlow experiments.

    PyTorch's default (uniform, fan-in-scaled by 1/sqrt(3)) leaves a network pruned to
    90% with activations that shrink layer by layer until it does not train.
    """
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def list_models() -> list[str]:
    """Names accepted by ``build_model``."""
    return sorted(_MODELS)


def build_model(name: str, *, input_shape=(3, 32, 32), num_classes: int = 10) -> nn.Module:
    """A fresh model from the zoo, for inputs of ``input_shape`` and ``num_classes``."""
    if name not in _MODELS:
        raise ValueError(f"model must be one of {list_models()}, got {name!r}")
    return init_weights_(_MODELS[name](input_shape=tuple(input_shape), num_classes=num_classes))

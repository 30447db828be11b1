"""``resnet18`` and ``resnet50``: the ImageNet-style ResNets of He et al. (2016) at a reduced width.

Two of the CNNs of Checkmate's (Jain et al., 2020) Table 2, written here without torchvision: a
7x7 stride-2 conv+BN+ReLU and a 3x3 stride-2 max-pool, four stages of [2, 2, 2, 2]
:class:`~.resnet.BasicBlock` (ResNet-18) or [3, 4, 6, 3] :class:`Bottleneck` blocks (ResNet-50,
expansion 4) with 1x1 conv+BN projection shortcuts, global average pool, Linear. ``width`` is the
stem's channel count, 64 in the paper: 8 / 16 / 32 for ``resnet18`` and 4 / 16 / 32 for
``resnet50`` at tiny / small / medium, every later layer keeping its ratio to it; the images are
32 or 64 px.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import shortcut
from .registry import register
from .resnet import BasicBlock


class Bottleneck(nn.Module):
    """ResNet-50 block: 1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4, each with BN;
    a 1x1 conv+BN projection shortcut when the shape changes."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int):
        super().__init__()
        c_out = planes * self.expansion
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = shortcut(c_in, c_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.shortcut(x))


class ImageNetResNet(nn.Module):
    """ImageNet-style ResNet: 7x7 stride-2 conv+BN+ReLU and a 3x3 stride-2 max-pool, four
    stages of ``blocks`` (:class:`BasicBlock` or :class:`Bottleneck`) at widths ``width`` x
    1, 2, 4, 8 (strides 1, 2, 2, 2), global average pool, Linear."""

    def __init__(self, block: type, blocks: tuple[int, ...], width: int, classes: int = 10):
        super().__init__()
        expansion = getattr(block, "expansion", 1)
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        c = width
        for i, n in enumerate(blocks):
            planes = width * 2**i
            stage = []
            for j in range(n):
                stage.append(block(c, planes, 2 if (i > 0 and j == 0) else 1))
                c = planes * expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
        self.stages = len(blocks)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for i in range(self.stages):
            x = getattr(self, f"layer{i + 1}")(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@register(
    "resnet18",
    tiny=dict(batch=2, image=32, width=8),
    small=dict(batch=128, image=64, width=16),
    medium=dict(batch=256, image=64, width=32),
)
def _resnet18(batch, image, width):
    model = ImageNetResNet(BasicBlock, (2, 2, 2, 2), width)
    return model, (torch.randn(batch, 3, image, image),), {}


@register(
    "resnet50",
    tiny=dict(batch=2, image=32, width=4),
    small=dict(batch=32, image=64, width=16),
    medium=dict(batch=64, image=64, width=32),
)
def _resnet50(batch, image, width):
    model = ImageNetResNet(Bottleneck, (3, 4, 6, 3), width)
    return model, (torch.randn(batch, 3, image, image),), {}

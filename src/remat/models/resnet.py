"""The CIFAR-style ResNet ``resnet``, and :class:`BasicBlock`, which ``resnet18`` reuses.

After the CIFAR-10 networks of He et al. (2016, "Deep Residual Learning for Image
Recognition"): a 3x3 conv+BN+ReLU stem, three stages of basic blocks (3x3 conv+BN+ReLU, 3x3
conv+BN, a shortcut added before the last ReLU) at widths ``width`` x 1, 2, 4 with strides 1, 2,
2, global average pool, Linear. Where the shape changes the shortcut is a 1x1 conv+BN projection.
The ImageNet-style ``resnet18`` and ``resnet50`` are in :mod:`.resnet_imagenet`, registered after
the VGGs, which is their place in :func:`names`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import conv_bn, shortcut
from .registry import register


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = shortcut(c_in, c_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stem, three stages of basic blocks (strides 1, 2, 2)."""

    def __init__(self, width: int, blocks: int, classes: int = 10):
        super().__init__()
        self.stem = conv_bn(3, width, inplace=True)
        layers, c = [], width
        for i, w in enumerate((width, 2 * width, 4 * width)):
            for j in range(blocks):
                layers.append(BasicBlock(c, w, 2 if (i > 0 and j == 0) else 1))
                c = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


@register(
    "resnet",
    tiny=dict(batch=2, image=16, width=8, blocks=1),
    small=dict(batch=32, image=32, width=16, blocks=2),
    medium=dict(batch=128, image=32, width=16, blocks=3),
)
def _resnet(batch, image, width, blocks):
    return ResNet(width, blocks), (torch.randn(batch, 3, image, image),), {}

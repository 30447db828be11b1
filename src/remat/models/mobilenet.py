"""``mobilenet``: MobileNet v1 (Howard et al., 2017), at a reduced width.

One of the CNNs of Checkmate's (Jain et al., 2020) Table 2, written here without torchvision: a
3x3 stride-2 conv, then 13 depthwise 3x3 + pointwise 1x1 pairs with the paper's stride pattern
(each conv followed by BN+ReLU), global average pool, Linear. ``width`` is the stem's channel
count, 32 in the paper and 8 / 16 / 32 here at tiny / small / medium (medium is the full-width
network); every later layer keeps its ratio to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import conv_bn
from .registry import register


# (output channels as a multiple of the stem's, stride) of MobileNet v1's 13 depthwise-separable
# layers.
_MOBILENET_LAYERS = (
    (2, 1), (4, 2), (4, 1), (8, 2), (8, 1), (16, 2),
    (16, 1), (16, 1), (16, 1), (16, 1), (16, 1), (32, 2), (32, 1),
)


def _depthwise_separable(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_in, 3, stride=stride, padding=1, groups=c_in, bias=False),
        nn.BatchNorm2d(c_in),
        nn.ReLU(inplace=True),
        nn.Conv2d(c_in, c_out, 1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


class MobileNet(nn.Module):
    """MobileNet v1: a 3x3 stride-2 conv+BN+ReLU with ``width`` channels (32 in the paper),
    13 depthwise 3x3 + pointwise 1x1 pairs (each with BN+ReLU), global average pool, Linear."""

    def __init__(self, width: int, classes: int = 10):
        super().__init__()
        layers, c = [conv_bn(3, width, stride=2, inplace=True)], width
        for multiple, stride in _MOBILENET_LAYERS:
            layers.append(_depthwise_separable(c, multiple * width, stride))
            c = multiple * width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


@register(
    "mobilenet",
    tiny=dict(batch=2, image=32, width=8),
    small=dict(batch=32, image=64, width=16),
    medium=dict(batch=64, image=64, width=32),
)
def _mobilenet(batch, image, width):
    return MobileNet(width), (torch.randn(batch, 3, image, image),), {}

"""``vgg11`` and ``vgg16``: configurations A and D of Simonyan & Zisserman (2015), at a reduced width.

Two of the CNNs of Checkmate's (Jain et al., 2020) Table 2, written here without torchvision:
stacks of 3x3 conv+ReLU without BatchNorm separated by five 2x2 max-pools (32 px images end at
1x1), then Linear+ReLU, Linear+ReLU and a Linear head, without dropout. ``width`` is the first
layer's channel count, 64 in the paper and 8 / 16 / 32 here at tiny / small / medium; every later
layer keeps its ratio to it.
"""

from __future__ import annotations

import torch
from torch import nn

from .registry import register


_VGG_CONFIGS = {  # Simonyan & Zisserman, configurations A and D; "M" is a 2x2 max-pool
    "vgg11": (1, "M", 2, "M", 4, 4, "M", 8, 8, "M", 8, 8, "M"),
    "vgg16": (1, 1, "M", 2, 2, "M", 4, 4, 4, "M", 8, 8, 8, "M", 8, 8, 8, "M"),
}


class VGG(nn.Module):
    """Conv3x3+ReLU stacks (no BatchNorm) separated by max-pools, then Linear+ReLU, Linear+ReLU,
    Linear (no dropout). ``layers`` lists channel multiples of ``width`` and "M" for pools;
    ``image`` must halve to 1 at the last pool (32 for five pools)."""

    def __init__(self, layers: tuple, width: int, hidden: int, classes: int = 10, c_in: int = 3):
        super().__init__()
        features: list[nn.Module] = []
        c = c_in
        for item in layers:
            if item == "M":
                features.append(nn.MaxPool2d(2))
            else:
                features += [nn.Conv2d(c, item * width, 3, padding=1), nn.ReLU(inplace=True)]
                c = item * width
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(
            nn.Linear(c, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def _vgg(name: str):
    def builder(batch, image, width, hidden):
        return VGG(_VGG_CONFIGS[name], width, hidden), (torch.randn(batch, 3, image, image),), {}

    return builder


register(
    "vgg11",
    tiny=dict(batch=2, image=32, width=8, hidden=64),
    small=dict(batch=192, image=32, width=16, hidden=128),
    medium=dict(batch=384, image=32, width=32, hidden=256),
)(_vgg("vgg11"))
register(
    "vgg16",
    tiny=dict(batch=2, image=32, width=8, hidden=64),
    small=dict(batch=128, image=32, width=16, hidden=128),
    medium=dict(batch=256, image=32, width=32, hidden=256),
)(_vgg("vgg16"))

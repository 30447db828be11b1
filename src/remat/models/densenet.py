"""``densenet``: DenseNet-style dense blocks (Huang et al., 2017), at a reduced size.

Every layer of a dense block reads the concatenation of the block's input and all earlier
layers' outputs (BN-ReLU-conv1x1 bottleneck to ``4 x growth`` channels, then BN-ReLU-conv3x3 to
``growth``), so each feature map is read by every later layer of its block: the branchy graph
that defeats chain planners. Blocks are joined by transitions (BN-ReLU-conv1x1 halving the
channels, 2x2 average pool); the head is BN-ReLU, global average pool and a Linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .registry import register


class DenseLayer(nn.Module):
    def __init__(self, c_in: int, growth: int):
        super().__init__()
        self.bottleneck = nn.Sequential(nn.BatchNorm2d(c_in), nn.ReLU(), nn.Conv2d(c_in, 4 * growth, 1, bias=False))
        self.conv = nn.Sequential(nn.BatchNorm2d(4 * growth), nn.ReLU(),
                                  nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return self.conv(self.bottleneck(torch.cat(features, dim=1)))


class DenseNet(nn.Module):
    """A 3x3 stem conv with ``2 x growth`` channels, ``len(block_layers)`` dense blocks of
    :class:`DenseLayer` joined by transitions, and a classifier over ``classes``."""

    def __init__(self, growth: int, block_layers: tuple[int, ...], classes: int = 10):
        super().__init__()
        c = 2 * growth
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.blocks = nn.ModuleList()
        self.transitions = nn.ModuleList()
        for b, layers in enumerate(block_layers):
            self.blocks.append(nn.ModuleList(DenseLayer(c + k * growth, growth) for k in range(layers)))
            c += layers * growth
            if b + 1 < len(block_layers):
                self.transitions.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                                                      nn.AvgPool2d(2)))
                c //= 2
        self.head = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU())
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b, block in enumerate(self.blocks):
            features = [x]
            for layer in block:
                features.append(layer(features))
            x = torch.cat(features, dim=1)
            if b < len(self.transitions):
                x = self.transitions[b](x)
        x = F.adaptive_avg_pool2d(self.head(x), 1).flatten(1)
        return self.fc(x)


@register(
    "densenet",
    tiny=dict(growth=4, block_layers=(2, 2), batch=2, image=16),
    small=dict(growth=8, block_layers=(4, 4, 4), batch=10, image=32),
    medium=dict(growth=12, block_layers=(6, 12, 24), batch=16, image=32),
)
def _densenet(growth, block_layers, batch, image):
    model = DenseNet(growth, tuple(block_layers))
    return model, (torch.randn(batch, 3, image, image),), {}

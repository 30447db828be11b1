"""``unet``: U-Net (Ronneberger et al., 2015) with padded convolutions, at a reduced width.

One of the CNNs of Checkmate's (Jain et al., 2020) Table 2, written here from the paper: four
down levels of double conv3x3+BN+ReLU and a 2x2 max-pool, a bottleneck double conv, four up
levels (2x2 stride-2 ``ConvTranspose2d``, concatenation with the skip, double conv) and a 1x1
output conv. It returns the ``(batch, 2, H, W)`` map, whose sum is the loss. ``width`` is the
first level's channel count, 64 in the paper and 4 / 8 / 16 here at tiny / small / medium.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import conv_bn
from .registry import register


def _double_conv(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(conv_bn(c_in, c_out, inplace=True), conv_bn(c_out, c_out, inplace=True))


class UNetUp(nn.Module):
    """2x2 stride-2 transposed conv halving the channels, concatenation with the skip, double conv."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.up = nn.ConvTranspose2d(c_in, c_out, 2, stride=2)
        self.conv = _double_conv(2 * c_out, c_out)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    """U-Net (Ronneberger et al., 2015) with padded convs: ``levels`` down levels of double
    conv3x3+BN+ReLU and a 2x2 max-pool (widths ``width`` x 1, 2, 4, 8), a bottleneck double
    conv, as many :class:`UNetUp` levels, and a 1x1 output conv. The image side must divide
    by ``2**levels``; the output is a ``(batch, classes, H, W)`` map."""

    def __init__(self, width: int, levels: int = 4, classes: int = 2, c_in: int = 3):
        super().__init__()
        widths = [width * 2**i for i in range(levels + 1)]
        self.down = nn.ModuleList()
        c = c_in
        for w in widths[:-1]:
            self.down.append(_double_conv(c, w))
            c = w
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = _double_conv(c, widths[-1])
        self.up = nn.ModuleList(UNetUp(widths[i + 1], widths[i]) for i in reversed(range(levels)))
        self.out = nn.Conv2d(width, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for down in self.down:
            x = down(x)
            skips.append(x)
            x = self.pool(x)
        x = self.bottleneck(x)
        for up, skip in zip(self.up, reversed(skips)):
            x = up(x, skip)
        return self.out(x)


@register(
    "unet",
    tiny=dict(batch=2, image=32, width=4),
    small=dict(batch=16, image=64, width=8),
    medium=dict(batch=32, image=64, width=16),
)
def _unet(batch, image, width):
    return UNet(width), (torch.randn(batch, 3, image, image),), {}

"""Building blocks shared by several model families (the small CNN, the ResNets, MobileNet, U-Net)."""

from __future__ import annotations

from torch import nn


def conv_bn(c_in: int, c_out: int, stride: int = 1, inplace: bool = False) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=inplace),
    )


def shortcut(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    """A residual block's shortcut: the identity, or a 1x1 conv+BN projection where the shape changes."""
    if stride != 1 or c_in != c_out:
        return nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))
    return nn.Sequential()

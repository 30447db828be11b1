"""Building blocks shared by several model families (the small CNN, the ResNets, MobileNet, U-Net)."""

from __future__ import annotations

from torch import nn


def _conv_bn(c_in: int, c_out: int, stride: int = 1, inplace: bool = False) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=inplace),
    )

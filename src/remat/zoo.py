"""Built-in example models: random weights, nothing downloaded, deterministic for a seed.

The zoo feeds the tests, the benchmarks, ``remat demo`` and the CLI::

    from remat import zoo
    ex = zoo.build("resnet", size="small", seed=0)
    out = ex.model(*ex.args, **ex.kwargs)
    ex.loss(out).backward()
    zoo.names()        # ['mlp', 'cnn_bn', 'dropout_mlp', ...]

Every model is returned in ``train()`` mode and captures with
``torch.compile(ex.model, backend=..., fullgraph=True)`` without graph breaks.
The same ``(name, size, seed)`` gives the same weights and inputs on every call; building
does not disturb the caller's global RNG state.

Sizes:

- ``tiny``: gradient-equality tests; forward+backward in at most a few milliseconds (about 10
  for ``resnet50``, whose 53 convolutions are mostly per-op overhead at this size).
- ``small`` (default): memory tests; 30-60 MiB saved for backward, so that allocator noise of
  a few hundred KiB does not matter; a step takes 20-80 ms on two CPU cores.
- ``medium``: benchmarks; 120-250 MiB saved for backward; a step takes 0.1-0.4 s.

Measured on torch 2.13 CPU, two cores, float32 (``python -m remat.zoo`` reprints it).
*saved* is what autograd keeps for the backward pass (storages of the tensors packed by
``saved_tensors_hooks``, each counted once, parameters and inputs excluded); *peak* is the
growth of the process's resident memory high-water mark over one eager forward+backward,
with ``.grad`` cleared first (it also holds temporaries and the gradients the step makes;
``-`` for tiny, whose small blocks never leave glibc's heap); *step* is the best of several
eager forward+backward times on an otherwise idle machine (2 threads).

=============  ======  ===========  ==========  ========
model          size    saved MiB    peak MiB    step ms
=============  ======  ===========  ==========  ========
mlp            tiny            0.0           -       0.1
mlp            small          40.0        48.0      73.4
mlp            medium        144.0       167.9     399.4
dropout_mlp    tiny            0.1           -       0.2
dropout_mlp    small          48.0        50.1      57.1
dropout_mlp    medium        192.0       199.9     339.1
cnn_bn         tiny            0.2           -       0.8
cnn_bn         small          33.0        34.8      17.8
cnn_bn         medium        222.8       234.1     175.6
inplace_views  tiny            0.1           -       0.4
inplace_views  small          39.0        52.5      53.0
inplace_views  medium        156.0       208.0     236.4
tied           tiny            0.2           -       0.4
tied           small          57.7        88.8      51.3
tied           medium        248.7       373.5     334.6
two_outputs    tiny            0.0           -       0.1
two_outputs    small          32.0        39.8      58.4
two_outputs    medium        120.0       143.9     330.5
resnet         tiny            0.2           -       2.0
resnet         small          33.5        35.1      24.3
resnet         medium        190.0       196.3     125.5
vgg11          tiny            0.2           -       1.5
vgg11          small          45.1        48.9      43.9
vgg11          medium        180.4       196.2     291.9
vgg16          tiny            0.4           -       3.1
vgg16          small          45.3        48.9      50.3
vgg16          medium        181.2       195.5     333.0
resnet18       tiny            0.1           -       3.2
resnet18       small          53.8        55.5      39.6
resnet18       medium        215.3       222.0     230.3
resnet50       tiny            0.2           -       9.9
resnet50       small          53.2        55.9      42.6
resnet50       medium        212.9       223.5     155.0
mobilenet      tiny            0.4           -       4.2
mobilenet      small          50.4        52.2      24.7
mobilenet      medium        201.3       209.1     131.5
unet           tiny            0.6           -       3.9
unet           small          40.8        51.4      30.8
unet           medium        163.3       188.2     130.5
gpt2           tiny            2.4           -       2.8
gpt2           small          47.5        55.3      33.0
gpt2           medium        227.0       242.5     152.6
bert           tiny            1.7           -       2.7
bert           small          37.0        44.8      30.7
bert           medium        182.0       197.6     141.2
vit            tiny            0.6           -       1.7
vit            small          38.7        41.9      32.8
vit            medium        150.9       156.9     126.7
llama          tiny            1.8           -       2.8
llama          small          38.2        45.9      27.7
llama          medium        190.0       205.5     131.5
=============  ======  ===========  ==========  ========

Models:

- ``mlp``: ``nn.Sequential`` of Linear+ReLU layers; returns a ``(batch, classes)`` tensor.
- ``cnn_bn``: Conv2d+BatchNorm2d+ReLU stages with max-pooling, then a linear head.
- ``dropout_mlp``: Linear+ReLU+Dropout layers with ``p`` cycling through 0.1, 0.3, 0.5.
- ``inplace_views``: blocks made of in-place ops (``mul_``, ``add_``, ``nn.ReLU(inplace=True)``),
  a slicing write ``h[..., :k] = h[..., :k] * 2`` and views (view, reshape, transpose,
  permute, narrow, chunk).
- ``tied``: a small language model whose token embedding is also its output projection
  (one Parameter used twice); takes ``input_ids`` and ``targets``, returns the scalar loss.
- ``two_outputs``: returns ``(logits, features)``; ``features`` is also the head's input.
  ``Example.loss`` weights them 1.0 and 0.5.
- ``resnet``: CIFAR-style ResNet of basic blocks (conv-BN-ReLU, BN, shortcut), three stages.
- ``vgg11``, ``vgg16``, ``resnet18``, ``resnet50``, ``mobilenet``, ``unet``: the CNNs of
  Checkmate's (Jain et al., 2020) Table 2, written here (no torchvision) with the channel counts
  scaled down by a width multiplier and small images (32 or 64 px):

  - ``vgg11``, ``vgg16``: VGG configurations A and D, conv3x3+ReLU stacks without BatchNorm and
    five 2x2 max-pools (32 px images end at 1x1), then a Linear+ReLU, Linear+ReLU, Linear head
    without dropout. First-layer width 8 / 16 / 32 (64 in the paper).
  - ``resnet18``, ``resnet50``: ImageNet-style ResNets (7x7 stride-2 conv, BN, ReLU, max-pool;
    stages of [2, 2, 2, 2] basic blocks or [3, 4, 6, 3] bottleneck blocks with expansion 4,
    1x1 conv+BN projection shortcuts; average pool; Linear). Stem width 8 / 16 / 32 for
    ``resnet18``, 4 / 16 / 32 for ``resnet50`` (64 in the paper).
  - ``mobilenet``: MobileNet v1, a 3x3 stride-2 conv then 13 depthwise 3x3 + pointwise 1x1
    pairs (each conv followed by BN+ReLU) with the paper's stride pattern, average pool, Linear.
    Stem width 8 / 16 / 32 (32 in the paper: medium is the full-width network).
  - ``unet``: U-Net with padded convs: four down levels of double conv3x3+BN+ReLU and a max-pool,
    a bottleneck double conv, four up levels (2x2 stride-2 ``ConvTranspose2d``, concatenation
    with the skip, double conv), a 1x1 output conv; returns the ``(batch, 2, H, W)`` map, whose
    sum is the loss. First-level width 4 / 8 / 16 (64 in the paper).
- ``gpt2``, ``bert``, ``vit``, ``llama``: ``transformers`` models built from configs (random
  weights, default dropout kept), wrapped in :class:`LossOnly` so the output is the scalar
  loss computed from ``labels``. Need the ``transformers`` package (``pip install remat[models]``).
  For ``fullgraph=True`` (checked with transformers 5.23) the one setting that is needed is
  ``model.loss_type = "ForCausalLM"`` on GPT-2: its class name maps to no loss type, and the
  ``logger.warning_once`` transformers then calls inside forward is a graph break. The rest are
  for a simpler graph: ``use_cache=False`` (no KV cache objects), ``return_dict=False`` (a
  tuple, the loss first), ``config.problem_type`` for ViT (not assigned during forward), and
  ``config._attn_implementation = "eager"``, so the joint graph holds the attention scores,
  softmax and dropout as separate ops a planner can free or recompute (``"sdpa"`` captures too,
  as one fused op).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Example", "build", "names", "LossOnly"]

SIZES = ("tiny", "small", "medium")


@dataclass
class Example:
    """A model with example inputs and a way to turn its output into a scalar loss.

    ``weights`` are the per-output weights :meth:`loss` uses when the model returns a tuple.
    """

    name: str
    model: nn.Module
    args: tuple
    kwargs: dict
    weights: tuple[float, ...] | None = None
    size: str = "small"
    seed: int = 0

    def loss(self, output: Any) -> torch.Tensor:
        """Scalar loss of ``output``: itself if scalar, else the sum of its elements; for a
        tuple of outputs, the sum of their losses weighted by ``self.weights``."""
        if isinstance(output, (tuple, list)):
            weights = self.weights or (1.0,) * len(output)
            if len(weights) != len(output):
                raise ValueError(f"{self.name}: {len(output)} outputs but {len(weights)} weights")
            return sum(w * self.loss(o) for w, o in zip(weights, output))
        if not isinstance(output, torch.Tensor):
            loss = getattr(output, "loss", None)  # a transformers ModelOutput
            if loss is None:
                raise TypeError(f"{self.name}: cannot make a loss from a {type(output).__name__}")
            return loss
        return output if output.dim() == 0 else output.sum()

    def step(self) -> torch.Tensor:
        """Run one forward + backward with the example inputs; return the loss (detached)."""
        loss = self.loss(self.model(*self.args, **self.kwargs))
        loss.backward()
        return loss.detach()


# ---------------------------------------------------------------------------------------------
# Models


def _mlp_layers(d_in: int, width: int, depth: int, dropout: tuple[float, ...] = ()) -> list:
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(d_in if i == 0 else width, width), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout[i % len(dropout)]))
    return layers


class MLP(nn.Sequential):
    """``depth`` Linear+ReLU layers (optionally followed by Dropout) and a Linear head."""

    def __init__(self, d_in: int, width: int, depth: int, d_out: int, dropout: tuple[float, ...] = ()):
        super().__init__(*_mlp_layers(d_in, width, depth, dropout), nn.Linear(width, d_out))


def _conv_bn(c_in: int, c_out: int, stride: int = 1, inplace: bool = False) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=inplace),
    )


class CNN(nn.Module):
    """Stages of two Conv-BN-ReLU layers and a 2x2 max-pool; global average pool; Linear."""

    def __init__(self, widths: tuple[int, ...], classes: int = 10, c_in: int = 3):
        super().__init__()
        stages, c = [], c_in
        for w in widths:
            stages += [_conv_bn(c, w), _conv_bn(w, w), nn.MaxPool2d(2)]
            c = w
        self.features = nn.Sequential(*stages)
        self.head = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class InplaceViewBlock(nn.Module):
    """In-place ops, a slicing write and views; every in-place op comes before anything
    autograd saves from the same storage, so eager backward is valid."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.fc_in = nn.Linear(dim, 2 * dim)
        self.bias = nn.Parameter(torch.zeros(2 * dim))
        self.act = nn.ReLU(inplace=True)
        self.fc_out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.fc_in(x)  # (b, s, 2d)
        h.mul_(0.5)
        k = d // 2
        h[:, :, :k] = h[:, :, :k] * 2  # slicing write
        h.add_(self.bias)
        h = self.act(h)  # relu_, saves its result
        a, g = h.chunk(2, dim=-1)  # two (b, s, d) views
        a = a.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        g = g.reshape(b, s, self.heads, d // self.heads).permute(0, 2, 1, 3)
        m = (a * torch.sigmoid(g)).transpose(1, 2).reshape(b, s, d)
        y = self.fc_out(m)
        y.add_(x)  # in-place residual
        return y


class InplaceViews(nn.Module):
    def __init__(self, dim: int, heads: int, depth: int):
        super().__init__()
        self.blocks = nn.Sequential(*[InplaceViewBlock(dim, heads) for _ in range(depth)])
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(x)
        return self.head(y.narrow(1, 0, y.shape[1] // 2))


class _MLPBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(F.gelu(self.fc1(self.norm(h))))


class TiedLM(nn.Module):
    """Token embedding, residual MLP blocks, and an output projection sharing the embedding
    weight. ``forward(input_ids, targets)`` returns the mean cross-entropy."""

    def __init__(self, vocab: int, dim: int, depth: int, max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)
        self.blocks = nn.Sequential(*[_MLPBlock(dim) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        nn.init.normal_(self.embed.weight, std=dim**-0.5)
        self.lm_head.weight = self.embed.weight  # tied: the same Parameter twice

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos[: input_ids.shape[1]]
        logits = self.lm_head(self.norm(self.blocks(h)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class TwoOutputs(nn.Module):
    """An MLP trunk returning ``(logits, features)``; ``features`` also feeds the head."""

    def __init__(self, d_in: int, width: int, depth: int, classes: int):
        super().__init__()
        self.trunk = nn.Sequential(*_mlp_layers(d_in, width, depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.trunk(x)
        return self.head(features), features


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stem, three stages of basic blocks (strides 1, 2, 2)."""

    def __init__(self, width: int, blocks: int, classes: int = 10):
        super().__init__()
        self.stem = _conv_bn(3, width, inplace=True)
        layers, c = [], width
        for i, w in enumerate((width, 2 * width, 4 * width)):
            for j in range(blocks):
                layers.append(BasicBlock(c, w, 2 if (i > 0 and j == 0) else 1))
                c = w
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


# Checkmate's (Jain et al., 2020) Table 2 CNNs, at a width multiplier: ``width`` is the channel
# count of the first layer, which the paper's models have at 64 (VGG, ResNet, U-Net) or 32
# (MobileNet); every later layer keeps its ratio to it.

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
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

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


# MobileNet v1 (Howard et al., 2017): (output channels as a multiple of the stem's, stride) of
# its 13 depthwise-separable layers.
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
        layers, c = [_conv_bn(3, width, stride=2, inplace=True)], width
        for multiple, stride in _MOBILENET_LAYERS:
            layers.append(_depthwise_separable(c, multiple * width, stride))
            c = multiple * width
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def _double_conv(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(_conv_bn(c_in, c_out, inplace=True), _conv_bn(c_out, c_out, inplace=True))


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


class LossOnly(nn.Module):
    """Wraps a ``transformers`` model called with ``labels``; returns only its scalar loss
    (``return_dict=False`` puts it first), so the logits are not a graph output."""

    def __init__(self, model: nn.Module, **call_options: Any):
        super().__init__()
        self.model = model
        self.call_options = call_options

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model(*args, **kwargs, **self.call_options, return_dict=False)[0]


# ---------------------------------------------------------------------------------------------
# Builders: each takes a size's settings and returns (model, args, kwargs), using the global
# RNG, which build() has seeded inside a forked RNG state.

_BUILDERS: dict[str, Callable[..., tuple[nn.Module, tuple, dict]]] = {}
_CONFIGS: dict[str, dict[str, dict[str, Any]]] = {}


def _register(name: str, **sizes: dict[str, Any]):
    def deco(fn):
        _BUILDERS[name] = fn
        _CONFIGS[name] = sizes
        return fn

    return deco


@_register(
    "mlp",
    tiny=dict(batch=32, d_in=64, width=64, depth=4),
    small=dict(batch=4096, d_in=256, width=256, depth=10),
    medium=dict(batch=8192, d_in=384, width=384, depth=12),
)
def _mlp(batch, d_in, width, depth):
    return MLP(d_in, width, depth, 10), (torch.randn(batch, d_in),), {}


@_register(
    "dropout_mlp",
    tiny=dict(batch=32, d_in=64, width=64, depth=4),
    small=dict(batch=2048, d_in=256, width=256, depth=8),
    medium=dict(batch=4096, d_in=512, width=512, depth=8),
)
def _dropout_mlp(batch, d_in, width, depth):
    model = MLP(d_in, width, depth, 10, dropout=(0.1, 0.3, 0.5))
    return model, (torch.randn(batch, d_in),), {}


@_register(
    "cnn_bn",
    tiny=dict(batch=4, image=16, widths=(8, 16)),
    small=dict(batch=16, image=64, widths=(16, 32, 64)),
    medium=dict(batch=24, image=96, widths=(32, 64, 128)),
)
def _cnn_bn(batch, image, widths):
    return CNN(widths), (torch.randn(batch, 3, image, image),), {}


@_register(
    "inplace_views",
    tiny=dict(batch=4, seq=16, dim=32, heads=4, depth=2),
    small=dict(batch=8, seq=256, dim=256, heads=8, depth=4),
    medium=dict(batch=16, seq=512, dim=256, heads=8, depth=4),
)
def _inplace_views(batch, seq, dim, heads, depth):
    return InplaceViews(dim, heads, depth), (torch.randn(batch, seq, dim),), {}


@_register(
    "tied",
    tiny=dict(batch=4, seq=16, vocab=100, dim=32, depth=2),
    small=dict(batch=16, seq=128, vocab=2000, dim=128, depth=4),
    medium=dict(batch=16, seq=256, vocab=4000, dim=192, depth=6),
)
def _tied(batch, seq, vocab, dim, depth):
    model = TiedLM(vocab, dim, depth, seq)
    ids = torch.randint(0, vocab, (batch, seq + 1))
    return model, (), {"input_ids": ids[:, :-1].contiguous(), "targets": ids[:, 1:].contiguous()}


@_register(
    "two_outputs",
    tiny=dict(batch=32, d_in=64, width=64, depth=3),
    small=dict(batch=4096, d_in=256, width=256, depth=8),
    medium=dict(batch=8192, d_in=384, width=384, depth=10),
)
def _two_outputs(batch, d_in, width, depth):
    return TwoOutputs(d_in, width, depth, 10), (torch.randn(batch, d_in),), {}


@_register(
    "resnet",
    tiny=dict(batch=2, image=16, width=8, blocks=1),
    small=dict(batch=32, image=32, width=16, blocks=2),
    medium=dict(batch=128, image=32, width=16, blocks=3),
)
def _resnet(batch, image, width, blocks):
    return ResNet(width, blocks), (torch.randn(batch, 3, image, image),), {}


def _vgg(name: str):
    def builder(batch, image, width, hidden):
        return VGG(_VGG_CONFIGS[name], width, hidden), (torch.randn(batch, 3, image, image),), {}

    return builder


_register(
    "vgg11",
    tiny=dict(batch=2, image=32, width=8, hidden=64),
    small=dict(batch=192, image=32, width=16, hidden=128),
    medium=dict(batch=384, image=32, width=32, hidden=256),
)(_vgg("vgg11"))
_register(
    "vgg16",
    tiny=dict(batch=2, image=32, width=8, hidden=64),
    small=dict(batch=128, image=32, width=16, hidden=128),
    medium=dict(batch=256, image=32, width=32, hidden=256),
)(_vgg("vgg16"))


@_register(
    "resnet18",
    tiny=dict(batch=2, image=32, width=8),
    small=dict(batch=128, image=64, width=16),
    medium=dict(batch=256, image=64, width=32),
)
def _resnet18(batch, image, width):
    model = ImageNetResNet(BasicBlock, (2, 2, 2, 2), width)
    return model, (torch.randn(batch, 3, image, image),), {}


@_register(
    "resnet50",
    tiny=dict(batch=2, image=32, width=4),
    small=dict(batch=32, image=64, width=16),
    medium=dict(batch=64, image=64, width=32),
)
def _resnet50(batch, image, width):
    model = ImageNetResNet(Bottleneck, (3, 4, 6, 3), width)
    return model, (torch.randn(batch, 3, image, image),), {}


@_register(
    "mobilenet",
    tiny=dict(batch=2, image=32, width=8),
    small=dict(batch=32, image=64, width=16),
    medium=dict(batch=64, image=64, width=32),
)
def _mobilenet(batch, image, width):
    return MobileNet(width), (torch.randn(batch, 3, image, image),), {}


@_register(
    "unet",
    tiny=dict(batch=2, image=32, width=4),
    small=dict(batch=16, image=64, width=8),
    medium=dict(batch=32, image=64, width=16),
)
def _unet(batch, image, width):
    return UNet(width), (torch.randn(batch, 3, image, image),), {}


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the transformers models of remat.zoo need the 'transformers' package: "
            "pip install 'remat[models]'"
        ) from e
    return transformers


def _finish_hf(model: nn.Module, loss_type: str, **call_options: Any) -> LossOnly:
    # With no loss type, transformers logs a warning from inside forward: a graph break.
    model.loss_type = loss_type
    return LossOnly(model, **call_options)


_GPT2 = dict(n_layer=2, n_embd=128, n_head=4, vocab=1000, positions=256)


@_register(
    "gpt2",
    tiny=dict(_GPT2, batch=2, seq=32),
    small=dict(_GPT2, batch=8, seq=128),
    medium=dict(_GPT2, n_layer=4, batch=8, seq=256),
)
def _gpt2(n_layer, n_embd, n_head, vocab, positions, batch, seq):
    tf = _transformers()
    config = tf.GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab, n_positions=positions,
        bos_token_id=0, eos_token_id=0,
    )
    config._attn_implementation = "eager"
    model = _finish_hf(tf.GPT2LMHeadModel(config), "ForCausalLM", use_cache=False)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, (), {"input_ids": ids, "labels": ids.clone()}


_BERT = dict(layers=2, hidden=128, heads=4, vocab=1000, positions=256)


@_register(
    "bert",
    tiny=dict(_BERT, batch=2, seq=32),
    small=dict(_BERT, batch=8, seq=128),
    medium=dict(_BERT, layers=4, batch=8, seq=256),
)
def _bert(layers, hidden, heads, vocab, positions, batch, seq):
    tf = _transformers()
    config = tf.BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=4 * hidden, max_position_embeddings=positions, pad_token_id=0,
    )
    config._attn_implementation = "eager"
    model = _finish_hf(tf.BertForMaskedLM(config), "ForMaskedLM")
    ids = torch.randint(1, vocab, (batch, seq))
    labels = torch.where(torch.rand(batch, seq) < 0.15, ids, torch.full_like(ids, -100))
    labels[:, 0] = ids[:, 0]  # at least one labelled token per row
    return model, (), {"input_ids": ids, "labels": labels}


_VIT = dict(layers=2, hidden=128, heads=4, image=32, patch=4)


@_register(
    "vit",
    tiny=dict(_VIT, batch=2, image=16),
    small=dict(_VIT, batch=32),
    medium=dict(_VIT, layers=4, batch=64),
)
def _vit(layers, hidden, heads, image, patch, batch):
    tf = _transformers()
    config = tf.ViTConfig(
        image_size=image, patch_size=patch, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=4 * hidden, num_labels=10,
        problem_type="single_label_classification",  # else assigned inside forward
    )
    config._attn_implementation = "eager"
    model = _finish_hf(tf.ViTForImageClassification(config), "ForImageClassification")
    return model, (), {"pixel_values": torch.randn(batch, 3, image, image),
                       "labels": torch.randint(0, 10, (batch,))}


_LLAMA = dict(layers=2, hidden=128, heads=4, kv_heads=2, vocab=1000, positions=256)


@_register(
    "llama",
    tiny=dict(_LLAMA, batch=2, seq=32),
    small=dict(_LLAMA, batch=8, seq=128),
    medium=dict(_LLAMA, layers=4, batch=8, seq=256),
)
def _llama(layers, hidden, heads, kv_heads, vocab, positions, batch, seq):
    tf = _transformers()
    config = tf.LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=344, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions,
        bos_token_id=0, eos_token_id=0, attention_dropout=0.1,
    )
    config._attn_implementation = "eager"
    model = _finish_hf(tf.LlamaForCausalLM(config), "ForCausalLM", use_cache=False)
    ids = torch.randint(0, vocab, (batch, seq))
    return model, (), {"input_ids": ids, "labels": ids.clone()}


# ---------------------------------------------------------------------------------------------
# Public API


def names() -> list[str]:
    """Names accepted by :func:`build`, in a fixed order (small hand-written models first)."""
    return list(_BUILDERS)


def build(name: str, *, size: str = "small", seed: int = 0, device: str | torch.device = "cpu",
          batch: int | None = None) -> Example:
    """Build example ``name`` at ``size`` ("tiny", "small" or "medium") with weights and
    inputs drawn from ``seed``; the model is in train() mode, on ``device``. ``batch``, if
    given, replaces the size's batch size (the weights do not depend on it).

    The same arguments always give the same weights and inputs (they are drawn on the CPU,
    then moved), and the caller's RNG state is left as it was.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown example model {name!r}; choose one of {names()}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {list(SIZES)}")
    config = dict(_CONFIGS[name][size])
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an int >= 1, got {batch!r}")
        config["batch"] = batch
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, args, kwargs = _BUILDERS[name](**config)
    device = torch.device(device)
    model = model.to(device).train()
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) for k, v in kwargs.items()}
    weights = (1.0, 0.5) if name == "two_outputs" else None
    return Example(name, model, args, kwargs, weights=weights, size=size, seed=seed)


# ---------------------------------------------------------------------------------------------
# `python -m remat.zoo [size ...]`: re-measure the table in the module docstring.


def _saved_bytes(ex: Example) -> int:
    """Bytes autograd saves for backward (distinct storages, parameters/buffers/inputs excluded)."""
    skip = {t.untyped_storage().data_ptr() for t in ex.model.parameters()}
    skip |= {t.untyped_storage().data_ptr() for t in ex.model.buffers()}
    skip |= {t.untyped_storage().data_ptr() for t in (*ex.args, *ex.kwargs.values())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip and s.device.type != "meta":
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = ex.loss(ex.model(*ex.args, **ex.kwargs))
    loss.backward()
    return sum(seen.values())


def _peak_bytes(name: str, size: str) -> int:
    """Growth of VmHWM over one forward+backward on the CPU (Linux only), measured in a fresh
    process whose glibc sends blocks of 64 KiB and more straight to mmap, so freed memory
    leaves the resident set instead of hiding in the heap."""
    import os
    import subprocess
    import sys

    code = (
        "import torch, remat.zoo as z\n"
        f"ex = z.build({name!r}, size={size!r}); ex.step(); ex.model.zero_grad(set_to_none=True)\n"
        "def get(key):\n"
        "    with open('/proc/self/status') as f:\n"
        "        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))\n"
        "peaks = []\n"
        "for _ in range(3):\n"
        "    open('/proc/self/clear_refs', 'w').write('5'); start = get('VmRSS:')\n"
        "    ex.step(); peaks.append(get('VmHWM:') - start); ex.model.zero_grad(set_to_none=True)\n"
        "print(sorted(peaks)[1])\n"
    )
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _report(sizes: tuple[str, ...] = SIZES, repeat: int = 7) -> str:
    """One table row per model and size: saved MiB, peak MiB, best step ms of ``repeat``."""
    import time

    rows = []
    for name in names():
        for size in sizes:
            ex = build(name, size=size)
            ex.step()  # warm up
            saved = _saved_bytes(ex)
            times = []
            for _ in range(repeat):
                ex.model.zero_grad(set_to_none=True)
                t = time.perf_counter()
                ex.step()
                times.append(time.perf_counter() - t)
            step = min(times)
            peak = _peak_bytes(name, size)
            rows.append(f"{name:<13}  {size:<6}  {saved / 2**20:>11.1f}  {peak / 2**20:>10.1f}"
                        f"  {step * 1e3:>8.1f}")
            print(rows[-1], flush=True)
    return "\n".join(rows)


if __name__ == "__main__":
    import sys

    _report(tuple(sys.argv[1:]) or SIZES)

"""The small hand-written test models: ``mlp``, ``dropout_mlp``, ``cnn_bn``, ``inplace_views``,
``tied`` and ``two_outputs``.

They are not taken from a paper; each one exercises something a rematerialization planner has
to get right:

- ``mlp``: ``nn.Sequential`` of Linear+ReLU layers and a Linear head; a ``(batch, classes)`` output.
- ``dropout_mlp``: the same with a Dropout after every ReLU, ``p`` cycling through 0.1, 0.3, 0.5
  (random ops that a recomputation must replay with the same mask).
- ``cnn_bn``: stages of two Conv2d+BatchNorm2d+ReLU and a max-pool, then a linear head
  (BatchNorm's running statistics are buffers updated in training mode).
- ``inplace_views``: blocks of in-place ops (``mul_``, ``add_``, ``nn.ReLU(inplace=True)``), a
  slicing write ``h[..., :k] = h[..., :k] * 2`` and views (view, reshape, transpose, permute,
  narrow, chunk).
- ``tied``: a small language model whose token embedding is also its output projection (one
  Parameter used twice); takes ``input_ids`` and ``targets``, returns the scalar loss.
- ``two_outputs``: returns ``(logits, features)``, ``features`` being also the head's input;
  ``Example.loss`` weights them 1.0 and 0.5.

Two transformer blocks are here as classes only (not in the zoo): :class:`SDPABlock`
(``scaled_dot_product_attention``) and :class:`MHABlock` (``nn.MultiheadAttention``), each with an
MLP, returning the mean square of their output (the split tests and benchmark use them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .layers import conv_bn
from .registry import register


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


class CNN(nn.Module):
    """Stages of two Conv-BN-ReLU layers and a 2x2 max-pool; global average pool; Linear."""

    def __init__(self, widths: tuple[int, ...], classes: int = 10, c_in: int = 3):
        super().__init__()
        stages, c = [], c_in
        for w in widths:
            stages += [conv_bn(c, w), conv_bn(w, w), nn.MaxPool2d(2)]
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


class SDPABlock(nn.Module):
    """A pre-norm transformer block: causal ``scaled_dot_product_attention`` and a GELU MLP;
    ``forward(x)`` returns the mean square of the block's output (a scalar loss)."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = _MLPBlock(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.norm1(x)).split(d, -1))
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attention.transpose(1, 2).reshape(b, t, d))
        return self.mlp(x).square().mean()


class MHABlock(nn.Module):
    """``nn.MultiheadAttention`` (batch first; its averaged weights asked for, so the math path
    materialises the ``[batch * heads, tokens, tokens]`` scores) and a GELU MLP; returns the mean
    square of the block's output."""

    def __init__(self, dim: int = 64, heads: int = 4):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = _MLPBlock(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(x)
        return self.mlp(x + self.attn(y, y, y)[0]).square().mean()


class ConvBN(nn.Module):
    """A stem, max pooling and one residual block with BatchNorm, then a linear classifier over
    ``(images, targets)``: the smallest CNN whose floor BatchNorm and its max pooling set."""

    def __init__(self, c=16, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.block = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                   nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
        self.head = nn.Linear(c, classes)

    def forward(self, x, target):
        x = self.pool(self.stem(x))
        x = F.relu(x + self.block(x))
        return F.cross_entropy(self.head(F.adaptive_avg_pool2d(x, 1).flatten(1)), target)


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


@register(
    "mlp",
    tiny=dict(batch=32, d_in=64, width=64, depth=4),
    small=dict(batch=4096, d_in=256, width=256, depth=10),
    medium=dict(batch=8192, d_in=384, width=384, depth=12),
)
def _mlp(batch, d_in, width, depth):
    return MLP(d_in, width, depth, 10), (torch.randn(batch, d_in),), {}


@register(
    "dropout_mlp",
    tiny=dict(batch=32, d_in=64, width=64, depth=4),
    small=dict(batch=2048, d_in=256, width=256, depth=8),
    medium=dict(batch=4096, d_in=512, width=512, depth=8),
)
def _dropout_mlp(batch, d_in, width, depth):
    model = MLP(d_in, width, depth, 10, dropout=(0.1, 0.3, 0.5))
    return model, (torch.randn(batch, d_in),), {}


@register(
    "cnn_bn",
    tiny=dict(batch=4, image=16, widths=(8, 16)),
    small=dict(batch=16, image=64, widths=(16, 32, 64)),
    medium=dict(batch=24, image=96, widths=(32, 64, 128)),
)
def _cnn_bn(batch, image, widths):
    return CNN(widths), (torch.randn(batch, 3, image, image),), {}


@register(
    "inplace_views",
    tiny=dict(batch=4, seq=16, dim=32, heads=4, depth=2),
    small=dict(batch=8, seq=256, dim=256, heads=8, depth=4),
    medium=dict(batch=16, seq=512, dim=256, heads=8, depth=4),
)
def _inplace_views(batch, seq, dim, heads, depth):
    return InplaceViews(dim, heads, depth), (torch.randn(batch, seq, dim),), {}


@register(
    "tied",
    tiny=dict(batch=4, seq=16, vocab=100, dim=32, depth=2),
    small=dict(batch=16, seq=128, vocab=2000, dim=128, depth=4),
    medium=dict(batch=16, seq=256, vocab=4000, dim=192, depth=6),
)
def _tied(batch, seq, vocab, dim, depth):
    model = TiedLM(vocab, dim, depth, seq)
    ids = torch.randint(0, vocab, (batch, seq + 1))
    return model, (), {"input_ids": ids[:, :-1].contiguous(), "targets": ids[:, 1:].contiguous()}


@register(
    "two_outputs",
    tiny=dict(batch=32, d_in=64, width=64, depth=3),
    small=dict(batch=4096, d_in=256, width=256, depth=8),
    medium=dict(batch=8192, d_in=384, width=384, depth=10),
)
def _two_outputs(batch, d_in, width, depth):
    return TwoOutputs(d_in, width, depth, 10), (torch.randn(batch, d_in),), {}

"""Models for the CLI tests, named as ``tests.cli_models:FACTORY`` (the ``module:factory`` form)."""

import torch
from torch import nn


def tiny_mlp(batch: int = 256):
    """A 4-layer MLP and a batch of ``batch`` inputs: ``(model, args)``."""
    g = torch.Generator().manual_seed(0)
    layers = []
    for i in range(4):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(32, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model, (torch.randn(batch, 32, generator=g),)


def not_a_model():
    return "nothing useful"


NOT_CALLABLE = 3


def warns():
    """``tiny_mlp`` after a two-line warning (the CLI prints warnings on one line)."""
    import warnings

    warnings.warn("first line\nsecond line", UserWarning)
    return tiny_mlp()

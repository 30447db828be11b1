"""The registry of example models: :class:`Example`, the sizes, and :func:`build` / :func:`names`.

Each family module registers its builders with :func:`register` when it is imported; the
package's ``__init__`` imports the families in a fixed order, which is the order of
:func:`names`. A builder takes a size's settings and returns ``(model, args, kwargs)``, drawing
from the global RNG, which :func:`build` has seeded inside a forked RNG state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

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

    def loss_module(self) -> nn.Module:
        """The model with :meth:`loss` folded in: a module whose forward returns the scalar loss
        (one graph output, as a training step has), sharing the model's parameters."""
        return _WithLoss(self)

    def step(self) -> torch.Tensor:
        """Run one forward + backward with the example inputs; return the loss (detached)."""
        loss = self.loss(self.model(*self.args, **self.kwargs))
        loss.backward()
        return loss.detach()


class _WithLoss(nn.Module):
    """:meth:`Example.loss_module`'s module."""

    def __init__(self, example: Example):
        super().__init__()
        self.model = example.model
        # the loss needs only the name and weights: a copy of it without the model and inputs, so that
        # deep copies of this module copy nothing more
        self._loss = dataclasses.replace(example, model=None, args=(), kwargs={}).loss

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._loss(self.model(*args, **kwargs))


# Builders: each takes a size's settings and returns (model, args, kwargs), using the global
# RNG, which build() has seeded inside a forked RNG state.

_BUILDERS: dict[str, Callable[..., tuple[nn.Module, tuple, dict]]] = {}
_CONFIGS: dict[str, dict[str, dict[str, Any]]] = {}


def register(name: str, **sizes: dict[str, Any]):
    def deco(fn):
        _BUILDERS[name] = fn
        _CONFIGS[name] = sizes
        return fn

    return deco


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

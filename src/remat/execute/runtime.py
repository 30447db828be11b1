"""What a lowered plan calls at run time: boxed graph functions and exact random replays.

A random op (dropout, ``rand_like`` …) that a plan recomputes must draw the very same
numbers as its first run, or gradients are silently wrong. The lowered forward calls
:func:`rng_state` right before the op's first run; each recomputation then runs the op
through :func:`replay_random`, which swaps that state in and the current one back out,
so the rest of the step sees the generator exactly as if nothing had been recomputed.
"""

from __future__ import annotations

import torch
import torch.fx as fx


def rng_state(device: str) -> torch.Tensor:
    """The generator state of ``device`` now (a small CPU uint8 tensor)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_rng_state(dev)
    return torch.get_rng_state()


def set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def replay_random(state: torch.Tensor, rng_device: str, op, /, *args, **kwargs):
    """Run ``op(*args, **kwargs)`` with the generator set to ``state``; restore it afterwards.
    (Positional-only, so that an op's own ``device=`` keyword passes through.)"""
    dev = torch.device(rng_device)
    now = rng_state(rng_device)
    set_rng_state(dev, state)
    try:
        return op(*args, **kwargs)
    finally:
        set_rng_state(dev, now)


def boxed(gm: fx.GraphModule) -> fx.GraphModule:
    """Make ``gm`` take its arguments as one list that it empties, so that every tensor
    dies at its last use instead of living as long as the caller's argument list."""
    gm.graph.set_codegen(fx.graph._BoxedCodeGen())
    gm.recompile()
    return gm

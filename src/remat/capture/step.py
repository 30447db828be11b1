"""Running the training step once for capture, leaving nothing behind.

    with no_lasting_effects(model), training_step_mode():
        loss = model(*detached_copies(args))   # RNG streams and buffers as they were before

Capture runs the model's forward (and the measuring of a compiled step runs a whole step); the
user's random number streams, BatchNorm statistics and inputs must not change because of it.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn


@contextlib.contextmanager
def no_lasting_effects(model: nn.Module):
    """Run a forward pass for capture without changing RNG streams or buffers."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = sorted({b.device.index for b in model.parameters() if b.device.type == "cuda"} - {None})
    with torch.random.fork_rng(devices=devices):
        yield
    with torch.no_grad():
        for b, saved in buffers:
            b.copy_(saved)


@contextlib.contextmanager
def training_step_mode():
    """Gradients enabled and inference mode off, for capturing a training step."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def detached_copies(tree):
    """Detached copies of the tensors in ``tree``; a tensor passed twice (``labels=input_ids``) is
    copied once, so the copies alias as the originals do (Dynamo specialises on that: two copies
    would make the first real step a second capture)."""
    copies: dict[int, torch.Tensor] = {}

    def copy(t):
        if isinstance(t, torch.Tensor):
            if id(t) not in copies:
                copies[id(t)] = t.detach().clone().requires_grad_(t.requires_grad)
            return copies[id(t)]
        return t

    return torch.utils._pytree.tree_map(copy, tree)



__all__ = ["no_lasting_effects", "training_step_mode", "detached_copies"]

"""The cost model of an Inductor-compiled step (``cost_model="inductor"``, :func:`remat.compile`'s default).

Inductor runs two kinds of kernels, and each is priced the way it is best known:

* **extern kernels and fallbacks** (``mm``, ``bmm``, convolutions, ops without a lowering): Inductor
  calls the very ATen kernel eager PyTorch runs, so they are **profiled** on the device
  (:class:`~remat.cost.profile.ProfileCostModel`: timed once per signature, cached on disk). The
  roofline misjudges them most: small matrix products and convolutions run well below the peak rate.
* **loops Inductor generates** (pointwise ops, reductions, their fused chains): priced by the
  **roofline** per op (:class:`~remat.cost.flops.FlopsCostModel`), and a fused group of them as *one*
  kernel (:meth:`InductorCostModel.kernel_seconds`)::

      seconds(group) = max(sum of its ops' FLOPs / F, (bytes of the group's inputs + outputs) / B)
                       + t_op + random numbers drawn / R

  An inlined value is computed in registers and never read or written, so it moves no bytes; the
  sum of the ops' own costs (what ``"flops"`` charges) counts every intermediate's bytes and every
  op's overhead. :func:`remat.inductor.fusion.fuse` applies it to the groups whose ops are all generated.

Measured on this project's CPU benchmarks (one process, alternating rounds, :mod:`remat.inductor`):
the predicted compute of a plan came within 2% of the measured step (GPT-2 8 layers: 651 ms predicted,
652 measured; ``"flops"`` predicted 725), and ResNet-18's plans at two of Inductor's matched peaks
ran 3.3% and 3.9% faster (the convolutions it used to recompute now cost what they cost, its batch-norm and ReLU chains
what they cost fused).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from ..cost import INDUCTOR_COST_MODEL, register_cost_model
from ..cost.flops import FlopsCostModel, node_flops, node_random_draws
from ..cost.machine import Roofline, machine_roofline
from ..cost.profile import ProfileCostModel
from .fusion import generated_by_inductor

__all__ = ["InductorCostModel"]


class InductorCostModel:
    """Seconds of the ops of a joint graph that Inductor compiles (see the module docstring)."""

    name = "inductor"

    def __init__(self, device: torch.device | str = "cpu", roofline: Roofline | None = None):
        self.roofline = roofline if roofline is not None else machine_roofline(device)
        self.loops = FlopsCostModel(roofline=self.roofline)
        self.extern = ProfileCostModel(device=device)

    def node_seconds(self, node: fx.Node) -> float:
        """One op alone: profiled when Inductor calls an ATen kernel for it, else its roofline."""
        if node.op != "call_function" or generated_by_inductor(node):
            return self.loops.node_seconds(node)
        return self.extern.node_seconds(node)

    def kernel_seconds(self, ops: list[fx.Node], nbytes: int) -> float:
        """A group of generated ops fused into one kernel that reads and writes ``nbytes`` in all."""
        r = self.roofline
        seconds = r.seconds(sum(node_flops(op) for op in ops), nbytes)
        drawn = sum(node_random_draws(op) for op in ops)
        return seconds + drawn / r.random_elements_per_second

    def __repr__(self) -> str:
        return f"InductorCostModel(extern kernels: {self.extern!r}; generated loops: {self.loops!r})"


register_cost_model(INDUCTOR_COST_MODEL, lambda device: InductorCostModel(device=device).node_seconds)

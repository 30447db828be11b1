"""Cost models: how many seconds each node of a Graph takes.

* ``"profile"`` (:data:`DEFAULT_COST_MODEL`) — measured: each distinct op signature timed on the
  real device, median of several runs, cached on disk (:mod:`remat.cost.profile`).
* ``"flops"`` — analytic roofline: FLOPs and bytes moved against the machine's measured peak rate
  and bandwidth (:mod:`remat.cost.flops`); no op is run.
* ``"inductor"`` (:data:`INDUCTOR_COST_MODEL`, the default of :func:`remat.compile`) — the two kinds
  of kernels of a compiled step: extern kernels (``mm``, convolutions) profiled, since Inductor calls
  the ATen kernel a profile times, and the loops Inductor generates by the roofline, a fused group
  of them as one kernel (:mod:`remat.inductor.cost`, registered by that package). Meant for :func:`remat.compile`: an eager step
  runs every op on its own, as ``"profile"`` times it.
* ``"unit"`` — every op costs 1 (for tests and for comparing with papers that used it).
* a callable ``fx_node -> seconds``.

Whatever the model, the offload tier's transfer costs are measured by the stores themselves
(:mod:`remat.execute.transfer`) and recorded in ``graph.meta["transfer"]``.

May import: ``remat.measure``, ``remat.graph``, ``remat.errors``. Never a planner or a lowering.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.fx as fx

from ..errors import RematError

# The roofline misjudges kernels that are slow for their FLOPs and bytes: CPU max pooling runs 10x
# longer than its bytes say, so on ResNet-18 a plan predicted at +1.1% measured +15.6% over
# store_all; planned on profiled costs, +4.4% predicted and +0.3% measured (GPT-2: no difference).
DEFAULT_COST_MODEL = "profile"
# Inductor's generated kernels are its own code, not the ATen kernels a profile times; its extern
# kernels are those very kernels (remat.inductor.cost)
INDUCTOR_COST_MODEL = "inductor"


COST_MODELS: dict[str, Callable[[torch.device | str], Callable[[fx.Node], float]]] = {}


def register_cost_model(name: str, factory: Callable[[torch.device | str], Callable[[fx.Node], float]]) -> None:
    """Make ``cost_model=name`` mean ``factory(device)``, a function ``fx_node -> seconds``.

    The Inductor cost model registers itself this way (:mod:`remat.inductor.cost`): a cost model
    that a higher stage owns is found by name, and this package never imports that stage."""
    if name in COST_MODELS:
        raise RematError(f"a cost model named {name!r} is registered already")
    COST_MODELS[name] = factory


def _flops(device):
    from .flops import FlopsCostModel

    return FlopsCostModel(device=device).node_seconds


def _profile(device):
    from .profile import ProfileCostModel

    return ProfileCostModel(device=device).node_seconds


register_cost_model("unit", lambda device: lambda node: 1.0)
register_cost_model("flops", _flops)
register_cost_model("profile", _profile)


def make_cost_fn(cost_model, device: torch.device | str = "cpu") -> Callable[[fx.Node], float]:
    """The function ``fx_node -> seconds`` of ``cost_model``: a registered name or a callable."""
    if callable(cost_model):
        return cost_model
    if cost_model in COST_MODELS:
        return COST_MODELS[cost_model](device)
    names = ", ".join(repr(n) for n in COST_MODELS)
    raise RematError(f"unknown cost_model {cost_model!r}; use one of {names} or a callable fx_node -> seconds")


def make_workspace_fn(workspace) -> Callable[[fx.Node], int] | None:
    """``"measure"``: probe each op signature once (:mod:`remat.cost.workspace`); ``"none"``: zero."""
    if workspace == "measure":
        from .workspace import node_workspace

        return node_workspace
    if workspace in ("none", None):
        return None
    raise RematError(f"unknown workspace option {workspace!r}; use 'measure' or 'none'")

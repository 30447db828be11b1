"""The ``"remat"`` torch.compile backend.

    compiled = torch.compile(model, backend="remat", options={"budget": 0.5, "solver": "auto"})

Dynamo hands the backend an FX graph of the model and example inputs; the backend
calls AOTAutograd with its own partition function, which receives the *joint*
forward+backward graph, captures it as a :class:`~remat.graph.Graph`, plans it, and
returns the forward and backward graphs the plan calls for (see :mod:`remat.lower`).
Both are compiled with the boxed calling convention, so every tensor dies at its
last use. This module is remat's only contact with AOTAutograd's private APIs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch._dynamo import register_backend
from torch._functorch.aot_autograd import aot_module_simplified

from .capture import capture_joint
from .cost import make_cost_fn, make_workspace_fn
from .errors import RematError, through_dynamo
from .lower import lower
from .planner import make_plan
from .runtime import boxed

OPTION_NAMES = ("budget", "solver", "cost_model", "workspace", "time_limit", "solver_options", "on_plan")


@dataclass
class BackendOptions:
    budget: Any = None
    solver: str = "auto"
    cost_model: Any = "flops"
    workspace: str = "measure"  # "measure" each op's scratch memory once, or "none"
    time_limit: float | None = None
    solver_options: dict = field(default_factory=dict)
    on_plan: Callable | None = None  # called with (plan, capture) after planning

    @classmethod
    def from_dict(cls, options: dict | None) -> "BackendOptions":
        options = dict(options or {})
        unknown = set(options) - set(OPTION_NAMES)
        if unknown:
            raise TypeError(f"unknown remat backend option(s) {sorted(unknown)}; known: {', '.join(OPTION_NAMES)}")
        return cls(**options)


def _compile_boxed(gm: torch.fx.GraphModule, example_inputs) -> torch.fx.GraphModule:
    return boxed(gm)


def make_partition_fn(opts: BackendOptions):
    def partition_fn(joint, joint_inputs, *, num_fwd_outputs, **_ignored):
        device = _device_of(joint)
        capture = capture_joint(
            joint,
            num_fwd_outputs,
            cost_fn=make_cost_fn(opts.cost_model, device),
            workspace_fn=make_workspace_fn(opts.workspace),
        )
        plan = make_plan(
            capture.graph, opts.budget, opts.solver, time_limit=opts.time_limit, **opts.solver_options
        )
        if opts.on_plan is not None:
            opts.on_plan(plan, capture)
        return lower(capture, plan)

    return partition_fn


def _device_of(joint: torch.fx.GraphModule) -> torch.device:
    for n in joint.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device
    return torch.device("cpu")


def remat_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **kwargs):
    """Dynamo backend entry point (``options`` comes from ``torch.compile(..., options=...)``)."""
    opts = BackendOptions.from_dict({**(options or {}), **kwargs})
    try:
        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=_compile_boxed,
            bw_compiler=_compile_boxed,
            partition_fn=make_partition_fn(opts),
        )
    except RematError as err:  # reach the user as remat's error, not as Dynamo's BackendCompilerFailed
        raise through_dynamo(err) from err.__cause__


register_backend(remat_backend, name="remat")

__all__ = ["remat_backend", "BackendOptions"]

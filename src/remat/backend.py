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

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.common import aot_autograd

from .budget import parse_budget_text
from .capture import capture_joint
from .cost import DEFAULT_COST_MODEL, make_cost_fn, make_transfer_meta, make_workspace_fn
from .errors import RematError, through_dynamo
from .lower import lower
from .cache import plan_with_cache
from .runtime import boxed

OPTION_NAMES = ("budget", "solver", "cost_model", "workspace", "time_limit", "solver_options", "on_plan", "cache")


BUDGET_ENV = "REMAT_BUDGET"
SOLVER_ENV = "REMAT_SOLVER"


@dataclass
class BackendOptions:
    """The backend's options, from ``torch.compile(..., options={...})`` and the environment.

    When ``options`` has no ``budget``, the budget is read from the environment variable
    ``REMAT_BUDGET`` (and the solver from ``REMAT_SOLVER`` when it has no ``solver``), so that
    code which calls ``torch.compile(model, backend="remat")`` itself, such as the Hugging Face
    ``Trainer``, can be given a budget. Options passed explicitly always win. The variable is
    written as on the command line: ``"0.5"`` (a bare number is a fraction in (0, 1]), ``"min"``,
    or a size with a unit (``"2GiB"``, ``"800MB"``). Each graph Dynamo hands the backend is
    planned on its own, so a fraction applies to each graph's own peak and a size to each graph.
    """

    budget: Any = None
    solver: str = "auto"
    cost_model: Any = DEFAULT_COST_MODEL
    workspace: str = "measure"  # "measure" each op's scratch memory once, or "none"
    time_limit: float | None = None
    solver_options: dict = field(default_factory=dict)
    on_plan: Callable | None = None  # called with (plan, capture) after planning
    cache: bool = True  # read and fill the on-disk plan cache (remat.cache)

    @classmethod
    def from_dict(cls, options: dict | None, environ: Mapping[str, str] | None = None) -> "BackendOptions":
        options = dict(options or {})
        unknown = set(options) - set(OPTION_NAMES)
        if unknown:
            raise TypeError(f"unknown remat backend option(s) {sorted(unknown)}; known: {', '.join(OPTION_NAMES)}")
        environ = os.environ if environ is None else environ
        if "budget" not in options and environ.get(BUDGET_ENV, "").strip():
            options["budget"] = parse_budget_text(environ[BUDGET_ENV], source=f"the environment variable {BUDGET_ENV}")
        if "solver" not in options and environ.get(SOLVER_ENV, "").strip():
            options["solver"] = environ[SOLVER_ENV].strip()
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
            transfer=make_transfer_meta(device),
        )
        plan = plan_with_cache(
            capture.graph, opts.budget, opts.solver, time_limit=opts.time_limit,
            solver_options=opts.solver_options, cost_model=opts.cost_model, cache=opts.cache,
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
    # Dynamo's own AOTAutograd wrapper, not aot_module_simplified directly: it keeps Dynamo from
    # tracing the compiled graphs and counts the call, which DDPOptimizer (torch.compile of a DDP
    # module) reads to know that the first call of each piece returns fake tensors.
    compiler = aot_autograd(fw_compiler=_compile_boxed, bw_compiler=_compile_boxed, partition_fn=make_partition_fn(opts))
    try:
        return compiler(gm, example_inputs)
    except RematError as err:  # reach the user as remat's error, not as Dynamo's BackendCompilerFailed
        raise through_dynamo(err) from err.__cause__


register_backend(remat_backend, name="remat")

__all__ = ["remat_backend", "BackendOptions", "BUDGET_ENV", "SOLVER_ENV"]

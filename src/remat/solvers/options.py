"""The planning options every entry point takes, from its arguments and the environment.

    opts = BackendOptions.from_dict({"budget": 0.5})           # torch.compile(..., options=...)
    opts = BackendOptions.from_dict({}, {"REMAT_BUDGET": "min"})   # what the HF Trainer can pass
    plan_with_cache(graph, opts.budget, opts.solver, cost_model=opts.cost_model, ...)

The ``torch.compile`` backend (:mod:`remat.backend`) and the Inductor partitioner
(:mod:`remat.inductor`) both read their options through this class.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..budget import parse_budget_text
from ..cost import DEFAULT_COST_MODEL

OPTION_NAMES = ("budget", "solver", "cost_model", "workspace", "time_limit", "solver_options", "on_plan", "cache",
                "offload_dir", "plan", "buckets", "on_run", "on_step", "split", "optimizer")


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
    cache: bool = True  # read and fill the on-disk plan cache (remat.solvers.cache)
    offload_dir: str | None = None  # the file store's folders (else $REMAT_OFFLOAD_DIR, else TMPDIR)
    plan: Any = None  # run this Plan (or saved plan file) instead of planning; checked on the live graph
    buckets: Any = None  # edges of the size buckets of a dynamic capture (None: powers of two and midpoints)
    on_run: Callable | None = None  # a dynamic capture: called with the plan of each step's bucket
    on_step: Callable | None = None  # a dynamic capture: called with its remat.execute.buckets.BucketedStep
    split: Any = "auto"  # split the ops that set the peak into chunks: "auto" (where the budget needs it), "off", or k
    optimizer: Any = None  # a remat.execute.optimizer.StepperInBackward: the optimizer steps inside the backward

    def __post_init__(self):
        self.split = checked_split(self.split)

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


def checked_split(split):
    """The ``split`` option checked: ``"auto"``, ``"off"`` (also False or None) or a number of chunks."""
    if split is False or split is None:
        return "off"
    if split in ("auto", "off") or (isinstance(split, int) and not isinstance(split, bool) and split >= 1):
        return split
    raise ValueError(f"split must be 'auto', 'off' or a number of chunks (an int >= 1), not {split!r}")


__all__ = ["BackendOptions", "checked_split", "OPTION_NAMES", "BUDGET_ENV", "SOLVER_ENV"]

"""remat: make a PyTorch training step fit a memory budget by rematerialization.

    import remat
    m = remat.optimize(model, x, budget="2GiB")
    loss = m(x); loss.backward()
    print(m.plan.summary())

This file only re-exports; the stages live in their folders (see docs/architecture.md):
capture/ -> Graph (graph.py) -> solvers/ -> Plan (plan.py, judged by simulate.py) -> execute/,
with inductor/ for Inductor's kernels, api.py and backend.py on top, and tools/ for the user's tools.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from . import backend as _backend  # noqa: F401  (registers the "remat" torch.compile backend)
from . import inductor as _inductor  # noqa: F401  (registers cost_model="inductor")
from .api import LengthPlan, RematModule, capture_and_plan, compile, optimize, plan, plan_lengths
from .capture import register_accelerate_backend as _register_accelerate_backend
from .capture import watch_for_transformers as _watch_for_transformers
from .errors import CaptureError, InfeasibleBudgetError, InvalidPlanError, RematError, SolverError, SolverTimeLimitWarning
from .errors import AllocatorRoundingWarning, MeasuredAboveBudgetWarning, NotTrainingWarning, UnsupportedWrappingError
from .graph import Graph
from .inductor import partitioner
from .measure import StepMeasurement, measure_step
from .plan import Plan, PlanGraphMismatchError
from .simulate import simulate
from .solvers import available as available_solvers
from .tools import plots as _plots  # noqa: F401  (registers Plan.plot's kinds)
from .tools.max_batch import BatchTry, MaxBatchResult, max_batch_size
from .tools.pareto import ParetoFront, pareto
from .version import __version__

__all__ = [
    "optimize",
    "compile",
    "partitioner",
    "plan",
    "plan_lengths",
    "LengthPlan",
    "pareto",
    "max_batch_size",
    "MaxBatchResult",
    "BatchTry",
    "ParetoFront",
    "capture_and_plan",
    "RematModule",
    "Plan",
    "Graph",
    "simulate",
    "measure_step",
    "StepMeasurement",
    "available_solvers",
    "RematError",
    "InfeasibleBudgetError",
    "CaptureError",
    "InvalidPlanError",
    "PlanGraphMismatchError",
    "SolverError",
    "SolverTimeLimitWarning",
    "NotTrainingWarning",
    "MeasuredAboveBudgetWarning",
    "AllocatorRoundingWarning",
    "UnsupportedWrappingError",
    "__version__",
]

# Modules that moved when the package was split into one folder per stage: their old names keep
# working (``from remat import zoo``, ``remat.viz.plot_timeline``) and name the same module object.
MOVED = {
    "remat.zoo": "remat.models",
    "remat.viz": "remat.tools.plots",
    "remat.cli": "remat.tools.cli",
    "remat.demo": "remat.tools.demo",
    "remat.batch": "remat.tools.max_batch",
    "remat.planner": "remat.solvers.planner",
    "remat.cache": "remat.solvers.cache",
    "remat.coarsen": "remat.solvers.coarsen",
    "remat.lower": "remat.execute.lowering",
    "remat.runtime": "remat.execute.runtime",
    "remat.compiled_ops": "remat.execute.compiled_ops",
    "remat.cost.transfer": "remat.execute.transfer",
    "remat.fusion": "remat.inductor.fusion",
    "remat.cost.inductor": "remat.inductor.cost",
    "remat.integrations": "remat.capture.wrappers",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module it moved to (the same object, not a copy)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import machinery sets the alias's spec on the module next
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


sys.meta_path.insert(0, _MovedModuleFinder())


def __getattr__(name: str):  # remat.zoo, remat.viz ... without an import statement
    if f"remat.{name}" in MOVED:
        return importlib.import_module(f"remat.{name}")
    raise AttributeError(f"module 'remat' has no attribute {name!r}")


_register_accelerate_backend()  # lets the Hugging Face Trainer pass backend="remat" on
_watch_for_transformers()  # transformers' warning_once inside forward: no graph break

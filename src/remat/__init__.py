"""remat: make a PyTorch training step fit a memory budget by rematerialization.

    import remat
    m = remat.optimize(model, x, budget="2GiB")
    loss = m(x); loss.backward()
    print(m.plan.summary())
"""

from . import backend as _backend  # noqa: F401  (registers the "remat" torch.compile backend)
from . import integrations as _integrations
from .batch import BatchTry, MaxBatchResult, max_batch_size
from .api import ParetoFront, RematModule, capture_and_plan, compile, optimize, pareto, plan
from .inductor import partitioner
from .errors import CaptureError, InfeasibleBudgetError, InvalidPlanError, RematError, SolverError, SolverTimeLimitWarning
from .errors import MeasuredAboveBudgetWarning, NotTrainingWarning, UnsupportedWrappingError
from .graph import Graph
from .measure import StepMeasurement, measure_step
from .plan import Plan, PlanGraphMismatchError, simulate
from .solvers import available as available_solvers

__all__ = [
    "optimize",
    "compile",
    "partitioner",
    "plan",
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
    "UnsupportedWrappingError",
]

_integrations.register_accelerate_backend()  # lets the Hugging Face Trainer pass backend="remat" on
__version__ = "0.1.0"

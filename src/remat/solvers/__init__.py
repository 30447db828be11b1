"""Planning: from a Graph and a budget to a Plan.

Owns every solver (one file each, its formulation or recurrence in the module docstring), the
registry they share (:mod:`.registry`: one signature, ``solve(graph, budget_bytes, *,
time_limit=None, **options) -> Plan``), the planner (:mod:`.planner`: budget resolution, ``auto``,
clear failures), the plan cache on disk (:mod:`.cache`), the planning options every entry point
takes (:mod:`.options`) and graph coarsening (:mod:`.coarsen`).

May import: ``remat.cost``, ``remat.plan``, ``remat.simulate``, ``remat.budget``, ``remat.graph``,
``remat.errors`` (and ``remat.measure``, ``remat.version``). Never tensors, capture or execution.

    from remat.solvers import solve, available
    plan = solve("rotor", graph, 64 * 2**20)      # one solver, a byte budget
    from remat.solvers.planner import make_plan
    plan = make_plan(graph, budget=0.5)           # auto: the best plan any solver makes
"""

from . import baselines, checkmate, checkmate_swap, chen, cpsat, hierarchical, hybrid, keep_set, reorder, revolve, rotor  # noqa: F401  (registers the solvers)
from .registry import SOLVERS, Solver, available, register, solve, time_budget, time_left

__all__ = ["SOLVERS", "Solver", "available", "register", "solve", "time_budget", "time_left"]

"""Overhead against budget: several planners over a range of budgets, on one capture.

    front = remat.pareto(model, x, solvers=["hierarchical", "rotor", "chen_sqrt"])
    print(front.table())           # predicted overhead and peak per solver and budget
    front.plot("sweep.png")        # one line per solver

``remat sweep`` on the command line draws the same front.
"""

from __future__ import annotations

import math
from typing import Any

from ..api import capture_and_plan
from ..budget import fixed_bytes
from ..cost import DEFAULT_COST_MODEL
from ..errors import InfeasibleBudgetError, SolverError
from ..solvers import available as available_solvers
from ..solvers import time_left
from ..solvers.cache import plan_with_cache
from ..solvers.planner import resolve, store_all_plan
from .plots import plot_pareto

DEFAULT_PARETO_SOLVERS = ("hierarchical", "rotor", "chen_sqrt")
DEFAULT_PARETO_BUDGETS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1)


class ParetoFront(dict):
    """``front[solver]``: one :class:`Plan` per budget (``None`` where the solver found none within it).

    ``front.budgets`` are the budgets in bytes, ``front.store_all_peak`` the unplanned step's peak,
    ``front.fixed_bytes`` the part of it no plan changes (see :mod:`remat.budget`). ``print(front)``
    prints :meth:`table`.
    """

    budgets: list[int]
    store_all_peak: int
    fixed_bytes: int

    def table(self) -> str:
        """A text table: predicted overhead (and peak) of each solver at each budget."""
        head = f"{'budget':>12}" + "".join(f"{s:>22}" for s in self)
        rows = [head]
        for k, b in enumerate(self.budgets):
            cells = []
            for plans in self.values():
                p = plans[k]
                cells.append(f"{'—':>22}" if p is None else f"{p.overhead * 100:+8.1f}% {p.peak_bytes / 2**20:9.1f} MiB")
            rows.append(f"{b / 2**20:8.1f} MiB" + "".join(cells))
        return "\n".join(rows)

    def __str__(self) -> str:  # print(front): the table, not every plan's fields
        return self.table()

    def __repr__(self) -> str:
        return (f"ParetoFront(solvers={list(self)}, budgets={len(self.budgets)}, "
                f"store_all_peak={self.store_all_peak / 2**20:.1f} MiB)")

    def plot(self, path=None, **kwargs):
        """Overhead against budget, one line per solver (:func:`remat.tools.plots.plot_pareto`)."""
        return plot_pareto(self, path, **kwargs)


def pareto(model, *example_args, solvers=DEFAULT_PARETO_SOLVERS, budgets=DEFAULT_PARETO_BUDGETS,
           cost_model: Any = DEFAULT_COST_MODEL, workspace: str = "measure", time_limit: float | None = None,
           cache: bool = True, **example_kwargs) -> ParetoFront:
    """Plan ``model``'s training step with each of ``solvers`` at each of ``budgets``.

    The model is captured once. Budgets are as in :func:`optimize`: bytes, sizes, fractions of the
    memory a plan can change, or ``"min"`` (the smallest budget ``auto`` meets). Returns a :class:`ParetoFront`: for each solver, one plan per budget, or
    ``None`` where it has no plan within that budget. ``rotor`` and ``hierarchical`` keep their
    decomposition, block menus and DP tables across budgets, so each further budget costs only
    the DP; the other solvers plan each budget from scratch.
    """
    for name in solvers:
        if name != "auto" and name not in available_solvers():
            raise SolverError(f"unknown solver {name!r}; choose 'auto' or one of {', '.join(available_solvers())}")
    base, _ = capture_and_plan(model, *example_args, solver="store_all", cost_model=cost_model,
                               workspace=workspace, cache=cache, **example_kwargs)
    return pareto_of_graph(base.graph, solvers=solvers, budgets=budgets, cost_model=cost_model,
                           time_limit=time_limit, cache=cache)


def pareto_of_graph(graph, *, solvers=DEFAULT_PARETO_SOLVERS, budgets=DEFAULT_PARETO_BUDGETS,
                    cost_model: Any = DEFAULT_COST_MODEL, time_limit: float | None = None, cache: bool = True,
                    on_plan=None) -> ParetoFront:
    """:func:`pareto` on a captured :class:`~remat.graph.Graph`; ``on_plan(solver, budget_bytes, plan_or_None)``
    is called after each cell (the CLI's progress bar)."""
    budget_bytes = [resolve(graph, b, time_limit=time_limit) for b in budgets]  # "min": auto's smallest
    front = ParetoFront()
    front.budgets, front.fixed_bytes = budget_bytes, fixed_bytes(graph)
    front.store_all_peak = store_all_plan(graph).peak_bytes
    cells_left = len(solvers) * len(budget_bytes)
    for name in solvers:
        plans = []
        for b in budget_bytes:
            left = time_left()  # inside a time budget (the CLI's --time-limit): share what is left
            limit = time_limit if left is None else min(time_limit or math.inf, left / cells_left)
            cells_left -= 1
            try:
                plan = plan_with_cache(graph, b, name, time_limit=limit, cost_model=cost_model, cache=cache)
            except (InfeasibleBudgetError, SolverError):
                plan = None
            plan = plan if plan is not None and (b is None or plan.peak_bytes <= b) else None
            plans.append(plan)
            if on_plan is not None:
                on_plan(name, b, plan)
        front[name] = plans
    return front


__all__ = ["pareto", "pareto_of_graph", "ParetoFront", "DEFAULT_PARETO_SOLVERS", "DEFAULT_PARETO_BUDGETS"]

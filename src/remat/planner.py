"""From a Graph and a budget to a Plan: budget resolution, solver choice, clear failures.

``solver="auto"`` returns store_all's plan when it fits. Otherwise, on a graph of at most
``AUTO_MILP_NODES`` ops it runs the Checkmate MILP (warm-started from the baselines, so never
worse than them), adding the hierarchical planner when the MILP stops at its time limit
(``AUTO_TIME_LIMIT`` seconds unless ``time_limit`` says otherwise) or misses the budget; a larger
graph goes to the hierarchical planner, which itself hands graphs without block structure to the
MILP. It keeps the plan with the least predicted compute among those within the budget (ties:
the smaller peak); solvers that do not apply to the graph (``SolverError``) are skipped. A budget no plan meets
raises :class:`~remat.errors.InfeasibleBudgetError` with the smallest budget any solver meets. Plans are cached in-process by (structural hash, costs,
budget, solver, options).
"""

from __future__ import annotations

import time

from .budget import resolve_budget
from .errors import InfeasibleBudgetError, SolverError
from .graph import Graph
from .plan import Plan
from .solvers import SOLVERS, solve

_CACHE: dict[tuple, Plan] = {}


def _cache_key(graph: Graph, budget_bytes, solver, options) -> tuple:
    return graph.planning_key + (budget_bytes, solver, tuple(sorted(options.items())))


AUTO_TIME_LIMIT = 30.0
AUTO_MILP_NODES = 100  # the op-level MILP usually proves optimality on graphs this small
FAST_SOLVERS = ("checkpoint_all", "chen_sqrt", "chen_greedy", "rotor", "hierarchical")  # for naming a minimum


def auto_candidates(graph: Graph) -> list[str]:
    """The solvers ``auto`` runs first on ``graph`` (see the module docstring)."""
    return ["checkmate"] if len(graph.nodes) <= AUTO_MILP_NODES else ["hierarchical"]


def _try_solve(name: str, graph: Graph, budget_bytes, time_limit, options, skip_inapplicable: bool) -> Plan | None:
    try:
        return solve(name, graph, budget_bytes, time_limit=time_limit, **options)
    except SolverError:
        if skip_inapplicable:
            return None
        raise


def make_plan(graph: Graph, budget=None, solver: str = "auto", *, time_limit: float | None = None, **options) -> Plan:
    """The plan ``solver`` makes for ``graph`` under ``budget`` (see :mod:`remat.budget`)."""
    start = time.perf_counter()
    store_all = solve("store_all", graph, None)
    budget_bytes = resolve_budget(budget, store_all.peak_bytes)
    key = _cache_key(graph, budget_bytes, solver, options)
    if key in _CACHE:
        return _CACHE[key]
    if solver == "auto":
        names = auto_candidates(graph)
    elif solver in SOLVERS:
        names = [solver]
    else:
        raise SolverError(f"unknown solver {solver!r}; choose 'auto' or one of {', '.join(sorted(SOLVERS))}")
    if solver == "auto" and (budget_bytes is None or store_all.peak_bytes <= budget_bytes):
        names = ["store_all"]  # fits: nothing is cheaper than computing everything once
    if solver == "auto" and time_limit is None:
        time_limit = AUTO_TIME_LIMIT
    plans = [
        store_all if n == "store_all" else _try_solve(n, graph, budget_bytes, time_limit, options, solver == "auto")
        for n in names
    ]
    plans = [p for p in plans if p is not None]
    if names == ["checkmate"] and solver == "auto":
        milp = plans[0] if plans else None
        if milp is None or milp.peak_bytes > budget_bytes or milp.info.get("status") != "optimal":
            names.append("hierarchical")
            extra = _try_solve("hierarchical", graph, budget_bytes, time_limit, options, True)
            plans += [extra] if extra is not None else []
    fitting = [p for p in plans if budget_bytes is None or p.peak_bytes <= budget_bytes]
    if not fitting:
        smallest = min(plans, key=lambda p: p.peak_bytes)  # the smallest budget *this* choice meets
        overall = _smallest_feasible(graph, plans)
        detail = ", ".join(f"{p.solver} reaches {p.peak_bytes}" for p in plans)
        if overall.peak_bytes < smallest.peak_bytes:
            detail += f"; solver {overall.solver!r} would reach {overall.peak_bytes}"
        raise InfeasibleBudgetError(budget_bytes, smallest.peak_bytes, detail)
    best = min(fitting, key=lambda p: (p.compute_seconds, p.peak_bytes))
    best.budget_bytes = budget_bytes
    if solver == "auto":
        best.info["chosen by"] = f"auto among {', '.join(names)}"
        best.solve_seconds = time.perf_counter() - start
    _CACHE[key] = best
    return best


def _smallest_feasible(graph: Graph, plans: list[Plan]) -> Plan:
    """The plan with the smallest peak among ``plans`` and the fast solvers' smallest plans."""
    tried = {p.solver for p in plans}
    others = [_try_solve(n, graph, 0, AUTO_TIME_LIMIT, {}, True) for n in FAST_SOLVERS if n not in tried]
    return min(plans + [p for p in others if p is not None], key=lambda p: p.peak_bytes)

"""The solver registry: one signature for every planner, solvers found by name.

    solve(graph, budget_bytes, *, time_limit=None, **options) -> Plan

A solver returns a :class:`~remat.plan.Plan` (validated by the simulator when it is
built). It may return a plan over the budget when it cannot do better; the caller
(:func:`remat.api.plan`) decides what to do with it. A solver that does not apply to a
graph raises :class:`~remat.errors.SolverError` with the reason.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

from ..errors import SolverError
from ..graph import Graph
from ..plan import Plan


class Solver(Protocol):
    def __call__(self, graph: Graph, budget_bytes: int | None, *, time_limit: float | None = None, **options) -> Plan: ...


SOLVERS: dict[str, Solver] = {}


def register(name: str) -> Callable[[Solver], Solver]:
    """Decorator adding a solver to the registry under ``name``."""

    def deco(fn: Solver) -> Solver:
        if name in SOLVERS:
            raise SolverError(f"a solver named {name!r} is registered already")
        SOLVERS[name] = fn
        return fn

    return deco


def available() -> list[str]:
    return sorted(SOLVERS)


def solve(name: str, graph: Graph, budget_bytes: int | None, *, time_limit: float | None = None, **options) -> Plan:
    """Run solver ``name``; record its name and wall time on the plan."""
    if name not in SOLVERS:
        raise SolverError(f"unknown solver {name!r}; choose one of {', '.join(available())} (or 'auto')")
    if budget_bytes is not None and budget_bytes < 0:
        raise SolverError(f"budget must be a non-negative number of bytes, got {budget_bytes}")
    start = time.perf_counter()
    plan = SOLVERS[name](graph, budget_bytes, time_limit=time_limit, **options)
    plan.solver = plan.solver or name
    plan.budget_bytes = budget_bytes
    plan.solve_seconds = time.perf_counter() - start
    return plan


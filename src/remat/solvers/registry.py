"""The solver registry: one signature for every planner, solvers found by name.

    solve(graph, budget_bytes, *, time_limit=None, **options) -> Plan

A solver returns a :class:`~remat.plan.Plan` (validated by the simulator when it is
built). It may return a plan over the budget when it cannot do better; the caller
(:func:`remat.api.plan`) decides what to do with it. A solver that does not apply to a
graph raises :class:`~remat.errors.SolverError` with the reason.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, Protocol

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


# ------------------------------------------------------------------------------ one time budget for many solves
MIN_SOLVE_SECONDS = 0.05  # what a solve still gets once the time is up: enough to return its warm start
_deadline: ContextVar[float | None] = ContextVar("remat_solve_deadline", default=None)


@contextmanager
def time_budget(seconds: float | None) -> Iterator[None]:
    """Bound all the solves inside by ``seconds`` from now, together: each :func:`solve` gets at most
    the time left (a nested budget can only shorten it). ``None``: no bound. The ``remat`` command
    runs each command inside its ``--time-limit``; solvers without a time limit of their own (the
    dynamic programs, the baselines) are not interrupted, but take milliseconds to seconds."""
    if seconds is None:
        yield
        return
    end = time.perf_counter() + float(seconds)
    outer = _deadline.get()
    token = _deadline.set(end if outer is None else min(outer, end))
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left(time_limit: float | None = None) -> float | None:
    """``time_limit`` shortened to what is left of the enclosing :func:`time_budget` (never below
    ``MIN_SOLVE_SECONDS``); ``time_limit`` itself outside one."""
    end = _deadline.get()
    if end is None:
        return time_limit
    left = max(MIN_SOLVE_SECONDS, end - time.perf_counter())
    return left if time_limit is None else min(float(time_limit), left)


def available() -> list[str]:
    return sorted(SOLVERS)


def solve(name: str, graph: Graph, budget_bytes: int | None, *, time_limit: float | None = None, **options) -> Plan:
    """Run solver ``name``; record its name and wall time on the plan."""
    if name not in SOLVERS:
        raise SolverError(f"unknown solver {name!r}; choose one of {', '.join(available())} (or 'auto')")
    if budget_bytes is not None and budget_bytes < 0:
        raise SolverError(f"budget must be a non-negative number of bytes, got {budget_bytes}")
    start = time.perf_counter()
    plan = SOLVERS[name](graph, budget_bytes, time_limit=time_left(time_limit), **options)
    plan.solver = plan.solver or name
    plan.budget_bytes = budget_bytes
    plan.solve_seconds = time.perf_counter() - start
    return plan


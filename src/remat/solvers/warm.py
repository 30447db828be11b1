"""A plan for one more size bucket of a step already planned at other sizes, in a fraction of a second.

A step captured with dynamic sizes has one graph per bucket with the *same* nodes and values (the
joint graph made concrete at other sizes: :mod:`remat.capture.shapes`), so a plan made for one
bucket is a valid instruction sequence for another; only its bytes and seconds change. For a new
bucket, :func:`warm_plan` takes the cheapest (predicted compute, then peak) of the plans that fit
the budget among

* the store-everything plan,
* every other bucket's plan, simulated again over this bucket's graph (a plan made at a larger size
  fits a smaller one: no value of a smaller bucket is larger), and
* the fast solvers' plans (:data:`FAST`: milliseconds each, run only when store-all does not fit),

and falls back to :func:`remat.solvers.planner.make_plan` (every solver ``auto`` runs) when none
fits. The plan says ``info["warm"]``; the backend plans such a bucket again in full once it has run
often enough to pay for it (:mod:`remat.execute.buckets`).
"""

from __future__ import annotations

import copy
import time

from ..errors import InvalidPlanError, SolverError
from ..graph import Graph
from ..plan import Plan
from .planner import make_plan, resolve, store_all_plan
from .registry import solve

FAST = ("rotor", "chen_greedy", "chen_sqrt")


def same_structure(a: Graph, b: Graph) -> bool:
    """Whether ``a`` and ``b`` have the same nodes and values, whatever their sizes."""
    return len(a.nodes) == len(b.nodes) and len(a.values) == len(b.values) and all(
        (x.op, x.inputs, x.outputs, x.phase) == (y.op, y.inputs, y.outputs, y.phase) for x, y in zip(a.nodes, b.nodes))


def warm_plan(graph: Graph, budget, neighbours: list[Plan], *, time_limit: float | None = None, **options) -> Plan:
    """The cheapest plan within ``budget`` among store-all, the ``neighbours`` (plans of other buckets)
    over ``graph``, and the fast solvers; ``make_plan(graph, budget)`` when none fits."""
    start = time.perf_counter()
    budget_bytes = resolve(graph, budget)
    candidates = [store_all_plan(graph)]
    for other in neighbours:
        if not same_structure(other.graph, graph):
            continue
        try:
            candidates.append(Plan(graph, other.instructions, other.boundary, budget_bytes, other.solver,
                                   info={"warm_start": dict(other.info.get("bucket") or {})}))
        except InvalidPlanError:
            continue  # not valid at this size (a value that is a view at one size only, ...)
    if budget_bytes is not None and store_all_plan(graph).peak_bytes > budget_bytes:
        for name in FAST:
            try:
                candidates.append(solve(name, graph, budget_bytes))
            except SolverError:
                continue
    fits = [c for c in candidates if budget_bytes is None or c.peak_bytes <= budget_bytes]
    if not fits:
        return make_plan(graph, budget, time_limit=time_limit, **options)
    plan = copy.copy(min(fits, key=lambda p: (p.compute_seconds, p.peak_bytes)))  # store-all's is the memo's
    plan.budget_bytes, plan.info = budget_bytes, {**plan.info, "warm": True}
    plan.solve_seconds = time.perf_counter() - start
    return plan


__all__ = ["warm_plan", "same_structure", "FAST"]

"""Chen et al. (2016) segment checkpointing: the articulation-point √n variant and the greedy.

Both cut the forward order into segments, keep only the values that cross a cut, and
rebuild each segment once in the backward (:func:`.schedule.backward_with_recomputation`).
They differ in where the cuts go:

* ``chen_sqrt_ap`` — ``chen_sqrt`` with ``cuts="articulation"``: about √n segments of equal
  compute, each cut placed after the articulation point nearest its equal-cost target, so
  only that node's outputs are carried over (Checkmate's "√n-AP").
* ``chen_greedy`` — Chen's memory-planning greedy (Checkmate's "greedy", with
  ``cuts="articulation"`` its "greedy-AP", registered as ``chen_greedy_ap``). For a
  threshold b, walk the forward in order adding up the bytes each node produces::

      acc += bytes(outputs of v)
      if acc > b and a cut is allowed after v:   cut after v;  acc = 0

  A small b gives many short segments (more kept across cuts, less rebuilt at a time), a
  large b few long ones. b is swept over a geometric grid from the largest single node's
  output to the whole forward's; the plan returned is the cheapest (least compute, then
  smallest peak) whose simulated peak fits the budget, else the smallest peak.

>>> plan = solve("chen_greedy_ap", graph, budget_bytes=2**30)
>>> plan.info["threshold_bytes"], plan.info["segments"]
"""

from __future__ import annotations

import copy
import time

from ..graph import ACTIVATION, Graph
from ..plan import Plan
from .registry import register
from .baselines import chen_sqrt
from .schedule import (
    allowed_cuts,
    backward_with_recomputation,
    check_cuts,
    cheapest_fitting,
    crossing_values,
    forward_articulation_points,
    segments_from_cuts,
)


@register("chen_sqrt_ap")
def chen_sqrt_ap(graph: Graph, budget_bytes: int | None, *, time_limit=None, **options) -> Plan:
    """``chen_sqrt`` cutting only after articulation points of the forward graph."""
    _only_articulation(options)
    plan = chen_sqrt(graph, budget_bytes, time_limit=time_limit, cuts="articulation", **options)
    plan.solver = "chen_sqrt_ap"
    return plan


def produced_bytes(graph: Graph, node_id: int) -> int:
    """Bytes of the activations a node computes."""
    return sum(graph.values[v].bytes for v in graph.nodes[node_id].outputs if graph.values[v].kind == ACTIVATION)


def greedy_cuts(graph: Graph, threshold: float, allowed) -> list[int]:
    """Chen's greedy rule: cut after the first allowed node at which the bytes produced since
    the last cut exceed ``threshold``, then start counting again."""
    allowed = set(allowed)
    cuts, acc = [], 0
    for n in graph.forward_nodes:
        acc += produced_bytes(graph, n.id)
        if acc > threshold and n.id in allowed:
            cuts.append(n.id)
            acc = 0
    return cuts


def greedy_thresholds(graph: Graph, points: int = 30) -> list[float]:
    """``points`` thresholds spaced geometrically from the largest single node's output bytes
    to the bytes the whole forward produces."""
    sizes = [produced_bytes(graph, n.id) for n in graph.forward_nodes]
    lo, hi = max(max(sizes, default=1), 1), max(sum(sizes), 1)
    if points <= 1 or hi <= lo:
        return [float(lo)]
    return [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]


def segment_plan(graph: Graph, cut_after, *, solver: str) -> Plan:
    """The plan that keeps the values crossing the cuts and rebuilds each segment once."""
    segment_of = segments_from_cuts(graph, cut_after)
    kept = crossing_values(graph, segment_of)
    backward = backward_with_recomputation(graph, kept=kept, segment_of=segment_of, drop_after_each_op=False)
    return Plan.from_schedule(graph, [n.id for n in graph.forward_nodes], backward, solver=solver)


def greedy_sweep(graph: Graph, *, cuts: str = "linear", points: int = 30, thresholds=None,
                 time_limit: float | None = None, solver: str = "chen_greedy") -> list[Plan]:
    """One plan per distinct segmentation the thresholds give (``info`` holds b and the count).
    The plans do not depend on a budget: a whole sweep is kept in the graph's memo, so the
    budgets of a Pareto sweep (and every MILP warm start) share it. Callers must not change them."""
    key = ("greedy_sweep", cuts, points, solver)
    if thresholds is None and key in graph.memo:
        return graph.memo[key]
    allowed = allowed_cuts(graph, cuts)
    start = time.perf_counter()
    plans: list[Plan] = []
    seen: set[tuple[int, ...]] = set()
    complete = True
    for b in thresholds if thresholds is not None else greedy_thresholds(graph, points):
        chosen = tuple(greedy_cuts(graph, b, allowed))
        if chosen in seen:
            continue
        seen.add(chosen)
        plan = segment_plan(graph, chosen, solver=solver)
        plan.info.update(threshold_bytes=int(b), segments=len(chosen) + 1, cuts=cuts)
        plans.append(plan)
        if time_limit is not None and time.perf_counter() - start > time_limit:
            complete = False
            break
    if thresholds is None and complete:
        graph.memo[key] = plans
    return plans


@register("chen_greedy")
def chen_greedy(
    graph: Graph,
    budget_bytes: int | None,
    *,
    time_limit=None,
    cuts: str = "linear",
    points: int = 30,
    thresholds=None,
    **options,
) -> Plan:
    """Chen's greedy segments, the threshold swept; the cheapest plan within the budget."""
    check_cuts(cuts)
    solver = "chen_greedy_ap" if cuts == "articulation" else "chen_greedy"
    plans = greedy_sweep(graph, cuts=cuts, points=points, thresholds=thresholds, time_limit=time_limit, solver=solver)
    best = copy.copy(cheapest_fitting(plans, budget_bytes))  # the sweep's plans are shared (the memo)
    best.info = {**best.info, "sweep": len(plans)}
    return best


@register("chen_greedy_ap")
def chen_greedy_ap(graph: Graph, budget_bytes: int | None, *, time_limit=None, **options) -> Plan:
    """``chen_greedy`` cutting only after articulation points of the forward graph."""
    _only_articulation(options)
    return chen_greedy(graph, budget_bytes, time_limit=time_limit, cuts="articulation", **options)


def _only_articulation(options: dict) -> None:
    """The ``_ap`` names fix ``cuts``. A ``cuts`` option is dropped rather than refused, because
    ``solver="auto"`` hands the same options to every solver; a bad value is still an error."""
    check_cuts(options.pop("cuts", "articulation"))


__all__ = [
    "chen_sqrt_ap",
    "chen_greedy",
    "chen_greedy_ap",
    "forward_articulation_points",
    "greedy_cuts",
    "greedy_sweep",
    "greedy_thresholds",
    "segment_plan",
]

"""Baselines users compare with: store everything, checkpoint everything, Chen's √n.

* ``store_all`` — PyTorch's default: run the forward, keep whatever the backward reads,
  run the backward. No recomputation; the largest peak.
* ``checkpoint_all`` — the other extreme: the forward keeps nothing but what cannot be
  recomputed (inputs; outputs the user holds anyway). Before each backward op, every
  forward value it reads is recomputed from the inputs, and dropped again right after.
  The smallest peak of the simple strategies, at a compute cost quadratic in depth.
* ``chen_sqrt`` — Chen et al. (2016): cut the forward order into about √n segments of
  equal compute, keep only the values that cross a cut, and in the backward recompute a
  segment (once) the first time the backward reads one of its values. Option
  ``cuts="linear"`` (default: cut anywhere in the topological order) or
  ``cuts="articulation"`` (cut only after articulation points of the forward graph, so
  that one value set crosses each cut; registered as ``chen_sqrt_ap`` in :mod:`.chen`).
"""

from __future__ import annotations

import math

from ..graph import ACTIVATION, BACKWARD, FORWARD, Graph
from ..plan import Plan
from .registry import register
from .schedule import (
    allowed_cuts,
    backward_with_recomputation,
    check_cuts,
    crossing_values,
    equal_cost_cuts,
    equal_cost_segments,
    segments_from_cuts,
)


@register("store_all")
def store_all(graph: Graph, budget_bytes: int | None, *, time_limit=None, **options) -> Plan:
    return Plan.from_schedule(
        graph,
        [n.id for n in graph.forward_nodes],
        [n.id for n in graph.backward_nodes],
        solver="store_all",
    )


@register("checkpoint_all")
def checkpoint_all(graph: Graph, budget_bytes: int | None, *, time_limit=None, **options) -> Plan:
    segment_of = {n.id: n.id for n in graph.forward_nodes}
    backward = backward_with_recomputation(graph, kept=set(), segment_of=segment_of, drop_after_each_op=True)
    return Plan.from_schedule(graph, [n.id for n in graph.forward_nodes], backward, solver="checkpoint_all")


@register("chen_sqrt")
def chen_sqrt(
    graph: Graph,
    budget_bytes: int | None,
    *,
    time_limit=None,
    segments: int | None = None,
    cuts: str = "linear",
    **options,
) -> Plan:
    fwd = graph.forward_nodes
    count = segments or max(1, round(math.sqrt(len(fwd))))
    if check_cuts(cuts) == "linear":
        segment_of = equal_cost_segments(graph, count)
    else:  # ~count cuts, each after the articulation point nearest an equal-cost target
        chosen = equal_cost_cuts(graph, count, allowed_cuts(graph, cuts))
        segment_of = segments_from_cuts(graph, chosen)
        count = len(chosen) + 1
    kept = crossing_values(graph, segment_of)
    backward = backward_with_recomputation(graph, kept=kept, segment_of=segment_of, drop_after_each_op=False)
    plan = Plan.from_schedule(graph, [n.id for n in fwd], backward, solver="chen_sqrt")
    plan.info["segments"] = count
    plan.info["cuts"] = cuts
    return plan


__all__ = ["store_all", "checkpoint_all", "chen_sqrt", "equal_cost_segments", "ACTIVATION", "BACKWARD", "FORWARD"]

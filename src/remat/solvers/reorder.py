"""Operator reordering: a lower peak from the order of the computes alone, with nothing recomputed.

    better = reorder(plan)                       # the same computes, in an order with a lower peak
    plan = solve("reorder", graph, None)         # every node once (store_all's work), reordered

A plan fixes *which* computes run; within the forward and within the backward many orders of them
are valid, and their peaks differ: a frozen teacher that a distillation step runs after its student
piles its working set on top of everything the student saved, while run first it is gone before
the student starts. :func:`reorder` is a local search over those orders with the simulator as
the only judge (OLLA and ROAM treat the order as an optimisation variable, exactly or through a
tree decomposition; this is the cheap heuristic counterpart, applied to any plan).

The order is a topological order of the *instance DAG* of each phase: compute ``i`` depends on
the latest earlier compute of the same phase that made a value ``i`` reads; a recomputation of a
value comes after every reader of its previous copy (so each read sees the copy it saw before,
and frees stay where :meth:`Plan.from_schedule` puts them). Forward computes stay in the forward,
backward ones in the backward. One round looks at the first instruction ``p`` where the peak is
reached and tries two kinds of block move, the most promising first:

* **sink** a compute ``c`` before ``p`` whose output is resident at ``p`` (and that ``p`` does not
  depend on), together with its descendants between ``c`` and ``p``, to right after ``p``;
* **hoist** a compute ``c`` after ``p`` that reads a value resident at ``p`` (it may be its last
  reader) and does not depend on ``p``, together with its ancestors between ``p`` and ``c``, to
  right before ``p``.

Each candidate order becomes a plan (:meth:`Plan.from_schedule`, frees at last use) and is
simulated; the first that lowers (peak, instructions at the peak, the sum of the memory timeline)
is taken, and the search goes on from it until no move helps or the time is up. The compute time
never changes. Plans with offload or reload instructions are returned unchanged (their transfer
timing is tied to positions).
"""

from __future__ import annotations

import copy
import time

from ..errors import InvalidPlanError
from ..graph import Graph
from ..plan import Plan
from ..simulate import COMPUTE, FREE, OFFLOAD, RELOAD
from .registry import register, time_left

REORDER_TIME_LIMIT = 5.0  # seconds, when the caller gives none
MAX_COMPUTES = 4000  # longer plans are returned as they are: a round costs O(computes) simulations


def reorder(plan: Plan, *, time_limit: float | None = None) -> Plan:
    """``plan``'s computes in an order of lower peak (``plan`` itself when none is found).

    The result computes the same nodes the same number of times in each phase, so its compute
    time is the plan's; ``info["reordered"]`` records the peak before and after and the moves made.
    """
    if any(ins.kind in (OFFLOAD, RELOAD) for ins in plan.instructions) or plan.simulation.computes > MAX_COMPUTES:
        return plan
    start = time.perf_counter()
    deadline = start + (REORDER_TIME_LIMIT if time_limit is None else time_limit)
    graph = plan.graph
    forward, backward = plan.schedule()
    best = _judged(graph, forward, backward, plan)
    if best is None:
        return plan
    score = _score(best)
    moves = 0
    while time.perf_counter() < deadline:
        found = None
        for candidate in _candidate_orders(best, forward, backward):
            if time.perf_counter() >= deadline:
                break
            trial = _judged(graph, *candidate, plan)
            if trial is not None and _score(trial) < score:
                found = candidate, trial
                break
        if found is None:
            break
        (forward, backward), best = found
        score = _score(best)
        moves += 1
    if best.peak_bytes > plan.peak_bytes or (best.peak_bytes == plan.peak_bytes and moves == 0):
        return plan  # (a plan whose own frees beat the rebuilt plan's, or nothing found)
    best = copy.copy(best)  # (simulated already: not built again)
    best.info = dict(plan.info, reordered={"peak_before": plan.peak_bytes, "peak_after": best.peak_bytes, "moves": moves})
    best.solve_seconds = plan.solve_seconds + time.perf_counter() - start
    return best


@register("reorder")
def reorder_solver(graph: Graph, budget_bytes: int | None, *, time_limit: float | None = None, **options) -> Plan:
    """Every node computed once (store_all's work, no recomputation), in an order of lower peak."""
    from .baselines import store_all

    left = time_left(time_limit)
    plan = copy.copy(reorder(store_all(graph, budget_bytes), time_limit=REORDER_TIME_LIMIT if left is None else left))
    plan.solver = "reorder"
    return plan


# ------------------------------------------------------------------------------------- the search
def _judged(graph: Graph, forward: list[int], backward: list[int], like: Plan) -> Plan | None:
    try:
        return Plan.from_schedule(graph, forward, backward, budget_bytes=like.budget_bytes, solver=like.solver)
    except InvalidPlanError:  # an order the simulator refuses (an optimizer update read after, ...)
        return None


def _score(plan: Plan) -> tuple[int, int, int]:
    timeline = plan.simulation.timeline
    return plan.peak_bytes, sum(1 for b in timeline if b == plan.peak_bytes), sum(timeline)


def _candidate_orders(plan: Plan, forward: list[int], backward: list[int]):
    """Orders of (forward, backward) one block move away, the most promising first."""
    graph = plan.graph
    peak_at = _peak_compute(plan)
    if peak_at is None:
        return
    computes_before = sum(1 for ins in plan.instructions[:peak_at] if ins.kind == COMPUTE)
    in_forward = peak_at < plan.boundary
    seq = forward if in_forward else backward
    p = computes_before if in_forward else computes_before - len(forward)
    resident = _resident_before(plan, peak_at)
    before, after = _instance_edges(graph, seq)
    ancestors_of_p = _closure(before, p, lo=0)
    descendants_of_p = _closure(after, p, hi=len(seq) - 1)
    nodes, values = graph.nodes, graph.values

    moves = []  # (bytes it may take off the peak, kind, position)
    for c in range(p):
        if c in ancestors_of_p:
            continue
        held = sum(values[v].bytes for v in set(nodes[seq[c]].outputs) if v in resident)
        if held:
            moves.append((held, "sink", c))
    for c in range(p + 1, len(seq)):
        if c in descendants_of_p:
            continue
        read = sum(values[v].bytes for v in set(nodes[seq[c]].inputs) if v in resident)
        if read:
            moves.append((read, "hoist", c))
    moves.sort(key=lambda m: (-m[0], m[2]))
    for _, kind, c in moves:
        if kind == "sink":  # the block lies in [c, p): p moves up by its size, the block goes right after p
            block = _closure(after, c, hi=p - 1)
            at = p - len(block) + 1
        else:  # the block lies in (p, c]: it goes right before p
            block = _closure(before, c, lo=p + 1)
            at = p
        rest = [nid for i, nid in enumerate(seq) if i not in block]
        moved = rest[:at] + [seq[i] for i in sorted(block)] + rest[at:]
        yield (moved, backward) if in_forward else (forward, moved)


def _peak_compute(plan: Plan) -> int | None:
    """The instruction index of the compute at (or last before) the plan's first peak."""
    i = plan.simulation.peak_index
    while i >= 0 and plan.instructions[i].kind != COMPUTE:
        i -= 1
    return i if i >= 0 else None


def _resident_before(plan: Plan, index: int) -> set[int]:
    """Values the plan holds when instruction ``index`` starts (its own outputs included)."""
    resident: set[int] = set(plan.graph.tangents) if index >= plan.boundary else set()
    nodes = plan.graph.nodes
    for ins in plan.instructions[: index + 1]:
        if ins.kind == COMPUTE:
            resident.update(nodes[ins.target].outputs)
        elif ins.kind == FREE:
            resident.discard(ins.target)
    return resident


def _instance_edges(graph: Graph, seq: list[int]) -> tuple[list[set[int]], list[set[int]]]:
    """The instance DAG of one phase's computes: ``before[i]``, the positions ``i`` must follow;
    ``after[i]``, those that must follow ``i``."""
    before: list[set[int]] = [set() for _ in seq]
    made_at: dict[int, int] = {}  # value -> position of the latest compute that made it
    readers: dict[int, list[int]] = {}  # value -> positions that read its latest copy
    nodes = graph.nodes
    for i, nid in enumerate(seq):
        node = nodes[nid]
        for v in node.inputs:
            if v in made_at:
                before[i].add(made_at[v])
            readers.setdefault(v, []).append(i)
        for v in node.outputs:
            if v in made_at:  # a recomputation: after the previous copy and all its readers
                before[i].add(made_at[v])
            before[i].update(r for r in readers.get(v, ()) if r != i)
            made_at[v] = i
            readers[v] = []
    after: list[set[int]] = [set() for _ in seq]
    for i, deps in enumerate(before):
        for j in deps:
            after[j].add(i)
    return before, after


def _closure(edges: list[set[int]], start: int, lo: int = 0, hi: int | None = None) -> set[int]:
    """``start`` and every position reachable from it along ``edges`` within ``[lo, hi]``."""
    hi = len(edges) - 1 if hi is None else hi
    seen = {start}
    stack = [start]
    while stack:
        i = stack.pop()
        for j in edges[i]:
            if lo <= j <= hi and j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


__all__ = ["reorder", "reorder_solver", "REORDER_TIME_LIMIT"]

"""Revolve: Griewank & Walther's binomial checkpointing, for forward graphs that are chains.

The forward is a chain of l steps, x_{k+1} = f_k(x_k) (x_0: parameters and inputs, free;
x_{k+1}: the outputs of forward node k). Reversing step k needs its input x_k and its output
x_{k+1} (the "tape"). With s snapshot slots (states held besides x_0), the steps [i, j) are
reversed from a held x_i by::

    reverse(i, j, s):
        j = i + 1:   compute step i (the tape); run its backward
        s = 0:       for k = j−1 … i: advance i → k keeping nothing, tape k, backward k
        otherwise:   advance i → m and keep x_m;  reverse(m, j, s−1);  drop x_m;  reverse(i, m, s)

Counting advances (forward steps besides the one tape per step), the best split solves::

    F(n, s) = min_{1≤m<n}  m + F(n−m, s−1) + F(m, s),    F(1, s) = 0,   F(n, 0) = n(n−1)/2

whose solution is binomial: with β(a, t) = C(a+t, a) and t the least integer with
β(s+1, t) ≥ n,  F(n, s) = t·n − β(s+2, t−1). F is convex in n, so m ↦ m + F(n−m, s−1) + F(m, s)
is convex and its minimiser is found by bisection. Steps count as equal (classic Revolve).

On the graph: the first sweep of ``reverse(0, l, s)`` computes every step once, in order: that
is the forward pass. Then come the graph's backward nodes in their order, each preceded by the
computes the schedule makes before reversing its step. A backward node belongs to the largest
step whose forward outputs it reads (one reading none, to the step of the node before it). The
plan thus recomputes F(l, s) forward nodes (fewer where a recomputed value would go unread).
A "snapshot" is simply a value read again later without being recomputed:
:meth:`~remat.plan.Plan.from_schedule` frees every value after its last use.

The solver sweeps s = 0 … l−1 and returns the cheapest plan within the budget
(``snapshots=s`` fixes s)::

    >>> plan = solve("revolve", graph, budget_bytes=2**30)
    >>> plan.info["snapshots"], plan.recomputations
"""

from __future__ import annotations

import time
from functools import lru_cache
from math import comb

from ..errors import SolverError
from ..graph import ACTIVATION, Graph
from ..plan import Plan
from .registry import register
from .schedule import cheapest_fitting, prune_unread


# ------------------------------------------------------------------------ the binomial schedule
def _beta(a: int, t: int) -> int:
    return comb(a + t, a) if t >= 0 else 0


@lru_cache(maxsize=None)
def min_advances(n: int, s: int) -> int:
    """F(n, s): the fewest forward advances that reverse n steps with s snapshot slots."""
    if n <= 1:
        return 0
    if s == 0:
        return n * (n - 1) // 2
    t = 0
    while _beta(s + 1, t) < n:
        t += 1
    return t * n - _beta(s + 2, t - 1)


@lru_cache(maxsize=None)
def best_split(n: int, s: int) -> int:
    """The m in 1 … n−1 minimising m + F(n−m, s−1) + F(m, s) (convex in m: bisection)."""

    def cost(m: int) -> int:
        return m + min_advances(n - m, s - 1) + min_advances(m, s)

    lo, hi = 1, n - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if cost(mid + 1) >= cost(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def revolve_events(steps: int, snapshots: int) -> list[tuple[str, int]]:
    """The schedule of ``reverse(0, steps, snapshots)`` as events ``("compute", k)`` (run step k),
    ``("hold", q)`` / ``("drop", q)`` (state x_q becomes / stops being a snapshot) and
    ``("reverse", k)`` (run the backward of step k), in order."""
    events: list[tuple[str, int]] = []
    tasks: list[tuple] = [("reverse", 0, steps, snapshots)] if steps > 0 else []  # explicit stack: chains can be deep
    while tasks:
        task = tasks.pop()
        if task[0] == "drop":
            events.append(task)
            continue
        _, i, j, s = task
        if j - i == 1:
            events += [("compute", i), ("reverse", i)]
        elif s == 0:
            for k in range(j - 1, i - 1, -1):
                events += [("compute", q) for q in range(i, k + 1)]
                events.append(("reverse", k))
        else:
            m = i + best_split(j - i, s)
            events += [("compute", q) for q in range(i, m)]
            events.append(("hold", m))
            tasks += [("reverse", i, m, s), ("drop", m), ("reverse", m, j, s - 1)]
    return events


# ------------------------------------------------------------------------ on the graph
def check_chain(graph: Graph) -> None:
    """Raise :class:`SolverError` unless every forward node reads forward activations only
    from the forward node right before it."""
    fwd = graph.forward_nodes
    for k, node in enumerate(fwd):
        for v in node.inputs:
            value = graph.values[v]
            if value.kind != ACTIVATION:
                continue
            if k == 0 or value.producer != fwd[k - 1].id:
                raise SolverError(
                    f"revolve needs a chain: forward node {node.name} reads {value.name} produced by "
                    f"non-adjacent node {graph.nodes[value.producer].name}; use chen_sqrt_ap / checkmate"
                )


def backward_steps(graph: Graph) -> dict[int, int]:
    """Backward node id -> the chain step (forward position) whose backward it is part of."""
    pos = {n.id: k for k, n in enumerate(graph.forward_nodes)}
    step = len(graph.forward_nodes) - 1
    steps = {}
    for b in graph.backward_nodes:
        reads = [pos[graph.values[v].producer] for v in b.inputs if graph.values[v].producer in pos]
        if reads:
            step = max(reads)
        steps[b.id] = step
    return steps


def revolve_schedule(graph: Graph, snapshots: int) -> tuple[list[int], list[int]]:
    """(forward, backward) node id sequences of the Revolve plan with ``snapshots`` slots."""
    fwd, values = graph.forward_nodes, graph.values
    l = len(fwd)
    pos = {n.id: k for k, n in enumerate(fwd)}
    forward_outputs = set(graph.forward_outputs)
    no_recompute = set(graph.meta.get("no_backward_recompute", ()))
    # steps whose outputs stay resident anyway: never recomputed in the backward
    fixed = {k for k, n in enumerate(fwd) if n.id in no_recompute or set(n.outputs) <= forward_outputs}

    pre: dict[int, list[tuple[str, int]]] = {}  # step -> events before its reversal
    pending: list[tuple[str, int]] = []
    for event in revolve_events(l, snapshots):
        if event[0] == "reverse":
            pre[event[1]], pending = pending, []
        else:
            pending.append(event)

    forward = [fwd[k].id for kind, k in pre.get(l - 1, ()) if kind == "compute"]
    assert forward == [n.id for n in fwd], "the first sweep of Revolve is the forward pass"
    backward: list[int] = []
    held: set[int] = set()  # states kept as snapshots
    available: set[int] = set()  # states resident while the current step is reversed
    extra: set[int] = set()  # steps recomputed for a backward node reading outside its step

    def enter(step: int) -> None:
        nonlocal available, extra
        for kind, k in pre[step]:
            if kind == "hold":
                held.add(k)
            elif kind == "drop":
                held.discard(k)
            elif step != l - 1 and k not in fixed:
                backward.append(fwd[k].id)
        available, extra = held | {0, step, step + 1}, set()

    def resident(k: int) -> bool:  # are step k's outputs (state x_{k+1}) resident?
        return k < 0 or k in fixed or k in extra or k + 1 in available

    def ensure(k: int) -> None:  # recompute step k from the nearest resident state before it
        if resident(k):
            return
        r = k
        while not resident(r - 1):
            r -= 1
        for q in range(r, k + 1):
            backward.append(fwd[q].id)
            extra.add(q)

    if l:
        enter(l - 1)
    current = l - 1
    steps = backward_steps(graph)
    for b in graph.backward_nodes:
        while current > steps[b.id]:
            current -= 1
            enter(current)
        for v in b.inputs:
            if values[v].producer in pos:
                ensure(pos[values[v].producer])
        backward.append(b.id)
    return forward, prune_unread(graph, backward, set(graph.backward_outputs))


@register("revolve")
def revolve(
    graph: Graph,
    budget_bytes: int | None,
    *,
    time_limit=None,
    snapshots: int | None = None,
    **options,
) -> Plan:
    """Binomial checkpointing on a chain; ``snapshots`` fixed, or swept for the cheapest fitting plan."""
    check_chain(graph)
    l = len(graph.forward_nodes)
    if snapshots is not None and (not isinstance(snapshots, int) or snapshots < 0):
        raise SolverError(f"snapshots must be a non-negative int, got {snapshots!r}")
    sweep = [snapshots] if snapshots is not None else list(range(max(l - 1, 0), -1, -1))
    start = time.perf_counter()
    plans = []
    for s in sweep:  # most snapshots (cheapest) first, so a time limit keeps the cheap end
        forward, backward = revolve_schedule(graph, s)
        plan = Plan.from_schedule(graph, forward, backward, solver="revolve")
        plan.info.update(snapshots=s, steps=l, advances=min_advances(l, s))
        plans.append(plan)
        if time_limit is not None and time.perf_counter() - start > time_limit:
            break
    best = cheapest_fitting(plans, budget_bytes)
    best.info["sweep"] = len(plans)
    return best


__all__ = ["revolve", "revolve_events", "revolve_schedule", "min_advances", "best_split", "check_chain", "backward_steps"]

"""A lower bound on the recomputation any plan in the graph's order needs: one stage at a time.

The exact planners (:mod:`remat.solvers.cpsat`, :mod:`remat.solvers.checkmate`) plan in the graph's
order: stage ``t`` runs node ``t``, and forward nodes are recomputed only between the stages. Take
the moment node ``t`` runs. With everything kept (store-all), ``here(t)`` bytes are counted then;
the budget leaves ``excess = here(t) − budget`` to free. A forward value ``v`` made before ``t`` and
read by a node after it (not by ``t`` itself) may be absent at that moment only if its producer
``i`` runs again after stage ``t``; that recomputation reads ``i``'s inputs, so each input ``u``
that store-all no longer holds at ``t`` is held across ``t`` unless its own producer runs again
after ``t`` too. With ``r_i = 1`` for "``i`` is recomputed in a stage after ``t``"::

    min  Σ_i cost(i) · r_i
    s.t. Σ_{v live at t, not read by t} bytes(v) · r_producer(v)  −  Σ_u bytes(u) · x_u  ≥  excess
         x_u ≥ r_i − r_producer(u)     for each input u of i that store-all no longer holds at t
         r_i = 0 where i's recomputation window ends at t;   r, x ∈ {0, 1}

Every plan in the order satisfies this at every stage (its recomputations after ``t`` are such an
``r``; each costs at least once), so the largest optimum over the stages bounds its recomputation
cost from below: a plan of that cost is optimal. Memory is counted as the exact planners' models
count it, without in-place reuse (the simulator's credit for outputs written into dying inputs).
Each stage is a small MILP (HiGHS): at most one binary per forward node and per value. The stages
are solved in order of excess, largest first, within a time limit; any subset of them gives a bound.

*Joint* bound over the stages solved: one recomputation serves every stage before it up to the
next reader of the value it restores, but no stage past that reader. Split the stages after node
``i`` at the readers of ``i``'s values into segments; ``y_{i,k} = 1`` when ``i`` runs again at
least once in segment ``k``, ``a_{v,t} = 1`` when value ``v`` is absent while node ``t`` runs::

    min  Σ_{i,k} cost(i) · y_{i,k}
    s.t. a_{v,t} ≤ Σ_{k meeting (t, next reader of v after t]} y_{producer(v),k}
         x_{u,t} + Σ_{k after t} y_{producer(u),k} ≥ a_{v,t}   for each input u of producer(v)
                                                       that store-all no longer holds at t
         Σ_v bytes(v) · a_{v,t} − Σ_u bytes(u) · x_{u,t} ≥ excess(t)      for each stage t

A plan's recomputations give such ``y`` (each counted once per segment it falls in), so the optimum
bounds it too, and it is at least each stage's own: the U-Net of the zoo at half its peak, +3.14%
of the step where the stages alone give +2.92% and CP-SAT's best plan after 300 s is +3.19%.
"""

from __future__ import annotations

import dataclasses
import math
import time
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from ..graph import Graph
from ..plan import schedule_instructions
from ..simulate import COMPUTE, simulate
from .checkmate_model import horizons, recompute_windows, value_roles

BOUND_SECONDS = 5.0  # what the exact planners give the bound: at most this, and a tenth of their time limit


def time_for_bound(solver_time_limit: float) -> float:
    """The time an exact planner with ``solver_time_limit`` gives :func:`stage_bound`."""
    return min(BOUND_SECONDS, solver_time_limit / 10)


@dataclass(frozen=True)
class StageBound:
    """``cost``: the bound (in the units of the costs given; ``inf`` when some stage cannot fit the
    budget however much is recomputed); ``stage``: the node whose stage sets it; ``solved``: stages
    solved, of ``over`` stages above the budget with everything kept."""

    cost: float
    stage: int | None
    solved: int
    over: int
    joint: float = 0.0  # the joint bound over the stages solved (0 when not computed in time)


def stage_bound(graph: Graph, budget_bytes: int, *, costs: dict[int, float] | None = None,
                time_limit: float = BOUND_SECONDS) -> StageBound:
    """The bound of the module docstring for ``graph`` under ``budget_bytes``; ``costs``: per forward
    node (default: each node's ``cost``, seconds). Memoised per graph, budget and costs."""
    key = ("stage bound", int(budget_bytes), None if costs is None else tuple(sorted(costs.items())))
    return graph.memo.cached(key, lambda: _stage_bound(graph, int(budget_bytes), costs, time_limit))


def _stage_bound(graph: Graph, budget: int, costs, time_limit: float) -> StageBound:
    started = time.perf_counter()
    model_view = dataclasses.replace(graph, meta={k: v for k, v in graph.meta.items() if k != "inplace_reuse"})
    num_forward, n = len(graph.forward_nodes), len(graph.nodes)
    instructions, boundary = schedule_instructions(model_view, range(num_forward), range(num_forward, n))
    highs = simulate(model_view, instructions, boundary, record_highs=True).highs
    excess = {ins.target: highs[k] - budget for k, ins in enumerate(instructions)
              if ins.kind == COMPUTE and highs[k] > budget}
    if not excess:
        return StageBound(0.0, None, 0, 0)
    stages = _Stages(graph, costs)
    best, where, solved = 0.0, None, 0
    order = sorted(excess, key=lambda s: -excess[s])  # largest excess first
    for t in order:
        if solved and time.perf_counter() - started > time_limit:
            break
        bound = stages.bound(t, excess[t], max(0.5, time_limit - (time.perf_counter() - started)))
        solved += 1
        if bound > best:
            best, where = bound, t
        if math.isinf(best):
            break
    joint = 0.0
    left = time_limit - (time.perf_counter() - started)
    if solved > 1 and not math.isinf(best) and left > 0:
        joint = stages.joint({t: excess[t] for t in order[:solved]}, left)
    return StageBound(max(best, joint), where, solved, len(excess), joint)


class _Stages:
    """The per-stage MILPs of one graph (the recomputation windows and readers computed once)."""

    def __init__(self, graph: Graph, costs):
        self.graph = graph
        self.num_forward = len(graph.forward_nodes)
        self.variable, pinned = value_roles(graph)
        horizon, _ = horizons(graph, self.variable, set(range(self.num_forward)))
        windows = recompute_windows(graph, pinned, horizon)
        self.last_stage = [w[-1] if len(w) else -1 for w in windows]  # the last stage i may run again in
        self.last_reader = {v: max(graph.users[v], default=-1) for v in self.variable}
        self.cost = {i: float(costs[i] if costs is not None else graph.nodes[i].cost) for i in range(self.num_forward)}
        users = graph.users
        self.readers = {}  # forward node -> the sorted stages that read its variable values: its segments' ends
        for i in range(self.num_forward):
            stages = set()
            for v in graph.nodes[i].outputs:
                if v in self.variable:
                    stages.update(users[v])
            self.readers[i] = sorted(stages)

    def _across(self, t: int) -> tuple[set[int], set[int]]:
        """(values node ``t`` reads, variable values store-all holds across stage ``t``: made before it,
        read after it)."""
        values = self.graph.values
        held = {v for v in self.variable if values[v].producer < t and self.last_reader[v] > t}
        return set(self.graph.nodes[t].inputs), held

    def _inputs_to_hold(self, i: int, read_by_t: set[int], held: set[int]):
        """The inputs of ``i`` a recomputation after stage ``t`` needs that store-all no longer holds
        at ``t`` (nor counts there: ``t`` does not read them), each once."""
        for u in dict.fromkeys(self.graph.nodes[i].inputs):
            if u in self.variable and u not in held and u not in read_by_t:
                yield u

    def _segments(self, i: int, after: int, until: int) -> range:
        """The segments of node ``i`` (split at its readers) that meet the stages ``(after, until]``."""
        return range(bisect_left(self.readers[i], after + 1), bisect_left(self.readers[i], until) + 1)

    def joint(self, excess: dict[int, int], time_limit: float) -> float:
        """The joint bound (module docstring) over the stages in ``excess``: HiGHS's dual bound."""
        values, users = self.graph.values, self.graph.users
        col_cost: list[float] = []
        segment_column: dict[tuple[int, int], int] = {}

        def recomputed(i: int, k: int) -> int:
            if (i, k) not in segment_column:
                segment_column[(i, k)] = len(col_cost)
                col_cost.append(self.cost[i])
            return segment_column[(i, k)]

        rows: list[tuple[dict[int, float], float]] = []
        for t, over in excess.items():
            read_by_t, held = self._across(t)
            memory: dict[int, float] = {}
            kept_input: dict[int, int] = {}
            for v in sorted(held - read_by_t):
                i = values[v].producer
                if self.last_stage[i] <= t:
                    continue  # i cannot run again after t: v stays
                absent = len(col_cost)
                col_cost.append(0.0)
                memory[absent] = float(values[v].bytes)
                until = min(min(u for u in users[v] if u > t), self.last_stage[i])
                row = {recomputed(i, k): 1.0 for k in self._segments(i, t, until)}
                rows.append(({**row, absent: -1.0}, 0.0))
                for u in self._inputs_to_hold(i, read_by_t, held):
                    if u not in kept_input:
                        kept_input[u] = len(col_cost)
                        col_cost.append(0.0)
                        memory[kept_input[u]] = -float(values[u].bytes)
                    j = values[u].producer
                    row = {kept_input[u]: 1.0, absent: -1.0}
                    if self.last_stage[j] > t:
                        row.update({recomputed(j, k): 1.0 for k in self._segments(j, t, self.last_stage[j])})
                    rows.append((row, 0.0))
            rows.append((memory, float(over)))
        return _solve(col_cost, rows, time_limit)

    def bound(self, t: int, excess: int, time_limit: float) -> float:
        """The optimum (HiGHS's dual bound) of stage ``t``'s MILP: ``inf`` if nothing fits."""
        values = self.graph.values
        candidates = [i for i in range(min(t, self.num_forward)) if self.last_stage[i] > t]
        column = {i: k for k, i in enumerate(candidates)}
        read_by_t, held = self._across(t)
        memory: dict[int, float] = {}  # column -> bytes it adds at t (freed: negative)
        for v in held - read_by_t:
            i = values[v].producer
            if i in column:
                memory[column[i]] = memory.get(column[i], 0.0) - values[v].bytes
        num_cols = len(candidates)
        kept_input: dict[int, int] = {}  # u -> its column x_u
        rows: list[tuple[dict[int, float], float]] = []  # (coefficients, lower bound)
        for i in candidates:
            for u in self._inputs_to_hold(i, read_by_t, held):
                if u not in kept_input:
                    kept_input[u] = num_cols
                    memory[num_cols] = float(values[u].bytes)
                    num_cols += 1
                row = {kept_input[u]: 1.0, column[i]: -1.0}
                j = values[u].producer
                if j in column:
                    row[column[j]] = 1.0
                rows.append((row, 0.0))
        rows.append(({k: -b for k, b in memory.items()}, float(excess)))  # freed − kept inputs ≥ excess
        col_cost = [self.cost[i] for i in candidates] + [0.0] * (num_cols - len(candidates))
        return _solve(col_cost, rows, time_limit)


def _solve(col_cost: list[float], rows, time_limit: float) -> float:
    """min col_cost · x over binary x with each row ``Σ coef · x ≥ lower``: the dual bound."""
    import highspy

    if sum(c for c in rows[-1][0].values() if c > 0) < rows[-1][1]:
        return math.inf  # freeing every candidate's values is not enough
    n = len(col_cost)
    h = highspy.Highs()
    h.silent()
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.0)
    h.addVars(n, np.zeros(n), np.ones(n))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.asarray(col_cost, dtype=np.float64))
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.full(n, highspy.HighsVarType.kInteger))
    for row, lower in rows:
        index = np.fromiter(row.keys(), dtype=np.int32, count=len(row))
        h.addRow(lower, highspy.kHighsInf, len(row), index, np.fromiter(row.values(), dtype=np.float64, count=len(row)))
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return math.inf
    info = h.getInfo()
    bound = info.mip_dual_bound
    if status == highspy.HighsModelStatus.kOptimal:
        bound = min(info.objective_function_value, bound) if math.isfinite(bound) else info.objective_function_value
    return max(0.0, float(bound)) if math.isfinite(bound) else 0.0


__all__ = ["StageBound", "stage_bound", "time_for_bound", "BOUND_SECONDS"]

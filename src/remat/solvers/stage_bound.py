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
next reader of the value it restores, but no stage past that reader. ``a_{v,t} = 1`` when value
``v`` is absent while node ``t`` runs, ``x_{u,t} = 1`` when a value store-all has freed by then is
held across ``t``, and ``y_{j,k} = 1`` when node ``j`` runs again at least once in its segment ``k``
(the stages after ``j``, split at every deadline ``d`` the rows below give ``j``)::

    min  Σ_{j,k} cost(j) · y_{j,k}
    s.t. Σ_{l=0..m} absent(u_l, t) − Σ_{k meeting (t, d]} y_{producer(u_m),k} ≤ m
              for each chain v = u_0 <- u_1 <- ... <- u_m (m ≥ 0), u_{l+1} an input of u_l's
              producer, v held by store-all across t; d: the next reader of v after t
              (or the last stage a producer on the chain may run again in, if earlier)
         Σ_v bytes(v) · a_{v,t} − Σ_u bytes(u) · x_{u,t} ≥ excess(t)      for each stage t

with ``absent(u, t)`` = ``a_{u,t}``, or ``1 − x_{u,t}`` for a value store-all has freed. A chain
all absent at ``t`` is restored from its far end: ``u_m``'s producer runs again after ``t`` and
before the recomputation that reads ``u_m``, so by ``d``; chains are followed up to
``JOINT_DEPTH`` inputs deep. A plan's recomputations give such ``y`` (each counted once, in the
segment it falls in), so the optimum bounds it too, and it is at least each stage's own. When
HiGHS has not solved it in half the time left, the same MILP with each node's segments ending only
at its readers runs too (a run by ``d`` then also counts for stages past ``d``: weaker, but easier
for HiGHS; T5 at 70% after 60 s, +12.59% of the step against +11.86%); the larger bound counts. The
deadlines matter: on the zoo's small U-Net at half its peak (``flops`` costs) the stages alone give
+12.89% of the step; the joint bound with each chain's restoration anywhere after ``t`` gave
+13.07%, by ``d`` one input deep +13.67%, two deep +13.76%, which is CP-SAT's plan: proven optimal.

The joint MILP's solution is a plan too (:func:`guided_plan`): each recomputation ``y_{j,k}`` runs
in the latest stage of segment ``k`` that still precedes the recomputations there reading ``j``, and
:meth:`~remat.plan.Plan.from_schedule` holds and frees values around them. The bound's memory model
is a relaxation (nothing is counted while a recomputation runs), so the simulator judges whether it
fits; when it does and the MILP was solved, it costs the bound and is optimal.
"""

from __future__ import annotations

import dataclasses
import math
import time
from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from ..graph import Graph
from ..plan import Plan, schedule_instructions
from ..simulate import COMPUTE, simulate
from .checkmate_model import horizons, recompute_windows, value_roles

JOINT_DEPTH = 2  # the longest chain of absent values the joint bound follows
BOUND_SECONDS = 5.0  # what the exact planners give the bound: at most this, and a tenth of their time limit


def time_for_bound(solver_time_limit: float) -> float:
    """The time an exact planner with ``solver_time_limit`` gives :func:`stage_bound`."""
    return min(BOUND_SECONDS, solver_time_limit / 10)


@dataclass(frozen=True)
class StageBound:
    """``cost``: the bound (in the units of the costs given; ``inf`` when some stage cannot fit the
    budget however much is recomputed); ``stage``: the node whose stage sets the
    largest per-stage bound; ``solved``: stages
    solved, of ``over`` stages above the budget with everything kept."""

    cost: float
    stage: int | None
    solved: int
    over: int
    joint: float = 0.0  # the joint bound over the stages solved (0 when not computed in time)
    # the joint MILPs' best solutions as schedules (forward, backward with the recomputations placed;
    # see :func:`guided_plan`), none when they found none in time
    schedules: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()


def stage_bound(graph: Graph, budget_bytes: int, *, costs: dict[int, float] | None = None,
                time_limit: float = BOUND_SECONDS, enough: float | None = None) -> StageBound:
    """The bound of the module docstring for ``graph`` under ``budget_bytes``; ``costs``: per forward
    node (default: each node's ``cost``, seconds). ``enough``: the recomputation of a plan in the order
    at hand. Once the stages' bound reaches it, that plan is optimal, and nothing more is solved: the
    joint MILPs would otherwise take the rest of the time where HiGHS does not solve them quickly.
    Memoised per graph, budget, costs and ``enough`` (not per time limit: the first call's stands)."""
    key = ("stage bound", int(budget_bytes), None if costs is None else tuple(sorted(costs.items())), enough)
    return graph.memo.cached(key, lambda: _stage_bound(graph, int(budget_bytes), costs, time_limit, enough))


def _stage_bound(graph: Graph, budget: int, costs, time_limit: float, enough: float | None = None) -> StageBound:
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

    def enough_reached() -> bool:
        return enough is not None and best >= enough * (1 - 1e-6)

    order = sorted(excess, key=lambda s: -excess[s])  # largest excess first
    for t in order:
        if solved and time.perf_counter() - started > time_limit:
            break
        bound = stages.bound(t, excess[t], max(0.5, time_limit - (time.perf_counter() - started)))
        solved += 1
        if bound > best:
            best, where = bound, t
        if math.isinf(best) or enough_reached():
            break
    if enough_reached():  # a plan at hand meets the stages' bound: no joint MILP needed
        return StageBound(best, where, solved, len(excess))
    joint, schedules = 0.0, []
    solved_excess = {t: excess[t] for t in order[:solved]}
    for fine in (True, False):  # segments split at every deadline; if unsolved in half the time, at readers only
        left = time_limit - (time.perf_counter() - started)
        if math.isinf(best) or left <= 0:
            break
        found, schedule, optimal = stages.joint(solved_excess, left / 2 if fine else left, fine_segments=fine)
        joint = max(joint, found)
        schedules += [schedule] if schedule is not None else []
        if optimal:
            break
    return StageBound(max(best, joint), where, solved, len(excess), joint, tuple(schedules))


def guided_plan(graph: Graph, budget_bytes: int, found: StageBound) -> Plan | None:
    """The plan of the joint bound's solution, when it fits ``budget_bytes`` (the simulator judges):
    the cheapest plan in the graph's order when that solution is optimal, for its recomputations
    cost what the bound says. None when there is no solution or it does not fit."""
    plans = [Plan.from_schedule(graph, forward, backward, budget_bytes=budget_bytes, solver="stage_bound")
             for forward, backward in found.schedules]
    return min((p for p in plans if p.peak_bytes <= budget_bytes), key=lambda p: p.compute_seconds, default=None)


@dataclass(frozen=True)
class _Need:
    """A joint-bound row ``Σ row + Σ_{k meeting (after, until]} y_{node,k} ≥ lower`` (no ``y`` when
    ``until < 0``: ``node`` cannot run again)."""

    row: dict[int, float]
    lower: float
    node: int
    after: int
    until: int


class _Stages:
    """The per-stage and joint MILPs of one graph (the recomputation windows computed once)."""

    def __init__(self, graph: Graph, costs):
        self.graph = graph
        self.num_forward = len(graph.forward_nodes)
        self.variable, pinned = value_roles(graph)
        horizon, _ = horizons(graph, self.variable, set(range(self.num_forward)))
        windows = recompute_windows(graph, pinned, horizon)
        self.last_stage = [w[-1] if len(w) else -1 for w in windows]  # the last stage i may run again in
        self.last_reader = {v: max(graph.users[v], default=-1) for v in self.variable}
        self.cost = {i: float(costs[i] if costs is not None else graph.nodes[i].cost) for i in range(self.num_forward)}

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

    def joint(self, excess: dict[int, int], time_limit: float, depth: int | None = None, fine_segments: bool = True):
        """The joint bound (module docstring) over the stages in ``excess`` (as many as can be written
        in half the time), following chains of up to ``depth`` (default ``JOINT_DEPTH``) absent
        inputs: (HiGHS's dual bound, its best solution as a schedule or None, whether it is proven).
        ``fine_segments=False``: a node's segments end at its readers only (and its last stage), not
        at every deadline; a run by a deadline then counts in the segment holding it, which also serves
        stages past the deadline. A weaker MILP, but one HiGHS gets further with in little time (T5
        at 70%, the fine one with 30 s then this one with 30 s: +12.59% of the step, the fine one with all
        60 s: +11.86%; on the U-Net at 50% this one gives +13.07%, the fine one +13.76%)."""
        depth = JOINT_DEPTH if depth is None else depth
        col_cost: list[float] = []

        def column(cost: float = 0.0) -> int:
            col_cost.append(cost)
            return len(col_cost) - 1

        started = time.perf_counter()
        needs: dict[tuple, _Need] = {}
        memory_rows = []
        for t, over in excess.items():  # largest excess first; any subset of the stages gives a bound
            if memory_rows and time.perf_counter() - started > time_limit / 2:
                break
            memory_rows.append(self._stage_rows(t, over, column, needs, depth))
        # y_{j,k}: j runs again in its segment k; a node's segments end at every deadline a row gives it
        ends: dict[int, set[int]] = {}
        for need in needs.values():
            if need.until >= 0 and fine_segments:
                ends.setdefault(need.node, set()).add(need.until)
            elif need.until >= 0 and need.node not in ends:
                j = need.node
                ends[j] = {r for v in self.graph.nodes[j].outputs if v in self.variable for r in self.graph.users[v]}
                ends[j].add(self.last_stage[j])
        sorted_ends = {j: sorted(e) for j, e in ends.items()}
        segment_column: dict[tuple[int, int], int] = {}
        rows: list[tuple[dict[int, float], float]] = []
        for need in needs.values():
            row = dict(need.row)
            if need.until >= 0:
                segment_ends = sorted_ends[need.node]
                for k in range(bisect_left(segment_ends, need.after + 1), bisect_left(segment_ends, need.until) + 1):
                    if (need.node, k) not in segment_column:
                        segment_column[(need.node, k)] = column(self.cost[need.node])
                    row[segment_column[(need.node, k)]] = 1.0
            rows.append((row, need.lower))
        bound, solution, optimal = _solve(col_cost, rows + memory_rows, max(0.1, time_limit - (time.perf_counter() - started)))
        if solution is None:
            return bound, None, optimal
        segments = {}  # j -> the (start, end] of each segment in which the solution runs j again
        for (j, k), col in segment_column.items():
            if solution[col] > 0.5:
                segments.setdefault(j, []).append((sorted_ends[j][k - 1] if k else j, sorted_ends[j][k]))
        return bound, self._schedule(segments), optimal

    def _schedule(self, segments: dict[int, list[tuple[int, int]]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The joint solution's recomputations placed in stages: each as late in its segment as it
        can be while it still comes before every recomputation there that reads it (latest readers
        first, so theirs are placed already); a stage's recomputations in graph order before its node."""
        users = self.graph.users
        placed: dict[int, list[int]] = {}  # j -> the stages it runs again in
        for j in sorted(segments, reverse=True):
            readers = {i for v in self.graph.nodes[j].outputs for i in users[v] if i in placed}
            for start, end in segments[j]:
                stage = end
                for i in readers:
                    stage = min([stage, *(q for q in placed[i] if start < q <= stage)])
                placed.setdefault(j, []).append(stage)
        in_stage: dict[int, list[int]] = {}
        for j, stages in placed.items():
            for stage in stages:
                in_stage.setdefault(stage, []).append(j)
        forward: list[int] = []
        backward: list[int] = []
        for t in range(len(self.graph.nodes)):
            (forward if t < self.num_forward else backward).extend([*sorted(in_stage.get(t, ())), t])
        return tuple(forward), tuple(backward)

    def _stage_rows(self, t: int, over: int, column, needs: dict, depth: int) -> tuple[dict[int, float], float]:
        """Stage ``t``'s columns ``a_{v,t}`` and ``x_{u,t}``, its rows that need a node to run again
        (added to ``needs``), and its memory row (returned)."""
        values, users = self.graph.values, self.graph.users
        read_by_t, held = self._across(t)
        memory: dict[int, float] = {}
        absent: dict[int, int] = {}  # v -> a_{v,t}
        kept: dict[int, int] = {}  # u -> x_{u,t}
        for v in sorted(held - read_by_t):
            if self.last_stage[values[v].producer] > t:  # else v's producer cannot run again: v stays
                absent[v] = column()
                memory[absent[v]] = float(values[v].bytes)

        def absence(u: int) -> tuple[int, int] | None:
            """The literal "``u`` is absent at ``t``": (column, +1 for ``a_u`` or -1 for ``1 − x_u``); None:
            ``u`` is present."""
            if u not in self.variable or u in read_by_t:
                return None
            if u in absent:
                return absent[u], 1
            if u in held:
                return None  # held by store-all, and its producer cannot run again
            if u not in kept:  # store-all has freed u: absent unless held across t
                kept[u] = column()
                memory[kept[u]] = -float(values[u].bytes)
            return kept[u], -1

        for v, a in absent.items():
            i = values[v].producer
            until = min(min(r for r in users[v] if r > t), self.last_stage[i])  # v is back by then
            needs[(a, i)] = _Need({a: -1.0}, 0.0, i, t, until)
            # a chain v <- u_1 <- ... <- u_m all absent at t: each u_l's producer runs again in (t, until]
            stack = [(i, {a: -1.0}, 0.0, 1)]
            while stack:
                node, row, lower, level = stack.pop()
                for u in dict.fromkeys(self.graph.nodes[node].inputs):
                    literal = absence(u)
                    if literal is None:
                        continue
                    col, sign = literal  # Σ y − Σ_l absent(u_l) ≥ 1 − (literals); 1 − x moves a 1 right
                    grown, grown_lower = {**row, col: -float(sign)}, lower - 1.0 if sign == 1 else lower
                    j = values[u].producer
                    runs = self.last_stage[j] > t
                    needs[(tuple(grown.items()), j)] = _Need(grown, grown_lower, j, t,
                                                            min(until, self.last_stage[j]) if runs else -1)
                    if runs and level < depth:
                        stack.append((j, grown, grown_lower, level + 1))
        return memory, float(over)

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
        return _solve(col_cost, rows, time_limit)[0]


def _solve(col_cost: list[float], rows, time_limit: float) -> tuple[float, list[float] | None, bool]:
    """min col_cost · x over binary x with each row ``Σ coef · x ≥ lower``: (the dual bound, the best
    solution found or None, whether it is proven optimal or infeasible)."""
    import highspy

    if sum(c for c in rows[-1][0].values() if c > 0) < rows[-1][1]:
        return math.inf, None, True  # freeing every candidate's values is not enough
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
        return math.inf, None, True
    info = h.getInfo()
    bound = info.mip_dual_bound
    if status == highspy.HighsModelStatus.kOptimal:
        bound = min(info.objective_function_value, bound) if math.isfinite(bound) else info.objective_function_value
    feasible = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    solution = list(h.getSolution().col_value) if feasible else None
    return (max(0.0, float(bound)) if math.isfinite(bound) else 0.0), solution, status == highspy.HighsModelStatus.kOptimal


__all__ = ["StageBound", "stage_bound", "guided_plan", "time_for_bound", "BOUND_SECONDS"]

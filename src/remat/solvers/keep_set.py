"""The cheapest schedule of a graph when only what its forward keeps is bounded.

Rockmate's block menus (:mod:`remat.solvers.hierarchical`) ask, for a grid of *save budgets*
``s``: what is the least compute with which the block's backward can run if its forward keeps
at most ``s`` bytes for it, memory being otherwise unbounded? The Checkmate MILP answers that
with thousands of variables (every stage, every value); without a peak to respect the question
is much smaller, and this module answers it exactly with a MILP of one variable per forward node
and per forward value.

With memory unbounded, a schedule is fixed by the set ``K`` of forward values kept across the
boundary: the forward runs once; before each backward op, the producers of what it reads that
is neither kept nor recomputed yet are recomputed (recursively, from kept values and inputs),
and what is recomputed stays until its last use. Recomputing a node twice never pays, so the
least compute is::

    min  Σ_i c_i X_i
    s.t. K_v + X_p(v) ≥ 1            for every droppable forward value v a backward op reads
         K_u + X_p(u) ≥ X_i          for every droppable input u of a forward node i
         Σ_v M_v K_v ≤ s
         X_i = 0                     where node i cannot run in the backward (reads a mutated input)

over binary ``X_i`` (node ``i`` is recomputed) and ``K_v`` (value ``v`` is kept), "droppable"
being the forward values that are not forward outputs (:func:`~remat.solvers.checkmate_model.value_roles`).
Among the cheapest, a second solve keeps the fewest bytes. The schedule is then built by
:func:`~remat.solvers.schedule.backward_with_recomputation`, whose recomputations are exactly the
nodes the kept set forces, so its compute is the optimum. It is also a feasible point of the
Checkmate MILP with the same save budget whenever the latter's peak bound is at least this
schedule's peak, and then an optimal one.

Solved LP first (:meth:`KeepSetModel._minimum`): the relaxation is nearly integral, a knapsack over
a closure leaving two or three fractional columns; integral, it is the optimum; else the MILP over the
fractional columns alone, the others fixed, is taken when within a given gap of the LP's bound, and the
full MILP runs otherwise (block menus: gap 0, exact).

The ``keep_set`` solver (:func:`keep_set`) plans a whole graph this way (within ``GAP``), the class of plans
Inductor's min-cut partitioner makes (one set of values kept, the rest recomputed where the
backward needs it), but with the least compute for each save budget rather than the fewest bytes:
it tries save budgets on a grid from the largest down, stops at the first whose plain schedule's
simulated peak fits the budget (keeping less never costs less), and bisects between that save budget
and the next one up. The cheapest fitting schedules then lose the recomputations the budget does
not need (:func:`~remat.solvers.recompute_less.recompute_less`): a lean schedule recomputes a value
once per reader, and most of those repeats fit once the rest are gone (the zoo U-Net at half its
peak: +12.5% of the step down to +3.4%). Such a plan is no longer one kept set plus
recomputations, but it is cheaper, and it is what the exact solvers start from. ``auto`` runs
``keep_set`` beside the hierarchical planner, whose DP over blocks can miss such plans. Below every plan's lower bound (``budget="min"`` asks at 0) nothing fits and every save
budget of the grid is tried for the smallest peak; there a kept set within ``SMALLEST_GAP`` of the least
compute will do (the LP's rounding, milliseconds), and only the smallest peak's save budget is solved
exactly too.
"""

from __future__ import annotations

import copy
import math
import time

import numpy as np

from ..errors import SolverError
from ..graph import Graph
from ..plan import Plan
from ..simulate import peak_lower_bound
from .registry import register
from .checkmate_model import set_start, value_roles
from .recompute_less import recompute_less
from .schedule import backward_with_recomputation, cheapest_fitting


class KeepSetModel:
    """The MILP of the module docstring for one graph; :meth:`solve` per save budget."""

    def __init__(self, graph: Graph):
        self.graph = graph
        values, nodes = graph.values, graph.nodes
        variable, _pinned = value_roles(graph)
        fixed = set(graph.meta.get("no_backward_recompute", ()))
        forward = [n.id for n in graph.forward_nodes]
        self.x_col = {i: k for k, i in enumerate(forward)}
        self.k_col = {v: len(forward) + k for k, v in enumerate(sorted(variable))}
        self.num_cols = len(forward) + len(variable)
        self.variable = variable
        rows: list[tuple[float, dict[int, float]]] = []  # (lower bound, terms) of "terms >= lower"
        read_by_backward = {v for n in graph.backward_nodes for v in n.inputs if v in variable}
        self.backward_read_bytes = sum(values[v].bytes for v in read_by_backward)  # what storing all keeps
        for v in sorted(read_by_backward):
            rows.append((1.0, {self.k_col[v]: 1.0, self.x_col[values[v].producer]: 1.0}))
        for i in forward:
            for u in dict.fromkeys(nodes[i].inputs):
                if u in variable:
                    rows.append((0.0, {self.k_col[u]: 1.0, self.x_col[values[u].producer]: 1.0,
                                       self.x_col[i]: -1.0}))
        self.rows = rows
        self._csr = (np.asarray([r[0] for r in rows], dtype=np.float64),  # the rows as a row-wise matrix
                     np.asarray([len(r[1]) for r in rows], dtype=np.int64),
                     np.asarray([c for r in rows for c in r[1]], dtype=np.int32),
                     np.asarray([x for r in rows for x in r[1].values()], dtype=np.float64))
        self.upper = np.ones(self.num_cols)
        for i in fixed:
            if i in self.x_col:
                self.upper[self.x_col[i]] = 0.0
        total_cost = sum(nodes[i].cost for i in forward)
        self.cost_scale = total_cost if total_cost > 0 else 1.0
        self.cost = np.zeros(self.num_cols)
        for i in forward:
            self.cost[self.x_col[i]] = nodes[i].cost / self.cost_scale
        total_bytes = sum(values[v].bytes for v in variable)
        self.byte_scale = float(total_bytes) if total_bytes > 0 else 1.0
        self.bytes = np.zeros(self.num_cols)
        for v in variable:
            self.bytes[self.k_col[v]] = values[v].bytes / self.byte_scale

    def _highs(self, objective: np.ndarray, extra_rows: list[tuple[float, float, np.ndarray]],
               time_limit: float | None = None, *, integer: bool = True, fixed: np.ndarray | None = None,
               start: np.ndarray | None = None):
        """Solve the model with ``objective`` and ``extra_rows`` ((lower, upper, coefficients)): a 0/1
        vector, or None when infeasible (or stopped without a solution). ``integer=False``: the LP
        relaxation's vector; ``fixed``: columns whose value (not NaN) is fixed; ``start``: a warm start."""
        import highspy

        base_lower, lengths, index, value = self._csr
        extra_index = [np.flatnonzero(r[2]) for r in extra_rows]
        lp = highspy.HighsLp()
        n = self.num_cols
        lp.num_col_ = n
        lp.num_row_ = len(base_lower) + len(extra_rows)
        lp.col_cost_ = np.asarray(objective, dtype=np.float64)
        lower, upper = np.zeros(n), np.asarray(self.upper, dtype=np.float64).copy()
        if fixed is not None:
            known = ~np.isnan(fixed)
            lower[known] = upper[known] = fixed[known]
        lp.col_lower_, lp.col_upper_ = lower, upper
        lp.row_lower_ = np.concatenate([base_lower, [max(r[0], -highspy.kHighsInf) for r in extra_rows]])
        lp.row_upper_ = np.concatenate([np.full(len(base_lower), highspy.kHighsInf), [r[1] for r in extra_rows]])
        starts = np.zeros(lp.num_row_ + 1, dtype=np.int32)
        starts[1:] = np.cumsum(np.concatenate([lengths, [len(k) for k in extra_index]]))
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_ = n
        lp.a_matrix_.num_row_ = lp.num_row_
        lp.a_matrix_.start_ = starts
        lp.a_matrix_.index_ = np.concatenate([index] + [k.astype(np.int32) for k in extra_index])
        lp.a_matrix_.value_ = np.concatenate([value] + [r[2][k] for r, k in zip(extra_rows, extra_index)])
        if integer:
            lp.integrality_ = [highspy.HighsVarType.kInteger] * n
        h = highspy.Highs()
        h.silent()
        h.passModel(lp)
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("mip_abs_gap", 1e-12)
        if time_limit is not None:
            h.setOptionValue("time_limit", float(time_limit))
        if start is not None:
            set_start(h, start)
        h.run()
        status = h.getModelStatus()
        stopped_with_a_plan = (time_limit is not None and status == highspy.HighsModelStatus.kTimeLimit
                               and h.getInfo().primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible)
        if status != highspy.HighsModelStatus.kOptimal and not stopped_with_a_plan:
            return None
        x = np.asarray(h.getSolution().col_value)
        return np.round(x) if integer else x

    def _minimum(self, objective: np.ndarray, rows: list, time_limit: float | None, gap: float):
        """A 0/1 vector of least ``objective`` under ``rows``, within ``gap`` of the least (None: infeasible).

        The LP relaxation first (milliseconds): this model's is nearly integral (a knapsack over a
        closure: a few fractional columns). Integral, it is the optimum. Otherwise the MILP with every
        integral column fixed at its value; within ``gap`` of the LP's bound, that is the answer, else
        the full MILP, warm-started from it."""
        relaxed = self._highs(objective, rows, integer=False)
        if relaxed is None:
            return None
        fractional = np.abs(relaxed - np.round(relaxed)) > 1e-6
        if not fractional.any() and all(lo - 1e-9 <= float(c @ np.round(relaxed)) <= up + 1e-9 for lo, up, c in rows):
            return np.round(relaxed)
        fixed = np.where(fractional, np.nan, np.round(relaxed))
        rounded = self._highs(objective, rows, time_limit, fixed=fixed)
        if rounded is not None and float(objective @ rounded) - float(objective @ relaxed) <= gap:
            return rounded
        return self._highs(objective, rows, time_limit, start=rounded)

    def solve(self, save_budget_bytes: int, time_limit: float | None = None, gap: float = 0.0) -> set[int] | None:
        """The kept set of least compute within ``save_budget_bytes`` of droppable forward values,
        fewest bytes among the cheapest (None when none fits: nodes that cannot be recomputed need
        more). With ``time_limit`` (seconds per MILP), the best set found by then, which may cost more
        than the least (None if there is none yet). ``gap``: a set whose recomputation costs at most this
        share of the forward's compute more than the least will do (0: the least)."""
        budget = save_budget_bytes / self.byte_scale * (1 + 1e-12)
        x = self._minimum(self.cost, [(-math.inf, budget, self.bytes)], time_limit, gap)
        if x is None:
            return None
        best = float(self.cost @ x)
        y = self._minimum(self.bytes, [(-math.inf, budget, self.bytes),
                                       (-math.inf, best + 1e-9 * max(best, 1.0), self.cost)], time_limit, gap)
        if y is not None:
            x = y
        return {v for v, col in self.k_col.items() if x[col] > 0.5}

    def schedule(self, kept: set[int], *, lean: bool = False) -> tuple[list[int], list[int]]:
        """The (forward, backward) schedule keeping ``kept``: recomputed values stay until their last
        use, or with ``lean`` only until the backward op that needs them (more compute, lower peak)."""
        forward = [n.id for n in self.graph.forward_nodes]
        backward = backward_with_recomputation(self.graph, kept=kept, segment_of={i: i for i in forward},
                                               drop_after_each_op=lean)
        return forward, backward


SAVE_GRID = 20  # the solver's save budgets: k/20 of what storing everything keeps, k = 0..20
REFINE_STEPS = 6  # bisections between the best fitting save budget of the grid and the next one
SOLVE_TIME_LIMIT = 1.0  # seconds per MILP: then its best kept set so far
# the solver's kept sets recompute at most this share of the forward's compute more than the least: on a
# deep model of identical layers the MILP spends its whole time limit closing a gap of that size (its
# symmetric knapsack), where the LP relaxation rounded to a set within it takes milliseconds
GAP = 1e-3
# below every plan's lower bound nothing fits and the answer is the smallest peak over the save budgets,
# so the kept sets only need to be near the cheapest: within this share of the forward's compute, which
# the LP's rounding (the MILP over its fractional columns) meets in milliseconds where the exact MILP
# hits its time limit at every save budget (GPT-2 split into 16 chunks, 245 nodes: 15.4 s -> 0.4 s, the
# same smallest peak). The save budget of the smallest peak is then solved exactly too (GAP), and the
# better of the two plans (peak, then compute) kept.
SMALLEST_GAP = 0.05
DEFAULT_TIME_LIMIT = 60.0  # seconds for the whole solver
# the fitting schedules, cheapest first, that recompute_less then thins out, while it finds something to take
# out: on the zoo U-Net's op graph at half its peak the cheapest, a lean schedule (+12.5% of the step, 139
# recomputations), becomes +3.41% in 0.14 s, where CP-SAT warm-started from the +12.5% found nothing better in
# 40 s; the next two become +3.38% and +3.54%. On a 64-layer Llama-style model at 50% nothing can be taken out of
# the cheapest (its plain schedule) and the loop stops after it: 0.4 s (the next two: 1.5 s and 2.9 s, and dearer)
TAKE_OUT_FROM = 3


class KeepSetPlanner:
    """The ``keep_set`` solver's plans of one graph, memoised per save budget (shared across budgets)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.model = KeepSetModel(graph)
        self._kept: dict[tuple[int, float], set[int] | None] = {}  # (save budget, gap) -> kept set (None: none fits)
        self._plans: dict[tuple[int, float, bool], Plan] = {}  # (save budget, gap, lean) -> its schedule's plan
        self._smallest: Plan | None = None  # the smallest peak of a whole sweep below the bound

    def plans_at(self, save: int, time_limit: float | None, budget_bytes: int | None = None,
                 over_budget_too: bool = False, gap: float = GAP) -> list[Plan]:
        """The schedules keeping the cheapest set within ``save`` bytes, plain and lean ([] if none);
        the lean one only when the plain one peaks above ``budget_bytes`` (it costs at least as much);
        unless ``over_budget_too``, none when the kept set alone is over ``budget_bytes`` (its values are
        all resident, each in its own storage, when the forward ends: no schedule of it fits, and
        simulating two took 0.3 s a save budget on a 64-layer model). The first answer for ``save``
        is kept, also one a time limit cut short. ``gap``: the kept set's compute within this share of
        the forward's above the least."""
        if (save, gap) not in self._kept:
            self._kept[(save, gap)] = self.model.solve(save, time_limit, gap)
        kept = self._kept[(save, gap)]
        if kept is None:
            return []
        if (budget_bytes is not None and not over_budget_too
                and sum(self.graph.values[v].bytes for v in kept) > budget_bytes):
            return []
        plans = []
        for lean in (False, True):
            if (save, gap, lean) not in self._plans:
                self._plans[(save, gap, lean)] = Plan.from_schedule(self.graph, *self.model.schedule(kept, lean=lean))
            plans.append(self._plans[(save, gap, lean)])
            if budget_bytes is not None and plans[0].peak_bytes <= budget_bytes:
                break
        return plans

    def solve(self, budget_bytes: int | None, time_limit: float) -> Plan:
        """The solver's plan at ``budget_bytes`` (see :func:`keep_set`). At a budget no higher than the
        smallest peak a whole sweep below the bound found, that plan, without sweeping again
        (``budget="min"`` plans at the minimum it has just found: 20 s more on a 2,302-node split step)."""
        if self._smallest is not None and budget_bytes is not None and budget_bytes <= self._smallest.peak_bytes:
            return self._smallest
        start = time.perf_counter()

        def left() -> float:
            return time_limit - (time.perf_counter() - start)

        def per_solve() -> float:  # each MILP's time limit
            return min(SOLVE_TIME_LIMIT, max(left(), 0.1))

        def fits(p: Plan) -> bool:
            return budget_bytes is None or p.peak_bytes <= budget_bytes

        total = self.model.backward_read_bytes
        grid = sorted({round(k * total / SAVE_GRID) for k in range(SAVE_GRID + 1)}, reverse=True)
        # below the bound of every plan (budget="min" asks at 0): the smallest peak is sought, kept sets near the cheapest do
        smallest = budget_bytes is not None and budget_bytes < peak_lower_bound(self.graph)
        gap = SMALLEST_GAP if smallest else GAP
        found: dict[int, list[Plan]] = {}
        for save in grid:  # largest first, down to the first whose cheapest kept set's plain schedule fits
            if left() <= 0:
                break
            found[save] = self.plans_at(save, per_solve(), budget_bytes, gap=gap)
            if found[save] and fits(found[save][0]):
                # the plain schedule of the cheapest kept set fits: keeping less never costs less compute
                # (the optimum is monotone in the save budget, and a lean schedule costs at least as much)
                break
        fitting_saves = [s for s, plans in found.items() if any(fits(p) for p in plans)]
        if fitting_saves and budget_bytes is not None:
            # the cheapest fitting plan keeps as much as fits: search between it and the next grid point
            best = cheapest_fitting([p for s in fitting_saves for p in found[s]], budget_bytes)
            low = max(s for s in fitting_saves if any(p is best for p in found[s]))
            higher = [s for s in grid if s > low]
            if higher:
                high = min(higher)
                for _ in range(REFINE_STEPS):
                    if high - low <= 1 or left() <= 0:
                        break
                    mid = (low + high) // 2
                    found[mid] = self.plans_at(mid, per_solve(), budget_bytes)
                    low, high = (mid, high) if any(fits(p) for p in found[mid]) else (low, mid)
        candidates = [p for plans in found.values() for p in plans]
        if budget_bytes is not None and not any(fits(p) for p in candidates):
            # nothing fits: the smallest peak is the answer, among the schedules of every set kept
            every = {s: self.plans_at(s, None, budget_bytes, over_budget_too=True, gap=gap) for s in found}
            candidates = [p for plans in every.values() for p in plans]
            if smallest and candidates and left() > 0:  # the smallest peak's save budget, its kept set exact too
                lowest = cheapest_fitting(candidates, budget_bytes)
                save = next(s for s, plans in every.items() if any(p is lowest for p in plans))
                candidates += self.plans_at(save, per_solve(), budget_bytes, over_budget_too=True)
        if not candidates:
            raise SolverError(f"keep_set found no schedule for {self.graph.name!r} in {time_limit:.0f} s")
        if budget_bytes is not None:  # the cheapest fitting schedules without the recomputations the budget does not need
            fitting = sorted((p for p in candidates if fits(p) and p.recomputations > 0), key=lambda p: p.compute_seconds)
            for plan in fitting[:TAKE_OUT_FROM]:
                thinner = recompute_less(plan, budget_bytes, left()) if left() > 0 else plan
                if thinner is plan:  # nothing to take out of the cheapest: likely none of the next either
                    break
                candidates.append(thinner)
        plan = copy.copy(cheapest_fitting(candidates, budget_bytes))  # the memoised one stays as it is
        plan.info = dict(plan.info)
        kept = sum(self.graph.values[v].bytes for v in plan.saved_values)
        plan.info.update({"save budgets tried": len(found), "saved bytes": kept})
        if smallest and len(found) == len(grid):  # the whole sweep: no budget at or below this peak sweeps again
            self._smallest = plan
        return plan


def keep_set_planner(graph: Graph) -> KeepSetPlanner:
    return graph.memo.cached(("keep_set",), lambda: KeepSetPlanner(graph))


@register("keep_set")
def keep_set(graph: Graph, budget_bytes: int | None, *, time_limit: float | None = None, **options) -> Plan:
    """The cheapest schedule that keeps a set of forward values and recomputes the rest in the backward
    (the plans Inductor's min-cut partitioner makes), over save budgets: for each save budget ``s`` on a
    grid of ``k/SAVE_GRID`` of the bytes storing everything keeps, largest first until a schedule fits,
    the exact least-compute kept set within ``s`` (:class:`KeepSetModel`), scheduled plainly and lean;
    then bisection between the best fitting ``s`` and the next. Returns the cheapest plan within the budget, else the smallest peak."""
    if options:
        raise SolverError(f"keep_set takes no options, got {sorted(options)}")
    return keep_set_planner(graph).solve(budget_bytes, DEFAULT_TIME_LIMIT if time_limit is None else time_limit)


__all__ = ["KeepSetModel", "KeepSetPlanner", "keep_set"]

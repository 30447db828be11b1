"""Checkmate's planners: the optimal MILP (``checkmate``) and LP rounding (``checkmate_lp``).

``checkmate`` solves the MILP of :mod:`remat.solvers.checkmate_model` with HiGHS:
warm-started from the cheapest plan that fits among the baselines and LP rounding, stopped at ``time_limit``
(then the best plan found is returned with its MIP gap and a
:class:`~remat.errors.SolverTimeLimitWarning`). When no plan fits, the same model with
the budget as a variable finds the smallest feasible peak, and that plan is returned
(over budget) so that the caller can name the minimum.

``checkmate_lp`` (Checkmate's approximation): solve the LP relaxation at a tightened budget
(``0.9 × budget``, then 0.8, 0.7 and 1.0 if nothing fits), then *two-phase rounding*: keep
``S[t,v] = 1`` where the LP's ``S* > threshold``; start ``R`` from the diagonal, set
``R[t-1,i] = 1`` wherever a kept value is neither kept nor computed the stage before,
then walk each stage in reverse order adding the producers of missing inputs — the
minimal ``R`` that makes ``S`` valid. Thresholds 0.1..0.9 are swept; every candidate is
checked by the simulator and the cheapest that fits is returned.

Both accept ``coarsen`` (see :mod:`remat.solvers.coarsen`; default ``"auto"``: graphs of more than
``AUTO_MAX_NODES`` ops are planned over module-level nodes and expanded back to ops). Plans record the model size, solve status, gap and bound in ``plan.info``.
"""

from __future__ import annotations

import copy
import math
import time
import warnings

import numpy as np

from ..errors import SolverError, SolverTimeLimitWarning
from ..graph import Graph
from ..plan import Plan
from ..simulate import fixed_order_lower_bound
from .registry import SOLVERS, register, solve
from .stage_bound import StageBound, guided_plan, stage_bound, time_for_bound
from .checkmate_model import (Formulation, build, decode, schedule_from_R, set_start, solution_vector, to_highs,
                               value_roles, with_save_budget)

DEFAULT_TIME_LIMIT = 120.0
SMALLEST_PEAK_SECONDS = 10.0  # the least time the smallest-peak MILP gets when the minimum is asked for
# the most it gets to name the minimum for an infeasible budget (see _smallest_peak): half the above, so
# that a later call asking for the minimum reuses its plan (known_smallest_peak) rather than solving again
INFEASIBLE_PEAK_SECONDS = SMALLEST_PEAK_SECONDS / 2
KEEP_SET_WARM_SECONDS = 5.0
WARM_START_SOLVERS = ("store_all", "chen_greedy", "chen_greedy_ap", "chen_sqrt", "chen_sqrt_ap", "revolve", "checkpoint_all")


# ------------------------------------------------------------------------------ helpers
def stages_of(f: Formulation, plan: Plan) -> tuple[set, set] | None:
    """(R entries, S entries) of a plan whose schedule is frontier-advancing, else None."""
    R_on: set[tuple[int, int]] = set()
    S_on: set[tuple[int, int]] = set()
    stage_start: dict[int, set[int]] = {}
    frontier = 0
    resident: set[int] = set()
    last_in_stage = -1
    for ins in plan.instructions:
        if ins.kind == "free":
            resident.discard(ins.target)
            continue
        c = ins.target
        t = frontier
        if t not in stage_start:
            stage_start[t] = set(resident)
            last_in_stage = -1
        if c == frontier:
            frontier += 1
        elif c < frontier and (t, c) in f.R and c > last_in_stage:
            R_on.add((t, c))
        else:
            return None
        last_in_stage = c
        resident.update(plan.graph.nodes[c].outputs)
    for t, res in stage_start.items():
        S_on.update((t, v) for v in res if (t, v) in f.S)
    return R_on, S_on


def _plan_from(graph: Graph, f: Formulation, R_on, **kw) -> Plan:
    forward, backward = schedule_from_R(f, R_on)
    return Plan.from_schedule(graph, forward, backward, **kw)


def warm_start_plans(graph: Graph, budget_bytes: int | None) -> list[Plan]:
    plans = []
    for name in WARM_START_SOLVERS:
        if name in SOLVERS:
            try:
                plans.append(SOLVERS[name](graph, budget_bytes))
            except SolverError:
                pass
    return plans


def keep_set_plans(graph: Graph, budget_bytes: int, time_limit: float | None) -> list[Plan]:
    """keep_set's plan at the budget, as one more warm start of the exact solvers (within a tenth of
    their time, at most ``KEEP_SET_WARM_SECONDS``): its plans are often optimal where the stage bound
    proves them so (ResNet-18's op graph at 80% and 70%), and CP-SAT started from a baseline did not
    find them in 60 s."""
    limit = min(KEEP_SET_WARM_SECONDS, (time_limit if time_limit is not None else DEFAULT_TIME_LIMIT) / 10)
    try:
        return [solve("keep_set", graph, budget_bytes, time_limit=limit)] if "keep_set" in SOLVERS else []
    except SolverError:
        return []


def smallest_first_plans(graph: Graph) -> list[Plan]:
    """The quick planners' smallest plans of ``graph`` (each asked at budget 0), smallest peak first, then
    the cheapest: where the exact solvers' smallest-peak searches start."""
    return sorted(warm_start_plans(graph, 0), key=lambda p: (p.peak_bytes, p.compute_seconds))


def proven_smallest(graph: Graph, plans) -> Plan | None:
    """The plan of smallest peak among ``plans`` when it peaks at :func:`~remat.simulate.fixed_order_lower_bound`
    (or below it): then no plan of the exact solvers' space (each backward node once, in the graph's
    order) peaks lower, and the smallest-peak search is over before it starts. Among plans of that peak,
    the cheapest; ``info["status"]`` says "optimal" and why. None when no plan reaches the bound.

    The quick planners reach it often: on seven of ten small zoo graphs (U-Net, ResNet and GPT-2
    among them) checkpoint_all's or Chen's greedy plan peaks at the bound, where the MILP spent its
    10 s proving nothing smaller exists, or stopped at its time limit without proving it."""
    best = min(plans, key=lambda p: (p.peak_bytes, p.compute_seconds), default=None)
    if best is None or best.peak_bytes > fixed_order_lower_bound(graph):
        return None
    best = copy.copy(best)
    best.info = {**best.info, "status": "optimal",
                 "proof": f"peaks at {best.peak_bytes} bytes, the lower bound of every plan in the graph's order"}
    return best


def within_save_budget(graph: Graph, plans, save_budget_bytes: int) -> list[Plan]:
    """The ``plans`` whose forward keeps at most ``save_budget_bytes`` for the backward (the save
    budget of :func:`~remat.solvers.checkmate_model.build` counts droppable values only)."""
    variable, _ = value_roles(graph)
    return [p for p in plans
            if sum(graph.values[v].bytes for v in p.saved_values if v in variable) <= save_budget_bytes]


def formulation_info(f: Formulation) -> dict:
    binaries = sum(f.integer)
    return {
        "variables": f.num_cols,
        "binaries": binaries,
        "constraints": f.num_rows,
        "nonzeros": f.num_nonzeros,
    }


def run_highs(h, time_limit: float | None, gap: float, threads: int | None):
    """Run HiGHS on ``h``: (model status, info, solution vector or None).

    The vector is checked against the objective HiGHS reports: highspy 1.16.0 can report the
    optimum's objective yet hand back the warm start's vector. When they disagree, the model is
    solved again without the warm start in the time left, and the better of the two vectors is
    returned (with the second run's status, so a plan is never called optimal on a mismatch)."""
    import highspy

    limit = float(time_limit if time_limit is not None else DEFAULT_TIME_LIMIT)
    h.setOptionValue("time_limit", limit)
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("mip_abs_gap", 1e-9)
    if threads:
        h.setOptionValue("threads", int(threads))
        # HiGHS sizes one global thread pool at its first run and refuses to run ("Not Set") when a
        # later model asks for another count: start the pool again at this one
        highspy.Highs.resetGlobalScheduler(True)
    start = time.perf_counter()
    h.run()
    status, info = h.getModelStatus(), h.getInfo()
    if not _has_solution(h):
        return status, info, None
    x = np.asarray(h.getSolution().col_value)
    if _objective_agrees(h, x, info.objective_function_value):
        return status, info, x
    h.clearSolver()  # drops the warm start and the inconsistent solution
    h.setOptionValue("time_limit", max(1.0, limit - (time.perf_counter() - start)))
    h.run()
    second_status, second_info = h.getModelStatus(), h.getInfo()
    if _has_solution(h):
        y = np.asarray(h.getSolution().col_value)
        if _objective_agrees(h, y, second_info.objective_function_value) or _objective(h, y) < _objective(h, x):
            return second_status, second_info, y
    if second_status == highspy.HighsModelStatus.kOptimal:  # the second run proved nothing about x
        second_status = highspy.HighsModelStatus.kInterrupt
    return second_status, second_info, x


def _objective(h, x) -> float:
    lp = h.getLp()
    return float(lp.offset_ + np.dot(np.asarray(lp.col_cost_), x))


def _objective_agrees(h, x, reported: float) -> bool:
    return abs(_objective(h, x) - reported) <= 1e-7 * max(1.0, abs(reported))


def _has_solution(h) -> bool:
    import highspy

    return h.getInfo().primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible


def known_smallest_peak(graph: Graph, key: str, time_limit: float) -> Plan | None:
    """The smallest-peak plan an exact solver made for ``graph`` before: proven optimal, or found
    with at least half of ``time_limit`` seconds (None: solve it, with the more time)."""
    known = graph.memo.get((key,))
    if known is None:
        return None
    plan, seconds = known
    return plan if plan.info.get("status") == "optimal" or 2 * seconds >= time_limit else None


def remember_smallest_peak(graph: Graph, key: str, plan: Plan, time_limit: float) -> None:
    graph.memo[(key,)] = (plan, time_limit)


def infeasible_below(graph: Graph, key: str, budget_bytes: int | None = None) -> int:
    """The largest budget an exact solver has proven infeasible on ``graph`` (-1: none); with
    ``budget_bytes``, record that it is."""
    known = graph.memo.get((key, "infeasible"), -1)
    if budget_bytes is not None and budget_bytes > known:
        graph.memo[(key, "infeasible")] = known = budget_bytes
    return known


# ------------------------------------------------------------------------------ the MILP
def solve_milp(
    graph: Graph,
    budget_bytes: int | None,
    *,
    time_limit: float | None = None,
    warm_start: bool = True,
    lp_warm_start: bool = True,
    gap: float = 1e-6,
    threads: int | None = None,
    save_budget_bytes: int | None = None,
    quiet: bool = False,
    warm_plans=(),
    baselines: bool = True,
) -> Plan:
    """The optimal (within ``gap``) frontier-advancing plan of ``graph`` under ``budget_bytes``;
    ``budget_bytes=None``: the plan of smallest peak. ``save_budget_bytes`` also bounds the bytes
    the forward keeps for the backward (see :func:`~remat.solvers.checkmate_model.build`); with it,
    an infeasible model raises :class:`SolverError` instead of looking for the smallest peak.
    ``quiet``: no warning at the time limit (the plan's ``info`` still says so). ``warm_plans``: more
    plans of ``graph`` to warm-start from (the cheapest that fits both budgets is used); ``baselines=False``:
    only those (a caller solving many budgets passes the baselines' plans once). The smallest peak is
    returned unsearched where a quick plan peaks at the lower bound (:func:`proven_smallest`), unless
    ``warm_start=False`` (no quick plans: the MILP's own search)."""
    import highspy

    start = time.perf_counter()
    if (budget_bytes is not None and save_budget_bytes is None
            and (budget_bytes < fixed_order_lower_bound(graph) or budget_bytes <= infeasible_below(graph, "checkmate"))):
        return _smallest_peak(graph, budget_bytes, time_limit, start, gap, threads)  # infeasible: no model to build
    if budget_bytes is None and warm_start:  # smallest peak: the baseline plans of smallest peak first
        smallest_first = smallest_first_plans(graph)
        proven = proven_smallest(graph, smallest_first)
        if proven is not None:  # one of them peaks at the lower bound: nothing to search
            return proven
    if save_budget_bytes is None:
        f = build(graph, budget_bytes)
    else:  # a block menu's row: one peak bound, many save budgets; the model is built once per bound
        f = with_save_budget(graph.memo.cached(("checkmate with a save budget", budget_bytes),
                                               lambda: build(graph, budget_bytes, save_budget_bytes=save_budget_bytes)),
                             save_budget_bytes)
    h = to_highs(f)
    info = {"formulation": formulation_info(f)}
    found = None  # the stage bound, where the MILP takes it
    if budget_bytes is not None and save_budget_bytes is None and f.R:
        found = _bound_below(h, f, graph, budget_bytes, time_limit, info)
    warm = None
    if warm_start:
        if budget_bytes is None:  # smallest peak: start from the baseline plan of smallest peak
            candidates = smallest_first
        else:
            plans = (warm_start_plans(graph, budget_bytes) if baselines else []) + list(warm_plans)
            if save_budget_bytes is not None:
                plans = within_save_budget(graph, plans, save_budget_bytes)
            elif baselines:
                plans += keep_set_plans(graph, budget_bytes, time_limit)
                if found is not None and (guided := guided_plan(graph, budget_bytes, found)) is not None:
                    plans.append(guided)  # the plan of the stage bound's solution
            if lp_warm_start and save_budget_bytes is None:  # LP rounding often lands far closer to the optimum than any baseline
                try:
                    plans.append(
                        solve_lp_rounding(graph, budget_bytes, time_limit=time_limit, budget_factors=(0.9, 1.0), fallback=False)
                    )
                except SolverError:
                    pass
            fitting = [p for p in plans if p.peak_bytes <= budget_bytes]
            candidates = sorted(fitting, key=lambda p: p.compute_seconds)
        for p in candidates:
            stages = stages_of(f, p)
            if stages is None:
                continue
            x = solution_vector(f, *stages)
            if set_start(h, x):
                warm = p
                info["warm start"] = f"{p.solver} ({p.overhead * 100:+.1f}%)"
                info["warm start compute seconds"] = p.compute_seconds
                break
    limit = time_limit if time_limit is not None else DEFAULT_TIME_LIMIT
    status, hinfo, x = run_highs(h, max(min(1.0, limit), limit - (time.perf_counter() - start)), gap, threads)
    info["setup seconds"] = round(time.perf_counter() - start - h.getRunTime(), 3)
    info["solve seconds"] = round(h.getRunTime(), 3)
    status_name = h.modelStatusToString(status)
    if x is None:
        if status == highspy.HighsModelStatus.kInfeasible and save_budget_bytes is not None:
            raise SolverError(f"no plan of {graph.name!r} peaks within {budget_bytes} bytes and saves at most {save_budget_bytes}")
        if status == highspy.HighsModelStatus.kInfeasible and budget_bytes is not None:
            infeasible_below(graph, "checkmate", budget_bytes)  # and so is every smaller budget
            return _smallest_peak(graph, budget_bytes, time_limit, start, gap, threads)
        if warm is not None:  # cannot happen (HiGHS keeps the warm start), but never return nothing
            return warm
        raise SolverError(
            f"checkmate found no plan for {graph.name!r} within {time_limit or DEFAULT_TIME_LIMIT:.0f} s "
            f"(HiGHS: {status_name}); raise time_limit, or use solver='checkmate_lp' or a coarser graph"
        )
    R_on, _ = decode(f, x)
    minimising_cost = budget_bytes is not None  # else the objective is the peak
    optimal = status == highspy.HighsModelStatus.kOptimal
    info.update(
        status="optimal" if optimal else status_name,
        gap=float(hinfo.mip_gap) if math.isfinite(hinfo.mip_gap) else None,
        bound_seconds=hinfo.mip_dual_bound * f.cost_scale + f.constant_cost if minimising_cost else None,
        objective_seconds=hinfo.objective_function_value * f.cost_scale + f.constant_cost if minimising_cost else None,
    )
    floor = info.get("stage bound seconds")
    if minimising_cost and not optimal and floor is not None and 0 < floor < math.inf:
        # the stage bound holds whatever HiGHS proved: a plan that meets it is optimal (the gap HiGHS
        # reports before its root LP is solved with the bound's row can even exceed 100%)
        recomputation = _objective(h, x) * f.cost_scale  # (the columns' costs are the recomputations')
        info["gap"] = min(info["gap"] if info["gap"] is not None else 1.0, max(0.0, 1 - floor / recomputation))
        if recomputation <= floor * (1 + 1e-6):
            optimal = True
            info.update(status="optimal", gap=0.0, proven_by="the stage bound")
    plan = _plan_from(graph, f, R_on, solver="checkmate", info=info)
    return finish_exact(plan, budget_bytes, optimal=optimal, quiet=quiet, limit=time_limit or DEFAULT_TIME_LIMIT,
                        gap=info["gap"], detail=f" (HiGHS: {status_name})")


def _bound_below(h, f: Formulation, graph: Graph, budget_bytes: int, time_limit, info: dict) -> StageBound:
    """Add the row "recomputation ≥ the stage bound" (:mod:`remat.solvers.stage_bound`), and return
    that bound: the MILP's own LP bound is weak on graphs of 100 ops and more; with the row, a plan
    that meets the stage bound is proven optimal as soon as HiGHS finds it."""
    import highspy

    limit = time_for_bound(time_limit if time_limit is not None else DEFAULT_TIME_LIMIT)
    found = stage_bound(graph, budget_bytes, time_limit=limit)
    floor = found.cost
    info["stage bound seconds"] = floor
    if 0 < floor < math.inf:
        columns = np.fromiter(f.R.values(), dtype=np.int32, count=len(f.R))
        costs = np.asarray(f.col_cost, dtype=np.float64)[columns]
        # (1e-6 below: the stage MILPs' tolerances must never cut the optimum off)
        h.addRow(floor / f.cost_scale * (1 - 1e-6), highspy.kHighsInf, len(columns), columns, costs)
    return found


def finish_exact(plan: Plan, budget_bytes: int | None, *, optimal: bool, quiet: bool, limit: float, gap, detail="") -> Plan:
    """An exact solver's last word on its decoded plan: a :class:`SolverTimeLimitWarning` when it is
    not proven optimal (unless ``quiet``), and an internal error when it peaks over the budget (the
    models are conservative: that would be a bug)."""
    if not optimal and not quiet:
        warnings.warn(
            f"{plan.solver} stopped at its time limit ({limit:.0f} s) on {plan.graph.name!r}: "
            f"returning its best plan, within {100 * (gap or 0):.2f}% of optimal{detail}",
            SolverTimeLimitWarning,
            stacklevel=4,
        )
    if budget_bytes is not None and plan.peak_bytes > budget_bytes:
        raise SolverError(
            f"internal error: {plan.solver}'s plan peaks at {plan.peak_bytes} bytes over its budget {budget_bytes}"
        )
    return plan


def _smallest_peak(graph, budget_bytes, time_limit, start, gap, threads) -> Plan:
    """No plan fits: return the plan of smallest peak (over budget) so the caller can name it. Solved
    once per graph (the graph's memo; graphs of one step share it), not once per infeasible budget:
    a sweep's budgets below the minimum reuse it. A plan not proven optimal is solved again only
    for a call with more than twice the time it had. On a branchy graph the bound of this MILP is
    weak: on the tiny U-Net it never improved on checkpoint_all's peak in 5, 15 or 60 s.

    Asked for the minimum (``budget_bytes`` 0: ``budget="min"``, a solver's own minimum) it gets a third
    of the caller's time, at least ``SMALLEST_PEAK_SECONDS``; to name the minimum in an infeasible
    budget's error, at most ``INFEASIBLE_PEAK_SECONDS``: on eight zoo graphs (``cnn_bn``, ``vgg11``, ``mlp``,
    ``unet``, ``densenet``, ``gpt2``, ``resnet``, ``t5``) it found no smaller peak in 10 s than in 3 s, nor
    than the quick planners' and the plans already made, and proved the two optima it proved within 3.7 s."""
    given = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    # the same cap for every call of one planning run, so that the first call's answer serves them all
    cap = max(SMALLEST_PEAK_SECONDS, given / 3) if not budget_bytes else INFEASIBLE_PEAK_SECONDS
    left = min(max(1.0, given - (time.perf_counter() - start)), cap)
    known = known_smallest_peak(graph, "checkmate_smallest_peak", left)
    if known is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SolverTimeLimitWarning)
            known = solve_milp(graph, None, time_limit=left, gap=1e-4, threads=threads)
        remember_smallest_peak(graph, "checkmate_smallest_peak", known, left)
    plan = copy.copy(known)
    plan.info = {**known.info, "status": f"infeasible at {budget_bytes} bytes; smallest peak shown"}
    return plan


@register("checkmate")
def checkmate(
    graph: Graph,
    budget_bytes: int | None,
    *,
    time_limit: float | None = None,
    coarsen="auto",
    warm_start: bool = True,
    gap: float = 1e-6,
    threads: int | None = None,
    warm_plans=(),
    **options,
) -> Plan:
    """``warm_plans``: plans of ``graph`` to start from too (used when ``graph`` is planned uncoarsened)."""
    if budget_bytes is None:
        return SOLVERS["store_all"](graph, None)  # nothing to trade: store everything
    from .coarsen import planned_on_coarse_graph

    return planned_on_coarse_graph(
        graph,
        coarsen,
        lambda g: solve_milp(g, budget_bytes, time_limit=time_limit, warm_start=warm_start, gap=gap, threads=threads,
                             warm_plans=warm_plans if g is graph else ()),
        solver="checkmate",
    )


# ------------------------------------------------------------------------------ LP + rounding
def two_phase_rounding(f: Formulation, S_star: dict, threshold: float) -> set[tuple[int, int]] | None:
    """The minimal R that makes ``S = [S* > threshold]`` valid (None if it needs a forbidden R)."""
    graph = f.graph
    values, nodes = graph.values, graph.nodes
    S_on = {key for key, val in S_star.items() if val > threshold}
    R_on: set[tuple[int, int]] = set()

    def require(t: int, i: int) -> bool:
        if i == t or (t, i) in R_on:
            return True
        if (t, i) not in f.R:
            return False
        R_on.add((t, i))
        return True

    # phase 1: a value kept into stage t is kept into, or computed in, stage t-1
    for t, v in S_on:
        p = values[v].producer
        if t - 1 != p and (t - 1, v) not in S_on and not require(t - 1, p):
            return None
    # phase 2: within each stage, in reverse order, compute the producers of missing inputs
    for t in range(len(f.positions)):
        for j in range(t, -1, -1):
            if j != t and (t, j) not in R_on:
                continue
            for v in nodes[j].inputs:
                if (t, v) in f.S and (t, v) not in S_on:
                    if not require(t, values[v].producer):
                        return None
    return R_on


def solve_lp_rounding(
    graph: Graph,
    budget_bytes: int,
    *,
    time_limit: float | None = None,
    thresholds=tuple(np.round(np.arange(0.1, 0.91, 0.1), 2)),
    budget_factors=(0.9, 0.8, 0.7, 1.0),
    fallback: bool = True,
) -> Plan:
    start = time.perf_counter()
    best: Plan | None = None
    smallest: Plan | None = None
    tried = 0
    info: dict = {}
    for factor in budget_factors:
        f = build(graph, int(budget_bytes * factor))
        h = to_highs(f, relax=True)
        left = None if time_limit is None else max(1.0, time_limit - (time.perf_counter() - start))
        status, _, x = run_highs(h, left, 1e-6, None)
        info = {"formulation": formulation_info(f), "lp budget factor": factor, "lp status": h.modelStatusToString(status)}
        if x is None:
            continue
        S_star = {key: x[col] for key, col in f.S.items()}
        seen = set()
        for threshold in thresholds:
            R_on = two_phase_rounding(f, S_star, float(threshold))
            if R_on is None or frozenset(R_on) in seen:
                continue
            seen.add(frozenset(R_on))
            tried += 1
            plan = _plan_from(graph, f, R_on, solver="checkmate_lp")
            plan.info.update(info, threshold=float(threshold))
            if smallest is None or plan.peak_bytes < smallest.peak_bytes:
                smallest = plan
            if plan.peak_bytes <= budget_bytes and (best is None or plan.compute_seconds < best.compute_seconds):
                best = plan
        if best is not None:
            break
    if best is not None:
        best.info["roundings tried"] = tried
        return best
    if smallest is None and not fallback:
        raise SolverError(f"checkmate_lp: the LP relaxation is infeasible at {budget_bytes} bytes")
    if smallest is None:  # even the relaxation is infeasible: the budget is below every plan's peak
        plan = _smallest_peak(graph, budget_bytes, time_limit, start, 1e-4, None)
        plan.solver = "checkmate_lp"
        return plan
    smallest.info["status"] = "no rounding fits the budget; the smallest peak found is shown"
    return smallest


@register("checkmate_lp")
def checkmate_lp(graph: Graph, budget_bytes: int | None, *, time_limit: float | None = None, coarsen="auto", **options) -> Plan:
    if budget_bytes is None:
        return SOLVERS["store_all"](graph, None)
    from .coarsen import planned_on_coarse_graph

    return planned_on_coarse_graph(
        graph, coarsen, lambda g: solve_lp_rounding(g, budget_bytes, time_limit=time_limit, **options), solver="checkmate_lp"
    )

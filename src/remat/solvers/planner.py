"""From a Graph and a budget to a Plan: budget resolution, solver choice, clear failures.

``solver="auto"`` returns store_all's plan when it fits, or else the same computes reordered
(:mod:`remat.solvers.reorder`) when that plan fits: nothing recomputed either. Otherwise, on a graph of at most
``AUTO_MILP_NODES`` ops it runs CP-SAT (:mod:`remat.solvers.cpsat`) with half its time
(``AUTO_TIME_LIMIT`` seconds unless ``time_limit`` says otherwise) and, unless CP-SAT proved its
plan optimal, the Checkmate MILP with the rest, warm-started from CP-SAT's plan and the baselines
(so never worse than them), adding the hierarchical planner when neither proved an optimum
or both missed the budget; a larger
graph goes to the hierarchical planner, which itself hands graphs without block structure to the
exact solvers (there CP-SAT's plan, where it fits, is kept without the MILP). Wherever the hierarchical planner runs, so does ``keep_set`` (milliseconds per save budget;
on a large graph in a thread beside the hierarchical planner, both being mostly HiGHS, which runs
without Python's lock):
the exact cheapest plans that keep one set of values across the whole graph, which the
hierarchical DP, choosing per block, can miss (ResNet-18 under Inductor: 59.6 ms predicted where the
DP found 61.6, at the same peak). Each fitting plan not proven optimal loses the recomputations the
budget does not need (:mod:`remat.solvers.recompute_less`: the hierarchical planner's T5 at 70%
of its peak, +17.5% of the step -> +15.4%). It keeps the plan with the least predicted compute among those
within the budget (ties: the smaller peak); solvers that do not apply to the graph
(``SolverError``) are skipped.

When none of those meets the budget, ``auto`` learns the smallest budget each of the fast
solvers (``FAST_SOLVERS``) meets, by solving at budget 0, where a solver returns its plan of
smallest peak (``budget="min"``: ``keep_set``'s too). Below the smallest of all of them (the MILP's included: when it misses a budget
it returns its smallest-peak plan), it raises :class:`~remat.errors.InfeasibleBudgetError`
naming that minimum, in bytes and as a fraction; otherwise it falls back to the cheapest plan
within the budget among the fast solvers' plans at the budget and the smallest-peak plans. So
a budget equal to the minimum it names always plans, and so does ``budget="min"``.

On a graph with transfer costs (``graph.meta["transfer"]``), ``auto`` also runs the ``hybrid``
solver (recomputation and swapping, :mod:`remat.solvers.hybrid`), starting from the recomputation
plan it chose (:func:`recomputation_plan`), and takes its plan when recomputation alone misses the
budget or when it predicts a shorter step (compute + stalls); the minimum it names then includes
the hybrid's smallest plan.

Under ``auto`` (and a quick named solver), a budget below a lower bound of every plan's peak is
refused at once, without running the solvers that search (the MILP would prove the same in
minutes on a branchy graph). The bound (:func:`_lower_bound`) is one operator's working set with what
must stay beside it: the gradients and outputs every plan ends with
(:func:`remat.simulate.peak_lower_bound`), and, since no plan recomputes a backward operator, the
backward values every order of the backward must hold across it
(:func:`remat.simulate.dependency_lower_bound`: within 0.4% of the smallest peak on the zoo's CNN with
BatchNorm and VGG-11). The error names that bound and, as the budget to raise to, the
smallest peak of the quick planners (``QUICK_MINIMUM_SOLVERS``) and of the plans ``auto`` already
knows for the graph (a named solver: its own smallest plan), and says that ``budget="min"`` finds
the exact minimum. A named searching solver keeps its own path (the MILP skips its model below the
bound and returns its smallest-peak plan, solved once per graph).

A named solver that misses a budget likewise falls back to its own smallest-peak plan when that
fits, and otherwise raises with its own minimum (and the lower one ``auto`` reaches, if any).

What it learns is kept in the graph's own memo (:attr:`remat.graph.Graph.memo`, gone with the
graph): the plans made (key: budget, solver, options), each solver's smallest-peak plan seen so far,
and which of those are the solver's proven minimum.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import time
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor

from ..budget import bytes_to_fraction, fixed_bytes, is_min, resolve_budget
from ..errors import InfeasibleBudgetError, InvalidPlanError, SolverError, format_bytes
from ..graph import Graph, forget_memos
from ..plan import Plan
from ..simulate import dependency_lower_bound, has_transfer_costs, peak_lower_bound
from .recompute_less import recompute_less
from .registry import SOLVERS, solve, time_budget, time_left

AUTO_TIME_LIMIT = 30.0
AUTO_KEEP_SET_SECONDS = 10.0  # auto's time for keep_set (milliseconds per save budget on most graphs)
AUTO_REORDER_SECONDS = 2.0  # auto's time for reordering store_all's computes (milliseconds on most graphs)
AUTO_RECOMPUTE_LESS_SECONDS = 2.0  # auto's time per fitting plan for recompute_less
AUTO_THIN_ALL_NODES = 1000  # on larger graphs auto thins only its cheapest fitting plan (see _thinned)
AUTO_MILP_NODES = 100  # the op-level MILP usually proves optimality on graphs this small
FAST_SOLVERS = ("checkpoint_all", "chen_sqrt", "chen_greedy", "rotor", "hierarchical")  # auto's fallbacks
# solvers whose plan at a budget they cannot meet is already their smallest-peak plan (the MILP
# then minimises the peak): their minimum is learnt from that plan, not from a second solve
MINIMUM_WHEN_INFEASIBLE = ("checkmate", "checkmate_lp", "cpsat")
SWAPPING_SOLVERS = ("hybrid", "checkmate_swap")  # the solvers that read the transfer costs
# remat's solvers whose plans never offload (a solver registered by a user may: it is not assumed to)
RECOMPUTATION_SOLVERS = ("store_all", "checkpoint_all", "chen_sqrt", "chen_sqrt_ap", "chen_greedy", "chen_greedy_ap",
                         "revolve", "rotor", "hierarchical", "checkmate", "checkmate_lp", "cpsat", "keep_set", "reorder")
# the budget to raise to when a budget is below the lower bound: these solvers' smallest plans (each
# a sweep or a DP, no search), with the smallest-peak plans already known for the graph
# (rotor is left out: its DP at budget 0 took 11 s on the zoo's MobileNet)
QUICK_MINIMUM_SOLVERS = ("checkpoint_all", "chen_sqrt", "chen_greedy")


def _options_key(options: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in options.items()))


def _plan_key(budget_bytes, solver, options) -> tuple:
    return ("plan", budget_bytes, solver, _options_key(options))


def _smallest_key(solver: str, options: dict) -> tuple:
    return ("smallest", solver, _options_key(options))


def _minimum_known(graph: Graph) -> set:
    """The ``_smallest_key``s of ``graph`` whose plan is the solver's own minimum."""
    return graph.memo.cached(("minimum known",), set)


def clear_caches() -> None:
    """Forget every plan made and every minimum learnt for the graphs alive (the chain planners' too)."""
    forget_memos()


def uses_swaps(graph: Graph) -> bool:
    """Whether ``auto`` also considers swapping (the ``hybrid`` solver): the graph has transfer costs."""
    return has_transfer_costs(graph)


def recomputation_twin(graph: Graph) -> Graph:
    """``graph`` without its offload tier's costs (``graph`` itself where it has none). What the
    recomputation solvers plan does not depend on those costs, so ``auto`` plans them on this twin:
    the twin's memo is that of every graph with its planning key, so the work is shared with the same
    step planned without the offload tier (``remat.compile`` plans a step both ways, and the second
    way used to solve the recomputation solvers' part again: a 2-layer GPT-2 at 0.4 spent 15 s more
    in CP-SAT for the same plan) and between the calls of one planning run. ``graph``'s memo holds the
    twin, so the twin's memo lives as long as ``graph``'s."""
    if "transfer" not in graph.meta:
        return graph
    return graph.memo.cached(("recomputation twin",), lambda: dataclasses.replace(
        graph, meta={k: v for k, v in graph.meta.items() if k != "transfer"}))


def on_graph(plan: Plan | None, graph: Graph) -> Plan | None:
    """A plan of :func:`recomputation_twin` as a plan of ``graph``: the same instructions and the same
    simulation (a plan without offloads is simulated alike with or without the transfer costs)."""
    if plan is None or plan.graph is graph:
        return plan
    if plan.offloaded_values:
        raise SolverError(f"a plan of {plan.graph.name!r} that offloads cannot move to another graph")
    plan = copy.copy(plan)
    plan.graph = graph
    return plan


def auto_candidates(graph: Graph) -> list[str]:
    """The solvers ``auto`` runs first on ``graph`` (see the module docstring)."""
    return ["checkmate"] if len(graph.nodes) <= AUTO_MILP_NODES else ["hierarchical"]


def auto_solvers(graph: Graph) -> list[str]:
    """Every solver ``auto`` may use on ``graph``: its first choices, then the fast ones."""
    names = auto_candidates(graph) + (["cpsat", "hierarchical"] if auto_candidates(graph) == ["checkmate"] else [])
    # keep_set: auto runs it at a budget wherever the hierarchical planner runs, and its smallest plan can be
    # far below the others' (cnn_bn split into 16 chunks: 5.31 MiB, where hierarchical's and the hybrid's
    # reach 8.76), so auto's smallest plan counts it on every graph
    return names + ["keep_set"] + [n for n in FAST_SOLVERS if n not in names]


# ------------------------------------------------------------------------- solving, remembering
def _remember(graph: Graph, name: str, options: dict, plan: Plan) -> None:
    key = _smallest_key(name, options)
    old = graph.memo.get(key)
    if old is None or (plan.peak_bytes, plan.step_seconds) < (old.peak_bytes, old.step_seconds):
        graph.memo[key] = plan


def _run(name: str, graph: Graph, budget_bytes, time_limit, options: dict, skip_inapplicable: bool,
         extra: dict | None = None) -> Plan | None:
    """``solve``, remembering the plan's peak; None for a solver that does not apply (when skipped).
    ``extra``: more arguments for the solver that are not the user's options (no memo key holds them)."""
    try:
        plan = solve(name, graph, budget_bytes, time_limit=time_limit, **options, **(extra or {}))
    except SolverError:
        if skip_inapplicable:
            return None
        raise
    _remember(graph, name, options, plan)
    own_minimum = name in MINIMUM_WHEN_INFEASIBLE and (extra or {}).get("grow_copies", True)
    if budget_bytes is not None and plan.peak_bytes > budget_bytes and own_minimum:
        _minimum_known(graph).add(_smallest_key(name, options))
    return plan


def store_all_plan(graph: Graph) -> Plan:
    """The store-everything plan of ``graph`` (cached)."""
    return _solved_once(graph, "store_all")


def reordered_store_all_plan(graph: Graph) -> Plan:
    """Every node once, in the order of lowest peak :mod:`remat.solvers.reorder` finds (cached)."""
    return _solved_once(graph, "reorder", AUTO_REORDER_SECONDS)


def _solved_once(graph: Graph, name: str, time_limit: float | None = None) -> Plan:
    """``name``'s plan of ``graph`` without a budget, solved once and kept as its known minimum
    (solved on :func:`recomputation_twin`: ``store_all`` and ``reorder`` read no transfer costs)."""
    key = _smallest_key(name, {})
    if key not in _minimum_known(graph):
        twin = recomputation_twin(graph)
        graph.memo[key] = (solve(name, graph, None, time_limit=time_limit) if twin is graph
                           else on_graph(_solved_once(twin, name, time_limit), graph))
        _minimum_known(graph).add(key)
    return graph.memo[key]


def solver_minimum(graph: Graph, name: str, *, time_limit: float | None = None, **options) -> Plan | None:
    """The plan of smallest peak ``name`` makes on ``graph`` (solved at budget 0 once, then
    cached; a smaller one seen at another budget wins); None when the solver does not apply. A solver
    that does not swap is solved on :func:`recomputation_twin` and what it learns copied back."""
    if name == "store_all":
        return store_all_plan(graph)
    key = _smallest_key(name, options)
    twin = recomputation_twin(graph)
    if key not in _minimum_known(graph) and twin is not graph and name not in SWAPPING_SOLVERS:
        solver_minimum(twin, name, time_limit=time_limit, **options)
        _learn_minima(graph, twin)
    if key not in _minimum_known(graph):
        _run(name, graph, 0, time_limit, options, skip_inapplicable=True)
        _minimum_known(graph).add(key)
    return graph.memo.get(key)


def smallest_plan(graph: Graph, solver: str = "auto", *, time_limit: float | None = None, thorough: bool = True,
                  swaps: bool = True, **options) -> Plan:
    """The plan of smallest peak among those ``solver`` may return (``auto``: among every solver
    it may use, ``hybrid`` included when the graph has transfer costs and ``swaps``).
    ``thorough=False`` does not run the MILP for its minimum; it counts the MILP's plans seen so far."""
    if solver != "auto":
        plan = solver_minimum(graph, solver, time_limit=time_limit, **options)
        if plan is None:
            raise SolverError(f"solver {solver!r} does not apply to {graph.name!r}")
        return plan
    if time_limit is None:
        time_limit = AUTO_TIME_LIMIT
    plans = [store_all_plan(graph), reordered_store_all_plan(graph)]
    quick = _smallest_of(plans + _minimum_plans(graph, QUICK_MINIMUM_SOLVERS))
    if quick.peak_bytes <= dependency_lower_bound(graph):  # proven the smallest: no plan goes below the bound
        return quick
    first = auto_candidates(graph) + ["hierarchical"]
    for name in auto_solvers(graph):
        opts = options if name in first else {}
        if (thorough and name != "cpsat") or name in FAST_SOLVERS:  # the MILP finds the same minimum
            limit = min(time_limit, AUTO_KEEP_SET_SECONDS) if name == "keep_set" else time_limit
            plans.append(solver_minimum(graph, name, time_limit=limit, **opts))
        else:  # the MILP's smallest plan seen (its minimum when it missed a budget)
            plans.append(graph.memo.get(_smallest_key(name, opts)))
    if swaps and uses_swaps(graph):
        plans.append(solver_minimum(graph, "hybrid", time_limit=time_limit))
    return _smallest_of(plans)


def resolve(graph: Graph, budget, solver: str = "auto", *, time_limit: float | None = None, **options) -> int | None:
    """``budget`` (any form :mod:`remat.budget` accepts, ``"min"`` included) in bytes for ``graph``."""
    return resolve_budget(
        budget, store_all_plan(graph).peak_bytes, fixed_bytes(graph),
        smallest=lambda: smallest_plan(graph, solver, time_limit=time_limit, **options).peak_bytes,
    )


def given_plan(graph: Graph, plan, budget=None) -> Plan:
    """The plan a user passed (a :class:`Plan`, or the path of one saved with :meth:`Plan.save`),
    checked over the live ``graph`` before anything runs: made for this graph (else
    :class:`~remat.plan.PlanGraphMismatchError`), valid on it (re-simulated), and, when ``budget``
    is given, peaking within it on this graph (else :class:`InvalidPlanError` naming both)."""
    source = "the plan passed as plan="
    if not isinstance(plan, Plan):
        source = f"the plan file {plan}"
        plan = Plan.load(plan)
    plan = copy.copy(plan.for_graph(graph, source=source))
    plan.info = {**plan.info, "given": True}
    budget_bytes = resolve(graph, budget) if budget is not None and not is_min(budget) else None
    if budget_bytes is not None and plan.peak_bytes > budget_bytes:
        raise InvalidPlanError(
            f"{source} peaks at {format_bytes(plan.peak_bytes)} ({plan.peak_bytes} bytes) on this graph, above the "
            f"budget of {format_bytes(budget_bytes)} ({budget_bytes} bytes): leave the budget out to run it as "
            "it is, raise the budget to its peak, or leave plan= out to plan for this budget")
    return plan


def _smallest_of(plans: list) -> Plan:
    """The plan of smallest peak (ties: the shorter step) among ``plans`` (None entries skipped)."""
    return min((p for p in plans if p is not None), key=lambda p: (p.peak_bytes, p.step_seconds))


def _fits(plan: Plan | None, budget_bytes) -> bool:
    return plan is not None and (budget_bytes is None or plan.peak_bytes <= budget_bytes)


def _cheapest(plans: list[Plan]) -> Plan:
    return min(plans, key=lambda p: (p.compute_seconds, p.peak_bytes))


def _for_budget(plan: Plan, budget_bytes, **info) -> Plan:
    """A copy of ``plan`` carrying ``budget_bytes`` (plans are shared by the caches)."""
    plan = copy.copy(plan)
    plan.budget_bytes = budget_bytes
    plan.info = {**plan.info, **info}
    return plan


# ------------------------------------------------------------------------- the planner
def make_plan(graph: Graph, budget=None, solver: str = "auto", *, time_limit: float | None = None, **options) -> Plan:
    """The plan ``solver`` makes for ``graph`` under ``budget`` (see :mod:`remat.budget`).

    ``time_limit`` (seconds) bounds the whole call, every solve it runs together (``auto`` runs
    several: the recomputation solvers, the hybrid, the searches for the minimum): each gets at most
    what is left (:func:`~remat.solvers.time_budget`), and one stopped there returns its best plan.
    ``None``: each solve its own default (``AUTO_TIME_LIMIT`` for each of ``auto``'s)."""
    with _collector_paused(), time_budget(time_limit):
        return _make_plan(graph, budget, solver, time_limit, options)


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while planning (as it was before, after). Planning makes
    millions of small objects and no cyclic garbage (0 objects to collect after ``auto`` on a 64-layer
    Llama), but each collection walks the whole heap, the captured model's included: 2.3 of 11.4 s there."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _make_plan(graph: Graph, budget, solver: str, time_limit: float | None, options: dict) -> Plan:
    start = time.perf_counter()
    if solver != "auto" and solver not in SOLVERS:
        raise SolverError(f"unknown solver {solver!r}; choose 'auto' or one of {', '.join(sorted(SOLVERS))}")
    budget_bytes = resolve(graph, budget, solver, time_limit=time_limit, **options)
    key = _plan_key(budget_bytes, solver, options)
    if key in graph.memo:
        return graph.memo[key]
    fraction = budget if isinstance(budget, float) else None
    if budget_bytes is not None and (solver == "auto" or solver in QUICK_MINIMUM_SOLVERS):
        bound = _lower_bound(graph, budget_bytes, solver)
        if budget_bytes < bound:
            raise _below_lower_bound(graph, budget_bytes, solver, fraction, bound)
    if solver == "auto":
        plan = _auto(graph, budget_bytes, AUTO_TIME_LIMIT if time_limit is None else time_limit, options, fraction)
        plan.solve_seconds = time.perf_counter() - start
    else:
        plan = _named(graph, budget_bytes, solver, time_limit, options, fraction)
    graph.memo[key] = plan
    return plan


def _auto(graph: Graph, budget_bytes, time_limit, options, fraction, swaps: bool = True) -> Plan:
    store_all = store_all_plan(graph)
    if _fits(store_all, budget_bytes):  # nothing is cheaper than computing everything once
        return _for_budget(store_all, budget_bytes, **{"chosen by": "auto among store_all"})
    reordered = reordered_store_all_plan(graph)
    if _fits(reordered, budget_bytes):  # the same work in another order: nothing recomputed either
        return _for_budget(reordered, budget_bytes, **{"chosen by": "auto among store_all, reorder"})
    if not (swaps and uses_swaps(graph)):
        best, names = _recomputation_choice(graph, budget_bytes, time_limit, options, fraction, swaps)
        return _for_budget(best, budget_bytes, **{"chosen by": f"auto among {', '.join(names)}"})
    try:
        best, names = _recomputation_choice(graph, budget_bytes, time_limit, options, fraction, False)
    except InfeasibleBudgetError:  # recomputation alone cannot reach the budget
        best, names = None, []
    graph.memo[("recompute",) + _plan_key(budget_bytes, "auto", options)] = best
    names = names + ["hybrid"]
    hybrid = _run("hybrid", graph, budget_bytes, time_limit, {}, True)
    if not _fits(hybrid, budget_bytes):  # the greedy at this budget missed: its smallest plan may fit
        hybrid = solver_minimum(graph, "hybrid", time_limit=time_limit)
    if _fits(hybrid, budget_bytes) and (best is None or hybrid.step_seconds < best.step_seconds):
        best = hybrid
    if best is None:
        smallest = smallest_plan(graph, "auto", time_limit=time_limit, thorough=False, **options)
        raise _infeasible(graph, budget_bytes, smallest, "auto", fraction, options)
    return _for_budget(best, budget_bytes, **{"chosen by": f"auto among {', '.join(names)}"})


def exact_plan(graph: Graph, budget_bytes, time_limit, options=None) -> Plan | None:
    """The cheapest fitting plan of :func:`_exact`'s (else its smallest peak): the exact planners'
    answer for ``graph``, which the hierarchical planner gives a graph without block structure. Once
    per budget and options (memoised, like a plan): the hybrid solver asks the hierarchical planner
    again at the budget ``auto`` asked it, and the exact planners use their whole time limit there."""
    def solved():
        _, plans = _exact(graph, budget_bytes, time_limit, options or {})
        plans = [p for p in plans if p is not None]
        fitting = [p for p in plans if _fits(p, budget_bytes)]
        return _cheapest(fitting) if fitting else (_smallest_of(plans) if plans else None)

    return graph.memo.cached(("exact",) + _plan_key(budget_bytes, "exact", options or {}), solved)


def _exact(graph: Graph, budget_bytes, time_limit, options) -> tuple[list[str], list[Plan | None]]:
    """The exact solvers on a small graph: CP-SAT with half the time (it proves many optima in
    seconds that take HiGHS minutes, and where neither proves one its plans are as good or better),
    then the MILP warm-started from CP-SAT's plan with the rest, unless CP-SAT's plan fits and is proven
    optimal, or the graph has more than ``AUTO_MILP_NODES`` nodes: there the MILP proved nothing within
    a minute on the graphs measured (``benchmarks/solvers.md``) and, warm-started, found no better plan
    (the tiny U-Net's 152-node coarse graph: CP-SAT at its limit 1.5-2.5% of the step above its bound,
    then HiGHS 15 s more for the same plan). Where CP-SAT finds no plan the MILP still runs: it proves
    infeasibility and finds the smallest peak."""
    time_limit = AUTO_TIME_LIMIT if time_limit is None else time_limit
    start = time.perf_counter()
    if _fits(store_all_plan(graph), budget_bytes):  # nothing is cheaper than computing everything once
        return ["store_all"], [store_all_plan(graph)]
    # CP-SAT with its default copies only: it is slow to prove a budget infeasible, the MILP is not
    first = _run("cpsat", graph, budget_bytes, time_limit / 2, options, True, {"grow_copies": False})
    if _fits(first, budget_bytes) and (first.info.get("status") == "optimal"  # (or within a negligible 0.1% of the step)
                                        or len(graph.nodes) > AUTO_MILP_NODES):
        return ["cpsat"], [first]
    left = max(1.0, time_limit - (time.perf_counter() - start))
    warm = {"warm_plans": [first]} if _fits(first, budget_bytes) else {}
    return ["cpsat", "checkmate"], [first, _run("checkmate", graph, budget_bytes, left, options, True, warm)]


def _recomputation_choice(graph: Graph, budget_bytes, time_limit, options, fraction, swaps: bool):
    """:func:`_auto_recompute` on :func:`recomputation_twin`, once per budget and options (memoised
    there, like a plan: the time limit is not part of the key), as a plan of ``graph``."""
    twin = recomputation_twin(graph)  # (``swaps`` is True only for a graph without transfer costs: its own twin)
    key = ("auto recompute",) + _plan_key(budget_bytes, "auto", options)
    try:
        best, names = twin.memo.cached(key, lambda: _auto_recompute(twin, budget_bytes, time_limit, options, fraction,
                                                                    swaps=swaps))
    finally:
        _learn_minima(graph, twin)
    return on_graph(best, graph), list(names)


def _learn_minima(graph: Graph, twin: Graph) -> None:
    """What the recomputation solvers taught about ``twin`` (each one's smallest plan seen, and which
    of those are its own minimum) as knowledge of ``graph``, where the smallest budget is looked up."""
    if twin is graph:
        return
    learnt = [(key, plan) for key, plan in list(twin.memo.items())
              if key[0] == "smallest" and key[1] not in SWAPPING_SOLVERS and plan is not None]
    for key, plan in learnt:
        old = graph.memo.get(key)
        if old is None or (plan.peak_bytes, plan.step_seconds) < (old.peak_bytes, old.step_seconds):
            graph.memo[key] = on_graph(plan, graph)
    known = _minimum_known(twin)
    _minimum_known(graph).update(key for key, _ in learnt if key in known)


def _auto_recompute(graph: Graph, budget_bytes, time_limit, options, fraction, swaps: bool = True):
    """auto's choice among the recomputation solvers: (plan, solvers run); raises
    InfeasibleBudgetError below the smallest budget any solver reaches (swapping ones included
    when ``swaps``)."""
    names = auto_candidates(graph)
    if names == ["checkmate"]:
        names, plans = _exact(graph, budget_bytes, time_limit, options)
        if not any(_fits(p, budget_bytes) and p.info.get("status") == "optimal" for p in plans):
            names.append("hierarchical")
            plans.append(_run("hierarchical", graph, budget_bytes, time_limit, options, True))
        if "hierarchical" in names:  # its chain DP can miss plans that keep a set across blocks
            names.append("keep_set")
            plans.append(_keep_set(graph, budget_bytes, time_limit))
    else:  # keep_set beside the hierarchical planner, in a thread: much of both is HiGHS, which runs unlocked
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="remat-keep-set") as pool:
            kept = pool.submit(_keep_set, graph, budget_bytes, time_limit)
            plans = [_run(n, graph, budget_bytes, time_limit, options, True) for n in names]
            names.append("keep_set")
            plans.append(kept.result())
    fitting = [p for p in plans if _fits(p, budget_bytes)]
    if not fitting:  # the first choices miss: learn the minimum, then fall back to the fast solvers
        smallest = smallest_plan(graph, "auto", time_limit=time_limit, thorough=False, swaps=False, **options)
        if smallest.peak_bytes > budget_bytes:
            if swaps:  # the message names the minimum over every solver
                smallest = smallest_plan(graph, "auto", time_limit=time_limit, thorough=False, **options)
            raise _infeasible(graph, budget_bytes, smallest, "auto", fraction, options)
        for name in FAST_SOLVERS:
            if name not in names:
                names.append(name)
                plans.append(_run(name, graph, budget_bytes, time_limit, {}, True))
        known = _known_plans(graph, ["store_all", *auto_solvers(graph)])
        fitting = [p for p in plans + known if _fits(p, budget_bytes)]
    return _cheapest(_thinned(graph, fitting, budget_bytes)), names


def _thinned(graph: Graph, fitting: list[Plan], budget_bytes) -> list[Plan]:
    """``fitting`` without the recomputations the budget does not need (:mod:`remat.solvers.recompute_less`;
    the hierarchical planner's T5 at 70%: +17.5% of the step -> +15.4%): every plan not proven optimal on a
    graph of at most ``AUTO_THIN_ALL_NODES`` ops, else the cheapest only (on a 64-layer Llama-style
    model the hierarchical planner's plan took 1.9 s to go from +3.55% to +3.30%, still dearer than keep_set's).
    A plan its solver thinned already (keep_set's) is not walked again."""
    order = sorted(fitting, key=lambda p: p.compute_seconds)
    done = [p.info.get("status") == "optimal" or "recomputations taken out" in p.info
            or (k and len(graph.nodes) > AUTO_THIN_ALL_NODES) for k, p in enumerate(order)]
    return [p if skip else recompute_less(p, budget_bytes, time_left(AUTO_RECOMPUTE_LESS_SECONDS))
            for p, skip in zip(order, done)]


def _keep_set(graph: Graph, budget_bytes, time_limit) -> Plan | None:
    return _run("keep_set", graph, budget_bytes, min(time_limit, AUTO_KEEP_SET_SECONDS), {}, True)


def recomputation_plan(graph: Graph, budget_bytes: int, *, time_limit: float | None = None) -> Plan:
    """The plan ``auto`` makes at ``budget_bytes`` with recomputation alone, or, below what
    recomputation reaches, its plan of smallest peak (the ``hybrid`` solver's starting point)."""
    time_limit = AUTO_TIME_LIMIT if time_limit is None else time_limit
    key = ("recompute",) + _plan_key(budget_bytes, "auto", {})
    if graph.memo.get(key) is not None:
        return graph.memo[key]

    def smallest():
        return smallest_plan(graph, "auto", time_limit=time_limit, thorough=False, swaps=False)

    if budget_bytes < peak_lower_bound(graph):  # no plan fits: no solver needs to try at the budget
        plan = smallest()
    else:  # the plan at the budget first: the smallest one took 35 s on a 64-layer model
        try:
            plan = _auto(graph, budget_bytes, time_limit, {}, None, swaps=False)
        except InfeasibleBudgetError:
            plan = smallest()
    graph.memo[key] = plan
    return plan


def _named(graph: Graph, budget_bytes, solver: str, time_limit, options, fraction) -> Plan:
    twin = recomputation_twin(graph)
    if solver in RECOMPUTATION_SOLVERS and twin is not graph:
        # a recomputation solver does not read the offload tier's costs: planned on the twin, it shares
        # the work of every plan made there (``auto``'s, a sweep's; the smallest-peak MILP of an exact
        # solver's fallback, 5-10 s, ran once on each before)
        try:
            return on_graph(_named(twin, budget_bytes, solver, time_limit, options, fraction), graph)
        finally:
            _learn_minima(graph, twin)
    plan = _run(solver, graph, budget_bytes, time_limit, options, skip_inapplicable=False)
    if _fits(plan, budget_bytes):
        return _for_budget(plan, budget_bytes)
    smallest = solver_minimum(graph, solver, time_limit=time_limit, **options) or plan
    if _fits(smallest, budget_bytes):  # a heuristic's search at this budget missed a plan it makes at 0
        return _for_budget(smallest, budget_bytes)
    raise _infeasible(graph, budget_bytes, smallest, solver, fraction, options)


def quick_minimum(graph: Graph) -> int:
    """The smallest peak of store_all and the quick planners (``QUICK_MINIMUM_SOLVERS``) on ``graph``: a
    budget that surely plans, found in well under a second."""
    return _smallest_of([store_all_plan(graph), *_minimum_plans(graph, QUICK_MINIMUM_SOLVERS)]).peak_bytes


def plannable_minimum(graph: Graph, budget_bytes: int | None = None) -> int:
    """:func:`quick_minimum`, or where that is higher the keep-set model's smallest peak (one HiGHS
    model: 0.4-7 s on the zoo's graphs): a budget that surely plans, for choosing how many chunks a
    split step needs. ConvBN (16 images of 32 x 32) split in two, as the eager backend captures it:
    the quick planners reach 2.52 MiB, keep_set 2.02, and a fraction of 0.5 is about 2.25. Counted on
    the quick planners alone, remat.compile took eight chunks there, whose plan stepped 1.6x as
    long as the two chunks' (benchmarks/split_bn_compiled.md). Given ``budget_bytes``, the keep-set
    model is solved only where it can change whether a plan fits that budget: not where a quick plan
    fits it, nor where it is below every order's lower bound (an infeasible budget stays quick)."""
    quick = quick_minimum(graph)
    if budget_bytes is not None and (quick <= budget_bytes or budget_bytes < peak_lower_bound(graph)):
        return quick
    return min([quick] + [p.peak_bytes for p in _minimum_plans(graph, ["keep_set"]) if p is not None])


def _minimum_plans(graph: Graph, names) -> list[Plan]:
    """The smallest-peak plan of each of the solvers ``names`` that handles ``graph``."""
    plans = []
    for name in names:
        try:
            plans.append(solver_minimum(graph, name))
        except SolverError:
            pass
    return plans


def _known_plans(graph: Graph, names) -> list[Plan]:
    """The smallest-peak plans remembered for ``graph`` from the solvers ``names``."""
    return [p for k, p in graph.memo.items() if k[0] == "smallest" and k[1] in names]


def _lower_bound(graph: Graph, budget_bytes: int, solver: str) -> int:
    """A peak no plan of any solver goes below, as far as ``budget_bytes`` needs it: the bound over
    every order (:func:`~remat.simulate.peak_lower_bound`, milliseconds) where the budget is below it,
    else the bound that also counts the backward values every order must hold
    (:func:`~remat.simulate.dependency_lower_bound`)."""
    anywhere = peak_lower_bound(graph)
    return anywhere if budget_bytes < anywhere else dependency_lower_bound(graph)


def _below_lower_bound(graph: Graph, budget_bytes: int, solver: str, fraction, bound: int) -> InfeasibleBudgetError:
    """The error for a budget below ``bound`` (:func:`_lower_bound`): the bound, and the smallest peak
    of the quick planners and of the plans already known (a budget that plans), found in well under a
    second."""
    if solver == "auto":  # what auto itself would fall back to at the budget it names (so that budget plans)
        names = ["store_all", *auto_solvers(graph)] + (["hybrid"] if uses_swaps(graph) else [])
        plans = [store_all_plan(graph), reordered_store_all_plan(graph)] + _known_plans(graph, names)
        quick = QUICK_MINIMUM_SOLVERS
    else:  # a named quick solver: its own smallest plan
        plans, quick = [], (solver,)
    smallest = _smallest_of(plans + _minimum_plans(graph, quick))
    if solver == "auto" and budget_bytes >= peak_lower_bound(graph):  # the dependency bound refused it:
        for name in FAST_SOLVERS:  # the chain planners' minima, until one reaches the bound (the minimum)
            if smallest.peak_bytes <= bound:
                break
            if name not in quick:
                smallest = _smallest_of([smallest, *_minimum_plans(graph, (name,))])
    detail = (f"the bound is one operator's working set with what must stay beside it: the gradients and "
              f"outputs every plan holds, and in the backward the values made before it and read after it, "
              f"which no plan recomputes; the smallest budget is {smallest.solver}'s plan")
    if smallest.peak_bytes > bound:
        detail += "; the exact minimum lies between the two (budget='min' finds it: minutes on a large branchy graph)"
    return _error(graph, budget_bytes, smallest, detail, solver, fraction, lower_bound_bytes=bound)


def _error(graph: Graph, budget_bytes: int, smallest: Plan, detail: str, solver: str, fraction,
           lower_bound_bytes: int | None = None) -> InfeasibleBudgetError:
    """The error naming ``smallest``'s peak as the budget to raise to, in bytes and as a fraction."""
    store, fixed = store_all_plan(graph).peak_bytes, fixed_bytes(graph)
    return InfeasibleBudgetError(
        budget_bytes, smallest.peak_bytes, detail, solver=solver, budget_fraction=fraction,
        min_budget_fraction=bytes_to_fraction(smallest.peak_bytes, store, fixed), lower_bound_bytes=lower_bound_bytes,
    )


def _infeasible(graph: Graph, budget_bytes: int, smallest: Plan, solver: str, fraction, options) -> InfeasibleBudgetError:
    store, fixed = store_all_plan(graph).peak_bytes, fixed_bytes(graph)
    minima: dict[str, int] = {}  # each solver's own minimum, where it is known
    for k in _minimum_known(graph):
        known = graph.memo.get(k)  # None for a solver that does not apply to this graph
        if known is not None:
            minima[k[1]] = min(minima.get(k[1], known.peak_bytes), known.peak_bytes)
    by_peak: dict[int, list[str]] = {}
    for name, peak in sorted(minima.items()):
        by_peak.setdefault(peak, []).append(name)
    detail = "smallest peak per solver: " + "; ".join(f"{b} bytes: {', '.join(n)}" for b, n in sorted(by_peak.items()))
    if solver != "auto" and min(minima.values(), default=smallest.peak_bytes) < smallest.peak_bytes:
        detail += "; other solvers go lower: try solver='auto'"
    detail += f". Every plan holds {fixed} bytes of gradients and outputs; the store-everything peak is {store} bytes"
    return _error(graph, budget_bytes, smallest, detail, solver, fraction)


__all__ = ["make_plan", "given_plan", "recomputation_twin", "on_graph", "resolve", "quick_minimum", "plannable_minimum", "smallest_plan", "recomputation_plan", "uses_swaps", "solver_minimum", "store_all_plan", "reordered_store_all_plan", "auto_candidates",
           "auto_solvers", "clear_caches", "is_min"]

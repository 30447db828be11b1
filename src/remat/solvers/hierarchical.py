"""Rockmate's hierarchical planner: exact block menus inside blocks, Rotor's DP across them.

1. Cut the graph into a chain of blocks at the articulation points of its forward
   (:mod:`remat.solvers.chain`).
2. Group identical blocks (same ops, shapes, edges and costs: :attr:`Block.key`); a
   transformer's layers or a ResNet stage's blocks are solved once.
3. For each class (in parallel threads: the time is HiGHS's), find the block's cheapest schedules
   on a grid of (peak, saved) budgets — the
   *save budget* bounds what the block's forward leaves for its backward — and keep the
   Pareto-optimal ones, with the plain "store all" schedule, as the block's menu of options (time,
   saved bytes, forward and backward peaks). See :func:`block_menu`.
4. Rotor's DP (:class:`~remat.solvers.rotor.ChainDP`) picks per block one option, or a forward
   without saving and a later recomputation of the whole block, for the budget.

Steps 1–3 are cached per graph, and the DP's tables per slot size: a new budget reruns only
the DP (usually not even that). A graph without block structure (fewer than two blocks) is
handed to the exact solvers (:func:`~remat.solvers.planner.exact_plan`: CP-SAT, then the MILP
warm-started from its plan unless CP-SAT proved it optimal, or fit on a graph of more than
``AUTO_MILP_NODES`` nodes). The grid: save budgets ``SAVE_FRACTIONS`` × the store-all
schedule's saved bytes, each with the peak unbounded and bounded at ``PEAK_FRACTIONS`` of the
store-all schedule's peak. With the peak unbounded the cheapest schedule is exact and takes
milliseconds (:mod:`remat.solvers.keep_set`); each is offered with its *lean* variant too (what it
recomputes dropped right after use: more compute, a lower peak, for tight budgets). With the peak
bounded it is the Checkmate MILP (:func:`~remat.solvers.checkmate.solve_milp`, built once per row:
only the save bound changes), stopped after ``PEAK_TIME_LIMIT`` seconds with its best schedule,
unless the keep-set schedule already fits the bound (it is then optimal there too). Once one of a
row's MILPs stops at its limit with nothing better than its warm start, the row's other save
budgets take their warm starts without a MILP: on blocks of 60 ops and more HiGHS rarely gets past
its presolve in that time (the 64-layer Llama-style model's three block classes: 15 MILPs, each
returning its warm start; 6 s of its 12 s of planning), while on smaller blocks the first MILP
usually improves and the row runs in full.
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

from ..errors import SolverError, SolverTimeLimitWarning
from ..graph import FORWARD, Graph
from ..plan import Plan
from .registry import SOLVERS, register
from .chain import Block
from .keep_set import KeepSetModel
from .rotor import (ChainDP, best_plan, chains_or_error, option_from_schedule,
                    pareto_options, store_all_option)

SAVE_FRACTIONS = (0.0, 0.1, 0.25, 0.4, 0.6, 0.8)
PEAK_FRACTIONS = (0.85,)
# per MILP with the peak bounded: these MILPs are hard (many stop at any limit up to 10 s); warm-started
# from the row's cheaper neighbour, 0.25 s finds plans as good as 2 s did on GPT-2 and BERT blocks
PEAK_TIME_LIMIT = 0.25
MIN_FORWARD_OPS = 3  # smaller blocks keep Rotor's three choices only
DEFAULT_TIME_LIMIT = 120.0
# what block_menu counts, summed over the classes in the planner's stats
MENU_COUNTS = ("milps", "infeasible", "not optimal", "skipped", "keep-set solves", "warm starts kept")


def block_menu(block: Block, *, time_limit: float) -> tuple[list[tuple], dict]:
    """Pareto-optimal schedules of one block, as (forward, backward) local node id lists, and stats.

    The row with the peak unbounded is solved exactly by the keep-set model
    (:class:`~remat.solvers.keep_set.KeepSetModel`, milliseconds). A row with a bounded peak
    takes, at each save budget, the keep-set schedule when it peaks within the bound (then it is
    optimal there too: bounding the peak cannot make a plan cheaper), else the Checkmate MILP,
    warm-started from the cheapest schedule found so far that fits both budgets.
    """
    from .checkmate import solve_milp, warm_start_plans, within_save_budget

    g = block.graph
    base = store_all_option(block)
    schedules = [([n.id for n in g.nodes if n.phase == FORWARD],
                  [n.id for n in g.nodes if n.phase != FORWARD])]
    stats = {**dict.fromkeys(MENU_COUNTS, 0), "seconds": 0.0}
    forward_ops = sum(1 for n in g.nodes if n.phase == FORWARD)
    if forward_ops < MIN_FORWARD_OPS or base.saved_bytes == 0:
        return schedules, stats
    start = time.perf_counter()
    store_all_peak = Plan.from_schedule(g, *schedules[0]).peak_bytes
    # largest first: below the first infeasible save budget, every smaller one is infeasible
    save_budgets = [int(f * base.saved_bytes) for f in sorted(SAVE_FRACTIONS, reverse=True)]

    model = KeepSetModel(g)
    unbounded: dict[int, Plan] = {}  # save budget -> the keep-set plan
    for save in save_budgets:
        stats["keep-set solves"] += 1
        kept = model.solve(save)
        if kept is None:
            stats["infeasible"] += 1
            break
        schedule = model.schedule(kept)
        unbounded[save] = Plan.from_schedule(g, *schedule)
        schedules += [schedule, model.schedule(kept, lean=True)]  # the lean one: a lower peak for tight budgets

    for fraction in PEAK_FRACTIONS:
        bound = int(fraction * store_all_peak)
        found: list[Plan] = []
        warm = warm_start_plans(g, bound)  # the MILPs' warm starts, made once per row
        milps_pay = True  # until a MILP returns its warm start: then the row's others are not run

        def bounded(save: int) -> Plan | None:
            """The row's plan at ``save`` (None: infeasible, or no plan found in time)."""
            nonlocal milps_pay
            easy = unbounded.get(save)
            if easy is not None and easy.peak_bytes <= bound:
                return easy  # optimal under the bound too; already in the menu
            starts = warm + list(unbounded.values()) + found
            if not milps_pay:  # the MILP's warm start: the cheapest plan at hand within both budgets
                fitting = [p for p in within_save_budget(g, starts, save) if p.peak_bytes <= bound]
                if not fitting:
                    return None
                stats["warm starts kept"] += 1
                plan = min(fitting, key=lambda p: p.compute_seconds)
                schedules.append(plan.schedule())
                return plan
            left = time_limit - (time.perf_counter() - start)
            if left <= 0.5:
                stats["skipped"] += 1
                return None
            stats["milps"] += 1
            try:  # (quiet: no time-limit warning, which a thread could not silence safely)
                plan = solve_milp(g, bound, save_budget_bytes=save, time_limit=min(PEAK_TIME_LIMIT, left),
                                  gap=1e-3, quiet=True, warm_plans=starts, baselines=False)
            except SolverError:
                stats["infeasible"] += 1
                return None
            if plan.info.get("status") != "optimal":
                stats["not optimal"] += 1
                warm_seconds = plan.info.get("warm start compute seconds")
                if warm_seconds is not None and plan.compute_seconds >= warm_seconds * (1 - 1e-9):
                    milps_pay = False  # HiGHS did not improve on its warm start in its time
            schedules.append(plan.schedule())
            return plan

        # smallest save budget first: if it is feasible, so is every larger one, and each plan
        # warm-starts the next; if not, walk down from the largest to the first infeasible one
        first = bounded(save_budgets[-1])
        if first is not None:
            found.append(first)
            for save in reversed(save_budgets[:-1]):
                plan = bounded(save)
                if plan is not None:
                    found.append(plan)
        else:
            for save in save_budgets[:-1]:
                plan = bounded(save)
                if plan is None:
                    break
                found.append(plan)
    stats["seconds"] = round(time.perf_counter() - start, 3)
    return schedules, stats


class HierarchicalPlanner:
    """Decomposition, block menus and the chain DP of one graph (cached across budgets)."""

    def __init__(self, graph: Graph, time_limit: float):
        start = time.perf_counter()
        chains = chains_or_error(graph, "hierarchical")
        # blocks: of one chain; classes: distinct blocks given a menu, over both backward deals
        self.stats = {"blocks": chains[0].length, "classes (both deals)": 0, **dict.fromkeys(MENU_COUNTS, 0)}
        blocks_of = [[chain.block_graph(k) for k in range(chain.length)] for chain in chains]
        # one block per class (block key), the classes of both chains together; big classes first:
        # they matter most if the time runs out
        weight: dict[tuple, int] = {}
        first: dict[tuple, Block] = {}
        for blocks in blocks_of:
            for b in blocks:
                first.setdefault(b.key, b)
                weight[b.key] = weight.get(b.key, 0) + len(b.graph.nodes)
        order = sorted(first, key=lambda key: -weight[key])
        # the menus in parallel: their time is HiGHS's, which runs without Python's lock
        with ThreadPoolExecutor(max_workers=max(1, min(len(order), os.cpu_count() or 1)),
                                thread_name_prefix="remat-block-menu") as pool:
            jobs = {key: pool.submit(lambda b: block_menu(b, time_limit=max(0.0, time_limit - (time.perf_counter() - start))),
                                     first[key]) for key in order}
            menus_of = {key: job.result() for key, job in jobs.items()}
        for key in order:
            self.stats["classes (both deals)"] += 1
            for name in MENU_COUNTS:
                self.stats[name] += menus_of[key][1][name]
        self.dps = []
        for chain, blocks in zip(chains, blocks_of):
            menus = [pareto_options(option_from_schedule(b, f, bw, "milp" if i else "store all")
                                    for i, (f, bw) in enumerate(menus_of[b.key][0])) for b in blocks]
            self.dps.append(ChainDP(chain, menus))
        # (Rotor's DPs are not run beside these: its single option per block is in every menu, so the
        # DP's value is never above Rotor's at any budget; they cost as much again as these, and their
        # plan was never the cheaper one on the 20 models of the zoo at budgets from 30% to 90%)
        self.stats["options"] = sum(len(m) for m in self.dps[0].menus)
        self.stats["menu seconds"] = round(time.perf_counter() - start, 3)
        self._plans: dict[int | None, Plan] = {}  # budget -> the DP's plan

    def solve(self, budget_bytes: int | None) -> Plan:
        """The DP's plan at ``budget_bytes``, once per budget (the hybrid solver asks again at the
        budget ``auto`` asked: 2 s of DP on a 64-layer Llama-style model); each call gets its own copy."""
        if budget_bytes not in self._plans:
            plan = best_plan(self.dps, budget_bytes, "hierarchical")
            plan.info.update({k if k in ("blocks", "classes (both deals)", "options", "menu seconds") else f"menu {k}": v
                              for k, v in self.stats.items()})
            if self.stats["skipped"]:
                plan.info["status"] = "time limit: some block menus are incomplete"
            self._plans[budget_bytes] = plan
        plan = copy.copy(self._plans[budget_bytes])
        plan.info = dict(plan.info)
        return plan


def hierarchical_planner(graph: Graph, time_limit: float | None = None) -> HierarchicalPlanner:
    limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    return graph.memo.cached(("hierarchical",), lambda: HierarchicalPlanner(graph, limit))


@register("hierarchical")
def hierarchical(graph: Graph, budget_bytes: int | None, *, time_limit: float | None = None, **options) -> Plan:
    """Rockmate (see module docstring); graphs without block structure go to the exact solvers."""
    if options:
        raise SolverError(f"hierarchical takes no options, got {sorted(options)}")
    try:
        planner = hierarchical_planner(graph, time_limit)
    except SolverError as err:
        if "needs a chain of blocks" not in str(err):
            raise
        from .planner import exact_plan

        plan = exact_plan(graph, budget_bytes, time_limit)
        if plan is None:  # neither exact solver applies (cannot happen on a graph they both take)
            plan = SOLVERS["checkmate"](graph, budget_bytes, time_limit=time_limit)
        plan = copy.copy(plan)
        plan.info = {**plan.info, "fallback": f"{plan.solver}: the graph has no block structure"}
        plan.solver = "hierarchical"
        return plan
    plan = planner.solve(budget_bytes)
    if planner.stats["skipped"]:
        warnings.warn(
            f"hierarchical: the time limit cut {planner.stats['skipped']} block MILPs; "
            "the plan uses the schedules found (raise time_limit for fuller menus)",
            SolverTimeLimitWarning,
            stacklevel=3,
        )
    return plan


__all__ = ["hierarchical", "HierarchicalPlanner", "hierarchical_planner", "block_menu"]

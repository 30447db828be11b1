"""The ``hybrid`` solver: Libra's greedy refinement of a recomputation plan with swapping.

A plan is kept as a *state*: the (forward, backward) node-id schedules (repeats in the backward
are recomputations) and, for each *swapped* value, the schedule position before which it is
reloaded. :meth:`~remat.plan.Plan.from_schedule` turns the schedules into a plan; each swapped
value is then offloaded right after its last forward use and reloaded at its position
(:meth:`~remat.plan.Plan.with_swaps`); the simulator judges peak and step time (compute + stalls).

1. Start from the recomputation plan ``auto`` makes at the budget, or, when recomputation cannot
   reach the budget, from its smallest-peak plan; from the store-all schedule (swapping alone); also
   from the hierarchical planner's plan at the budget, fitting or not. Keep the best result. The
   fitting starts are refined first, fastest first (each gets an equal share of the time left).
2. Candidate switches of a state:

   * *swap* a value the forward saves for the backward (not a forward output); its reload goes
     just early enough that the compute before its first backward use covers the copy (right
     before that use when copies are synchronous, since nothing can cover them), and after the
     peak while over the budget;
   * *drop a recomputation* in the backward: the recomputed values are then kept from the
     forward and swapped, and every recomputation that only fed it is dropped too;
   * *recompute* a value the forward saves (within the budget: a swapped one, instead of its
     copies; over it, only on a kick's way back (step 5): one live across the peak): its producer
     runs again right before its first backward use, after the producers of those of its inputs
     the backward does not hold anyway (a chain of at most ``_CHAIN`` nodes);
   * *reload later* (only while over the budget): move a swapped value's reload past the peak;
   * within the budget also *keep* (drop a recomputation and keep its values in memory, not
     swapped) and *unswap* (keep a swapped value in memory): memory left under the budget
     bought back as time.

3. While the plan is over the budget, take the switch that lowers (peak, bytes over the budget,
   step time) most; once it fits, the switch with the least step time among those still within the
   budget, as long as it lowers the step time (the search: :mod:`remat.solvers.hybrid_search`,
   with its constants), found best first: simulated in the order of their step floors, until a
   floor is above the best step found. Only the ``CANDIDATES`` most promising switches
   (by a cheap estimate) are simulated per round, at most ``PER_KIND`` of each kind of *alike*
   switches (the same kind, op, output sizes and module path but for layer numbers: the same
   switch in the other identical layers), so that a round compares different switches rather than
   one switch in 32 layers; one whose step time cannot beat the one to beat (its compute, plus its
   copies when they are synchronous and so all stall: then exact) is not simulated at all, nor
   one within the budget that certainly overshoots it when the forward ends (``cannot_fit``). The
   chosen switch's alike ones are then taken with it: within the budget all of them, or the
   longest prefix that still fits and gains (binary search); over it all of them, or the shortest
   prefix that fits, or else a longer prefix while it lowers (peak, excess, step) further (when
   the switch alone fits, none). So 64 identical layers need a round per kind of switch, not one
   per layer. The search stops after min(``time_limit``, ``GREEDY_TIME_LIMIT``) seconds (where
   nothing fits, steps 6 and 7 take more: see there).
4. After a swap is taken whose reload stalls, its reload is moved as early as the budget allows
   (binary search back from the first use), if that lowers the step time.
5. Kicks, once the descent stops at a fitting plan: a switch that lowers the step time by at least
   ``KICK_GAIN`` of it but overshoots the budget (keep, unswap, drop; the ``KICKS`` that overshoot
   least), then the
   descent from there back under the budget (freeing the memory elsewhere, by recomputation
   too); the result replaces the plan when it is faster, until no kick helps. Each state is
   simulated once (cached). (Recomputing over the budget in the first descent too made worse
   smallest-peak plans: GPT-2 small's went 4% up.) A kick's descent over the budget gives up once
   its step floor is not below the plan it must beat.

6. When no start reaches the budget (the descent stalls above it: no single switch lowers the
   peak), descend with budget 0 instead, every byte then being over it, as far as the greedy goes
   (once per graph, for up to the greedy's time limit again), and, if that plan fits, refine it at
   the budget: the memory left buys time.
7. When still nothing fits, the plan of smallest peak is the answer (the solver's minimum); it is
   refined within its own peak, as if that were the budget: the descent lowered the bytes over the
   budget all along the step, not only at the peak, and the memory under the peak buys time back
   (for what is left of the greedy's time, at least a quarter of its limit).

Returns the fitting plan of least step time, or, when none fits, the plan of smallest peak (the
planner then reports it as this solver's minimum). Needs ``graph.meta["transfer"]``.
"""

from __future__ import annotations

import copy
import time

from ..errors import SolverError
from ..graph import Graph
from ..plan import Plan
from ..simulate import has_transfer_costs
from .hybrid_search import Evaluation, GreedySearch, State
from .planner import on_graph, recomputation_plan, recomputation_twin, store_all_plan
from .registry import register, solve

DEFAULT_TIME_LIMIT = 30.0  # for the recomputation planners that make the start
GREEDY_TIME_LIMIT = 10.0  # the greedy itself stops after min(time_limit, this)


def _starts(graph: Graph, budget: int, time_limit: float) -> list[Plan]:
    """The recomputation plan auto makes at the budget (or its smallest plan), and store-all's; and,
    refined first, the hierarchical planner's plan at the budget even when it misses it: a second
    start, as a time-limited MILP's plan can be far from the best (coarse resnet: 113 recomputations).
    Store-all's schedule is a start even where recomputation fits: where copies hide behind compute,
    swapping alone can beat every plan that recomputes (ViT `small` at 30% with copies beside
    compute: from store-all 0.0262 s, the step of store-all itself; from the recomputation plan, whose
    compute is 0.0653 s, 0.0281 s)."""
    plan = recomputation_plan(graph, budget, time_limit=time_limit)
    store_all = store_all_plan(graph)
    plans = [plan] if plan.schedule() == store_all.schedule() else [plan, store_all]
    try:  # planned without the transfer costs, which it does not read: shares the work auto did (recomputation_twin)
        other = on_graph(solve("hierarchical", recomputation_twin(graph), budget, time_limit=time_limit), graph)
    except SolverError:
        return plans
    if all(other.schedule() != p.schedule() for p in plans):
        plans.insert(0, other)
    return plans


def _lowest_state(graph: Graph, state: State, time_limit: float) -> tuple[Evaluation, int]:
    """The greedy's descent from ``state`` with budget 0 (every byte is over it, so each round
    lowers the peak or the bytes held over the whole step): the lowest plan it reaches, once per
    graph. Where the descent at the budget stalls above it (no single switch lowers the peak: on
    ResNet-18 under Inductor the stem's backward holds three 8 MiB values at once), refining from
    this plan at the budget buys time back with the memory left (ResNet-18 of
    ``benchmarks/inductor.py`` at 24 MiB: 23.5 MiB at 61.9 ms predicted instead of the lowest
    plan's 18.7 MiB at 69.8)."""
    def descend():
        _, lowest, rounds = GreedySearch(graph, 0).refine(state, time.perf_counter() + time_limit)
        return lowest, rounds

    return graph.memo.cached(("hybrid lowest",), descend)  # the transfer costs are part of the graph's key


def _fastest_at_peak(graph: Graph, smallest: Evaluation, time_limit: float) -> tuple[Evaluation, int]:
    """The greedy within ``smallest``'s own peak, from it: where no plan reaches the budget, the plan
    of smallest peak is the solver's answer (its minimum, for ``budget="min"``), and the descent that
    found it lowered the bytes held over the budget everywhere, not only at the peak, at the cost of
    copies and recomputation that the peak does not need (ResNet-18 with synchronous copies: 27%
    more step at the same peak). Memory left under that peak buys time back."""
    fit, _, rounds = GreedySearch(graph, smallest.peak).refine(smallest.state, time.perf_counter() + time_limit)
    if fit is None or fit.step >= smallest.step:
        return smallest, rounds
    return Evaluation(fit.state, fit.plan, smallest.budget), rounds  # (judged against the caller's budget again)


@register("hybrid")
def solve_hybrid(graph: Graph, budget_bytes: int | None, *, time_limit: float | None = None, **options) -> Plan:
    """Recomputation and swapping together: Libra's greedy (see the module docstring)."""
    if options:
        raise SolverError(f"hybrid takes no options, got {sorted(options)}")
    if not has_transfer_costs(graph):
        raise SolverError(f"hybrid needs transfer costs (graph.meta['transfer']) on {graph.name!r}")
    if budget_bytes is None:  # no limit: nothing beats computing everything once
        return copy.copy(store_all_plan(graph))
    time_limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    budget = int(budget_bytes)
    starts = _starts(graph, budget, time_limit)
    started = time.perf_counter()  # the greedy's own time limit starts after the recomputation planners
    greedy_limit = min(time_limit, GREEDY_TIME_LIMIT)
    search = GreedySearch(graph, budget)
    results = []
    # the fitting starts first, fastest first: one that finishes early leaves its time to the others
    starts.sort(key=lambda p: (p.peak_bytes > budget, p.step_seconds if p.peak_bytes <= budget else 0.0))
    for k, plan in enumerate(starts):
        share = (started + greedy_limit - time.perf_counter()) / (len(starts) - k)
        fwd, bwd = plan.schedule()
        fit, small, rounds = search.refine(State(tuple(fwd), tuple(bwd), ()), time.perf_counter() + max(share, 0.0))
        results.append((fit, small, rounds, plan))
    fitting = [r for r in results if r[0] is not None]
    if not fitting and budget > 0:  # stuck above the budget: from the lowest state the greedy reaches, back up
        _, small, _, stalled_start = min(results, key=lambda r: r[1].key())
        lowest, more = _lowest_state(graph, small.state, greedy_limit)
        if lowest.peak <= budget:
            fit, _, rounds = search.refine(lowest.state, time.perf_counter() + greedy_limit)
            results.append((fit, lowest, more + rounds, stalled_start))
            fitting = [r for r in results if r[0] is not None]
    if fitting:
        fit, _, rounds, start = min(fitting, key=lambda r: (r[0].step, r[0].peak))
        chosen = fit
    else:
        _, chosen, rounds, start = min(results, key=lambda r: r[1].key())
        left = max(started + greedy_limit - time.perf_counter(), greedy_limit / 4)
        chosen, more = _fastest_at_peak(graph, chosen, left)
        rounds += more
    plan = chosen.plan
    plan.solver = "hybrid"
    plan.info = {
        "start": f"{start.solver or '?'} (peak {start.peak_bytes} bytes, compute {start.compute_seconds:.6g} s)",
        "swapped": len(chosen.state.reloads),
        "greedy rounds": rounds,
        "simulations": search.simulations,
    }
    return plan


__all__ = ["solve_hybrid", "has_transfer_costs", "State"]

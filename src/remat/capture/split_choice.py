"""How many chunks a split step runs its sites in: the choices :mod:`remat.capture.split` leaves to the planner.

The lowerings plan a split step for each choice and keep the one the simulator predicts best:

* :func:`faster_chunks` (the eager backend and the Inductor partitioner): where the step fits, more
  chunks (2, 4, 8, ...) while each is predicted faster (smaller chunks leave more memory, so less
  recomputation);
* :func:`smallest_split` (both lowerings, ``budget="min"``):
  more chunks while each lowers the quick planners' smallest peak by ``MIN_GAIN``, then each site in
  :func:`site_chunks` where that peak is no higher so; only that split's smallest plan is searched in
  full, and kept where it peaks ``MIN_GAIN`` below the unsplit step's (:func:`lower_enough`);
* :func:`graded_chunks` (both lowerings, wherever ``split="auto"`` chose a count within a budget): each
  site in :func:`site_chunks` instead of one count for all, where that is predicted no slower.
"""

from __future__ import annotations

from typing import Callable

from ..budget import bytes_to_fraction
from ..errors import InfeasibleBudgetError
from .split import FASTER_SPLIT_GAIN, FASTER_SPLIT_OVERHEAD, Site

MIN_GAIN = 0.02  # budget="min": a larger split factor must lower the peak by this fraction to be tried further


def site_chunks(sites: list[Site], k: int) -> tuple[int, ...]:
    """Each site's chunk count when the largest site (the first) runs in ``k`` chunks: the fewest of
    ``k, k/2, k/4, ..., 1`` that keep the site's chunks of its seed no larger than the largest site's
    (fewer, larger chunks: fewer launches, the same grain of memory). 1: the site is left whole."""
    if not sites:
        return ()
    grain = sites[0].seed_bytes / k
    counts = []
    for site in sites:
        c = k
        while c > 1 and site.seed_bytes / (c // 2) <= grain:
            c //= 2
        counts.append(c)
    return tuple(counts)


def smallest_split(factors, sites: list[Site], quick_peak: Callable[[int | tuple], int],
                   unsplit_peak: int) -> int | tuple[int, ...] | None:
    """``budget="min"``: the split whose smallest plan to search in full, from the quick planners' smallest
    peaks alone (``quick_peak(counts)``: seconds; a full search takes a minute on a 2,000-op split step):

    1. the chunk count ``k`` of ``factors`` (2, 4, 8, ...): counts are taken in turn while each lowers the
       quick peak by ``MIN_GAIN`` below the one before (``unsplit_peak``: the step's as captured);
    2. then each site in :func:`site_chunks` of ``k`` (the counts, a tuple) where that step's quick peak is
       no higher than with every site in ``k``: the same grain of memory with fewer launches.

    None where two chunks do not lower the quick peak: splitting would not lower the floor. (One full
    search instead of two, uniform and graded: on the zoo's ``cnn_bn`` both found the same smallest
    peak, and the graded step, no slower, was kept; 160 s to plan, 60 s of them the second search.)"""
    chosen, best = None, unsplit_peak
    for k in factors:
        least = quick_peak(k)
        if least > best * (1 - MIN_GAIN):
            break
        chosen, best = k, least
    if chosen is None or len(sites) < 2:
        return chosen
    counts = site_chunks(sites, chosen)
    if counts == (chosen,) * len(sites):
        return chosen
    return counts if quick_peak(counts) <= best else chosen


def lower_enough(split_peak: int, unsplit_peak: int) -> bool:
    """Whether a split step's smallest plan is kept for ``budget="min"`` over the unsplit step's: it
    peaks ``MIN_GAIN`` lower (each chunk is an op launch more, for less than that)."""
    return split_peak < unsplit_peak * (1 - MIN_GAIN)


NOT_FASTER = "not faster"  # faster_chunks' plan_for: the split step's store-all step is already too slow


def faster_chunks(baseline, factors, plan_for: Callable[[int], tuple | None], label: str):
    """``(k, plan_for(k, within))`` for the chunk count of ``factors`` taken for speed over ``baseline`` (a
    plan: of the step unsplit, or split into fewer chunks; ``label`` names it), or None.
    ``plan_for(k, within)`` is a tuple ending with the split step's plan within the budget, None where
    no quick plan fits, or ``NOT_FASTER`` where no plan of the split step can take less than ``within``
    seconds: its store-all step (each op once, no stall) already takes that long, so it returns
    without planning, and more chunks (more launches) are not tried either (on a 2-layer GPT-2 under
    Inductor that skipped a 72 s search whose plan was slower anyway).
    Counts are taken in turn while each plan's predicted step (compute and stalls) is
    ``FASTER_SPLIT_GAIN`` below the one before, up to the first whose overhead is at most
    ``FASTER_SPLIT_OVERHEAD`` (little recomputation left for more chunks to save). The rule of both
    lowerings: the eager backend and the Inductor partitioner."""
    best, chosen = baseline, None
    for k in factors:
        result = plan_for(k, best.simulation.step_seconds * (1 - FASTER_SPLIT_GAIN))
        if result is NOT_FASTER:
            break
        if result is None:
            continue
        plan = result[-1]
        if plan.simulation.step_seconds >= best.simulation.step_seconds * (1 - FASTER_SPLIT_GAIN):
            break
        plan.info["chosen by"] = (
            f"auto: split into {k} chunks, predicted {plan.step_overhead:+.1%} against the {label} "
            f"plan's {baseline.step_overhead:+.1%} (its own store-all compute each)")
        best, chosen = plan, (k, result)
        if plan.step_overhead <= FASTER_SPLIT_OVERHEAD:
            break
    return chosen


def graded_chunks(chosen: tuple, sites: list[Site], plan_for: Callable[[tuple], tuple | None]):
    """``chosen`` (``(k, plan_for(k))``: a split step's plan with every site in ``k`` chunks), or the same
    step with each site in :func:`site_chunks` (``(counts, plan_for(counts))``) where that plan is
    predicted no slower: sites whose values
    are smaller than the largest site's need fewer chunks for the same grain of memory, and each chunk
    is an op launch more (the predicted times of ``flops`` costs do not see launches; profiled ones do:
    cnn_bn, 16 chunks, at its smallest budget 289 ms predicted with (16, 16), 178 ms with (16, 4))."""
    k, result = chosen
    if len(sites) < 2 or not isinstance(k, int):
        return chosen
    counts = site_chunks(sites, k)
    if counts == (k,) * len(sites):
        return chosen
    graded = plan_for(counts)
    if graded is None:
        return chosen
    better = graded[-1].simulation.step_seconds <= result[-1].simulation.step_seconds
    return (counts, graded) if better else chosen



def refused_over_splits(refused: InfeasibleBudgetError, least: int, most_chunks: int, store_all_peak: int,
                        fixed: int, bound: int) -> InfeasibleBudgetError:
    """The refusal of a budget no split plans (both lowerings): the least budget over the splits tried, in
    bytes and as a fraction of the step as captured (its store-all peak and ``fixed`` bytes), and
    ``bound``, the least bound of every plan of the step split or not, where the budget is below it."""
    return InfeasibleBudgetError(
        refused.budget_bytes, least, f"with its largest ops split into up to {most_chunks} chunks",
        solver=refused.solver, budget_fraction=refused.budget_fraction,
        min_budget_fraction=bytes_to_fraction(least, store_all_peak, fixed),
        lower_bound_bytes=bound if refused.budget_bytes < bound else None)


__all__ = ["MIN_GAIN", "NOT_FASTER", "faster_chunks", "graded_chunks", "lower_enough", "refused_over_splits",
           "site_chunks", "smallest_split"]

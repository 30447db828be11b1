"""How many chunks a split step runs its sites in: the choices :mod:`remat.capture.split` leaves to the planner.

The lowerings plan a split step for each choice and keep the one the simulator predicts best:

* :func:`faster_chunks` (the eager backend and the Inductor partitioner): where the step fits, more
  chunks (2, 4, 8, ...) while each is predicted faster (smaller chunks leave more memory, so less
  recomputation);
* :func:`smallest_chunks` (both lowerings, ``budget="min"``):
  more chunks while each lowers the quick planners' smallest peak by ``MIN_GAIN``; that count's
  smallest plan is then kept where it peaks ``MIN_GAIN`` below the unsplit step's (:func:`lower_enough`);
* :func:`graded_chunks` (both lowerings, wherever ``split="auto"`` chose a count): each site in
  :func:`site_chunks` instead of one count for all, where that is predicted no slower.
"""

from __future__ import annotations

from typing import Callable

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


def smallest_chunks(factors, quick_peak: Callable[[int], int], unsplit_peak: int) -> int | None:
    """``budget="min"``: the chunk count of ``factors`` (2, 4, 8, ...) whose smallest plan to search in
    full: counts are taken in turn while each lowers the quick planners' smallest peak (``quick_peak(k)``,
    seconds) by ``MIN_GAIN`` below the one before (``unsplit_peak``: the step's as captured). None where
    two chunks do not: splitting would not lower the floor."""
    chosen, best = None, unsplit_peak
    for k in factors:
        least = quick_peak(k)
        if least > best * (1 - MIN_GAIN):
            break
        chosen, best = k, least
    return chosen


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


def graded_chunks(chosen: tuple, sites: list[Site], plan_for: Callable[[tuple], tuple | None], smallest: bool = False):
    """``chosen`` (``(k, plan_for(k))``: a split step's plan with every site in ``k`` chunks), or the same
    step with each site in :func:`site_chunks` (``(counts, plan_for(counts))``) where that plan is
    predicted no slower (``smallest``: for ``budget="min"``, where it peaks lower, or as low and no
    slower): sites whose values
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
    plan, other = graded[-1], result[-1]
    if smallest:  # the smaller peak first, then the shorter step
        better = (plan.peak_bytes, plan.simulation.step_seconds) <= (other.peak_bytes, other.simulation.step_seconds)
    else:
        better = plan.simulation.step_seconds <= other.simulation.step_seconds
    return (counts, graded) if better else chosen


__all__ = ["MIN_GAIN", "NOT_FASTER", "faster_chunks", "graded_chunks", "lower_enough", "site_chunks", "smallest_chunks"]

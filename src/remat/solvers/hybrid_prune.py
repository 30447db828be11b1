"""What the hybrid's greedy can tell about a switch without simulating it.

:func:`removed_computations` compares two backward schedules of which one is the other with
computations removed (a *keep* or a *drop* switch): the instructions of the two plans agree up to
the first removed computation, but for values the removed ones read last, which the shorter plan
frees sooner. :meth:`remat.solvers.hybrid_search.GreedySearch.cannot_fit` uses it to carry the
difference in held bytes from the forward's end into the backward.

:func:`pruned_removal` finds which recomputations a *keep* or *drop* takes
out with the computations it removes (those that fed only them), in time proportional to what it
removes rather than to the backward's length.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right

from ..graph import FORWARD, INPUT, Graph
from .hybrid_instances import BackwardReads


def removed_computations(graph: Graph, old: tuple[int, ...], new: tuple[int, ...],
                         changed: set[int]) -> tuple[int, int] | None:
    """When backward ``new`` is ``old`` with computations removed: (the position in ``old`` up to
    which both run the same computations and none makes a value of ``changed``, the values whose
    holding from the forward differs; the bytes of the values a removed computation read that no
    computation ``new`` keeps from that position on reads: those ``new`` may free sooner, inputs
    aside). None when ``new`` is not such a subsequence of ``old``."""
    nodes, values = graph.nodes, graph.values
    kept, first, j = [], None, 0
    for k, nid in enumerate(old):
        is_kept = j < len(new) and new[j] == nid
        j += is_kept
        kept.append(is_kept)
        if first is None and (not is_kept or not changed.isdisjoint(nodes[nid].outputs)):
            first = k
    if j != len(new):
        return None
    if first is None:
        return len(old), 0
    read_removed, read_later = set(), set()
    for k in range(first, len(old)):
        (read_later if kept[k] else read_removed).update(nodes[old[k]].inputs)
    return first, sum(values[v].bytes for v in read_removed - read_later if values[v].kind != INPUT)


def same_until(graph: Graph, old_state, new_state, changed: set[int], backward_computes: list[int],
               boundary: int, n_instructions: int) -> tuple[int, int] | None:
    """(end, freed_sooner): the instructions of the plan of ``old_state`` from the forward's end up to
    index ``end`` (not included) are those of ``new_state``'s but for frees of ``freed_sooner`` bytes
    at most (:func:`removed_computations`), and for the held values ``changed``, whose bytes stay
    the same difference all along. Also cut before the first reload only one of the two makes (both
    reload the same values in the forward). ``backward_computes``: the instruction index of each
    backward computation of ``old_state``'s plan. None: ``new_state``'s backward is not ``old_state``'s
    with computations removed."""
    removed = removed_computations(graph, old_state.backward, new_state.backward, changed)
    if removed is None:
        return None
    first, freed_sooner = removed
    nf = len(old_state.forward)
    differing = ({r for r in old_state.reloads if r[1] <= nf + first}
                 ^ {r for r in new_state.reloads if r[1] <= nf + first})
    if differing:  # a reload lands before the computation at its position: cut after the one before
        before = min(r for _, r in differing) - nf - 1
        return (backward_computes[before] + 1 if before >= 0 else boundary), freed_sooner
    return (backward_computes[first] if first < len(old_state.backward) else n_instructions), freed_sooner


def pruned_removal(graph: Graph, n_forward: int, backward: tuple[int, ...], positions, index: BackwardReads,
                   kept_outputs: set[int]) -> set[int]:
    """The backward positions a switch removes: ``positions``, and each recomputation (a forward node
    run in the backward) none of whose outputs is read any more before its next remaining
    computation, nor held to the step's end (``kept_outputs``).

    A worklist from the latest position down: removing position ``m`` can only orphan, for each value
    ``m`` reads, its latest remaining maker before ``m``; so a candidate is judged once every
    position after it is settled. Equal to a walk of the whole backward from its end (which also
    drops recomputations no one read before; the greedy's states hold none) in what it removes."""
    nodes, reads, makes = graph.nodes, index.reads, index.makes
    removed = set(positions)
    heap = [-p for p in removed]
    heapq.heapify(heap)
    judged: set[int] = set()

    def latest_maker(v: int, before: int) -> int | None:
        made = makes.get(v, ())
        i = bisect_left(made, before) - 1
        while i >= 0 and made[i] in removed:
            i -= 1
        return made[i] if i >= 0 else None

    def needed(pos: int) -> bool:
        for v in nodes[backward[pos - n_forward]].outputs:
            if v in kept_outputs:
                return True
            made = makes.get(v, ())
            i = bisect_right(made, pos)
            while i < len(made) and made[i] in removed:
                i += 1
            end = made[i] if i < len(made) else None
            read = reads.get(v, ())
            for j in read[bisect_right(read, pos):]:
                if end is not None and j >= end:
                    break
                if j not in removed:
                    return True
        return False

    while heap:
        pos = -heapq.heappop(heap)
        if pos in judged:
            continue
        judged.add(pos)
        if pos not in removed:
            if nodes[backward[pos - n_forward]].phase != FORWARD or needed(pos):
                continue
            removed.add(pos)
        for v in nodes[backward[pos - n_forward]].inputs:
            maker = latest_maker(v, pos)
            if maker is not None and maker not in judged and maker not in removed:
                heapq.heappush(heap, -maker)
    return removed


__all__ = ["removed_computations", "same_until", "pruned_removal"]

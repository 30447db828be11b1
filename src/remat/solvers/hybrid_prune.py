"""What the hybrid's greedy can tell about a switch without simulating it.

:func:`removed_computations` compares two backward schedules of which one is the other with
computations removed (a *keep* or a *drop* switch): the instructions of the two plans agree up to
the first removed computation, but for values the removed ones read last, which the shorter plan
frees sooner. :meth:`remat.solvers.hybrid_search.GreedySearch.cannot_fit` uses it to carry the
difference in held bytes from the forward's end into the backward.
"""

from __future__ import annotations

from ..graph import INPUT, Graph


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


__all__ = ["removed_computations", "same_until"]

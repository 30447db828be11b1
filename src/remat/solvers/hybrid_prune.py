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


__all__ = ["removed_computations"]

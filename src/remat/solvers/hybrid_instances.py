"""Which activations a schedule keeps from its forward for its backward, and where: per schedule,
and carried through the greedy's switches without walking the schedule again.

A schedule is a forward (each node once) and a backward (node ids, a forward node again is a
recomputation). For each activation ``v`` the forward makes and the backward reads before making it
again, its *instance* is (the forward position of its last forward use, the position of its first
backward read): the forward holds it from the one to the other (unless it is swapped).

* :class:`ForwardUses` (once per forward) knows each value's last forward use;
* :func:`instances` walks a backward once: ``first`` is ``v``'s first backward read, if it comes
  before ``v``'s first backward computation;
* :class:`BackwardReads` (once per backward, for the switches tried on it) knows where each value
  the forward makes is read and made again in the backward;
* :func:`instances_after_removal` derives the instances of a schedule with backward computations
  removed (a *keep* or a *drop*) from its parent's: only the values the removed computations read
  or make can change; every other one keeps its instance, its backward position shifted.

The instances are ordered by first read, then by the order the reading node lists its inputs (the
order a walk of the schedule meets them: the greedy's candidates keep it among equal gains).
"""

from __future__ import annotations

from bisect import bisect_left

from ..graph import ACTIVATION, Graph

Instances = dict[int, tuple[int, int]]  # value -> (last forward use, first backward read)


class ForwardUses:
    """The last position each value the forward makes is made or read there."""

    def __init__(self, graph: Graph, forward: tuple[int, ...]):
        self.last: dict[int, int] = {}
        last = self.last
        for pos, nid in enumerate(forward):
            node = graph.nodes[nid]
            for v in node.inputs:
                if v in last:
                    last[v] = pos
            for v in node.outputs:
                last[v] = pos


class BackwardReads:
    """Where each value the forward makes (``forward``) is read and made again in one backward
    schedule (positions in forward + backward, ascending)."""

    def __init__(self, graph: Graph, forward: ForwardUses, n_forward: int, backward: tuple[int, ...]):
        self.reads: dict[int, list[int]] = {}
        self.makes: dict[int, list[int]] = {}
        tracked, nodes = forward.last, graph.nodes
        for pos, nid in enumerate(backward, start=n_forward):
            node = nodes[nid]
            for where, values in ((self.reads, node.inputs), (self.makes, node.outputs)):
                for v in values:
                    if v in tracked:
                        at = where.get(v)
                        if at is None:
                            where[v] = [pos]
                        else:
                            at.append(pos)


def _first_read(reads, makes) -> int | None:
    """The first of ``reads`` before the first of ``makes`` (ascending positions; None: none)."""
    if not reads:
        return None
    return reads[0] if not makes or reads[0] < makes[0] else None


def _position_key(graph: Graph, sequence_at, v: int, first: int) -> tuple[int, int]:
    """Where a walk of the schedule meets ``v``'s first backward read (``sequence_at(pos)``: the node
    at ``pos``)."""
    return first, graph.nodes[sequence_at(first)].inputs.index(v)


def _merged(graph: Graph, sequence_at, kept: list, found: Instances) -> Instances:
    """``kept`` (instances in walk order) with ``found`` put in their places."""
    if not found:
        return dict(kept)
    firsts = [first for _, (_, first) in kept]
    out, i = [], 0
    keyed = sorted((_position_key(graph, sequence_at, v, first), v, last) for v, (last, first) in found.items())
    for key, v, last in keyed:
        first = key[0]
        j = bisect_left(firsts, first, i)
        while j < len(kept) and firsts[j] == first and _position_key(graph, sequence_at, kept[j][0], first) < key:
            j += 1
        out.extend(kept[i:j])
        out.append((v, (last, first)))
        i = j
    out.extend(kept[i:])
    return dict(out)


def _saved(graph: Graph, v: int, kept_to_the_end: set[int]) -> bool:
    """Whether ``v`` is an activation the greedy may swap or recompute (not an output it keeps)."""
    return graph.values[v].kind == ACTIVATION and v not in kept_to_the_end


def instances(graph: Graph, forward: ForwardUses, n_forward: int, backward: tuple[int, ...],
              kept_to_the_end: set[int]) -> Instances:
    """Every saved activation's instance (module docstring), in walk order."""
    current = set(forward.last)  # values whose forward instance is still the current one
    first: dict[int, int] = {}
    nodes = graph.nodes
    for pos, nid in enumerate(backward, start=n_forward):
        node = nodes[nid]
        for v in node.inputs:
            if v in current and v not in first:
                first[v] = pos
        current.difference_update(node.outputs)
    last = forward.last
    return {v: (last[v], q) for v, q in first.items() if _saved(graph, v, kept_to_the_end)}


def instances_after_removal(graph: Graph, forward: ForwardUses, n_forward: int, old_backward: tuple[int, ...],
                            old: Instances, reads: BackwardReads, removed: set[int], kept_to_the_end: set[int],
                            new_backward: tuple[int, ...]) -> Instances:
    """The instances of ``old_backward`` (``old``; ``reads``) without the computations at positions
    ``removed``, the new backward being ``new_backward``. A value none of them reads or makes keeps its
    instance; one of them may lose its read or its backward computation, and is found again among
    the remaining reads and computations. Positions after a removed one move down by one each."""
    nodes = graph.nodes
    cut = sorted(removed)
    touched: set[int] = set()
    for pos in cut:
        node = nodes[old_backward[pos - n_forward]]
        touched.update(node.inputs)
        touched.update(node.outputs)
    kept = [(v, (last, first - bisect_left(cut, first))) for v, (last, first) in old.items() if v not in touched]
    found = {}
    for v in touched:
        last = forward.last.get(v)
        if last is None or not _saved(graph, v, kept_to_the_end):
            continue
        first = _first_read([r for r in reads.reads.get(v, ()) if r not in removed],
                            [m for m in reads.makes.get(v, ()) if m not in removed])
        if first is not None:
            found[v] = (last, first - bisect_left(cut, first))
    return _merged(graph, lambda pos: new_backward[pos - n_forward], kept, found)


__all__ = ["ForwardUses", "BackwardReads", "Instances", "instances", "instances_after_removal"]

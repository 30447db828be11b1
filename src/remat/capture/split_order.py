"""The order in which a split site runs: its ops in stages, the stages and the ops outside in one order.

A site (:mod:`remat.capture.split`) runs each *segment* (its ops of one phase and one stage) chunk
after chunk where the original ran the segment's first op. :func:`segments` groups the site's ops
into stages: an op runs in the stage from which everything it reads in its phase exists, so that
what needs the whole of a value combined over the chunks (a sum, a barrier's statistics) runs after
all of them. :func:`convex` checks that a segment can run as one block, and :func:`run_order`
orders the segments and the ops outside the sites (Kahn's algorithm), or finds that they wait on
each other. A site is :class:`remat.capture.split.Site` (its ``seed``, ``splits`` and ``states``).
"""

from __future__ import annotations

import heapq
import operator

import torch.fx as fx

# An entry of a segment: (node, part), part "op" (an op or getitem run per chunk), "reduce" or
# "apply" (a barrier's two passes), "result" (a barrier's getitem: made by its passes).
Entry = tuple[fx.Node, str]


_COMBINED = ("sum", "mean", "first")  # states of values made whole when their segment ends


def segments(site, forward: set[fx.Node]) -> list[list[Entry]]:
    """The site's entries by phase (forward, backward) and stage, each in graph order.

    A node's stage is the largest stage from which what it reads in its phase exists: a split
    value from the stage that makes it; a sum, a mean or a ``first`` value, combined when its
    segment ends, from the next one; a barrier's statistics from the one after its reduce pass;
    and an op outside the site from the largest of those it reads, so that an op of the site that
    reads a combined value through small ops outside it (a decomposed batch norm's ``sum dy / n``)
    runs in a later stage than the op that made it. A barrier reduces in its stage and makes its
    outputs in the next: its statistics (whole) at the end of the reduce stage, its row outputs in
    the apply pass."""
    members = set(site.splits) | set(site.states)
    ready: dict[fx.Node, int] = {}  # site node -> the stage from which its outputs exist
    exists: dict[fx.Node, int] = {}  # node -> the stage from which readers of its phase can read it
    groups: dict[tuple[bool, int], list[Entry]] = {}
    for n in site.seed.graph.nodes:
        phase = n not in forward
        if n not in members:  # outside the site: after whatever of the site's it reads
            stages = [exists[a] for a in n.all_input_nodes if a in exists and (a not in forward) == phase]
            if stages:
                exists[n] = max(stages)
            continue
        if n.target is operator.getitem and n.args[0] in site.splits:
            parent = n.args[0]
            ready[n] = ready[parent]
            if site.splits[parent].barrier is None:
                groups.setdefault((phase, ready[n]), []).append((n, "op"))
            elif site.states[n].kind == "stat":  # made by the combine, at the end of the reduce stage
                groups.setdefault((phase, ready[n] - 1), []).append((n, "result"))
            else:  # made by the apply pass
                groups.setdefault((phase, ready[n]), []).append((n, "result"))
        else:
            stage = max((exists[a] for a in n.all_input_nodes if a in exists and (a not in forward) == phase),
                        default=0)
            if site.splits[n].barrier is not None:
                groups.setdefault((phase, stage), []).append((n, "reduce"))
                if site.splits[n].barrier.apply is not None:
                    groups.setdefault((phase, stage + 1), []).append((n, "apply"))
                ready[n] = stage + 1
            else:
                groups.setdefault((phase, stage), []).append((n, "op"))
                ready[n] = stage
        state = site.states.get(n)
        exists[n] = ready[n] + (1 if state is not None and state.kind in _COMBINED else 0)
    return [groups[key] for key in sorted(groups)]


def convex(segment: list[Entry]) -> bool:
    """No path leaves the segment and comes back into it (else it cannot run as one block)."""
    inside = {n for n, _ in segment}
    stack = [u for n in inside for u in n.users if u not in inside]
    seen: set[fx.Node] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        for u in n.users:
            if u in inside:
                return False
            stack.append(u)
    return True


def run_order(nodes: list[fx.Node], sites: list, forward: set[fx.Node]):
    """The order in which the rewritten graph runs: ``(unit, entries)`` pairs, a unit being a node
    outside the sites (entries None) or a site's segment ``(site index, segment index)``; units
    in topological order, ties broken by the graph position of their first node (Kahn's
    algorithm). None when the units wait on each other (a cycle)."""
    unit_of: dict[fx.Node, object] = {n: n for n in nodes}
    members: dict[object, list[Entry]] = {}
    needs: dict[object, set] = {}
    reduced_in: dict[fx.Node, object] = {}  # barrier -> the segment of its reduce pass (and combine)
    for s, site in enumerate(sites):
        site_segments = segments(site, forward)
        for g, segment in enumerate(site_segments):
            members[(s, g)] = segment
            for n, part in segment:
                if part != "reduce":
                    unit_of[n] = (s, g)
        for g, segment in enumerate(site_segments):
            for n, part in segment:  # a barrier without an apply pass: its reduce segment makes it
                if part == "reduce" and unit_of[n] is n:
                    unit_of[n] = (s, g)
        for g, segment in enumerate(site_segments):
            for n, part in segment:
                if part == "reduce":  # reads the barrier's inputs; its apply pass comes after it
                    reduced_in[n] = (s, g)
                    needs.setdefault((s, g), set()).update(unit_of[a] for a in n.all_input_nodes)
                    needs.setdefault(unit_of[n], set()).add((s, g))
    index = {n: i for i, n in enumerate(nodes)}
    first: dict[object, int] = {}
    for n in nodes:
        first.setdefault(unit_of[n], index[n])
    for unit, segment in members.items():
        first[unit] = min(index[n] for n, _ in segment)
    for n in nodes:
        for a in n.all_input_nodes:
            # (a barrier's statistics are made where it reduces, not by its apply pass)
            made_by = reduced_in[a] if a in reduced_in and unit_of[n] == reduced_in[a] else unit_of[a]
            needs.setdefault(unit_of[n], set()).add(made_by)
    users: dict[object, list] = {u: [] for u in first}
    waiting = {u: 0 for u in first}
    for u, deps in needs.items():
        for d in deps - {u}:
            users[d].append(u)
            waiting[u] += 1
    ready = [(first[u], i, u) for i, u in enumerate(first) if waiting[u] == 0]
    heapq.heapify(ready)
    tie, order = len(first), []
    while ready:
        _, _, unit = heapq.heappop(ready)
        order.append((unit, members.get(unit)))
        for u in users[unit]:
            waiting[u] -= 1
            if waiting[u] == 0:
                tie += 1
                heapq.heappush(ready, (first[u], tie, u))
    return order if len(order) == len(first) else None


__all__ = ["Entry", "segments", "convex", "run_order"]

"""Shared building block of the checkpointing baselines: a backward with recomputation.

Given the forward values kept across the forward/backward boundary, walk the backward
nodes in order; before each one, recompute whatever forward values it reads that are
not resident. Recomputation works by *segments* (a map forward node -> segment id):
the first time the backward misses a value of a segment, every value of that segment
the backward will read is recomputed together, from the nearest resident values.
With ``drop_after_each_op`` every recomputed forward value is forgotten after the
backward op (unless the next op reads it), which gives the smallest peak and the most
recomputation. Frees are left to :meth:`remat.plan.Plan.from_schedule` (last use).
"""

from __future__ import annotations

from ..graph import ACTIVATION, FORWARD, Graph


def crossing_values(graph: Graph, segment_of: dict[int, int]) -> set[int]:
    """Forward values produced in one segment and read by a forward node of a later one."""
    kept = set()
    for node in graph.forward_nodes:
        for v in node.inputs:
            p = graph.values[v].producer
            if p is not None and graph.values[v].kind == ACTIVATION and segment_of[p] < segment_of[node.id]:
                kept.add(v)
    return kept


def backward_with_recomputation(
    graph: Graph, *, kept: set[int], segment_of: dict[int, int], drop_after_each_op: bool
) -> list[int]:
    """The backward's node sequence, recomputations included (see module docstring)."""
    values, nodes = graph.values, graph.nodes

    def forward_made(v: int) -> bool:
        p = values[v].producer
        return p is not None and nodes[p].phase == FORWARD

    always = set(kept) | {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}
    for nid in graph.meta.get("no_backward_recompute", ()):
        if nodes[nid].phase == FORWARD:
            always.update(nodes[nid].outputs)  # cannot be recomputed in the backward: keep
    resident = set(always)
    segment_needs: dict[int, set[int]] = {}
    for b in graph.backward_nodes:
        for v in b.inputs:
            if forward_made(v):
                segment_needs.setdefault(segment_of[values[v].producer], set()).add(v)

    sequence: list[int] = []

    def ensure(targets) -> None:
        stack = [values[v].producer for v in targets if forward_made(v) and v not in resident]
        to_run: set[int] = set()
        expanded: set[int] = set()
        while stack:
            p = stack.pop()
            if p in to_run:
                continue
            to_run.add(p)
            seg = segment_of[p]
            if not drop_after_each_op and seg not in expanded:
                expanded.add(seg)
                stack.extend(values[v].producer for v in segment_needs.get(seg, ()) if v not in resident)
            for v in nodes[p].inputs:
                if forward_made(v) and v not in resident:
                    stack.append(values[v].producer)
        for p in sorted(to_run):  # node ids are topological
            sequence.append(p)
            resident.update(nodes[p].outputs)

    bwd = graph.backward_nodes
    for i, b in enumerate(bwd):
        ensure(b.inputs)
        sequence.append(b.id)
        resident.update(b.outputs)
        if drop_after_each_op:
            keep_next = set(bwd[i + 1].inputs) if i + 1 < len(bwd) else set()
            resident = {v for v in resident if not forward_made(v) or v in always or v in keep_next}
    return sequence

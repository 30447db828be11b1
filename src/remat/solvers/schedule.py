"""Shared building block of the checkpointing baselines: a backward with recomputation.

Given the forward values kept across the forward/backward boundary, walk the backward
nodes in order; before each one, recompute whatever forward values it reads that are
not resident. Recomputation works by *segments* (a map forward node -> segment id):
the first time the backward misses a value of a segment, every value of that segment
the backward will read is recomputed together, from the nearest resident values.
With ``drop_after_each_op`` every recomputed forward value is forgotten after the
backward op (unless the next op reads it), which gives the smallest peak and the most
recomputation. Frees are left to :meth:`remat.plan.Plan.from_schedule` (last use).

Also here: where segments may end (:func:`forward_articulation_points`, ``cuts`` =
``"linear"`` or ``"articulation"``), how to place cuts, and how a sweep picks its plan.
"""

from __future__ import annotations

from ..errors import SolverError
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
    recomputed: set[int] = set()  # resident forward values not in ``always``: what dropping may drop

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
            recomputed.update(v for v in nodes[p].outputs if v not in always)

    bwd = graph.backward_nodes
    for i, b in enumerate(bwd):
        ensure(b.inputs)
        sequence.append(b.id)
        resident.update(b.outputs)
        if drop_after_each_op:  # forward values not kept go unless the next op reads them
            keep_next = set(bwd[i + 1].inputs) if i + 1 < len(bwd) else set()
            gone = [v for v in recomputed if v not in keep_next]
            resident.difference_update(gone)
            recomputed.difference_update(gone)
    return sequence


# ---------------------------------------------------------------------------------- cut points
CUTS = ("linear", "articulation")


def check_cuts(cuts: str) -> str:
    """Validate the ``cuts`` option of the segment baselines."""
    if cuts not in CUTS:
        raise SolverError(
            f"cuts must be 'linear' (cut anywhere in the forward order) or 'articulation' "
            f"(cut only after articulation points), got {cuts!r}"
        )
    return cuts


def forward_articulation_points(graph: Graph, nodes=None, ignore=frozenset()) -> list[int]:
    """Forward nodes after which only their own outputs cross (node ids, in order).

    Node k is an articulation (cut) point when no forward activation produced by a node
    before k is read by a forward node after k: cutting the forward order right after k,
    the only values carried over are k's outputs. Parameters and user inputs (kind
    ``input``) never count, and neither do reads by backward nodes. The last forward node
    is always one (nothing comes after it). ``nodes``: the forward nodes to cut (default:
    all of them, in order); values in ``ignore`` do not block a cut.

    >>> # stem, then blocks h -> a -> c -> add(c, h), then a loss
    >>> [graph.nodes[k].name for k in forward_articulation_points(graph)]
    ['stem', 'add0', 'add1', 'add2', 'loss']
    """
    fwd = list(graph.forward_nodes if nodes is None else nodes)
    pos = {n.id: i for i, n in enumerate(fwd)}
    last_read: dict[int, int] = {}
    for i, n in enumerate(fwd):
        for v in n.inputs:
            if graph.values[v].kind == ACTIVATION and v not in ignore:
                last_read[v] = i
    # a value made at position p and last read at r > p + 1 blocks every k with p < k < r
    blocked = [0] * (len(fwd) + 1)
    for v, r in last_read.items():
        p = pos[graph.values[v].producer]
        if r - p >= 2:
            blocked[p + 1] += 1
            blocked[r] -= 1
    points, run = [], 0
    for i, n in enumerate(fwd):
        run += blocked[i]
        if run == 0:
            points.append(n.id)
    return points


def allowed_cuts(graph: Graph, cuts: str) -> list[int]:
    """Forward node ids after which a segment may end (the last forward node excluded)."""
    fwd = graph.forward_nodes
    last = fwd[-1].id if fwd else None
    points = [n.id for n in fwd] if check_cuts(cuts) == "linear" else forward_articulation_points(graph)
    return [k for k in points if k != last]


def segments_from_cuts(graph: Graph, cut_after) -> dict[int, int]:
    """Forward node id -> segment index, a new segment starting after each node of ``cut_after``."""
    cut_after = set(cut_after)
    segment_of, seg = {}, 0
    for n in graph.forward_nodes:
        segment_of[n.id] = seg
        if n.id in cut_after:
            seg += 1
    return segment_of


def equal_cost_segments(graph: Graph, count: int) -> dict[int, int]:
    """Split the forward order into ``count`` runs of about equal compute (node id -> segment)."""
    fwd = graph.forward_nodes
    total = sum(max(n.cost, 1e-12) for n in fwd)
    segment_of, acc = {}, 0.0
    for n in fwd:
        segment_of[n.id] = min(count - 1, int(acc / total * count))
        acc += max(n.cost, 1e-12)
    return segment_of


def equal_cost_cuts(graph: Graph, count: int, allowed) -> list[int]:
    """Up to ``count - 1`` nodes of ``allowed`` splitting the forward into runs of about equal
    cost: each cut of :func:`equal_cost_segments` moved to the allowed node whose cumulative
    cost is nearest (so with every node allowed the segments are exactly those)."""
    allowed = sorted(set(allowed))
    if count <= 1 or not allowed:
        return []
    fwd = graph.forward_nodes
    cum, acc = {}, 0.0
    for n in fwd:
        acc += max(n.cost, 1e-12)
        cum[n.id] = acc
    segment_of = equal_cost_segments(graph, count)
    ideal = [a.id for a, b in zip(fwd, fwd[1:]) if segment_of[b.id] != segment_of[a.id]]
    return sorted({min(allowed, key=lambda k: (abs(cum[k] - cum[c]), k)) for c in ideal})


def prune_unread(graph: Graph, sequence: list[int], needed: set[int]) -> list[int]:
    """``sequence`` without the forward computations whose outputs nothing reads before they are
    computed again (walking backwards from the end, where the values in ``needed`` must exist).
    ``needed`` is updated in place to what must exist before the sequence starts."""
    kept: list[int] = []
    for nid in reversed(sequence):
        node = graph.nodes[nid]
        if node.phase == FORWARD and not any(v in needed for v in node.outputs):
            continue
        needed.difference_update(node.outputs)
        needed.update(v for v in node.inputs if graph.values[v].kind == ACTIVATION)
        kept.append(nid)
    kept.reverse()
    return kept


def cheapest_fitting(plans, budget_bytes: int | None):
    """The plan a sweep returns: the least compute (then the smallest peak) among the plans
    within ``budget_bytes`` (all of them when it is None); if none fits, the smallest peak."""
    plans = list(plans)
    fitting = [p for p in plans if budget_bytes is None or p.peak_bytes <= budget_bytes]
    if fitting:
        return min(fitting, key=lambda p: (p.compute_seconds, p.peak_bytes))
    return min(plans, key=lambda p: (p.peak_bytes, p.compute_seconds))

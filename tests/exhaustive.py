"""Exhaustive search over frontier-advancing plans, independent of the MILP, for small graphs.

The plan space is the MILP's: nodes are first computed in graph order; before each first
computation, forward nodes may be recomputed, each at most once and in increasing order;
backward nodes run once; a node with a forward output is not recomputed. Frees of forward
activations are free choices; everything else dies at its last use. Dijkstra over states
(stage, last node recomputed in the stage, resident forward activations) with compute
cost as distance finds the cheapest plan whose every compute fits the budget. The plan
found is rebuilt with ``Plan.from_schedule`` and checked by the simulator.
"""

from __future__ import annotations

import heapq
import itertools

from remat.graph import ACTIVATION, FORWARD, Graph
from remat.plan import Plan


def cheapest_plan(graph: Graph, budget: int) -> Plan | None:
    values, nodes, users = graph.values, graph.nodes, graph.users
    n, F = len(nodes), len(graph.forward_nodes)
    pinned = {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}
    pinned_nodes = {values[v].producer for v in pinned}
    no_bwd = set(graph.meta.get("no_backward_recompute", ()))
    outputs = set(graph.backward_outputs)

    def last_use(v):
        return max(users[v], default=-1)

    def constant(t: int) -> int:
        """Bytes resident at stage t that are not free choices."""
        total = sum(values[v].bytes for v in pinned if values[v].producer < t)
        for node in graph.backward_nodes:
            if node.id < t:
                total += sum(values[v].bytes for v in node.outputs if v in outputs or last_use(v) >= t)
        if t >= F:
            total += sum(values[v].bytes for v in graph.tangents if v in outputs or last_use(v) >= t)
        return total

    consts = [constant(t) for t in range(n)]

    def available(v, t, res) -> bool:
        kind, p = values[v].kind, values[v].producer
        if kind != ACTIVATION:
            return True
        if nodes[p].phase != FORWARD or v in pinned:
            return True
        return v in res

    def can_run(i, t, res) -> bool:
        return all(available(v, t, res) for v in nodes[i].inputs)

    def mem(i, t, res) -> int:
        out = sum(values[v].bytes for v in nodes[i].outputs)
        return consts[t] + sum(values[v].bytes for v in res) + out + nodes[i].workspace

    def produced(i):
        return {v for v in nodes[i].outputs if nodes[i].phase == FORWARD and v not in pinned}

    start = (0, -1, frozenset())
    dist = {start: 0.0}
    parent: dict = {start: None}
    counter = itertools.count()
    heap = [(0.0, next(counter), start)]
    while heap:
        d, _, state = heapq.heappop(heap)
        if d > dist[state]:
            continue
        t, last, res = state
        if t == n:
            steps = []
            s = state
            while parent[s] is not None:
                s, node = parent[s]
                if node is not None:
                    steps.append((s[0], node))  # (stage, node)
            steps.reverse()
            fwd = [i for stage, i in steps if stage < F]
            bwd = [i for stage, i in steps if stage >= F]
            return Plan.from_schedule(graph, fwd, bwd, info={"exhaustive cost": d})
        moves = []
        for v in res:  # drop a value
            moves.append((0.0, (t, last, res - {v}), None))
        for i in range(last + 1, min(t, F)):  # recompute
            if i in pinned_nodes or (t >= F and i in no_bwd) or produced(i) & res:
                continue
            if can_run(i, t, res) and mem(i, t, res) <= budget:
                moves.append((nodes[i].cost, (t, i, res | produced(i)), i))
        if can_run(t, t, res) and mem(t, t, res) <= budget:  # first computation of node t
            moves.append((nodes[t].cost, (t + 1, -1, res | produced(t)), t))
        for cost, nxt, node in moves:
            nd = d + cost
            if nd < dist.get(nxt, float("inf")) - 1e-12:
                dist[nxt] = nd
                parent[nxt] = (state, node)
                heapq.heappush(heap, (nd, next(counter), nxt))
    return None


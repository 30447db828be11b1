"""Coarsening: plan over module-level nodes, as Checkmate's layer graphs did, then expand to ops.

A full-graph MILP grows with the square of the node count; a captured CNN has several
ops per layer. :func:`coarsen_graph` groups them:

* forward: maximal runs of consecutive forward ops whose module path, cut to ``depth``
  components (``"module"``: the whole innermost path), is the same; level ``(depth, k)``
  merges every ``k`` consecutive runs into one group; an op that reads an input the step
  mutates (never recomputed in the backward) is a group of its own;
* backward: each op joins the group of the newest forward value it reads (ops that read
  none join their predecessor's group); consecutive ops of one group form a node.

A group becomes one node: its inputs are what its ops read from outside, its outputs what
is read outside or is a graph output; values that live and die inside vanish. Its cost is
the sum of its ops' costs; its workspace is the peak of running its ops alone (freeing the
values that die inside at their last use) minus its outputs — so the coarse graph never
under-states memory. Runs are contiguous in a topological order, hence convex: the coarse
graph is a DAG in the same order. :meth:`Coarsened.expand` replaces each coarse compute by
its ops and lets :meth:`~remat.plan.Plan.from_schedule` free values at their last use, so
the expanded plan peaks no higher than the coarse one predicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import SolverError
from ..graph import BACKWARD, FORWARD, Graph, Node, Value
from ..plan import Plan

AUTO_MAX_NODES = 160  # "auto" coarsens graphs larger than this, as little as gets them under it


@dataclass
class Coarsened:
    graph: Graph  # the coarse graph
    members: list[list[int]]  # coarse node id -> original node ids, in order
    original: Graph
    level: object

    def expand(self, coarse_plan: Plan, **plan_kwargs) -> Plan:
        """The op-level plan running each coarse node's ops where the coarse plan runs it."""
        coarse_forward, coarse_backward = coarse_plan.schedule()
        forward = [op for c in coarse_forward for op in self.members[c]]
        backward = [op for c in coarse_backward for op in self.members[c]]
        info = dict(coarse_plan.info)
        info["coarsened"] = f"{len(self.graph.nodes)} module-level nodes from {len(self.original.nodes)} ops (level {self.level})"
        info["coarse peak"] = coarse_plan.peak_bytes
        return Plan.from_schedule(self.original, forward, backward, info=info, **plan_kwargs)


def _module_key(module: str, depth) -> str:
    if depth == "module":
        return module
    parts = module.split(".")
    return ".".join(parts[: 1 + int(depth)])  # the first part is the root ("L['model']")


def _split_level(level) -> tuple[object, int]:
    """``"module"``, an int depth, or ``(depth, k)``: k consecutive groups of that depth merged."""
    if isinstance(level, tuple):
        return level[0], int(level[1])
    return level, 1


def group_nodes(graph: Graph, level) -> list[list[int]]:
    """Consecutive node runs per the rules in the module docstring."""
    values, nodes = graph.values, graph.nodes
    depth, merge = _split_level(level)
    runs: list[list[int]] = []
    key_prev = None
    for node in graph.forward_nodes:
        key = _module_key(node.module, depth)
        if not runs or key != key_prev:
            runs.append([])
        runs[-1].append(node.id)
        key_prev = key
    merged = [sum(runs[i : i + merge], []) for i in range(0, len(runs), merge)]
    # an op that reads an input the step mutates (a BatchNorm's batch counter) can never be
    # recomputed in the backward; alone, it does not pin the rest of its group
    pinned = set(graph.meta.get("no_backward_recompute", ()))
    groups = []
    for members in merged:
        current: list[int] = []
        for nid in members:
            if nid in pinned:
                groups.extend([current] if current else [])
                groups.append([nid])
                current = []
            else:
                current.append(nid)
        groups.extend([current] if current else [])
    group_of = {nid: g for g, members in enumerate(groups) for nid in members}
    key_prev = None
    for node in graph.backward_nodes:
        producers = [values[v].producer for v in node.inputs if values[v].producer is not None]
        fwd = [p for p in producers if nodes[p].phase == FORWARD]
        key = group_of[max(fwd)] if fwd else key_prev
        if key_prev is None or key != key_prev or nodes[groups[-1][-1]].phase != BACKWARD:
            groups.append([])
        groups[-1].append(node.id)
        key_prev = key
    return groups


def coarsen_graph(graph: Graph, depth="module") -> Coarsened:
    """The coarse graph of ``graph`` at ``depth`` (``"module"`` or an int)."""
    groups = group_nodes(graph, depth)
    return Coarsened(graph_of_groups(graph, groups, name=f"{graph.name} (coarse)"), groups, graph, depth)


def graph_of_groups(graph: Graph, groups: list[list[int]], *, name: str,
                    workspace_of: Callable[[Graph, list[int], set[int]], int] | None = None) -> Graph:
    """The graph whose node ``g`` runs the ops ``groups[g]`` (in topological order of groups).

    ``workspace_of(graph, members, escaping)`` gives a group's workspace; by default the peak
    of running its ops alone beyond its escaping outputs (see the module docstring)."""
    workspace_of = workspace_of or _group_workspace
    values, nodes, users = graph.values, graph.nodes, graph.users
    group_of = {nid: g for g, members in enumerate(groups) for nid in members}
    graph_outputs = set(graph.forward_outputs) | set(graph.backward_outputs)

    new_values: list[Value] = []
    new_id: dict[int, int] = {}

    def add_value(v: int, producer: int | None) -> int:
        if v not in new_id:
            old = values[v]
            new_id[v] = len(new_values)
            new_values.append(Value(len(new_values), old.name, old.bytes, old.kind, producer, old.shape, old.dtype))
        return new_id[v]

    for v in values:
        if v.producer is None:
            add_value(v.id, None)
    new_nodes: list[Node] = []
    rng_ops = 1
    for g, members in enumerate(groups):
        member_set = set(members)
        inputs: list[int] = []
        escaping: list[int] = []
        for nid in members:
            for v in nodes[nid].inputs:
                p = values[v].producer
                if (p is None or p not in member_set) and v not in inputs:
                    inputs.append(v)
            for v in nodes[nid].outputs:
                if v in graph_outputs or any(group_of[u] != g for u in users[v]):
                    escaping.append(v)
        workspace = workspace_of(graph, members, set(escaping))
        first = nodes[members[0]]
        outs = tuple(add_value(v, g) for v in escaping)
        rng_ops = max(rng_ops, sum(1 for nid in members if nodes[nid].random))
        new_nodes.append(
            Node(
                g,
                first.name if len(members) == 1 else f"{first.name}..{nodes[members[-1]].name}",
                first.op if len(members) == 1 else "group",
                tuple(new_id[v] for v in inputs),
                outs,
                first.phase,
                sum(nodes[nid].cost for nid in members),
                workspace,
                any(nodes[nid].random for nid in members),
                first.module,
            )
        )
    meta = dict(graph.meta)
    # a coarse node is judged without in-place reuse inside it (only ever an overestimate); the
    # plan expanded back onto ``graph`` is simulated with it
    for key in ("inplace_reuse", "inplace_conflicts", "inductor_kernels"):
        meta.pop(key, None)
    if "rng_state_bytes" in meta:
        meta["rng_state_bytes"] = int(meta["rng_state_bytes"]) * rng_ops
    if "no_backward_recompute" in meta:
        meta["no_backward_recompute"] = sorted({group_of[n] for n in meta["no_backward_recompute"]})
    if "optimizer_updates" in meta:
        meta["optimizer_updates"] = [[group_of[n], new_id[v]] for n, v in meta["optimizer_updates"] if v in new_id]
    if "grad_inputs" in meta:  # inputs keep their values (renumbered)
        meta["grad_inputs"] = sorted(new_id[v] for v in meta["grad_inputs"] if v in new_id)
    return Graph(
        tuple(new_nodes),
        tuple(new_values),
        tuple(new_id[v] for v in graph.forward_outputs),
        tuple(new_id[v] for v in graph.backward_outputs),
        name,
        meta,
    )


def _group_workspace(graph: Graph, members: list[int], escaping: set[int]) -> int:
    """Peak of running ``members`` alone, beyond the bytes of the escaping outputs."""
    values, nodes, users = graph.values, graph.nodes, graph.users
    member_set = set(members)
    last_use = {}
    for nid in members:
        for v in nodes[nid].inputs + nodes[nid].outputs:
            last_use[v] = nid
    live = peak = 0
    for nid in members:
        out = sum(values[v].bytes for v in nodes[nid].outputs)
        peak = max(peak, live + out + nodes[nid].workspace)
        live += out
        for v, last in last_use.items():
            p = values[v].producer
            if last == nid and p in member_set and v not in escaping and all(u in member_set for u in users[v]):
                live -= values[v].bytes
    return max(0, peak - sum(values[v].bytes for v in escaping))


def resolve_level(graph: Graph, coarsen) -> object | None:
    """The depth to coarsen at: None (not at all), "module", or an int.

    ``"auto"``: none for graphs of at most ``AUTO_MAX_NODES`` nodes, else module-level groups,
    merged ``k`` consecutive forward groups at a time with the smallest ``k`` that brings the
    graph under that size.
    """
    if coarsen in (None, False, "none"):
        return None
    if coarsen in ("module",) or isinstance(coarsen, (int, tuple)) and not isinstance(coarsen, bool):
        return coarsen
    if coarsen != "auto":
        raise SolverError(f"unknown coarsen option {coarsen!r}; use None, 'auto', 'module' or a module depth (int)")
    if len(graph.nodes) <= AUTO_MAX_NODES:
        return None
    sizes = {}
    for merge in range(1, 17):
        sizes[merge] = len(group_nodes(graph, ("module", merge)))
        if sizes[merge] <= AUTO_MAX_NODES:
            break
    merge = min(sizes, key=lambda k: (sizes[k] > AUTO_MAX_NODES, sizes[k] if sizes[k] > AUTO_MAX_NODES else k))
    return "module" if merge == 1 else ("module", merge)


def planned_on_coarse_graph(graph: Graph, coarsen, solve: Callable[[Graph], Plan], *, solver: str) -> Plan:
    """``solve`` on ``graph`` coarsened as ``coarsen`` says, expanded back to ``graph``'s ops."""
    level = resolve_level(graph, coarsen)
    if level is None:
        plan = solve(graph)
        plan.solver = solver
        return plan
    coarse = coarsen_graph(graph, level)
    coarse_plan = solve(coarse.graph)
    plan = coarse.expand(coarse_plan, solver=solver)
    status = str(plan.info.get("status", ""))
    if status.startswith("infeasible"):
        # the coarse model over-states memory: its smallest-peak plan may fit once expanded
        plan.info["status"] = "smallest peak of the coarse graph (the coarse model found no plan within the budget)"
    return plan


__all__ = ["coarsen_graph", "graph_of_groups", "group_nodes", "resolve_level", "planned_on_coarse_graph", "Coarsened", "AUTO_MAX_NODES"]

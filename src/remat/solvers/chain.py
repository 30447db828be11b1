"""A training graph as a chain of stages: what Rotor's and Rockmate's dynamic programs plan over.

The forward is cut after its *articulation points* (nodes after which only their own outputs
are read further on); the ops between two cuts form a stage, and the backward ops are dealt
out to the stages so that stage ``k``'s backward ``B_k`` reads only stage ``k``'s forward
values, its input ``x_{k-1}`` and its output ``x_k``::

    x_0 ─F_1→ x_1 ─F_2→ x_2 … ─F_L→ loss          B_L, B_{L-1}, …, B_1 run in that order

* **Constant ops** — forward ops that read nothing differentiable (masks from ``arange``,
  position ids, a BatchNorm step counter) — are not part of any stage: they run once, first,
  and their outputs stay until their last use. Ignoring them is what lets a transformer's
  layers be separate stages although every layer reads the causal mask.
* **Backward ops** are dealt out by what they read: reading an inner value of stage ``k`` pins
  an op to ``k``, reading ``x_k`` allows ``k`` or ``k+1``, reading a gradient made in ``B_j``
  requires ``≤ j``. An op reading only gradients goes to the latest stage allowed (it runs as
  soon as its inputs exist), unless that frees nothing (then it waits for its readers' stage).
  An op reading ``x_k`` may go either way, and neither is always better: deal ``"newest"``
  puts it in stage ``k`` (a ReLU's backward with the ReLU), deal ``"earliest"`` in ``k+1`` (a
  layer's weight gradient with the layer reading ``x_k``); the planners try both. Where the
  rules contradict each other the stages in between are merged and the deal is redone.
* Stage ``k`` as a graph of its own (:meth:`Chain.block_graph`): ``x_{k-1}`` and constants
  are inputs (not counted), gradients flowing in from later stages are tangents, ``x_k``
  and what later stages' backward read are its forward and backward outputs.

``H[k]`` is the memory of gradient-side values (tangents, parameter gradients, partial
gradients of shared weights) alive when ``B_k`` starts; the chain DPs charge it to every
moment of reversing stages ``≤ k``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from ..errors import SolverError
from .schedule import forward_articulation_points
from ..graph import ACTIVATION, BACKWARD, FORWARD, INPUT, TANGENT, Graph, Node, Value

MAX_STAGES = 96  # more stages are merged (whole periods, else cheapest neighbours first): the DP is cubic in them
DEALS = ("newest", "earliest")  # how backward ops reading a stage's output are dealt (see docstring)


@dataclass(frozen=True)
class Stage:
    index: int  # 0-based position in the chain
    forward: tuple[int, ...]  # forward node ids, in order
    backward: tuple[int, ...]  # backward node ids, in order
    inputs: tuple[int, ...]  # x_{k-1}: activations of the previous stage read here
    outputs: tuple[int, ...]  # x_k: activations of this stage read by later stages
    recomputable: bool  # no op here that the backward needs reads an input the step mutates


@dataclass
class Chain:
    """A graph cut into stages (see the module docstring)."""

    graph: Graph
    stages: list[Stage]
    constant_nodes: tuple[int, ...]
    constant_bytes: int  # constant-op values read by the stages, kept all step (conservative)
    pinned_bytes: int  # the graph's forward outputs, held by the user from the forward on
    held_backward: list[int]  # H[k]: gradient-side bytes alive when B_k starts
    consumed_backward: list[int] = field(default_factory=list)  # of H[k], bytes whose last reader is in B_k
    first_run_only: frozenset = frozenset()  # forward ops a stage's recomputation skips (see first_run_only)
    _blocks: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def length(self) -> int:
        return len(self.stages)

    def block_graph(self, k: int) -> "Block":
        """Stage ``k`` as a Graph of its own, with the maps between its ids and the chain's."""
        if k not in self._blocks:
            self._blocks[k] = _block_graph(self, k)
        return self._blocks[k]


@dataclass
class Block:
    """One stage as a standalone Graph (``graph``); ``nodes[i]`` is the chain-graph id of local node ``i``."""

    graph: Graph
    tail_graph: Graph  # the same, with x_k no forward output: the stage when it ends a segment
    nodes: tuple[int, ...]
    input_values: frozenset  # local ids of x_{k-1}
    output_values: frozenset  # local ids of x_k
    pinned_bytes: int  # the chain graph's forward outputs made here (also counted by the chain)

    @cached_property
    def local_id(self) -> dict[int, int]:
        return {g: i for i, g in enumerate(self.nodes)}

    @cached_property
    def key(self) -> tuple:
        """Equal keys: identical blocks (same ops, shapes, edges and costs) that share one plan menu."""
        return self.graph.planning_key + (tuple(sorted(self.input_values)), tuple(sorted(self.output_values)))

    def to_chain_ids(self, local_nodes) -> list[int]:
        return [self.nodes[i] for i in local_nodes]


# ------------------------------------------------------------------------------ decomposition
def differentiable_nodes(graph: Graph) -> set[int]:
    """Forward nodes that read (transitively) an input the step differentiates.

    ``graph.meta['grad_inputs']`` (set by capture) lists those inputs; without it every input counts.
    """
    values = graph.values
    grad_inputs = graph.meta.get("grad_inputs")
    live = set(grad_inputs) if grad_inputs is not None else {v.id for v in values if v.kind == INPUT}
    nodes = set()
    for n in graph.forward_nodes:
        if any(v in live for v in n.inputs):
            nodes.add(n.id)
            live.update(n.outputs)
    return nodes


def first_run_only(graph: Graph) -> frozenset[int]:
    """Forward ops that read, directly or through each other, an input the step mutates, and that no
    backward op needs (transitively): BatchNorm's running-statistics updates once Inductor has
    decomposed the op (``running_mean * (1 - m) + batch_mean * m``). They run in the forward pass
    only: their outputs are forward outputs (written back into the buffers after the forward), and
    running them again in the backward would read the buffers already updated. A stage's
    recomputation skips them, so they do not make the stage unrecomputable."""
    nodes, values = graph.nodes, graph.values
    pinned = set(graph.meta.get("no_backward_recompute", ()))
    if not pinned:
        return frozenset()
    needed: set[int] = set()
    stack = [v for b in graph.backward_nodes for v in b.inputs]
    while stack:
        p = values[stack.pop()].producer
        if p is not None and p not in needed and nodes[p].phase == FORWARD:
            needed.add(p)
            stack.extend(nodes[p].inputs)
    tainted = set(pinned)
    made_by_tainted: set[int] = set()
    for n in graph.forward_nodes:
        if n.id in tainted or any(v in made_by_tainted for v in n.inputs):
            tainted.add(n.id)
            made_by_tainted.update(n.outputs)
    return frozenset(tainted - needed)


def _cut_points(graph: Graph, body: list[Node], ignore: set[int]) -> list[int]:
    """Positions in ``body`` after which a stage may end (its articulation points, the last excluded)."""
    pos = {n.id: i for i, n in enumerate(body)}
    return [pos[k] for k in forward_articulation_points(graph, body, ignore)][:-1]


def decompose(graph: Graph, *, deal: str = "newest", max_stages: int = MAX_STAGES) -> Chain:
    """Cut ``graph`` into a chain of stages (see the module docstring); ``deal``: one of ``DEALS``."""
    if deal not in DEALS:
        raise ValueError(f"deal must be one of {DEALS}, got {deal!r}")
    deal_rule = deal
    nodes = graph.nodes
    differentiable = differentiable_nodes(graph)
    body = [n for n in graph.forward_nodes if n.id in differentiable]
    constant_nodes = tuple(n.id for n in graph.forward_nodes if n.id not in differentiable)
    constant_values = {v for nid in constant_nodes for v in nodes[nid].outputs}
    if not body:
        raise SolverError(f"{graph.name!r} has no forward op that needs a gradient: nothing to plan")
    cuts = set(_cut_points(graph, body, constant_values))
    if len(cuts) + 1 > max_stages:  # a model of repeated layers: merge whole periods, alike
        cuts = _periodic_cuts(graph, body, cuts, max_stages)
    stage_of, deal = _settle(graph, body, cuts, deal_rule)
    while len(cuts) + 1 > max_stages:  # merge the cheapest adjacent pair
        order = sorted(cuts)
        cost = _stage_costs(body, order)
        k = min(range(len(order)), key=lambda i: (cost[i] + cost[i + 1], i))
        cuts.discard(order[k])
        stage_of, deal = _settle(graph, body, cuts, deal_rule)
    return _build_chain(graph, body, stage_of, deal, constant_nodes, constant_values)


PERIODIC_SHARE = 0.75  # merge by periods when the stages of one kind hold at least this share of the ops


def _periodic_cuts(graph: Graph, body: list[Node], cuts: set[int], max_stages: int) -> set[int]:
    """The cuts that merge every ``g`` consecutive stages (from an offset ``o``, the first ``o`` stages
    one stage of their own), for the smallest ``g`` that leaves at most ``max_stages`` stages, the alike
    ones (same ops, costs and sizes) holding at least ``PERIODIC_SHARE`` of the ops; ``cuts`` unchanged if
    none does.

    Merging the cheapest pairs one at a time would merge a transformer's first layers and leave the
    rest split in two: five kinds of stages instead of three, each a block menu to solve, and more
    stages for the DP, which is cubic in them. Merged by periods, the layers stay identical."""
    order = sorted(cuts)
    ends = order + [len(body) - 1]
    values = graph.values
    signature, start = [], 0
    for end in ends:
        signature.append(tuple((n.op, n.cost, tuple(values[v].bytes for v in n.outputs))
                               for n in body[start:end + 1]))
        start = end + 1
    n = len(signature)
    for g in range(2, n):
        best = None
        for o in range(g):
            groups = ([(0, o)] if o else []) + [(a, min(a + g, n)) for a in range(o, n, g)]
            if len(groups) > max_stages:
                continue
            kinds: dict[tuple, int] = {}  # kind of merged stage -> its ops, over the stages of that kind
            for a, b in groups:
                kind = tuple(signature[a:b])
                kinds[kind] = kinds.get(kind, 0) + sum(len(x) for x in kind)
            alike = max(kinds.values())
            if alike >= PERIODIC_SHARE * len(body) and (best is None or alike > best[0]):
                best = (alike, groups)
        if best is not None:
            return {ends[b - 1] for _, b in best[1][:-1]}
        if (n + g - 1) // g <= max_stages // 2:  # coarser groups would only merge more
            break
    return cuts


def _settle(graph: Graph, body: list[Node], cuts: set[int], rule: str) -> tuple[dict[int, int], dict[int, int]]:
    """Stage numbers and the backward deal, dropping (in place) the cuts the deal cannot respect."""
    while True:
        stage_of = _stage_numbers(body, cuts)
        deal = _deal_backward(graph, stage_of, body, rule)
        if not isinstance(deal, tuple):
            return stage_of, deal
        lo, hi = deal  # merge stages lo..hi
        cuts -= {p for p, n in enumerate(body) if lo <= stage_of[n.id] < hi}


def _stage_numbers(body: list[Node], cuts: set[int]) -> dict[int, int]:
    stage_of, k = {}, 0
    for p, n in enumerate(body):
        stage_of[n.id] = k
        if p in cuts:
            k += 1
    return stage_of


def _stage_costs(body: list[Node], order: list[int]) -> list[float]:
    costs, acc, cut_iter = [], 0.0, iter(order + [len(body) - 1])
    nxt = next(cut_iter)
    for p, n in enumerate(body):
        acc += n.cost
        if p == nxt:
            costs.append(acc)
            acc = 0.0
            nxt = next(cut_iter, None)
    return costs


def _deal_backward(graph: Graph, stage_of: dict[int, int], body: list[Node], deal: str):
    """Backward node id -> stage, or (lo, hi) when stages lo..hi must merge (see module docstring)."""
    values = graph.values
    last = max(stage_of.values())
    # a stage's output values: made by its last node, read by the next stage's forward
    interface = {}
    for n in body:
        for v in n.inputs:
            p = values[v].producer
            if p in stage_of and stage_of[p] < stage_of[n.id]:
                interface[v] = stage_of[p]
    stage: dict[int, int] = {}
    for b in graph.backward_nodes:
        lo, hi = 0, last
        reads_forward = False
        for v in b.inputs:
            p = values[v].producer
            if p is None:
                continue
            if p in stage_of:
                k = stage_of[p]
                reads_forward = True
                lo = max(lo, k)
                hi = min(hi, k + 1 if v in interface else k)
            elif p in stage:  # a gradient made by an earlier backward op
                hi = min(hi, stage[p])
        if hi < lo:
            return (hi, lo)
        # with the stage of the newest forward value it reads (those can go right after);
        # an op reading only gradients runs as early as they exist
        stage[b.id] = hi if (deal == "earliest" or not reads_forward) else lo
    _defer_gradient_ops(graph, stage, stage_of)
    return stage


def _defer_gradient_ops(graph: Graph, stage: dict[int, int], stage_of: dict[int, int]) -> None:
    """Move an op that reads only gradients down to its readers' stage when running it early frees
    nothing (every gradient it reads is read again there anyway): its outputs then live shorter.
    (A linear layer's grad-input matmul waits for the stage that consumes it; a residual add of
    two gradients still runs early, freeing both.)"""
    values, nodes, users = graph.values, graph.nodes, graph.users
    for b in reversed(graph.backward_nodes):
        if any(values[v].producer in stage_of for v in b.inputs):
            continue  # reads forward values: stays with them
        readers = [stage[u] for v in b.outputs for u in users[v]]
        if not readers:
            continue
        late = max(readers)
        if late >= stage[b.id]:
            continue
        gradients = [v for v in b.inputs if values[v].kind == TANGENT
                     or (values[v].producer is not None and nodes[values[v].producer].phase == BACKWARD)]
        if all(any(u != b.id and stage[u] <= late for u in users[v]) for v in gradients):
            stage[b.id] = late


def _build_chain(graph, body, stage_of, deal, constant_nodes, constant_values) -> Chain:
    values, nodes, users = graph.values, graph.nodes, graph.users
    count = max(stage_of.values()) + 1
    forward = [[] for _ in range(count)]
    backward = [[] for _ in range(count)]
    for n in body:
        forward[stage_of[n.id]].append(n.id)
    for b in graph.backward_nodes:
        backward[deal[b.id]].append(b.id)
    once = first_run_only(graph)
    no_recompute = set(graph.meta.get("no_backward_recompute", ())) - once
    stages = []
    for k in range(count):
        ins = []
        for nid in forward[k]:
            for v in nodes[nid].inputs:
                p = values[v].producer
                if p in stage_of and stage_of[p] < k and v not in ins:
                    ins.append(v)
        outs = []
        for nid in forward[k]:
            for v in nodes[nid].outputs:
                readers = users[v]
                if any(u in stage_of and stage_of[u] > k for u in readers) or any(
                    nodes[u].phase == BACKWARD and deal[u] > k for u in readers
                ):
                    outs.append(v)
        stages.append(Stage(k, tuple(forward[k]), tuple(backward[k]), tuple(ins), tuple(outs),
                            not (set(forward[k]) & no_recompute)))
    # constants read by stage ops are kept all step
    stage_nodes = {nid for s in stages for nid in s.forward + s.backward}
    constant_bytes = sum(
        values[v].bytes for v in constant_values if any(u in stage_nodes for u in users[v])
    )
    pinned = sum(values[v].bytes for v in graph.forward_outputs if values[v].kind == ACTIVATION)
    # gradient-side values: made in B_p (tangents: before B_{L-1}), last read in B_q (pinned: never freed)
    held = [0] * count
    consumed = [0] * count
    backward_outputs = set(graph.backward_outputs)
    for v in values:
        if v.kind == TANGENT:
            made = count  # present from the start of the backward
        elif v.producer is not None and nodes[v.producer].phase == BACKWARD:
            made = deal[v.producer]
        else:
            continue
        readers = [deal[u] for u in users[v.id] if nodes[u].phase == BACKWARD]
        last = 0 if (v.id in backward_outputs or not readers) else min(readers)
        if v.kind == TANGENT and not readers and v.id not in backward_outputs:
            last = count - 1  # an unused tangent: dropped at once (counted at the boundary only)
        for k in range(last, min(made, count)):
            held[k] += v.bytes
        if readers and v.id not in backward_outputs and min(readers) < made:
            consumed[min(readers)] += v.bytes
    return Chain(graph, stages, constant_nodes, constant_bytes, pinned, held, consumed, once)


def _block_graph(chain: Chain, k: int) -> Block:
    graph, stage = chain.graph, chain.stages[k]
    values, nodes, users = graph.values, graph.nodes, graph.users
    members = stage.forward + stage.backward
    member_set = set(members)
    constant = set(chain.constant_nodes)
    previous_stage: set[int] = set()  # local ids of x_{k-1}: activations of earlier stages read here
    local: dict[int, int] = {}
    new_values: list[Value] = []

    def add(v: int, kind: str, producer) -> int:
        old = values[v]
        local[v] = len(new_values)
        new_values.append(Value(len(new_values), old.name, old.bytes, kind, producer, old.shape, old.dtype))
        return local[v]

    for nid in members:  # outside values first: inputs and tangents
        for v in nodes[nid].inputs:
            if v in local:
                continue
            p = values[v].producer
            if p in member_set:
                continue
            if values[v].kind == TANGENT or (p is not None and nodes[p].phase == BACKWARD):
                add(v, TANGENT, None)
            else:  # parameters, user inputs, constants, x_{k-1}
                add(v, INPUT, None)
                if p is not None and p not in constant:
                    previous_stage.add(local[v])
    new_nodes: list[Node] = []
    for i, nid in enumerate(members):
        n = nodes[nid]
        ins = tuple(local[v] for v in n.inputs)
        outs = tuple(add(v, ACTIVATION, i) for v in n.outputs)
        new_nodes.append(Node(i, n.name, n.op, ins, outs, n.phase, n.cost, n.workspace, n.random, n.module))
    graph_fwd_out = set(graph.forward_outputs)
    graph_bwd_out = set(graph.backward_outputs)
    forward_outputs, backward_outputs = [], []
    for nid in members:
        for v in nodes[nid].outputs:
            outside = any(u not in member_set for u in users[v])
            if nodes[nid].phase == FORWARD and (outside or v in graph_fwd_out):
                forward_outputs.append(local[v])
            elif nodes[nid].phase == BACKWARD and (outside or v in graph_bwd_out):
                backward_outputs.append(local[v])
    meta = {k2: graph.meta[k2] for k2 in ("rng_state_bytes", "device") if k2 in graph.meta}
    pos = {g: i for i, g in enumerate(members)}
    meta["no_backward_recompute"] = sorted(pos[n] for n in graph.meta.get("no_backward_recompute", ()) if n in pos)
    meta["optimizer_updates"] = [[pos[n], local[v]] for n, v in graph.meta.get("optimizer_updates", ())
                                 if n in pos and v in local]
    block = Graph(tuple(new_nodes), tuple(new_values), tuple(forward_outputs), tuple(backward_outputs),
                  f"{graph.name} stage {k}", meta)
    # the stage as the last of a segment: later stages are done, x_k is needed only by B_k
    graph_out_local = {local[v] for v in graph_fwd_out if v in local}
    tail_outputs = [v for v in forward_outputs if v in graph_out_local]
    tail = Graph(tuple(new_nodes), tuple(new_values), tuple(tail_outputs), tuple(backward_outputs),
                 f"{graph.name} stage {k} (tail)", meta)
    pinned = sum(values[v].bytes for v in graph.forward_outputs if v in local and values[v].kind == ACTIVATION
                 and values[v].producer in member_set)
    return Block(
        block,
        tail,
        members,
        frozenset(previous_stage),
        frozenset(local[v] for v in stage.outputs),
        pinned,
    )


__all__ = ["Chain", "Stage", "Block", "decompose", "differentiable_nodes", "first_run_only", "MAX_STAGES"]

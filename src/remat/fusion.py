"""Inductor's fusion, as a graph remat plans on: which values a compiled step materialises.

Inductor turns pointwise ops into loop bodies that it inlines into their consumers: a
pointwise value read by one pointwise op or reduction is computed inside the consumer's
kernel and never exists in memory, while the consumer's kernel reads the producer's inputs.
remat plans the compiled step on a *fused graph* that says the same:

* a node is **inlined** into its consumer when it is a pointwise op (``Tag.pointwise``, or a
  tensor factory / dtype conversion Inductor lowers the same way), its one output is not a
  forward or backward output, and exactly one node reads it -- a pointwise op or a reduction
  of the same phase (an extern kernel such as ``mm`` or a convolution needs its inputs in
  memory, and so does a composite op Inductor decomposes);
* chains inline transitively; a chain stops growing once it reads more than
  ``MAX_INLINED_READS`` distinct values (Inductor realises such a loop body,
  ``config.realize_acc_reads_threshold``);
* every other value is materialised, also a pointwise value read by several ops: remat
  compiles with ``config.realize_reads_threshold = 0``, which makes Inductor store such a
  value once instead of recomputing it inside each reader (which would keep the value's own
  inputs alive until its last reader, a lifetime the plan does not see).

A fused node is one group of ops ``[inlined producers..., consumer]``; its inputs are what the
group reads from outside, its outputs the consumer's, its cost the sum of its ops' costs and its
workspace the largest of theirs (inlined values never exist). The groups in order of their
consumers are a topological order: an inlined producer has one reader, so nothing between it
and that reader depends on it. :meth:`Fused.expand` turns a plan of the fused graph into the
op-level plan the lowering replays; Inductor then fuses the same chains again.

What Inductor does beyond this model only lowers the measured peak: kernels it fuses so that a
materialised value's every reader is in the same kernel (the value then stays in registers),
buffers it updates in place, and the values of composite ops it decomposes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from .capture import Capture
from .coarsen import graph_of_groups
from .graph import Graph
from .plan import Plan

MAX_INLINED_READS = 8  # Inductor's realize_acc_reads_threshold default

_aten = torch.ops.aten
_POINTWISE_EXTRA_NAMES = (
    "aten.full.default", "aten.scalar_tensor.default", "aten._to_copy.default",
    "prims.inductor_random.default", "prims.inductor_lookup_seed.default",
)


def _is_pointwise(node: fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return torch.Tag.pointwise in target.tags or str(target) in _POINTWISE_EXTRA_NAMES


def _is_reduction(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.reduction in target.tags


@dataclass
class Fused:
    """The fused graph of a captured step and the op groups behind its nodes."""

    graph: Graph
    members: list[list[int]]  # fused node id -> original node ids, producers first
    original: Graph

    def expand(self, fused_plan: Plan, **plan_kwargs) -> Plan:
        """The op-level plan that runs each fused node's ops where ``fused_plan`` runs the node."""
        forward, backward = fused_plan.schedule()
        info = dict(fused_plan.info)
        info["fused"] = f"{len(self.graph.nodes)} kernels-level nodes from {len(self.original.nodes)} ops"
        return Plan.from_schedule(
            self.original,
            [op for f in forward for op in self.members[f]],
            [op for f in backward for op in self.members[f]],
            info=info, **plan_kwargs,
        )


def _generated_by_inductor(node: fx.Node) -> bool:
    """Whether Inductor writes ``node``'s kernel itself (a loop nest of its own code generation)
    rather than calling an external kernel (``mm``, a convolution, a fallback to the eager op):
    ``node``'s op has a lowering in ``torch._inductor.lowering`` and is not one of its fallbacks.

    Such an op allocates only its outputs, whatever temporaries eager's implementation (which
    ``workspace="measure"`` measured) allocates. Ops lowered to extern kernels or templates have
    their lowering in ``torch._inductor.kernel``; ops without a lowering fall back to eager."""
    from torch._inductor import lowering

    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target in lowering.fallbacks:
        return False
    fn = lowering.lowerings.get(target)
    return fn is not None and getattr(fn, "__module__", None) == lowering.__name__


def _workspace_of(capture: Capture):
    """A fused node's workspace: the largest of its ops' that Inductor does not generate itself."""

    def workspace(graph: Graph, members: list[int], escaping: set[int]) -> int:
        return max((graph.nodes[n].workspace for n in members
                    if not _generated_by_inductor(capture.op_node[n])), default=0)

    return workspace


def fusion_groups(capture: Capture) -> list[list[int]]:
    """Groups of op ids, each ``[inlined producers..., consumer]``, in topological order."""
    graph = capture.graph
    nodes, values, users = graph.nodes, graph.values, graph.users
    outputs = set(graph.forward_outputs) | set(graph.backward_outputs)
    inlined_into: dict[int, int] = {}  # producer node -> the node it is inlined into
    reads: dict[int, set[int]] = {}  # node -> values its (fused) loop body reads

    for node in nodes:
        body_reads: set[int] = set()
        for v in node.inputs:
            p = values[v].producer
            if p is not None and p in inlined_into:
                body_reads |= reads[p]
            else:
                body_reads.add(v)
        reads[node.id] = body_reads
        fx_node = capture.op_node[node.id]
        if len(node.outputs) != 1 or node.random or not _is_pointwise(fx_node):
            continue
        (v,) = node.outputs
        readers = users[v]
        if v in outputs or len(readers) != 1:
            continue
        reader = nodes[readers[0]]
        reader_fx = capture.op_node[reader.id]
        if reader.phase != node.phase or not (_is_pointwise(reader_fx) or _is_reduction(reader_fx)):
            continue
        if len(body_reads) > MAX_INLINED_READS:
            continue
        inlined_into[node.id] = reader.id

    def root(n: int) -> int:
        while n in inlined_into:
            n = inlined_into[n]
        return n

    groups: dict[int, list[int]] = {}
    for node in nodes:  # members in op order: producers before their consumer
        groups.setdefault(root(node.id), []).append(node.id)
    return [groups[r] for r in sorted(groups)]


def fuse(capture: Capture) -> Fused:
    """The fused graph of ``capture`` (see the module docstring)."""
    groups = fusion_groups(capture)
    graph = graph_of_groups(capture.graph, groups, name=f"{capture.graph.name} (fused)",
                            workspace_of=_workspace_of(capture))
    return Fused(graph, groups, capture.graph)


__all__ = ["Fused", "fuse", "fusion_groups", "MAX_INLINED_READS"]

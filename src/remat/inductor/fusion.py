"""Inductor's fusion, as a graph remat plans on: which values a compiled step materialises.

Inductor turns pointwise ops into loop bodies that it inlines into their consumers: a
pointwise value read by one pointwise op or reduction is computed inside the consumer's
kernel and never exists in memory, while the consumer's kernel reads the producer's inputs.
remat plans the compiled step on a *fused graph* that says the same:

* a node is **inlined** into its consumer when it is a pointwise op (``Tag.pointwise``, or a
  tensor factory / dtype conversion / index computation Inductor lowers the same way), its one
  output is not a forward or backward output, and exactly one node reads it -- a pointwise op, a
  reduction or a loop body that loads its inputs (max pooling's backward, ``scatter_add`` where
  Inductor writes it rather than run eager's op: :func:`scatter_falls_back`) of the same phase
  (an extern kernel such as ``mm`` or a convolution needs its inputs in memory, and so do a
  composite op Inductor decomposes and a random op, which the lowering runs as an opaque operator);
* chains inline transitively; a chain stops growing once it reads more than
  ``MAX_INLINED_READS`` distinct values (Inductor realises such a loop body,
  ``config.realize_acc_reads_threshold``);
* an ``mm`` whose only reader is the ``add`` right after it joins the add's group
  (:func:`addmm_pairs`): Inductor's post-grad pass rewrites the pair into one ``addmm``. Inductor
  would rewrite a later add too, running the product there and keeping its inputs alive until then
  (a tied embedding's gradient would keep the logits' gradient to the end of the backward); remat's
  lowering writes such an add so that the pattern does not match (:func:`deferred_addmm_adds`);
* every other value is materialised, also a pointwise value read by several ops: remat
  compiles with ``config.realize_reads_threshold = 0``, which makes Inductor store such a
  value once instead of recomputing it inside each reader (which would keep the value's own
  inputs alive until its last reader, a lifetime the plan does not see).

A fused node is one group of ops ``[inlined producers..., consumer]``; its inputs are what the
group reads from outside, its outputs the consumer's, its cost the sum of its ops' costs. Its
workspace is the largest of its ops' that Inductor does not generate code for (extern kernels and
fallbacks, :func:`generated_by_inductor`): a loop nest Inductor writes allocates only its outputs,
whatever eager's implementation of the op (which ``workspace="measure"`` measured) allocates. The
groups in order of their consumers are a topological order: an inlined producer has one reader, so
nothing between it and that reader depends on it. :meth:`Fused.expand` turns a plan of the fused
graph into the op-level plan the lowering replays; Inductor then fuses the same chains again.

Inductor also writes a kernel's output into the storage of an input that dies there
(``config.inplace_buffers``; the backward's saved inputs too, which AOTAutograd donates). The fused
graph lists where that can happen (``meta["inplace_reuse"]``, :func:`inplace_reuses`) and the
simulator counts it where the plan lets the input die: on GPT-2 it is worth about 4% of the peak.
Where a reduction reading the same input runs in the same kernel, Inductor refuses it
(:func:`inplace_conflicts`).

What Inductor's scheduler does beyond this model, seen in its generated code (``del`` and
``# reuse`` lines of the wrapper):

* it fuses a materialised value's readers into the producer's kernel, so that the value never
  exists (a log-softmax backward: the product read by a row sum and by the pointwise op after it
  is one kernel): the measured peak can be below the plan's;
* it allocates all outputs of a fused kernel before running it and frees the inputs after, so
  two kernels fused from neighbours in the plan can hold more at once than the plan, which runs
  them one after the other: such a fusion is refused when the fused kernel would hold more than the
  plan's peak (:func:`remat.inductor.fusion_raises_peak`). Fusion across the plan's order, which
  moved computation and stretched lifetimes, is limited to neighbours
  (:class:`remat.inductor.PlanOrderChoices`), horizontal fusion (kernels that only share a read)
  included: across the order it merged two recomputed copies of one chain and kept both alive,
  1.5x the predicted peak;
* on the CPU its C++ backend calls all the kernels between two extern kernels as one function
  (allocations before, frees after); remat has it call each kernel on its own
  (:func:`remat.inductor.install_one_call_per_kernel`);
* it inlines a value by the readers of the *lowered* graph, where a recomputed copy can have one
  reader though the joint graph's value had several; for a value computed from drawn random numbers
  that puts the numbers in the reader's kernel as its output's in-place target, so remat has
  Inductor store such a copy (:func:`remat.inductor.store_random_masks`).

Two rewrites of the joint graph come before all this. A value computed from Inductor's seeded
random numbers alone (a dropout mask) gets one copy per reader (:func:`draw_random_per_reader`), so
that each reader draws the numbers again inside its own kernel, as Inductor's own partitioner does
where it recomputes random ops; no mask is ever stored, and the backward keeps the step's seeds.
And a light forward value the backward reads (a layer norm's affine output, a bias added to a
product) gets one copy per backward reader (:func:`recompute_light_values_per_reader`), computed
inside that reader's kernel from the value's inputs, as Inductor computes a value read by a few
kernels inside each under its default ``realize_reads_threshold``.

:func:`remat.inductor.calibration` measures the compiled step and re-plans when the peak is above
the budget.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx as fx

from ..capture.joint import Capture
from ..solvers.coarsen import graph_of_groups
from ..cost.flops import SEEDED_RANDOM_OPS
from ..graph import ACTIVATION, Graph
from ..plan import COMPUTE, FREE, OFFLOAD, RELOAD, Instruction, Plan

MAX_INLINED_READS = 8  # Inductor's realize_acc_reads_threshold default
INDUCTOR_RANDOM = "prims.inductor_random.default"  # Inductor's random values (its RNG functionalisation)
INDUCTOR_SEEDS = "prims.inductor_seeds.default"  # the step's seeds, drawn once from the generator

_aten = torch.ops.aten
_POINTWISE_EXTRA_NAMES = (
    "aten.full.default", "aten.scalar_tensor.default", "aten._to_copy.default",
    INDUCTOR_RANDOM, "prims.inductor_lookup_seed.default",
    # untagged, but lowered by Inductor to an elementwise loop body (max pooling's saved offsets -> indices)
    "prims._low_memory_max_pool_offsets_to_indices.default",
)
# Not pointwise or reductions, but lowered by Inductor to loop bodies that load their inputs through
# the inputs' own loop bodies, so a pointwise input is inlined into them: max pooling's backward
# (a gather over a window) and scatter_add, which max pooling's backward decomposes to (it reads
# index and src through loaders and writes into its realised ``self``, whose buffer it returns).
_INLINING_READER_NAMES = ("aten.max_pool2d_with_indices_backward.default", "aten.scatter_add.default")
# Lowered by Inductor as a copy of their first input (``clone(self)``, one buffer the input's loop body
# fills) that they then write into: a pointwise ``self`` (the zeros of an embedding's backward) is
# inlined into that copy and never exists on its own. Their other inputs may be realised (a fallback).
_CLONING_READER_NAMES = ("aten.index_put.default", "aten._unsafe_index_put.default",
                         "aten._unsafe_masked_index_put_accumulate.default")


def _is_pointwise(node: fx.Node) -> bool:
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return torch.Tag.pointwise in target.tags or str(target) in _POINTWISE_EXTRA_NAMES


def computed_lazily(node: fx.Node) -> bool:
    """Whether Inductor lowers ``node`` to a loop body that it stores only when a reader needs it
    stored (and then where that reader is lowered): a pointwise op other than a random draw."""
    return _is_pointwise(node) and str(node.target) not in (INDUCTOR_RANDOM, INDUCTOR_SEEDS)


def _is_reduction(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.reduction in target.tags


def _inlines(reader: fx.Node, value: fx.Node) -> bool:
    """Whether Inductor computes the pointwise ``value`` inside ``reader``'s kernel (or its copy)."""
    return inlines_its_inputs(reader) or (_clones_its_first_input(reader) and bool(reader.args)
                                           and reader.args[0] is value
                                           and all(a is not value for a in reader.args[1:]))


def inlines_its_inputs(node: fx.Node) -> bool:
    """Whether Inductor computes a pointwise input of ``node`` inside ``node``'s kernel."""
    return (_is_pointwise(node) or _is_reduction(node)
            or (str(node.target) in _INLINING_READER_NAMES and not scatter_falls_back(node)))


def _clones_its_first_input(node: fx.Node) -> bool:
    return str(node.target) in _CLONING_READER_NAMES or scatter_falls_back(node)


def scatter_falls_back(node: fx.Node) -> bool:
    """Whether Inductor runs ``node``, a ``scatter_add``, as eager's ``scatter_reduce_`` on a copy of
    its first input rather than as a loop of its own (``torch._inductor.utils.use_scatter_fallback``):
    on the CPU with more than one thread (``config.cpp.fallback_scatter_reduce_sum``), and under
    deterministic algorithms. The copy inlines a pointwise first input (the zeros of max pooling's
    backward); the index and the source are stored (a pooled image's indices as int64, 8 times the
    offsets they come from)."""
    if str(node.target) != "aten.scatter_add.default" or len(node.args) < 4:
        return False
    from torch._inductor.utils import use_scatter_fallback

    base, src = node.args[0].meta.get("val"), node.args[3].meta.get("val")
    if not isinstance(base, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    return use_scatter_fallback(torch.ops.aten.scatter_reduce_.two, "sum", base.dtype, src.dtype, src.device.type, True)


@dataclass
class Fused:
    """The fused graph of a captured step and the op groups behind its nodes."""

    graph: Graph
    members: list[list[int]]  # fused node id -> original node ids, producers first
    original: Graph
    deferred_adds: frozenset = frozenset()  # op ids the lowering must keep apart from their mm

    def expand(self, fused_plan: Plan, **plan_kwargs) -> Plan:
        """The op-level plan that runs each fused node's ops where ``fused_plan`` runs the node.

        Without offloads: the ops in that order, each value freed after its last use. With offloads,
        instruction by instruction: a fused node's ops, then its inlined values freed; a fused
        value's free, offload or reload on the same value of the op-level graph."""
        info = dict(fused_plan.info)
        info["fused"] = f"{len(self.graph.nodes)} kernels-level nodes from {len(self.original.nodes)} ops"
        if any(ins.kind in (OFFLOAD, RELOAD) for ins in fused_plan.instructions):
            instructions, boundary = self._expand_instructions(fused_plan)
            return Plan(self.original, instructions, boundary, info=info, **plan_kwargs)
        forward, backward = fused_plan.schedule()
        return Plan.from_schedule(
            self.original,
            [op for f in forward for op in self.members[f]],
            [op for f in backward for op in self.members[f]],
            info=info, **plan_kwargs,
        )

    def _expand_instructions(self, fused_plan: Plan) -> tuple[tuple[Instruction, ...], int]:
        original_id = {value.name: value.id for value in self.original.values}
        to_original = [original_id[value.name] for value in self.graph.values]
        out: list[Instruction] = []
        boundary = None
        for i, ins in enumerate(fused_plan.instructions):
            if i == fused_plan.boundary:
                boundary = len(out)
            if ins.kind == COMPUTE:
                members = self.members[ins.target]
                out.extend(Instruction(COMPUTE, op) for op in members)
                kept = {to_original[v] for v in self.graph.nodes[ins.target].outputs}
                out.extend(Instruction(FREE, v) for op in members for v in self.original.nodes[op].outputs
                           if v not in kept)  # inlined: read inside the group only, or never read
            else:
                out.append(Instruction(ins.kind, to_original[ins.target]))
        return tuple(out), len(out) if boundary is None else boundary


def generated_by_inductor(node: fx.Node) -> bool:
    """Whether Inductor writes ``node``'s kernel itself (a loop nest of its own code generation)
    rather than calling an external kernel (``mm``, a convolution, a fallback to the eager op):
    ``node``'s op has a lowering in ``torch._inductor.lowering`` and is not one of its fallbacks.

    Such an op allocates only its outputs, whatever temporaries eager's implementation (which
    ``workspace="measure"`` measured) allocates. Ops lowered to extern kernels or templates have
    their lowering in ``torch._inductor.kernel``; ops without a lowering fall back to eager."""
    lowering = importlib.import_module("torch._inductor.lowering")  # registers Inductor's lowerings

    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or target in lowering.fallbacks:
        return False
    fn = lowering.lowerings.get(target)
    return fn is not None and getattr(fn, "__module__", None) == lowering.__name__


def _workspace_of(capture: Capture):
    """A fused node's workspace: the largest of its ops' that Inductor does not generate itself."""

    def workspace(graph: Graph, members: list[int], escaping: set[int]) -> int:
        # a random op runs as eager's op inside remat's replay operator (remat.execute.compiled_ops)
        return max((graph.nodes[n].workspace for n in members
                    if graph.nodes[n].random or not generated_by_inductor(capture.op_node[n])), default=0)

    return workspace


def _is_gpu(device: torch.device) -> bool:
    return device.type not in ("cpu", "meta")


def addmm_pairs(capture: Capture) -> dict[int, int]:
    """``{mm op id: add op id}`` for each ``add(mm(a, b), c)`` that Inductor rewrites into one
    ``addmm(c, a, b)`` kernel: the add is the op right after the product (see :func:`addmm_candidates`;
    the others remat keeps apart, :func:`deferred_addmm_adds`)."""
    return {mm: add for mm, add in addmm_candidates(capture).items() if add == mm + 1}


def deferred_addmm_adds(capture: Capture) -> set[int]:
    """Add op ids of the :func:`addmm_candidates` whose add comes later than right after the product.

    Inductor's rewrite would run the product where the add runs: the tied embedding's gradient,
    ``embedding_backward + mm(logits_grad^T, hidden)``, would keep the logits' gradient (the step's
    largest value) and the last hidden state alive through the whole backward, and tie the first
    block of the chain to the last, so that no chain of blocks is left to plan. The lowering writes
    these adds as ``sub(x, y, alpha=-1)`` (bitwise ``x + y``: negation is exact), which the pattern
    does not match (:func:`remat.execute.lowering.lower`'s ``keep_apart``); the product then runs, and its inputs
    die, where the plan puts it."""
    return {add for mm, add in addmm_candidates(capture).items() if add != mm + 1}


def addmm_candidates(capture: Capture) -> dict[int, int]:
    """``{mm op id: add op id}`` for each ``add(mm(a, b), c)`` that Inductor's post-grad pattern
    (``torch._inductor.fx_passes.post_grad.addmm``) would rewrite into ``addmm(c, a, b)`` *at the add*:
    when the ``mm`` has no other reader, ``c`` is a tensor of the product's dtype whose shape expands
    to the product's, and (on a GPU) not when every reader of the sum is pointwise (Inductor then
    prefers the unfused add)."""
    from torch._prims_common import is_expandable_to

    graph = capture.graph
    pairs: dict[int, int] = {}
    for node in graph.nodes:
        mm = capture.op_node[node.id]
        if mm.target is not _aten.mm.default or len(node.outputs) != 1:
            continue
        if node.outputs[0] in graph.forward_outputs or node.outputs[0] in graph.backward_outputs:
            continue
        readers = set(graph.users[node.outputs[0]])
        if len(readers) != 1 or len(mm.users) != 1:
            continue
        reader = graph.nodes[readers.pop()]
        add = capture.op_node[reader.id]
        if add.target is not _aten.add.Tensor or next(iter(mm.users)) is not add or reader.phase != node.phase:
            continue
        if add.kwargs.get("alpha", 1) != 1:
            continue
        others = [a for a in add.args if a is not mm]
        if len(others) != 1 or not isinstance(others[0], fx.Node):
            continue
        c, product = others[0].meta.get("val"), mm.meta.get("val")
        if not isinstance(c, torch.Tensor) or not isinstance(product, torch.Tensor) or c.dtype != product.dtype:
            continue
        if not is_expandable_to(tuple(c.shape), tuple(product.shape)):
            continue
        if _is_gpu(c.device) and all(_is_pointwise(u) for u in add.users):
            continue
        pairs[node.id] = reader.id
    return pairs


def _seeded_values(graph: fx.Graph) -> dict[fx.Node, bool]:
    """The nodes that are pure functions of Inductor's seeds (pointwise ops and views over
    ``inductor_seeds`` and constants), each with whether a seeded draw is among them."""
    seeded: dict[fx.Node, bool] = {}
    for node in graph.nodes:  # topological order: a node's inputs are judged before it
        target = node.target
        if (node.op != "call_function" or not isinstance(target, torch._ops.OpOverload)
                or torch.Tag.nondeterministic_seeded in target.tags
                or not (_is_pointwise(node) or target.is_view)
                or not isinstance(node.meta.get("val"), torch.Tensor)):
            continue
        inputs = [arg for arg in node.all_input_nodes
                  if not (arg.op == "call_function" and str(arg.target) == INDUCTOR_SEEDS)]
        if all(arg in seeded for arg in inputs):
            seeded[node] = str(target) in SEEDED_RANDOM_OPS or any(seeded[arg] for arg in inputs)
    return seeded


def _copy_before(graph: fx.Graph, node: fx.Node, reader: fx.Node) -> fx.Node:
    """A copy of ``node`` (same op, same inputs, same meta) placed right before ``reader``; give it
    a value of its own with :func:`_own_value` once its inputs are final."""
    with graph.inserting_before(reader):
        new = graph.node_copy(node, lambda arg: arg)
    new.meta = dict(node.meta)
    return new


def _own_value(node: fx.Node) -> None:
    """Recompute ``node``'s fake value from its inputs' (a value shared with the node it was copied
    from would make the capture see an alias)."""
    val = node.meta["val"]
    with val.fake_mode:
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda arg: arg.meta["val"])
        node.meta["val"] = node.target(*args, **kwargs)


def draw_random_per_reader(gm: fx.GraphModule) -> int:
    """Give every reader of a value computed from Inductor's seeded random draws its own copy of
    the draw, placed right before the reader; returns the number of nodes copied.

    With ``config.fallback_random`` off, Inductor replaces each random op by
    ``inductor_random(shape, seed)``, a pure function of one of the step's seeds. A dropout mask
    made from it is read twice in the joint graph (the forward's product and the backward's), so
    the fused graph would store it: 1 byte per element, and on the CPU a bool store Inductor's C++
    kernels write slowly (about as slow as drawing the numbers again). Copied per reader, each copy
    has one reader and is computed inside that reader's kernel, from the seeds alone, as Inductor's
    own partitioner does when it recomputes random ops: the mask never exists, the backward keeps
    the seeds, and the planner sees each copy's draw as part of its reader's cost. The values are the
    same (same seed, same offsets), so gradients are unchanged."""
    graph = gm.graph
    position = {node: i for i, node in enumerate(graph.nodes)}
    seeded = _seeded_values(graph)
    copies = 0

    def copy_for(node: fx.Node, reader: fx.Node) -> fx.Node:
        nonlocal copies
        new = _copy_before(graph, node, reader)
        copies += 1
        for arg in new.all_input_nodes:  # an input read elsewhere too gets its own copy as well
            if arg in seeded and len(arg.users) > 1:
                new.replace_input_with(arg, copy_for(arg, new))
        seeded[new] = seeded[node]
        _own_value(new)
        return new

    for node in reversed(list(graph.nodes)):
        if not seeded.get(node) or len(node.users) < 2 or any(u.op == "output" for u in node.users):
            continue
        for reader in sorted(node.users, key=lambda u: position.get(u, len(position)))[1:]:
            reader.replace_input_with(node, copy_for(node, reader))
    if copies:
        graph.lint()
        gm.recompile()
    return copies


def fusion_groups(capture: Capture) -> list[list[int]]:
    """Groups of op ids, each ``[inlined producers..., consumer]``, in topological order."""
    graph = capture.graph
    nodes, values, users = graph.nodes, graph.values, graph.users
    outputs = set(graph.forward_outputs) | set(graph.backward_outputs)
    inlined_into: dict[int, int] = dict(addmm_pairs(capture))  # producer node -> the node it is inlined into
    addmm_adds = set(inlined_into.values())  # extern addmm kernels: read their inputs from memory
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
        if len(node.outputs) != 1 or node.random or not _is_pointwise(fx_node) or node.id in addmm_adds:
            continue
        (v,) = node.outputs
        readers = users[v]
        if v in outputs or len(readers) != 1:
            continue
        reader = nodes[readers[0]]
        reader_fx = capture.op_node[reader.id]
        if (reader.phase != node.phase or reader.id in addmm_adds or reader.random
                or not _inlines(reader_fx, capture.value_node[v])):
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


def inplace_reuses(capture: Capture, groups: list[list[int]]) -> list[tuple[int, int, int]]:
    """``(group, input value, output value)`` for each input whose storage Inductor may hand to the
    group's output (``config.inplace_buffers``) when the group is the input's last reader.

    Inductor writes a kernel's output into the buffer of an input that dies at that kernel when the
    kernel reads the input at exactly the index it writes (``can_inplace``: one access, the same
    index) and both have the same dtype and, within 5%, the same size; in a kernel that draws seeded
    random numbers (a dropout), the first such read is the drawn numbers' own buffer, so a group
    with a seeded draw hands its output no input's storage. Listed here, conservatively:
    the group's consumer is a pointwise op that Inductor generates, with one output; the input is an
    activation (parameters and user inputs are never reused, tangents are not donated) of the
    output's storage size; every read of it has the output's dtype, shape and strides (the value
    itself, or a view that only reshapes it) and is made by a member whose output keeps that shape
    all the way to the consumer (no broadcast or reduction between the read and the write). Whether
    the input dies there depends on the plan: :func:`remat.plan.simulate` decides that.
    """
    graph = capture.graph
    values = graph.values
    found: list[tuple[int, int, int]] = []
    for g, members in enumerate(groups):
        consumer = members[-1]
        out_fx = capture.op_node[consumer]
        if len(graph.nodes[consumer].outputs) != 1 or graph.nodes[consumer].random:
            continue
        if not _is_pointwise(out_fx) or not generated_by_inductor(out_fx):
            continue
        if any(str(capture.op_node[m].target) in SEEDED_RANDOM_OPS for m in members):
            continue  # Inductor realises the drawn numbers and writes the output into their buffer
        (o,) = graph.nodes[consumer].outputs
        out_val = capture.value_node[o].meta.get("val")
        if capture.value_node[o] is not out_fx or not isinstance(out_val, torch.Tensor):
            continue
        member_set = set(members)
        aligned: set[int] = set()  # members whose output reaches the consumer's at the same index
        for m in reversed(members):
            val = capture.op_node[m].meta.get("val")
            if not (_is_pointwise(capture.op_node[m]) and isinstance(val, torch.Tensor)
                    and tuple(val.shape) == tuple(out_val.shape)):
                continue
            readers = [u for v in graph.nodes[m].outputs for u in graph.users[v] if u in member_set]
            if m == consumer or (readers and all(u in aligned for u in readers)):
                aligned.add(m)
        layout = (out_val.dtype, tuple(out_val.shape), tuple(out_val.stride()), 0)
        reads: dict[int, bool] = {}  # outside value -> every read is at the output's index
        for m in members:
            for arg in capture.op_node[m].all_input_nodes:
                v = capture.value_id.get(arg, capture.alias_base.get(arg))
                if v is None or values[v].producer in member_set:
                    continue
                val = arg.meta.get("val")  # the value itself, or a view of it (a reshape keeps the index)
                same_index = m in aligned and isinstance(val, torch.Tensor) and (
                    val.dtype, tuple(val.shape), tuple(val.stride()), val.storage_offset()) == layout
                reads[v] = reads.get(v, True) and same_index
        for v, same_index in reads.items():
            # equal storage sizes (Inductor also reuses a buffer up to 5% larger; not counted here)
            if same_index and values[v].kind == ACTIVATION and values[v].bytes == values[o].bytes:
                found.append((g, v, o))
    return found


def inplace_conflicts(capture: Capture, groups: list[list[int]],
                      reuses: list[tuple[int, int, int]]) -> list[tuple[int, int, list[int]]]:
    """``(group, input value, [other groups])`` for each in-place candidate of :func:`inplace_reuses`
    whose input is also read by groups that do not read it at the output's index (their consumer is
    not pointwise: a reduction, say).

    Inductor refuses the in-place write when such a reader ends up in the *same* kernel as the writer
    (``single_index_in_fused_node``: the fused kernel must touch the buffer at one index only; remat
    takes a reduction's access to be another index). A softmax is the case: the row max reads the
    scores that ``exp(s - max)`` may overwrite, the row sum reads the exponentials that the
    probabilities may overwrite, and Inductor fuses all four into one kernel when they are neighbours
    in the plan. Whether they are depends on the plan, so :func:`remat.plan.simulate` decides. On the
    GPT-2 of ``benchmarks/inductor.py`` at ``budget="min"`` the prediction went from 41.0 to 42.1 MiB
    against 43.1 measured; its other budgets, and ResNet-18's, predict the same as without it."""
    graph = capture.graph
    reader_groups: dict[int, set[int]] = {}
    for g, members in enumerate(groups):
        member_set = set(members)
        consumer = members[-1]
        if _is_pointwise(capture.op_node[consumer]):
            continue
        for m in members:
            for v in graph.nodes[m].inputs:
                if graph.values[v].producer not in member_set:
                    reader_groups.setdefault(v, set()).add(g)
    out = []
    for g, v, _ in reuses:
        others = sorted(reader_groups.get(v, set()) - {g})
        if others:
            out.append((g, v, others))
    return out


def inductor_kernels(capture: Capture, groups: list[list[int]]) -> list[int]:
    """The groups whose consumer Inductor generates code for (:func:`generated_by_inductor`): only
    these fuse with their neighbours; an extern kernel (``mm``, a convolution) ends a fused run."""
    return [g for g, members in enumerate(groups) if generated_by_inductor(capture.op_node[members[-1]])]


def _costed_as_kernels(capture: Capture, groups: list[list[int]], graph: Graph,
                       kernel_seconds: Callable[[list[fx.Node], int], float]) -> Graph:
    """``graph`` with each node whose ops Inductor all generates costed as one kernel."""
    nodes = list(graph.nodes)
    for g, members in enumerate(groups):
        ops = [capture.op_node[m] for m in members]
        if not all(generated_by_inductor(op) for op in ops):
            continue  # an extern kernel (or a fallback) keeps its own, profiled, cost
        node = nodes[g]
        nbytes = sum(graph.values[v].bytes for v in (*node.inputs, *node.outputs))
        nodes[g] = dataclasses.replace(node, cost=min(node.cost, kernel_seconds(ops, nbytes)))
    return dataclasses.replace(graph, nodes=tuple(nodes))


def fuse(capture: Capture, kernel_seconds: Callable[[list[fx.Node], int], float] | None = None) -> Fused:
    """The fused graph of ``capture`` (see the module docstring), with ``meta["inplace_reuse"]``:
    ``[node, input value, output value]`` triples of :func:`inplace_reuses` in the fused graph's ids;
    ``meta["inplace_conflicts"]`` (:func:`inplace_conflicts`) and ``meta["inductor_kernels"]``
    (:func:`inductor_kernels`) let the simulator tell where Inductor refuses them.

    A fused node costs the sum of its ops' costs, or, given ``kernel_seconds(ops, nbytes)``
    (:meth:`remat.inductor.cost.InductorCostModel.kernel_seconds`), a node whose ops Inductor all
    generates costs one kernel reading its inputs and writing its outputs (``nbytes`` in all)."""
    groups = fusion_groups(capture)
    graph = graph_of_groups(capture.graph, groups, name=f"{capture.graph.name} (fused)",
                            workspace_of=_workspace_of(capture))
    if kernel_seconds is not None:
        graph = _costed_as_kernels(capture, groups, graph, kernel_seconds)
    fused_id = {value.name: value.id for value in graph.values}
    names = capture.graph.values
    found = inplace_reuses(capture, groups)
    if found:
        meta = dict(graph.meta)
        meta["inplace_reuse"] = [[g, fused_id[names[v].name], fused_id[names[o].name]] for g, v, o in found]
        conflicts = inplace_conflicts(capture, groups, found)
        if conflicts:
            meta["inplace_conflicts"] = [[g, fused_id[names[v].name], others] for g, v, others in conflicts]
            meta["inductor_kernels"] = inductor_kernels(capture, groups)
        graph = dataclasses.replace(graph, meta=meta)
    return Fused(graph, groups, capture.graph, frozenset(deferred_addmm_adds(capture)))


# Ops Inductor's CPU backend stores rather than computes again in each of several readers
# (``StorageBox.should_realize_on_reuse``): a copy per reader would cost real time.
HEAVY_POINTWISE = frozenset({"exp", "log", "log10", "log1p", "log2", "sigmoid", "tanh"})
MAX_SHARED_READS = 4  # Inductor's realize_reads_threshold default: inputs of a value it computes in each reader


def _tensor_bytes(node: fx.Node) -> int:
    val = node.meta.get("val")
    return val.numel() * val.element_size() if isinstance(val, torch.Tensor) else 0


def _depends_on_tangents(graph: fx.Graph) -> set[fx.Node]:
    """The backward's nodes of a joint graph: the tangents (placeholders named as
    :func:`remat.capture.capture_joint` recognises them) and everything computed from them."""
    backward: set[fx.Node] = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and str(node.target).startswith("tangents")) or any(
                arg in backward for arg in node.all_input_nodes):
            backward.add(node)
    return backward


def _light_forward_value(node: fx.Node, backward: set[fx.Node], seeded: dict) -> list[fx.Node]:
    """The backward readers to give a copy of ``node`` (see :func:`recompute_light_values_per_reader`),
    or none."""
    target = node.target
    if (node in backward or node.op != "call_function" or not _is_pointwise(node) or node in seeded
            or torch.Tag.nondeterministic_seeded in target.tags or str(target).split(".")[1] in HEAVY_POINTWISE):
        return []
    if not isinstance(node.meta.get("val"), torch.Tensor) or any(u.op == "output" for u in node.users):
        return []
    readers = [u for u in node.users if u in backward]
    if not all(u.op == "call_function" and inlines_its_inputs(u) and u not in seeded for u in readers):
        return []
    inputs = [arg for arg in node.all_input_nodes if isinstance(arg.meta.get("val"), torch.Tensor)]
    if len(inputs) > MAX_SHARED_READS or any(arg in seeded for arg in inputs):
        return []
    # parameters and the user's inputs are in memory anyway; other inputs the backward must keep instead
    kept = sum(_tensor_bytes(arg) for arg in inputs if arg.op != "placeholder")
    return readers if kept <= _tensor_bytes(node) else []


def recompute_light_values_per_reader(gm: fx.GraphModule) -> int:
    """Give every backward reader of a light forward value its own copy of it, placed right before
    the reader; returns the number of copies.

    A light value is a pointwise op of the forward, not random and none of
    :data:`HEAVY_POINTWISE`, reading at most ``MAX_SHARED_READS`` tensors whose bytes, parameters and
    inputs aside, are no more than its own (a layer norm's affine output ``x_hat * w + b``, a bias
    added to a product, a value scaled by a constant), whose backward readers all compute a pointwise input
    inside their own kernel (pointwise ops and reductions). Each copy has one reader, so the fused
    graph (and Inductor) compute it inside that reader's kernel: the backward reads the value's
    inputs instead of the value, which the forward then never stores for it. This is what Inductor's
    own partitioner does where it recomputes such values (a minimum cut saves their inputs, and
    Inductor's default ``realize_reads_threshold`` computes a value read by a few kernels inside each);
    remat compiles with that threshold at 0 so that its fused graph stays exact, and makes the choice
    here instead, in the graph it plans: the planner then sees each copy's compute in its reader's cost
    and the inputs' lifetimes in the memory. Forcing it drops the option of storing the value itself,
    hence the size rule: keeping the inputs costs no more than keeping the value. On the 8-layer
    GPT-2 of ``benchmarks/inductor.py`` (161 copies) the plan at 125.9 MiB measured 2.5% faster (700.6
    against 718.7 ms), at 147.4 MiB 0.4% (measured peaks equal to the predictions in all four)."""
    graph = gm.graph
    backward = _depends_on_tangents(graph)
    seeded = _seeded_values(graph)
    copies = 0
    for node in reversed(list(graph.nodes)):  # a copied value's inputs are judged after it, by their new readers
        readers = _light_forward_value(node, backward, seeded)
        for reader in readers:
            new = _copy_before(graph, node, reader)
            _own_value(new)
            reader.replace_input_with(node, new)
            backward.add(new)
            copies += 1
        if readers and not node.users:
            graph.erase_node(node)  # read by the backward only: its copies replace it
    if copies:
        graph.lint()
        gm.recompile()
    return copies


__all__ = ["Fused", "fuse", "fusion_groups", "inplace_reuses", "inplace_conflicts", "inductor_kernels", "addmm_pairs", "addmm_candidates", "deferred_addmm_adds", "MAX_INLINED_READS", "computed_lazily", "scatter_falls_back", "draw_random_per_reader", "recompute_light_values_per_reader"]

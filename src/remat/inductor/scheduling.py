"""Inductor's scheduler kept to the plan: which kernels may fuse, and one call per kernel on the CPU.

    install_plan_order_choices(); install_one_call_per_kernel()   # once, before compiling
    tag_plan_memory(graphs, fused_plan, expanded, members)         # on the lowered graphs
    store_where_planned(graphs)                                    # values made where the plan makes them

Inductor fuses kernels and groups their calls by its own heuristics; remat's memory model holds only
if kernels fuse next to each other in the plan's order and within the plan's peak
(:class:`PlanOrderChoices`, reading the simulated memory :func:`tag_plan_memory` writes), and, on the
CPU, if each generated kernel runs as its own call (:func:`install_one_call_per_kernel`). Both apply
only to graphs remat planned: a partitioner with ``planned_by_remat = True``. And it holds only if
Inductor stores each value where the plan makes it: the lowered graphs pass the values it would
compute later, or inside a reader, through its stride prim (:func:`store_where_planned`,
:func:`store_random_masks`).
"""

from __future__ import annotations

import math
import operator

import torch
from torch._inductor.choices import InductorChoices

from ..simulate import COMPUTE
from .fusion import INDUCTOR_RANDOM, Fused, computed_lazily, inlines_its_inputs

MAX_FUSION_GAP = 1  # kernels fuse only when next to each other in the plan's order
UNROLLED_POOL_WINDOW = 25  # Inductor's max pooling lowering unrolls windows up to this size into loop bodies
MEMORY_BEFORE, PLAN_PEAK = "remat_memory_before", "remat_plan_peak"  # FX node meta (tag_plan_memory)


def tag_plan_memory(graphs, fused_plan, expanded, members) -> None:
    """Write into each lowered op node's meta its fused node's step in the plan and the simulated
    bytes held just before it (``MEMORY_BEFORE``) and the plan's peak (``PLAN_PEAK``), for
    :meth:`PlanOrderChoices.can_fuse`. The expanded plan runs each fused node's ops one after
    the other, in the fused plan's order, so its k-th computation belongs to the fused plan's
    k-th computation's group."""
    timeline = fused_plan.simulation.timeline
    fused_steps = [j for j, ins in enumerate(fused_plan.instructions) if ins.kind == COMPUTE
                   for _ in members[ins.target]]
    op_steps = [i for i, ins in enumerate(expanded.instructions) if ins.kind == COMPUTE]
    fused_step = dict(zip(op_steps, fused_steps))
    for gm in graphs:
        for n in gm.graph.nodes:
            j = fused_step.get(n.meta.get("remat_instruction"))
            if j is not None:
                n.meta[MEMORY_BEFORE] = (j, timeline[j - 1] if j else 0)
                n.meta[PLAN_PEAK] = fused_plan.peak_bytes


def _readers_through_views(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The ops that read ``node``'s values, looking through views of it (which Inductor folds into
    the reader's loads)."""
    readers = []
    for user in node.users:
        target = user.target
        if isinstance(target, torch._ops.OpOverload) and target.is_view:
            readers.extend(_readers_through_views(user))
        else:
            readers.append(user)
    return readers


def store_random_masks(graphs, expanded, fused: Fused) -> int:
    """Make Inductor store the values computed from drawn random numbers that the fused graph
    stores; returns how many copies it would have computed inside their reader.

    Inductor stores random values (its lowering of ``inductor_random`` realises them) and removes
    them again when the kernel reading them is their only reader, fused with them; the fused graph
    counts them that way, inlined into their reader (a dropout's product), and stores that value
    where the joint graph reads it twice. A recomputed copy of it in the lowered graphs can have
    one reader: Inductor then computes it inside that kernel, which reads the random values
    themselves, the same size as its output, and writes its output into them (the first dying input
    of the output's size it reads) instead of into the dying input the plan hands it. So the random
    values stay allocated beside that input (on the 8-layer GPT-2 of ``benchmarks/inductor.py`` at
    ``budget="min"``, when its masks were stored, 1.8% above the plan). Such a copy -- a value the
    fused graph stores, computed from inlined random values, read (through views) by one op that
    would inline it -- is passed through ``prims.inductor_force_stride_order`` with its own strides,
    which Inductor lowers to a stored buffer (values unchanged). What was tried instead is in
    ``docs/design.md`` (Known gaps)."""
    original = fused.original.nodes
    masks = {members[-1] for members in fused.members  # each group's consumer: its outputs are stored
             if any(original[m].op == INDUCTOR_RANDOM for m in members[:-1])}

    def store(gm, n) -> int:
        i = n.meta.get("remat_instruction")
        return 0 if i is None or expanded.instructions[i].target not in masks else _store_if_inlined(gm, n)

    return _store_in(graphs, store)


def store_where_planned(graphs) -> int:
    """Make Inductor store the values it computes lazily where the plan computes them, as the fused
    graph has them; returns how many it would have computed elsewhere.

    Inductor lowers a pointwise op, and max pooling's low-memory form with a window of at most
    ``UNROLLED_POOL_WINDOW`` elements, to loop bodies it does not store at once: a value read by one
    kernel that loads its inputs is computed inside that kernel, and a value read only by extern
    kernels (a convolution, ``mm``) or by the graph's output is stored where its first reader is
    lowered. The fused graph stores both kinds where the plan runs the op, so two cases would hold
    more than the plan:

    * a pointwise value read only by extern kernels or the output, where the plan runs other ops
      before its first reader: its own inputs stay alive until then (a threshold backward deferred
      past a recomputed convolution: 8.6% above the prediction on a small pooling CNN under
      ``checkpoint_all``);
    * an output of such a max pool read by one kernel that loads its inputs (the scatter of max
      pooling's backward reading the offsets of a pool the plan recomputes): that kernel reads the
      pool's input, 16 times the int8 offsets of a 2x2 window, and keeps it alive until then (the
      2-chunk ``cnn_bn`` plan: 9.8% above, 130,152 against 118,540 bytes).

    Each is passed through ``prims.inductor_force_stride_order`` with its own strides right where it is
    made, which Inductor lowers to a buffer stored there (values unchanged; remat compiles with layout
    optimisation off, so these are the strides Inductor would give it). A pointwise value read by one
    such kernel stays inlined, as the fused graph has it where the joint graph's value has one reader
    (a recomputed copy with fewer readers than the joint graph's is a known gap: see
    :func:`store_random_masks`)."""
    pool = torch.ops.prims._low_memory_max_pool_with_offsets.default

    def store(gm, n) -> int:
        if "remat_instruction" not in n.meta:
            return 0
        if n.target is pool and math.prod(n.args[1]) <= UNROLLED_POOL_WINDOW:
            return sum(_store_if_inlined(gm, output) or _store_if_deferred(gm, output)
                       for output in [u for u in n.users if u.target is operator.getitem])
        return _store_if_deferred(gm, n) if computed_lazily(n) else 0

    return _store_in(graphs, store)


def _store_in(graphs, store) -> int:
    """``store(gm, node)`` (how many values it stored) over every node of every graph, recompiling each
    graph it changed; the total."""
    count = 0
    for gm in graphs:
        stored = sum(store(gm, n) for n in list(gm.graph.nodes))
        if stored:
            gm.recompile()
        count += stored
    return count


def _store_if_deferred(gm: torch.fx.GraphModule, n: torch.fx.Node) -> int:
    """Store ``n`` where it is made if no reader loads it inside its own kernel and an op runs
    between ``n`` and its first reader (Inductor would compute it there); 1 if so, else 0."""
    readers = set(_readers_through_views(n))
    if not readers or any(inlines_its_inputs(r) for r in readers):
        return 0
    m = n.next
    while m not in readers and m.op != "root":  # the graph's nodes form a ring through its root
        if (m.op == "call_function" and m.target is not operator.getitem
                and isinstance(m.meta.get("val"), (torch.Tensor, tuple, list))
                and not (isinstance(m.target, torch._ops.OpOverload) and m.target.is_view)):
            return _store(gm, n)
        m = m.next
    return 0


def _store_if_inlined(gm: torch.fx.GraphModule, n: torch.fx.Node) -> int:
    """Store ``n`` where it is made if its only reader, looking through views, would compute it
    inside its own kernel; 1 if so, else 0."""
    readers = _readers_through_views(n)
    if len(readers) != 1 or not inlines_its_inputs(readers[0]):
        return 0
    return _store(gm, n)


def _store(gm: torch.fx.GraphModule, n: torch.fx.Node) -> int:
    """Pass ``n`` through Inductor's stride prim, with its own strides: a buffer stored where ``n`` is
    made. 1 if done, 0 where ``n`` is no tensor."""
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return 0
    stride, last = list(val.stride()), n
    for d, step in enumerate(stride):  # a symbolic stride: read off the value at run time
        if isinstance(step, torch.SymInt):
            with gm.graph.inserting_after(last):
                stride[d] = last = gm.graph.call_function(torch.ops.aten.sym_stride.int, (n, d))
            last.meta["val"] = step
    with gm.graph.inserting_after(last):
        stored_copy = gm.graph.call_function(torch.ops.prims.inductor_force_stride_order.default, (n, stride))
    own = {stored_copy, *(x for x in stride if isinstance(x, torch.fx.Node))}
    n.replace_all_uses_with(stored_copy, delete_user_cb=lambda user: user not in own)
    stored_copy.meta.update(n.meta)
    return 1


def fusion_raises_peak(node1, node2) -> bool:
    """Whether the kernel fused from scheduler nodes ``node1`` and ``node2`` would hold more than
    the plan's peak (False where remat's tags are missing: Inductor's answer stands).

    Inductor allocates a fused kernel's outputs before it runs and frees its inputs after, so
    it holds what the plan held before its first part (``MEMORY_BEFORE``) plus every output read
    after it (or returned), less outputs a part writes into an input of the same size: one that
    part itself reads (Inductor decides in-place writes per scheduler node), that dies inside the
    kernel and that no reduction of the kernel reads. The plan frees dying inputs between the
    parts: on the zoo's 2-layer GPT-2 at hierarchical's smallest budget a recomputed softmax fused
    with the dropout after it held the scores, the probabilities and the dropout's output at once,
    1.098x the predicted peak (exact with this check).

    The kernel's first op is its earliest tagged FX origin, which can be a pointwise producer
    Inductor inlined into it that the plan computed earlier, at lower memory (each part's last
    origin was tried instead: see ``docs/design.md``, Known gaps)."""
    from torch._inductor.scheduler import OutputNode

    parts = [s for n in (node1, node2) for s in n.get_nodes()]
    origins = [fx for s in parts if s.node is not None for fx in s.node.get_origins() if MEMORY_BEFORE in fx.meta]
    if not origins:
        return False
    names = {s.get_name() for s in parts}
    peak = max(fx.meta[PLAN_PEAK] for fx in origins)

    def read_outside(buf) -> bool:
        return any(isinstance(u.node, OutputNode) or any(p.get_name() not in names for p in u.node.get_nodes())
                   for u in buf.users)

    produced = {b.get_name() for s in parts for b in s.get_outputs()}
    scheduler = parts[0].scheduler
    reduced = {d.name for s in parts if s.is_reduction() for d in s.read_writes.reads}
    held = min(fx.meta[MEMORY_BEFORE] for fx in origins)[1]  # before the kernel's first op
    for s in parts:
        kept = [_buffer_bytes(b) for b in s.get_outputs() if read_outside(b)]
        held += sum(kept)
        dying = [  # inputs of this part that die in the kernel and that no reduction of it reads
            _buffer_bytes(scheduler.name_to_buf[name]) for name in {d.name for d in s.read_writes.reads}
            if name not in produced and name not in reduced and name in scheduler.name_to_buf
            and not read_outside(scheduler.name_to_buf[name])
        ]
        for out in sorted(kept):  # an output written into a dying input of its size
            if out in dying:
                dying.remove(out)
                held -= out
    return held > peak


def _buffer_bytes(buf) -> int:
    """The buffer's bytes at the largest sizes the graph runs: for a graph of a size bucket (its
    symbols guarded to the bucket, :func:`remat.capture.shapes.guard_bucket`) at the bucket's edge,
    where the plan's memory tags were simulated, not at the size it was traced with."""
    from torch._inductor.utils import get_dtype_size
    from torch._inductor.virtualized import V

    try:
        numel = buf.node.get_numel()
        itemsize = get_dtype_size(buf.node.get_dtype())
    except (NotImplementedError, AttributeError, AssertionError):  # no tensor (a multi-output op's list)
        return 0
    sizevars = V.graph.sizevars
    if getattr(numel, "free_symbols", None):
        try:
            upper = sizevars.shape_env.bound_sympy(numel).upper
            if upper.is_finite:
                return int(upper) * itemsize
        except Exception:  # noqa: BLE001  (an expression the range analysis cannot bound: its hint)
            pass
    return int(sizevars.optimization_hint(numel, fallback=0)) * itemsize


class PlanOrderChoices:
    """Inductor's heuristics, except that in graphs remat planned two kernels fuse only when no other
    kernel runs between them in the plan's order (``MAX_FUSION_GAP``).

    Inductor's scheduler runs a fused kernel where the earlier of its parts ran and pulls the later
    part's other inputs up before it, so values live longer than the plan says: a recomputed GELU
    fused with its backward a few kernels later moved the gradient's product up, and a ResNet-18
    planned at 0.6 measured 3% above its prediction (exact with this rule; GPT-2 at 0.4: 0.7%
    below, now exact; step time unchanged within 1%). Kernels next to each other in the plan fuse
    as before (softmax, layer norm), which moves nothing, unless the fused kernel would hold more
    than the plan's peak (:func:`fusion_raises_peak`). Graphs remat did not plan
    (``custom_partitioner_fn`` not remat's) get ``base``'s answers."""

    def __init__(self, base: InductorChoices):
        self.base = base

    def can_fuse(self, scheduler, node1, node2, shared_data_score: int) -> bool:
        if not self.base.can_fuse(scheduler, node1, node2, shared_data_score):
            return False
        if not _planned_by_remat():
            return True
        gap = max(node2.min_order - node1.max_order, node1.min_order - node2.max_order)
        return gap <= MAX_FUSION_GAP and not fusion_raises_peak(node1, node2)

    def __getattr__(self, name):  # every other heuristic: base's
        return getattr(self.__dict__["base"], name)


def _planned_by_remat() -> bool:
    """Whether the graph Inductor compiles now is one remat planned (its partitioner says so)."""
    return getattr(torch._inductor.config.custom_partitioner_fn, "planned_by_remat", False)


def install_one_call_per_kernel() -> None:
    """On the CPU, Inductor's C++ backend gathers consecutive generated kernels into one C++
    function and one call (until an extern kernel): the wrapper allocates every output of the
    group before the call and frees the dying inputs after it, so the group holds at once what
    the plan frees between its kernels (a recomputed attention on a 2-layer GPT-2: scores,
    softmax, dropout output and the value's copy together, 13% above the plan). In graphs remat
    planned the backend flushes after every kernel, so each runs as its own call and its dying
    inputs go before the next allocates (one Python call per kernel more; other graphs as before)."""
    from torch._inductor.codegen.cpp import CppScheduling

    base = getattr(CppScheduling, "ready_to_flush", None)
    if base is None or getattr(base, "remat", False):  # (a torch without the hook: Inductor's grouping stays)
        return

    def ready_to_flush(self) -> bool:
        return _planned_by_remat() or base(self)

    ready_to_flush.remat = True
    CppScheduling.ready_to_flush = ready_to_flush


def install_plan_order_choices() -> None:
    """Make :class:`PlanOrderChoices` Inductor's heuristics in this thread (once; it defers to the
    heuristics it replaces for every graph remat did not plan)."""
    from torch._inductor.virtualized import V

    current = V.choices
    if not isinstance(current, PlanOrderChoices):
        V.set_choices_handler(PlanOrderChoices(current))


__all__ = ["PlanOrderChoices", "install_plan_order_choices", "install_one_call_per_kernel", "fusion_raises_peak",
           "tag_plan_memory", "store_random_masks", "store_where_planned", "MAX_FUSION_GAP", "MEMORY_BEFORE", "PLAN_PEAK"]

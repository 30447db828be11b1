"""remat as Inductor's partitioner: Inductor's fused kernels, remat's plans and budget.

    m = remat.compile(model, x, budget=0.4)                  # Inductor under the hood
    m = remat.optimize(model, x, budget=0.4, compiler="inductor")   # the same
    torch.compile(model, options={"custom_partitioner_fn": remat.partitioner(budget=0.4),
                                  **remat.inductor.INDUCTOR_CONSTRAINTS})   # by hand

Inductor calls ``torch._inductor.config.custom_partitioner_fn`` with the joint forward+backward
graph after its joint-graph passes; :class:`RematPartitioner` captures it, fuses it as Inductor
will (:mod:`remat.fusion`), plans the fused graph and lowers the plan for a compiler (random ops
through :mod:`remat.compiled_ops`); Inductor compiles the two graphs it returns.

What remat asks of Inductor (:data:`INDUCTOR_CONSTRAINTS`) so that the plan's memory is the compiled
step's memory:

* ``realize_reads_threshold = 0``: a pointwise value read by several ops is stored once, not
  recomputed inside each reader (which would stretch its inputs' lifetimes past the plan's). Where
  computing it in each reader pays, remat writes the copies into the graph it plans instead
  (:func:`remat.fusion.recompute_light_values_per_reader`: a light forward value the backward
  reads, copied per backward reader), so the planner sees them;
* ``layout_optimization = False``: no channels-last copies of convolution inputs and weights that
  the plan cannot see (give the model channels-last tensors yourself if you want that layout);
* ``reorder_for_peak_memory = False``: Inductor keeps the plan's order;
* ``allow_buffer_reuse = False``: a buffer is freed where it dies. Inductor would otherwise keep a
  dead buffer for a later allocation of the same size (its ``# reuse`` lines), when its own estimate
  of the graph's peak says that is free; that estimate leaves out the backward's saved inputs, and
  on a 2-layer GPT-2 the buffers so kept raised the step 12% above the plan's peak. The allocator
  (CUDA's caching allocator, or malloc) hands the freed memory out again anyway;
* ``fx_graph_cache = False``: every compilation goes through the partitioner, so that the module's
  ``plan`` exists and describes what runs (compiled kernels are still cached);
* through Inductor's heuristics hook (:class:`PlanOrderChoices`, installed for the thread that
  compiles), kernels fuse only when they are next to each other in the plan's order, and only while
  the fused kernel, which allocates everything it keeps before it runs and frees its inputs after,
  stays within the plan's peak (:func:`fusion_raises_peak`, from the simulated memory
  :func:`tag_plan_memory` writes on the lowered graphs). This holds for vertical fusion (producer
  into consumer) and horizontal fusion (two kernels that read the same buffer) alike. Horizontal
  fusion across the order would run the later kernel at the earlier one's place and pull its
  inputs' computation forward: two recomputed copies of one chain, made for two backward uses, were
  merged and both kept alive (a small ResNet measured 1.5x the prediction before fusion was
  limited to neighbours). Between neighbours it moves nothing and saves a read: the
  two sums of a BatchNorm backward share their inputs' pass (ResNet-18 of ``benchmarks/inductor.py``:
  60.5 ms a step against 63.3 with horizontal fusion off, the same peaks);
* and on the CPU each generated kernel is called on its own (:func:`install_one_call_per_kernel`):
  the C++ backend would call all kernels between two extern kernels as one function, holding all
  their outputs and all their dying inputs at once;
* Inductor's seeded random numbers (its replacement of dropout's draws) are drawn again inside
  each reader (:func:`remat.fusion.draw_random_per_reader`), so no dropout mask is stored; and in
  the lowered graphs, a copy of a value computed from drawn numbers that the fused graph stores is
  stored also where the copy has a single reader, which Inductor would compute it inside
  (:func:`store_random_masks`).

What stays on: Inductor writes a kernel's output into the storage of an input that dies there
(``config.inplace_buffers``); the fused graph lists where it can (:func:`remat.fusion.inplace_reuses`)
and the simulator counts it, and :func:`plan_into_reused_bytes` plans again at a raised budget to
spend the bytes so saved on fewer recomputations.

**The budget is checked, not only predicted.** Inductor's scheduler may still allocate in ways no
graph-level model follows exactly, so with example inputs :func:`compile` runs the compiled step
once, measures its peak (the same measurement as :mod:`remat.measure`), and while it is above the
budget plans again with the budget lowered by the excess (at most ``CALIBRATION_ROUNDS`` times);
``plan.info["measured_peak"]`` and ``plan.info["calibration"]`` record it.

**Offloading** (``solver="hybrid"`` or ``"checkmate_swap"``): the lowering writes the store's calls as
the operators ``remat::offload`` and ``remat::reload`` (:mod:`remat.compiled_ops`), which Inductor
calls as extern kernels in the plan's order; a reload returns once its copy has landed, so the plan
is made with synchronous copies (:func:`compiled_transfer_meta`). ``auto`` plans recomputation
alone while that reaches the budget, unless the plan made with the offload tier's costs (the
``hybrid`` solver's) is predicted at least ``OFFLOAD_MIN_GAIN`` cheaper (close calls stay with
recomputation: on the GPT-2 of ``benchmarks/inductor.py`` at fraction 0.2 a hybrid plan predicted
2.5% faster than hierarchical's measured 0.5% slower; near recomputation's smallest budget on
ResNet-18 the hybrid plan measured 1.9x faster), and offloads below
that: at a budget recomputation misses, and for ``budget="min"``, it plans again with the offload
tier's costs (:func:`with_transfer_costs`), so the minimum an infeasible budget names includes
the offloading plans' reach (the zoo's GPT-2: 0.82x recomputation's; ResNet-18: 0.70x).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import warnings
from typing import Any

import torch
import torch.nn as nn
from torch._inductor.choices import InductorChoices
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from . import compiled_ops  # noqa: F401  (registers remat's operators before any compiled graph runs)
from .backend import BackendOptions, _device_of
from .cache import code_fingerprint, plan_with_cache
from .capture import capture_joint
from .cost import INDUCTOR_COST_MODEL, make_cost_fn, make_transfer_meta, make_workspace_fn
from .cost.inductor import InductorCostModel
from .errors import InfeasibleBudgetError, MeasuredAboveBudgetWarning, SolverError
from .fusion import (INDUCTOR_RANDOM, Fused, _inlines_its_inputs, draw_random_per_reader, fuse,
                     recompute_light_values_per_reader)
from .lower import lower
from .plan import COMPUTE
from .planner import is_min, resolve, store_all_plan, uses_swaps

INDUCTOR_CONSTRAINTS = {
    "realize_reads_threshold": 0,
    "layout_optimization": False,
    "reorder_for_peak_memory": False,
    "fx_graph_cache": False,
    "allow_buffer_reuse": False,
}
CALIBRATION_ROUNDS = 3
SLACK_ROUNDS = 4  # plans made at raised budgets to use the bytes Inductor reuses in place
SLACK_MIN_FRACTION = 0.005  # ... while at least this fraction of the budget is left over
# Solvers that offload: these always get the offload tier's costs; ``auto`` below what recomputation
# reaches, and where its recomputation plan is costly (see the module docstring).
OFFLOADING_SOLVERS = ("hybrid", "checkmate_swap")
OFFLOAD_MIN_GAIN = 0.10  # where recomputation reaches the budget, auto plans with offloads only when this much cheaper
# offloading plans are made at the budget and at one raise into reused bytes (each runs auto's solvers and
# hybrid's greedy; more raises found the same plans on ResNet-18 at 20-24 MiB, in twice the time)
OFFLOAD_TRY_REUSE_ROUNDS = 1


def plan_into_reused_bytes(plan, budget_bytes: int, make, rounds: int = SLACK_ROUNDS):
    """The cheapest of ``plan`` and plans made at raised budgets whose simulated peak fits ``budget_bytes``.

    The planners count an op's output beside its inputs; the simulator also counts what Inductor
    writes into the storage of a dying input (:func:`remat.fusion.inplace_reuses`), so a plan made
    at the budget peaks below it. Plan again with the budget raised by the bytes left over, and
    bisect between the last raise that fitted and the first that did not (``rounds`` plans at most):
    those bytes buy fewer recomputations."""
    high = None  # the lowest raised planning budget whose plan did not fit
    planned_at = chosen_at = budget_bytes  # the highest raised budget that fitted; where ``plan`` was made
    worth_trying = max(SLACK_MIN_FRACTION * budget_bytes, 1)
    for _ in range(rounds):
        gap = budget_bytes - plan.peak_bytes if high is None else high - planned_at  # bytes still unused / untried
        if gap < worth_trying:
            break
        trial = planned_at + (gap if high is None else gap // 2)
        try:
            candidate = make(trial)
        except InfeasibleBudgetError:
            break
        if candidate.peak_bytes <= budget_bytes:
            if candidate.step_seconds <= plan.step_seconds:
                plan, chosen_at = candidate, trial
            planned_at = trial
        else:
            high = trial
    if chosen_at != budget_bytes:
        plan = copy.copy(plan)  # plans are shared by the caches
        plan.budget_bytes = budget_bytes
        plan.info = {**plan.info, "planned_at_bytes": chosen_at}
    return plan


def with_transfer_costs(fused: Fused, transfer: dict) -> Fused:
    """``fused`` with the offload tier's costs in the meta of its graph and of the op-level graph
    (what the planners and the expansion of an offloading plan read)."""

    def costed(graph):
        return dataclasses.replace(graph, meta={**graph.meta, "transfer": dict(transfer)})

    return dataclasses.replace(fused, graph=costed(fused.graph), original=costed(fused.original))


def compiled_transfer_meta(device) -> dict:
    """The offload tier's measured costs (``graph.meta["transfer"]``) for a graph Inductor compiles:
    its copies are synchronous (``remat::reload`` returns once the copy has landed; see
    :mod:`remat.compiled_ops`), so they never overlap compute."""
    return {**make_transfer_meta(device), "overlap": False}


class RematPartitioner(CustomPartitionerFn):
    """Inductor's partitioner replaced by remat's capture, fusion model, planner and lowering.

    ``margin_bytes`` is subtracted from the budget (bytes) before planning; :func:`compile`
    raises it when a measured step comes out above the budget."""

    def __init__(self, options: BackendOptions, margin_bytes: int = 0):
        self.options = options
        self.margin_bytes = int(margin_bytes)
        self.last_plan = None
        self.last_budget_bytes: int | None = None

    def __call__(self, gm: torch.fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **_kwargs):
        install_plan_order_choices()  # before Inductor schedules the two graphs returned here
        install_one_call_per_kernel()
        opts = self.options
        device = _device_of(gm)
        seeded_copies = draw_random_per_reader(gm)
        light_copies = recompute_light_values_per_reader(gm)
        costs = InductorCostModel(device) if opts.cost_model == "inductor" else None
        capture = capture_joint(
            gm, num_fwd_outputs,
            cost_fn=costs.node_seconds if costs else make_cost_fn(opts.cost_model, device),
            workspace_fn=make_workspace_fn(opts.workspace),
            transfer=compiled_transfer_meta(device) if opts.solver in OFFLOADING_SOLVERS else None,
        )
        fused = fuse(capture, kernel_seconds=costs.kernel_seconds if costs else None)
        if opts.solver == "auto" and is_min(opts.budget):  # the smallest peak, offloading included
            fused = with_transfer_costs(fused, compiled_transfer_meta(device))
        try:
            plan = self._plan(fused)
        except InfeasibleBudgetError:
            if opts.solver != "auto" or uses_swaps(fused.graph):
                raise
            # below what recomputation reaches: auto offloads too (its error then names that minimum)
            fused = with_transfer_costs(fused, compiled_transfer_meta(device))
            plan = self._plan(fused, reuse_rounds=OFFLOAD_TRY_REUSE_ROUNDS)
        else:
            if opts.solver == "auto" and not uses_swaps(fused.graph):
                fused, plan = self._offload_if_much_cheaper(fused, plan, device)
        self.last_plan = plan
        if opts.on_plan is not None:
            opts.on_plan(plan, capture)
        expanded = fused.expand(plan)
        graphs = lower(capture, expanded, compiled=True, keep_apart=fused.deferred_adds)
        plan.info["seeded_copies"] = seeded_copies
        plan.info["light_copies"] = light_copies
        plan.info["stored_masks"] = store_random_masks(graphs, expanded, fused)
        tag_plan_memory(graphs, plan, expanded, fused.members)
        return graphs

    def _plan(self, fused, reuse_rounds: int = SLACK_ROUNDS):
        """The plan of ``fused``'s graph at the budget less the margin (raised into the bytes
        Inductor writes in place where that fits, in at most ``reuse_rounds`` more plans)."""
        opts = self.options
        budget = opts.budget
        budget_bytes = None if budget is None else resolve(fused.graph, budget, opts.solver)
        self.last_budget_bytes = budget_bytes
        if budget_bytes is not None and self.margin_bytes:
            budget = max(0, budget_bytes - self.margin_bytes)

        def make(planning_budget):
            return plan_with_cache(
                fused.graph, planning_budget, opts.solver, time_limit=opts.time_limit,
                solver_options=opts.solver_options, cost_model=opts.cost_model, cache=opts.cache,
            )

        plan = make(budget)
        if budget_bytes is not None and budget != "min" and fused.graph.meta.get("inplace_reuse"):
            plan = plan_into_reused_bytes(plan, budget_bytes - self.margin_bytes, make, rounds=reuse_rounds)
        plan.info["compiler"] = "inductor"
        if budget_bytes is not None:
            plan.info["budget_bytes"] = budget_bytes
        if self.margin_bytes:
            plan.info["planned_below_budget_by"] = self.margin_bytes
        return plan

    def _offload_if_much_cheaper(self, fused, plan, device):
        """``auto``'s recomputation plan, or, where it costs much more than computing everything once,
        the plan made with the offload tier's costs (``auto`` then also runs the ``hybrid`` solver, a
        greedy refinement of the recomputation plan that offloads where that pays) when that is at
        least ``OFFLOAD_MIN_GAIN`` cheaper (predicted step time). Near recomputation's smallest budget
        the recomputation solvers' plans can cost far more: ResNet-18 of ``benchmarks/inductor.py`` at
        30 MiB, ``keep_set``'s plan 92 ms predicted and 118 ms measured, ``hybrid``'s 62 and 63 (it
        offloaded nothing: its refinement found cheaper recomputations; that was while BatchNorm stages
        were pinned for ``hierarchical``, whose own plan there is now 56 ms predicted). Where the two are close,
        recomputation stays (on GPT-2 at fraction 0.2 a hybrid plan predicted 2.5% faster measured
        0.5% slower). No plan costs less than the store-everything step, so the second planning runs
        only when the recomputation plan costs more than that by the same fraction."""
        store_all_seconds = store_all_plan(fused.graph).step_seconds
        if plan.step_seconds * (1 - OFFLOAD_MIN_GAIN) <= store_all_seconds:
            return fused, plan
        offloading = with_transfer_costs(fused, compiled_transfer_meta(device))
        alternative = self._plan(offloading, reuse_rounds=OFFLOAD_TRY_REUSE_ROUNDS)
        if alternative.step_seconds < (1 - OFFLOAD_MIN_GAIN) * plan.step_seconds:
            alternative.info = {**alternative.info, "recomputation plan's step": plan.step_seconds}
            return offloading, alternative
        return fused, plan

    def __getstate__(self) -> dict:
        """Inductor pickles its config (cache keys): without the plan callback and the last plan."""
        state = dict(self.__dict__)
        state["options"] = dataclasses.replace(self.options, on_plan=None)
        state["last_plan"] = None
        return state

    def uuid(self) -> str:
        """Everything that changes the plan: budget, solver and its options, cost and workspace
        models, the margin, remat's code and torch's version (Inductor's cache key)."""
        o = self.options
        described = json.dumps({
            "budget": repr(o.budget), "solver": o.solver, "cost_model": repr(o.cost_model),
            "workspace": o.workspace, "time_limit": o.time_limit,
            "solver_options": repr(sorted((o.solver_options or {}).items())),
            "margin": self.margin_bytes, "remat": code_fingerprint(), "torch": torch.__version__,
        }, sort_keys=True)
        return hashlib.sha256(described.encode()).hexdigest()


def partitioner(budget=None, solver: str = "auto", cost_model: Any = INDUCTOR_COST_MODEL, *, workspace: str = "measure",
                time_limit: float | None = None, solver_options: dict | None = None, cache: bool = True,
                on_plan=None) -> RematPartitioner:
    """A ``CustomPartitionerFn`` for ``torch._inductor.config.custom_partitioner_fn``.

    Pass it with :data:`INDUCTOR_CONSTRAINTS` (see :func:`inductor_options`), which the memory model
    relies on. ``budget`` as in :func:`remat.optimize`; it applies to each graph Inductor compiles."""
    options = BackendOptions.from_dict(dict(
        budget=budget, solver=solver, cost_model=cost_model, workspace=workspace, time_limit=time_limit,
        solver_options=solver_options or {}, cache=cache, on_plan=on_plan,
    ))
    return RematPartitioner(options)


MAX_FUSION_GAP = 1  # kernels fuse only when next to each other in the plan's order
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
    realize = torch.ops.prims.inductor_force_stride_order.default
    count = 0
    for gm in graphs:
        stored_before = count
        for n in list(gm.graph.nodes):
            i = n.meta.get("remat_instruction")
            val = n.meta.get("val")
            if i is None or expanded.instructions[i].target not in masks or not isinstance(val, torch.Tensor):
                continue
            readers = _readers_through_views(n)
            if len(readers) != 1 or not _inlines_its_inputs(readers[0]):
                continue
            with gm.graph.inserting_after(n):
                stored_copy = gm.graph.call_function(realize, (n, list(val.stride())))
            n.replace_all_uses_with(stored_copy, delete_user_cb=lambda user: user is not stored_copy)
            stored_copy.meta.update(n.meta)
            count += 1
        if count > stored_before:
            gm.recompile()
    return count


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
    from torch._inductor.utils import get_dtype_size
    from torch._inductor.virtualized import V

    try:
        return int(V.graph.sizevars.optimization_hint(buf.node.get_numel(), fallback=0)) * get_dtype_size(
            buf.node.get_dtype())
    except (NotImplementedError, AttributeError, AssertionError):  # no tensor (a multi-output op's list)
        return 0


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
    """Whether the graph Inductor compiles now is one remat planned."""
    return isinstance(torch._inductor.config.custom_partitioner_fn, RematPartitioner)


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


def inductor_options(part: RematPartitioner, *, mode: str | None = None, options: dict | None = None) -> dict:
    """``torch.compile(options=...)`` for Inductor with ``part``: the options of ``mode`` (torch.compile
    refuses a mode and options together, so the mode is spelled out), then the user's ``options``,
    then remat's partitioner and :data:`INDUCTOR_CONSTRAINTS`."""
    merged = dict(torch._inductor.list_mode_options(mode)) if mode else {}
    merged.update(options or {})
    clashing = {k: merged[k] for k in INDUCTOR_CONSTRAINTS if k in merged and merged[k] != INDUCTOR_CONSTRAINTS[k]}
    if clashing or "custom_partitioner_fn" in merged:
        raise TypeError(
            f"remat sets the Inductor options {sorted(INDUCTOR_CONSTRAINTS) + ['custom_partitioner_fn']} itself (its "
            f"memory model relies on them); remove {sorted(clashing) or ['custom_partitioner_fn']} from options"
        )
    merged.update(INDUCTOR_CONSTRAINTS)
    merged["custom_partitioner_fn"] = part
    return merged


def _scalar_of(output) -> torch.Tensor:
    """A scalar whose gradient reaches every output that requires one (their sum)."""
    leaves = [t for t in torch.utils._pytree.tree_leaves(output)
              if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
    if not leaves:
        loss = getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor):
            return loss
        raise SolverError("the model's output has no tensor that requires gradients: nothing to train")
    if len(leaves) == 1 and leaves[0].dim() == 0:  # a loss: nothing to add (a sum would allocate 2 scalars)
        return leaves[0]
    return sum(t.sum() for t in leaves)


def measured_step_peak(module: nn.Module, args: tuple, kwargs: dict, warmup: bool = True) -> int:
    """Peak memory growth of one forward+backward of ``module`` (parameters' ``.grad`` cleared before,
    restored after; buffers and random generators restored): what the budget bounds.

    With ``warmup`` the step runs once unmeasured first: a compiled module's first backward compiles
    its backward graph, and on a GPU that compilation (Triton autotuning buffers) and the libraries'
    one-time allocations (cuBLAS/cuDNN workspaces, kept for the process) would count as step memory.
    (Without it, on an H100, calibration read 51.7 MiB in every round for a tiny ResNet whose Inductor
    step peaks at 0.8 MiB, each re-plan compiling again, and declared the budget infeasible. The
    warm-up has not been re-run on a GPU since.)"""
    from .api import _detached_copies, _no_lasting_effects, _training_step_mode
    from .measure import peak_memory_growth

    params = [p for p in module.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    device = next((p.device for p in params), torch.device("cpu"))
    try:
        for p in params:
            p.grad = None
        with _training_step_mode(), _no_lasting_effects(module):
            a, k = _detached_copies(args), _detached_copies(kwargs)
            if warmup:
                _scalar_of(module(*a, **k)).backward()
                for p in params:
                    p.grad = None
            peak, _ = peak_memory_growth(lambda: _scalar_of(module(*a, **k)).backward(), device)
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    return int(peak)


def calibrate(wrapped, part_factory, args: tuple, kwargs: dict) -> None:
    """Run ``wrapped`` (a RematModule compiled with Inductor) once, measure its peak and, while the
    peak is above the budget, re-plan with the budget lowered by the excess (``part_factory(margin)``
    recompiles). Raises InfeasibleBudgetError when the lowered budget has no plan."""
    margin, history, budget_bytes = 0, [], None
    for round_ in range(CALIBRATION_ROUNDS + 1):
        try:
            peak = measured_step_peak(wrapped, args, kwargs)
        except Exception as err:  # planning below the budget by the excess may find no plan
            from .api import _unwrap_compile_error

            if round_ == 0 or not isinstance(_unwrap_compile_error(err), InfeasibleBudgetError):
                raise
            raise InfeasibleBudgetError(
                budget_bytes, peak,
                f"the Inductor-compiled step measured {peak} bytes, above the budget; planning below it by the "
                f"excess found no plan ({'; '.join(history)})",
            ) from err
        plan, part = wrapped.plan, wrapped._remat_partitioner
        budget_bytes = part.last_budget_bytes
        history.append(f"planned {plan.peak_bytes} bytes below {budget_bytes - margin if budget_bytes else None}, "
                       f"measured {peak}")
        # "min" asks for the smallest peak: the plan for it is already the smallest, nothing to lower
        smallest = is_min(part.options.budget)
        fits = budget_bytes is None or smallest or peak <= budget_bytes
        if fits or round_ == CALIBRATION_ROUNDS:
            plan.info["measured_peak"] = peak
            plan.info["calibration"] = "; ".join(history)
            if smallest and peak > budget_bytes:
                warnings.warn(MeasuredAboveBudgetWarning(
                    f"budget='min': the compiled step measured {peak} bytes, {peak - budget_bytes} above the "
                    f"plan's {budget_bytes} (Inductor's kernels hold more than the plan there; no lower plan "
                    f"exists to re-plan to). Give a byte budget of at least {peak} bytes to have it checked"
                ), stacklevel=3)
            if not fits:
                raise InfeasibleBudgetError(
                    budget_bytes, peak,
                    f"the Inductor-compiled step still measured {peak} bytes after {CALIBRATION_ROUNDS} re-plans "
                    f"below the budget ({plan.info['calibration']})",
                )
            return
        margin += peak - budget_bytes + max(1, budget_bytes // 200)  # the excess, and 0.5% more
        wrapped._recompile(part_factory(margin))  # planned again by the next measurement


__all__ = ["RematPartitioner", "partitioner", "inductor_options", "INDUCTOR_CONSTRAINTS", "calibrate",
           "measured_step_peak", "CALIBRATION_ROUNDS", "PlanOrderChoices", "install_plan_order_choices",
           "install_one_call_per_kernel", "fusion_raises_peak", "tag_plan_memory", "with_transfer_costs",
           "MAX_FUSION_GAP", "plan_into_reused_bytes", "store_random_masks"]

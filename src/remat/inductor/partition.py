"""remat as Inductor's partitioner: Inductor's fused kernels, remat's plans and budget.

    m = remat.compile(model, x, budget=0.4)                  # Inductor under the hood
    m = remat.optimize(model, x, budget=0.4, compiler="inductor")   # the same
    torch.compile(model, options={"custom_partitioner_fn": remat.partitioner(budget=0.4),
                                  **remat.inductor.INDUCTOR_CONSTRAINTS})   # by hand

Inductor calls ``torch._inductor.config.custom_partitioner_fn`` with the joint forward+backward
graph after its joint-graph passes; :class:`RematPartitioner` captures it, fuses it as Inductor
will (:mod:`remat.inductor.fusion`), plans the fused graph and lowers the plan for a compiler (random ops
through :mod:`remat.execute.compiled_ops`); Inductor compiles the two graphs it returns.

What remat asks of Inductor (:data:`INDUCTOR_CONSTRAINTS`) so that the plan's memory is the compiled
step's memory:

* ``realize_reads_threshold = 0``: a pointwise value read by several ops is stored once, not
  recomputed inside each reader (which would stretch its inputs' lifetimes past the plan's). Where
  computing it in each reader pays, remat writes the copies into the graph it plans instead
  (:func:`remat.inductor.fusion.recompute_light_values_per_reader`: a light forward value the backward
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
  each reader (:func:`remat.inductor.fusion.draw_random_per_reader`), so no dropout mask is stored; and in
  the lowered graphs, a copy of a value computed from drawn numbers that the fused graph stores is
  stored also where the copy has a single reader, which Inductor would compute it inside
  (:func:`store_random_masks`), and so is a value Inductor would compute later than the plan does
  (:func:`store_where_planned`: its inputs would stay alive until then).

What stays on: Inductor writes a kernel's output into the storage of an input that dies there
(``config.inplace_buffers``); the fused graph lists where it can (:func:`remat.inductor.fusion.inplace_reuses`)
and the simulator counts it, and :func:`plan_into_reused_bytes` plans again at a raised budget to
spend the bytes so saved on fewer recomputations.

**The budget is checked, not only predicted.** Inductor's scheduler may still allocate in ways no
graph-level model follows exactly, so with example inputs :func:`compile` runs the compiled step
once, measures its peak (the same measurement as :mod:`remat.measure`), and while it is above the
budget plans again with the budget lowered by the excess (at most ``CALIBRATION_ROUNDS`` times);
``plan.info["measured_peak"]`` and ``plan.info["calibration"]`` record it.

**Offloading** (``solver="hybrid"`` or ``"checkmate_swap"``): the lowering writes the store's calls as
the operators ``remat::offload`` and ``remat::reload`` (:mod:`remat.execute.compiled_ops`), which Inductor
calls as extern kernels in the plan's order; a reload returns once its copy has landed, so the plan
is made with synchronous copies (:func:`compiled_transfer_meta`). ``auto`` plans recomputation
alone while that reaches the budget, unless the plan made with the offload tier's costs (the
``hybrid`` solver's) is predicted at least ``OFFLOAD_MIN_GAIN`` cheaper (close calls stay with
recomputation: on the GPT-2 of ``benchmarks/inductor.py`` at fraction 0.2 a hybrid plan predicted
2.5% faster than hierarchical's measured 0.5% slower; near recomputation's smallest budget on
ResNet-18 the hybrid plan measured 1.9x faster), and offloads below
that: at a budget recomputation misses, and for ``budget="min"``, it plans again with the offload
tier's costs (:func:`with_transfer_costs`), so the minimum an infeasible budget names includes
the offloading plans' reach (the zoo's GPT-2: 0.88-0.91x recomputation's, as the profiled op costs
move it; ResNet-18: 0.70x).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from ..budget import fixed_bytes, is_fraction
from ..capture import capture_joint, joint_device
from ..capture.split import FASTER_SPLIT_OVERHEAD, SPLIT_FACTORS, SPLIT_FIRST_SOLVER, find_sites, split_info, split_joint
from ..capture.split_choice import (NOT_FASTER, faster_chunks, graded_chunks, lower_enough, refused_over_splits,
                                    smallest_split)
from ..capture.shapes import bucket_key, concrete_joint, guard_bucket, is_dynamic, name_bucket, refuse_unless_monotone
from ..capture.split_sizes import SymbolicSizes, chunk_counts
from ..cost import INDUCTOR_COST_MODEL, make_cost_fn, make_workspace_fn
from ..errors import CaptureError, InfeasibleBudgetError, RematError
from ..execute import compiled_ops  # noqa: F401  (registers remat's operators before any compiled graph runs)
from ..execute.lowering import lower
from ..execute.transfer import make_transfer_meta
from ..simulate import dependency_lower_bound, peak_lower_bound
from ..solvers.cache import code_fingerprint, plan_with_cache
from ..solvers.options import BackendOptions
from ..solvers.planner import given_plan, is_min, plannable_minimum, quick_minimum, resolve, store_all_plan, uses_swaps
from .cost import InductorCostModel
from .fusion import (Fused, draw_random_per_reader, fuse,
                     recompute_light_values_per_reader)
from .scheduling import (install_one_call_per_kernel, install_plan_order_choices, store_where_planned, store_random_masks,
                         tag_plan_memory)

INDUCTOR_CONSTRAINTS = {
    "realize_reads_threshold": 0,
    "layout_optimization": False,
    "reorder_for_peak_memory": False,
    "fx_graph_cache": False,
    "allow_buffer_reuse": False,
}
SLACK_ROUNDS = 4  # plans made at raised budgets to use the bytes Inductor reuses in place
SLACK_MIN_FRACTION = 0.005  # ... while at least this fraction of the budget is left over
# Solvers that offload: these always get the offload tier's costs; ``auto`` below what recomputation
# reaches, and where its recomputation plan is costly (see the module docstring).
OFFLOADING_SOLVERS = ("hybrid", "checkmate_swap")
OFFLOAD_MIN_GAIN = 0.10  # where recomputation reaches the budget, auto plans with offloads only when this much cheaper
# offloading plans are made at the budget and at one raise into reused bytes (each runs auto's solvers and
# hybrid's greedy; more raises found the same plans on ResNet-18 at 20-24 MiB, in twice the time)
OFFLOAD_TRY_REUSE_ROUNDS = 1


def _point_to_the_eager_batch_norm_split(err: InfeasibleBudgetError, gm: torch.fx.GraphModule) -> None:
    """Where the step has batch norms and no split site was found, say in ``err`` where they split
    otherwise.

    Inductor decomposes a training batch norm before its partitioner sees the graph: its statistics
    become a ``var_mean`` over the batch and the image, its backward two sums over them. Those split
    in stages (:mod:`remat.capture.split_barriers`) where the ops around them do; where no site was
    found (an op in it with no split rule), remat's own lowering, which keeps each batch norm whole
    and splits it in two passes, may still plan the budget."""
    count = sum(1 for n in gm.graph.nodes if n.target is torch.ops.aten.var_mean.correction
                and 0 in (list(n.args[1]) if len(n.args) > 1 and n.args[1] is not None else []))
    if count:
        err.args = (f"{err.args[0]} Splitting found no site to lower this floor under Inductor, which decomposes "
                    f"the step's {count} batch norm(s) into reductions over the whole batch. remat.optimize (remat's "
                    "own lowering, without Inductor's kernels) splits each batch norm whole, in two passes, chunk by "
                    "chunk, and may plan this budget.",)


def plan_into_reused_bytes(plan, budget_bytes: int, make, rounds: int = SLACK_ROUNDS):
    """The cheapest of ``plan`` and plans made at raised budgets whose simulated peak fits ``budget_bytes``.

    The planners count an op's output beside its inputs; the simulator also counts what Inductor
    writes into the storage of a dying input (:func:`remat.inductor.fusion.inplace_reuses`), so a plan made
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


def _symbolic_again(joint: torch.fx.GraphModule, planned: torch.fx.GraphModule) -> None:
    """Give the nodes of ``planned`` (a copy of ``joint`` made concrete at a bucket's edge, which was
    captured and planned) ``joint``'s symbolic values again, so that the graphs lowered from it carry
    them and Inductor compiles kernels for every size of the bucket."""
    for symbolic, concrete in zip(joint.graph.nodes, planned.graph.nodes):
        if "val" in symbolic.meta:
            concrete.meta["val"] = symbolic.meta["val"]


def _symbolic_split(joint: torch.fx.GraphModule, split: torch.fx.GraphModule) -> None:
    """Give the nodes of ``split`` (a split of ``joint``'s copy made concrete at a bucket's edge, its
    chunk sizes computed from the size inputs) symbolic values: fake tensors of ``joint``'s symbolic
    inputs propagated through it, in ``joint``'s shape environment."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    inputs = [n.meta["val"] for n in joint.graph.find_nodes(op="placeholder")]
    FakeTensorProp(split, torch._guards.detect_fake_mode(inputs)).propagate_dont_convert_inputs(*inputs)


def with_transfer_costs(fused: Fused, transfer: dict) -> Fused:
    """``fused`` with the offload tier's costs in the meta of its graph and of the op-level graph
    (what the planners and the expansion of an offloading plan read)."""

    def costed(graph):
        return dataclasses.replace(graph, meta={**graph.meta, "transfer": dict(transfer)})

    return dataclasses.replace(fused, graph=costed(fused.graph), original=costed(fused.original))


def compiled_transfer_meta(device) -> dict:
    """The offload tier's measured costs (``graph.meta["transfer"]``) for a graph Inductor compiles:
    its copies are synchronous (``remat::reload`` returns once the copy has landed; see
    :mod:`remat.execute.compiled_ops`), so they never overlap compute."""
    return {**make_transfer_meta(device), "overlap": False}


class RematPartitioner(CustomPartitionerFn):
    """Inductor's partitioner replaced by remat's capture, fusion model, planner and lowering.

    ``margin_bytes`` is subtracted from the budget (bytes) before planning; :func:`compile`
    raises it when a measured step comes out above the budget."""

    planned_by_remat = True  # Inductor's scheduler keeps to the plan in graphs this partitioner makes (scheduling.py)

    def __init__(self, options: BackendOptions, margin_bytes: int = 0):
        self.options = options
        self.margin_bytes = int(margin_bytes)
        self.last_plan = None
        self.last_budget_bytes: int | None = None
        self.bucket_budget_bytes: int | None = None  # a fraction's bytes at the largest bucket planned so far
        self.refused: dict = {}  # (bucket, budget bytes) -> the error its planning raised (raised again)
        self._made: dict = {}  # one call's split steps and captures, made once (see _split_step)

    def __call__(self, gm: torch.fx.GraphModule, joint_inputs, *, num_fwd_outputs: int, **_kwargs):
        try:
            return self._partition(gm, num_fwd_outputs)
        finally:
            self._made.clear()  # the steps weighed are not kept past their call

    def _partition(self, gm: torch.fx.GraphModule, num_fwd_outputs: int):
        started = time.perf_counter()
        install_plan_order_choices()  # before Inductor schedules the two graphs returned here
        install_one_call_per_kernel()
        opts = self.options
        device = joint_device(gm)
        low, bucket = self._bucket(gm) if is_dynamic(gm) else (None, None)
        key = None if bucket is None else bucket_key(bucket)
        if (key, self.bucket_budget_bytes) in self.refused:  # refused at this budget already (a fraction's
            raise self.refused[(key, self.bucket_budget_bytes)]  # bytes grow with the buckets: then it plans again)
        seeded_copies = draw_random_per_reader(gm)
        light_copies = recompute_light_values_per_reader(gm)
        # a graph with symbolic sizes is planned at its bucket's edge, and lowered with its symbolic sizes
        planned_gm = gm if bucket is None else concrete_joint(gm, bucket)
        costs = InductorCostModel(device) if opts.cost_model == "inductor" else None
        split = opts.split if opts.plan is None else "off"
        # a bucket's copy splits with its chunks' sizes computed at run time (capture.split_sizes)
        sizes = None if bucket is None else SymbolicSizes(gm, low, bucket)
        sites = find_sites(planned_gm, num_fwd_outputs, sizes) if isinstance(split, int) and split > 1 else []
        chunks = max(chunk_counts(sizes, sites, range(2, split + 1)), default=None) if sites else None
        # a fraction is of the step as captured, unsplit (as in the eager backend), also for a split step
        forced_bytes = (self._unsplit_budget_bytes(planned_gm, num_fwd_outputs, device, costs)
                        if chunks and is_fraction(opts.budget) else None)
        # budget="min": the split step's smallest plan first; the step as captured is searched only where
        # that plan is not lower enough than every plan of it (its lower bound)
        smaller = (self._smallest_split(planned_gm, num_fwd_outputs, device, costs, bucket, key, sizes)
                   if split == "auto" and not chunks and self._may_split_for_min() else None)
        min_chunks, min_sites, min_planned, unsplit_captured = smaller or (None, None, None, None)
        try:
            if smaller is not None and lower_enough(min_planned[2].peak_bytes,
                                                    dependency_lower_bound(unsplit_captured[1].graph)):
                chunks, sites, (capture, fused, plan) = min_chunks, min_sites, min_planned
            else:
                capture, fused, plan = self._capture_and_plan(
                    self._split_step(planned_gm, num_fwd_outputs, sites, chunks, sizes) if chunks else planned_gm,
                    num_fwd_outputs, device, costs, bucket, key, split_step=bool(chunks), budget_bytes=forced_bytes,
                    captured=unsplit_captured)
        except InfeasibleBudgetError as refused:
            sites = find_sites(planned_gm, num_fwd_outputs, sizes) if split == "auto" and opts.solver == "auto" else []
            factors = chunk_counts(sizes, sites, SPLIT_FACTORS)
            if not sites or not factors:
                if split == "auto" and not sites:
                    _point_to_the_eager_batch_norm_split(refused, planned_gm)
                raise
            unsplit_bytes = self.last_budget_bytes if is_fraction(opts.budget) else None  # resolved on the unsplit step
            # below the step's floor as captured: its largest ops split into 2, 4, ... chunks, the fewest that plan
            for i, chunks in enumerate(factors):  # the fewest chunks a quick or keep-set plan fits, planned in full
                planned = self._quick_split_plan(planned_gm, num_fwd_outputs, device, costs, sites, chunks,
                                                 unsplit_bytes, bucket, key, sizes, plannable=True)
                if planned is not None:
                    capture, fused, plan = planned
                    break
            else:  # no quick or keep-set plan fits: a full search per count (the eager backend's rule)
                try:
                    i, (capture, fused, plan) = self._searched_split(planned_gm, num_fwd_outputs, device, costs,
                                                                     sites, factors, unsplit_bytes, bucket, key, sizes,
                                                                     refused)
                except InfeasibleBudgetError as err:  # a bucket's refusal names its sizes and is kept, split or not
                    if bucket is not None:
                        named = err if getattr(err, "bucket", None) else name_bucket(err, key)
                        self.refused[(key, self.bucket_budget_bytes)] = named
                    raise
                chunks = factors[i]
            if plan.step_overhead > FASTER_SPLIT_OVERHEAD:  # more chunks leave more memory for what it recomputes
                faster = self._faster_split(planned_gm, num_fwd_outputs, device, costs, plan, sites, factors[i + 1:],
                                            unsplit_bytes, f"{chunks} chunks'", bucket, key, sizes)
                if faster is not None:
                    chunks, (capture, fused, plan) = faster
            chunks, (capture, fused, plan) = self._graded(planned_gm, num_fwd_outputs, device, costs, sites, chunks,
                                                          (capture, fused, plan), unsplit_bytes, bucket, key, sizes)
            fused, plan = self._offered_offload(fused, plan, device, unsplit_bytes, bucket)
        else:
            if smaller is not None and not chunks and lower_enough(min_planned[2].peak_bytes, plan.peak_bytes):
                chunks, sites, (capture, fused, plan) = min_chunks, min_sites, min_planned
            elif split == "auto" and not chunks and self._may_split_for_speed(plan, bucket):
                sites, budget_bytes = find_sites(planned_gm, num_fwd_outputs), self.last_budget_bytes
                faster = self._faster_split(planned_gm, num_fwd_outputs, device, costs, plan, sites, SPLIT_FACTORS,
                                            budget_bytes, "unsplit")
                if faster is not None:
                    chunks, planned = faster
                    chunks, (capture, fused, plan) = self._graded(planned_gm, num_fwd_outputs, device, costs, sites,
                                                                  chunks, planned, budget_bytes)
                    fused, plan = self._offered_offload(fused, plan, device, budget_bytes)
        # the chosen plan's budget (plans weighed and not taken set it too; "min" resolves per split step)
        self.last_budget_bytes = plan.info.get("budget_bytes", self.last_budget_bytes)
        # planned after all (split below the floor): a refusal recorded on the way is not this bucket's answer
        self.refused.pop((key, self.bucket_budget_bytes), None)
        if chunks:
            plan.info["split"] = split_info(chunks, sites)
        if bucket is not None:
            plan.info["bucket"] = dict(key)
            if chunks:
                _symbolic_split(gm, capture.joint)
            else:
                _symbolic_again(gm, planned_gm)
        self.last_plan = plan
        if opts.on_plan is not None:
            opts.on_plan(plan, capture)
        expanded = fused.expand(plan)
        graphs = lower(capture, expanded, compiled=True, keep_apart=fused.deferred_adds,
                       offload_dir=self.options.offload_dir)
        plan.info["seeded_copies"] = seeded_copies
        plan.info["light_copies"] = light_copies
        plan.info["stored_masks"] = store_random_masks(graphs, expanded, fused)
        plan.info["stored_where_planned"] = store_where_planned(graphs)
        tag_plan_memory(graphs, plan, expanded, fused.members)
        plan.info["partition_seconds"] = time.perf_counter() - started  # captured, planned, lowered
        return graphs

    def _unsplit_budget_bytes(self, planned_gm, num_fwd_outputs, device, costs) -> int:
        """The options' budget (a fraction) in bytes of the step as captured, unsplit and fused."""
        _, fused = self._capture_and_fuse(planned_gm, num_fwd_outputs, device, costs)
        return resolve(fused.graph, self.options.budget, self.options.solver)

    def _quick_split_plan(self, planned_gm, num_fwd_outputs, device, costs, sites, chunks, budget_bytes,
                          bucket=None, key=None, sizes=None, within: float | None = None, plannable: bool = False):
        """(capture, fused, plan) of the step with ``sites`` split into ``chunks``, where a quick plan fits
        (``plannable``: or the keep-set model's smallest plan, :func:`~remat.solvers.planner.plannable_minimum`;
        ``budget_bytes``: the unsplit step's, None: the options' budget resolved on the split step); None
        where none fits or the plan is infeasible; ``NOT_FASTER`` where (``within``, seconds) the split step's
        store-all step already takes that long. ``sizes``: the bucket's (:mod:`remat.capture.split_sizes`).
        The plan weighs a split: the step chosen among them is offered the offload tier afterwards, once
        (:meth:`_offered_offload`; for each split weighed, that took a minute on a two-site MLP)."""
        try:
            return self._capture_and_plan(self._split_step(planned_gm, num_fwd_outputs, sites, chunks, sizes), num_fwd_outputs,
                                          device, costs, bucket, key, split_step=True, quick_only=True,
                                          keep_set_gate=plannable, budget_bytes=budget_bytes, within=within,
                                          offload_check=False)
        except InfeasibleBudgetError:
            return None

    def _searched_split(self, planned_gm, num_fwd_outputs, device, costs, sites, factors, budget_bytes,
                        bucket, key, sizes, refused: InfeasibleBudgetError):
        """``(index of the count in factors, (capture, fused, plan))``: the step with ``sites`` split into the
        fewest chunks of ``factors`` that a full search plans within the budget (``budget_bytes``: the
        unsplit step's, None: the options' budget resolved on the split step), where no quick plan fit any
        count. Counts whose lower bound (:func:`~remat.simulate.peak_lower_bound`) is above the budget are
        not searched. Raises the refusal, naming the least budget any count reaches, where none plans."""
        least = refused.min_budget_bytes
        bounds = []  # each split step's: no plan of it peaks below
        for i, k in enumerate(factors):
            step = self._split_step(planned_gm, num_fwd_outputs, sites, k, sizes)
            captured = self._capture_and_fuse(step, num_fwd_outputs, device, costs)
            graph = captured[1].graph
            least = min(least, quick_minimum(graph))
            budget = budget_bytes if budget_bytes is not None else resolve(graph, self.options.budget)
            bounds.append(peak_lower_bound(graph))
            if budget < bounds[-1]:
                continue
            try:
                reused = captured if self.options.solver not in OFFLOADING_SOLVERS else None  # same transfer costs
                return i, self._capture_and_plan(step, num_fwd_outputs, device, costs, bucket, key, split_step=True,
                                                 budget_bytes=budget_bytes, offload_check=False, captured=reused)
            except InfeasibleBudgetError as err:
                least = min(least, err.min_budget_bytes)
        if least >= refused.min_budget_bytes:
            raise refused
        unsplit = self._capture_and_fuse(planned_gm, num_fwd_outputs, device, costs)[1].graph
        store, fixed = store_all_plan(unsplit).peak_bytes, fixed_bytes(unsplit)
        bound = min([peak_lower_bound(unsplit), *bounds])  # below every plan of the step, split or not
        raise refused_over_splits(refused, least, factors[-1], store, fixed, bound) from None

    def _may_split_for_min(self) -> bool:
        """Whether ``split="auto"`` looks below the step's floor for ``budget="min"`` (under ``auto``)."""
        opts = self.options
        return opts.solver == "auto" and opts.plan is None and is_min(opts.budget)

    def _smallest_split(self, planned_gm, num_fwd_outputs, device, costs, bucket=None, key=None, sizes=None):
        """``budget="min"``: (chunks, sites, (capture, fused, plan), unsplit) of the step split as
        :func:`~remat.capture.split_choice.smallest_split` picks from the quick planners' peaks (a count, or
        each site's), its smallest plan searched in full; ``unsplit``: (capture, fused graph) of the step as
        captured, without transfer costs (as ``auto`` captures it). The caller takes the split plan where it
        peaks lower than the unsplit step's smallest plan, or than ``dependency_lower_bound`` of it (every
        plan's bound), by :func:`~remat.capture.split_choice.lower_enough` (the eager backend's rule).
        None: no split lowers the quick planners' peak, or the split step fails to plan."""
        sites = find_sites(planned_gm, num_fwd_outputs, sizes)
        factors = chunk_counts(sizes, sites, SPLIT_FACTORS) if sites else []
        if not factors:
            return None

        def split_step(k):
            return self._split_step(planned_gm, num_fwd_outputs, sites, k, sizes)

        def quick_peak(k):
            return quick_minimum(self._capture_and_fuse(split_step(k), num_fwd_outputs, device, costs)[1].graph)

        unsplit = self._capture_and_fuse(planned_gm, num_fwd_outputs, device, costs)
        try:  # a split step that fails to capture or plan leaves the step as captured
            chosen = smallest_split(factors, sites, quick_peak, quick_minimum(unsplit[1].graph))
            if chosen is None:
                return None
            planned = self._capture_and_plan(split_step(chosen), num_fwd_outputs, device, costs, bucket, key,
                                             split_step=True)
        except RematError:
            return None
        return chosen, sites, planned, unsplit

    def _may_split_for_speed(self, plan, bucket) -> bool:
        """Whether ``split="auto"`` weighs split plans against ``plan``, a fitting plan of the step as
        captured: under ``auto`` and a budget (not ``"min"``), a static step, and an overhead above
        ``FASTER_SPLIT_OVERHEAD``."""
        opts = self.options
        return (opts.solver == "auto" and opts.plan is None and bucket is None and opts.budget is not None
                and not is_min(opts.budget) and plan.step_overhead > FASTER_SPLIT_OVERHEAD)

    def _faster_split(self, planned_gm, num_fwd_outputs, device, costs, baseline, sites, factors, budget_bytes,
                      label: str, bucket=None, key=None, sizes=None):
        """(chunks, (capture, fused, plan)) of the step split into one of ``factors`` chunk counts, taken
        for speed over ``baseline`` by :func:`~remat.capture.split_choice.faster_chunks` (``label`` names it),
        each planned at ``budget_bytes`` as :meth:`_quick_split_plan` plans it (only where a quick plan
        fits, as the eager backend does). None: no split plan is that much faster."""
        return faster_chunks(baseline, factors if sites else (), lambda chunks, within: self._quick_split_plan(
            planned_gm, num_fwd_outputs, device, costs, sites, chunks, budget_bytes, bucket, key, sizes,
            within=within), label)

    def _graded(self, planned_gm, num_fwd_outputs, device, costs, sites, chunks: int, planned: tuple,
                budget_bytes: int | None, bucket=None, key=None, sizes=None):
        """``(counts, (capture, fused, plan))``: ``planned`` (every site in ``chunks``), or the step with each
        site in :func:`~remat.capture.split_choice.site_chunks` where that is predicted no slower
        (:func:`~remat.capture.split_choice.graded_chunks`, the eager backend's rule): one more split step
        captured and planned by a quick plan within ``budget_bytes``, as the split plans weighed for speed
        are. (``budget="min"`` grades in :func:`~remat.capture.split_choice.smallest_split`.)"""
        return graded_chunks((chunks, planned), sites, lambda counts: self._quick_split_plan(
            planned_gm, num_fwd_outputs, device, costs, sites, counts, budget_bytes, bucket, key, sizes))

    def _capture_and_plan(self, planned_gm, num_fwd_outputs, device, costs, bucket, key, split_step=False,
                          quick_only=False, keep_set_gate=False, budget_bytes: int | None = None,
                          within: float | None = None, offload_check: bool = True, captured: tuple | None = None):
        """Capture, fuse and plan one joint graph: (capture, fused graph, plan). Auto offloads below
        what recomputation reaches, or where that is much cheaper. ``split_step``: a split step,
        planned by ``SPLIT_FIRST_SOLVER`` first; ``quick_only``: None unless a quick plan fits
        (``keep_set_gate``: or the keep-set model's smallest plan);
        ``budget_bytes``: the budget in bytes, instead of the options' budget resolved on this graph;
        ``within``: ``NOT_FASTER``, without planning, where the store-all step (a floor on every plan's)
        takes at least these seconds; ``offload_check=False``: a fitting recomputation plan is not weighed
        against offloading (the caller does that for the step it chooses); ``captured``: (capture, fused
        graph) of ``planned_gm`` already made by :meth:`_capture_and_fuse` with the same transfer costs."""
        opts = self.options
        capture, fused = captured or self._capture_and_fuse(
            planned_gm, num_fwd_outputs, device, costs,
            transfer=compiled_transfer_meta(device) if opts.solver in OFFLOADING_SOLVERS or opts.plan is not None else None)
        if quick_only and not self._quick_plan_fits(fused, budget_bytes, plannable=keep_set_gate):
            return None  # auto's full search on a split step takes minutes: only where a quick plan fits
        if within is not None and store_all_plan(fused.graph).step_seconds >= within:
            return NOT_FASTER  # no plan of this step can be that fast
        may_offload = opts.solver == "auto" and opts.plan is None and bucket is None
        if may_offload and is_min(opts.budget):  # the smallest peak, offloading included
            fused = with_transfer_costs(fused, compiled_transfer_meta(device))
        try:
            plan = None
            if split_step and opts.solver == "auto" and not is_min(opts.budget):  # seconds, where auto takes minutes
                try:
                    plan = self._plan(fused, bucket=bucket, solver=SPLIT_FIRST_SOLVER, budget_bytes=budget_bytes)
                except InfeasibleBudgetError:
                    pass
            plan = plan or self._plan(fused, bucket=bucket, budget_bytes=budget_bytes)
        except InfeasibleBudgetError as err:
            if not may_offload or uses_swaps(fused.graph):
                if bucket is not None:
                    self.refused[(key, self.bucket_budget_bytes)] = name_bucket(err, key)
                raise
            # below what recomputation reaches: auto offloads too (its error then names that minimum)
            fused = with_transfer_costs(fused, compiled_transfer_meta(device))
            plan = self._plan(fused, reuse_rounds=OFFLOAD_TRY_REUSE_ROUNDS, budget_bytes=budget_bytes)
        else:
            if offload_check:
                fused, plan = self._offered_offload(fused, plan, device, budget_bytes, bucket)
        return capture, fused, plan

    def _split_step(self, planned_gm, num_fwd_outputs, sites, chunks, sizes=None) -> torch.fx.GraphModule:
        """``planned_gm`` with ``sites`` split into ``chunks`` (a count, or one per site), made once per
        call: a count weighed by a quick plan and then searched in full, or refused and then named in
        the refusal, is the same step, and its captured graph keeps what its planning learned
        (smallest peaks, bounds; a 256-token bucket refused under a 9 MiB budget solved the keep-set
        model's smallest plan twice per count)."""
        # (the graph module keys itself; the list of sites by id, held in the entry so that it stays its own)
        key = ("split", planned_gm, id(sites), chunks if isinstance(chunks, int) else tuple(chunks))
        if key not in self._made:
            self._made[key] = (split_joint(planned_gm, num_fwd_outputs, sites, chunks, sizes), sites)
        return self._made[key][0]

    def _capture_and_fuse(self, planned_gm, num_fwd_outputs, device, costs, transfer=None):
        """(capture, fused graph) of one joint graph, with the options' cost and workspace models; made
        once per call for each graph and transfer costs (see :meth:`_split_step`)."""
        key = ("captured", planned_gm, transfer is not None)
        if key not in self._made:
            opts = self.options
            capture = capture_joint(planned_gm, num_fwd_outputs,
                                    cost_fn=costs.node_seconds if costs else make_cost_fn(opts.cost_model, device),
                                    workspace_fn=make_workspace_fn(opts.workspace), transfer=transfer)
            self._made[key] = (capture, fuse(capture, kernel_seconds=costs.kernel_seconds if costs else None))
        return self._made[key]

    def _quick_plan_fits(self, fused, budget_bytes: int | None = None, plannable: bool = False) -> bool:
        """Whether store_all or a quick baseline (``plannable``: or the keep-set model) fits the budget
        (``budget_bytes``, else the options' budget resolved on ``fused``'s graph) on ``fused``'s graph (seconds)."""
        budget = self.options.budget
        if budget is None or is_min(budget):
            return True
        if budget_bytes is None:
            budget_bytes = resolve(fused.graph, budget, self.options.solver)
        budget_bytes -= self.margin_bytes
        least = plannable_minimum(fused.graph, budget_bytes) if plannable else quick_minimum(fused.graph)
        return least <= budget_bytes

    def _bucket(self, gm) -> tuple[dict, dict]:
        """``({symbol: smallest}, {symbol: edge})``: the bucket of a joint graph with symbolic sizes,
        guarded so that only sizes in it run the graphs compiled from this one
        (:func:`remat.capture.shapes.guard_bucket`)."""
        opts = self.options
        if opts.solver in OFFLOADING_SOLVERS:
            raise CaptureError(
                f"remat.compile cannot offload in a step captured with dynamic sizes (solver {opts.solver!r}): its "
                "copies are written for one size; use remat.optimize for inputs of many sizes with offloading, or "
                "a recomputing solver")
        edges = tuple(sorted(opts.buckets)) if opts.buckets else None
        low, high = guard_bucket(gm, edges)
        refuse_unless_monotone(gm, low, high)
        return low, high

    def _plan(self, fused, reuse_rounds: int = SLACK_ROUNDS, bucket: dict | None = None, solver: str | None = None,
              budget_bytes: int | None = None):
        """The plan of ``fused``'s graph at the budget less the margin (raised into the bytes
        Inductor writes in place where that fits, in at most ``reuse_rounds`` more plans). In a
        ``bucket``, a fraction budget gives the most bytes it has given any bucket so far (those of
        the largest: they hold at every smaller bucket too). ``budget_bytes``: the budget in bytes (a
        split step planned at its unsplit step's bytes), instead of the options' budget resolved here."""
        opts = self.options
        budget = opts.budget if budget_bytes is None else budget_bytes
        if budget_bytes is None and budget is not None:
            budget_bytes = resolve(fused.graph, budget, opts.solver)
        if bucket is not None and is_fraction(budget):  # the bytes the fraction gives at the largest bucket
            self.bucket_budget_bytes = max(self.bucket_budget_bytes or 0, budget_bytes)
            budget = budget_bytes = self.bucket_budget_bytes
        self.last_budget_bytes = budget_bytes
        if budget_bytes is not None and self.margin_bytes:
            budget = max(0, budget_bytes - self.margin_bytes)

        if opts.plan is not None:  # the user's own plan (made by remat.compile), checked on this graph
            plan = given_plan(fused.graph, opts.plan, budget)
            plan.info["compiler"] = "inductor"
            return plan

        def make(planning_budget):
            return plan_with_cache(
                fused.graph, planning_budget, solver or opts.solver, time_limit=opts.time_limit,
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

    def _offered_offload(self, fused, plan, device, budget_bytes: int | None = None, bucket=None):
        """``(fused, plan)``, or the offloading plan :meth:`_offload_if_much_cheaper` takes instead: under
        ``auto`` only, for a static step (``bucket`` None) whose plan does not offload already."""
        opts = self.options
        if opts.solver != "auto" or opts.plan is not None or bucket is not None or uses_swaps(fused.graph):
            return fused, plan
        return self._offload_if_much_cheaper(fused, plan, device, budget_bytes)

    def _offload_if_much_cheaper(self, fused, plan, device, budget_bytes: int | None = None):
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
        alternative = self._plan(offloading, reuse_rounds=OFFLOAD_TRY_REUSE_ROUNDS, budget_bytes=budget_bytes)
        if alternative.step_seconds < (1 - OFFLOAD_MIN_GAIN) * plan.step_seconds:
            alternative.info = {**alternative.info, "recomputation plan's step": plan.step_seconds}
            return offloading, alternative
        return fused, plan

    def __getstate__(self) -> dict:
        """Inductor pickles its config (cache keys): without the plan callback and the last plan."""
        state = dict(self.__dict__)
        state["options"] = dataclasses.replace(self.options, on_plan=None, on_run=None, on_step=None)
        state["last_plan"] = None
        state["refused"] = {}
        state["_made"] = {}
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
            "offload_dir": o.offload_dir, "buckets": repr(o.buckets),
            "plan": o.plan if o.plan is None or isinstance(o.plan, str) else repr((o.plan.instructions, o.plan.boundary)),
        }, sort_keys=True)
        return hashlib.sha256(described.encode()).hexdigest()


def partitioner(budget=None, solver: str = "auto", cost_model: Any = INDUCTOR_COST_MODEL, *, workspace: str = "measure",
                time_limit: float | None = None, solver_options: dict | None = None, cache: bool = True,
                on_plan=None, offload_dir: str | None = None, split="auto") -> RematPartitioner:
    """A ``CustomPartitionerFn`` for ``torch._inductor.config.custom_partitioner_fn``.

    Pass it with :data:`INDUCTOR_CONSTRAINTS` (see :func:`inductor_options`), which the memory model
    relies on. ``budget`` as in :func:`remat.optimize`; it applies to each graph Inductor compiles."""
    options = BackendOptions.from_dict(dict(
        budget=budget, solver=solver, cost_model=cost_model, workspace=workspace, time_limit=time_limit,
        solver_options=solver_options or {}, cache=cache, on_plan=on_plan, offload_dir=offload_dir, split=split,
    ))
    return RematPartitioner(options)


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


__all__ = ["RematPartitioner", "partitioner", "inductor_options", "INDUCTOR_CONSTRAINTS", "with_transfer_costs",
           "plan_into_reused_bytes", "compiled_transfer_meta", "OFFLOAD_MIN_GAIN", "OFFLOADING_SOLVERS"]

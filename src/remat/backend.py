"""The ``"remat"`` torch.compile backend.

    compiled = torch.compile(model, backend="remat", options={"budget": 0.5, "solver": "auto"})

Dynamo hands the backend an FX graph of the model and example inputs; the backend
calls AOTAutograd with its own partition function, which receives the *joint*
forward+backward graph, captures it as a :class:`~remat.graph.Graph`, plans it, and
returns the forward and backward graphs the plan calls for (see :mod:`remat.execute.lowering`).
Both are compiled with the boxed calling convention, so every tensor dies at its
last use. This module is remat's only contact with AOTAutograd's private APIs.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import torch
import torch._functorch.config
from torch._dynamo import register_backend
from torch._dynamo.backends.common import aot_autograd

from .budget import fixed_bytes, is_fraction, is_min
from .capture import capture_joint, joint_device
from .capture.shapes import is_dynamic
from .capture.split import FASTER_SPLIT_OVERHEAD, SPLIT_FACTORS, SPLIT_FIRST_SOLVER, find_sites, split_info, split_joint
from .capture.split_choice import (NOT_FASTER, faster_chunks, graded_chunks, lower_enough, refused_over_splits,
                                   smallest_split)
from .capture.split_sizes import SymbolicSizes, chunk_counts
from .cost import make_cost_fn, make_workspace_fn
from .errors import InfeasibleBudgetError, RematError, through_dynamo
from .execute.buckets import BucketedStep, dispatching_graphs
from .execute.lowering import lower
from .execute.optimizer import with_optimizer_steps
from .execute.runtime import boxed
from .execute.transfer import make_transfer_meta
from .solvers.cache import plan_with_cache
from .simulate import dependency_lower_bound, peak_lower_bound
from .solvers.planner import given_plan, plannable_minimum, quick_minimum, resolve, store_all_plan
from .solvers.warm import warm_plan
from .solvers.options import BUDGET_ENV, OPTION_NAMES, SOLVER_ENV, BackendOptions

_CAPTURES = itertools.count(1)  # joint graphs this process has captured


def _compile_boxed(gm: torch.fx.GraphModule, example_inputs) -> torch.fx.GraphModule:
    return boxed(gm)


def make_partition_fn(opts: BackendOptions, updated_params: dict | None = None):
    """AOTAutograd's partition function for ``opts``; ``updated_params`` (primal index -> parameter):
    the parameters ``opts.optimizer`` updates inside the backward."""
    def capture(joint, num_fwd_outputs, no_workspace=frozenset()):
        device = joint_device(joint)
        if updated_params:
            joint = with_optimizer_steps(joint, num_fwd_outputs, opts.optimizer, updated_params)
        workspace_fn = make_workspace_fn(opts.workspace)
        if workspace_fn is not None and no_workspace:
            measure = workspace_fn

            def workspace_fn(node):  # an op with no scratch memory at one size has none at another
                return 0 if node.name in no_workspace else measure(node)

        return capture_joint(
            joint,
            num_fwd_outputs,
            cost_fn=make_cost_fn(opts.cost_model, device),
            workspace_fn=workspace_fn,
            transfer=make_transfer_meta(device) if _may_offload(opts) else None,
            eager_inplace=True,
        )

    def plan(graph, budget, solver=None):
        if opts.plan is not None:  # the user's own plan, checked on this graph before it runs
            return given_plan(graph, opts.plan, budget)
        return plan_with_cache(graph, budget, solver or opts.solver, time_limit=opts.time_limit,
                               solver_options=opts.solver_options, cost_model=opts.cost_model, cache=opts.cache)

    def partition_fn(joint, joint_inputs, *, num_fwd_outputs, **_ignored):
        capture_id = next(_CAPTURES)  # plan.info["capture"]: which capture a plan was made for
        if is_dynamic(joint):  # captured once for every size: a plan per bucket, made when first met
            return _bucketed(joint, num_fwd_outputs, capture, plan, opts, capture_id)
        started = time.perf_counter()
        captured = capture(joint, num_fwd_outputs)
        captured, planned = _plan_with_splits(joint, num_fwd_outputs, captured, capture, plan, opts)
        planned.info["capture"] = capture_id
        if opts.on_plan is not None:
            opts.on_plan(planned, captured)
        graphs = lower(captured, planned, offload_dir=opts.offload_dir)
        # remat's part of the capture (costs and workspaces measured, planned, lowered), Dynamo's trace excluded
        planned.info["partition_seconds"] = time.perf_counter() - started
        return graphs

    return partition_fn


def _plan_with_splits(joint, num_fwd_outputs: int, captured, capture, plan, opts: BackendOptions,
                      sizes: SymbolicSizes | None = None, for_speed: bool = True):
    """``(capture, plan)`` for the step, its ops split into row chunks where that is needed
    (:mod:`remat.capture.split`).

    ``split="auto"`` (with ``solver="auto"``; a named solver plans the step as captured): the step as
    captured where its plan fits the budget, unless that plan's predicted overhead is above
    ``FASTER_SPLIT_OVERHEAD``: then split plans (``SPLIT_FIRST_SOLVER``, 2, 4, 8, ... chunks while each is
    faster) are weighed against it and the fastest is taken when its predicted step time is
    ``FASTER_SPLIT_GAIN`` below the unsplit plan's (smaller chunks need less recomputation). Where no plan
    fits as captured, the split sites with 2, 4, 8, ... chunks: the
    fewest chunks a quick plan or the keep-set model's smallest plan fits
    (:func:`~remat.solvers.planner.plannable_minimum`, seconds; fewer chunks, fewer extra launches), planned by
    ``SPLIT_FIRST_SOLVER`` (else ``auto``), then more chunks weighed for speed as above where that
    plan's overhead is above ``FASTER_SPLIT_OVERHEAD``; if none fits so, each factor in full. A split chosen so, with
    several sites, is then weighed against the same step with each site in the fewest chunks of the
    same grain (:func:`~remat.capture.split_choice.graded_chunks`), taken where no slower.
    With ``budget="min"``, more chunks while each
    lowers the quick planners' smallest peak by ``MIN_GAIN``, each site graded so where that peak is no
    higher (:func:`~remat.capture.split_choice.smallest_split`), then the smallest plan of that split
    in full (kept when it beats the unsplit step's by ``MIN_GAIN``; the unsplit step's is searched only
    where the split plan does not beat so the bound of every unsplit plan, ``dependency_lower_bound``). An int: that many chunks, whatever the solver. A
    fraction is of the unsplit step's store-all peak, and :class:`InfeasibleBudgetError` names the
    smallest budget over every split tried.

    ``sizes``: ``joint`` is a bucket's concrete copy of a step captured with symbolic sizes
    (:mod:`remat.capture.split_sizes`): only sites that split at every size of the bucket, into the
    chunk counts that hold at every size (an int ``split``: the most chunks up to it that do,
    recorded as ``info["split"]["asked"]`` where fewer). ``for_speed=False``: a step that fits is not
    split for speed (a bucket's first plan: each bucket would pay the split plans' search; its full plan,
    made once its warm plan has run ``UPGRADE_AFTER`` steps, weighs splits)."""
    split = opts.split
    if opts.plan is not None or split in ("off", 1) or (split == "auto" and opts.solver != "auto"):
        return captured, plan(captured.graph, opts.budget)
    budget = opts.budget
    fitting = None  # the unsplit step's plan, where it fits the budget but recomputes much
    if not (isinstance(split, int) or is_min(budget)):
        try:  # most steps fit as captured with little overhead: no sites looked for
            fitting = plan(captured.graph, budget)
        except InfeasibleBudgetError as err:
            refused = err
        else:
            if fitting.step_overhead <= FASTER_SPLIT_OVERHEAD or not for_speed:
                return captured, fitting
    sites = find_sites(joint, num_fwd_outputs, sizes)
    factors = chunk_counts(sizes, sites, SPLIT_FACTORS)
    asked = split
    if isinstance(split, int):
        split = max(chunk_counts(sizes, sites, range(2, split + 1)), default=1)
    if not sites or split == 1 or (not isinstance(split, int) and not factors):
        if fitting is not None:
            return captured, fitting
        if isinstance(split, int) or is_min(budget):
            return captured, plan(captured.graph, budget)
        raise refused

    captures: dict = {}

    def chunked(k):
        if k not in captures:
            captures[k] = capture(split_joint(joint, num_fwd_outputs, sites, k, sizes), num_fwd_outputs)
        return captures[k]

    def with_chunks(k, budget):
        planned = None
        if opts.solver == "auto" and not is_min(budget):  # seconds where auto takes minutes (SPLIT_FIRST_SOLVER)
            try:
                planned = plan(chunked(k).graph, budget, SPLIT_FIRST_SOLVER)
                planned.info["chosen by"] = f"auto: {SPLIT_FIRST_SOLVER} first on a split step"
            except InfeasibleBudgetError:
                pass
        planned = planned or plan(chunked(k).graph, budget)
        planned.info["split"] = split_info(k, sites)
        if isinstance(asked, int) and asked != k:  # the most chunks up to the asked that hold at every size
            planned.info["split"]["asked"] = asked
        return chunked(k), planned

    def graded(result, budget):
        """``result``, or its sites each in the fewest chunks of the same grain where no slower (split_choice)."""
        k = result[1].info.get("split", {}).get("chunks")
        if k is None:  # not split
            return result

        def plan_for(counts):  # the quick planner only (as for speed: _faster_of)
            found = _split_plan(chunked, plan, sites, counts, budget)
            if found is not None:
                found[1].info["chosen by"] = f"auto: {SPLIT_FIRST_SOLVER}, sites in {list(counts)} chunks (no slower)"
            return found

        return graded_chunks((k, result), sites, plan_for)[1]

    if fitting is not None:
        return graded(_faster_of((captured, fitting), chunked, sites, fitting.budget_bytes, plan, factors, "unsplit"),
                      fitting.budget_bytes)
    if isinstance(split, int):  # a fraction of the unsplit step's peak
        return with_chunks(split, resolve(captured.graph, budget) if is_fraction(budget) else budget)
    if is_min(budget):  # the split from the quick planners (seconds), then one full search
        chosen = smallest_split(factors, sites, lambda k: quick_minimum(chunked(k).graph),
                                quick_minimum(captured.graph))
        candidate = None if chosen is None else with_chunks(chosen, budget)
        if candidate is not None and lower_enough(candidate[1].peak_bytes, dependency_lower_bound(captured.graph)):
            return candidate  # lower enough than every plan of the step as captured: none is searched
        unsplit = (captured, plan(captured.graph, budget))
        if candidate is None:
            return unsplit
        return candidate if lower_enough(candidate[1].peak_bytes, unsplit[1].peak_bytes) else unsplit
    least = refused.min_budget_bytes
    # first the fewest chunks a quick or keep-set plan fits (seconds); only if none does, a full
    # search per factor whose lower bound the budget reaches
    for i, k in enumerate(factors):
        least = min(least, plannable_minimum(chunked(k).graph, refused.budget_bytes))
        if least <= refused.budget_bytes:
            fewest = with_chunks(k, refused.budget_bytes)
            if fewest[1].step_overhead > FASTER_SPLIT_OVERHEAD:
                # more chunks leave more memory for what the plan recomputes: taken where predicted faster
                fewest = _faster_of(fewest, chunked, sites, refused.budget_bytes, plan, factors[i + 1:], f"{k} chunks'")
            return graded(fewest, refused.budget_bytes)
    for k in factors:
        if refused.budget_bytes < peak_lower_bound(chunked(k).graph):
            continue
        try:
            return graded(with_chunks(k, refused.budget_bytes), refused.budget_bytes)
        except InfeasibleBudgetError as err:
            least = min(least, err.min_budget_bytes)
    store, fixed = store_all_plan(captured.graph).peak_bytes, fixed_bytes(captured.graph)
    # below the bound of every plan of every split (and of the step as captured): refused without a search
    bound = min(peak_lower_bound(g) for g in [captured.graph, *(chunked(k).graph for k in factors)])
    raise refused_over_splits(refused, least, factors[-1], store, fixed, bound) from None


def _faster_of(baseline, chunked, sites, budget_bytes: int, plan, factors, label: str):
    """``(capture, plan)``: ``baseline`` (a fitting plan of the step unsplit, or split into fewer
    chunks; ``label`` names it), or a split step's plan by ``SPLIT_FIRST_SOLVER`` within
    ``budget_bytes`` taken for speed by :func:`~remat.capture.split_choice.faster_chunks`, where the quick
    planners fit the split step (a factor that needs a full search to fit is not worth one for speed)."""
    def plan_for(k, within: float):
        graph = chunked(k).graph
        if store_all_plan(graph).step_seconds >= within:
            return NOT_FASTER
        if quick_minimum(graph) > budget_bytes:
            return None
        return _split_plan(chunked, plan, sites, k, budget_bytes)

    found = faster_chunks(baseline[1], factors, plan_for, label)
    return baseline if found is None else found[1]


def _split_plan(chunked, plan, sites, counts, budget_bytes: int):
    """``(capture, plan)`` of the step split into ``counts`` (an int, or each site's), planned by
    ``SPLIT_FIRST_SOLVER`` within ``budget_bytes``, its split recorded; None where that plan cannot fit."""
    try:
        planned = plan(chunked(counts).graph, budget_bytes, SPLIT_FIRST_SOLVER)
    except InfeasibleBudgetError:
        return None
    planned.info["split"] = split_info(counts, sites)
    return chunked(counts), planned


def _bucketed(joint, num_fwd_outputs: int, capture, plan, opts: BackendOptions, capture_id: int):
    """The dispatching forward and backward graphs of a joint graph with symbolic sizes
    (:mod:`remat.execute.buckets`).

    With the solver ``auto``, a new bucket first gets a warm plan (:func:`remat.solvers.warm.warm_plan`:
    store-all, the other buckets' plans, the fast solvers; a full ``auto`` plan only when none of
    them fits), in a fraction of a second; a bucket whose warm plan recomputes or offloads is planned
    again in full once it has run ``UPGRADE_AFTER`` steps (:class:`~remat.execute.buckets.BucketedStep`),
    when the better plan pays for its planning; that full plan weighs split plans for speed as a static
    step's does (``split="auto"``). A fraction budget is of the largest bucket planned so
    far: its bytes, resolved on that bucket's graph, hold at every smaller bucket too."""
    state: dict = {"bytes": 0, "plans": [], "no_workspace": frozenset()}

    def plan_bucket(concrete, key, full=False, low=None, high=None):
        def capture_here(graph, n):  # ops without scratch memory are known by name in the unsplit graph only
            return capture(graph, n, state["no_workspace"] if graph is concrete else frozenset())

        captured = capture_here(concrete, num_fwd_outputs)
        if not state["plans"]:  # the ops without scratch memory here are not probed at other sizes
            state["no_workspace"] = frozenset(captured.op_node[i].name for i, node in enumerate(captured.graph.nodes)
                                              if node.workspace == 0)
        budget = opts.budget
        if is_fraction(budget):  # the most bytes the fraction gives any bucket so far: the largest's
            state["bytes"] = max(state["bytes"], resolve(captured.graph, budget))
            budget = state["bytes"]

        def plan_here(graph, budget, solver=None):
            if solver is not None or full or opts.solver != "auto" or opts.plan is not None:
                return plan(graph, budget, solver)
            return warm_plan(graph, budget, state["plans"], time_limit=opts.time_limit, **opts.solver_options)

        sizes = SymbolicSizes(joint, low, high) if low is not None else None
        captured, planned = _plan_with_splits(concrete, num_fwd_outputs, captured, capture_here, plan_here,
                                              dataclasses.replace(opts, budget=budget), sizes, for_speed=full)
        planned.info["capture"] = capture_id
        state["plans"].append(planned)
        if opts.on_plan is not None:
            opts.on_plan(planned, captured)
        return captured, planned

    step = BucketedStep(joint, num_fwd_outputs, plan_bucket,
                        lambda captured, planned: lower(captured, planned, offload_dir=opts.offload_dir),
                        edges=tuple(sorted(opts.buckets)) if opts.buckets else None, on_run=opts.on_run)
    if opts.on_step is not None:
        opts.on_step(step)
    outputs = list(joint.graph.find_nodes(op="output")[0].args[0])
    placeholders = list(joint.graph.find_nodes(op="placeholder"))
    tangents = [p for p in placeholders if str(p.target).startswith("tangents")]
    primals = [p for p in placeholders if not str(p.target).startswith("tangents")]
    return dispatching_graphs(step, outputs[:num_fwd_outputs], primals, tangents, outputs[num_fwd_outputs:])


def _may_offload(opts: BackendOptions) -> bool:
    """Whether a plan for ``opts`` may offload, and so needs the store's measured bandwidth: not when
    ``auto`` plans without a budget (store_all then, nothing beats it); any named solver may, and so
    may a plan the user passes (a saved ``hybrid`` plan is checked on a graph with transfer costs)."""
    return opts.budget is not None or opts.solver != "auto" or opts.plan is not None


def remat_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **kwargs):
    """Dynamo backend entry point (``options`` comes from ``torch.compile(..., options=...)``)."""
    opts = BackendOptions.from_dict({**(options or {}), **kwargs})
    # the optimizer inside the backward: AOTAutograd's primals are Dynamo's example inputs, in order
    updated = ({i: x for i, x in enumerate(example_inputs) if opts.optimizer.owns(x)}
               if opts.optimizer is not None else None)
    # Dynamo's own AOTAutograd wrapper, not aot_module_simplified directly: it keeps Dynamo from
    # tracing the compiled graphs and counts the call, which DDPOptimizer (torch.compile of a DDP
    # module) reads to know that the first call of each piece returns fake tensors.
    compiler = aot_autograd(fw_compiler=_compile_boxed, bw_compiler=_compile_boxed, partition_fn=make_partition_fn(opts, updated))
    try:
        # the backward is remat's own: AOTAutograd's donated-buffer analysis (for Inductor's backward) has
        # nothing to give it, and torch 2.11 reads the storage of every saved value there, also of a size
        # bucket's opaque saved object (AttributeError: 'SavedByBucket' object has no attribute 'untyped_storage')
        with torch._functorch.config.patch(donated_buffer=False):
            return compiler(gm, example_inputs)
    except RematError as err:  # reach the user as remat's error, not as Dynamo's BackendCompilerFailed
        raise through_dynamo(err) from err.__cause__


register_backend(remat_backend, name="remat")

__all__ = ["remat_backend", "make_partition_fn", "BackendOptions", "BUDGET_ENV", "SOLVER_ENV", "OPTION_NAMES"]

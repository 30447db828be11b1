"""The public API: ``remat.optimize`` and ``remat.plan``.

    m = remat.optimize(model, x, budget="2GiB")   # same parameters, same state_dict
    loss = m(x); loss.backward(); opt.step()      # nothing else changes
    print(m.plan.summary())

    plan = remat.plan(model, x, budget=0.3, solver="chen_sqrt")   # plans, runs nothing
    front = remat.pareto(model, x, solvers=["hierarchical", "chen_sqrt"])   # overhead vs budget
"""

from __future__ import annotations

import itertools
import sys
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from .backend import BackendOptions, remat_backend
from .capture.shapes import bucket_edge
from .capture import (Capture, PlanReady, check_materialized, check_unwrapped, detached_copies, no_lasting_effects,
                      training_step_mode, unwrap_compile_error, users_own_exception)
from .cost import DEFAULT_COST_MODEL, INDUCTOR_COST_MODEL
from .errors import CaptureError, NotTrainingWarning, RematError
from . import inductor
from .execute.optimizer import OptimizerInBackwardError, StepperInBackward
from .plan import Plan
from .solvers.options import checked_split


_NO_TRAINING_GRAPH = (
    "the model's forward produced no training graph: nothing it computes requires gradients. "
    "Check that its parameters (or inputs) have requires_grad=True; remat plans training steps."
)


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by this module's caller point at the first
    frame outside this module (the user's call of optimize, plan or pareto)."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


def _warn_if_not_training(model: nn.Module) -> None:
    """Warn when ``model`` is in eval mode: the captured step is then eval mode's."""
    if not model.training:
        warnings.warn(
            "remat was asked to plan a model in eval mode: it captures and plans the step as it runs in eval mode "
            "(Dropout off, BatchNorm normalising with its running statistics and not updating them), which is not "
            "the training step if you train in train mode. Call model.train() first; a later call in train mode "
            "would capture and plan again.",
            NotTrainingWarning, stacklevel=_user_stacklevel(),
        )


COMPILERS = ("eager", "inductor")  # how a plan runs: remat's unfused ATen lowering, or Inductor's kernels
_entry_count = itertools.count()
RECOMPILE_LIMIT = 64  # distinct input shapes one RematModule plans for


def _entry_point(model: nn.Module):
    """A function calling ``model`` whose code object is new.

    Dynamo keeps compiled graphs on the code object of the function it compiles and
    allows only a few per code object (``recompile_limit``, 8); past that, with
    ``fullgraph=True``, it fails. Planning the same model class many times (several
    budgets, several solvers) would hit that limit through ``Module.forward``'s one code
    object, so each RematModule is given an entry point of its own.
    """

    def remat_step(*args, **kwargs):
        return model(*args, **kwargs)

    code = remat_step.__code__.replace(co_name=f"remat_step_{next(_entry_count)}")
    return types.FunctionType(code, remat_step.__globals__, code.co_name, None, remat_step.__closure__)


def _compile(model: nn.Module, options: dict):
    return torch.compile(_entry_point(model), backend=remat_backend, options=options, fullgraph=True)


class _WeakCallback:
    """Calls a bound method without keeping its object alive (a no-op once it is gone)."""

    def __init__(self, method):
        self._ref = weakref.WeakMethod(method)

    def __call__(self, *args):
        method = self._ref()
        if method is not None:
            method(*args)


def _too_many_captures() -> str:
    why = ("the first input shape is one capture and each size bucket after it one more; something other than "
           "sizes changes from call to call (a flag, the inputs' dtypes, devices or aliasing), or the sizes span "
           "more buckets than that: make the rest the same at every call, or give wider buckets (buckets=[...])")
    return f"this module has been captured {RECOMPILE_LIMIT} times, the most remat allows: {why}"


def _input_sizes(args: tuple, kwargs: dict) -> tuple:
    """The shapes of the tensors among a call's arguments and its integers (which Dynamo may make
    sizes too), in order."""
    leaves = torch.utils._pytree.tree_leaves((args, kwargs))
    return tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else (x,) for x in leaves
                 if isinstance(x, torch.Tensor) or (isinstance(x, int) and not isinstance(x, bool)))


class RematModule(nn.Module):
    """``model`` with a planned training step. Shares its parameters, buffers and submodules.

    Its forward runs the planned graph when gradients are enabled and the original
    model otherwise (evaluation does not need a plan). ``plan`` is the plan of the
    most recent capture (a new input shape makes a new capture and plan).
    """

    def __init__(self, model: nn.Module, options: dict, *, compiler: str = "eager", mode: str | None = None,
                 inductor_options: dict | None = None, compile_kwargs: dict | None = None):
        check_unwrapped(model)
        if compiler not in COMPILERS:
            raise ValueError(f"compiler must be one of {COMPILERS}, got {compiler!r}")
        super().__init__()
        object.__setattr__(self, "_remat_original", model)
        object.__setattr__(self, "_modules", model._modules)
        object.__setattr__(self, "_parameters", model._parameters)
        object.__setattr__(self, "_buffers", model._buffers)
        object.__setattr__(self, "_non_persistent_buffers_set", model._non_persistent_buffers_set)
        self.training = model.training
        self._remat_plans: list[Plan] = []
        options = dict(options)
        # weakly: torch.compile keeps every backend (and so these options) until torch._dynamo.reset(),
        # which would keep this module, and the model's parameters, alive for the life of the process
        options["on_plan"] = _WeakCallback(self._record)
        options["on_run"] = _WeakCallback(self._ran)
        self._remat_last_run: Plan | None = None
        self._remat_call_sizes: tuple | None = None  # Inductor: the input sizes of the call under way
        self._remat_ran_sizes: tuple | None = None  # Inductor: those of the last call that ran
        self._remat_compiled_plans: dict = {}  # Inductor: _sizes_key -> plan
        self._remat_compiler = compiler
        object.__setattr__(self, "_remat_partitioner", None)
        if compiler == "inductor":
            part = inductor.RematPartitioner(BackendOptions.from_dict(options))
            self._remat_inductor = dict(mode=mode, options=inductor_options, compile_kwargs=compile_kwargs or {})
            self._recompile(part)
        else:
            object.__setattr__(self, "_remat_compiled", _compile(model, options))

    def _recompile(self, part) -> None:
        """Compile with Inductor and ``part`` as its partitioner (again: a fresh entry point)."""
        settings = self._remat_inductor
        opts = inductor.inductor_options(part, mode=settings["mode"], options=settings["options"])
        kwargs = {"fullgraph": True, **settings["compile_kwargs"]}
        object.__setattr__(self, "_remat_partitioner", part)
        object.__setattr__(self, "_remat_compiled",
                           torch.compile(_entry_point(self._remat_original), backend="inductor", options=opts, **kwargs))

    def _record(self, plan: Plan, capture: Capture) -> None:
        self._remat_plans.append(plan)  # not the capture: it holds fake tensors (no deepcopy)
        self._remat_last_run = self._remat_ran_sizes = None
        if self._remat_compiler == "inductor" and self._remat_call_sizes is not None:
            self._remat_compiled_plans[self._sizes_key(self._remat_call_sizes, "bucket" in plan.info)] = plan

    def _sizes_key(self, sizes: tuple, bucketed: bool) -> tuple:
        """An Inductor plan's key: the input sizes of the call it was made for, each rounded up to its
        bucket's edge for a plan made for a size bucket."""
        if not bucketed:
            return ("exact", sizes)
        edges = self._remat_partitioner.options.buckets
        edges = tuple(sorted(edges)) if edges else None
        return ("bucket", tuple(tuple(bucket_edge(d, edges) for d in shape) for shape in sizes))

    def _inductor_plan_for(self, sizes: tuple) -> Plan | None:
        """The plan Inductor's compiled step runs for inputs of ``sizes``: its size bucket's, else the
        plan made for those exact sizes. (Dynamo keeps a compiled step per bucket, and one for the
        first input shape, which a later bucket's covers too; both hold the budget.)"""
        plans = self._remat_compiled_plans
        return plans.get(self._sizes_key(sizes, True)) or plans.get(self._sizes_key(sizes, False))

    def _ran(self, plan: Plan) -> None:
        self._remat_last_run = plan

    @property
    def plan(self) -> Plan | None:
        """The plan of the step that ran last (for a step captured with dynamic sizes, that of the
        size bucket it ran in: ``plan.info["bucket"]`` names the bucket's edges); before any step,
        the plan made last."""
        if self._remat_ran_sizes is not None:  # Inductor: looked up here, not in every step
            self._remat_last_run = self._inductor_plan_for(self._remat_ran_sizes) or self._remat_last_run
        if self._remat_last_run is not None:
            return self._remat_last_run
        return self._remat_plans[-1] if self._remat_plans else None

    @property
    def plans(self) -> list[Plan]:
        """Every plan made so far, in order: one per capture of a static shape and one per size bucket
        of a capture with dynamic sizes (``plan.info["bucket"]``: ``{size symbol: bucket edge}``)."""
        return list(self._remat_plans)

    @property
    def original(self) -> nn.Module:
        return self._remat_original

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self._remat_original(*args, **kwargs)
        if self._remat_compiler == "inductor":
            self._remat_call_sizes = _input_sizes(args, kwargs)
        try:
            try:
                out = self._remat_compiled(*args, **kwargs)
            except torch._dynamo.exc.FailOnRecompileLimitHit:
                # each new input shape (or size bucket) is a new capture and plan: allow more than
                # Dynamo's default 8, paying for the config patch (~0.2 ms) only on the call that needs it
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                    try:
                        out = self._remat_compiled(*args, **kwargs)
                    except torch._dynamo.exc.FailOnRecompileLimitHit as hit:
                        raise RematError(_too_many_captures()) from hit
            if self._remat_compiler == "inductor":
                self._remat_ran_sizes = self._remat_call_sizes
            return out
        except Exception as err:  # surface remat's own errors, not Dynamo's wrapper
            inner = unwrap_compile_error(err, self._remat_original)
            if isinstance(inner, CaptureError):
                own = users_own_exception(err, self._remat_original, args, kwargs)
                if own is not None:  # the model's forward raised: its exception, as plain PyTorch gives it
                    raise own from None
                check_unwrapped(self._remat_original)  # wrapped by DDP/FSDP after optimize: say so
            if inner is err:
                raise
            raise inner from err

    def train(self, mode: bool = True):
        self._remat_original.train(mode)
        self.training = mode
        return self

    def extra_repr(self) -> str:
        return repr(self.plan) if self.plan else "not planned yet"


def optimize(
    model: nn.Module,
    *example_args,
    budget=None,
    solver: str = "auto",
    cost_model: Any = None,
    workspace: str = "measure",
    time_limit: float | None = None,
    solver_options: dict | None = None,
    cache: bool = True,
    offload_dir: str | None = None,
    plan: Plan | str | None = None,
    buckets: list[int] | None = None,
    compiler: str = "eager",
    mode: str | None = None,
    inductor_options: dict | None = None,
    calibrate: bool = True,
    compile_kwargs: dict | None = None,
    split="auto",
    optimizer: torch.optim.Optimizer | None = None,
    **example_kwargs,
) -> RematModule:
    """Plan ``model``'s training step for ``budget`` and return a module that runs the plan.

    ``budget``: bytes (int), a size (``"2GiB"``), a fraction in (0, 1] of the memory a plan can
    change (0.5: the gradients and outputs every plan holds, plus half of the rest of the
    store-everything peak; see :mod:`remat.budget`), ``"min"`` (the smallest feasible budget) or
    None (no limit). A model in eval mode, or a call with gradients disabled, gets a
    :class:`~remat.errors.NotTrainingWarning`.

    The example inputs are run through the forward once, to capture the graph; the model's
    buffers (e.g. BatchNorm statistics) and the random number generators are restored
    afterwards, so this leaves no trace on training. Raises
    :class:`~remat.errors.InfeasibleBudgetError` when no plan fits and
    :class:`~remat.errors.CaptureError` when the forward cannot be captured as one graph.
    Plans are kept in the on-disk plan cache (:mod:`remat.solvers.cache`) unless ``cache=False``.
    ``offload_dir``: where an offloading plan's files go on the CPU (else ``$REMAT_OFFLOAD_DIR``, else
    the temporary directory); at most ``plan.offload_peak_bytes`` at once, removed as the step ends.
    ``plan``: run this plan (a :class:`~remat.plan.Plan`, or the path of one saved with
    :meth:`~remat.plan.Plan.save`) instead of planning; it is checked on the captured graph before
    anything runs (:class:`~remat.plan.PlanGraphMismatchError` if it was made for another model,
    shape or dtype; :class:`~remat.errors.InvalidPlanError` if it peaks above a given budget).
    ``buckets``: edges of the size buckets once the step is captured with dynamic sizes (a second
    input shape; default: powers of two and their midpoints); each bucket is planned at its edge.
    ``split``: ``"auto"`` (the default) splits the ops that set the peak (the LM head and its loss)
    into chunks of rows when no plan fits the budget otherwise (see :mod:`remat.capture.split`);
    ``"off"`` never; an int splits them into that many chunks.
    ``optimizer``: update each parameter it holds inside the backward, as soon as its gradient
    exists, and free the gradient (:mod:`remat.execute.optimizer`): the step then never holds every
    gradient at once, and the plan knows it. ``loss.backward()`` does the update; the loop must not
    call ``optimizer.step()`` itself, accumulate gradients or clip them by their global norm (each
    refused with :class:`~remat.execute.optimizer.OptimizerInBackwardError`).

    ``compiler``: ``"eager"`` (the default) runs the plan as unfused ATen ops, exactly as planned
    (bitwise gradients, every solver, offloading included); ``"inductor"`` has Inductor compile the
    planned graphs into fused kernels (``mode`` and ``inductor_options`` as in ``torch.compile``;
    see :mod:`remat.inductor`), and, with ``calibrate``, runs the compiled step once on copies of the
    example inputs and re-plans while its measured peak is above the budget; ``compile_kwargs``
    (``fullgraph``, ``dynamic``, ...) pass to ``torch.compile``. ``cost_model`` (see :mod:`remat.cost`)
    defaults to ``"profile"``, and to ``"inductor"`` with ``compiler="inductor"``: Inductor's generated
    kernels are its own code rather than the ATen kernels a profile times, so they are costed by the
    roofline, a fused group as one kernel (:mod:`remat.inductor.cost`).
    """
    _warn_if_not_training(model)
    if not torch.is_grad_enabled():
        warnings.warn(
            "remat.optimize was called with gradients disabled (torch.no_grad() or torch.inference_mode()): it "
            "plans the training step all the same (it captures with gradients enabled), but the module it returns "
            "runs the original model, without the plan, wherever gradients are disabled. Call the module where "
            "you train, with gradients enabled; evaluation and inference need no plan.",
            NotTrainingWarning, stacklevel=2,
        )
    check_materialized(model, example_args, example_kwargs)
    split = checked_split(split)
    if cost_model is None:
        cost_model = INDUCTOR_COST_MODEL if compiler == "inductor" else DEFAULT_COST_MODEL
    options = dict(budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
                   time_limit=time_limit, solver_options=solver_options or {}, cache=cache, offload_dir=offload_dir,
                   plan=plan, buckets=buckets, split=split)
    if optimizer is not None:
        if compiler != "eager":
            raise OptimizerInBackwardError("the optimizer step inside the backward runs with compiler='eager' only "
                                           "(Inductor cannot call a Python optimizer from its compiled backward)")
        options["optimizer"] = StepperInBackward(optimizer)
    wrapped = RematModule(model, options, compiler=compiler, mode=mode, inductor_options=inductor_options,
                          compile_kwargs=compile_kwargs)
    with training_step_mode():
        args, kwargs = detached_copies(example_args), detached_copies(example_kwargs)  # forward may mutate them
        with no_lasting_effects(model):
            wrapped(*args, **kwargs)
    if wrapped.plan is None:
        raise CaptureError(_NO_TRAINING_GRAPH)
    if compiler == "inductor" and calibrate and plan is None:  # a given plan is run as it is
        _calibrate(wrapped, example_args, example_kwargs)
    return wrapped


def _calibrate(wrapped: RematModule, args: tuple, kwargs: dict) -> None:
    options = wrapped._remat_partitioner.options
    try:
        inductor.calibrate(wrapped, lambda margin: inductor.RematPartitioner(options, margin), args, kwargs)
    except Exception as err:
        inner = unwrap_compile_error(err)
        if inner is err:
            raise
        raise inner from err


def compile(
    model: nn.Module,
    *example_args,
    budget=None,
    solver: str = "auto",
    mode: str | None = None,
    options: dict | None = None,
    cost_model: Any = INDUCTOR_COST_MODEL,
    workspace: str = "measure",
    time_limit: float | None = None,
    solver_options: dict | None = None,
    cache: bool = True,
    offload_dir: str | None = None,
    buckets: list[int] | None = None,
    calibrate: bool = True,
    example_kwargs: dict | None = None,
    split="auto",
    **compile_kwargs,
) -> RematModule:
    """``torch.compile`` with Inductor, remat planning the training step: Inductor's fused kernels
    within remat's ``budget`` (see :mod:`remat.inductor`).

    ``mode``, ``options`` (Inductor's) and ``compile_kwargs`` (``fullgraph``, ``dynamic``, ...) pass to
    ``torch.compile``. With example inputs, the step is planned now (and, with ``calibrate``, measured
    once and re-planned while above the budget), as :func:`optimize` does; without, at the first
    training call. Returns a module sharing ``model``'s parameters and state_dict; ``.plan`` is the plan.

    Inputs of many sizes: the first shape is compiled for itself; from the second, Dynamo captures the
    step with the changed sizes symbolic, and each **size bucket** (``buckets``: edges, as in
    :func:`optimize`; default powers of two and midpoints) gets one plan, made at the bucket's edge,
    and one compilation with Inductor's dynamic-shape kernels, which every size of the bucket runs
    (guarded: a size outside it compiles the next bucket). Such buckets plan recomputation only: the
    offloading solvers' copies are written for one size.

    ``split`` as in :func:`optimize`: ``"auto"`` splits the largest ops into 2, 4, ... chunks where no
    plan of the step as captured fits (the fewest chunks that plan; more while each is predicted 2%
    faster, where that plan recomputes more than 2% of the step) or, for a static step, where a split
    plan is predicted faster than the one that fits; with ``budget="min"``, more chunks while each lowers
    the smallest peak by 2%; an int forces that many.
    """
    if not example_args and not example_kwargs:
        _warn_if_not_training(model)
        check_materialized(model)
        remat_options = dict(budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
                             time_limit=time_limit, solver_options=solver_options or {}, cache=cache,
                             offload_dir=offload_dir, buckets=buckets, split=split)
        return RematModule(model, remat_options, compiler="inductor", mode=mode, inductor_options=options,
                           compile_kwargs=compile_kwargs)
    wrapped = optimize(model, *example_args, budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
                       time_limit=time_limit, solver_options=solver_options, cache=cache, offload_dir=offload_dir,
                       buckets=buckets, compiler="inductor", split=split,
                       mode=mode, inductor_options=options, calibrate=calibrate, compile_kwargs=compile_kwargs,
                       **(example_kwargs or {}))
    return wrapped


def plan(
    model: nn.Module,
    *example_args,
    budget=None,
    solver: str = "auto",
    cost_model: Any = DEFAULT_COST_MODEL,
    workspace: str = "measure",
    time_limit: float | None = None,
    solver_options: dict | None = None,
    cache: bool = True,
    split="auto",
    **example_kwargs,
) -> Plan:
    """Capture and plan ``model``'s training step without running it (``cache`` and ``split``: as in
    :func:`optimize`)."""
    plan, _capture = capture_and_plan(
        model, *example_args, budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
        time_limit=time_limit, solver_options=solver_options, cache=cache, split=split, **example_kwargs,
    )
    return plan


@dataclass
class LengthPlan:
    """One size bucket of :func:`plan_lengths`: its edge (the largest size it runs), its plan, or the
    error that refused it (an :class:`~remat.errors.InfeasibleBudgetError` names the smallest budget)."""

    edge: int
    plan: Plan | None = None
    error: Exception | None = None


def plan_lengths(model, *example_args, lengths: tuple[int, int], dim: int = 1, budget=None, solver: str = "auto",
                 buckets=None, cost_model: Any = DEFAULT_COST_MODEL, workspace: str = "measure",
                 time_limit: float | None = None, solver_options: dict | None = None, cache: bool = True,
                 split="auto", **example_kwargs) -> list[LengthPlan]:
    """What every length will cost, before it arrives: the plan of each size bucket from ``lengths[0]``
    to ``lengths[1]`` of dimension ``dim`` of the inputs (the sequence, for token inputs).

    The step is captured once with that dimension symbolic (``torch._dynamo.mark_dynamic`` on every
    input tensor whose ``dim`` has the example's length), then planned at each bucket's edge as
    :func:`optimize` does when that length arrives (``buckets``: edges, as the backend option; a
    byte ``budget`` holds at every bucket, a fraction is of the largest bucket's changeable memory;
    ``split`` as in :func:`optimize`: a bucket no plan fits as captured is split into row chunks
    that follow the sizes at run time, :mod:`remat.capture.split_sizes`). Nothing runs. Returns one
    :class:`LengthPlan` per bucket, smallest first."""
    from .capture.shapes import example_binding

    lo, hi = (int(x) for x in lengths)
    if not 1 <= lo <= hi:
        raise ValueError(f"lengths must be (smallest, largest) with 1 <= smallest <= largest, got {lengths}")
    tensors = [t for t in torch.utils._pytree.tree_leaves((example_args, example_kwargs)) if isinstance(t, torch.Tensor)]
    sized = [t for t in tensors if t.dim() > dim]
    if not sized:
        raise ValueError(f"no input tensor has a dimension {dim} to vary")
    example_args, example_kwargs = detached_copies((example_args, example_kwargs))
    length = sized[0].shape[dim]
    for t in torch.utils._pytree.tree_leaves((example_args, example_kwargs)):
        if isinstance(t, torch.Tensor) and t.dim() > dim and t.shape[dim] == length:
            torch._dynamo.mark_dynamic(t, dim)
    edges = sorted({bucket_edge(n, sorted(buckets) if buckets else None) for n in range(lo, hi + 1)})
    steps: list = []

    def stop(step):
        steps.append(step)
        raise PlanReady()

    options = dict(budget=budget, solver=solver, cost_model=cost_model, workspace=workspace, time_limit=time_limit,
                   solver_options=solver_options or {}, cache=cache, buckets=buckets, on_step=stop,
                   split=checked_split(split))
    _capture_until_planned(model, options, example_args, example_kwargs)
    if not steps:
        raise CaptureError(f"the step did not vary with dimension {dim} of its inputs: nothing to plan per length")
    step = steps[0]
    base = example_binding(step.joint)
    varying = [s for s, v in base.items() if v == length] or list(base)
    rows = []
    for edge in sorted(edges, key=lambda e: -e):  # the largest first: it sets a fraction's bytes
        binding = {**base, **{s: edge for s in varying}}
        try:
            rows.append(LengthPlan(edge, step.bucket_for(binding).plan))
        except RematError as err:
            rows.append(LengthPlan(edge, error=err))
    return sorted(rows, key=lambda r: r.edge)


def capture_and_plan(model, *example_args, budget=None, solver="auto", cost_model=DEFAULT_COST_MODEL, workspace="measure",
                     time_limit=None, solver_options=None, cache=True, split="auto",
                     **example_kwargs) -> tuple[Plan, Capture]:
    """Like :func:`plan`, also returning the :class:`~remat.capture.Capture`."""
    result: list = []

    def stop(plan: Plan, capture: Capture):
        result.append((plan, capture))
        raise PlanReady()

    options = dict(budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
                   time_limit=time_limit, solver_options=solver_options or {}, on_plan=stop, cache=cache,
                   split=checked_split(split))
    _warn_if_not_training(model)
    _capture_until_planned(model, options, example_args, example_kwargs)
    if not result:
        raise CaptureError(_NO_TRAINING_GRAPH)
    return result[0]


def _capture_until_planned(model, options: dict, example_args: tuple, example_kwargs: dict) -> None:
    """Capture ``model``'s step with ``options``, whose callback raises :class:`PlanReady` once it has
    what it needs (no step runs): remat's own errors reach the caller unwrapped, and an exception the
    model's forward raises reaches it as plain PyTorch gives it."""
    check_unwrapped(model)
    check_materialized(model, example_args, example_kwargs)
    compiled = _compile(model, options)
    try:
        with training_step_mode():
            compiled(*example_args, **example_kwargs)
    except Exception as err:
        inner = unwrap_compile_error(err, model)
        own = users_own_exception(err, model, example_args, example_kwargs) if isinstance(inner, CaptureError) else None
        if own is not None:  # the model's forward raised: its exception, as plain PyTorch gives it
            raise own from None
        if not isinstance(inner, PlanReady):
            if inner is err:
                raise
            raise inner from err

"""The public API: ``remat.optimize`` and ``remat.plan``.

    m = remat.optimize(model, x, budget="2GiB")   # same parameters, same state_dict
    loss = m(x); loss.backward(); opt.step()      # nothing else changes
    print(m.plan.summary())

    plan = remat.plan(model, x, budget=0.3, solver="chen_sqrt")   # plans, runs nothing
    front = remat.pareto(model, x, solvers=["hierarchical", "chen_sqrt"])   # overhead vs budget
"""

from __future__ import annotations

import contextlib
import itertools
import linecache
import os
import re
import sys
import types
import warnings
import weakref
from typing import Any

import torch
import torch.nn as nn

from .backend import BackendOptions, remat_backend
from .capture import Capture
from .cost import DEFAULT_COST_MODEL, INDUCTOR_COST_MODEL
from .errors import CaptureError, InfeasibleBudgetError, NotTrainingWarning, RematError, SolverError
from .integrations import check_unwrapped
from .plan import Plan
from .solvers import available as available_solvers


_NO_TRAINING_GRAPH = (
    "the model's forward produced no training graph: nothing it computes requires gradients. "
    "Check that its parameters (or inputs) have requires_grad=True; remat plans training steps."
)


class _PlanReady(Exception):
    """Raised from inside the backend by :func:`plan` to stop before anything runs."""


def _unwrap_compile_error(err: BaseException) -> BaseException:
    """The remat error inside Dynamo's wrapper, or a CaptureError naming the graph break."""
    seen = err
    while seen is not None:
        if isinstance(seen, (RematError, _PlanReady)):
            return seen
        seen = getattr(seen, "inner_exception", None) or seen.__cause__
    dynamo_exc = torch._dynamo.exc
    if isinstance(err, (dynamo_exc.Unsupported, dynamo_exc.UserError)):
        return _capture_error(err)
    return err


_NOT_USER_CODE = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(torch.__file__)))


def _user_frame(err: BaseException) -> tuple[str, int, str] | None:
    """(file, line, source text) of the innermost frame of the user's code where Dynamo stopped.

    Dynamo's graph-break exceptions carry the traced user stack as ``real_stack``; its
    message repeats it under "from user code:", which is read when the attribute is missing.
    Frames of remat and torch are skipped."""
    frames = [(f.filename, f.lineno, (f.line or "").strip()) for f in getattr(err, "real_stack", None) or ()]
    if not frames:
        found = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', str(err))
        frames = [(f, int(n), src.strip()) for f, n, src in found]
    for filename, lineno, line in reversed(frames):
        if not os.path.abspath(filename).startswith(_NOT_USER_CODE):
            if not line:
                line = linecache.getline(filename, lineno).strip()
            return filename, lineno, line
    return None


def _capture_error(err: BaseException) -> CaptureError:
    """A CaptureError for Dynamo's graph-break ``err``: what, where (file, line, source) and what to do."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    reason = lines[0] if lines else type(err).__name__
    where = _user_frame(err)
    if where is None:
        at = ""
        caused = next((ln for ln in lines if ln.startswith("Caused by:")), "")
        reason = f"{reason} {caused}".strip()
    else:
        at = f" at {where[0]}, line {where[1]}: `{where[2]}`"
    return CaptureError(
        f"remat needs the model's forward as one graph, but Dynamo could not capture it{at} "
        f"({type(err).__name__}: {reason}). Rewrite that line without data-dependent Python control flow "
        "(an `if` on a tensor's value, .item() in a condition or a shape) or the unsupported call, for example "
        "with torch.where, or plan the parts on either side of it separately.",
        filename=where and where[0], lineno=where and where[1], line=where and where[2],
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
    return torch.compile(_entry_point(model), backend=remat_backend, options=options, fullgraph=True, dynamic=False)


@contextlib.contextmanager
def _no_lasting_effects(model: nn.Module):
    """Run a forward pass for capture without changing RNG streams or buffers."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = sorted({b.device.index for b in model.parameters() if b.device.type == "cuda"} - {None})
    with torch.random.fork_rng(devices=devices):
        yield
    with torch.no_grad():
        for b, saved in buffers:
            b.copy_(saved)


class _WeakCallback:
    """Calls a bound method without keeping its object alive (a no-op once it is gone)."""

    def __init__(self, method):
        self._ref = weakref.WeakMethod(method)

    def __call__(self, *args):
        method = self._ref()
        if method is not None:
            method(*args)


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
        self._remat_compiler = compiler
        object.__setattr__(self, "_remat_partitioner", None)
        if compiler == "inductor":
            from .inductor import RematPartitioner

            part = RematPartitioner(BackendOptions.from_dict(options))
            self._remat_inductor = dict(mode=mode, options=inductor_options, compile_kwargs=compile_kwargs or {})
            self._recompile(part)
        else:
            object.__setattr__(self, "_remat_compiled", _compile(model, options))

    def _recompile(self, part) -> None:
        """Compile with Inductor and ``part`` as its partitioner (again: a fresh entry point)."""
        from .inductor import inductor_options

        settings = self._remat_inductor
        opts = inductor_options(part, mode=settings["mode"], options=settings["options"])
        kwargs = {"fullgraph": True, "dynamic": False, **settings["compile_kwargs"]}
        object.__setattr__(self, "_remat_partitioner", part)
        object.__setattr__(self, "_remat_compiled",
                           torch.compile(_entry_point(self._remat_original), backend="inductor", options=opts, **kwargs))

    def _record(self, plan: Plan, capture: Capture) -> None:
        self._remat_plans.append(plan)  # not the capture: it holds fake tensors (no deepcopy)

    @property
    def plan(self) -> Plan | None:
        return self._remat_plans[-1] if self._remat_plans else None

    @property
    def original(self) -> nn.Module:
        return self._remat_original

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self._remat_original(*args, **kwargs)
        try:
            try:
                return self._remat_compiled(*args, **kwargs)
            except torch._dynamo.exc.FailOnRecompileLimitHit:
                # each new input shape is a new capture and plan: allow more than Dynamo's default 8,
                # paying for the config patch (~0.2 ms) only on the call that needs it
                with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
                    return self._remat_compiled(*args, **kwargs)
        except Exception as err:  # surface remat's own errors, not Dynamo's wrapper
            inner = _unwrap_compile_error(err)
            if isinstance(inner, CaptureError):
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
    compiler: str = "eager",
    mode: str | None = None,
    inductor_options: dict | None = None,
    calibrate: bool = True,
    compile_kwargs: dict | None = None,
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
    Plans are kept in the on-disk plan cache (:mod:`remat.cache`) unless ``cache=False``.

    ``compiler``: ``"eager"`` (the default) runs the plan as unfused ATen ops, exactly as planned
    (bitwise gradients, every solver, offloading included); ``"inductor"`` has Inductor compile the
    planned graphs into fused kernels (``mode`` and ``inductor_options`` as in ``torch.compile``;
    see :mod:`remat.inductor`), and, with ``calibrate``, runs the compiled step once on copies of the
    example inputs and re-plans while its measured peak is above the budget; ``compile_kwargs``
    (``fullgraph``, ``dynamic``, ...) pass to ``torch.compile``. ``cost_model`` (see :mod:`remat.cost`)
    defaults to ``"profile"``, and to ``"inductor"`` with ``compiler="inductor"``: Inductor's generated
    kernels are its own code rather than the ATen kernels a profile times, so they are costed by the
    roofline, a fused group as one kernel (:mod:`remat.cost.inductor`).
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
    if cost_model is None:
        cost_model = INDUCTOR_COST_MODEL if compiler == "inductor" else DEFAULT_COST_MODEL
    options = dict(budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
                   time_limit=time_limit, solver_options=solver_options or {}, cache=cache)
    wrapped = RematModule(model, options, compiler=compiler, mode=mode, inductor_options=inductor_options,
                          compile_kwargs=compile_kwargs)
    with _training_step_mode():
        args, kwargs = _detached_copies(example_args), _detached_copies(example_kwargs)  # forward may mutate them
        with _no_lasting_effects(model):
            wrapped(*args, **kwargs)
    if wrapped.plan is None:
        raise CaptureError(_NO_TRAINING_GRAPH)
    if compiler == "inductor" and calibrate:
        _calibrate(wrapped, example_args, example_kwargs)
    return wrapped


def _calibrate(wrapped: RematModule, args: tuple, kwargs: dict) -> None:
    from .inductor import RematPartitioner, calibrate

    options = wrapped._remat_partitioner.options
    try:
        calibrate(wrapped, lambda margin: RematPartitioner(options, margin), args, kwargs)
    except Exception as err:
        inner = _unwrap_compile_error(err)
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
    calibrate: bool = True,
    example_kwargs: dict | None = None,
    **compile_kwargs,
) -> RematModule:
    """``torch.compile`` with Inductor, remat planning the training step: Inductor's fused kernels
    within remat's ``budget`` (see :mod:`remat.inductor`).

    ``mode``, ``options`` (Inductor's) and ``compile_kwargs`` (``fullgraph``, ``dynamic``, ...) pass to
    ``torch.compile``. With example inputs, the step is planned now (and, with ``calibrate``, measured
    once and re-planned while above the budget), as :func:`optimize` does; without, at the first
    training call. Returns a module sharing ``model``'s parameters and state_dict; ``.plan`` is the plan.
    """
    if not example_args and not example_kwargs:
        _warn_if_not_training(model)
        remat_options = dict(budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
                             time_limit=time_limit, solver_options=solver_options or {}, cache=cache)
        return RematModule(model, remat_options, compiler="inductor", mode=mode, inductor_options=options,
                           compile_kwargs=compile_kwargs)
    wrapped = optimize(model, *example_args, budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
                       time_limit=time_limit, solver_options=solver_options, cache=cache, compiler="inductor",
                       mode=mode, inductor_options=options, calibrate=calibrate, compile_kwargs=compile_kwargs,
                       **(example_kwargs or {}))
    return wrapped


@contextlib.contextmanager
def _training_step_mode():
    """Gradients enabled and inference mode off, for capturing a training step."""
    with torch.inference_mode(False), torch.enable_grad():
        yield


def _detached_copies(tree):
    def copy(t):
        if isinstance(t, torch.Tensor):
            return t.detach().clone().requires_grad_(t.requires_grad)
        return t

    return torch.utils._pytree.tree_map(copy, tree)


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
    **example_kwargs,
) -> Plan:
    """Capture and plan ``model``'s training step without running it (``cache``: as in :func:`optimize`)."""
    plan, _capture = capture_and_plan(
        model, *example_args, budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
        time_limit=time_limit, solver_options=solver_options, cache=cache, **example_kwargs,
    )
    return plan


def capture_and_plan(model, *example_args, budget=None, solver="auto", cost_model=DEFAULT_COST_MODEL, workspace="measure",
                     time_limit=None, solver_options=None, cache=True, **example_kwargs) -> tuple[Plan, Capture]:
    """Like :func:`plan`, also returning the :class:`~remat.capture.Capture`."""
    check_unwrapped(model)
    result: list = []

    def stop(plan: Plan, capture: Capture):
        result.append((plan, capture))
        raise _PlanReady()

    options = dict(budget=budget, solver=solver, cost_model=cost_model, workspace=workspace,
                   time_limit=time_limit, solver_options=solver_options or {}, on_plan=stop, cache=cache)
    _warn_if_not_training(model)
    compiled = _compile(model, options)
    try:
        with _training_step_mode():
            compiled(*example_args, **example_kwargs)
    except Exception as err:
        inner = _unwrap_compile_error(err)
        if not isinstance(inner, _PlanReady):
            if inner is err:
                raise
            raise inner from err
    if not result:
        raise CaptureError(_NO_TRAINING_GRAPH)
    return result[0]


DEFAULT_PARETO_SOLVERS = ("hierarchical", "rotor", "chen_sqrt")
DEFAULT_PARETO_BUDGETS = (1.0, 0.8, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2, 0.15, 0.1)


class ParetoFront(dict):
    """``front[solver]``: one :class:`Plan` per budget (``None`` where the solver found none within it).

    ``front.budgets`` are the budgets in bytes, ``front.store_all_peak`` the unplanned step's peak,
    ``front.fixed_bytes`` the part of it no plan changes (see :mod:`remat.budget`).
    """

    budgets: list[int]
    store_all_peak: int
    fixed_bytes: int

    def table(self) -> str:
        """A text table: predicted overhead (and peak) of each solver at each budget."""
        head = f"{'budget':>12}" + "".join(f"{s:>22}" for s in self)
        rows = [head]
        for k, b in enumerate(self.budgets):
            cells = []
            for plans in self.values():
                p = plans[k]
                cells.append(f"{'—':>22}" if p is None else f"{p.overhead * 100:+8.1f}% {p.peak_bytes / 2**20:9.1f} MiB")
            rows.append(f"{b / 2**20:8.1f} MiB" + "".join(cells))
        return "\n".join(rows)

    def plot(self, path=None, **kwargs):
        """Overhead against budget, one line per solver (:func:`remat.viz.plot_pareto`)."""
        from .viz import plot_pareto

        return plot_pareto(self, path, **kwargs)


def pareto(model, *example_args, solvers=DEFAULT_PARETO_SOLVERS, budgets=DEFAULT_PARETO_BUDGETS,
           cost_model: Any = DEFAULT_COST_MODEL, workspace: str = "measure", time_limit: float | None = None,
           cache: bool = True, **example_kwargs) -> ParetoFront:
    """Plan ``model``'s training step with each of ``solvers`` at each of ``budgets``.

    The model is captured once. Budgets are as in :func:`optimize`: bytes, sizes, fractions of the
    memory a plan can change, or ``"min"`` (the smallest budget ``auto`` meets). Returns a :class:`ParetoFront`: for each solver, one plan per budget, or
    ``None`` where it has no plan within that budget. ``rotor`` and ``hierarchical`` keep their
    decomposition, block menus and DP tables across budgets, so each further budget costs only
    the DP; the other solvers plan each budget from scratch.
    """
    for name in solvers:
        if name != "auto" and name not in available_solvers():
            raise SolverError(f"unknown solver {name!r}; choose 'auto' or one of {', '.join(available_solvers())}")
    base, _ = capture_and_plan(model, *example_args, solver="store_all", cost_model=cost_model,
                               workspace=workspace, cache=cache, **example_kwargs)
    return pareto_of_graph(base.graph, solvers=solvers, budgets=budgets, cost_model=cost_model,
                           time_limit=time_limit, cache=cache)


def pareto_of_graph(graph, *, solvers=DEFAULT_PARETO_SOLVERS, budgets=DEFAULT_PARETO_BUDGETS,
                    cost_model: Any = DEFAULT_COST_MODEL, time_limit: float | None = None, cache: bool = True,
                    on_plan=None) -> ParetoFront:
    """:func:`pareto` on a captured :class:`~remat.graph.Graph`; ``on_plan(solver, budget_bytes, plan_or_None)``
    is called after each cell (the CLI's progress bar)."""
    from .budget import fixed_bytes
    from .cache import plan_with_cache
    from .planner import resolve, store_all_plan

    budget_bytes = [resolve(graph, b, time_limit=time_limit) for b in budgets]  # "min": auto's smallest
    front = ParetoFront()
    front.budgets, front.fixed_bytes = budget_bytes, fixed_bytes(graph)
    front.store_all_peak = store_all_plan(graph).peak_bytes
    for name in solvers:
        plans = []
        for b in budget_bytes:
            try:
                plan = plan_with_cache(graph, b, name, time_limit=time_limit, cost_model=cost_model, cache=cache)
            except (InfeasibleBudgetError, SolverError):
                plan = None
            plan = plan if plan is not None and (b is None or plan.peak_bytes <= b) else None
            plans.append(plan)
            if on_plan is not None:
                on_plan(name, b, plan)
        front[name] = plans
    return front

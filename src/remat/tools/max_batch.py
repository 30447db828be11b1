"""The largest batch size whose training step fits a memory limit, with remat and without.

    result = remat.max_batch_size(lambda: MyModel(), lambda n: torch.randn(n, 3, 224, 224), "8GiB")
    result.batch_size, result.plain_batch_size     # e.g. (96, 32)
    print(result.summary())

What the limit bounds
---------------------
``memory_limit`` bounds the **total** memory of one training step (forward + backward):

    parameters + buffers + the batch's tensors + the measured peak growth of the step

where the peak growth (activations, temporaries and the gradients the step produces) is
measured by :func:`remat.measure.peak_memory_growth` on the device the step runs on, with
every ``.grad`` set to ``None`` first. **Optimizer state is not included**: leave room for it
(Adam keeps two more copies of the parameters) by passing a smaller limit. remat is given the
rest as its budget: ``budget = memory_limit - (parameters + buffers + batch)``.

Search
------
For each method (``"remat"``, then ``"plain"`` PyTorch when ``compare_plain``), batch sizes
``start, 2·start, 4·start, ...`` are tried until one does not fit (or ``max_batch`` is
reached), then the gap between the last size that fit and the first that did not is halved
until they are adjacent. A try builds a fresh model (``make_model()``) and batch
(``make_batch(n)``), runs the step once to warm up, measures it once, and frees everything
before the next try. For remat, a budget no plan meets (:class:`~remat.errors.InfeasibleBudgetError`)
means "does not fit" without running anything; a planned step whose *measured* total is over
the limit does not fit either, whatever the plan predicted. An out-of-memory error during a try
(``torch.OutOfMemoryError`` on CUDA, the CPU allocator's "can't allocate memory") also counts
as "does not fit"; the process stays usable for the next try. The search assumes memory grows
with the batch size.

When even batch 1 does not fit, ``batch_size`` (or ``plain_batch_size``) is ``0``: no error is
raised, and ``tries`` says why each size failed.

Each :class:`~remat.api.RematModule` compiles through an entry point of its own (see
:mod:`remat.api`), so Dynamo's per-code-object caches die with the module of each try and
nothing accumulates across tries; ``torch._dynamo.reset()`` is not called (it would drop the
caller's own compiled functions).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

from ..budget import parse_size
from ..errors import RematError, format_bytes

__all__ = ["max_batch_size", "MaxBatchResult", "BatchTry"]

METHODS = ("remat", "plain")


@dataclass
class BatchTry:
    """One batch size tried by :func:`max_batch_size`.

    ``measured_bytes`` is the measured total (parameters + buffers + batch + peak growth of the
    step), ``None`` when the step did not run (no plan, out of memory, over the limit before
    running). ``reason`` says why it did not fit ("" when it fit).
    """

    method: str  # "remat" or "plain"
    batch: int
    fits: bool
    measured_bytes: int | None
    reason: str = ""
    fixed_bytes: int = 0  # parameters + buffers + batch
    predicted_bytes: int | None = None  # remat: fixed + the plan's predicted peak
    solver: str = ""  # remat: the solver whose plan ran
    device: str = ""  # where the step ran


@dataclass
class MaxBatchResult:
    """What :func:`max_batch_size` found.

    ``batch_size``: the largest batch whose remat-planned step measured within the limit (0 if
    none); ``plain_batch_size``: the same for plain PyTorch (``None`` when not compared);
    ``plan``: the plan of ``batch_size``; ``tries``: every try, in order.
    """

    batch_size: int
    plain_batch_size: int | None
    memory_limit: int
    plan: Any = None
    tries: list[BatchTry] = field(default_factory=list)
    device: str = "cpu"

    @property
    def gain(self) -> float | None:
        """``batch_size / plain_batch_size`` (``None`` when plain was not compared or fit nothing)."""
        if not self.plain_batch_size:
            return None
        return self.batch_size / self.plain_batch_size

    def summary(self) -> str:
        lines = [f"max batch size under {format_bytes(self.memory_limit)} (total step memory on {self.device}):"]
        best = {m: self._best_try(m) for m in METHODS}
        for method, size in (("remat", self.batch_size), ("plain", self.plain_batch_size)):
            if size is None:
                continue
            t = best[method]
            used = f", {format_bytes(t.measured_bytes)} measured" if t is not None and t.measured_bytes else ""
            lines.append(f"  {method:<6} {size}{used}")
        if self.gain is not None:
            lines.append(f"  remat fits {self.gain:.2f}x plain PyTorch's batch")
        return "\n".join(lines)

    def _best_try(self, method: str) -> BatchTry | None:
        size = self.batch_size if method == "remat" else self.plain_batch_size
        return next((t for t in self.tries if t.method == method and t.batch == size and t.fits), None)


def max_batch_size(
    make_model: Callable[[], nn.Module],
    make_batch: Callable[[int], Any],
    memory_limit,
    *,
    solver: str = "auto",
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    device: torch.device | str | None = None,
    start: int = 1,
    max_batch: int | None = None,
    compare_plain: bool = True,
    on_try: Callable[[BatchTry], Any] | None = None,
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None,
    **optimize_options,
) -> MaxBatchResult:
    """The largest batch size whose measured training step fits ``memory_limit`` (see the module doc).

    Args:
        make_model: returns a fresh ``nn.Module`` (called once per try).
        make_batch: ``make_batch(n)`` returns the model's inputs for batch size ``n``: a tuple of
            positional arguments, a lone tensor, a dict of keyword arguments, or an
            ``(args_tuple, kwargs_dict)`` pair.
        memory_limit: int bytes or a size string (``"8GiB"``): total step memory, optimizer state
            excluded.
        solver: remat's solver (``"auto"`` by default).
        loss_fn: ``loss_fn(output)`` -> scalar. Default: the output if scalar, else ``.float().sum()``;
            for a tuple/list or a ``ModelOutput``, its ``.loss`` if it has one, else its first tensor.
        device: where to run; default: the device of the model's parameters (CPU if none).
        start: the first batch size tried; max_batch: never try above it.
        compare_plain: also search plain PyTorch's largest batch.
        on_try: called with each :class:`BatchTry` once it is done (progress reporting).
        make_optimizer: ``make_optimizer(model)`` returns an optimizer for the model of a try: remat's
            tries then update the parameters inside the backward (``remat.optimize(...,
            optimizer=)``), so their steps never hold every gradient; the optimizer's state stays
            outside the limit, made by the warm-up step before the measured one.
        **optimize_options: passed to :func:`remat.optimize` (``cost_model``, ``time_limit``, ``cache`` ...).

    Returns:
        A :class:`MaxBatchResult`.
    """
    limit = _limit_bytes(memory_limit)
    if not isinstance(start, int) or start < 1:
        raise BatchSearchError(f"start must be an int >= 1, got {start!r}")
    if max_batch is not None and max_batch < start:
        raise BatchSearchError(f"max_batch ({max_batch}) must be >= start ({start})")
    loss_fn = loss_fn or default_loss
    tries: list[BatchTry] = []
    plans: dict[int, Any] = {}
    dev = _device_or_none(device)

    def attempt(method: str, n: int) -> bool:
        options = dict(optimize_options, make_optimizer=make_optimizer) if method == "remat" and make_optimizer else \
            optimize_options
        record, plan = _try_batch(method, n, make_model, make_batch, limit, solver, loss_fn, dev, options)
        tries.append(record)
        if record.fits and plan is not None:
            plans[n] = plan
        _free()
        if on_try is not None:
            on_try(record)
        return record.fits

    best_remat = _search(lambda n: attempt("remat", n), start, max_batch)
    best_plain = _search(lambda n: attempt("plain", n), start, max_batch) if compare_plain else None
    device_name = str(dev) if dev is not None else next((t.device for t in tries if t.device), "cpu")
    return MaxBatchResult(best_remat, best_plain, limit, plans.get(best_remat), tries, device_name)


class BatchSearchError(RematError, ValueError):
    """Invalid arguments to :func:`max_batch_size`."""


# ----------------------------------------------------------------------------- search


def _search(fits: Callable[[int], bool], start: int, max_batch: int | None) -> int:
    """Largest n in [1, max_batch] with fits(n), assuming fits is monotone (true, then false).

    Exponential growth from ``start`` until a failure, then bisection between the last
    success and the first failure; 0 when nothing from 1 up fits."""
    good, bad = 0, None
    n = start
    while True:
        if fits(n):
            good = n
            if max_batch is not None and n >= max_batch:
                return n
            n = 2 * n if max_batch is None else min(2 * n, max_batch)
        else:
            bad = n
            break
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


# ----------------------------------------------------------------------------- one try


def _try_batch(method, n, make_model, make_batch, limit, solver, loss_fn, dev, optimize_options):
    """Run one try; returns (BatchTry, plan or None). Never raises for out-of-memory."""
    try:
        return _run_try(method, n, make_model, make_batch, limit, solver, loss_fn, dev, optimize_options)
    except RematError:
        raise  # remat's own errors already say what to do
    except Exception as err:  # noqa: BLE001 - only out-of-memory is swallowed
        if not _is_oom(err):
            root = err
            while root.__cause__ is not None:  # Dynamo wraps the model's own error
                root = root.__cause__
            raise BatchSearchError(
                f"the training step fails at batch {n} ({method}), for a reason other than memory: "
                f"{type(root).__name__}: {_first_line(root)} -- if the model cannot run this batch size "
                "(BatchNorm needs more than one value per channel in training), start the search at a "
                "larger batch (start=, or --start on the command line)"
            ) from err
        reason = f"out of memory: {_first_line(err)}"
    return BatchTry(method, n, False, None, reason), None


def _run_try(method, n, make_model, make_batch, limit, solver, loss_fn, dev, optimize_options):
    from ..api import optimize
    from ..errors import InfeasibleBudgetError

    model = make_model()
    if not isinstance(model, nn.Module):
        raise BatchSearchError(f"make_model() must return an nn.Module, got {type(model).__name__}")
    device = dev or _model_device(model)
    model = model.to(device).train()
    args, kwargs = _split_batch(make_batch(n), n)
    args, kwargs = _to_device((args, kwargs), device)
    fixed = _tensor_bytes(list(model.parameters()) + list(model.buffers()) + _tensors((args, kwargs)))
    if fixed > limit:
        return BatchTry(method, n, False, None,
                        f"parameters, buffers and batch alone take {format_bytes(fixed)}", fixed,
                        device=str(device)), None

    plan = None
    predicted = None
    used_solver = ""
    if method == "remat":
        optimize_options = dict(optimize_options)
        make_optimizer = optimize_options.pop("make_optimizer", None)
        if make_optimizer is not None:
            optimize_options["optimizer"] = make_optimizer(model)
        try:
            runner = optimize(model, *args, budget=limit - fixed, solver=solver, **optimize_options, **kwargs)
        except InfeasibleBudgetError as err:
            return BatchTry(method, n, False, None,
                            f"no plan fits a budget of {format_bytes(limit - fixed)} "
                            f"(smallest: {format_bytes(err.min_budget_bytes)})", fixed, device=str(device)), None
        plan = runner.plan
        predicted = fixed + plan.peak_bytes
        used_solver = plan.solver
    else:
        runner = model

    def setup():
        for p in model.parameters():
            p.grad = None

    def step():
        loss_fn(runner(*args, **kwargs)).backward()

    from ..measure import peak_memory_growth

    setup()
    step()  # warm-up: compilation, lazy initialization
    setup()
    peak, _ = peak_memory_growth(step, device)
    setup()
    total = fixed + peak
    fits = total <= limit
    reason = "" if fits else f"measured {format_bytes(total)} > limit {format_bytes(limit)}"
    return BatchTry(method, n, fits, total, reason, fixed, predicted, used_solver, str(device)), plan


# ----------------------------------------------------------------------------- helpers


def default_loss(output) -> torch.Tensor:
    """A scalar from a model's output: itself if scalar, else ``.float().sum()``; for a tuple,
    list, dict or ``ModelOutput``: its ``loss`` if it has one, else its first tensor's."""
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else output.float().sum()
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return default_loss(loss)
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    for item in values:
        if isinstance(item, torch.Tensor) and item.is_floating_point():
            return default_loss(item)
    raise BatchSearchError(
        f"cannot make a loss from the model's output ({type(output).__name__}); pass loss_fn=..."
    )


def _limit_bytes(memory_limit) -> int:
    if isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, str)):
        raise BatchSearchError(
            f"memory_limit must be an int of bytes or a size such as '8GiB', not {memory_limit!r}"
        )
    limit = parse_size(memory_limit) if isinstance(memory_limit, str) else memory_limit
    if limit <= 0:
        raise BatchSearchError(f"memory_limit must be positive, got {memory_limit!r}")
    return limit


def _device_or_none(device) -> torch.device | None:
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _model_device(model: nn.Module) -> torch.device:
    for t in list(model.parameters()) + list(model.buffers()):
        return t.device
    return torch.device("cpu")


def _split_batch(batch, n: int) -> tuple[tuple, dict]:
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    if isinstance(batch, dict):
        return (), dict(batch)
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], tuple) and isinstance(batch[1], dict):
        return batch[0], dict(batch[1])
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    raise BatchSearchError(
        f"make_batch({n}) returned a {type(batch).__name__}; return a tensor, a tuple of positional "
        "arguments, a dict of keyword arguments or an (args, kwargs) pair"
    )


def _to_device(tree, device):
    return torch.utils._pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree)


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _tensor_bytes(tensors) -> int:
    """Bytes of the distinct storages of ``tensors``."""
    seen: dict[tuple, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[(t.device.type, t.device.index, s.data_ptr())] = s.nbytes()
    return sum(seen.values())


def _is_oom(err: BaseException) -> bool:
    """An out-of-memory error, possibly wrapped (Dynamo, AOTAutograd) in other exceptions."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, torch.OutOfMemoryError):
            return True
        if isinstance(err, RuntimeError) and ("can't allocate memory" in str(err) or "out of memory" in str(err)):
            return True
        err = getattr(err, "inner_exception", None) or err.__cause__ or err.__context__
    return False


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__


def _free() -> None:
    """Drop what the last try left: cycles (autograd graphs, modules), then CUDA's cached blocks."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

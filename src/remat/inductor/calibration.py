"""The budget checked, not only predicted: measure the compiled step, plan lower while above it.

    calibrate(wrapped, lambda margin: RematPartitioner(options, margin), args, kwargs)
    wrapped.plan.info["measured_peak"]      # what the compiled step measured

Inductor's scheduler may still allocate in ways no graph-level model follows exactly, so with
example inputs :func:`remat.compile` runs the compiled step once, measures its peak, and while it
is above the budget plans again with the budget lowered by the excess (at most
``CALIBRATION_ROUNDS`` times). An excess is one plan's: where lowering the budget by all of it leaves
no plan, the smallest budget that plans is tried before the budget is refused (another plan may hold
less than its prediction says; on an H100 one ResNet plan measured 6.2 MB above its prediction and
the plan made in another process measured within its own).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn

from ..budget import is_min
from ..capture import detached_copies, no_lasting_effects, training_step_mode, unwrap_compile_error
from ..errors import InfeasibleBudgetError, MeasuredAboveBudgetWarning, SolverError
from ..measure import peak_memory_growth

CALIBRATION_ROUNDS = 3

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
    step peaks at 0.8 MiB, each re-plan compiling again, and declared the budget infeasible. With
    it, the CUDA tests' compiled ResNet and GPT-2 pass on an H100.)"""
    params = [p for p in module.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    device = next((p.device for p in params), torch.device("cpu"))
    try:
        for p in params:
            p.grad = None
        with training_step_mode(), no_lasting_effects(module):
            a, k = detached_copies(args), detached_copies(kwargs)
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
    recompiles); where the lowered budget has no plan, once at the smallest budget that plans. Raises
    InfeasibleBudgetError when no plan so made measures within the budget."""
    margin, history, budget_bytes, floor_tried = 0, [], None, False
    for round_ in range(CALIBRATION_ROUNDS + 1):
        try:
            peak = measured_step_peak(wrapped, args, kwargs)
        except Exception as err:  # planning below the budget by the excess may find no plan
            refusal = unwrap_compile_error(err)
            if round_ == 0 or not isinstance(refusal, InfeasibleBudgetError):
                raise
            floor = refusal.min_budget_bytes  # the smallest budget that plans: its plan is another one
            if not floor_tried and round_ < CALIBRATION_ROUNDS and floor < budget_bytes - previous_margin:
                history.append(f"no plan below {budget_bytes - margin}; planned at the smallest budget that "
                               f"plans, {floor}")
                floor_tried, margin = True, budget_bytes - floor
                wrapped._recompile(part_factory(margin))
                continue
            raise InfeasibleBudgetError(
                budget_bytes, peak,
                f"the Inductor-compiled step measured {peak} bytes, above the budget, and no plan below it is "
                f"lower ({'; '.join(history)})",
            ) from err
        plan, part = wrapped.plan, wrapped._remat_partitioner
        budget_bytes = part.last_budget_bytes
        history.append(f"planned {plan.peak_bytes} bytes below {budget_bytes - margin if budget_bytes else None}, "
                       f"measured {peak}")
        # "min" asks for the smallest peak: the plan for it is already the smallest, nothing to lower
        smallest = is_min(part.options.budget)
        fits = budget_bytes is None or smallest or peak <= budget_bytes
        if not fits and floor_tried:  # the smallest budget's plan measured above too: no lower plan is left
            raise InfeasibleBudgetError(
                budget_bytes, peak,
                f"the Inductor-compiled step measured {peak} bytes, above the budget, also planned at the smallest "
                f"budget that plans ({'; '.join(history)})",
            )
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
        previous_margin = margin
        margin += peak - budget_bytes + max(1, budget_bytes // 200)  # the excess, and 0.5% more
        wrapped._recompile(part_factory(margin))  # planned again by the next measurement


__all__ = ["calibrate", "measured_step_peak", "CALIBRATION_ROUNDS"]

"""``remat demo``: a small GPT-2 trained a few steps at several budgets, measured.

For each budget (everything, half, the smallest feasible) it plans the step, trains
``steps`` SGD steps from the same weights and seed as eager PyTorch, and reports the
solver, the budget, the predicted and measured peak memory of one step, the measured
step time against eager, and whether the trained weights equal eager's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from . import zoo
from .api import optimize
from .errors import InfeasibleBudgetError, format_bytes
from .measure import measure_step


@dataclass
class DemoRow:
    label: str
    solver: str
    budget_bytes: int | None
    predicted: int | None
    measured: int
    seconds: float
    max_rel_err: float
    plan_seconds: float


def _train(example: zoo.Example, module, steps: int, seed: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(example.model.parameters(), lr=1e-2)
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(seed + i)
        example.loss(module(*example.args, **example.kwargs)).backward()
        opt.step()
    return [p.detach().clone() for p in example.model.parameters()]


def _measure(example: zoo.Example, module, repeats: int):
    def step():
        out = module(*example.args, **example.kwargs)
        example.loss(out).backward()

    return measure_step(step, setup=lambda: example.model.zero_grad(set_to_none=True), warmup=1, repeats=repeats)


def _rel_err(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    worst = 0.0
    for a, b in zip(got, ref):
        scale = max(b.abs().max().item(), 1e-12)
        worst = max(worst, (a.double() - b.double()).abs().max().item() / scale)
    return worst


def run_demo(model: str = "gpt2", size: str = "small", steps: int = 3, repeats: int = 3, seed: int = 0,
             console: Console | None = None) -> list[DemoRow]:
    console = console or Console()
    console.print(f"[bold]remat demo[/]: {model} ({size}, random weights), {steps} SGD steps per budget\n")

    eager_ex = zoo.build(model, size=size, seed=seed)
    eager_weights = _train(eager_ex, eager_ex.model, steps, seed)
    ex = zoo.build(model, size=size, seed=seed)
    eager = _measure(ex, ex.model, repeats)
    rows = [DemoRow("eager PyTorch", "-", None, None, eager.peak_bytes, eager.seconds, 0.0, 0.0)]

    probe = zoo.build(model, size=size, seed=seed)
    try:
        optimize(probe.model, *probe.args, **probe.kwargs, budget=1)
        smallest = 1
    except InfeasibleBudgetError as err:
        smallest = err.min_budget_bytes

    for label, budget in (("100%", 1.0), ("50%", 0.5), ("smallest", smallest)):
        ex = zoo.build(model, size=size, seed=seed)
        start = time.perf_counter()
        try:
            module = optimize(ex.model, *ex.args, **ex.kwargs, budget=budget)
        except InfeasibleBudgetError as err:
            console.print(f"[yellow]{label}: no plan fits ({err})[/]")
            continue
        plan_seconds = time.perf_counter() - start
        measured = _measure(ex, module, repeats)
        ex_train = zoo.build(model, size=size, seed=seed)
        trained = _train(ex_train, optimize(ex_train.model, *ex_train.args, **ex_train.kwargs, budget=budget), steps, seed)
        plan = module.plan
        rows.append(DemoRow(label, plan.solver, plan.budget_bytes, plan.peak_bytes, measured.peak_bytes,
                            measured.seconds, _rel_err(trained, eager_weights), plan_seconds))

    table = Table(title=f"{model} ({size}): one training step")
    for col in ("budget", "solver", "limit", "predicted", "measured", "time", "weights vs eager", "plan"):
        table.add_column(col, justify="left" if col in ("budget", "solver", "weights vs eager") else "right")
    base = rows[0].seconds
    for r in rows:
        if r.label == "eager PyTorch":
            same = "reference"
        elif r.max_rel_err <= 1e-5:
            same = "equal" if r.max_rel_err == 0 else f"equal ({r.max_rel_err:.0e})"
        else:
            same = f"DIFFER ({r.max_rel_err:.0e})"
        table.add_row(
            r.label,
            r.solver,
            "-" if r.budget_bytes is None else format_bytes(r.budget_bytes),
            "-" if r.predicted is None else format_bytes(r.predicted),
            format_bytes(r.measured),
            f"{r.seconds / base:.2f}x",
            same,
            "-" if r.label == "eager PyTorch" else f"{r.plan_seconds:.1f}s",
        )
    console.print(table)
    console.print(
        "limit: the budget in bytes; predicted: the simulator's peak; measured: the peak measured. "
        "Peaks are the growth of allocated memory during one forward+backward (gradients included, "
        "weights and inputs excluded), measured from torch's allocator; times are medians of "
        f"{repeats} steps on this machine."
    )
    return rows

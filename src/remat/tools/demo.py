"""``remat demo``: a small GPT-2 trained a few steps at several budgets, measured.

For each budget (everything, half of what a plan can change, the smallest feasible) it plans
the step, trains ``steps`` SGD steps from the same weights and seed as eager PyTorch, and
reports the solver, the budget, the predicted and measured peak memory of one step, the
measured step time against eager PyTorch's, whether the trained weights equal eager's, and
the planning time.

Planning time is reported twice, honestly: ``plan`` is the wall time of the first
:func:`remat.optimize` at that budget in this process (the first budget's includes the
process's first capture and the cost measurements it fills caches with; a budget the
planner has not seen builds its menus), ``re-plan`` the same call again (capture again, the
plan from the in-process cache).

Step times are taken in alternating rounds — eager, then each planned module, then eager
again, ... — so that a slow moment of a shared machine hits all of them alike; a module's
time ratio is the median over the rounds of (its step ÷ eager's step in the same round),
shown with the range of those ratios.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
from rich.console import Console
from rich.table import Table

from .. import models as zoo
from ..api import optimize
from ..errors import InfeasibleBudgetError, format_bytes
from ..measure import measure_step


@dataclass
class DemoRow:
    label: str
    solver: str
    budget_bytes: int | None
    predicted: int | None
    measured: int = 0
    seconds: list[float] = field(default_factory=list)  # one step time per round
    ratios: list[float] = field(default_factory=list)  # step / eager's step, per round
    max_rel_err: float = 0.0
    plan_seconds: float = 0.0  # first optimize() at this budget in the process
    replan_seconds: float = 0.0  # the same call again

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else 1.0


def _train(example: zoo.Example, module, steps: int, seed: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(example.model.parameters(), lr=1e-2)
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.manual_seed(seed + i)
        example.loss(module(*example.args, **example.kwargs)).backward()
        opt.step()
    return [p.detach().clone() for p in example.model.parameters()]


def _measure(example: zoo.Example, module, warmup: int):
    def step():
        out = module(*example.args, **example.kwargs)
        example.loss(out).backward()

    return measure_step(step, setup=lambda: example.model.zero_grad(set_to_none=True), warmup=warmup, repeats=1)


def _rel_err(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    worst = 0.0
    for a, b in zip(got, ref):
        scale = max(b.abs().max().item(), 1e-12)
        worst = max(worst, (a.double() - b.double()).abs().max().item() / scale)
    return worst


def run_demo(model: str = "gpt2", size: str = "small", steps: int = 3, rounds: int = 7, seed: int = 0,
             console: Console | None = None) -> list[DemoRow]:
    console = console or Console()
    console.print(f"[bold]remat demo[/]: {model} ({size}, random weights), {steps} SGD steps per budget, "
                  f"step times over {rounds} alternating rounds\n")

    eager_ex = zoo.build(model, size=size, seed=seed)
    eager_weights = _train(eager_ex, eager_ex.model, steps, seed)
    runs: list[tuple[DemoRow, zoo.Example, torch.nn.Module]] = []
    ex = zoo.build(model, size=size, seed=seed)
    runs.append((DemoRow("eager PyTorch", "-", None, None), ex, ex.model))

    for label, budget in (("100%", 1.0), ("50%", 0.5), ("smallest", "min")):
        ex = zoo.build(model, size=size, seed=seed)
        start = time.perf_counter()
        try:
            module = optimize(ex.model, *ex.args, **ex.kwargs, budget=budget)
        except InfeasibleBudgetError as err:
            console.print(f"[yellow]{label}: no plan fits ({err})[/]")
            continue
        plan_seconds = time.perf_counter() - start
        ex_train = zoo.build(model, size=size, seed=seed)
        start = time.perf_counter()
        again = optimize(ex_train.model, *ex_train.args, **ex_train.kwargs, budget=budget)
        replan_seconds = time.perf_counter() - start
        trained = _train(ex_train, again, steps, seed)
        plan = module.plan
        row = DemoRow(label, plan.solver, plan.budget_bytes, plan.peak_bytes,
                      max_rel_err=_rel_err(trained, eager_weights), plan_seconds=plan_seconds,
                      replan_seconds=replan_seconds)
        runs.append((row, ex, module))

    for row, ex, module in runs:  # warm-up (and the first memory reading)
        row.measured = _measure(ex, module, warmup=1).peak_bytes
    for _ in range(rounds):
        for row, ex, module in runs:
            m = _measure(ex, module, warmup=0)
            row.seconds.append(m.seconds)
            row.measured = max(row.measured, m.peak_bytes)
        eager_seconds = runs[0][0].seconds[-1]
        for row, _, _ in runs:
            row.ratios.append(row.seconds[-1] / eager_seconds)
    rows = [row for row, _, _ in runs]
    _print_table(console, model, size, rows, rounds)
    return rows


def _print_table(console: Console, model: str, size: str, rows: list[DemoRow], rounds: int) -> None:
    table = Table(title=f"{model} ({size}): one training step")
    columns = ("budget", "solver", "limit", "predicted", "measured", "time vs eager", "weights vs eager",
               "plan", "re-plan")
    for col in columns:
        table.add_column(col, justify="left" if col in ("budget", "solver", "weights vs eager") else "right",
                         no_wrap=col in ("solver", "limit", "predicted", "measured"))
    for r in rows:
        eager = r.label == "eager PyTorch"
        if eager:
            same = "reference"
        elif r.max_rel_err <= 1e-5:
            same = "equal" if r.max_rel_err == 0 else f"equal ({r.max_rel_err:.0e})"
        else:
            same = f"DIFFER ({r.max_rel_err:.0e})"
        if eager:
            timing = f"{statistics.median(r.seconds) * 1e3:.0f} ms"
        else:
            timing = f"{r.ratio:.2f}x ({min(r.ratios):.2f}-{max(r.ratios):.2f})"
        table.add_row(
            r.label,
            r.solver,
            "-" if r.budget_bytes is None else format_bytes(r.budget_bytes),
            "-" if r.predicted is None else format_bytes(r.predicted),
            format_bytes(r.measured),
            timing,
            same,
            "-" if eager else f"{r.plan_seconds:.1f}s",
            "-" if eager else f"{r.replan_seconds:.1f}s",
        )
    console.print(table)
    console.print(
        "limit: the budget in bytes; predicted: the simulator's peak; measured: the largest peak measured. "
        "Peaks are the growth of allocated memory during one forward+backward (gradients included, "
        "weights and inputs excluded), measured from torch's allocator. "
        f"time vs eager: the planned step's wall time divided by eager PyTorch's step on this machine, "
        f"median over {rounds} alternating rounds (eager, each plan, eager, ...), with the range over the "
        "rounds; eager's row shows its median step time. "
        "plan: wall time of the first remat.optimize at that budget in this process, capture included "
        "(the first row also pays the process's first capture and cost measurements); "
        "re-plan: the same call again, the plan coming from the in-process cache."
    )

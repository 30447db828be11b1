"""The ``remat`` command.

    remat demo                                     GPT-2 trained at several budgets, measured
    remat plan gpt2 --budget 0.5 --save plan.json  plan one model's step, print the plan
    remat sweep gpt2 --solvers hierarchical chen_sqrt --output sweep.png   overhead against budget
    remat bench gpt2 --budget min --output timeline.png   run the plan: predicted vs measured
    remat maxbatch gpt2 --memory-limit 2GiB        the largest batch that fits, remat vs plain PyTorch
    remat plot plan.json --output schedule.svg --kind schedule

MODEL is a built-in example (``remat.models.names()``: random weights, nothing downloaded; pick
its scale with ``--size tiny|small|medium``) or ``package.module:factory``, a callable that
returns ``(model, example_args)`` or a :class:`remat.models.Example` (``remat maxbatch`` calls it
with ``batch=N``). The current directory is importable.

BUDGET: a bare number in (0, 1] is a fraction (see the README's "Budget"); ``min`` is the
smallest feasible budget; bytes need a unit (``2GiB``, ``800MB``, ``123B``); ``none`` is no
limit. Exit status: 0 success, 1 an error (one line on stderr), 2 a usage error, 3 a budget no
plan meets (one line naming the smallest feasible budget).

Every step that takes time shows a spinner or progress bar on stderr while it runs (nothing is
left there when it ends) and a line with its wall time on stdout when it is done.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .inputs import EXIT_ERROR, EXIT_INFEASIBLE, EXIT_OK, EXIT_USAGE, SIZES, CliError, check_output, load_example, load_plan

# ------------------------------------------------------------------------------ argument types


def parse_budget(text: str):
    """``--budget``: ``none``/``all`` -> None, else :func:`remat.budget.parse_budget_text`
    (``min``, a fraction in (0, 1], or a size with a unit)."""
    from ..budget import BudgetError, parse_budget_text

    if text.strip().lower() in ("none", "all"):
        return None
    try:
        return parse_budget_text(text)
    except BudgetError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_memory(text: str) -> int:
    """``--memory-limit``: a size with a unit (``16GiB``, ``800MB``); a bare number is refused."""
    from ..budget import parse_size

    try:
        float(text)
    except ValueError:
        pass
    else:
        raise argparse.ArgumentTypeError(f"the memory limit {text!r} has no unit: write e.g. {text}GiB, {text}MB or {text}B")
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"cannot read the memory limit {text!r}: write a size such as 16GiB or 800MB") from err


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (no usage block), exit status 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


# ------------------------------------------------------------------------------ display


class _Ui:
    """Results on stdout (rich tables); spinners and bars on stderr, gone when they end."""

    def __init__(self):
        probe = Console()
        # a terminal's own width; a pipe or file gets lines long enough for a sweep's table
        self.out = Console(width=probe.width if probe.is_terminal else 150, highlight=False)
        self.err = Console(stderr=True)

    @contextlib.contextmanager
    def phase(self, label: str):
        """A spinner while the block runs, then ``✓ label (seconds)`` on stdout."""
        start = time.perf_counter()
        with self.err.status(f"{label} ...", spinner="dots"):
            yield
        self.out.print(f"[green]\u2713[/] {label} [dim]({time.perf_counter() - start:.1f} s)[/]")

    def progress(self) -> Progress:
        return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=self.err, transient=True,
                        disable=not self.err.is_terminal)  # off a terminal it would leave a blank line


def _fmt(n: int | None) -> str:
    from ..errors import format_bytes

    return "-" if n is None else format_bytes(n)


def _fraction_label(budget) -> str:
    if budget is None:
        return "none"
    if isinstance(budget, float):
        return f"{budget:g}"
    return str(budget) if isinstance(budget, str) else _fmt(budget)


# ------------------------------------------------------------------------------ planning steps


def _capture(ui: _Ui, example, cost_model: str):
    """Capture the model's training step once (the store_all plan); returns that plan."""
    from ..api import capture_and_plan

    with ui.phase(f"captured {example.name} and costed its ops ({cost_model})"):
        base, _ = capture_and_plan(example.model, *example.args, solver="store_all", cost_model=cost_model,
                                   **example.kwargs)
    ui.out.print(f"  {base.graph.summary()}", highlight=False)
    return base


def _plan_table(title: str, plan, store_all_peak: int, extra: dict | None = None) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    rows = {
        "solver": plan.solver,
        "budget": "none" if plan.budget_bytes is None else f"{_fmt(plan.budget_bytes)} ({plan.budget_bytes} B)",
        "predicted peak": f"{_fmt(plan.peak_bytes)}  (store_all: {_fmt(store_all_peak)}, "
                          f"{plan.peak_bytes / store_all_peak * 100 if store_all_peak else 100:.0f}%)",
        "saved for backward": f"{_fmt(plan.saved_bytes)} in {len(plan.saved_values)} values",
        "compute": f"{plan.compute_seconds * 1e3:.2f} ms predicted, overhead {plan.overhead * 100:+.1f}% "
                   f"over store_all, {plan.recomputations} recomputations",
        "solve time": f"{plan.solve_seconds:.2f} s",
    }
    rows.update(extra or {})
    rows.update({k: str(v) for k, v in plan.info.items()})
    for k, v in rows.items():
        table.add_row(k, str(v))
    return table


# ------------------------------------------------------------------------------ commands


def cmd_plan(args, ui: _Ui) -> int:
    check_output(args.output)
    example = load_example(args.model, args.size)
    if args.lengths:
        return cmd_plan_lengths(args, ui, example)
    base = _capture(ui, example, args.cost_model)
    with ui.phase(f"planned with {args.solver} for budget {_fraction_label(args.budget)}"):
        plan = _plan_splitting(example, base, args)
    ui.out.print(_plan_table(f"Plan for {example.name}", plan, base.peak_bytes))
    if args.save:
        plan.save(args.save)
        ui.out.print(f"saved to {args.save}")
    return EXIT_OK


def _plan_splitting(example, base, args):
    """The plan of ``remat plan``: of the captured step; where ``--split`` asks for chunks, or under
    ``auto`` no plan fits otherwise, of the step with its largest ops split into row chunks
    (captured again through :func:`remat.api.capture_and_plan`, which chooses the chunks)."""
    from ..api import capture_and_plan
    from ..errors import InfeasibleBudgetError
    from ..solvers.cache import plan_with_cache

    if not isinstance(args.split, int):
        try:
            return plan_with_cache(base.graph, args.budget, args.solver, time_limit=args.time_limit,
                                   cost_model=args.cost_model)
        except InfeasibleBudgetError:
            if args.split == "off" or args.solver != "auto":
                raise
    plan, _ = capture_and_plan(example.model, *example.args, budget=args.budget, solver=args.solver,
                               cost_model=args.cost_model, time_limit=args.time_limit, split=args.split,
                               **example.kwargs)
    return plan


def _split_arg(text: str):
    if text in ("auto", "off"):
        return text
    try:
        chunks = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, off or a number of chunks, not {text!r}") from None
    if chunks < 1:
        raise argparse.ArgumentTypeError(f"the number of chunks must be at least 1, not {chunks}")
    return chunks


def cmd_plan_lengths(args, ui: _Ui, example) -> int:
    from .lengths import lengths_table, parse_lengths, plan_each_length, plot_lengths

    try:
        lengths = parse_lengths(args.lengths)
    except ValueError as err:
        raise CliError(str(err), EXIT_USAGE) from None
    with ui.phase(f"captured once, planned each length bucket of {lengths[0]}..{lengths[1]}"):
        rows, budget = plan_each_length(example, lengths, budget=args.budget, solver=args.solver,
                                        cost_model=args.cost_model, time_limit=args.time_limit, split=args.split)
    ui.out.print(lengths_table(f"{example.name}: predicted peak per length", rows, budget))
    if args.output:
        plot_lengths(rows, budget, args.output, f"{example.name}: predicted peak against length")
        ui.out.print(f"plotted to {args.output}")
    return EXIT_OK


def cmd_sweep(args, ui: _Ui) -> int:
    from .pareto import pareto_of_graph
    from ..solvers.registry import available

    check_output(args.output)
    unknown = [s for s in args.solvers if s != "auto" and s not in available()]
    if unknown:
        raise CliError(f"unknown solver(s) {', '.join(unknown)}: choose 'auto' or any of {', '.join(available())}",
                       EXIT_USAGE)
    example = load_example(args.model, args.size)
    base = _capture(ui, example, args.cost_model)
    solve_seconds = {s: 0.0 for s in args.solvers}
    start = last = time.perf_counter()
    with ui.progress() as progress:
        task = progress.add_task("planning", total=len(args.solvers) * len(args.budgets))

        def on_plan(solver, budget_bytes, plan):
            nonlocal last
            now = time.perf_counter()
            solve_seconds[solver] += now - last
            last = now
            progress.update(task, description=f"{solver} at {_fmt(budget_bytes)}")
            progress.advance(task)

        front = pareto_of_graph(base.graph, solvers=args.solvers, budgets=args.budgets,
                                cost_model=args.cost_model, time_limit=args.time_limit, on_plan=on_plan)
    ui.out.print(f"[green]\u2713[/] planned {len(args.solvers)} solver(s) x {len(args.budgets)} budget(s) "
                 f"[dim]({time.perf_counter() - start:.1f} s)[/]")

    table = Table(title=f"{example.name}: predicted overhead over store_all (and peak) per budget",
                  title_justify="left")
    table.add_column("budget", justify="right")
    table.add_column("of store_all", justify="right")
    for s in args.solvers:
        table.add_column(s, justify="right", no_wrap=True)
    for k, (label, b) in enumerate(zip(args.budgets, front.budgets)):
        cells = [front[s][k] for s in args.solvers]
        best = min((p.overhead for p in cells if p is not None), default=None)
        row = []
        for p in cells:
            if p is None:
                row.append("[dim]-[/]")
            else:
                text = f"{p.overhead * 100:+.1f}%  {_fmt(p.peak_bytes)}"
                row.append(f"[bold green]{text}[/]" if p.overhead == best else text)
        share = "-" if b is None else f"{b / base.peak_bytes * 100:.0f}%"
        table.add_row(f"{_fraction_label(label)} = {_fmt(b)}" if label is not None else "none", share, *row)
    table.caption = ("- : no plan within that budget.  Solve time: "
                     + ", ".join(f"{s} {t:.1f} s" for s, t in solve_seconds.items()))
    ui.out.print(table)
    if args.output:
        from .plots import plot_pareto

        plot_pareto(front, args.output, title=f"{example.name} ({args.size}): overhead against budget")
        ui.out.print(f"wrote {args.output}")
    return EXIT_OK


def _optimize(example, budget, solver: str, cost_model: str, time_limit):
    from ..api import optimize

    return optimize(example.model, *example.args, budget=budget, solver=solver, cost_model=cost_model,
                    time_limit=time_limit, **example.kwargs)


def _timed_rounds(steps: dict[str, Callable[[], Any]], setup: Callable[[], Any], rounds: int, sync, progress, task,
                  min_round_seconds: float = 0.05) -> dict[str, list[float]]:
    """Seconds per step of each of ``steps``, one reading per round; within a round each step
    runs ``k`` times (``k`` makes a round last ``min_round_seconds``), and the order in which
    the steps run alternates from round to round, so drifts of the machine hit all alike."""
    names = list(steps)
    single = {}
    for name in names:  # warm-up + calibration
        setup()
        t0 = time.perf_counter()
        steps[name]()
        sync()
        single[name] = time.perf_counter() - t0
    k = max(1, math.ceil(min_round_seconds / max(max(single.values()), 1e-6)))
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            total = 0.0
            for _ in range(k):
                setup()
                sync()
                t0 = time.perf_counter()
                steps[name]()
                sync()
                total += time.perf_counter() - t0
            times[name].append(total / k)
        progress.advance(task)
    return times


def cmd_bench(args, ui: _Ui) -> int:
    import torch

    from ..measure import measure_step
    from ..solvers.registry import solve

    check_output(args.output)
    if args.rounds < 1:
        raise CliError("--rounds must be at least 1", EXIT_USAGE)
    example = load_example(args.model, args.size, device=args.device)
    with ui.phase(f"captured and planned {example.name} with {args.solver} for budget {_fraction_label(args.budget)}"):
        module = _optimize(example, args.budget, args.solver, args.cost_model, args.time_limit)
    plan = module.plan
    store_all = solve("store_all", plan.graph, None)
    model = example.model

    def setup():
        model.zero_grad(set_to_none=True)

    def eager_step():
        example.loss(model(*example.args, **example.kwargs)).backward()

    def planned_step():
        example.loss(module(*example.args, **example.kwargs)).backward()

    device = torch.device(args.device)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with ui.progress() as progress:
        task = progress.add_task("measuring peak memory", total=2)
        eager = measure_step(eager_step, device=device, setup=setup, warmup=1, repeats=1)
        progress.advance(task)
        planned = measure_step(planned_step, device=device, setup=setup, warmup=1, repeats=1)
        progress.advance(task)
    ui.out.print("[green]\u2713[/] measured peak memory of both steps")
    with ui.progress() as progress:
        task = progress.add_task(f"timing {args.rounds} alternating rounds", total=args.rounds)
        times = _timed_rounds({"eager": eager_step, "planned": planned_step}, setup, args.rounds, sync, progress, task)
    ratios = [p / e for p, e in zip(times["planned"], times["eager"])]
    ratio = statistics.median(ratios)
    ui.out.print(f"[green]\u2713[/] timed {args.rounds} rounds")

    table = Table(title=f"{example.name}: one training step on {device}", title_justify="left")
    for col in ("step", "budget", "predicted peak", "measured peak", "predicted time", "measured time", "time vs eager"):
        table.add_column(col, justify="left" if col == "step" else "right")
    table.add_row("eager PyTorch (unplanned)", "-", _fmt(store_all.peak_bytes), _fmt(eager.peak_bytes),
                  "1.00x", f"{statistics.median(times['eager']) * 1e3:.2f} ms", "1.00x")
    table.add_row(f"remat ({plan.solver})", _fmt(plan.budget_bytes), _fmt(plan.peak_bytes), _fmt(planned.peak_bytes),
                  f"{1 + plan.overhead:.2f}x", f"{statistics.median(times['planned']) * 1e3:.2f} ms", f"{ratio:.2f}x")
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else f"{ratios[0]:.2f}"
    table.caption = (
        "Peaks: growth of allocated memory during one forward+backward (gradients included, weights and "
        "inputs excluded); predicted by the simulator (eager: remat's store_all plan), measured from the "
        "allocator. Predicted time: compute relative to store_all. Time vs eager: the planned step's time "
        f"divided by the unplanned eager step's on the same model and inputs, median of {len(ratios)} "
        f"alternating rounds (eager, planned, planned, eager, ...), range {spread}x."
    )
    ui.out.print(table)
    if args.output:
        from .plots import plot_timeline

        from ..measure import allocator_timeline_cpu

        measured: Any = planned.peak_bytes
        if device.type == "cpu":
            setup()
            measured, _ = allocator_timeline_cpu(planned_step)
        plot_timeline(plan, args.output, measured=measured,
                      title=f"{example.name} ({args.size}): {plan.solver}, predicted vs measured memory")
        ui.out.print(f"wrote {args.output}")
    return EXIT_OK


def _best_try(result, method: str, size: int | None):
    return next((t for t in result.tries if t.method == method and t.batch == size and t.fits), None)


def cmd_maxbatch(args, ui: _Ui) -> int:
    import remat

    max_batch_size = getattr(remat, "max_batch_size", None)
    if max_batch_size is None:
        raise CliError("this installation of remat has no remat.max_batch_size")
    if args.start < 1 or (args.max_batch is not None and args.max_batch < args.start):
        raise CliError("--start must be >= 1 and --max-batch >= --start", EXIT_USAGE)
    template = load_example(args.model, args.size, batch=args.start, device=args.device)

    def make_model():
        return load_example(args.model, args.size, batch=args.start, device=args.device).model

    def make_batch(n: int):
        ex = load_example(args.model, args.size, batch=n, device=args.device)
        return tuple(ex.args), dict(ex.kwargs)

    tries: list = []
    with ui.progress() as progress:
        task = progress.add_task(f"searching batch sizes under {_fmt(args.memory_limit)}", total=None)

        def on_try(record):
            tries.append(record)
            verdict = "fits" if record.fits else "does not fit"
            progress.update(task, description=f"{record.method} batch {record.batch}: {verdict}")
            measured = "" if record.measured_bytes is None else f"measured {_fmt(record.measured_bytes)}"
            progress.console.print(f"  {record.method:<6} batch {record.batch:>6}  {verdict:<12}  {measured:<22} "
                                   f"{record.reason}".rstrip(), highlight=False)  # above the bar, on stderr

        result = max_batch_size(make_model, make_batch, args.memory_limit, solver=args.solver, loss_fn=template.loss,
                                device=args.device, start=args.start, max_batch=args.max_batch,
                                compare_plain=not args.no_plain, on_try=on_try, cost_model=args.cost_model)
    ui.out.print(f"[green]\u2713[/] tried {len(tries)} batch sizes")
    log = Table(title="tries, in order", title_justify="left")
    for col in ("method", "batch", "fits", "measured total", "predicted total", "why not"):
        log.add_column(col, justify="right" if col in ("batch", "measured total", "predicted total") else "left")
    for t in tries:
        log.add_row(t.method, str(t.batch), "yes" if t.fits else "no", _fmt(t.measured_bytes),
                    _fmt(getattr(t, "predicted_bytes", None)), t.reason)
    ui.out.print(log)

    table = Table(title=f"{template.name}: the largest batch whose measured step fits in {_fmt(args.memory_limit)}",
                  title_justify="left")
    for col in ("", "batch size", "measured total", "of which the step's peak"):
        table.add_column(col, justify="left" if not col else "right")
    rows = [(f"remat ({args.solver})", "remat", result.batch_size)]
    if not args.no_plain:
        rows.append(("plain PyTorch", "plain", result.plain_batch_size))
    for label, method, size in rows:
        best = _best_try(result, method, size)
        total = None if best is None else best.measured_bytes
        growth = None if best is None or total is None else total - best.fixed_bytes
        table.add_row(label, str(size or 0), _fmt(total), _fmt(growth))
    table.caption = ("Measured total = parameters + buffers + the batch + the step's measured peak growth "
                     "(optimizer state not included)."
                     + (f" remat fits {result.batch_size / result.plain_batch_size:.2f}x plain PyTorch's batch."
                        if result.batch_size and result.plain_batch_size else ""))
    ui.out.print(table)
    if args.save and result.plan is not None:
        result.plan.save(args.save)
        ui.out.print(f"saved the plan for batch {result.batch_size} to {args.save}")
    if not result.batch_size:
        raise CliError(f"not even batch {args.start} fits in {_fmt(args.memory_limit)} with remat "
                       "(see the tries above)")
    return EXIT_OK


def cmd_plot(args, ui: _Ui) -> int:
    from . import plots as viz

    check_output(args.output)
    plan = load_plan(args.plan)
    with ui.phase(f"drew the {args.kind} of {args.plan}"):
        name = os.path.basename(args.plan)
        if args.kind == "timeline":
            viz.plot_timeline(plan, args.output, name=name)
        else:
            viz.plot_schedule(plan, args.output, name=name)
    ui.out.print(f"wrote {args.output}")
    return EXIT_OK


def cmd_demo(args, ui: _Ui) -> int:
    from .demo import run_demo

    rows = run_demo(args.model, args.size, args.steps, console=ui.out)
    return EXIT_OK if all(r.max_rel_err <= 1e-5 for r in rows) else EXIT_ERROR


# ------------------------------------------------------------------------------ parser, main


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a built-in model (remat.models.names()) or package.module:factory")
    p.add_argument("--size", default="small", choices=SIZES, help="scale of a built-in model (default: small)")


def _add_cost_model(p: argparse.ArgumentParser) -> None:
    # "profile" is remat.cost.DEFAULT_COST_MODEL, written out: the CLI starts without importing torch
    p.add_argument("--cost-model", default="profile", choices=["profile", "flops", "unit"])


def _add_planning(p: argparse.ArgumentParser, budget_required: bool) -> None:
    p.add_argument("--budget", type=parse_budget, required=budget_required, default=None,
                   help="a fraction in (0, 1], 'min' (the smallest feasible), or a size with a unit (2GiB, 800MB)")
    p.add_argument("--solver", default="auto", help="auto (default) or one of remat.available_solvers()")
    _add_cost_model(p)
    p.add_argument("--time-limit", type=float, default=None,
                   help="seconds the command's planning may take in all; an exact solver stopped by it returns its "
                        "best plan and says how far from optimal it may be")


def build_parser() -> argparse.ArgumentParser:
    from .pareto import DEFAULT_PARETO_BUDGETS, DEFAULT_PARETO_SOLVERS

    parser = _Parser(prog="remat", description="Fit a PyTorch training step into a memory budget.",
                     epilog="BUDGET: a bare number is a fraction in (0, 1]; bytes need a unit (2GiB); 'min' is the "
                            "smallest feasible budget. Exit status: 0 done, 1 an error, 2 a usage error, 3 a "
                            "budget no plan meets.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="train a small GPT-2 at several budgets and measure it")
    demo.add_argument("--model", default="gpt2")
    demo.add_argument("--size", default="small", choices=SIZES)
    demo.add_argument("--steps", type=int, default=3)
    demo.set_defaults(func=cmd_demo)

    from .clean import cmd_clean

    clean = sub.add_parser("clean", help="remove offload folders and cache files that killed processes left")
    clean.add_argument("--offload-dir", default=None, help="where offload folders are (default: $REMAT_OFFLOAD_DIR, else the temporary directory)")
    clean.set_defaults(func=cmd_clean)

    plan = sub.add_parser("plan", help="plan one model's training step and print the plan")
    _add_model(plan)
    _add_planning(plan, budget_required=False)
    plan.add_argument("--save", metavar="PLAN.json", help="write the plan as JSON")
    plan.add_argument("--split", type=_split_arg, default="auto", metavar="auto|off|K",
                      help="split the ops that set the peak (the LM head and its loss) into row chunks: auto (where "
                           "no plan fits otherwise, with --solver auto; default), off, or K chunks")
    plan.add_argument("--lengths", metavar="MIN:MAX", help="a plan per sequence-length bucket (dimension 1)")
    plan.add_argument("--output", metavar="FILE.png|svg", help="with --lengths: plot peak against length")
    plan.set_defaults(func=cmd_plan)

    sweep = sub.add_parser("sweep", help="overhead against budget for several solvers (a table and a plot)")
    _add_model(sweep)
    sweep.add_argument("--solvers", nargs="+", default=list(DEFAULT_PARETO_SOLVERS), metavar="SOLVER")
    sweep.add_argument("--budgets", nargs="+", type=parse_budget, default=list(DEFAULT_PARETO_BUDGETS),
                       metavar="BUDGET")
    _add_cost_model(sweep)
    sweep.add_argument("--time-limit", type=float, default=None,
                       help="seconds all the sweep's planning may take, shared among its solvers and budgets")
    sweep.add_argument("--output", metavar="FILE.png|svg", help="plot the curves to this file")
    sweep.set_defaults(func=cmd_sweep)

    bench = sub.add_parser("bench", help="run the plan: predicted vs measured peak and time against eager")
    _add_model(bench)
    _add_planning(bench, budget_required=True)
    bench.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    bench.add_argument("--rounds", type=int, default=10, help="alternating timing rounds (default 10)")
    bench.add_argument("--output", metavar="FILE.png|svg", help="plot predicted and measured memory to this file")
    bench.set_defaults(func=cmd_bench)

    maxbatch = sub.add_parser("maxbatch", help="the largest batch whose measured step fits a memory limit")
    _add_model(maxbatch)
    maxbatch.add_argument("--memory-limit", type=parse_memory, required=True, metavar="SIZE",
                          help="total step memory (parameters, buffers, batch, the step's peak; not optimizer "
                               "state): a size with a unit (16GiB, 800MB)")
    maxbatch.add_argument("--solver", default="auto", help="auto (default) or one of remat.available_solvers()")
    _add_cost_model(maxbatch)
    maxbatch.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    maxbatch.add_argument("--start", type=int, default=2,
                          help="first batch size tried (default 2: BatchNorm cannot train on one sample)")
    maxbatch.add_argument("--max-batch", type=int, default=None, help="never try a larger batch")
    maxbatch.add_argument("--no-plain", action="store_true", help="skip the plain PyTorch comparison")
    maxbatch.add_argument("--save", metavar="PLAN.json", help="write the plan of the largest batch as JSON")
    maxbatch.set_defaults(func=cmd_maxbatch)

    plot = sub.add_parser("plot", help="draw a saved plan: its memory timeline or its schedule matrix")
    plot.add_argument("plan", metavar="PLAN.json")
    plot.add_argument("--output", required=True, metavar="FILE.png|svg")
    plot.add_argument("--kind", default="timeline", choices=["timeline", "schedule"])
    plot.set_defaults(func=cmd_plot)
    return parser


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _infeasible_line(err) -> str:
    """One line for an InfeasibleBudgetError, naming the smallest feasible budget."""
    least = err.min_budget_bytes
    fraction = getattr(err, "min_budget_fraction", None)
    as_fraction = f", a fraction of {fraction:.3f}" if isinstance(fraction, float) else ""
    bound = getattr(err, "lower_bound_bytes", None)
    if bound is not None and bound < least:  # refused below the bound: the exact minimum lies between
        return (f"remat: no plan fits a budget of {_fmt(err.budget_bytes)}; no plan can peak below {_fmt(bound)}, "
                f"and {_fmt(least)} ({least} bytes{as_fraction}) plans: rerun with --budget {least}B, or "
                "--budget min for the exact minimum")
    return (f"remat: no plan fits a budget of {_fmt(err.budget_bytes)}; the smallest feasible budget is "
            f"{_fmt(least)} ({least} bytes{as_fraction}): rerun with --budget min or --budget {least}B")


def main(argv: list[str] | None = None) -> int:
    """Run the ``remat`` command; returns the exit status (errors are one line on stderr)."""
    from ..errors import InfeasibleBudgetError, RematError

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, or a usage error already printed as one line
        return stop.code if isinstance(stop.code, int) else EXIT_USAGE
    from ..solvers.registry import time_budget

    ui = _Ui()
    show_warning = warnings.showwarning

    def warn_on_one_line(message, category, filename, lineno, file=None, line=None):
        ui.err.print(Text.assemble((category.__name__, "yellow"), f": {_one_line(message)}"), soft_wrap=True)

    warnings.showwarning = warn_on_one_line  # printed above a running progress bar, without source lines
    try:
        try:
            with time_budget(getattr(args, "time_limit", None)):  # every solve of the command, together
                return args.func(args, ui)
        finally:
            sys.stdout.flush()  # what was printed comes before an error line
            warnings.showwarning = show_warning
    except CliError as err:
        sys.stderr.write(f"remat {args.command}: error: {_one_line(err)}\n")
        return err.status
    except InfeasibleBudgetError as err:
        sys.stderr.write(_one_line(_infeasible_line(err)) + "\n")
        return EXIT_INFEASIBLE
    except RematError as err:
        sys.stderr.write(f"remat {args.command}: {type(err).__name__}: {_one_line(err)}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("remat: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())

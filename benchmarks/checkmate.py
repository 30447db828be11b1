"""Checkmate's planners against the baselines: cost ratios, MILP solve times, measured peaks.

Run: ``.venv/bin/python benchmarks/checkmate.py [--quick]`` (writes ``benchmarks/checkmate.md``).

1. **Table 2 analogue** (Jain et al., MLSys 2020): on VGG16, ResNet-50, MobileNet and U-Net
   (``remat.models``, scaled to a 2-core CPU), each solver's predicted compute (``flops``
   cost model) divided by the MILP's, at budgets of 90/80/70/60/50% of store_all's peak;
   the geometric mean over the budgets where the solver fits ("–": fits none). Where the MILP
   does not prove optimality within its time limit, ratios are taken to its best bound
   (marked *), which makes them upper bounds of the true ratios.
2. **MILP solve time and gap** on ResNet-18 and VGG11 at those budgets, on the whole op
   graph (no coarsening).
3. **Measured vs predicted** peak and step-time overhead for each planner on one model at
   one budget, each plan run through ``remat.optimize``; times are medians of per-round
   ratios to store_all, measured alternately in one run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import remat
from remat import models as zoo
from remat.api import capture_and_plan
from remat.errors import SolverError
from remat.solvers import solve

from common import (  # this folder is on the path
    alternating_rounds, cpu_name, md_header, measured_peak, process_setup, quiet, timed_step)

FRACTIONS = (0.9, 0.8, 0.7, 0.6, 0.5)
BASELINES = ("checkpoint_all", "chen_sqrt", "chen_sqrt_ap", "chen_greedy", "chen_greedy_ap", "revolve", "checkmate_lp")
TABLE2_MODELS = (("vgg16", "small"), ("resnet50", "small"), ("mobilenet", "small"), ("unet", "small"))
TIMING_MODELS = (("resnet18", "small"), ("vgg11", "small"))
MEASURE_MODEL = ("vgg11", "small")
MEASURE_FRACTION = 0.8


def graph_of(name: str, size: str):
    ex = zoo.build(name, size=size)
    plan, _ = capture_and_plan(ex.model, *ex.args, **ex.kwargs, budget=None, solver="store_all")
    return plan.graph, plan


def milp(graph, budget, time_limit, coarsen="auto"):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        plan = solve("checkmate", graph, budget, time_limit=time_limit, coarsen=coarsen)
        wall = time.perf_counter() - t0
    return plan, wall


def table2(models, time_limit) -> list[str]:
    rows = md_header(["model", "nodes", "MILP graph", *BASELINES])
    for name, size in models:
        graph, store = graph_of(name, size)
        ratios: dict[str, list[float]] = {b: [] for b in BASELINES}
        coarse = "ops"
        bounded = False
        for frac in FRACTIONS:
            budget = int(store.peak_bytes * frac)
            best, _ = milp(graph, budget, time_limit)
            if best.peak_bytes > budget:
                print(f"  {name} {frac:.0%}: no MILP plan fits", file=sys.stderr)
                continue
            coarse = best.info.get("coarsened", "ops").split(" from")[0]
            denom = best.compute_seconds
            if best.info.get("status") != "optimal" and best.info.get("bound_seconds") and "coarsened" not in best.info:
                denom, bounded = best.info["bound_seconds"], True
            for b in BASELINES:
                try:
                    p = solve(b, graph, budget, time_limit=time_limit)
                except SolverError:
                    continue
                if p.peak_bytes <= budget:
                    ratios[b].append(p.compute_seconds / denom)
            print(f"  {name} {frac:.0%}: milp {best.overhead * 100:+.1f}% ({best.info.get('status')})", file=sys.stderr)
        cells = []
        for b in BASELINES:
            r = ratios[b]
            cells.append(f"{math.exp(sum(map(math.log, r)) / len(r)):.2f} ({len(r)})" if r else "–")
        rows.append(f"| {name} ({size}){' *' if bounded else ''} | {len(graph.nodes)} | {coarse} | " + " | ".join(cells) + " |")
    return rows


def solve_times(models, time_limit) -> list[str]:
    rows = md_header(["model", "nodes", "budget", "status", "MIP gap", "overhead", "solve s", "variables", "binaries",
                      "constraints"])
    for name, size in models:
        graph, store = graph_of(name, size)
        for frac in FRACTIONS:
            budget = int(store.peak_bytes * frac)
            plan, wall = milp(graph, budget, time_limit, coarsen=None)  # the whole op graph
            f = plan.info.get("formulation", {})
            status = plan.info.get("status", "")
            status = "infeasible" if status.startswith("infeasible") else status
            gap = plan.info.get("gap")
            rows.append(
                f"| {name} | {len(graph.nodes)} | {frac:.0%} | {status} | {'' if gap is None else f'{gap * 100:.2f}%'} | "
                f"{plan.overhead * 100:+.1f}% | {wall:.1f} | {f.get('variables', '')} | {f.get('binaries', '')} | {f.get('constraints', '')} |"
            )
            print(f"  {name} {frac:.0%}: {status} in {wall:.1f}s", file=sys.stderr)
    return rows


def measured(model, frac, time_limit, rounds) -> list[str]:
    name, size = model
    solvers = ["store_all", "checkmate", "checkmate_lp", "chen_greedy", "chen_sqrt", "revolve", "checkpoint_all"]
    graph, store = graph_of(name, size)
    budget = int(store.peak_bytes * frac)
    runs = {}
    for s in solvers:
        ex = zoo.build(name, size=size)
        try:
            with quiet():
                module = remat.optimize(ex.model, *ex.args, **ex.kwargs, solver=s, budget=None if s == "store_all" else budget, time_limit=time_limit)
        except (SolverError, remat.InfeasibleBudgetError) as err:
            print(f"  {s}: {type(err).__name__}", file=sys.stderr)
            continue

        def step(ex=ex, module=module):
            ex.model.zero_grad(set_to_none=True)
            ex.loss(module(*ex.args, **ex.kwargs)).backward()

        step()
        runs[s] = (module.plan, measured_peak(None, step), step)  # the step clears the grads itself
    # each round, every solver's step in turn (grads cleared inside the timed step)
    samples = alternating_rounds([], [lambda step=step: timed_step(None, step) for _, _, step in runs.values()],
                                 rounds, warmup=0)
    times = {s: [t for (t,) in per] for s, per in zip(runs, samples)}
    base = statistics.median(times["store_all"])
    rows = [
        f"{name} ({size}), budget {frac:.0%} of store_all = {budget / 2**20:.2f} MiB; {rounds} rounds",
        "",
        *md_header(["solver", "predicted peak MiB", "measured peak MiB", "measured/predicted", "predicted overhead",
                    "measured time / store_all"]),
    ]
    for s, (plan, peak, _) in runs.items():
        rows.append(
            f"| {s} | {plan.peak_bytes / 2**20:.2f} | {peak / 2**20:.2f} | {peak / plan.peak_bytes:.3f} | "
            f"{plan.overhead * 100:+.1f}% | {statistics.median(times[s]) / base:.2f} |"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny models, short limits (a smoke test)")
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--only", choices=["table2", "times", "measured"], default=None)
    args = ap.parse_args()
    size = "tiny" if args.quick else None
    t2 = [(n, size or s) for n, s in TABLE2_MODELS]
    tm = [(n, size or s) for n, s in TIMING_MODELS]
    mm = (MEASURE_MODEL[0], size or MEASURE_MODEL[1])
    limit = 10.0 if args.quick else args.time_limit
    process_setup(seed=0)
    out = [
        "# Checkmate planners vs baselines",
        "",
        f"`benchmarks/checkmate.py` on {cpu_name()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, HiGHS MILP time limit {limit:.0f} s, cost model `flops`.",
        "",
    ]
    if args.only in (None, "table2"):
        out += ["## Cost ÷ MILP optimum (geometric mean over feasible budgets 90–50%; count in parentheses)", ""]
        out += table2(t2, limit) + [""]
    if args.only in (None, "times"):
        out += ["## MILP solve time and gap", ""] + solve_times(tm, limit) + [""]
    if args.only in (None, "measured"):
        out += ["## Measured against predicted", ""] + measured(mm, MEASURE_FRACTION, limit, 3 if args.quick else 7) + [""]
    text = "\n".join(out)
    print(text)
    if not args.quick and args.only is None:
        Path(__file__).with_suffix(".md").write_text(text + "\n")


if __name__ == "__main__":
    main()

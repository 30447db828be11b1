"""Exact planners at scale: CP-SAT (Moccasin's intervals) against HiGHS (Checkmate's MILP).

Run: ``.venv/bin/python benchmarks/solvers.py [--time-limit 60] [--quick]`` (writes
``benchmarks/solvers.md``).

On the op graphs of ResNet-18, the U-Net, the DenseNet and the T5 encoder-decoder of the zoo
(``small``) and on the coarse graph of the 8-layer GPT-2 the MILP is given by ``coarsen="auto"``,
at fractions of store_all's peak, each exact solver gets the same time limit: the time it took to
prove its optimum ("> limit" when it did not), its relative gap when it stopped, and its plan's
predicted overhead (compute time over store_all's, ``flops`` cost model); beside them the
overhead of the hierarchical planner's and the hybrid's plans of the same graph and budget.
Both exact solvers plan the same space (frontier-advancing plans; CP-SAT with at most two
recomputations per node unless it has to grow it) and their plans are checked by the simulator.
HiGHS runs with its default threads, CP-SAT with eight workers, on the same cores.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from common import GPT2_8LAYER, git_revision, gpt2, log, machine_facts, md_header, process_setup, HERE

CASES = (  # (label, builder, fractions)
    ("resnet18", ("resnet18", "small"), (0.9, 0.8, 0.7)),
    ("unet", ("unet", "small"), (0.9, 0.7, 0.5)),
    ("densenet", ("densenet", "small"), (0.9, 0.7)),
    ("t5", ("t5", "small"), (0.9, 0.7)),
    ("gpt2 8-layer (coarse)", "gpt2_8", (0.9, 0.7)),
)


def graph_of(spec):
    from remat import models as zoo
    from remat.api import capture_and_plan
    from remat.solvers.coarsen import coarsen_graph, resolve_level

    if spec == "gpt2_8":
        model, args, kwargs = gpt2(GPT2_8LAYER)
    else:
        ex = zoo.build(spec[0], size=spec[1])
        model, args, kwargs = ex.model, ex.args, ex.kwargs
    store, _ = capture_and_plan(model, *args, **kwargs, budget=None, solver="store_all")
    graph = store.graph
    level = resolve_level(graph, "auto")
    if level is not None:
        graph = coarsen_graph(graph, level).graph
    from remat.solvers import solve

    return graph, solve("store_all", graph, None)


def timed(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        try:
            plan = fn()
        except Exception as e:  # noqa: BLE001  (a failure is a result here)
            return None, time.perf_counter() - t0, f"{type(e).__name__}: {e}"[:80]
        return plan, time.perf_counter() - t0, None


def exact_row(plan, wall, err, budget, limit) -> list[str]:
    if plan is None:
        return ["–", "–", err or "–"]
    status = str(plan.info.get("status", ""))
    fits = plan.peak_bytes <= budget
    if status.startswith("infeasible") or not fits:
        return [f"{wall:.1f} (infeasible)" if status.startswith("infeasible") and wall < limit else f"> {limit:.0f}", "–",
                "no plan fits"]
    proven = status == "optimal"
    gap = plan.info.get("gap")
    return [f"{wall:.1f}" if proven else f"> {limit:.0f}", "0" if proven else (f"{100 * gap:.1f}%" if gap is not None else "?"),
            f"{100 * plan.overhead:+.2f}%"]


def heuristic(plan, budget) -> str:
    if plan is None or plan.peak_bytes > budget:
        return "–"
    return f"{100 * (plan.step_seconds / plan.graph.store_all_seconds - 1):+.2f}%"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true", help="one case, one budget, 10 s (a smoke test)")
    a = ap.parse_args()
    process_setup()
    from remat.solvers import solve
    from remat.solvers.checkmate import solve_milp
    from remat.solvers.cpsat import solve_cpsat

    limit = 10.0 if a.quick else a.time_limit
    cases = CASES[:1] if a.quick else CASES
    rows = md_header(["graph", "nodes", "budget", "HiGHS proved (s)", "HiGHS gap", "HiGHS overhead",
                      "CP-SAT proved (s)", "CP-SAT gap", "CP-SAT overhead", "hierarchical", "hybrid"])
    for label, spec, fractions in cases:
        graph, store = graph_of(spec)
        log(f"{label}: {len(graph.nodes)} nodes")
        for frac in fractions[:1] if a.quick else fractions:
            budget = int(store.peak_bytes * frac)
            milp = exact_row(*timed(lambda: solve_milp(graph, budget, time_limit=limit)), budget, limit)
            cpsat = exact_row(*timed(lambda: solve_cpsat(graph, budget, time_limit=limit)), budget, limit)
            hier, _, _ = timed(lambda: solve("hierarchical", graph, budget, time_limit=limit))
            hyb, _, _ = timed(lambda: solve("hybrid", graph, budget, time_limit=limit))
            rows.append(f"| {label} | {len(graph.nodes)} | {frac:.0%} | " + " | ".join(milp + cpsat)
                        + f" | {heuristic(hier, budget)} | {heuristic(hyb, budget)} |")
            log(rows[-1])
    out = [
        "# Exact planners: CP-SAT against HiGHS",
        "",
        f"`benchmarks/solvers.py {' '.join(sys.argv[1:])}` at {git_revision()}; {machine_facts()}.",
        f"Each exact solver: time limit {limit:.0f} s, warm-started from the cheapest baseline plan that fits "
        "(HiGHS also from LP rounding). Overheads are predicted compute over store_all's (`flops` cost model); "
        "hierarchical's and the hybrid's are step time (the hybrid's includes copy stalls). "
        "\"> limit\": not proven within the limit; gap = (plan − bound) / plan when it stopped.",
        "",
        *rows,
        "",
    ]
    (HERE / "solvers.md").write_text("\n".join(out))
    print("\n".join(out))


if __name__ == "__main__":
    main()

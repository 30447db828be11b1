"""The smallest peak of the exact solvers, with and without the proof by the lower bound.

Run: ``.venv/bin/python benchmarks/smallest_peak.py [--models a,b,...] [--time-limit S]`` (writes
``benchmarks/smallest_peak.md``).

For each zoo model (``tiny``), its op graph (``flops`` costs): the lower bound of every plan in the
graph's order (:func:`remat.simulate.fixed_order_lower_bound`), the smallest peak among the quick
planners' plans, and the MILP's smallest peak (``solve_milp(graph, None)``, as ``budget="min"`` and an
infeasible budget's error ask for it) twice in one process, one right after the other: as it is now
(a quick plan at the bound is returned as proven, :func:`remat.solvers.checkmate.proven_smallest`) and
with that proof switched off (the MILP searches, warm-started from the same plans, within the time limit).
"""

from __future__ import annotations

import argparse
import time
import warnings

from common import md_header, use_checkout_src, write_report

use_checkout_src()

MODELS = ("mlp", "two_outputs", "dropout_mlp", "tied", "cnn_bn", "vgg11", "resnet", "inplace_views", "unet", "gpt2")


def row(name: str, time_limit: float) -> str:
    from remat import models as zoo
    from remat.api import capture_and_plan
    from remat.simulate import fixed_order_lower_bound
    from remat.solvers import checkmate

    ex = zoo.build(name, size="tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        store, _ = capture_and_plan(ex.model, *ex.args, **ex.kwargs, budget=None, solver="store_all")
        graph = store.graph
        bound = fixed_order_lower_bound(graph)
        quick = checkmate.smallest_first_plans(graph)[0]
        results = {}
        for variant in ("searched", "now"):
            graph.memo.clear()  # nothing carried from the other variant
            real = checkmate.proven_smallest
            if variant == "searched":
                checkmate.proven_smallest = lambda *a: None
            try:
                began = time.perf_counter()
                plan = checkmate.solve_milp(graph, None, time_limit=time_limit, gap=1e-4)
                results[variant] = (plan, time.perf_counter() - began)
            finally:
                checkmate.proven_smallest = real
    (before, before_s), (now, now_s) = results["searched"], results["now"]

    def status(p):
        return "proven by the bound" if "proof" in p.info else p.info.get("status")

    return (f"| {name} | {len(graph.nodes)} | {bound:,} | {quick.peak_bytes:,} ({quick.solver}) | {before.peak_bytes:,} | "
            f"{status(before)} | {before_s:.1f} | {now.peak_bytes:,} | {status(now)} | {now_s:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--time-limit", type=float, default=10.0, help="the MILP's seconds (SMALLEST_PEAK_SECONDS)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = md_header(["model", "nodes", "lower bound (B)", "quick plans' smallest (B)", "searched: peak (B)",
                      "searched: status", "searched: s", "now: peak (B)", "now: status", "now: s"])
    rows += [row(name, args.time_limit) for name in args.models.split(",")]
    intro = (f"The MILP's smallest peak, time limit {args.time_limit:.0f} s, gap 1e-4; *searched*: the proof by the "
             "lower bound switched off; *now*: as `budget=\"min\"` runs it. Peaks in bytes, as the simulator counts them.")
    write_report("smallest_peak", "The smallest peak, proven by the lower bound", started, intro, rows, not args.no_save)


if __name__ == "__main__":
    main()

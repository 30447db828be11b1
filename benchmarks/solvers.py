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

Then ``auto``'s exact step on graphs of at most 100 ops, before this change and now, the
planning time of ``remat sweep``'s defaults on the tiny U-Net, and planning a 64-layer Llama-style model.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings

from common import GPT2_8LAYER, git_revision, gpt2, log, machine_facts, md_header, process_setup, HERE

AUTO_LIMIT = 30.0
DEFAULT_SWEEP = ("hierarchical", "rotor", "chen_sqrt")
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
    store, _ = capture_and_plan(model, *args, **kwargs, budget=None, solver="store_all", cost_model="flops")
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
    within = proven and (gap or 0) > 0  # cpsat: proven within NEGLIGIBLE_OVERHEAD of the step, not exactly
    if within:
        return [f"≈ {wall:.1f}", f"{100 * gap:.1f}% (≤ {100 * plan.info.get('gap_of_step', 0):.3f}% of step)",
                f"{100 * plan.overhead:+.2f}%"]
    return [f"{wall:.1f}" if proven else f"> {limit:.0f}", "0" if proven else (f"{100 * gap:.1f}%" if gap is not None else "?"),
            f"{100 * plan.overhead:+.2f}%"]


def heuristic(plan, budget) -> str:
    if plan is None or plan.peak_bytes > budget:
        return "–"
    return f"{100 * (plan.step_seconds / plan.graph.store_all_seconds - 1):+.2f}%"


AUTO_CASES = (("cnn_bn", "small"), ("mlp", "small"), ("vgg11", "small"))
AUTO_FRACTIONS = (0.7, 0.5)


def auto_rows(limit: float) -> list[str]:
    """``auto``'s exact step on graphs of at most 100 ops, before (the MILP with the whole time, then
    the hierarchical planner when it is not proven) and now (CP-SAT with half the time, then the
    MILP warm-started from its plan unless CP-SAT proved it, then hierarchical when neither did)."""
    from remat.graph import forget_memos
    from remat.solvers import solve
    from remat.solvers.planner import _exact

    rows = md_header(["graph", "nodes", "budget", "before: s", "before: overhead", "now: s", "now: overhead",
                      "now: solvers run"])
    for spec in AUTO_CASES:
        graph, store = graph_of(spec)
        for frac in AUTO_FRACTIONS:
            budget = int(store.peak_bytes * frac)
            forget_memos()

            def before():
                plans = [solve("checkmate", graph, budget, time_limit=limit)]
                if plans[0].info.get("status") != "optimal" or plans[0].peak_bytes > budget:
                    plans.append(solve("hierarchical", graph, budget, time_limit=limit))
                return plans

            def now():
                names, plans = _exact(graph, budget, limit, {})
                if not any(p is not None and p.peak_bytes <= budget and p.info.get("status") == "optimal" for p in plans):
                    names.append("hierarchical")
                    plans.append(solve("hierarchical", graph, budget, time_limit=limit))
                return names, plans

            old, t_old, _ = timed(before)
            forget_memos()
            (names, new), t_new, _ = timed(now)
            cell = []
            for plans in (old, new):
                fitting = [p for p in plans if p is not None and p.peak_bytes <= budget]
                cell.append(f"{100 * min(p.overhead for p in fitting):+.2f}%" if fitting else "no plan fits")
            rows.append(f"| {spec[0]} | {len(graph.nodes)} | {frac:.0%} | {t_old:.1f} | {cell[0]} | {t_new:.1f} | "
                        f"{cell[1]} | {', '.join(names)} |")
            log(rows[-1])
    return rows


def sweep_row() -> list[str]:
    """``remat sweep``'s default solvers and budgets on the zoo's tiny U-Net, no time limit given."""
    from remat.tools.pareto import pareto_of_graph

    graph, _ = graph_of(("unet", "tiny"))
    _, took, err = timed(lambda: pareto_of_graph(graph, cache=False))
    return [f"`remat sweep`'s default solvers ({', '.join(DEFAULT_SWEEP)}) and ten budgets on the tiny U-Net's "
            f"{len(graph.nodes)}-op graph, no time limit given: **{took:.1f} s** of planning{' (' + err + ')' if err else ''}."]


def deep_rows(layers: int = 64) -> list[str]:
    """Planning a deep model of identical layers: the zoo's Llama-style model with ``layers`` layers
    (batch 2 x 64 tokens, ``flops`` costs): capture, ``auto`` at 50%, then ``hierarchical`` at eight more
    budgets (its block menus and DP tables reused), ``keep_set`` alone at 50%, and ``auto`` at 50% again with
    the offload tier's costs (as a capture with a budget records them: ``hybrid`` runs too), with its default
    time limits and under ``time_limit=10``."""
    import remat
    from remat.api import capture_and_plan
    from remat.graph import forget_memos
    from remat.models import hf, registry
    from remat.solvers import solve
    from remat.solvers.planner import make_plan, resolve

    model, args, kwargs = registry._BUILDERS["llama"](**dict(hf._LLAMA, layers=layers, batch=2, seq=64))
    model.train()
    (_, captured), took_capture, _ = timed(lambda: capture_and_plan(
        model, *args, budget=None, cache=False, split="off", cost_model="flops", **kwargs))
    graph = captured.graph
    forget_memos()
    auto, took_auto, _ = timed(lambda: make_plan(graph, 0.5, "auto"))
    forget_memos()
    _, took_first, _ = timed(lambda: make_plan(graph, 0.6, "hierarchical"))
    more = (0.9, 0.8, 0.7, 0.5, 0.4, 0.35, 0.3, 0.25)

    def sweep():
        for f in more:
            try:
                make_plan(graph, f, "hierarchical")
            except remat.InfeasibleBudgetError:
                pass
    _, took_more, _ = timed(sweep)
    forget_memos()
    _, took_keep, _ = timed(lambda: solve("keep_set", graph, resolve(graph, 0.5)))
    # a capture with a budget records the offload tier's costs: auto then runs the hybrid too
    from remat.execute.transfer import make_transfer_meta

    offloadable = dataclasses.replace(graph, meta={**graph.meta, "transfer": dict(make_transfer_meta("cpu"))})
    forget_memos()
    hybrid, took_hybrid, _ = timed(lambda: make_plan(offloadable, 0.5, "auto"))
    forget_memos()
    bounded, took_bounded, _ = timed(lambda: make_plan(offloadable, 0.5, "auto", time_limit=10))
    return [f"The zoo's Llama-style model with {layers} identical layers ({len(graph.nodes)} ops; batch 2 x 64 "
            f"tokens, `flops` costs): capture {took_capture:.1f} s; `auto` at 50% **{took_auto:.1f} s** "
            f"({auto.info.get('chosen by')}, {auto.overhead:+.2%}); `hierarchical` at 60% {took_first:.1f} s "
            f"(block menus and DP tables), then at {len(more)} more budgets {took_more:.1f} s; `keep_set` alone at "
            f"50% {took_keep:.1f} s. With the offload tier's costs (the CPU's file store), as a capture with a "
            f"budget records them, `auto` at 50% also runs `hybrid`: {took_hybrid:.1f} s "
            f"({hybrid.info.get('chosen by')}, step {hybrid.step_overhead:+.2%}); the same under `time_limit=10`, "
            f"which bounds the whole call: **{took_bounded:.1f} s** (step {bounded.step_overhead:+.2%})."]


INFEASIBLE_CASES = ((("cnn_bn", "small"), 0.578), (("vgg11", "small"), 0.75), (("mlp", "small"), 0.30))
INFEASIBLE_TITLE = "## An infeasible budget above the lower bound"


def infeasible_section() -> list[str]:
    return [INFEASIBLE_TITLE, "",
            f"`benchmarks/solvers.py --only-infeasible` at {git_revision()}; {machine_facts()}. `auto`'s default time "
            "limit; budgets as fractions of store_all's peak, each above the bound over every order "
            "(`peak_lower_bound`) and below the smallest peak. Three settings, side by side in one process, the "
            "chain planners' block cache cleared before each. (a) Only that bound refuses at once, and the "
            "smallest-peak MILP that names the minimum gets 10 s. (b) The bound that counts what every order of "
            "the backward holds (`dependency_lower_bound`) refuses too, without the weight-gradient ops an order "
            "may defer; the MILP and CP-SAT skip their models below the bound of their own plans "
            "(`fixed_order_lower_bound`), and the smallest-peak MILP gets at most `INFEASIBLE_PEAK_SECONDS`. "
            "(c) Now: (b), and the dependency bound counts, for each gradient op an order may run before or after "
            "a node, the smaller of its gradient and the gradients it reads.", "",
            *infeasible_rows(), ""]


def infeasible_rows() -> list[str]:
    """Budgets between the bound over every order and the smallest peak, ``budget="min"`` and the sweep
    of the tiny U-Net, in the three settings of :func:`infeasible_section`."""
    import contextlib

    import remat
    from remat.graph import forget_memos
    from remat.simulate import dependency_lower_bound, peak_lower_bound
    from remat.solvers import checkmate, cpsat, planner, rotor
    from remat.solvers.planner import make_plan, smallest_plan
    from remat.tools.pareto import pareto_of_graph

    simulate_module = sys.modules["remat.simulate"]

    @contextlib.contextmanager
    def without_deferred_gradients():
        real = simulate_module._deferred_gradients
        simulate_module._deferred_gradients = lambda *args: real(*args) * 0
        try:
            yield
        finally:
            simulate_module._deferred_gradients = real

    @contextlib.contextmanager
    def only_the_bound_over_every_order():
        saved = (planner.dependency_lower_bound, checkmate.fixed_order_lower_bound, cpsat.fixed_order_lower_bound,
                 checkmate.INFEASIBLE_PEAK_SECONDS)
        planner.dependency_lower_bound = checkmate.fixed_order_lower_bound = cpsat.fixed_order_lower_bound = (
            peak_lower_bound)
        checkmate.INFEASIBLE_PEAK_SECONDS = checkmate.SMALLEST_PEAK_SECONDS
        try:
            yield
        finally:
            (planner.dependency_lower_bound, checkmate.fixed_order_lower_bound, cpsat.fixed_order_lower_bound,
             checkmate.INFEASIBLE_PEAK_SECONDS) = saved

    def forget():
        forget_memos()
        rotor._CLASS_MEMO.clear()  # block measurements shared across graphs

    graphs = {spec: graph_of(spec) for spec, _ in INFEASIBLE_CASES}
    unet, _ = graph_of(("unet", "tiny"))
    rows = md_header(["case", "bound over every order", "dependency bound (b)", "dependency bound (c)", "(a) s",
                      "(a) answer", "(b) s", "(b) answer", "(c) s", "(c) answer"])
    cells: dict[str, list[str]] = {}
    bounds_of: dict[str, list[str]] = {}  # per graph: its three bounds, as fractions of store-all's peak
    for spec, _ in INFEASIBLE_CASES:
        graph, store = graphs[spec]
        forget()
        with without_deferred_gradients():
            before = dependency_lower_bound(graph)
        forget()
        bounds_of[spec[0]] = [f"{f / store.peak_bytes:.4f}" for f in (peak_lower_bound(graph), before,
                                                                  dependency_lower_bound(graph))]
    for setting in (only_the_bound_over_every_order, without_deferred_gradients, contextlib.nullcontext):
        with setting():
            for spec, frac in INFEASIBLE_CASES:
                graph, store = graphs[spec]
                forget()
                start = time.perf_counter()
                try:
                    make_plan(graph, int(frac * store.peak_bytes))
                    answer = "planned"
                except remat.InfeasibleBudgetError as err:
                    answer = f"infeasible, minimum {err.min_budget_bytes / store.peak_bytes:.4f}"
                took = time.perf_counter() - start
                bounds = bounds_of[spec[0]]
                cells.setdefault(f"`{spec[0]}` at {frac:.1%}", list(bounds)).extend([f"{took:.2f}", answer])
                if spec[0] == "cnn_bn":
                    forget()
                    smallest, took, err = timed(lambda: smallest_plan(graph))
                    found = err or f"{smallest.peak_bytes / store.peak_bytes:.4f} ({smallest.solver})"
                    cells.setdefault(f"`{spec[0]}`, `budget=\"min\"`", list(bounds)).extend([f"{took:.2f}", found])
            forget()
            _, took, _ = timed(lambda: pareto_of_graph(unet, cache=False))
            cells.setdefault("`remat sweep` of the tiny U-Net", ["–", "–", "–"]).extend([f"{took:.1f}", "–"])
    rows += [f"| {case} | " + " | ".join(c) + " |" for case, c in cells.items()]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true", help="one case, one budget, 10 s (a smoke test)")
    ap.add_argument("--only-auto-and-sweep", action="store_true",
                    help="re-measure the last two sections only; the exact solvers' table is kept from its run")
    ap.add_argument("--only-deep", action="store_true", help="re-measure the deep model's section only")
    ap.add_argument("--only-exact", action="store_true",
                    help="re-measure the exact solvers' table only; the sections after it are kept")
    ap.add_argument("--only-infeasible", action="store_true",
                    help="re-measure the infeasible-budget section only (appended after the others)")
    a = ap.parse_args()
    if a.only_infeasible:
        process_setup()
        path = HERE / "solvers.md"
        kept = path.read_text().split(INFEASIBLE_TITLE)[0]
        out = [kept.rstrip("\n"), "", *infeasible_section()]
        path.write_text("\n".join(out))
        print("\n".join(out))
        return
    if a.only_deep:
        process_setup()
        path = HERE / "solvers.md"
        kept, _, rest = path.read_text().partition("## A deep model")
        tail = rest.partition(INFEASIBLE_TITLE)
        out = [kept.rstrip("\n"), "", "## A deep model", "",
               f"`benchmarks/solvers.py --only-deep` at {git_revision()}; {machine_facts()}.", "", *deep_rows(), ""]
        if tail[1]:  # the infeasible-budget section after it is kept
            out += [tail[1] + tail[2].rstrip("\n"), ""]
        path.write_text("\n".join(out))
        print("\n".join(out))
        return
    if a.only_auto_and_sweep:
        process_setup()
        path = HERE / "solvers.md"
        kept = path.read_text().split("## auto on graphs of at most 100 ops")[0]
        out = [kept.rstrip("\n"), "", "## auto on graphs of at most 100 ops", "",
               f"`benchmarks/solvers.py --only-auto-and-sweep` at {git_revision()}; {machine_facts()}.",
               f"Time limit {AUTO_LIMIT:.0f} s (auto's). Overhead: the cheapest plan that fits among those run.", "",
               *auto_rows(AUTO_LIMIT), "", "## A sweep of a branchy graph", "", *sweep_row(), "",
               "## A deep model", "", *deep_rows(), "", *infeasible_section()]
        path.write_text("\n".join(out))
        print("\n".join(out))
        return
    process_setup()
    from remat.solvers import solve
    from remat.solvers.checkmate import solve_milp
    from remat.solvers.cpsat import solve_cpsat

    limit = 10.0 if a.quick else a.time_limit
    cases = CASES[:1] if a.quick else CASES
    rows = md_header(["graph", "nodes", "budget", "stage bound", "bound s", "HiGHS proved (s)", "HiGHS gap",
                      "HiGHS overhead", "CP-SAT proved (s)", "CP-SAT gap", "CP-SAT overhead", "keep_set", "hierarchical", "hybrid"])
    from remat.graph import forget_memos
    from remat.solvers.stage_bound import stage_bound

    for label, spec, fractions in cases:
        graph, store = graph_of(spec)
        log(f"{label}: {len(graph.nodes)} nodes")
        for frac in fractions[:1] if a.quick else fractions:
            budget = int(store.peak_bytes * frac)
            forget_memos()  # each solver computes the stage bound itself, within its time limit
            bound, took_bound, _ = timed(lambda: stage_bound(graph, budget, time_limit=60.0))
            forget_memos()
            milp = exact_row(*timed(lambda: solve_milp(graph, budget, time_limit=limit)), budget, limit)
            forget_memos()
            cpsat = exact_row(*timed(lambda: solve_cpsat(graph, budget, time_limit=limit)), budget, limit)
            kept, _, _ = timed(lambda: solve("keep_set", graph, budget, time_limit=limit))
            hier, _, _ = timed(lambda: solve("hierarchical", graph, budget, time_limit=limit))
            hyb, _, _ = timed(lambda: solve("hybrid", graph, budget, time_limit=limit))
            floor = f"{100 * bound.cost / graph.store_all_seconds:+.2f}%" if bound.cost < float("inf") else "no plan fits"
            rows.append(f"| {label} | {len(graph.nodes)} | {frac:.0%} | {floor} | {took_bound:.2f} | "
                        + " | ".join(milp + cpsat) + f" | {heuristic(kept, budget)} | {heuristic(hier, budget)} | {heuristic(hyb, budget)} |")
            log(rows[-1])
    out = [
        "# Exact planners: CP-SAT against HiGHS",
        "",
        f"`benchmarks/solvers.py {' '.join(sys.argv[1:])}` at {git_revision()}; {machine_facts()}.",
        f"Each exact solver: time limit {limit:.0f} s, warm-started from the cheapest plan that fits among the "
        "baselines', keep_set's and the stage bound's own (`guided_plan`; HiGHS also from LP rounding). Overheads are predicted compute over store_all's (`flops` cost model); "
        "keep_set's (its cheapest schedules thinned by `recompute_less`), hierarchical's and the hybrid's are step time "
        "(the hybrid's includes copy stalls). "
        "\"> limit\": not proven within the limit; gap = (plan − bound) / plan when it stopped. \"≈\": CP-SAT stopped "
        "once its plan was proven within 0.1% of store_all's compute of the bound (`NEGLIGIBLE_OVERHEAD`: "
        "no plan can be cheaper by more), its gap and that gap as a share of the step beside it. A time with gap 0: "
        "proven exactly (CP-SAT returns a warm start that meets the stage bound with no search). "
        "Stage bound: the recomputation no plan in the graph's order can do without (`remat.solvers.stage_bound`, "
        "every stage solved, in the time beside it); both exact solvers take it as a bound on their objective, "
        "computed within a tenth of their time limit (at most 5 s).",
        "",
        *rows,
        "",
    ]
    if a.only_exact:
        path = HERE / "solvers.md"
        _, _, rest = path.read_text().partition("## auto on graphs of at most 100 ops")
        path.write_text("\n".join(out) + "\n## auto on graphs of at most 100 ops" + rest)
        print("\n".join(out))
        return
    if not a.quick:
        out += ["## auto on graphs of at most 100 ops", "",
                f"Time limit {AUTO_LIMIT:.0f} s (auto's). Overhead: the cheapest plan that fits among those run.", "",
                *auto_rows(AUTO_LIMIT), "", "## A sweep of a branchy graph", "", *sweep_row(), "",
               "## A deep model", "", *deep_rows(), ""]
    (HERE / "solvers.md").write_text("\n".join(out))
    print("\n".join(out))


if __name__ == "__main__":
    main()

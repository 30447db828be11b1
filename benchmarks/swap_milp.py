"""The ``hybrid`` greedy (recomputation + offloading) against the swap MILP's optimum (``checkmate_swap``).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/swap_milp.py [--limit 60] [--quick]``
(writes ``benchmarks/swap_milp.md`` and the raw results ``swap_milp.json``; about 10 minutes on 2 shared cores;
``--render swap_milp.json`` redraws the tables; ``--quick``: one graph,
two budgets, nothing written).

Graphs the MILP can prove: zoo models of size ``tiny`` with at most ~60 ops, and zoo models
coarsened to module level (:func:`remat.solvers.coarsen.coarsen_graph`; both planners then plan the
*coarse* graph, which is a graph in its own right). All are captured on the CPU with remat's
default cost model, so their transfer costs are the CPU's file store, measured:
**synchronous copies** (``overlap=False``), for which the swap MILP is exact (its objective is
the simulator's step time of its plan). A second table gives the same graphs the same bandwidth
on a channel *beside* compute (``overlap=True``, as CUDA's pinned copies), where the MILP's
stage-barrier model only bounds its own plan's step time from above, so there it is a reference,
not a proof.

Budgets: from the greedy's smallest peak (``hybrid`` at budget 0) to just under store_all, in
quarters. At each: the greedy's plan (``solve("hybrid", ...)``) and the MILP's
(``solve("checkmate_swap", ..., warm_plans=[greedy])``, stopped at ``--limit`` seconds); the
ratio greedy step / MILP step (both the simulator's prediction, compute + stalls), with the
MILP's status and gap. When the MILP is stopped, greedy / bound is an upper bound of the true
ratio. The issue's target: greedy within 1.05x of the optimum.
"""

from __future__ import annotations

import os

import common  # this folder is on the path

common.single_thread_env(omp=True)  # before torch is imported
common.use_checkout_src()

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import remat  # noqa: E402
from remat import models as zoo  # noqa: E402
from remat.solvers.coarsen import coarsen_graph  # noqa: E402
from remat.errors import RematError, SolverTimeLimitWarning  # noqa: E402
from remat.graph import Graph  # noqa: E402
from remat.solvers import solve  # noqa: E402
from common import HERE, git_revision, log, machine_facts, made_by, md_header, publish, quiet, write_json  # noqa: E402

OP_LEVEL = ("dropout_mlp", "cnn_bn", "tied")  # tiny zoo models, 35-43 ops
COARSE = ("gpt2", "vit", "resnet")  # tiny zoo models coarsened to module level: 50, 46, 59 nodes
FRACTIONS = (0.0, 0.25, 0.5, 0.75)  # budget = greedy min + f * (store_all - greedy min); 0.75 stays under store_all
TARGET = 1.05
LIMIT = 30.0  # the MILP's time limit per budget
OTHERS_LIMIT = 5.0  # the greedy's (its recomputation start and its search) and recompute-only checkmate's
OVERLAP_GRAPHS = ("dropout_mlp", "gpt2 (coarse)")


def graphs(quick: bool) -> list[tuple[str, Graph]]:
    out = []
    for name in (OP_LEVEL[:1] if quick else OP_LEVEL):
        ex = zoo.build(name, size="tiny")
        out.append((name, remat.plan(ex.model, *ex.args, solver="store_all", cache=False, **ex.kwargs).graph))
    for name in (() if quick else COARSE):
        ex = zoo.build(name, size="tiny")
        g = remat.plan(ex.model, *ex.args, solver="store_all", cache=False, **ex.kwargs).graph
        coarse = coarsen_graph(g, "module").graph
        out.append((f"{name} (coarse)", coarse))
    return out


def with_overlap(g: Graph) -> Graph:
    meta = {**g.meta, "transfer": {**g.meta["transfer"], "overlap": True}}
    return Graph(g.nodes, g.values, g.forward_outputs, g.backward_outputs, g.name, meta)


def compare(name: str, g: Graph, limit: float, fractions, overlap_table: bool = False) -> list[dict]:
    store = solve("store_all", g, None)
    start = time.perf_counter()
    smallest = solve("hybrid", g, 0, time_limit=OTHERS_LIMIT)
    low = smallest.peak_bytes
    log(f"{name}: {len(g.nodes)} nodes, store_all {store.peak_bytes} B, greedy min {low} B ({time.perf_counter() - start:.1f} s)")
    rows = []
    seen = set()
    for f in fractions:
        budget = int(low + f * (store.peak_bytes - low))
        if budget in seen:  # no room between the greedy's minimum and store_all
            continue
        seen.add(budget)
        t0 = time.perf_counter()
        greedy = solve("hybrid", g, budget, time_limit=OTHERS_LIMIT)
        if greedy.peak_bytes > budget or (smallest.step_seconds < greedy.step_seconds and smallest.peak_bytes <= budget):
            greedy = smallest  # as remat.plan(solver="hybrid") does: its smallest plan when it fits and is better
        t_greedy = time.perf_counter() - t0
        t0 = time.perf_counter()
        with quiet(SolverTimeLimitWarning):
            try:
                milp = solve("checkmate_swap", g, budget, time_limit=limit, warm_plans=[greedy])
                error = None
            except RematError as e:
                milp, error = None, str(e)
        t_milp = time.perf_counter() - t0
        ck_step = None
        if not overlap_table:
            try:
                ck = solve("checkmate", g, budget, time_limit=OTHERS_LIMIT)
                ck_step = ck.step_seconds if ck.peak_bytes <= budget else None
            except RematError:
                pass
        row = dict(graph=name, nodes=len(g.nodes), fraction=f, budget=budget, store=store.step_seconds,
                   greedy_fits=greedy.peak_bytes <= budget, greedy=greedy.step_seconds, greedy_s=t_greedy,
                   greedy_swaps=len(greedy.offloaded_values), greedy_recomputes=greedy.recomputations,
                   milp_s=t_milp, error=error, checkmate=ck_step)
        if milp is not None:
            info = milp.info
            row.update(milp_fits=milp.peak_bytes <= budget, milp=milp.step_seconds, status=info.get("status"),
                       gap=info.get("gap"), bound=info.get("bound_seconds"), objective=info.get("objective_seconds"),
                       milp_swaps=len(milp.offloaded_values), milp_recomputes=milp.recomputations,
                       model=info.get("time model"), repairs=info.get("repairs"),
                       binaries=info.get("formulation", {}).get("binaries"))
        rows.append(row)
        log(f"  {f:.2f} budget {budget}: greedy {greedy.step_seconds:.6g} s (fits {row['greedy_fits']}), "
            f"milp {row.get('milp')} ({row.get('status')}, {t_milp:.1f} s)")
    return rows


def ratio(row) -> float | None:
    if row.get("greedy_fits") and row.get("milp_fits") and row.get("milp"):
        return row["greedy"] / row["milp"]
    return None


def true_gap(row) -> float | None:
    """(objective - bound) / objective in seconds (HiGHS's own gap leaves out the fixed compute)."""
    obj, bound = row.get("objective"), row.get("bound")
    if obj is None or bound is None or obj <= 0:
        return None
    return max(0.0, (obj - bound) / obj)


def verdict_cell(row) -> str:
    """met / not met / open: the MILP's plan is a witness (a greedy more than 1.05x slower than it
    misses the target, proven or not); the greedy meets it against a proven optimum or the bound."""
    r = ratio(row)
    if r is None:
        if row.get("greedy_fits") and not row.get("milp_fits"):
            return "MILP: no plan in its space"
        return "–"
    if r > TARGET + 1e-12:
        return "**not met**"
    if row.get("status") == "optimal":
        return "met"
    bound = row.get("bound")
    if bound and row["greedy"] / bound <= TARGET:
        return "met (vs bound)"
    return "open"


def table(rows: list[dict]) -> list[str]:
    ms = 1e3
    lines = md_header(["graph", "nodes", "budget (fraction)", "greedy step ms (swaps, recomputes)",
                       "MILP step ms (swaps, recomputes)", "recompute-only checkmate ms", "**greedy / MILP**",
                       "MILP status (gap in seconds)", "MILP s", "≤ 1.05×"])
    for r in rows:
        greedy = (f"{r['greedy'] * ms:.4f} ({r['greedy_swaps']}, {r['greedy_recomputes']})" if r["greedy_fits"]
                  else "does not fit")
        if r.get("milp") is None:
            milp = f"error: {r['error']}"
        elif r["milp_fits"]:
            milp = f"{r['milp'] * ms:.4f} ({r['milp_swaps']}, {r['milp_recomputes']})"
        else:
            milp = "infeasible in its model"
        rt = ratio(r)
        gap = true_gap(r)
        status = f"{r.get('status')} ({'–' if gap is None else f'{gap * 100:.2f}%'})"
        if r.get("repairs"):
            status += "; re-solved: " + "; ".join(r["repairs"])
        ck = "–" if r["checkmate"] is None else f"{r['checkmate'] * ms:.4f}"
        lines.append(f"| {r['graph']} | {r['nodes']} | {r['budget']} B ({r['fraction']:.2f}) | {greedy} | {milp} | {ck} | "
                     f"{'–' if rt is None else f'**{rt:.3f}×**'} | {status} | {r['milp_s']:.1f} | {verdict_cell(r)} |")
    return lines


def summary(rows: list[dict]) -> str:
    verdicts = [verdict_cell(r) for r in rows]
    met = sum(v.startswith("met") for v in verdicts)
    missed = [r for r, v in zip(rows, verdicts) if "not met" in v]
    decided = met + len(missed)
    worst = max(missed, key=ratio, default=None)
    only_greedy = [r for r in rows if r.get("greedy_fits") and not r.get("milp_fits")]
    below = [r for r in rows if ratio(r) is not None and ratio(r) < 1 - 1e-9]
    text = (f"the ≤ {TARGET}× target is met at {met} of the {decided} budgets where it is decided "
            f"({verdicts.count('open')} open), **not met** at {len(missed)}"
            + (f"; the worst is {ratio(worst):.3f}× ({worst['graph']}, fraction {worst['fraction']:.2f})" if worst else ""))
    if only_greedy:
        text += f"; at {len(only_greedy)} budget(s) only the greedy has a plan (the MILP's stages cannot express it)"
    if below:
        text += (f"; at {len(below)} budget(s) the greedy is faster than the MILP's plan (the MILP stopped at its time "
                 "limit without the greedy's plan as a start, which its stages cannot express, or its model is not exact)")
    return text + "."


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=LIMIT, help="MILP time limit per budget (s)")
    ap.add_argument("--quick", action="store_true", help="one graph, two budgets; nothing written")
    ap.add_argument("--render", metavar="JSON", help="only render the tables from the results a run saved")
    args = ap.parse_args()
    if args.render:
        run = json.loads(Path(args.render).read_text())
    else:
        run = measure(args)
        if not args.quick:
            write_json(HERE / "swap_milp.json", run)
    publish(render(run), None if args.quick else HERE / "swap_milp.md", echo=args.quick)


def measure(args) -> dict:
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    fractions = FRACTIONS[:2] if args.quick else FRACTIONS
    gs = graphs(args.quick)
    exact_rows, overlap_rows = [], []
    for name, g in gs:
        exact_rows += compare(name, g, args.limit, fractions)
    for name, g in gs:
        if name in OVERLAP_GRAPHS or args.quick:
            overlap_rows += compare(name, with_overlap(g), args.limit, fractions, overlap_table=True)
    return dict(exact=exact_rows, overlap=overlap_rows, limit=args.limit, transfer=gs[0][1].meta["transfer"],
                revision=git_revision(), date=time.strftime('%Y-%m-%d %H:%M'), machine=machine_facts(),
                load_before=load_before, load_after=os.getloadavg()[0], minutes=(time.perf_counter() - started) / 60)


def render(run: dict) -> str:
    exact_rows, overlap_rows, t = run["exact"], run["overlap"], run["transfer"]
    lines = [
        "# The hybrid greedy against the swap MILP's optimum, CPU",
        "",
        made_by("swap_milp.py", run["revision"], run["date"], run["machine"])
        + f". Load average {run['load_before']:.1f} before, {run['load_after']:.1f} after (2 cores, shared); "
        f"total run time {run['minutes']:.1f} min (results saved in `swap_milp.json`; `--render` redraws the tables). Only predictions are compared (the simulator's step time, compute + "
        "stalls, and peak): nothing here is timed except the solvers.",
        "",
        f"*greedy*: `solve('hybrid', graph, budget, time_limit={OTHERS_LIMIT:.0f})` (Libra-style greedy; its "
        "plan at budget 0 instead when that fits and is faster, as `remat.plan(solver='hybrid')` does). *MILP*: `solve('checkmate_swap', graph, budget, "
        f"time_limit={run['limit']:.0f}, warm_plans=[greedy])`: Checkmate's recomputation MILP with offload/reload/host "
        "variables per stage and value (see `src/remat/solvers/checkmate_swap.py`). *recompute-only checkmate*: "
        f"`solve('checkmate', ..., time_limit={OTHERS_LIMIT:.0f})`, for reference (section 1 only). Budgets run from the greedy's smallest peak (fraction 0) towards "
        "store_all (`greedy min + f·(store_all − greedy min)`). Graphs: zoo models of size `tiny` at op level, and "
        "`gpt2`, `vit` and `resnet` tiny coarsened to module level (`coarsen_graph(g, 'module')`; both planners plan the coarse "
        f"graph). Transfer costs: the CPU file store as measured by capture (d2h {t['d2h_bytes_per_s'] / 1e6:.0f} MB/s, "
        f"h2d {t['h2d_bytes_per_s'] / 1e6:.0f} MB/s, latency {t.get('latency_s', 0) * 1e3:.2f} ms).",
        "",
        f"Columns: *greedy / MILP*: the ratio of predicted step times where both fit. *gap in seconds*: (MILP objective "
        f"− MILP bound) / objective. *≤ {TARGET}×*: `met` where the MILP proved its optimum and the ratio is within "
        f"{TARGET}×; `met (vs bound)` where the MILP stopped at its time limit but the greedy is within {TARGET}× of its "
        "bound (of every plan in the MILP's space); `not met` where the greedy is more than "
        f"{TARGET}× slower than the MILP's plan (a plan that exists, proven optimal or not); `open` otherwise; "
        "`MILP: no plan in its space` where only the greedy fits.",
        "",
        "## 1. Synchronous copies (the CPU file store, `overlap=False`): the MILP is exact",
        "",
        "With synchronous copies the model's objective equals the simulator's step time of its plan, so at an "
        "`optimal` status the MILP's step is the best any plan in its space reaches. Its space: Checkmate's "
        "frontier-advancing stages (forward-only recomputation) with copies at stage starts; `hybrid` may reload "
        "in the middle of a stage, so it can occasionally reach a plan the MILP cannot (shown as such).",
        "",
        *table(exact_rows),
        "",
        f"**Verdict (synchronous copies):** {summary(exact_rows)}",
        "",
        "## 2. The same bandwidth beside compute (`overlap=True`, hypothetical): a reference, not a proof",
        "",
        "Here the MILP charges each stage max(compute, copies) (a barrier per stage, as in POET) and makes a reloaded "
        "value usable only from the next stage; the simulator overlaps copies across stages. The MILP's plan is "
        "simulated like any other, and its model objective bounds that simulated step from above, so the greedy "
        "can come out faster than the MILP's plan: a ratio below 1 is the model's restriction, not a greedy win "
        "over an optimum.",
        "",
        *table(overlap_rows),
        "",
        f"**Verdict (overlapped copies):** {summary(overlap_rows)}",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

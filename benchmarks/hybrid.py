"""Recomputation alone against the ``hybrid`` planner (recomputation + offloading) on the CPU.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/hybrid.py [--rounds 7] [--quick]``
(writes ``benchmarks/hybrid.md``; about 10-15 minutes on 2 shared cores; ``--quick`` is a smoke
test on tiny models that writes nothing).

For each model (the zoo's ``gpt2`` and one CNN, size ``small``), in one run:

1. **Smallest feasible budget** (bytes of peak growth of one step, see :mod:`remat.budget`) with
   recomputation only -- ``hierarchical``, and ``checkmate`` (the MILP; coarsened to module level
   on graphs this large and stopped at ``CHECKMATE_LIMIT`` seconds: its status is reported) --
   and with ``hybrid`` (recomputation + offloading), each as
   ``remat.solvers.planner.smallest_plan(graph, solver)`` (the solver's plan at budget 0, its plan of
   smallest peak). The ratio hybrid / hierarchical is held against the issue's target (<= 0.5x),
   beside two lower bounds no schedule can go under: the largest working set of a single op
   (its inputs, outputs and workspace), which neither recomputation nor offloading can split, and
   the parameter gradients, which are all on the device when the step ends. Section 1 also covers
   the 8-layer GPT-2 of ``benchmarks/hierarchical.py`` (the model whose recomputation minimum the
   issue quotes), planned only: a deeper chain, where the single op matters less.
2. **Matched budgets, predicted vs measured.** Budgets: the hybrid's minimum, hierarchical's
   minimum, the fraction 0.6 (``fixed + 0.6 * (store_all_peak - fixed)``, remat's fraction
   meaning) and the midpoint of the last two. Every plan that fits is executed with
   ``remat.optimize`` (solver ``hierarchical`` or ``hybrid``); the offload store on the CPU is
   a file-backed store in a temporary folder with **synchronous** copies, so every offload and
   reload stalls compute (the cost model knows: ``overlap=False``). Where 0.6 is not above
   recomputation's minimum (resnet18), 0.8 takes its place. Per plan: predicted peak and
   measured peak (``remat.measure.peak_memory_growth``, torch's CPU allocator, ``.grad`` None
   first, an untimed run), predicted step overhead (compute + stalls over store_all's compute),
   measured overhead (median over ``--rounds`` rounds of plan step / store_all step, the two run
   alternately in each round), and whether the gradients equal store_all's bitwise (same seed).
3. **Largest batch under one memory cap** (``remat.max_batch_size``, total step memory:
   parameters + buffers + batch + measured peak growth; optimizer state excluded), for plain
   PyTorch, and remat with solvers ``checkpoint_all``, ``hierarchical`` and ``hybrid``.

Greedy vs the swap MILP's optimum (``checkmate_swap``) is measured by ``benchmarks/swap_milp.py``
(``swap_milp.md``): the MILP proves optima only on small graphs, which this script's models are not.
"""

from __future__ import annotations

import os

import common  # this folder is on the path

common.single_thread_env(omp=True)  # before torch is imported
common.use_checkout_src()

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import remat  # noqa: E402
import remat.solvers.planner as planner  # noqa: E402
from remat import models as zoo  # noqa: E402
from remat.budget import fixed_bytes  # noqa: E402
from remat.errors import InfeasibleBudgetError, RematError  # noqa: E402
from common import (  # noqa: E402
    GPT2_8LAYER, HERE, MiB, best_try, bitwise_equal, capture_store_all, git_revision, gpt2, log, machine_facts,
    made_by, make_step, md_header, measured_peak, pct, process_setup, publish, quiet, seeded_grads,
    shared_machine_note, time_against, timed_step, zoo_batch_factories)

mib = partial(common.mib, digits=2)
CNN = "resnet18"
MODELS = ("gpt2", CNN)
DEEP = "gpt2 8-layer"  # GPT2_8LAYER, benchmarks/hierarchical.py's SMALL GPT-2: section 1 only (planned, not run)
START = {"gpt2": 4, CNN: 16, "gpt2-tiny": 1}  # first batch size of the max-batch search
CHECKMATE_LIMIT = 60.0
ROUNDS = 7
CAP = {"gpt2": "48MiB", CNN: "32MiB"}  # per model: each search stays within ~2 minutes
BATCH_SOLVERS = ("checkpoint_all", "hierarchical", "hybrid")
MAX_BATCH = 1024


def op_floor(graph) -> tuple[int, str]:
    """The largest working set of one op: its non-input inputs and outputs plus its workspace.
    Every plan holds at least this much while the op runs (a lower bound; gradients held then
    come on top)."""
    best, name = 0, ""
    for n in graph.nodes:
        vals = set(n.inputs) | set(n.outputs)
        b = sum(graph.values[v].bytes for v in vals if graph.values[v].kind != "input") + n.workspace
        if b > best:
            best, name = b, f"{n.name} ({n.op})"
    return best, name


# ---------------------------------------------------------------------------------------------
# 1. smallest budgets


def minimums(graph) -> dict:
    out = {}
    for solver, limit in (("hierarchical", None), ("checkmate", CHECKMATE_LIMIT), ("hybrid", None)):
        t = time.perf_counter()
        try:
            plan = planner.smallest_plan(graph, solver, time_limit=limit)
        except RematError as err:
            plan, why = None, f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
        else:
            why = ""
        out[solver] = dict(plan=plan, seconds=time.perf_counter() - t, why=why)
        log(f"  min {solver}: {mib(plan.peak_bytes) if plan else why} MiB in {out[solver]['seconds']:.1f} s")
    return out


# ---------------------------------------------------------------------------------------------
# 2. executed plans


def executed(name: str, size: str, mins: dict, store_mod, model, ex, rounds: int) -> dict:
    graph = store_mod.plan.graph
    store, fixed = store_mod.plan.peak_bytes, fixed_bytes(graph)
    hier = mins["hierarchical"]["plan"]
    hyb = mins["hybrid"]["plan"]
    b60 = planner.resolve(graph, 0.6)
    # the upper budget: the fraction 0.6, or 0.8 where 0.6 is not above recomputation's minimum
    top, top_label = (b60, "0.6") if b60 > hier.peak_bytes * 1.05 else (planner.resolve(graph, 0.8), "0.8")
    budgets = {}
    if hyb is not None:
        budgets["hybrid min"] = hyb.peak_bytes
    budgets["hierarchical min"] = hier.peak_bytes
    budgets[f"mid (hierarchical min, {top_label})"] = (hier.peak_bytes + top) // 2
    budgets[top_label] = top
    rows = []
    runners = {}
    for label, b in budgets.items():
        for solver in ("hierarchical", "hybrid"):
            row = dict(label=label, budget=b, solver=solver)
            try:
                with quiet():
                    mod = remat.optimize(model, *ex.args, budget=b, solver=solver, cache=False, **ex.kwargs)
            except InfeasibleBudgetError as err:
                row["why"] = f"infeasible (smallest {mib(err.min_budget_bytes)} MiB)"
                rows.append(row)
                log(f"  {label} {solver}: {row['why']}")
                continue
            p = mod.plan
            row.update(plan=p, predicted_peak=p.peak_bytes, predicted_overhead=p.step_overhead,
                       compute_overhead=p.overhead, offloads=len(p.offloaded_values),
                       offload_peak=p.offload_peak_bytes, recomputations=p.recomputations)
            runners[(label, solver)] = mod
            rows.append(row)
            log(f"  {label} {solver}: predicted {mib(p.peak_bytes)} MiB, {pct(p.step_overhead)}, "
                f"{row['offloads']} offloaded, {row['recomputations']} recomputations")
    # gradients and measured peaks (untimed runs)
    base = make_step(store_mod, ex.args, ex.kwargs, ex.loss)
    steps = {k: make_step(mod, ex.args, ex.kwargs, ex.loss) for k, mod in runners.items()}
    ref = seeded_grads(model, base)
    store_peak = measured_peak(model, base)
    for row in rows:
        step = steps.get((row["label"], row["solver"]))
        if step is None:
            continue
        row["bitwise"] = bitwise_equal(seeded_grads(model, step), ref)
        row["measured_peak"] = measured_peak(model, step)
    # timing: per round, store_all then each plan, alternately (warm-up: the plans, then store_all)
    for step in (*steps.values(), base):
        timed_step(model, step)
    log(f"  timing {len(steps)} plans against store_all, {rounds} rounds")
    base_s, times, ratios = time_against((model, base), {k: (model, s) for k, s in steps.items()}, rounds, warmup=0)
    for row in rows:
        k = (row["label"], row["solver"])
        if k in runners:
            row["measured_overhead"] = ratios[k] - 1
            row["step_ms"] = times[k] * 1e3
    return dict(rows=rows, store=store, fixed=fixed, store_measured=store_peak,
                base_ms=base_s * 1e3 if base_s is not None else None, b60=b60)


# ---------------------------------------------------------------------------------------------
# 3. max batch


def batch_searches(name: str, size: str, cap: str, start: int) -> list[dict]:
    make_model, make_batch = zoo_batch_factories(name, size)
    out = []
    for i, solver in enumerate(BATCH_SOLVERS):
        t = time.perf_counter()
        log(f"  max batch {name} {solver}{' and plain' if i == 0 else ''}")
        with quiet():
            result = remat.max_batch_size(
                make_model, make_batch, cap, solver=solver, start=start, max_batch=MAX_BATCH,
                compare_plain=(i == 0), cache=False,
                on_try=lambda r: log(f"    {r.method} {r.batch}: {'fits' if r.fits else 'no'} {r.reason}"))
        out.append(dict(solver=solver, result=result, seconds=time.perf_counter() - t))
    return out


# ---------------------------------------------------------------------------------------------
# the run


def captured(label: str, model, args: tuple, kwargs: dict):
    """``(store_all module, capture seconds)``: ``model`` captured with the store-everything plan."""
    log(f"{label}: capture, store_all")
    store_mod, capture_s = capture_store_all(model, args, kwargs, cache=False)
    graph = store_mod.plan.graph
    log(f"  {len(graph.nodes)} nodes, store_all {mib(store_mod.plan.peak_bytes)} MiB, capture {capture_s:.1f} s")
    return store_mod, capture_s


def model_run(name: str, size: str, rounds: int, cap: str, start: int) -> dict:
    process_setup(seed=0)
    ex = zoo.build(name, size=size)
    model = ex.model.train()
    store_mod, capture_s = captured(f"{name} ({size})", model, ex.args, ex.kwargs)
    graph = store_mod.plan.graph
    mins = minimums(graph)
    ex_run = executed(name, size, mins, store_mod, model, ex, rounds)
    batches = batch_searches(name, size, cap, start)
    return dict(name=name, cap=cap, graph=graph, capture_s=capture_s, mins=mins, floor=op_floor(graph),
                transfer=graph.meta.get("transfer"), **ex_run, batches=batches)


def deep_run() -> dict:
    """Section 1 (smallest budgets) on the 8-layer GPT-2 of ``benchmarks/hierarchical.py``."""
    model, args, kwargs = gpt2(GPT2_8LAYER)
    store_mod, capture_s = captured(DEEP, model, args, kwargs)
    graph = store_mod.plan.graph
    return dict(name=DEEP, graph=graph, capture_s=capture_s, mins=minimums(graph), floor=op_floor(graph),
                store=store_mod.plan.peak_bytes, fixed=fixed_bytes(graph))


def section1_md(runs: list[dict]) -> list[str]:
    lines = [
        "## 1. Smallest feasible budget",
        "",
        "`remat.solvers.planner.smallest_plan(graph, solver)` on the captured graph (the solver's plan at budget 0). "
        f"`checkmate` is coarsened automatically on graphs this large and stopped at {CHECKMATE_LIMIT:.0f} s. "
        "Bytes are the predicted peak growth of one step (what the budget bounds); `fixed` = the gradients and "
        "outputs every plan holds (the parameter gradients, all on the device when the step ends); *op floor* = "
        "the largest working set of one op (its non-input inputs, outputs and workspace), which no schedule can "
        "split. Both are lower bounds for every plan, recomputing or offloading; *bound* = the larger over "
        f"hierarchical's minimum. `{DEEP}` is the GPT-2 of `benchmarks/hierarchical.py` (8 layers, d_model 256, "
        "sequence 256, batch 4, vocab 2000), planned only.",
        "",
        *md_header(["model", "nodes", "store_all MiB", "fixed MiB", "op floor MiB (op)",
                    "hierarchical min MiB (overhead)", "checkmate min MiB (status)",
                    "hybrid min MiB (step overhead, offloaded)", "hybrid / hierarchical", "target ≤ 0.5×",
                    "bound / hierarchical"]),
    ]
    for r in runs:
        m = r["mins"]
        h, c, y = (m[s]["plan"] for s in ("hierarchical", "checkmate", "hybrid"))
        ratio = y.peak_bytes / h.peak_bytes if (h and y) else None
        cell_c = (f"{mib(c.peak_bytes)} ({c.info.get('status', 'optimal')}; {c.info.get('coarsened', 'op level')}; "
                  f"{m['checkmate']['seconds']:.0f} s)" if c else f"– ({m['checkmate']['why']})")
        lines.append(
            f"| {r['name']} | {len(r['graph'].nodes)} | {mib(r['store'])} | {mib(r['fixed'])} | "
            f"{mib(r['floor'][0])} ({r['floor'][1]}) | {mib(h.peak_bytes)} ({pct(h.overhead)}) | {cell_c} | "
            + (f"{mib(y.peak_bytes)} ({pct(y.step_overhead)}, {len(y.offloaded_values)} values) | " if y else "– | ")
            + (f"**{ratio:.3f}×** | {'met' if ratio <= 0.5 else 'not met'} | "
               f"{max(r['floor'][0], r['fixed']) / h.peak_bytes:.3f}× ({'fixed' if r['fixed'] > r['floor'][0] else 'op floor'}) |"
               if ratio else "– | – | – |"))
    lines += [""]
    for r in runs:
        m = r["mins"]
        lines.append(f"- {r['name']}: planning time for the minimum: " + ", ".join(
            f"{s} {m[s]['seconds']:.1f} s" for s in ("hierarchical", "checkmate", "hybrid"))
            + f"; capture {r['capture_s']:.1f} s. As fractions (`fixed + f·(store_all − fixed)`): " + ", ".join(
                f"{s} {(m[s]['plan'].peak_bytes - r['fixed']) / (r['store'] - r['fixed']):.3f}"
                for s in ("hierarchical", "checkmate", "hybrid") if m[s]["plan"])
            + (f". The hybrid's smallest plan came from the greedy started from: {m['hybrid']['plan'].info.get('start', '?')}"
               if m["hybrid"]["plan"] else ""))
    return lines + [""]


def section2_md(runs: list[dict], rounds: int) -> list[str]:
    lines = [
        "## 2. Matched budgets: predicted and measured",
        "",
        "Every plan that fits its budget runs through `remat.optimize`. *Predicted overhead*: the plan's step "
        "time (compute + transfer stalls) over store_all's compute, minus 1. *Measured overhead*: median over "
        f"{rounds} rounds of (plan step ÷ remat store_all step), the two run alternately in each round, minus 1. "
        "Measured peak: `peak_memory_growth` (torch's CPU allocator), an untimed run. *bitwise*: parameter "
        "gradients equal store_all's (same seed). On the CPU the offload tier is a **file-backed store in a "
        "temporary folder with synchronous copies** (transfer costs measured: "
        "{transfer}), so every offload and reload stalls compute: the hybrid's step overhead is mostly stall "
        "time, unlike CUDA's pinned memory on a side stream.",
        "",
    ]
    t = runs[0]["transfer"] or {}
    lines[2] = lines[2].replace("{transfer}", (
        f"write {t.get('d2h_bytes_per_s', 0) / 1e6:.0f} MB/s, read {t.get('h2d_bytes_per_s', 0) / 1e6:.0f} MB/s, "
        f"latency {t.get('latency_s', 0) * 1e3:.2f} ms, overlap {t.get('overlap')}") if t else "none")
    for r in runs:
        lines += [
            f"**{r['name']}**: store_all predicted {mib(r['store'])} MiB, measured {mib(r['store_measured'])} MiB, "
            f"{r['base_ms']:.1f} ms/step (median); the fraction 0.6 is {mib(r['b60'])} MiB (0.8 replaces it when 0.6 is not above hierarchical's minimum).",
            "",
            *md_header(["budget", "budget MiB", "solver", "predicted peak MiB", "measured peak MiB",
                        "measured/predicted", "predicted compute overhead", "predicted step overhead",
                        "measured overhead", "step ms", "offloaded values (tier peak MiB)", "recomputations",
                        "bitwise"]),
        ]
        for row in r["rows"]:
            if "plan" not in row:
                lines.append(f"| {row['label']} | {mib(row['budget'])} | {row['solver']} | – | – | – | – | – | – | – | – | – | "
                             f"{row['why']} |")
                continue
            mp = row.get("measured_peak")
            lines.append(
                f"| {row['label']} | {mib(row['budget'])} | {row['solver']} | {mib(row['predicted_peak'])} | {mib(mp)} | "
                f"{mp / row['predicted_peak']:.3f} | {pct(row['compute_overhead'])} | {pct(row['predicted_overhead'])} | "
                f"{pct(row.get('measured_overhead'))} | {row.get('step_ms', 0):.1f} | {row['offloads']} "
                f"({mib(row['offload_peak'])}) | {row['recomputations']} | {'yes' if row.get('bitwise') else 'NO'} |")
        lines.append("")
    return lines


def section3_md(runs: list[dict]) -> list[str]:
    caps = ", ".join(f"{r['name']} {r['cap']}" for r in runs)
    lines = [
        f"## 3. Largest batch under a fixed memory cap ({caps})",
        "",
        "`remat.max_batch_size(make_model, make_batch, cap, solver=...)` (one cap per model) on zoo models (size `small`, batch "
        "overridden): the cap bounds the **total** memory of one step (parameters + buffers + batch + the measured "
        "peak growth of forward+backward; optimizer state excluded); doubling from the start size, then "
        "bisection; every candidate measured. Plain PyTorch: the eager model, searched once (with the first "
        "solver). Libra's figure: 3.12× PyTorch's batch; the issue aims at ≥ 4×.",
        "",
        *md_header(["model", "method", "largest batch", "measured MiB", "ratio to plain PyTorch", "tries",
                    "search time (incl. plain for the first row)"]),
    ]
    for r in runs:
        plain = r["batches"][0]["result"]
        p = best_try(plain, "plain")
        lines.append(f"| {r['name']} | plain PyTorch (start {START.get(r['name'], 1)}) | {plain.plain_batch_size} | "
                     f"{mib(p.measured_bytes) if p else '–'} | 1.00× | "
                     f"{sum(t.method == 'plain' for t in plain.tries)} | – |")
        for b in r["batches"]:
            res = b["result"]
            t = best_try(res, "remat")
            ratio = f"**{res.batch_size / plain.plain_batch_size:.2f}×**" if plain.plain_batch_size else "–"
            lines.append(f"| {r['name']} | {b['solver']} | {res.batch_size} | {mib(t.measured_bytes) if t else '–'} | "
                         f"{ratio} | {sum(t.method == 'remat' for t in res.tries)} | {b['seconds']:.0f} s |")
    lines += ["", "<details><summary>Every try</summary>", ""]
    for r in runs:
        for b in r["batches"]:
            for t in b["result"].tries:
                label = "plain" if t.method == "plain" else b["solver"]
                what = mib(t.measured_bytes) + " MiB" if t.measured_bytes else "not run"
                lines.append(f"- {r['name']} {label} {t.batch}: {'fits' if t.fits else 'does not fit'}, {what}"
                             + (f" ({t.reason})" if t.reason else ""))
    return lines + ["", "</details>", ""]


def verdict_md(runs: list[dict], deep: list[dict] = ()) -> list[str]:
    """The findings, computed from the run's figures."""
    lines = ["## Verdict", ""]
    for r in [*runs, *deep]:
        m = r["mins"]
        h, y = m["hierarchical"]["plan"], m["hybrid"]["plan"]
        if h is None or y is None:
            continue
        floor, fixed = r["floor"][0], r["fixed"]
        verdict = (f"- **{r['name']}, smallest budget**: hybrid {mib(y.peak_bytes)} MiB vs hierarchical {mib(h.peak_bytes)} MiB: "
                   f"**{y.peak_bytes / h.peak_bytes:.3f}×** (target ≤ 0.5×: **{'met' if y.peak_bytes <= 0.5 * h.peak_bytes else 'not met'}**). ")
        if fixed > 0.5 * h.peak_bytes:
            verdict += (f"The parameter gradients alone, {mib(fixed)} MiB, are {fixed / h.peak_bytes:.3f}× hierarchical's "
                        "minimum, and every step holds them all when it ends: no plan, recomputing or offloading, "
                        "can reach 0.5× on this model; it would take moving the gradients off the device as they are made.")
        else:
            verdict += (f"One op alone, {r['floor'][1]}, needs {mib(floor)} MiB "
                        f"({floor / h.peak_bytes:.3f}× hierarchical's minimum) while it runs, and neither recomputing nor "
                        "offloading splits an op: "
                        + (f"recomputation already gets within {mib(h.peak_bytes - floor)} MiB of that floor on this model and "
                           "input size, so no planner could reach 0.5× here; it would take splitting the op itself "
                           "(computing it in slices of its batch)."
                           if floor > 0.5 * h.peak_bytes else "the floor leaves room below 0.5×."))
        lines.append(verdict)
    peaks = [(r["name"], row) for r in runs for row in r["rows"] if row.get("measured_peak")]
    if peaks:
        worst = max(peaks, key=lambda nr: abs(nr[1]["measured_peak"] - nr[1]["predicted_peak"]))
        d = worst[1]["measured_peak"] - worst[1]["predicted_peak"]
        lines.append(
            f"- **Measured peak vs predicted**: {len(peaks)} executed plans ({sum(1 for _, r in peaks if r['offloads'])} "
            f"with offloads); the largest difference is {d / MiB:+.3f} MiB ({worst[0]}, {worst[1]['label']}, "
            f"{worst[1]['solver']}); gradients bitwise equal to store_all's in "
            f"{sum(1 for _, r in peaks if r.get('bitwise'))} of {len(peaks)}.")
    swaps = [(r["name"], row) for r in runs for row in r["rows"] if row.get("offloads") and "measured_overhead" in row]
    for name, row in swaps:
        lines.append(
            f"- **{name}, {row['label']}, hybrid** ({row['offloads']} values offloaded): predicted step overhead "
            f"{pct(row['predicted_overhead'])} (compute {pct(row['compute_overhead'])}), measured "
            f"{pct(row['measured_overhead'])}.")
    if swaps:
        lines.append(
            "  The CPU file store's copies are synchronous (they stall compute for their whole duration, as the "
            "simulator assumes with `overlap=False`); its measured bandwidth is one small-file figure taken once, "
            "and the cost model's store_all compute time differs from the measured step, so predicted and "
            "measured overheads of offloading plans are not expected to agree closely here.")
    for r in runs:
        plain = r["batches"][0]["result"].plain_batch_size
        if not plain:
            continue
        cells = ", ".join(f"{b['solver']} {b['result'].batch_size / plain:.2f}×" for b in r["batches"])
        hyb = next((b["result"].batch_size / plain for b in r["batches"] if b["solver"] == "hybrid"), None)
        lines.append(
            f"- **{r['name']}, largest batch under {r['cap']}** (plain PyTorch {plain}): {cells}; hybrid vs the ≥ 4× aim: "
            f"**{'met' if hyb and hyb >= 4 else 'not met'}** (Libra: 3.12×).")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--dump", default=None, help="also pickle the results here (to re-render the tables)")
    ap.add_argument("--render", default=None, help="render the tables from a --dump file; run nothing")
    ap.add_argument("--quick", action="store_true", help="tiny models, nothing written")
    args = ap.parse_args()
    size = "tiny" if args.quick else "small"
    rounds = 2 if args.quick else args.rounds
    if args.render:
        import pickle

        with open(args.render, "rb") as f:
            d = pickle.load(f)
        runs, size, rounds, load_before, load_after, started, total_min = (
            d[k] for k in ("runs", "size", "rounds", "load_before", "load_after", "started", "total_min"))
        deep = d.get("deep", [])
    else:
        load_before = os.getloadavg()
        started, t0 = time.strftime("%Y-%m-%d %H:%M"), time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="remat-hybench-") as tmp:
            os.environ["REMAT_CACHE_DIR"] = str(Path(tmp) / "plans")  # leave the user's plan cache alone
            runs = [model_run(name, size, rounds, "8MiB" if args.quick else CAP[name], 2 if args.quick else START[name])
                    for name in MODELS]
            deep = [] if args.quick else [deep_run()]
        load_after = os.getloadavg()
        total_min = (time.perf_counter() - t0) / 60
        if args.dump:
            import pickle

            try:
                with open(args.dump, "wb") as f:
                    pickle.dump(dict(runs=runs, deep=deep, size=size, rounds=rounds, load_before=load_before,
                                     load_after=load_after, started=started, total_min=total_min), f)
            except Exception as err:  # the tables are still written
                log(f"could not pickle the results: {err}")
    lines = [
        "# Recomputation vs the hybrid planner (recomputation + offloading), CPU",
        "",
        made_by("hybrid.py", git_revision(), started, machine_facts()) + ". "
        f"Models: zoo `gpt2` and `{CNN}`, size `{size}` (`{CNN}` as the CNN: capture and every planner finish in "
        "seconds on it (as on `vgg11` and `unet`), and it is the zoo's standard CNN). "
        + shared_machine_note(load_before[0], load_after[0])
        + f"overheads are ratios of steps run alternately. Total run time {total_min:.1f} min.",
        "",
        *section1_md(runs + deep), *section2_md(runs, rounds), *section3_md(runs), *verdict_md(runs, deep),
        "## 4. Greedy vs the swap MILP",
        "",
        "Measured on graphs the MILP (`checkmate_swap`) can prove, by `benchmarks/swap_milp.py`: see "
        "[swap_milp.md](swap_milp.md).",
        "",
    ]
    publish("\n".join(lines) + "\n", None if args.quick else HERE / "hybrid.md")


if __name__ == "__main__":
    main()

"""Plan cache cold vs warm, and the largest batch under a memory cap, with and without remat.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ux.py [--reps 3] [--cap 128MiB] [--quick]``
(writes ``benchmarks/ux.md``; ``--quick`` is a smoke test on tiny models that writes nothing).

1. **Plan cache, cold vs warm.** ``remat.optimize(model, **inputs, budget=BUDGET)`` on the zoo's
   GPT-2 (``gpt2``, size ``small``), each time in a **fresh Python process**: first with an
   empty plan cache (cold: the plan is solved and stored), then again with the cache that run
   filled (warm: the plan is read back). Cold and warm runs alternate, ``--reps`` times, each
   pair with a new empty cache folder. Timed in the child: the whole ``optimize()`` call
   (capture, planning, lowering, the first planned step) and, inside it, the planning part
   alone (the backend's ``plan_with_cache`` call: solving, or reading and re-simulating the
   cached plan). Import and model construction are not timed. remat's machine roofline cache
   (the cost model's measured rates) is filled once beforehand in a folder of the benchmark, so
   both runs find it: only the plan cache differs between them.
2. **Largest batch under one memory cap** (``remat.max_batch_size``): plain PyTorch and remat
   (``solver="auto"``), for the zoo's GPT-2 and ResNet-18 (size ``small``, batch overridden), with
   the same cap on the *total* memory of a training step (parameters, buffers, batch, and the
   measured peak growth of forward+backward; optimizer state excluded), measured with torch's
   CPU allocator (``remat.measure.peak_memory_growth``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import (  # this folder is on the path
    HERE, SRC, best_try, git_revision, machine_facts, made_by, md_header, shared_machine_note, use_checkout_src,
    zoo_batch_factories)

BUDGET = 0.5

_CHILD = """
import json, sys, time
sys.path.insert(0, {src!r})
import torch
import remat, remat.backend, remat.solvers.cache
from remat import models as zoo

planning = []
inner = remat.backend.plan_with_cache

def timed(*args, **kwargs):
    t = time.perf_counter()
    try:
        return inner(*args, **kwargs)
    finally:
        planning.append(time.perf_counter() - t)

remat.backend.plan_with_cache = timed
ex = zoo.build({name!r}, size={size!r})
t = time.perf_counter()
m = remat.optimize(ex.model, *ex.args, budget={budget!r}, **ex.kwargs)
total = time.perf_counter() - t
plan = m.plan
print("RESULT " + json.dumps(dict(optimize=total, planning=sum(planning), cache=plan.info.get("cache"),
      solver=plan.solver, nodes=len(plan.graph.nodes), peak=plan.peak_bytes, budget=plan.budget_bytes)))
"""


def run_child(name: str, size: str, plan_dir: Path, xdg: Path) -> dict:
    code = _CHILD.format(src=str(SRC), name=name, size=size, budget=1.0 if size == "tiny" else BUDGET)
    env = dict(os.environ, REMAT_CACHE_DIR=str(plan_dir), XDG_CACHE_HOME=str(xdg))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"child failed:\n{out.stderr[-4000:]}")
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def cache_benchmark(name: str, size: str, reps: int, work: Path) -> tuple[list[str], dict]:
    xdg = work / "xdg"
    run_child(name, size, work / "warmup-plans", xdg)  # fills the roofline cache (not timed)
    rows, pairs = [], []
    for rep in range(reps):
        plan_dir = work / f"plans-{rep}"
        cold = run_child(name, size, plan_dir, xdg)
        warm = run_child(name, size, plan_dir, xdg)
        pairs.append((cold, warm))
        rows.append(
            f"| {rep + 1} | {cold['optimize']:.2f} | {warm['optimize']:.2f} | {warm['optimize'] / cold['optimize']:.3f} "
            f"| {cold['planning']:.3f} | {warm['planning']:.4f} | {warm['planning'] / cold['planning']:.4f} "
            f"| {cold['cache']} / {warm['cache']} |"
        )
        print(rows[-1], flush=True)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    summary = dict(
        cold_opt=med([c["optimize"] for c, _ in pairs]), warm_opt=med([w["optimize"] for _, w in pairs]),
        cold_plan=med([c["planning"] for c, _ in pairs]), warm_plan=med([w["planning"] for _, w in pairs]),
        ratio_opt=med([w["optimize"] / c["optimize"] for c, w in pairs]),
        ratio_plan=med([w["planning"] / c["planning"] for c, w in pairs]),
        solver=pairs[0][0]["solver"], nodes=pairs[0][0]["nodes"], peak=pairs[0][0]["peak"],
        budget=pairs[0][0]["budget"], hits=sum(w["cache"] == "hit" for _, w in pairs),
    )
    return rows, summary


def batch_benchmark(name: str, size: str, cap: str, start: int) -> tuple[dict, float]:
    import remat

    make_model, make_batch = zoo_batch_factories(name, size)
    t = time.perf_counter()
    result = remat.max_batch_size(make_model, make_batch, cap, solver="auto", start=start,
                                  on_try=lambda r: print(f"  {name} {r.method} batch {r.batch}: "
                                                         f"{'fits' if r.fits else 'no'} {r.reason}", flush=True))
    return result, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cap", default="128MiB")
    ap.add_argument("--quick", action="store_true", help="tiny models, nothing written")
    args = ap.parse_args()
    use_checkout_src()
    import remat
    from remat.errors import format_bytes

    size = "tiny" if args.quick else "small"
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix="remat-ux-") as tmp:
        work = Path(tmp)
        os.environ["REMAT_CACHE_DIR"] = str(work / "batch-plans")  # part 2 leaves the user's cache alone
        os.environ["XDG_CACHE_HOME"] = str(work / "xdg")
        print("1. plan cache, cold vs warm (fresh processes)", flush=True)
        rows, s = cache_benchmark("gpt2", size, 1 if args.quick else args.reps, work)
        print("2. max batch size", flush=True)
        batches = []
        for name, start in (("gpt2", 4), ("resnet18", 8)):
            result, seconds = batch_benchmark(name, size, args.cap, 2 if args.quick else start)  # BatchNorm: batch >= 2
            print(result.summary(), flush=True)
            batches.append((name, result, seconds))
    load_after = os.getloadavg()
    if args.quick:
        return

    cap_bytes = remat.budget.parse_size(args.cap)
    lines = [
        "# Plan cache and max batch size",
        "",
        made_by("ux.py", git_revision(), started, machine_facts()) + ".",
        shared_machine_note(load_before[0], load_after[0]) + "the "
        "cold/warm pairs ran back to back, so their ratios are the figures to read.",
        "",
        "## 1. Plan cache: `remat.optimize` of GPT-2 (zoo `gpt2`, size `small`), cold vs warm",
        "",
        f"`remat.optimize(model, **inputs, budget={BUDGET})` (solver `auto`) in a fresh process each time; "
        f"cold = empty plan cache, warm = the cache the cold run just filled. The joint graph has {s['nodes']} "
        f"nodes; `auto` chose **{s['solver']}** (predicted peak {format_bytes(s['peak'])} within "
        f"{format_bytes(s['budget'])}). *optimize()* is the whole call (capture by Dynamo and AOTAutograd, "
        "per-op workspace probing, planning, lowering, the first planned step); *planning* is the part of it "
        "spent in the backend's planning call (cold: solving; warm: reading the entry and re-simulating the "
        "plan on the live graph to validate it). Seconds.",
        "",
        *md_header(["pair", "optimize() cold", "optimize() warm", "warm/cold", "planning cold", "planning warm",
                    "warm/cold", "cache (cold / warm)"]),
        *rows,
        f"| **median** | **{s['cold_opt']:.2f}** | **{s['warm_opt']:.2f}** | **{s['ratio_opt']:.3f}** "
        f"| **{s['cold_plan']:.3f}** | **{s['warm_plan']:.4f}** | **{s['ratio_plan']:.4f}** | {s['hits']}/{len(rows)} warm hits |",
        "",
        f"- Planning: warm is **{1 / s['ratio_plan']:.0f}x** faster than cold "
        f"(target >= 10x: **{'met' if 1 / s['ratio_plan'] >= 10 else 'not met'}**).",
        f"- The whole `optimize()` call: warm is **{1 / s['ratio_opt']:.1f}x** faster than cold "
        f"(target >= 10x: **{'met' if 1 / s['ratio_opt'] >= 10 else 'not met'}**): "
        f"the cache removes solving only; the remaining {s['warm_opt']:.1f} s is capture, workspace probing "
        "and lowering, which every new process repeats.",
        "",
        f"## 2. Largest batch under a {format_bytes(cap_bytes)} cap",
        "",
        f"`remat.max_batch_size(make_model, make_batch, \"{args.cap}\", solver=\"auto\")` with zoo models "
        "(size `small`, batch overridden). The cap bounds the **total** memory of one training step: "
        "parameters + buffers + batch + the measured peak growth of forward+backward (activations, "
        "temporaries, gradients), with torch's CPU allocator accounting; optimizer state is not included. "
        "Search: doubling from the start size (4 for gpt2, 8 for resnet18), then bisection; every candidate measured (remat: planned with "
        "budget = cap - parameters - buffers - batch, a budget no plan meets counts as not fitting without "
        "running).",
        "",
        *md_header(["model", "plain PyTorch batch", "measured", "remat batch", "measured", "remat solver",
                    "remat / plain", "tries", "search time"]),
    ]
    for name, result, seconds in batches:
        p, r = best_try(result, "plain"), best_try(result, "remat")
        gain = f"{result.gain:.2f}x" if result.gain else "–"
        lines.append(
            f"| {name} | {result.plain_batch_size} | {format_bytes(p.measured_bytes) if p else '–'} "
            f"| {result.batch_size} | {format_bytes(r.measured_bytes) if r else '–'} | {r.solver if r else '–'} "
            f"| {gain} | {len(result.tries)} | {seconds:.0f} s |"
        )
    lines += ["", "Every try (method, batch: measured total or why it did not fit):", ""]
    for name, result, _ in batches:
        for t in result.tries:
            what = format_bytes(t.measured_bytes) if t.measured_bytes else "not run"
            lines.append(f"- {name} {t.method} {t.batch}: {'fits' if t.fits else 'does not fit'}, {what}"
                         + (f" ({t.reason})" if t.reason else ""))
    (HERE / "ux.md").write_text("\n".join(lines) + "\n")
    print("wrote", HERE / "ux.md")


if __name__ == "__main__":
    main()

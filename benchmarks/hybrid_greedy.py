"""The ``hybrid`` solver's greedy on the zoo, against another checkout's (its step, fit and time).

Run: ``.venv/bin/python benchmarks/hybrid_greedy.py [--baseline-src PATH] [--fractions 0.3,0.5]``
(writes ``benchmarks/hybrid_greedy.md``; about 8 minutes per checkout on 2 cores).

Each zoo model (``small``, plus the Llama-style model with 8 layers) is captured once (``flops``
costs: deterministic) and pickled; then every case -- model, transfer setting, budget fraction -- is
planned by ``solve("hybrid", graph, budget, time_limit=30)`` in a fresh process, once with this
checkout's ``src`` and, with ``--baseline-src``, once with the other one's, one after the other
(the greedy stops at a time limit, so two processes at once would change each other's results).
Two transfer settings, fixed rather than measured so that runs compare: *beside compute* (copies
on a side channel at 20 GB/s each way, 10 us latency, as pinned memory on a GPU) and *synchronous*
(1.8 / 1.6 GB/s, 0.25 ms, every copy stalls compute: remat's CPU file store as measured here).

Reported per case: planning time, the plan's predicted step (compute + stalls), whether it fits,
the start the greedy's plan came from; and the new/old ratios with their geometric means.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
MODELS = ("gpt2", "resnet18", "mobilenet", "vit", "llama", "llama8", "densenet", "unet")
SETTINGS = {
    "beside compute": {"d2h_bytes_per_s": 2.0e10, "h2d_bytes_per_s": 2.0e10, "latency_s": 1e-5, "overlap": True},
    "synchronous": {"d2h_bytes_per_s": 1.8e9, "h2d_bytes_per_s": 1.6e9, "latency_s": 2.5e-4, "overlap": False},
}


def capture(name: str, path: Path) -> None:
    """Pickle the captured step graph of zoo model ``name`` (``llama8``: the Llama-style model with
    8 layers, batch 2 x 64 tokens)."""
    from remat.api import capture_and_plan
    from remat.models import hf, registry

    if name == "llama8":
        model, args, kwargs = registry._BUILDERS["llama"](**dict(hf._LLAMA, layers=8, batch=2, seq=64))
        model.train()
    else:
        ex = registry.build(name, size="small")
        model, args, kwargs = ex.model, ex.args, ex.kwargs
    _, captured = capture_and_plan(model, *args, budget=None, cache=False, split="off", cost_model="flops", **kwargs)
    with open(path, "wb") as f:
        pickle.dump(captured.graph, f)


def child(graph_path: str, setting: str, fraction: float) -> None:
    """One case in this process: print its result as JSON."""
    import importlib
    import warnings

    from remat.solvers import solve
    from remat.solvers.planner import resolve

    warnings.simplefilter("ignore")
    simulations = [0]
    plan_module = importlib.import_module("remat.plan")  # (``remat.plan`` is also the API's function)
    original = plan_module.simulate

    def counting(*a, **k):  # every simulation of the call: the recomputation starts' and the greedy's
        simulations[0] += 1
        return original(*a, **k)

    plan_module.simulate = counting
    try:
        from remat.solvers import hybrid_swaps  # the swap-free plans it predicts from (absent before)
        hybrid_swaps.simulate = counting
    except ImportError:
        pass
    with open(graph_path, "rb") as f:
        graph = pickle.load(f)
    graph.meta["transfer"] = dict(SETTINGS[setting])
    budget = resolve(graph, fraction)
    started = time.perf_counter()
    plan = solve("hybrid", graph, budget, time_limit=30)
    print(json.dumps({"seconds": time.perf_counter() - started, "step": plan.step_seconds,
                      "fits": plan.peak_bytes <= budget, "peak": plan.peak_bytes / budget, "start": plan.info.get("start", "").split(" ")[0],
                      "simulations": simulations[0]}))


def run_case(src: Path, graph_path: Path, setting: str, fraction: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, __file__, "--child", str(graph_path), setting, str(fraction)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def git_revision(src: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--baseline-src", type=Path, default=None, help="the other checkout's src folder")
    ap.add_argument("--fractions", default="0.3,0.5", help="budget fractions (remat's meaning)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", type=Path, default=HERE / "hybrid_greedy.md")
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], float(args.child[2]))
        return
    sys.path.insert(0, str(SRC))
    sys.path.insert(0, str(HERE))
    import common

    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = Path(tmp) / f"{name}.pkl"
            capture(name, path)
            for setting in SETTINGS:
                for fraction in fractions:
                    new = run_case(SRC, path, setting, fraction)
                    old = run_case(args.baseline_src, path, setting, fraction) if args.baseline_src else None
                    rows.append((name, setting, fraction, new, old))
                    common.log(f"{name} {setting} {fraction}: new {new} old {old}")
    lines = [
        "# The hybrid's greedy on the zoo" + (" against an earlier checkout" if args.baseline_src else ""), "",
        f"`benchmarks/hybrid_greedy.py` at {git_revision(SRC)}"
        + (f" against {git_revision(args.baseline_src)}" if args.baseline_src else "")
        + f", {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {common.machine_facts()}", "",
        "`solve(\"hybrid\", graph, budget, time_limit=30)` per case in a fresh process, the two checkouts one after "
        "the other; `flops` costs; budgets as fractions (remat's meaning). Step: the plan's predicted step "
        "(compute + stalls, seconds); where it misses the budget, the greedy's smallest plan (its peak against the budget). Transfer "
        "settings: *beside compute* 20 GB/s each way, 10 us, overlapped; *synchronous* 1.8 / 1.6 GB/s, 0.25 ms, "
        "every copy stalls compute. Simulations: every simulation the call runs (the recomputation planners' and "
        "the greedy's, and the swap-free plans the greedy predicts swaps from).", "",
    ]
    if args.baseline_src:
        lines += ["| model | copies | budget | before: s | before: step | now: s | now: step | now / before: step | "
                  "now / before: time | simulations: before, now | now: start |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    else:
        lines += ["| model | copies | budget | s | step | fits | start |", "|---|---|---|---|---|---|---|"]
    ratios, times, missed = [], [], []
    for name, setting, fraction, new, old in rows:
        fit = "" if new["fits"] else f" (misses: peak {new['peak']:.3f}x the budget)"
        if old is None:
            lines.append(f"| {name} | {setting} | {fraction} | {new['seconds']:.1f} | {new['step']:.5f} | "
                         f"{new['fits']} | {new['start']} |")
            continue
        ofit = "" if old["fits"] else f" (misses: peak {old['peak']:.3f}x the budget)"
        ratio, t = new["step"] / old["step"], new["seconds"] / old["seconds"]
        if new["fits"] and old["fits"]:
            ratios.append(ratio)
        elif not (new["fits"] or old["fits"]):
            missed.append((ratio, new["peak"] / old["peak"]))
        times.append(t)
        lines.append(f"| {name} | {setting} | {fraction} | {old['seconds']:.1f} | {old['step']:.5f}{ofit} | "
                     f"{new['seconds']:.1f} | {new['step']:.5f}{fit} | {ratio:.3f} | {t:.2f} | "
                     f"{old.get('simulations', '?')}, {new.get('simulations', '?')} | {new['start']} |")
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        tgeo = math.exp(sum(map(math.log, times)) / len(times))
        lines += ["", f"Over the {len(ratios)} cases where both fit: step now / before **{geo:.3f}** (geometric mean; "
                  f"{sum(r < 0.9999 for r in ratios)} faster, {sum(r > 1.0001 for r in ratios)} slower, worst "
                  f"{max(ratios):.3f}, best {min(ratios):.3f}); planning time now / before {tgeo:.2f} over all "
                  f"{len(times)} cases."]
    if missed:
        geo = math.exp(sum(math.log(r) for r, _ in missed) / len(missed))
        lines += ["", f"Over the {len(missed)} cases where both miss (the greedy's smallest plan): peak now / before "
                  f"{min(p for _, p in missed):.3f} to {max(p for _, p in missed):.3f}; its step now / before **{geo:.3f}** "
                  f"(geometric mean; worst {max(r for r, _ in missed):.3f}, best {min(r for r, _ in missed):.3f})."]
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()

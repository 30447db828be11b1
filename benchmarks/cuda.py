"""remat's eager lowering on a CUDA GPU: measured peak against predicted, gradients, step time.

Run (on a machine with a CUDA GPU): ``python benchmarks/cuda.py [--quick] [--rounds R] [--save F]``;
``python benchmarks/cuda.py --render F`` writes ``benchmarks/cuda.md`` from a saved run.

For each model -- GPT-2 from ``transformers`` (8 layers, d_model 512, 8 heads, sequence 512, batch 8, vocab
8192, eager attention, dropout 0.1, random weights) and the zoo's ResNet-18 (size ``medium``, BatchNorm) -- in
one process, on one GPU, with the ``profile`` cost model (every op timed on this GPU):

* plans: ``store_all``; ``checkpoint_all``; ``hierarchical`` at the fractions 0.6 and 0.3 and at
  its smallest feasible budget; ``hybrid`` (recomputation + offloading to pinned host memory on a
  side stream) at hierarchical's smallest budget and at its own smallest;
* per plan: the budget, the predicted peak, the **measured peak** (``torch.cuda`` allocator
  statistics: peak growth of allocated bytes over the step's start, ``.grad`` None first; see
  :mod:`remat.measure`), whether the parameter gradients equal ``store_all``'s **bitwise** (same
  seed), their largest relative difference from eager PyTorch's, the predicted step overhead (compute
  and transfer stalls over store_all's compute) and the measured one (median over ``--rounds``
  rounds of plan step / eager step, the two run back to back, order alternating).
"""

from __future__ import annotations

if __name__ == "cuda":  # this folder is on sys.path: torch's `from cuda.bindings import ...` found this script
    raise ImportError("benchmarks/cuda.py is a script, not the cuda-python package")

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import common  # this folder is on the path

common.use_checkout_src()

import torch  # noqa: E402

import remat  # noqa: E402
import remat.solvers.planner as planner  # noqa: E402
from remat import models as zoo  # noqa: E402
from remat.budget import fixed_bytes  # noqa: E402
from remat.errors import RematError  # noqa: E402
from common import (  # noqa: E402
    HERE, bitwise_equal, capture_store_all, fmt, git_revision, gpt2, grad_errors, log, make_step, md_header,
    measured_peak, mib, pct, quiet, seeded_grads, time_against, write_json)

DEVICE = "cuda"  # --cpu-smoke: "cpu" (to check the script where there is no GPU)
ROUNDS = 10
GPT2 = dict(n_layer=8, n_embd=512, n_head=8, vocab=8192, positions=512, batch=8, seq=512)
GPT2_QUICK = dict(n_layer=2, n_embd=128, n_head=4, vocab=1000, positions=256, batch=4, seq=128)


def build(name: str, quick: bool):
    """The model on the GPU (train mode), its inputs and its loss; the same weights and inputs every call."""
    if name == "gpt2":
        model, args, kwargs = gpt2(GPT2_QUICK if quick else GPT2)
        kwargs = {k: v.to(DEVICE) for k, v in kwargs.items()}
        return model.to(DEVICE).train(), args, kwargs, lambda out: out
    ex = zoo.build("resnet18", size="tiny" if quick else "medium", seed=0, device=DEVICE)
    return ex.model, ex.args, ex.kwargs, ex.loss


def bench_model(name: str, quick: bool, rounds: int, progress=lambda partial: None) -> dict:
    """One model's table; ``progress(partial)`` gets the rows measured so far after each plan (a run cut
    short still saves them)."""
    model, args, kwargs, loss = build(name, quick)
    eager = make_step(model, args, kwargs, loss)
    ref_eager = seeded_grads(model, eager, device=DEVICE)
    store, capture_s = capture_store_all(model, args, kwargs, cache=False)
    graph = store.plan.graph
    log(f"{name}: {len(graph.nodes)} nodes, store_all {mib(store.plan.peak_bytes)} MiB, capture+profile {capture_s:.0f} s")
    hier_min = planner.smallest_plan(graph, "hierarchical").peak_bytes
    try:
        hyb_min = planner.smallest_plan(graph, "hybrid").peak_bytes
    except RematError as err:
        log(f"  hybrid min: {err}")
        hyb_min = None
    targets = [("store_all", "store_all", None), ("checkpoint_all", "checkpoint_all", None),
               ("hierarchical 0.6", "hierarchical", 0.6), ("hierarchical 0.3", "hierarchical", 0.3),
               ("hierarchical min", "hierarchical", hier_min), ("hybrid at hierarchical min", "hybrid", hier_min)]
    if hyb_min is not None:
        targets.append(("hybrid min", "hybrid", hyb_min))
    rows, steps = [], {}
    transfer = graph.meta.get("transfer") or {}
    summary = dict(name=name, nodes=len(graph.nodes), capture_s=capture_s, store=store.plan.peak_bytes,
                   fixed=fixed_bytes(graph), eager_ms=None,
                   transfer={k: v for k, v in transfer.items() if isinstance(v, (int, float, str, bool))}, rows=rows)
    ref = seeded_grads(model, make_step(store, args, kwargs, loss), device=DEVICE)
    for label, solver, budget in targets:
        row = dict(label=label, solver=solver)
        try:
            if solver == "store_all":
                mod = store
            else:
                with quiet():
                    mod = remat.optimize(model, *args, budget=budget, solver=solver, cache=False, **kwargs)
            p = mod.plan
            row.update(budget=p.budget_bytes, predicted=p.peak_bytes, predicted_overhead=p.step_overhead,
                       recomputations=p.recomputations, offloads=len(p.offloaded_values),
                       offload_peak=p.offload_peak_bytes, stall_ms=p.simulation.stall_seconds * 1e3)
            step = make_step(mod, args, kwargs, loss)
            got = seeded_grads(model, step, device=DEVICE)
            row.update(bitwise=bitwise_equal(got, ref), vs_eager=grad_errors(got, ref_eager)["max_rel"])
            row["measured"] = measured_peak(model, step, DEVICE)
            steps[label] = step
            log(f"  {label}: budget {mib(row['budget'])}, predicted {mib(row['predicted'])}, measured "
                f"{mib(row['measured'])} MiB, bitwise {row['bitwise']}, vs eager {row['vs_eager']:.1e}")
        except Exception as err:  # a failure is a row of the table, not the end of the run
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            log(f"  {label}: {row['error']}")
            traceback.print_exc()
        rows.append(row)
        progress(summary)
    # timing: each round, eager and every plan back to back, order reversed every other round
    eager_s, _, ratios = time_against((model, eager), {k: (model, s) for k, s in steps.items()}, rounds,
                                      device=DEVICE, alternate=True)
    for row in rows:
        if row["label"] in ratios:
            row["vs_eager_time"] = ratios[row["label"]]
    base = next((r["vs_eager_time"] for r in rows if r["label"] == "store_all" and "vs_eager_time" in r), None)
    for row in rows:
        if base and "vs_eager_time" in row:
            row["measured_overhead"] = row["vs_eager_time"] / base - 1
    summary["eager_ms"] = eager_s * 1e3 if eager_s is not None else None
    return summary


def report(results: list[dict], meta: dict) -> str:
    out = ["# remat on a CUDA GPU (eager lowering)", "",
           f"Generated by `benchmarks/cuda.py` at {meta['revision']} on {meta['device']} (torch {meta['torch']}, "
           f"CUDA {meta['cuda']}, allocator settings: {meta.get('allocator', 'default')}), {meta['rounds']} timing rounds, {meta['elapsed']:.0f} s in all. "
           "Peaks are the growth of allocated CUDA memory over the step's start (`torch.cuda` allocator "
           "statistics), parameters and inputs excluded, gradients included: the quantity the budget bounds. "
           "Overheads: predicted = (compute + transfer stalls) / store_all's compute − 1; measured = "
           "(plan step / eager step) / (store_all step / eager step) − 1, medians of alternating rounds. "
           "Rel. diff vs eager: the largest, over parameters, of max|remat − eager| / max|eager| of the gradient.",
           "", *meta.get("notes", [])]
    for r in results:
        out += [f"## {r['name']}", "",
                f"{r['nodes']} nodes; store_all peak {mib(r['store'])} MiB, fixed (gradients and outputs every plan "
                f"holds) {mib(r['fixed'])} MiB; eager step {fmt(r['eager_ms'], '.1f')} ms; capture and profiling "
                f"{r['capture_s']:.0f} s. Transfer costs: "
                + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r["transfer"].items()),
                "", *md_header(["plan", "budget MiB", "predicted MiB", "measured MiB", "measured / predicted",
                                "≤ budget", "recomputed", "offloaded", "bitwise = store_all", "rel. diff vs eager",
                                "predicted overhead", "measured overhead", "step / eager"])]
        for row in r["rows"]:
            if "error" in row:
                out.append(f"| {row['label']} | {row['error']} |" + " |" * 11)
                continue
            m, p, b = row.get("measured"), row["predicted"], row["budget"]
            out.append(
                f"| {row['label']} | {mib(b)} | {mib(p)} | {mib(m)} | {m / p:.3f} | "
                f"{'–' if b is None else ('yes' if m <= b else '**no**')} | {row['recomputations']} | "
                f"{row['offloads']} ({mib(row['offload_peak'])} MiB) | {'yes' if row['bitwise'] else '**no**'} | "
                f"{row['vs_eager']:.1e} | {row['predicted_overhead'] * 100:+.1f}% | "
                f"{pct(row.get('measured_overhead'))} | "
                f"{row.get('vs_eager_time', float('nan')):.3f} |")
        out.append("")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny models, 2 rounds, nothing written but --save")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--models", nargs="+", default=["gpt2", "resnet18"], choices=["gpt2", "resnet18"])
    ap.add_argument("--save", help="write the measurements as JSON here (after each model)")
    ap.add_argument("--render", help="write benchmarks/cuda.md from a --save file; run nothing")
    ap.add_argument("--cpu-smoke", action="store_true", help="run --quick on the CPU (checks the script only)")
    a = ap.parse_args()
    global DEVICE
    if a.cpu_smoke:
        DEVICE, a.quick = "cpu", True
    if a.render:
        saved = json.loads(Path(a.render).read_text())
        text = report(saved["results"], saved["meta"])
        HERE.joinpath("cuda.md").write_text(text)
        print(text)
        return
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmarks/cuda.py needs a CUDA GPU (--cpu-smoke checks the script on the CPU)")
    rounds = 2 if a.quick else a.rounds
    meta = dict(revision=git_revision(), device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
                torch=torch.__version__, allocator=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"),
                cuda=torch.version.cuda, rounds=rounds, elapsed=0.0)
    start, results = time.perf_counter(), []
    def save(partial=None):
        meta["elapsed"] = time.perf_counter() - start
        if a.save:
            write_json(a.save, dict(meta=meta, results=results + ([partial] if partial else [])))

    for name in a.models:
        results.append(bench_model(name, a.quick, rounds, progress=save))
        save()
    text = report(results, meta)
    print(text)
    if not a.quick and not a.save:
        HERE.joinpath("cuda.md").write_text(text)


if __name__ == "__main__":
    main()

"""store_all through remat against eager PyTorch: measured peak and step time, as ratios.

Run: ``.venv/bin/python benchmarks/pipeline.py`` (writes ``benchmarks/pipeline.md``).

For each model, eager PyTorch and remat's store_all plan (the same work, through the
captured graph) run one training step each, alternately, ``ROUNDS`` times; the time
ratio is the median of the per-round ratios, so machine noise hits both sides alike.
Peaks are measured from torch's allocator (CPU) or CUDA's statistics, as the growth of
allocated memory during one forward+backward with gradients set to None beforehand.
Targets (issue 2): peak within 5%, time within 10%.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import remat
from remat import zoo
from remat.measure import peak_memory_growth

ROUNDS = 15
MODELS = [("gpt2", "small"), ("resnet", "small"), ("gpt2", "medium"), ("resnet", "medium")]


def step_fn(ex, module):
    def step():
        out = module(*ex.args, **ex.kwargs)
        ex.loss(out).backward()

    return step


def timed(ex, step) -> float:
    ex.model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def bench(name: str, size: str) -> dict:
    eager_ex = zoo.build(name, size=size)
    remat_ex = zoo.build(name, size=size)
    module = remat.optimize(remat_ex.model, *remat_ex.args, **remat_ex.kwargs, solver="store_all")
    eager_step, remat_step = step_fn(eager_ex, eager_ex.model), step_fn(remat_ex, module)
    for ex, step in ((eager_ex, eager_step), (remat_ex, remat_step)):  # warm up
        for _ in range(2):
            timed(ex, step)
    ratios, eager_t, remat_t = [], [], []
    for _ in range(ROUNDS):
        e = timed(eager_ex, eager_step)
        r = timed(remat_ex, remat_step)
        eager_t.append(e)
        remat_t.append(r)
        ratios.append(r / e)
    peaks = {}
    for label, ex, step in (("eager", eager_ex, eager_step), ("remat", remat_ex, remat_step)):
        ex.model.zero_grad(set_to_none=True)
        peaks[label] = peak_memory_growth(step)[0]
    return {
        "model": f"{name} ({size})",
        "nodes": len(module.plan.graph.nodes),
        "eager_peak": peaks["eager"],
        "remat_peak": peaks["remat"],
        "predicted": module.plan.peak_bytes,
        "eager_ms": statistics.median(eager_t) * 1e3,
        "remat_ms": statistics.median(remat_t) * 1e3,
        "time_ratio": statistics.median(ratios),
    }


def main() -> None:
    torch.manual_seed(0)
    rows = []
    for name, size in MODELS:
        row = bench(name, size)
        rows.append(row)
        print(row, flush=True)
    MiB = 2**20
    lines = [
        "# store_all through remat vs eager PyTorch",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, Python {sys.version.split()[0]}. Made by `benchmarks/pipeline.py`.",
        "",
        "Peak: growth of allocated memory during one forward+backward (grads None beforehand), from torch's",
        "allocator. Time: median over "
        f"{ROUNDS} rounds of (remat step / eager step), the two run alternately.",
        "",
        "| model | joint nodes | eager peak | remat peak | predicted | peak ratio | eager step | remat step | time ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['nodes']} | {r['eager_peak'] / MiB:.1f} MiB | {r['remat_peak'] / MiB:.1f} MiB | "
            f"{r['predicted'] / MiB:.1f} MiB | {r['remat_peak'] / r['eager_peak']:.3f} | {r['eager_ms']:.1f} ms | "
            f"{r['remat_ms']:.1f} ms | {r['time_ratio']:.3f} |"
        )
    lines += ["", "Targets: peak ratio within 5% of 1, time ratio within 10% of 1 (see the notes below).", ""]
    out = Path(__file__).with_suffix(".md")
    notes = out.read_text().split("<!-- notes -->", 1)[1] if out.exists() and "<!-- notes -->" in out.read_text() else "\n"
    out.write_text("\n".join(lines) + "<!-- notes -->" + notes)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

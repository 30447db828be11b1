"""store_all through remat against eager PyTorch: measured peak and step time, as ratios.

Run: ``.venv/bin/python benchmarks/pipeline.py [--quick]`` (writes ``benchmarks/pipeline.md``; ``--quick``
is a smoke test on tiny models, 2 rounds, that prints the table and writes nothing).

For each model, eager PyTorch and remat's store_all plan (the same work, through the
captured graph) run one training step each, alternately, ``ROUNDS`` times; the time
ratio is the median of the per-round ratios, so machine noise hits both sides alike.
Peaks are measured from torch's allocator (CPU) or CUDA's statistics, as the growth of
allocated memory during one forward+backward with gradients set to None beforehand.
Targets (issue 2): peak within 5%, time within 10%.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import remat
from remat import models as zoo

from common import (  # this folder is on the path
    MiB, cpu_name, make_step, md_header, measured_peak, process_setup, time_against)

ROUNDS = 15
MODELS = [("gpt2", "small"), ("resnet", "small"), ("gpt2", "medium"), ("resnet", "medium")]


def bench(name: str, size: str, rounds: int = ROUNDS) -> dict:
    eager_ex = zoo.build(name, size=size)
    remat_ex = zoo.build(name, size=size)
    module = remat.optimize(remat_ex.model, *remat_ex.args, **remat_ex.kwargs, solver="store_all")
    eager = (eager_ex.model, make_step(eager_ex.model, eager_ex.args, eager_ex.kwargs, eager_ex.loss))
    planned = (remat_ex.model, make_step(module, remat_ex.args, remat_ex.kwargs, remat_ex.loss))
    # two warm-ups each, then ``rounds`` rounds of eager then remat; peaks afterwards, untimed
    eager_s, remat_s, ratio = time_against(eager, {"remat": planned}, rounds, warmup=2)
    return {
        "model": f"{name} ({size})",
        "nodes": len(module.plan.graph.nodes),
        "eager_peak": measured_peak(*eager),
        "remat_peak": measured_peak(*planned),
        "predicted": module.plan.peak_bytes,
        "eager_ms": eager_s * 1e3,
        "remat_ms": remat_s["remat"] * 1e3,
        "time_ratio": ratio["remat"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny models, 2 rounds, the table printed, nothing written")
    args = ap.parse_args()
    models = [(name, "tiny") for name in ("gpt2", "resnet")] if args.quick else MODELS
    rounds = 2 if args.quick else ROUNDS
    process_setup(seed=0)
    rows = []
    for name, size in models:
        row = bench(name, size, rounds)
        rows.append(row)
        print(row, flush=True)
    lines = [
        "# store_all through remat vs eager PyTorch",
        "",
        f"Machine: {cpu_name()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, Python {sys.version.split()[0]}. Made by `benchmarks/pipeline.py`.",
        "",
        "Peak: growth of allocated memory during one forward+backward (grads None beforehand), from torch's",
        "allocator. Time: median over "
        f"{rounds} rounds of (remat step / eager step), the two run alternately.",
        "",
        *md_header(["model", "joint nodes", "eager peak", "remat peak", "predicted", "peak ratio", "eager step",
                    "remat step", "time ratio"]),
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['nodes']} | {r['eager_peak'] / MiB:.1f} MiB | {r['remat_peak'] / MiB:.1f} MiB | "
            f"{r['predicted'] / MiB:.1f} MiB | {r['remat_peak'] / r['eager_peak']:.3f} | {r['eager_ms']:.1f} ms | "
            f"{r['remat_ms']:.1f} ms | {r['time_ratio']:.3f} |"
        )
    lines += ["", "Targets: peak ratio within 5% of 1, time ratio within 10% of 1 (see the notes below).", ""]
    if args.quick:
        print("\n".join(lines))
        return
    out = Path(__file__).with_suffix(".md")
    notes = out.read_text().split("<!-- notes -->", 1)[1] if out.exists() and "<!-- notes -->" in out.read_text() else "\n"
    out.write_text("\n".join(lines) + "<!-- notes -->" + notes)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""``budget="min"`` under ``remat.compile`` with and without splits, and against the eager backend.

Run: ``.venv/bin/python benchmarks/split_compiled_min.py [--quick]`` (writes ``benchmarks/split_compiled_min.md``).

``remat.compile(model, budget="min")`` now splits the ops that set the step's floor (the LM head and
its loss) as ``remat.optimize`` does: more chunks while each lowers the quick planners' smallest peak
by 2%, that count's smallest plan searched in full and kept where it peaks 2% lower than the unsplit
step's. Here, in one process, for GPT-2s of the zoo with a 32k vocabulary: ``remat.compile`` with
``split="off"`` (the behaviour before) and with ``split="auto"`` (the default), and ``remat.optimize``
with ``split="auto"`` for reference. Reported: chunks, predicted and measured peak (allocator, one
step after a warm-up), the time to compile and plan, and the measured step of the split plan against
the unsplit one (median of the per-round ratios of alternating rounds).
"""

from __future__ import annotations

import argparse
import copy
import time

from common import gpt2, log, md_header, measured_peak, mib, process_setup, time_against, write_report

CONFIGS = {  # the zoo's GPT-2 with a 32k vocabulary: the LM head and its loss set the floor
    "2 layers, width 64, 2 x 128 tokens": dict(n_layer=2, n_embd=64, n_head=2, vocab=32000, positions=128,
                                               batch=2, seq=128),
    "2 layers, width 128, 4 x 128 tokens": dict(n_layer=2, n_embd=128, n_head=4, vocab=32000, positions=128,
                                                batch=4, seq=128),
}


def built(make, model, kwargs):
    """(module, its plan, seconds to build it and run its first step)."""
    t0 = time.perf_counter()
    module = make(copy.deepcopy(model))
    module(**kwargs).backward()  # remat.compile compiles at the first call
    return module, module.plan, time.perf_counter() - t0


def rows_for(label: str, cfg: dict, rounds: int) -> list[str]:
    import remat

    model, _, kwargs = gpt2(cfg)
    variants = {
        "compile, split off (before)": lambda m: remat.compile(m, budget="min", split="off", example_kwargs=kwargs,
                                                               cache=False, calibrate=False),
        "compile, split auto (now)": lambda m: remat.compile(m, budget="min", example_kwargs=kwargs, cache=False,
                                                             calibrate=False),
        "optimize, split auto": lambda m: remat.optimize(m, budget="min", cache=False, **kwargs),
    }
    made = {name: built(make, model, kwargs) for name, make in variants.items()}
    rows = []
    for name, (module, plan, seconds) in made.items():
        peak = measured_peak(module, lambda m=module: m(**kwargs).backward())
        chunks = plan.info.get("split", {}).get("chunks", 1)
        rows.append(f"| {label} | {name} | {chunks} | {mib(plan.peak_bytes, 2)} | {mib(peak, 2)} | "
                    f"{peak / plan.peak_bytes:.3f} | {seconds:.0f} |")
        log(rows[-1])
    unsplit, split = made["compile, split off (before)"][0], made["compile, split auto (now)"][0]
    _, _, ratios = time_against((unsplit, lambda: unsplit(**kwargs).backward()),
                                {"split": (split, lambda: split(**kwargs).backward())}, rounds=rounds, alternate=True)
    before, now = made["compile, split off (before)"][1], made["compile, split auto (now)"][1]
    rows.append(f"| {label} | **now / before** | | **{now.peak_bytes / before.peak_bytes:.3f}** | | | "
                f"step **{ratios['split']:.3f}** |")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    a = parser.parse_args()
    process_setup()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = md_header(["model", "lowering, split", "chunks", "predicted MiB", "measured MiB", "measured / predicted",
                      "compile + plan + first step, s"])
    for label, cfg in list(CONFIGS.items())[: 1 if a.quick else None]:
        rows += rows_for(label, cfg, rounds=3 if a.quick else 7)
    write_report("split_compiled_min", "The smallest budget under remat.compile, with splits", started,
                 "`budget=\"min\"`, `auto`, `profile` costs, no calibration (the plan as made). Peaks: the step's "
                 "growth over its start (allocator, one step after a warm-up). The last row of each model: the split "
                 "plan's predicted peak over the unsplit one's, and its measured step over the unsplit plan's "
                 "(median of per-round ratios, alternating rounds).", rows, save=not a.quick)


if __name__ == "__main__":
    main()

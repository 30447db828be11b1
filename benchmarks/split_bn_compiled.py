"""BatchNorm CNNs split under ``remat.compile`` (Inductor), against the unsplit step and the eager backend.

Run: ``.venv/bin/python benchmarks/split_bn_compiled.py [--quick] [--models convbn,cnn_bn,resnet18]`` (writes
``benchmarks/split_bn_compiled.md`` for the default models, ``convbn,cnn_bn``; prints only for others).

Inductor decomposes a training batch norm before remat sees the step: a ``var_mean`` over the batch
and the image, and in the backward two sums over them. remat splits those in stages (each chunk's
statistics combined, then each chunk normalised; the sums' totals read by the chunks of the next
stage), with Inductor's max pooling and its ``scatter_add`` backward. Before, such a step stopped at
its floor as captured under ``remat.compile``. Here, in one process per model: the smallest budget
(``budget="min"``) with ``split="off"`` (the behaviour before) and ``split="auto"``; a fraction below
the unsplit floor under ``remat.compile`` and, for reference, under ``remat.optimize`` (remat's own
lowering, which keeps each batch norm whole and splits it in two passes). Reported: chunks, predicted
and measured peak (allocator growth of one step after a warm-up), the fraction of the unsplit
store-all peak, the time to compile, plan and run the first step, and the measured step against the
unsplit smallest plan's (median of per-round ratios, alternating rounds).
"""

from __future__ import annotations

import argparse
import copy
import time

from common import log, md_header, measured_peak, mib, process_setup, time_against, write_report


def conv_bn():
    """The test suite's ConvBN (``remat.models.small``): a stem, max pooling, one residual block with
    BatchNorm, a classifier."""
    import torch

    from remat.models.small import ConvBN

    torch.manual_seed(0)
    return ConvBN(), (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))


def zoo_model(name: str):
    """A zoo CNN with its loss folded in (one tensor argument)."""
    from remat import models as zoo

    ex = zoo.build(name, size="small")
    return ex.loss_module(), tuple(ex.args)


MODELS = {  # key -> (label, builder)
    "convbn": ("ConvBN (16 x 3 x 32 x 32, three batch norms)", conv_bn),
    "cnn_bn": ("zoo `cnn_bn` small (16 x 3 x 64 x 64)", lambda: zoo_model("cnn_bn")),
    "resnet18": ("zoo `resnet18` small (128 x 3 x 64 x 64)", lambda: zoo_model("resnet18")),
}
DEFAULT_MODELS = "convbn,cnn_bn"  # the report's; ResNet-18 takes most of an hour on 2 cores
FRACTION = 0.5  # the README's headline budget


def built(make, model, args):
    """(module, its plan, seconds to build it and run its first step), or the error's first line."""
    import remat

    t0 = time.perf_counter()
    try:
        module = make(copy.deepcopy(model))
        module(*args).backward()  # remat.compile compiles at the first call
    except remat.InfeasibleBudgetError as err:
        return None, str(err).split(". ")[0], time.perf_counter() - t0
    return module, module.plan, time.perf_counter() - t0


def rows_for(label: str, build, rounds: int) -> list[str]:
    import remat

    model, args = build()
    variants = {
        "compile, `min`, split off (before)": lambda m: remat.compile(m, *args, budget="min", split="off", cache=False,
                                                                     calibrate=False),
        "compile, `min`, split auto (now)": lambda m: remat.compile(m, *args, budget="min", cache=False,
                                                                   calibrate=False),
        f"compile, {FRACTION}, split auto (now)": lambda m: remat.compile(m, *args, budget=FRACTION, cache=False,
                                                                          calibrate=False),
        f"optimize, {FRACTION}, split auto": lambda m: remat.optimize(m, *args, budget=FRACTION, cache=False),
    }
    made = {}
    for name, make in variants.items():
        made[name] = built(make, model, args)
        log(f"{label} / {name}: {made[name][2]:.0f} s")
    store_all = remat.compile(copy.deepcopy(model), *args, solver="store_all", split="off", cache=False,
                              calibrate=False)
    store_all(*args).backward()
    rows = []
    for name, (module, plan, seconds) in made.items():
        if module is None:
            rows.append(f"| {label} | {name} | refused: {plan} | | | | {seconds:.0f} |")
            continue
        peak = measured_peak(module, lambda m=module: m(*args).backward())
        chunks = plan.info.get("split", {}).get("chunks", 1)
        rows.append(f"| {label} | {name} | {chunks} | {mib(plan.peak_bytes, 2)} / {mib(peak, 2)} | "
                    f"{plan.peak_bytes / store_all.plan.peak_bytes:.3f} | {plan.step_overhead:+.1%} | {seconds:.0f} |")
        log(rows[-1])
    base = made["compile, `min`, split off (before)"][0]
    timed = {name: (module, lambda m=module: m(*args).backward()) for name, (module, _, _) in made.items()
             if module is not None and name.startswith("compile") and module is not base}
    _, _, ratios = time_against((base, lambda: base(*args).backward()), timed, rounds=rounds, alternate=True)
    rows.append(f"| {label} | **measured step / unsplit `min`'s** | | | | | "
                + ", ".join(f"{name.split(', split')[0].removeprefix('compile, ')}: **{r:.3f}**"
                            for name, r in ratios.items() if r is not None) + " |")
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated, of {', '.join(MODELS)}")
    a = parser.parse_args()
    keys = a.models.split(",")
    if unknown := [k for k in keys if k not in MODELS]:
        parser.error(f"unknown models {unknown}: choose among {', '.join(MODELS)}")
    process_setup()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = md_header(["model", "lowering, budget, split", "chunks", "predicted / measured MiB",
                      "of store-all's predicted peak", "predicted overhead", "compile + plan + first step, s"])
    for key in keys[: 1 if a.quick else None]:
        label, build = MODELS[key]
        rows += rows_for(label, build, rounds=3 if a.quick else 7)
    write_report("split_bn_compiled", "BatchNorm CNNs split under remat.compile", started,
                 "`auto`, `profile` costs, no calibration (the plan as made). Peaks: the step's growth over its "
                 "start (allocator, one step after a warm-up); the fraction is of the unsplit step's store-all "
                 "peak under Inductor. The last row of each model: each compiled plan's measured step over the "
                 "unsplit smallest plan's (median of per-round ratios, alternating rounds).", rows,
                 save=not a.quick and a.models == DEFAULT_MODELS)


if __name__ == "__main__":
    main()

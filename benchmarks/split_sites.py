"""Each split site in its own chunk count: ``auto`` with and without per-site counts, side by side.

Run: ``.venv/bin/python benchmarks/split_sites.py [--quick]`` (writes ``benchmarks/split_sites.md``).

A step with several split sites (BatchNorm CNNs: the stem at full resolution, later layers at a quarter
of the bytes or less) was split into one chunk count for all its sites. Now, once ``split="auto"`` has
chosen a count ``k``, the same step with each site in the fewest chunks whose chunks are no larger than
the largest site's (``remat.capture.split_choice.site_chunks``) is planned too, and taken where its
predicted step is no slower. Here, in one process and at the same budgets (the smallest, and fractions
of the unsplit step's store-all peak that no plan of the unsplit step reaches), ``auto`` plans each model twice: with
that choice turned off (one count for all sites: the behaviour before) and on. Reported: the counts,
the predicted peak and step, the measured peak, and the measured step time of the per-site plan against
the one-count plan (median of the per-round ratios of alternating rounds). Where both choose the same
plan the step is not timed.
"""

from __future__ import annotations

import argparse
import copy
import time

from common import log, md_header, measured_peak, mib, process_setup, time_against, write_report


def models(quick: bool):
    """(label, model with its loss, args): the zoo's models whose steps have several sites: its BatchNorm
    CNN (ResNet-18's step has one site, the U-Net's none)."""
    from remat import models as zoo

    out = []
    for name, size in (("cnn_bn", "tiny" if quick else "small"),):
        ex = zoo.build(name, size=size)
        out.append((f"{name} (`{size}`, batch {ex.args[0].shape[0]})", ex.loss_module(), ex.args))
    return out


def one_count(chosen, sites, plan_for, smallest=False):
    """``graded_chunks`` turned off: the count ``split="auto"`` chose, for every site."""
    return chosen


def rows_for(label, model, args, fractions, rounds, *, chooser=None, make=None, peak_of=None, step_digits=0):
    """Table rows: at each budget, ``model`` planned with per-site counts turned off and on (``chooser``:
    the module whose ``graded_chunks`` the lowering calls, the eager backend by default; ``make(model,
    fraction)``: the wrapped module, ``remat.optimize`` by default; ``peak_of(wrapped)``: its measured
    peak), then the measured step of the two against each other where they differ."""
    import remat
    import remat.backend as backend

    chooser = chooser or backend
    make = make or (lambda m, fraction: remat.optimize(m, *args, budget=fraction, cache=False))
    peak_of = peak_of or (lambda w: measured_peak(w, lambda: w(*args).backward()))
    rows = []
    graded = chooser.graded_chunks
    for fraction in fractions:
        built = {}
        for variant, choice in (("one count", one_count), ("per site", graded)):
            chooser.graded_chunks = choice
            t0 = time.perf_counter()
            try:
                built[variant] = (make(copy.deepcopy(model), fraction), time.perf_counter() - t0)
            except remat.InfeasibleBudgetError as err:
                log(f"{label} at {fraction}: {variant}: infeasible ({err.min_budget_bytes} bytes)")
            finally:
                chooser.graded_chunks = graded
        if len(built) < 2:
            rows.append(f"| {label} | {fraction} | infeasible | | |")
            continue
        cells = []
        for variant, (wrapped, seconds) in built.items():
            split = wrapped.plan.info.get("split", {})
            counts = split.get("site_chunks") or [split.get("chunks", 1)] * len(split.get("sites", [None]))
            cells.append(f"{counts}, {mib(wrapped.plan.peak_bytes)} / {mib(peak_of(wrapped))} MiB, "
                         f"{wrapped.plan.simulation.step_seconds * 1e3:.{step_digits}f} ms, {seconds:.0f} s")
        one, per = built["one count"][0], built["per site"][0]
        if one.plan.info.get("split") == per.plan.info.get("split"):
            ratio = "same plan"
        else:
            _, _, ratios = time_against((one, lambda: one(*args).backward()),
                                        {"per": (per, lambda: per(*args).backward())}, rounds=rounds)
            ratio = f"**{ratios['per']:.3f}**"
        rows.append(f"| {label} | {fraction} | {cells[0]} | {cells[1]} | {ratio} |")
        log(rows[-1])
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    a = parser.parse_args()
    process_setup()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = md_header(["model", "budget (fraction)", "one count: chunks per site, predicted / measured peak, "
                      "predicted step, plan time", "per site: the same", "measured step, per site / one count"])
    for label, model, args in models(a.quick):
        rows += rows_for(label, model, args, (0.3,) if a.quick else ("min", 0.2, 0.3, 0.4), rounds=3 if a.quick else 5)
    write_report("split_sites", "Split sites in their own chunk counts", started,
                 "`auto`, `split=\"auto\"`, `profile` costs; budgets: the smallest, and fractions of the unsplit "
                 "step's store-all peak below what its plans reach, so every plan here splits. Chunks per site: the "
                 "largest site first. Peaks: predicted / measured (allocator, one step).", rows, save=not a.quick)


if __name__ == "__main__":
    main()

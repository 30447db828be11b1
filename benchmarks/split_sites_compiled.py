"""Each split site in its own chunk count under ``remat.compile`` (Inductor), with and without, side by side.

Run: ``.venv/bin/python benchmarks/split_sites_compiled.py [--quick]`` (writes ``benchmarks/split_sites_compiled.md``).

The Inductor partitioner weighs per-site counts as the eager backend does (``benchmarks/split_sites.py``):
once ``split="auto"`` has chosen a count ``k`` for a step below its floor as captured (or for speed), the
same step with each site in the fewest chunks of the largest site's grain is captured, fused and planned
by the quick planner, and taken where its predicted step is no slower. When this was written BatchNorm
did not split under Inductor (it does since ``benchmarks/split_bn_compiled.py``), so the model is a token MLP with a residual and a classification
head over a wider vocabulary: two sites over the same rows, the head's values 4x the MLP's (16x its
width, 4x the MLP's hidden width). Budgets: fractions of the unsplit step's store-all peak that the
unsplit step cannot reach, or reaches only with much recomputation. Reported per budget: the counts, predicted and measured peak
(``remat.inductor.measured_step_peak``), the predicted step, the time to compile and plan, and the
measured step of the per-site plan against the one-count plan (median of per-round ratios,
alternating rounds).
"""

from __future__ import annotations

import argparse
import time

import split_sites
from common import md_header, process_setup, write_report


def mlp_and_head(d: int, vocab: int, batch: int, seq: int):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class MLPAndHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down, self.head = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.Linear(d, vocab)

        def forward(self, x, target):
            x = x + self.down(F.gelu(self.up(x)))
            return F.cross_entropy(self.head(x).flatten(0, 1), target.flatten())

    torch.manual_seed(0)
    args = (torch.randn(batch, seq, d), torch.randint(0, vocab, (batch, seq)))
    return f"MLP + head (width {d}, vocabulary {vocab}, {batch} x {seq} tokens)", MLPAndHead(), args


def rows_for(label, model, args, fractions, rounds):
    """``split_sites.rows_for`` under ``remat.compile``: the partitioner's per-site choice turned off and on."""
    import remat
    import remat.inductor.partition as partition
    from remat.inductor import measured_step_peak

    return split_sites.rows_for(
        label, model, args, fractions, rounds, chooser=partition, step_digits=1,
        make=lambda m, fraction: remat.compile(m, *args, budget=fraction, cache=False, calibrate=False),
        peak_of=lambda compiled: measured_step_peak(compiled, args, {}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    a = parser.parse_args()
    process_setup()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = md_header(["model", "budget (fraction)", "one count: chunks per site, predicted / measured peak, "
                      "predicted step, compile and plan time", "per site: the same",
                      "measured step, per site / one count"])
    configs = [(32, 512, 4, 256)] if a.quick else [(32, 512, 4, 256), (64, 1024, 4, 512)]
    for d, vocab, batch, seq in configs:
        label, model, args = mlp_and_head(d, vocab, batch, seq)
        rows += rows_for(label, model, args, (0.7,) if a.quick else (0.6, 0.7, 0.8), rounds=3 if a.quick else 7)
    write_report("split_sites_compiled", "Split sites in their own chunk counts under remat.compile", started,
                 "`remat.compile`, `auto`, `split=\"auto\"`, Inductor's cost model, no calibration (the plan as made); "
                 "budgets: fractions of the unsplit step's store-all peak, below what its plans reach or where they "
                 "recompute much (a `[1]` row: the step fitted as captured). Chunks per site: the head first. Peaks: predicted / measured (allocator, one step "
                 "after a warm-up).", rows, save=not a.quick)


if __name__ == "__main__":
    main()

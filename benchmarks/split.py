"""Below the single-operator floor: the LM head and its loss split into row chunks.

Run: ``.venv/bin/python benchmarks/split.py [--quick]`` (writes ``benchmarks/split.md``).

1. **Smallest budget** (``budget="min"``, predicted peak; the split plan's measured peak beside it)
   on a GPT-2 of the zoo with a 32,000-token vocabulary (4 layers, width 256, 4 x 256 tokens: the
   logits alone are 131 MB): recomputation only (``hierarchical``), recomputation and offload
   (``hybrid``), recomputation with splits (``hierarchical``, 4 to 32 chunks, the best), and ``auto``
   with ``split="auto"`` (every planner, the split factor its own choice).
2. **Step time at a budget both reach**: the unsplit plan at its smallest budget against the split
   plan at the same budget, measured in alternating rounds (ratio of medians per round).
3. **The LM head and its loss alone** (linear 256 -> 32,000 over 2,048 rows, cross-entropy): measured
   peak and step time of eager PyTorch, ``F.linear_cross_entropy``'s chunked path (torch 2.13),
   ``torch.compile`` with and without Inductor's auto-chunker, and remat's split plans.

``--faster`` (writes ``benchmarks/split_faster.md``): ``split="auto"`` at budgets the step fits unsplit with
recomputation, against ``split="off"``: chunks chosen, predicted overheads, measured peaks and step times.
``--faster-compiled`` (writes ``benchmarks/split_faster_compiled.md``): the same with ``remat.compile``.

``--blocks`` (writes ``benchmarks/split_blocks.md``): ResNet-18 and ``cnn_bn`` of the zoo (BatchNorm,
split in two passes over chunks of images), a ``scaled_dot_product_attention`` block and an
``nn.MultiheadAttention`` block: the smallest budget without and with splits, whether a fraction of
0.5 fits, the split plan's measured peak and gradients, step time at the unsplit minimum.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time

from common import (HERE, git_revision, gpt2, log, machine_facts, md_header, measured_peak, mib, process_setup,
                    time_against)

GPT2_32K = dict(n_layer=4, n_embd=256, n_head=4, vocab=32000, positions=256, batch=4, seq=256)
GPT2_QUICK = dict(GPT2_32K, n_layer=2, batch=2, seq=128)
FACTORS = (4, 8, 16, 32)


def plan_min(model, kwargs, **options):
    import remat

    t0 = time.perf_counter()
    plan = remat.plan(model, **kwargs, budget="min", cache=False, **options)
    return plan, time.perf_counter() - t0


def smallest_budgets(model, kwargs):
    rows = md_header(["planner", "smallest budget", "x recompute-only", "x store_all", "chunks", "plan time"])
    store = plan_min(model, kwargs, solver="store_all")[0]
    runs = {"recomputation only (hierarchical)": plan_min(model, kwargs, solver="hierarchical", split="off"),
            "recomputation + offload (hybrid)": plan_min(model, kwargs, solver="hybrid", split="off")}
    best = None
    for k in FACTORS:
        plan, seconds = plan_min(model, kwargs, solver="hierarchical", split=k)
        log(f"hierarchical split={k}: {mib(plan.peak_bytes)} MiB")
        if best is None or plan.peak_bytes < best[0].peak_bytes:
            best = (plan, seconds)
    runs["recomputation + splits (hierarchical, best of 4-32 chunks)"] = best
    runs["auto, split='auto'"] = plan_min(model, kwargs)
    recompute = runs["recomputation only (hierarchical)"][0].peak_bytes
    for label, (plan, seconds) in runs.items():
        chunks = plan.info.get("split", {}).get("chunks", "-")
        rows.append(f"| {label} | {mib(plan.peak_bytes)} MiB | {plan.peak_bytes / recompute:.3f} | "
                    f"{plan.peak_bytes / store.peak_bytes:.3f} | {chunks} | {seconds:.1f} s |")
        log(rows[-1])
    return rows, runs, store


def measured_rows(model, kwargs, runs):
    """The measured peak of the smallest split plan, and both plans' step time at the unsplit minimum."""
    import remat

    unsplit = runs["recomputation only (hierarchical)"][0]
    auto = runs["auto, split='auto'"][0]
    chunks = auto.info.get("split", {}).get("chunks", "off")
    smallest = remat.optimize(copy.deepcopy(model), **kwargs, budget=auto.peak_bytes, split=chunks, cache=False)
    peak = measured_peak(smallest, lambda: smallest(**kwargs).backward())
    rows = ["", "Measured (allocator peak of one step) against predicted, `auto`'s smallest split plan "
            f"({chunks} chunks): measured {mib(peak)} MiB, predicted {mib(smallest.plan.peak_bytes)} MiB "
            f"({peak / smallest.plan.peak_bytes - 1:+.1%}).", ""]
    budget = unsplit.peak_bytes
    plain = remat.optimize(copy.deepcopy(model), **kwargs, budget=budget, solver="hierarchical", cache=False)
    split = remat.optimize(copy.deepcopy(model), **kwargs, budget=budget, solver="hierarchical", split=8, cache=False)
    base, medians, ratios = time_against((plain, lambda: plain(**kwargs).backward()),
                                         {"split": (split, lambda: split(**kwargs).backward())}, rounds=5)
    rows += [f"At the unsplit plan's smallest budget ({mib(budget)} MiB), both planned by `hierarchical` "
             f"(recomputation only): unsplit (predicted overhead {plain.plan.step_overhead:+.1%}) {base * 1e3:.0f} ms "
             f"per step, split into 8 chunks ({split.plan.step_overhead:+.1%}) {medians['split'] * 1e3:.0f} ms: "
             f"ratio **{ratios['split']:.3f}** (median of 5 alternating rounds).", ""]
    return rows


def faster_rows(model, kwargs, rounds: int = 5, compiled: bool = False):
    """``split="auto"`` at budgets the step fits unsplit with recomputation: what it chooses (split where a
    split plan is predicted faster) against ``split="off"``, both by ``auto``: predicted overheads, plan
    times, measured peaks and step time (median ratio of alternating rounds). ``compiled``: the same with
    ``remat.compile`` (Inductor; its budgets of the fused step, calibration off)."""
    import remat

    if compiled:
        def build(budget, **options):
            return remat.compile(copy.deepcopy(model), budget=budget, example_kwargs=kwargs, cache=False,
                                 calibrate=False, **options)
        unsplit_min = build("min", split="off").plan.info["budget_bytes"]
    else:
        def build(budget, **options):
            return remat.optimize(copy.deepcopy(model), **kwargs, budget=budget, cache=False, **options)
        unsplit_min = remat.plan(model, **kwargs, budget="min", split="off", cache=False).peak_bytes
    rows = md_header(["budget", "`split='off'`: overhead, plan time", "`split='auto'`: chunks, overhead, plan time",
                      "measured peak off / auto", "step auto / off"])
    for factor in (1.0, 1.1, 1.25):
        budget = int(unsplit_min * factor)
        t0 = time.perf_counter()
        off = build(budget, split="off")
        t_off = time.perf_counter() - t0
        t0 = time.perf_counter()
        auto = build(budget)
        t_auto = time.perf_counter() - t0
        peaks = [measured_peak(m, lambda m=m: m(**kwargs).backward()) for m in (off, auto)]
        chunks = auto.plan.info.get("split", {}).get("chunks", "-")
        if chunks == "-":
            ratio = "same plan"
        else:
            _, _, ratios = time_against((off, lambda: off(**kwargs).backward()),
                                        {"auto": (auto, lambda: auto(**kwargs).backward())}, rounds=rounds)
            ratio = f"**{ratios['auto']:.3f}**"
        rows.append(f"| {mib(budget)} MiB ({factor:.2f}x the unsplit minimum) | {off.plan.step_overhead:+.1%}, "
                    f"{t_off:.1f} s | {chunks}, {auto.plan.step_overhead:+.1%}, {t_auto:.1f} s | "
                    f"{mib(peaks[0])} / {mib(peaks[1])} MiB | {ratio} |")
        log(rows[-1])
    return rows


def head_rows(rows_n: int, hidden: int, vocab: int):
    import torch
    import torch.nn.functional as F
    from torch import nn

    import remat

    class LMHead(nn.Module):
        def __init__(self, chunked=None):
            super().__init__()
            self.pre = nn.Linear(hidden, hidden)  # so that the head's input has a gradient
            self.proj = nn.Linear(hidden, vocab, bias=False)
            self.chunked = chunked

        def forward(self, x, target):
            h = self.pre(x)
            if self.chunked is None:
                return F.cross_entropy(self.proj(h), target)
            return F.linear_cross_entropy(h, self.proj.weight, target, options=self.chunked)

    torch.manual_seed(0)
    x, target = torch.randn(rows_n, hidden), torch.randint(0, vocab, (rows_n,))
    eager = LMHead()
    variants = {"eager (linear + cross_entropy)": eager,
                "F.linear_cross_entropy, chunked": copy.deepcopy(eager)}
    variants["F.linear_cross_entropy, chunked"].chunked = torch.nn.LinearCrossEntropyOptions()
    steps = {k: (m, (lambda m=m: m(x, target).backward())) for k, m in variants.items()}
    for label, options in (("torch.compile (Inductor)", {}),
                           ("torch.compile, Inductor's auto-chunker", {"auto_chunker.enable": True})):
        compiled = torch.compile(copy.deepcopy(eager), options=options)
        steps[label] = (compiled, (lambda m=compiled: m(x, target).backward()))
    peaks = {k: measured_peak(m, s) for k, (m, s) in steps.items()}
    chunked_peak = peaks["F.linear_cross_entropy, chunked"]
    refused: list[str] = []
    for label, options in ((f"remat auto at the chunked op's peak ({mib(chunked_peak)} MiB)", dict(budget=chunked_peak)),
                           ("remat auto, smallest budget", dict(budget="min")),
                           ("remat hierarchical (recompute only), 8 chunks, smallest budget",
                            dict(budget="min", solver="hierarchical", split=8))):
        try:
            plan = remat.plan(eager, x, target, cache=False, **options)
        except remat.InfeasibleBudgetError as err:
            refused.append(f"{label}: no plan fits; remat's smallest budget for the head alone is "
                           f"{mib(err.min_budget_bytes)} MiB.")
            log(refused[-1])
            continue
        chunks = plan.info.get("split", {}).get("chunks", "off")
        module = remat.optimize(copy.deepcopy(eager), x, target, budget=plan.peak_bytes, split=chunks,
                                solver=plan.solver, cache=False)
        key = f"{label}: {chunks} chunks, {plan.solver}"
        steps[key] = (module, (lambda m=module: m(x, target).backward()))
        peaks[key] = measured_peak(*steps[key])
        log(f"{key}: predicted {mib(plan.peak_bytes)} MiB, measured {mib(peaks[key])} MiB")
    rows = md_header(["LM head + loss", "measured peak", "x eager", "step", "x eager"])
    names = list(steps)
    base, medians, ratios = time_against(steps[names[0]], {k: steps[k] for k in names[1:]}, rounds=5)
    for k in names:
        t = base if k == names[0] else medians[k]
        r = 1.0 if k == names[0] else ratios[k]
        rows.append(f"| {k} | {mib(peaks[k])} MiB | {peaks[k] / peaks[names[0]]:.3f} | {t * 1e3:.0f} ms | {r:.3f} |")
        log(rows[-1])
    return rows + ([""] + refused if refused else [])


def block_models(quick: bool):
    """(label, model, args): two BatchNorm CNNs of the zoo and two attention blocks."""
    import torch
    from remat import models as zoo
    from remat.models.small import MHABlock, SDPABlock

    size = "tiny" if quick else "small"
    out = []
    for name in ("resnet18", "cnn_bn"):
        ex = zoo.build(name, size=size)
        out.append((f"{name} (`{size}`, batch {ex.args[0].shape[0]})", ex.loss_module(), ex.args))
    torch.manual_seed(0)
    batch, seq, dim = (4, 64, 64) if quick else (8, 256, 128)
    x = torch.randn(batch, seq, dim)
    out.append((f"SDPA block (width {dim}, {batch} x {seq} tokens)", SDPABlock(dim, 4), (x,)))
    out.append((f"`nn.MultiheadAttention` block (width {dim}, {batch} x {seq} tokens)", MHABlock(dim, 4), (x,)))
    return out


def gradient_errors(model, args, wrapped) -> tuple[float, float]:
    """The largest gradient error of eager float32 and of ``wrapped`` (a step runs) against a float64
    eager step, each relative to the reference tensor's largest entry."""

    def grads(module, inputs):
        module.zero_grad(set_to_none=True)
        module(*inputs).backward()
        return {n: p.grad.double() for n, p in module.named_parameters() if p.grad is not None}

    reference = grads(copy.deepcopy(model).double(), [a.double() if a.is_floating_point() else a for a in args])

    def error(got):
        return max(float((got[n] - r).abs().max() / r.abs().max()) for n, r in reference.items() if r.abs().max() > 0)
    return error(grads(copy.deepcopy(model), args)), error(grads(wrapped, args))


def block_rows(quick: bool):
    """Per model: smallest budgets without and with splits, the split plan measured, its gradients
    against eager's, and step time at the unsplit minimum."""
    import remat
    from remat.api import capture_and_plan
    from remat.budget import fixed_bytes, fraction_to_bytes

    rows = md_header(["model", "store_all", "recompute only (`auto`)", "+ offload (`hybrid`)",
                      "with splits (`keep_set`, best k)", "x recompute-only", "0.5 feasible", "split plan time"])
    notes = []
    for label, model, args in block_models(quick):
        store, captured = capture_and_plan(model, *args, solver="store_all", split="off", cache=False)
        half = fraction_to_bytes(0.5, store.peak_bytes, fixed_bytes(captured.graph))
        recompute = remat.plan(model, *args, budget="min", split="off", cache=False)
        hybrid = remat.plan(model, *args, budget="min", solver="hybrid", split="off", cache=False)
        best, seconds = None, 0.0
        for k in (2, 4, 8, 16):
            t0 = time.perf_counter()
            plan = remat.plan(model, *args, budget="min", solver="keep_set", split=k, cache=False)
            seconds += time.perf_counter() - t0
            log(f"{label}: keep_set split={k}: {mib(plan.peak_bytes)} MiB")
            if best is None or plan.peak_bytes < best.peak_bytes * 0.98:
                best = plan
        k = best.info.get("split", {}).get("chunks", "off")  # "off": no split site found
        rows.append(f"| {label} | {mib(store.peak_bytes)} MiB | {mib(recompute.peak_bytes)} MiB | "
                    f"{mib(hybrid.peak_bytes)} MiB | {mib(best.peak_bytes)} MiB ({k} chunks) | "
                    f"**{best.peak_bytes / recompute.peak_bytes:.3f}** | "
                    f"{'yes' if best.peak_bytes <= half else 'no'} (0.5 = {mib(half)} MiB) | {seconds:.1f} s |")
        log(rows[-1])
        # the smallest split plan, run: measured peak, gradients against eager
        wrapped = remat.optimize(copy.deepcopy(model), *args, budget=best.peak_bytes, solver="keep_set", split=k,
                                 cache=False)
        peak = measured_peak(wrapped, lambda: wrapped(*args).backward())
        wrapped.zero_grad(set_to_none=True)
        errors = gradient_errors(model, args, wrapped)
        # step time at the unsplit recompute-only minimum: that plan against a split one
        budget = recompute.peak_bytes
        plain = remat.optimize(copy.deepcopy(model), *args, budget=budget, split="off", cache=False)
        split = remat.optimize(copy.deepcopy(model), *args, budget=budget, solver="keep_set", split=4, cache=False)
        base, medians, ratios = time_against((plain, lambda: plain(*args).backward()),
                                             {"split": (split, lambda: split(*args).backward())}, rounds=5)
        notes.append(f"- {label}: the smallest split plan measured {mib(peak)} MiB against {mib(best.peak_bytes)} "
                     f"predicted ({peak / best.peak_bytes - 1:+.1%}); gradients' largest error against a float64 eager "
                     f"step (of the tensor's largest entry): eager float32 {errors[0]:.1e}, split {errors[1]:.1e}; at the unsplit minimum ({mib(budget)} MiB) the "
                     f"4-chunk `keep_set` plan's step takes **{ratios['split']:.2f}x** `auto`'s unsplit plan's "
                     f"({base * 1e3:.0f} ms, median of 5 alternating rounds).")
        log(notes[-1])
    return rows, notes


def optimizer_rows(quick: bool):
    """The smallest budget of the 32k GPT-2 with its LM head split, without and with AdamW (fused)
    updating each parameter inside the backward; measured peaks (the optimizer's state made by the
    warm-up steps, outside the step like the parameters) and the updates' agreement with eager."""
    import torch

    import remat

    cfg = GPT2_QUICK if quick else GPT2_32K
    model, _, kwargs = gpt2(cfg)
    gradients = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = md_header(["step", "smallest budget (predicted)", "x recompute-only", "measured", "measured / predicted",
                      "plan time"])
    runs = {}
    for label, split, with_optimizer in (("recomputation only (hierarchical)", "off", False),
                                        ("+ splits (hierarchical, 32 chunks)", 32, False),
                                        ("+ splits + AdamW inside the backward", 32, True)):
        planned = copy.deepcopy(model)
        opt = torch.optim.AdamW(planned.parameters(), lr=1e-4, fused=True) if with_optimizer else None
        t0 = time.perf_counter()
        m = remat.optimize(planned, budget="min", solver="hierarchical", split=split, optimizer=opt, cache=False,
                           **kwargs)
        seconds = time.perf_counter() - t0

        def step():
            torch.manual_seed(0)
            m(**kwargs).backward()

        step()  # the optimizer's state, made by the first update
        step()
        peak = measured_peak(None if with_optimizer else planned, step)
        runs[label] = (m.plan, peak, seconds)
    recompute = runs["recomputation only (hierarchical)"][0].peak_bytes
    for label, (plan, peak, seconds) in runs.items():
        rows.append(f"| {label} | {mib(plan.peak_bytes)} MiB | {plan.peak_bytes / recompute:.3f} | {mib(peak)} MiB | "
                    f"{peak / plan.peak_bytes:.4f} | {seconds:.1f} s |")
        log(rows[-1])
    notes = [f"The parameters' gradients are {mib(gradients)} MiB "
             f"({gradients / recompute:.3f} x the recompute-only minimum)."]
    return rows, notes


def max_batch_rows(limit: int, start: int = 1, max_batch: int = 40, only: set[str] | None = None):
    """``remat.max_batch_size`` on the 32k-vocabulary GPT-2 (sequence 256) under ``limit`` bytes of step
    memory (parameters, batch and the step; no optimizer state): plain PyTorch, remat without splits,
    with them, and with them and AdamW (fused) updating each parameter inside the backward. ``only``:
    the methods to search, by key (``off``, ``auto``, ``adamw``; None: all)."""
    import torch

    import remat
    from remat import models as zoo

    def make_model():
        torch.manual_seed(0)
        return zoo._BUILDERS["gpt2"](**dict(GPT2_32K, batch=1))[0].train()

    def make_batch(n):
        _, args, kwargs = zoo._BUILDERS["gpt2"](**dict(GPT2_32K, batch=n))
        return args, kwargs

    def adamw(model):
        return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    rows = md_header(["method", "largest batch", "x plain PyTorch", "solver of the largest", "search time"])
    results = {}
    methods = [("off", "remat, split='off'", dict(split="off")), ("auto", "remat, split='auto'", {}),
               ("adamw", "remat, split='auto', AdamW inside the backward", dict(make_optimizer=adamw))]
    if start > 1:  # splits only: split='off' stays at plain PyTorch's batch
        methods = methods[1:]
    for key, label, options in methods:
        if only is not None and key not in only:
            continue
        t0 = time.perf_counter()
        result = remat.max_batch_size(make_model, make_batch, limit, compare_plain=not results, cache=False,
                                      start=start, max_batch=max_batch,
                                      on_try=lambda t: log(f"{t.method} batch {t.batch}: fits={t.fits} {t.reason}"),
                                      **options)
        results[label] = (result, time.perf_counter() - t0)
    plain = next(iter(results.values()))[0].plain_batch_size
    rows.append(f"| plain PyTorch | {plain} | 1.00 | - | - |")
    for label, (result, seconds) in results.items():
        chunks = (result.plan.info.get("split", {}).get("chunks", "-") if result.plan is not None else "-")
        rows.append(f"| {label} | {result.batch_size} | {result.batch_size / max(plain, 1):.2f} | "
                    f"{result.plan.solver if result.plan is not None else '-'}, {chunks} chunks | {seconds:.0f} s |")
        log(rows[-1])
    return rows


def report(title: str, started: str, lines: list[str], name: str | None) -> None:
    """Print a report headed by ``title`` and the run's provenance line; write it to ``benchmarks/name``
    (None: print only)."""
    text = "\n".join([f"# {title}", "",
                      f"`benchmarks/split.py {' '.join(sys.argv[1:])}` at {git_revision()}, {started}; "
                      f"{machine_facts()}.", "", *lines])
    if name is not None:
        (HERE / name).write_text(text)
    print(text)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--blocks", action="store_true",
                        help="only BatchNorm CNNs and attention blocks (writes benchmarks/split_blocks.md)")
    parser.add_argument("--optimizer", action="store_true",
                        help="only the smallest budget with the optimizer inside the backward (writes "
                             "benchmarks/split_optimizer.md)")
    parser.add_argument("--start", type=int, default=1, help="the largest-batch search's first batch")
    parser.add_argument("--max-batch", metavar="MiB", type=int, default=None,
                        help="only the largest-batch search under this many MiB (writes benchmarks/split_batch.md)")
    parser.add_argument("--upto", type=int, default=64, help="the largest-batch search's largest batch")
    parser.add_argument("--methods", default=None,
                        help="with --max-batch: only these methods, comma-separated (off, auto, adamw); the "
                             "report is then printed, not written")
    parser.add_argument("--faster", action="store_true",
                        help="only split='auto' where the step fits unsplit (writes benchmarks/split_faster.md)")
    parser.add_argument("--faster-compiled", action="store_true",
                        help="the same with remat.compile (writes benchmarks/split_faster_compiled.md)")
    a = parser.parse_args()
    process_setup()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cfg = GPT2_QUICK if a.quick else GPT2_32K

    def written(name: str) -> str | None:  # --quick runs print only
        return None if a.quick else name

    if a.faster or a.faster_compiled:
        model, _, kwargs = gpt2(cfg)
        rows = faster_rows(model, kwargs, compiled=a.faster_compiled)
        how = ("`remat.compile` (Inductor), `inductor` cost model, calibration off; budgets of the fused step"
               if a.faster_compiled else "`profile` cost model")
        report("Splitting where it is faster, not only where it is needed"
               + (" (Inductor)" if a.faster_compiled else ""), started, [
            f"GPT-2, {cfg['n_layer']} layers, width {cfg['n_embd']}, vocabulary {cfg['vocab']}, {cfg['batch']} x "
            f"{cfg['seq']} tokens; solver `auto`, {how}. At budgets the step fits as captured, "
            "`split='auto'` weighs split plans against the unsplit one when that one's predicted overhead is above "
            "2%, and takes a split plan predicted at least 2% faster. Overheads are predicted, each against its own "
            "step's store-all compute; peaks measured (allocator, one step); step times in 5 alternating rounds.", "",
            *rows, ""], written("split_faster_compiled.md" if a.faster_compiled else "split_faster.md"))
        return
    if a.blocks:
        rows, notes = block_rows(a.quick)
        report("Splits by image or sequence: BatchNorm CNNs and attention blocks", started, [
            "Smallest budget (`budget=\"min\"`, predicted peaks; `profile` cost model): the step as captured with "
            "recomputation only (`auto`, `split=\"off\"`) and with offload (`hybrid`); split into 2, 4, 8 and 16 "
            "chunks of whole images or sequences (BatchNorm in two passes), planned by `keep_set` (seconds; "
            "`auto` on these split graphs takes minutes, see the note), the best factor shown. "
            "\"0.5 feasible\": a fraction of 0.5 of the memory a plan can change fits.", "",
            *rows, "", *notes, ""], written("split_blocks.md"))
        return
    if a.optimizer:
        rows, notes = optimizer_rows(a.quick)
        report("The optimizer step inside the backward, with splits", started, [
            f"GPT-2, {cfg['n_layer']} layers, width {cfg['n_embd']}, vocabulary {cfg['vocab']}, {cfg['batch']} x "
            f"{cfg['seq']} tokens. Smallest budget (`budget=\"min\"`, `hierarchical`), predicted by the simulator; "
            "measured: the allocator's peak of the third step (the first two make the optimizer's state).", "",
            *rows, "", *notes, ""], written("split_optimizer.md"))
        return
    if a.max_batch is not None:
        report("Largest batch with splits", started, [
            f"GPT-2, {GPT2_32K['n_layer']} layers, width {GPT2_32K['n_embd']}, vocabulary {GPT2_32K['vocab']}, "
            f"sequence {GPT2_32K['seq']}; `remat.max_batch_size` under {a.max_batch} MiB of measured step memory "
            f"(parameters, batch and step; no optimizer state), solver `auto`, batches from {a.start} up to {a.upto}.", "",
            *max_batch_rows(a.max_batch * 2**20, a.start, a.upto, set(a.methods.split(",")) if a.methods else None), "",
            *(["`split='off'` is searched only from batch 1 (its largest batch was plain PyTorch's, 2, in the run "
               "at b91340b: the LM head sets both floors)."] if a.start > 1 else []), ""],
            None if a.methods else "split_batch.md")
        return
    model, _, kwargs = gpt2(cfg)
    log(f"GPT-2 {cfg}")
    rows, runs, store = smallest_budgets(model, kwargs)
    measured = measured_rows(model, kwargs, runs)
    log("\n".join(measured))
    report("Splitting the ops that set the peak", started, [
        f"## Smallest budget: GPT-2, {cfg['n_layer']} layers, width {cfg['n_embd']}, vocabulary {cfg['vocab']}, "
        f"{cfg['batch']} x {cfg['seq']} tokens", "",
        f"Predicted peaks (the simulator's; `profile` cost model). store_all peaks at {mib(store.peak_bytes)} MiB.", "",
        *rows, *measured,
        "## The LM head and its loss alone", "",
        *head_rows(512 if a.quick else 2048, 256, 32000), "",
        "BatchNorm CNNs and attention blocks: `benchmarks/split_blocks.md` (`--blocks`).", ""],
        written("split.md"))


if __name__ == "__main__":
    main()

"""remat as Inductor's partitioner (``remat.compile``) against Inductor's own partitioner, eager
PyTorch and per-block ``torch.utils.checkpoint``, at matched measured peaks, in one run.

Run: ``.venv/bin/python benchmarks/inductor.py [--quick] [--rounds R] [--device cpu|cuda]``
(writes ``benchmarks/inductor.md``, or ``benchmarks/inductor_cuda.md`` with ``--device cuda``; ``--out``
names another file; ``--quick`` is a smoke test on tiny models that writes nothing).

Models: the 8-layer GPT-2 of ``benchmarks/hierarchical.py`` (its ``SMALL`` config: d_model 256,
4 heads, sequence 256, batch 4, vocab 2000, dropout 0.1) and, as the CNN (``hierarchical.py`` has
none), ``remat.models``'s ``resnet18`` at size ``small`` (batch 128, 64x64 images, width 16) with a
cross-entropy loss. Both are called with positional inputs and return the scalar loss.

Methods, per model, every one measured in the same process and timed in the same rounds:

- **eager**: plain PyTorch.
- **inductor b**: ``torch.compile(backend="inductor")`` with its min-cut partitioner at
  ``torch._functorch.config.activation_memory_budget = b`` for b in 1.0 (Inductor's default),
  0.8, 0.6, 0.4, 0.2, 0.0.
- **checkpoint**: ``torch.utils.checkpoint`` (``use_reentrant=False``) around every block (GPT-2's
  transformer blocks, ResNet's residual blocks), eager and under ``torch.compile`` (inductor default).
- **remat**: ``remat.compile(model, *inputs, budget=B)``, with B each other compiled or
  checkpointed method's measured peak in bytes (matched peaks) and the fractions 1.0, 0.6, 0.5, 0.4, 0.35
  and ``"min"`` (the fractions trace the memory/time trade-off below the matched peaks, where the
  activation-reduction target lies; ``--fractions`` chooses others, each another compilation, and
  compiling dominates the run time). ``"min"`` is compiled with ``calibrate=False``: calibration re-plans below a budget the
  measured step exceeds, which below the smallest feasible budget has no plan. A plan whose predicted and measured peaks are both within a lower target is the planner's
  answer for that target too (the cheapest plan within the higher budget fits the lower one), so it
  is reused rather than compiled again; the tables say so.

Peak: ``remat.measure.peak_memory_growth`` (allocator method on the CPU, the allocator's peak on
CUDA) of one forward+backward, ``.grad`` set to None beforehand, in a separate untimed run.
**Activation memory** = peak − the parameter gradients the step produces (Σ numel·element_size of
the trainable parameters): what a method can change. Time: alternating rounds; in each round every
method runs right after (or, every other round, right before) one eager and one Inductor-default
step, and its ratios to those two neighbours are kept; the figures are medians over rounds.
Close calls (a remat point within ``CLOSE_CALL`` of the Inductor point whose peak it matched) are
then timed head to head: 21 rounds (``HEAD_TO_HEAD_ROUNDS``) of the two steps alone.
"""

from __future__ import annotations

import os

import common  # this folder is on the path

common.single_thread_env(omp=True, compile_threads=True)  # before torch is imported

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import remat  # noqa: E402
from remat import models as zoo  # noqa: E402
from remat.errors import InfeasibleBudgetError  # noqa: E402
from common import GPT2_8LAYER as GPT2_SMALL  # noqa: E402
from common import (  # noqa: E402
    alternating_rounds, compiled_step, git_revision, gpt2, grad_bytes, keep_freed_cpu_memory, log, machine_facts,
    make_step, md_header, measured_peak, median, mib, process_setup, publish, quiet, timed_step, write_json)

INDUCTOR_BUDGETS = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)
REMAT_FRACTIONS = (1.0, 0.6, 0.5, 0.4, 0.35, "min")  # --fractions for others (each is another compile)
ROUNDS = 7
OVERHEAD_LIMIT = 0.10  # "at <= 10% step time over Inductor's default"
CLOSE_CALL = 0.02  # matched points whose step ratios differ by less are also timed head to head
HEAD_TO_HEAD_ROUNDS = 21
TIGHTEST = 2  # Inductor's tightest points: its non-default points with the smallest measured peaks

GPT2_QUICK = dict(n_layer=2, n_embd=64, n_head=2, vocab=300, positions=64, batch=2, seq=64)
QUICK_INDUCTOR_BUDGETS = (1.0,)  # --quick: also no compiled checkpointing and no fractions


# ---------------------------------------------------------------------------------------------
# Models: positional inputs, scalar loss, and the blocks to checkpoint


class LMLoss(nn.Module):
    """A zoo GPT-2 (``LossOnly``) called as ``model(input_ids, labels)``."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=input_ids, labels=labels)

    def blocks(self) -> list[nn.ModuleList]:
        return [self.lm.model.transformer.h]


class ClassifierLoss(nn.Module):
    """An image classifier with its cross-entropy: ``model(images, targets)``."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y)

    def blocks(self) -> list[nn.Sequential]:
        return [getattr(self.net, f"layer{i + 1}") for i in range(self.net.stages)]


class Checkpointed(nn.Module):
    """``block`` run under ``torch.utils.checkpoint`` (non-reentrant): its activations are recomputed
    in the backward instead of saved."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        return torch.utils.checkpoint.checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def build(name: str, quick: bool, device: str) -> tuple[nn.Module, tuple, str]:
    """The model (train mode, on ``device``), its inputs and a one-line description; the same
    weights and inputs on every call."""
    if name == "gpt2":
        cfg = GPT2_QUICK if quick else GPT2_SMALL
        lm, _, kwargs = gpt2(cfg)
        model, args = LMLoss(lm), (kwargs["input_ids"], kwargs["labels"])
        desc = (f"GPT-2 (`transformers`, eager attention, dropout 0.1): {cfg['n_layer']} layers, d_model {cfg['n_embd']}, "
                f"{cfg['n_head']} heads, sequence {cfg['seq']}, batch {cfg['batch']}, vocab {cfg['vocab']}")
    else:
        size = "tiny" if quick else "small"
        ex = zoo.build("resnet18", size=size, seed=0)
        x = ex.args[0]
        y = torch.randint(0, 10, (x.shape[0],), generator=torch.Generator().manual_seed(0))
        model, args = ClassifierLoss(ex.model), (x, y)
        cfg = zoo._CONFIGS["resnet18"][size]
        desc = (f"ResNet-18 (`remat.models` `resnet18`, size {size}: BasicBlocks (2, 2, 2, 2), width {cfg['width']}, "
                f"BatchNorm), batch {cfg['batch']}, {cfg['image']}×{cfg['image']} images, cross-entropy over 10 classes")
    return model.to(device).train(), tuple(a.to(device) for a in args), desc


def with_checkpointed_blocks(model: nn.Module) -> nn.Module:
    for container in model.blocks():
        for i, block in enumerate(list(container)):
            container[i] = Checkpointed(block)
    return model


# ---------------------------------------------------------------------------------------------
# Points and measurement


@dataclass
class Point:
    """One configuration of one method on one model."""

    method: str  # "eager", "inductor", "checkpoint", "remat"
    label: str
    model: nn.Module | None  # whose .grad is cleared before each step
    step: Callable[[], None] | None
    compile_s: float = 0.0
    inductor_budget: float | None = None
    target: str = ""  # remat: what its budget is (a fraction, "min" or another point's peak)
    budget: int | None = None  # remat: the budget in bytes
    predicted: int | None = None  # remat: the plan's predicted peak
    calibration: str = ""
    reused_from: str = ""  # remat: the point whose compiled module it shares
    note: str = ""
    head_to_head: dict = field(default_factory=dict)  # remat: other point's label -> this step ÷ its, per round
    peak: int | None = None
    times: list[float] = field(default_factory=list)
    vs_eager: list[float] = field(default_factory=list)
    vs_inductor: list[float] = field(default_factory=list)

    @property
    def seconds(self) -> float | None:
        return median(self.times)

    @property
    def r_eager(self) -> float | None:
        return median(self.vs_eager)

    @property
    def r_inductor(self) -> float | None:
        return median(self.vs_inductor)

    def timer(self, device: str) -> Callable[[], float]:
        """Runs one step (``.grad`` None first) and returns its seconds."""
        return lambda: timed_step(self.model, self.step, device)


def compiled_point(model: nn.Module, args: tuple, label: str, tag: str, budget: float = 1.0, **extra) -> Point:
    """``torch.compile`` with inductor at ``activation_memory_budget=budget``, compiled now (by one step)."""
    step, seconds = compiled_step(model, args, None, tag, budget)
    return Point(extra.pop("method", "inductor"), label, model, step, compile_s=seconds, **extra)


def remat_point(model: nn.Module, args: tuple, label: str, target: str, budget) -> Point:
    """``remat.compile(model, *args, budget=budget)``; an infeasible budget gives a point with a note.

    ``"min"`` is compiled without calibration: calibration re-plans below the budget when the measured
    peak exceeds it, and below the smallest feasible budget there is no plan (remat.compile raises)."""
    t0 = time.perf_counter()
    calibrate = budget != "min"
    try:
        with quiet():
            m = remat.compile(model, *args, budget=budget, calibrate=calibrate)
    except InfeasibleBudgetError as err:
        return Point("remat", label, None, None, compile_s=time.perf_counter() - t0, target=target,
                     budget=budget if isinstance(budget, int) else None,
                     note=f"infeasible: remat's smallest budget is {mib(err.min_budget_bytes)} MiB")
    plan = m.plan
    return Point("remat", label, model, make_step(m, args), compile_s=time.perf_counter() - t0, target=target,
                 budget=plan.info.get("budget_bytes", plan.budget_bytes), predicted=plan.peak_bytes,
                 calibration=str(plan.info.get("calibration", "")),
                 note="" if calibrate else "compiled with calibrate=False")


def remat_points(model, args, targets: list[tuple[str, str, object]], device: str) -> list[Point]:
    """remat at each ``(label, target description, budget)``: fractions first, then byte budgets from
    the highest down, reusing a compiled plan whose predicted and measured peaks fit a lower target."""
    done: list[Point] = []
    for label, target, budget in targets:
        reuse = None
        if isinstance(budget, int):
            reuse = next((q for q in done if q.step is not None and q.budget is not None and q.budget >= budget
                          and max(q.predicted, q.peak) <= budget), None)
        if reuse is not None:
            p = Point("remat", label, reuse.model, reuse.step, target=target, budget=budget, predicted=reuse.predicted,
                      peak=reuse.peak, reused_from=reuse.label)
            log(f"  remat {label}: same plan as {reuse.label}")
        else:
            p = remat_point(model, args, label, target, budget)
            if p.step is not None:
                p.peak = measured_peak(p.model, p.step, device)
            log(f"  remat {label}: {p.compile_s:.0f} s; " + (f"{p.note}" if p.step is None else f"budget "
                f"{mib(p.budget)} MiB, predicted {mib(p.predicted)} MiB, measured {mib(p.peak)} MiB {p.note}"))
        done.append(p)
    return done


def time_rounds(eager: Point, default: Point, others: list[Point], rounds: int, device: str) -> None:
    """Each round, for every point: eager, Inductor default, the point (reversed every other round);
    the point's ratios to the eager and Inductor steps beside it are kept."""
    unique = [p for p in others if p.step is not None and not p.reused_from]
    samples = alternating_rounds([eager.timer(device), default.timer(device)], [p.timer(device) for p in unique],
                                 rounds, alternate=True, after_round=lambda r: log(f"  round {r + 1}/{rounds} done"))
    for r in range(rounds):
        for p, per in zip(unique, samples):
            te, ti, tp = per[r]
            eager.times.append(te)
            default.times.append(ti)
            default.vs_eager.append(ti / te)
            eager.vs_inductor.append(te / ti)
            p.times.append(tp)
            p.vs_eager.append(tp / te)
            p.vs_inductor.append(tp / ti)
    eager.vs_eager, default.vs_inductor = [1.0], [1.0]
    for p in others:  # reused plans share their source's timings
        if p.reused_from:
            src = next(q for q in others if q.label == p.reused_from)
            p.times, p.vs_eager, p.vs_inductor = src.times, src.vs_eager, src.vs_inductor


def bench_model(name: str, quick: bool, device: str, rounds: int, fraction_list) -> dict:
    """Every method on model ``name``; returns the points and facts for the report."""
    torch._dynamo.reset()
    model, args, desc = build(name, quick, device)
    log(f"{name}: {desc}")
    eager = Point("eager", "eager", model, make_step(model, args))
    ind_budgets = QUICK_INDUCTOR_BUDGETS if quick else INDUCTOR_BUDGETS
    inductor = []
    for b in ind_budgets:
        p = compiled_point(model, args, f"inductor {b}", f"{name}_inductor_{int(b * 100)}", b, inductor_budget=b)
        log(f"  inductor {b}: compiled in {p.compile_s:.0f} s")
        inductor.append(p)
    default = inductor[0]
    ckpt_model = with_checkpointed_blocks(build(name, quick, device)[0])
    ckpt = [Point("checkpoint", "checkpoint eager", ckpt_model, make_step(ckpt_model, args))]
    if not quick:
        ckpt.append(compiled_point(ckpt_model, args, "checkpoint + inductor", f"{name}_ckpt", method="checkpoint"))
        log(f"  checkpoint + inductor: compiled in {ckpt[1].compile_s:.0f} s")
    for p in (eager, *inductor, *ckpt):
        p.peak = measured_peak(p.model, p.step, device)
        log(f"  {p.label}: measured peak {mib(p.peak)} MiB")
    fractions = () if quick else fraction_list
    targets = [(f"remat {f}", "fraction" if f != "min" else "smallest feasible", f) for f in fractions]
    matched = sorted(((f"remat = {p.label}", f"{p.label}'s peak", p.peak) for p in (*inductor, *ckpt)),
                     key=lambda t: -t[2])
    remats = remat_points(model, args, targets + matched, device)
    log(f"  timing {rounds} rounds")
    others = [*inductor[1:], *ckpt, *remats]
    r = {"name": name, "desc": desc, "grads": grad_bytes(model), "eager": eager, "inductor": inductor,
         "ckpt": ckpt, "remat": remats}
    with torch._dynamo.config.patch(error_on_recompile=True):  # every step must run what was compiled above
        time_rounds(eager, default, others, rounds, device)
        time_close_calls(r, 1 if quick else HEAD_TO_HEAD_ROUNDS, device)
    return r


def time_close_calls(r: dict, rounds: int, device: str) -> None:
    """Time each remat point against the Inductor point whose peak it matched, head to head, where
    their step ratios to Inductor's default differ by less than ``CLOSE_CALL``: rounds of the two
    steps one after the other (remat first every other round); remat's step ÷ the other's, per round."""
    by_label = {p.label: p for p in r["remat"]}
    for p, q in matched_rows(r):
        if p.method != "inductor" or q.peak is None or abs(q.r_inductor - p.r_inductor) >= CLOSE_CALL:
            continue
        ours = by_label[q.reused_from] if q.reused_from else q
        samples = alternating_rounds([ours.timer(device)], [p.timer(device)], rounds, alternate=True)[0]
        ratios = [t_ours / t_p for t_ours, t_p in samples]
        q.head_to_head[p.label] = ratios
        log(f"  head to head, {q.label} ÷ {p.label}: {statistics.median(ratios):.3f} (median of {rounds})")


# ---------------------------------------------------------------------------------------------
# Report


ratio = partial(common.fmt, spec=".3f")

def act(p: Point, grads: int) -> int:
    return p.peak - grads


def table_md(r: dict) -> list[str]:
    grads, eager = r["grads"], r["eager"]
    lines = md_header(["method", "budget", "measured peak MiB", "activations MiB", "predicted MiB", "measured/predicted",
                       "≤ budget?", "step ms", "÷ eager", "÷ Inductor default", "compile s"])
    for p in [eager, *r["inductor"], *r["ckpt"], *r["remat"]]:
        if p.method == "inductor":
            budget, within = f"activation_memory_budget {p.inductor_budget}", "(not a limit)"
        elif p.method == "remat":
            budget = f"{p.target}" + (f": {mib(p.budget)} MiB" if p.budget is not None else "")
            within = "–" if p.peak is None else ("yes" if p.peak <= p.budget else "**no**")
            within += f" ({p.note})" if p.note and p.peak is not None else ""
        else:
            budget, within = "–", "–"
        if p.peak is None:
            lines.append(f"| {p.label} | {budget} | – | – | – | – | – | – | – | – | {p.compile_s:.0f} ({p.note}) |")
            continue
        pred = mib(p.predicted) if p.predicted else "–"
        mp = f"{p.peak / p.predicted:.3f}" if p.predicted else "–"
        comp = f"shares {p.reused_from}" if p.reused_from else f"{p.compile_s:.0f}"
        lines.append(f"| {p.label} | {budget} | {mib(p.peak)} | {mib(act(p, grads))} | {pred} | {mp} | {within} | "
                     f"{p.seconds * 1e3:.0f} | {ratio(p.r_eager)} | {ratio(p.r_inductor)} | {comp} |")
    return lines


def matched_rows(r: dict) -> list[tuple[Point, Point]]:
    """(other method's point, remat planned at its measured peak)."""
    by_label = {p.label: p for p in r["remat"]}
    return [(p, by_label[f"remat = {p.label}"]) for p in (*r["inductor"], *r["ckpt"])]


def matched_md(r: dict) -> list[str]:
    lines = md_header(["other method", "its peak MiB", "its step ÷ Inductor default", "remat peak MiB",
                       "remat step ÷ Inductor default", "head to head: remat ÷ it", "remat ≤ its step time?",
                       "remat overhead ÷ its overhead"])
    smallest = min((q for q in r["remat"] if q.peak is not None), key=lambda q: q.peak, default=None)
    for p, q in matched_rows(r):
        if q.peak is None:
            aside = ""
            if smallest is not None and smallest.peak <= p.peak:
                aside = (f"; {smallest.label} measured {mib(smallest.peak)} MiB, below this peak, at "
                         f"{ratio(smallest.r_inductor)}× Inductor default")
            lines.append(f"| {p.label} | {mib(p.peak)} | {ratio(p.r_inductor)} | – ({q.note}{aside}) | – | – | – | – |")
            continue
        faster = "yes" if not slower(p, q) else "**no**"
        h2h = head_to_head(p, q)
        duel = "–" if h2h is None else f"{h2h:.3f} ({len(q.head_to_head[p.label])} rounds)"
        over = (f"{(q.r_inductor - 1) / (p.r_inductor - 1):.2f}" if p.r_inductor - 1 > 0.005 else "– (its overhead ≤ 0.5%)")
        lines.append(f"| {p.label} | {mib(p.peak)} | {ratio(p.r_inductor)} | {mib(q.peak)} | {ratio(q.r_inductor)} | "
                     f"{duel} | {faster} | {over} |")
    return lines


def head_to_head(p: Point, q: Point) -> float | None:
    """The median of remat point ``q``'s step ÷ ``p``'s, timed head to head, if it was."""
    ratios = q.head_to_head.get(p.label)
    return statistics.median(ratios) if ratios else None


def slower(p: Point, q: Point) -> bool:
    """Whether remat point ``q`` is slower than ``p``: head to head where they were timed so (a close
    call), else by their ratios to Inductor's default."""
    h2h = head_to_head(p, q)
    return h2h > 1.0 if h2h is not None else q.r_inductor > p.r_inductor


def best_reduction(points: list[Point], eager: Point, grads: int) -> Point | None:
    """The point with the smallest measured peak among those within OVERHEAD_LIMIT of Inductor's default."""
    ok = [p for p in points if p.peak is not None and p.r_inductor is not None and p.r_inductor <= 1 + OVERHEAD_LIMIT]
    return min(ok, key=lambda p: p.peak, default=None)


def verdict_md(results: list[dict]) -> list[str]:
    lines = ["## Verdict", ""]
    for r in results:
        grads, eager = r["grads"], r["eager"]
        name = r["name"]
        rows = [(p, q) for p, q in matched_rows(r) if p.method == "inductor"]
        # 1. step time <= Inductor's at every matched peak
        fails = [(p, q) for p, q in rows if q.peak is None or slower(p, q)]
        lines.append(f"**{name}**")
        lines.append("")
        lines.append(
            f"- remat+Inductor's step time ≤ Inductor's at every matched peak ({len(rows)} Inductor budgets): "
            + ("**met**" if not fails else "**not met** at " + ", ".join(
                f"{p.label} ({'infeasible' if q.peak is None else f'{q.r_inductor:.3f} vs {p.r_inductor:.3f}'}"
                + ("" if head_to_head(p, q) is None else f"; head to head {head_to_head(p, q):.3f}") + ")"
                for p, q in fails)) + ".")
        ck = [(p, q) for p, q in matched_rows(r) if p.method == "checkpoint"]
        lines.append("- against per-block checkpointing at its peaks (step ÷ Inductor default): " + "; ".join(
            f"{p.label} {p.r_inductor:.3f}, remat " + ("infeasible" if q.peak is None else f"{q.r_inductor:.3f}")
            for p, q in ck) + ".")
        # 2. <= 0.8x Inductor's overhead at its tightest points
        tight = sorted(rows[1:], key=lambda pq: pq[0].peak)[:TIGHTEST]  # not the default (overhead 0 by definition)
        parts, ok = [], True
        for p, q in tight:
            if q.peak is None:
                parts.append(f"{p.label} ({mib(p.peak)} MiB): remat infeasible")
                ok = False
                continue
            po, qo = p.r_inductor - 1, q.r_inductor - 1
            good = qo <= 0.8 * po
            ok &= good
            parts.append(f"{p.label} ({mib(p.peak)} MiB): Inductor {po * 100:+.1f}%, remat {qo * 100:+.1f}% "
                         f"({'≤' if good else '>'} 0.8× Inductor's)")
        lines.append(f"- ≤ 0.8× Inductor's overhead (over its default) at its {TIGHTEST} tightest points: "
                     f"**{'met' if ok else 'not met'}**: " + "; ".join(parts) + ".")
        # 3. activation memory reduction vs eager at <= 10% over Inductor default
        cells, verdict = [], "not met"
        for label, pts in (("remat+Inductor", r["remat"]), ("Inductor", r["inductor"]), ("checkpointing", r["ckpt"])):
            b = best_reduction(pts, eager, grads)
            if b is None:
                cells.append(f"{label}: none within {OVERHEAD_LIMIT:.0%}")
                continue
            red = act(eager, grads) / act(b, grads)
            cells.append(f"{label} {red:.2f}× ({b.label}, {mib(act(b, grads))} MiB, step {b.r_inductor:.3f}× "
                         "Inductor default)")
            if label == "remat+Inductor":
                verdict = "met" if red >= 3 else "not met"
        lines.append(f"- activation memory ÷ eager's ({mib(act(eager, grads))} MiB) at ≤ {OVERHEAD_LIMIT:.0%} step time "
                     f"over Inductor's default, ≥ 3×: **{verdict}**: " + "; ".join(cells) + ".")
        # 4. measured peak never above the budget
        measured = [q for q in r["remat"] if q.peak is not None]
        over = [q for q in measured if q.peak > q.budget]
        lines.append(f"- remat's measured peak ≤ its budget at all {len(measured)} points: "
                     + ("**met**" if not over else "**not met**: " + ", ".join(
                         f"{q.label} {mib(q.peak)} > {mib(q.budget)} MiB" for q in over)) + ".")
        ind = r["inductor"]
        mono = all(a.peak >= b.peak for a, b in zip(ind, ind[1:]))
        lines.append(f"- Inductor's peaks over `activation_memory_budget` {', '.join(str(p.inductor_budget) for p in ind)}: "
                     f"{', '.join(mib(p.peak) for p in ind)} MiB: {'monotonic' if mono else '**not monotonic**'} "
                     "(its budget bounds what the partitioner saves, not the step's peak).")
        lines.append("")
    return lines


NOTES = """## Notes

- **Not the same Inductor settings.** `remat.compile` sets `realize_reads_threshold=0`,
  `layout_optimization=False`, `reorder_for_peak_memory=False` and `fx_graph_cache=False`
  (`remat.inductor.INDUCTOR_CONSTRAINTS`: its memory model relies on them); the Inductor and
  checkpoint points use Inductor's defaults. Step-time ratios therefore include what those settings cost
  or save, not only the partition.
- **Inductor's budget is not a memory limit.** `activation_memory_budget` bounds what the min-cut
  partitioner saves for the backward (as a fraction of what the default partition saves), not the step's
  peak; the peak also holds the backward's recomputed activations and Inductor's buffers, so peaks over
  its budgets need not be monotonic (the verdict says whether they were here).
- **Compile times** (the last column) include Dynamo, the partitioner (remat: capture, fusion model,
  planning, and re-planning after calibration) and Inductor's code generation, on one compile thread;
  compiled kernels are cached on disk across runs, so a second run compiles faster.
- **Timing on a shared machine.** Step times are medians and ratios are medians of per-round ratios to
  the eager and Inductor-default steps run beside each point; absolute step times move with the
  machine's load, the ratios much less.
- **Close calls.** Where remat's point and the Inductor point whose peak it matched are within
  {close:.0%} of each other (ratios to Inductor's default), the two were also timed head to head after
  the rounds ({h2h} rounds of one step each, alternating which runs first): the matched table gives the
  median of remat's step ÷ the other's, and "remat ≤ its step time?" follows it.
""".format(close=CLOSE_CALL, h2h=HEAD_TO_HEAD_ROUNDS)


def report(results: list[dict], args, revision: str, elapsed: float, argv: list[str]) -> str:
    argv = [a for i, a in enumerate(argv) if a != "--save" and (i == 0 or argv[i - 1] != "--save")]
    lines = [
        "# remat + Inductor against Inductor, eager PyTorch and per-block checkpointing",
        "",
        f"Made by `{' '.join(['benchmarks/inductor.py', *argv])}` on {machine_facts()}, device {args.device}, "
        f"remat at commit {revision}. Total run time {elapsed / 60:.1f} min. CPU memory: {getattr(args, 'malloc', '-')}.",
        "",
        __doc__.split("\n\n", 2)[2].strip().replace("``", "`"),
        "",
        f"Rounds: {args.rounds} (each method's ratios are medians over {args.rounds} rounds; few, because compiling "
        "dominates the run time on this machine). **÷ eager** and **÷ Inductor default** are step-time ratios "
        "(1.10 = 10% slower). remat's **predicted** peak is `m.plan.peak_bytes`; its measured peak is the "
        "script's own measurement (`remat.compile` also measures once at compile time and re-plans while above "
        "the budget: `plan.info['calibration']`). **≤ budget?** compares remat's measured peak with its budget in "
        "bytes; Inductor's `activation_memory_budget` is documented as not an exact limit, so it has none.",
        "",
    ]
    for r in results:
        lines += [f"## {r['name']}", "", r["desc"] + f"; parameter gradients {mib(r['grads'])} MiB.", ""]
        lines += table_md(r) + ["", "### At matched measured peaks", "",
                                "remat planned with a budget equal to the other method's measured peak. "
                                "Overhead = step ÷ Inductor default − 1.", ""]
        lines += matched_md(r) + [""]
        calib = [q for q in r["remat"] if q.calibration and q.calibration.count("measured") > 1]
        if calib:
            lines += ["Re-planned after measuring (`plan.info['calibration']`):", ""]
            lines += [f"- {q.label}: {q.calibration}" for q in calib] + [""]
    lines += verdict_md(results) + [NOTES]
    lines += [
        "## How to run",
        "",
        "```",
        ".venv/bin/python benchmarks/inductor.py            # writes benchmarks/inductor.md",
        ".venv/bin/python benchmarks/inductor.py --quick    # tiny models, fewer points, 1 round; writes nothing",
        "```",
        "Options: `--rounds R` (timing rounds, default 7), `--device cuda` (on a GPU: peaks from the CUDA "
        "allocator), `--models gpt2 resnet18`, `--system-malloc`. One torch thread and one Inductor compile thread "
        "(`OMP_NUM_THREADS=1`, `TORCHINDUCTOR_COMPILE_THREADS=1`) unless set otherwise in the environment.",
        "",
    ]
    return "\n".join(lines)


def fraction(text: str):
    return text if text == "min" else float(text)


_SKIP = ("model", "step")


def save(results: list[dict], path: str, revision: str = "", elapsed: float = 0.0, malloc: str = "-") -> None:
    """The measurements (no modules) as JSON, so the report can be rewritten with --load."""
    def enc(v):
        if isinstance(v, Point):
            return {k: getattr(v, k) for k in Point.__dataclass_fields__ if k not in _SKIP}
        if isinstance(v, list):
            return [enc(x) for x in v]
        return v

    data = {"results": [{k: enc(v) for k, v in r.items()} for r in results], "revision": revision,
            "elapsed": elapsed, "argv": sys.argv[1:], "machine": machine_facts(), "malloc": malloc}
    write_json(path, data, indent=None)


def load(results: list[dict]) -> list[dict]:
    def dec(v):
        if isinstance(v, dict) and "method" in v:
            return Point(model=None, step=None, **v)
        if isinstance(v, list):
            return [dec(x) for x in v]
        return v

    return [{k: dec(v) for k, v in r.items()} for r in results]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="tiny models, fewer points, 1 round, no md (a smoke test)")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", nargs="+", default=["resnet18", "gpt2"], choices=["gpt2", "resnet18"])
    ap.add_argument("--fractions", nargs="+", default=list(REMAT_FRACTIONS), type=fraction)
    ap.add_argument("--save", help="also write the measurements as JSON here (after each model)")
    ap.add_argument("--load", help="write the report from a --save file instead of measuring")
    ap.add_argument("--system-malloc", action="store_true",
                    help="keep glibc's malloc defaults (freed large blocks go back to the OS) on the CPU")
    ap.add_argument("--out", help="the report's path (default: inductor.md beside this script, "
                                  "inductor_cuda.md for --device cuda)")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(__file__).with_name(
        "inductor_cuda.md" if args.device.startswith("cuda") else "inductor.md")
    if args.load:
        saved = json.loads(Path(args.load).read_text())
        args.malloc = saved.get("malloc", "-")
        text = report(load(saved["results"]), args, saved["revision"], saved["elapsed"], saved["argv"])
        out.write_text(text)
        print(text)
        return
    if args.device != "cpu":
        args.malloc = "the device's caching allocator"
    else:
        args.malloc = "glibc's defaults (`--system-malloc`)" if args.system_malloc else keep_freed_cpu_memory()
    process_setup(threads=int(os.environ["OMP_NUM_THREADS"]), quiet_future=True)
    if args.quick:
        args.rounds = 1
    start, revision = time.perf_counter(), git_revision()
    results = []
    for name in args.models:
        results.append(bench_model(name, args.quick, args.device, args.rounds, args.fractions))
        if args.save:
            save(results, args.save, malloc=args.malloc)
        gc.collect()
    elapsed = time.perf_counter() - start
    if args.save:
        save(results, args.save, revision, elapsed, args.malloc)
    publish(report(results, args, revision, elapsed, sys.argv[1:]), None if args.quick else out)


if __name__ == "__main__":
    main()

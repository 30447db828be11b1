"""Plots of plans and of Pareto fronts (matplotlib, no pyplot state, PNG or SVG by suffix).

    from remat.tools import plots as viz
    viz.plot_timeline(plan, "timeline.png")                  # predicted memory, budget, fwd/bwd boundary
    viz.plot_timeline(plan, "timeline.svg", measured=m)      # + a measured peak or measured timeline
    viz.plot_schedule(plan, "schedule.png")                  # Checkmate's stage x op matrix
    viz.plot_pareto(remat.pareto(model, x), "sweep.png")     # overhead against budget, per solver

Each function returns the matplotlib :class:`~matplotlib.figure.Figure` it drew on and, when
``path`` is given, writes it there; the format follows the suffix (``.png``, ``.svg``, ``.pdf``).
Figures are made with :class:`matplotlib.figure.Figure` directly (the Agg canvas), so nothing
here touches pyplot's global state or needs a display.

**The schedule matrix** (:func:`plot_schedule`) follows Checkmate (Jain et al., 2020), whose
solution is two boolean matrices over *stages* t and *ops* i: ``R[t, i]`` (op i is computed in
stage t) and ``S[t, i]`` (op i's output is kept in memory from stage t-1 into stage t). In
Checkmate's formulation stage t is the stage in which op t is computed for the first time (the
"frontier" advances by one op per stage). A :class:`~remat.plan.Plan` is a flat list of
instructions, so the stages are recovered the same way: walking the plan in order, **a new
stage starts at every instruction that computes an op for the first time**, and the
recomputations and frees that follow it (up to the next first computation) belong to that
stage. There are as many stages as ops. Rows are stages in plan order, columns are ops in the
graph's topological order (forward ops first), so a plan that computes each op once in graph
order shows a pure diagonal; recomputations appear as marks left of the diagonal, and what is
kept shows as the band of grey to its left. An op counts as kept in a stage when any of its
outputs is resident as the stage begins. Graphs of more than ``max_pixels`` ops are shown
binned (each cell covers several stages and ops and shows the strongest mark inside it:
recomputed > computed > kept), so hundreds or thousands of ops stay readable.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..errors import format_bytes
from ..plan import COMPUTE, FREE, PLOT_KINDS, Plan

__all__ = ["plot_timeline", "plot_schedule", "plot_pareto", "schedule_matrix", "SUPPORTED_SUFFIXES"]

SUPPORTED_SUFFIXES = (".png", ".svg", ".pdf")

# cell codes of the schedule matrix (also their drawing order: higher wins when binned)
EMPTY, KEPT, COMPUTED, RECOMPUTED = 0, 1, 2, 3


def _figure_and_axes(ax, figsize=(9, 4.5)):
    """``ax``'s figure, or a new figure (no pyplot state) with one axes."""
    if ax is not None:
        return ax.figure, ax
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.add_subplot()


def _save(fig, path: str | os.PathLike | None) -> None:
    if path is None:
        return
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise ValueError(f"cannot write a plot to {os.fspath(path)!r}: use a file name ending in "
                         f"{', '.join(SUPPORTED_SUFFIXES)}")
    fig.savefig(path, dpi=150)


def _unit(top: float) -> tuple[float, str]:
    """(bytes per unit, unit name) so that ``top`` bytes reads as a number below 1024."""
    for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if top >= scale:
            return float(scale), name
    return 1.0, "B"


# ------------------------------------------------------------------------------------ timeline


def _measured_parts(measured: Any) -> tuple[int | None, Sequence[int] | None]:
    """(measured peak, measured timeline) from a peak in bytes, a StepMeasurement, or a sequence."""
    if measured is None:
        return None, None
    if isinstance(measured, (int, np.integer)):
        return int(measured), None
    peak = getattr(measured, "peak_bytes", None)
    if peak is not None:  # a StepMeasurement
        return int(peak), None
    series = [int(v) for v in measured]
    if not series:
        raise ValueError("a measured timeline must hold at least one reading")
    return max(series), series


def plot_timeline(plan: Plan, path: str | os.PathLike | None = None, *, measured: Any = None, ax=None,
                  title: str | None = None, name: str | None = None):
    """The plan's predicted memory after each instruction, with its budget and fwd/bwd boundary.

    ``plan.simulation.timeline`` (bytes counted against the budget after each instruction) is
    drawn against the instruction index; a dashed line marks the budget, a vertical line the
    boundary where the forward ends and the backward begins, and a dot the predicted peak
    (which may sit *inside* an instruction, above the step's curve: an op's inputs, outputs and
    workspace are alive together).

    ``measured`` overlays what was measured: an ``int`` (bytes) or a
    :class:`~remat.measure.StepMeasurement` is drawn as a horizontal "measured peak" line; a
    sequence of byte readings taken in time order during the step is stretched over the
    instruction axis (time and instructions are not the same axis, so only its shape and
    height are comparable). ``name`` (default: the graph's) starts the default title. Returns
    the figure.
    """
    fig, ax = _figure_and_axes(ax)
    sim = plan.simulation
    peak, series = _measured_parts(measured)
    top = max(sim.peak_bytes, plan.budget_bytes or 0, peak or 0)
    scale, unit = _unit(top)
    timeline = np.asarray(sim.timeline, dtype=float) / scale
    x = np.arange(len(timeline))
    ax.fill_between(x, timeline, step="post", alpha=0.25, color="tab:blue", linewidth=0)
    ax.step(x, timeline, where="post", color="tab:blue", linewidth=1.2, label="predicted (after each instruction)")
    ax.plot([sim.peak_index], [sim.peak_bytes / scale], "o", color="tab:blue",
            label=f"predicted peak {format_bytes(sim.peak_bytes)}")
    if plan.budget_bytes is not None:
        ax.axhline(plan.budget_bytes / scale, color="tab:red", linestyle="--", linewidth=1.2,
                   label=f"budget {format_bytes(plan.budget_bytes)}")
    ax.axvline(plan.boundary - 0.5, color="0.3", linestyle=":", linewidth=1.2)
    if series is not None:
        xs = np.linspace(0, max(len(timeline) - 1, 1), len(series))
        ax.plot(xs, np.asarray(series, dtype=float) / scale, color="tab:orange", linewidth=1.0,
                label="measured (readings in order, stretched over the instructions)")
    if peak is not None:
        ax.axhline(peak / scale, color="tab:orange", linestyle="-.", linewidth=1.2,
                   label=f"measured peak {format_bytes(peak)}")
    ax.set_ylim(0, top / scale * 1.08 or 1)
    ax.set_xlim(0, max(len(timeline) - 1, 1))
    for text, align in ((" backward \u2192", "left"), ("\u2190 forward ", "right")):
        ax.annotate(text, (plan.boundary - 0.5, 1.0), xycoords=("data", "axes fraction"), ha=align, va="bottom",
                    fontsize=8, color="0.3")
    ax.set_xlabel("instruction (compute / free, in plan order)")
    ax.set_ylabel(f"memory counted against the budget ({unit})")
    ax.set_title(title or f"{name or plan.graph.name}: plan by {plan.solver or '?'}, "
                          f"overhead {plan.overhead * 100:+.1f}%, {plan.recomputations} recomputations",
                 fontsize=10, pad=14)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    _save(fig, path)
    return fig


# ------------------------------------------------------------------------------------ schedule


def schedule_matrix(plan: Plan) -> np.ndarray:
    """Checkmate's schedule as one matrix of cell codes, ``stages x ops`` (see the module docstring).

    ``m[t, i]`` is ``RECOMPUTED`` when op i runs in stage t but not for the first time,
    ``COMPUTED`` when it runs there for the first time, ``KEPT`` when one of its outputs is
    resident as stage t begins and it does not run in t, and ``EMPTY`` otherwise. A plan that
    never computes some op (a dead op) has fewer stages than ops; rows are stages in plan order.
    """
    graph = plan.graph
    n = len(graph.nodes)
    rows: list[np.ndarray] = []
    resident: set[int] = set()
    computed_once: set[int] = set()
    row: np.ndarray | None = None
    for ins in plan.instructions:
        if ins.kind == COMPUTE:
            node = graph.nodes[ins.target]
            if ins.target not in computed_once:  # frontier advance: a new stage
                computed_once.add(ins.target)
                row = np.zeros(n, dtype=np.int8)
                for v in resident:
                    producer = graph.values[v].producer
                    if producer is not None:
                        row[producer] = KEPT
                rows.append(row)
                row[ins.target] = COMPUTED
            elif row is not None:
                row[ins.target] = RECOMPUTED
            resident.update(node.outputs)
        elif ins.kind == FREE:
            resident.discard(ins.target)
    return np.stack(rows) if rows else np.zeros((0, n), dtype=np.int8)


def _binned(matrix: np.ndarray, max_pixels: int) -> tuple[np.ndarray, int, int]:
    """``matrix`` reduced by taking the maximum over blocks, so neither side exceeds ``max_pixels``."""
    rows, cols = matrix.shape
    fr = max(1, -(-rows // max_pixels))
    fc = max(1, -(-cols // max_pixels))
    if fr == 1 and fc == 1:
        return matrix, 1, 1
    padded = np.zeros((-(-rows // fr) * fr, -(-cols // fc) * fc), dtype=matrix.dtype)
    padded[:rows, :cols] = matrix
    out = padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc).max(axis=(1, 3))
    return out, fr, fc


def plot_schedule(plan: Plan, path: str | os.PathLike | None = None, *, max_pixels: int = 400, ax=None,
                  title: str | None = None, name: str | None = None):
    """Checkmate's schedule matrix of ``plan``: stage x op, computed / recomputed / kept.

    See the module docstring for how stages are derived from a plan. Lines mark where the
    backward ops begin (columns) and the stage in which the backward starts (rows). Graphs with
    more than ``max_pixels`` ops are binned. ``name`` (default: the graph's) starts the default
    title. Returns the figure.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    fig, ax = _figure_and_axes(ax, figsize=(7.5, 7))
    matrix = schedule_matrix(plan)
    shown, fr, fc = _binned(matrix, max_pixels)
    colors = ["white", "#b9c7d9", "tab:blue", "tab:red"]
    ax.imshow(shown, cmap=ListedColormap(colors), vmin=0, vmax=3, interpolation="nearest", aspect="auto",
              extent=(-0.5, shown.shape[1] * fc - 0.5, shown.shape[0] * fr - 0.5, -0.5))
    graph = plan.graph
    first_backward = next((nd.id for nd in graph.nodes if nd.phase == "backward"), None)
    if first_backward is not None:
        ax.axvline(first_backward - 0.5, color="0.3", linestyle=":", linewidth=1)
    boundary_stage = _boundary_stage(plan)
    if boundary_stage is not None:
        ax.axhline(boundary_stage - 0.5, color="0.3", linestyle=":", linewidth=1)
    ax.set_xlabel("op (topological order: forward ops, then backward ops)")
    ax.set_ylabel("stage (a new stage at each op's first computation)")
    binned = f", shown binned {fr}x{fc}" if fr > 1 or fc > 1 else ""
    ax.set_title(title or f"{name or graph.name}: schedule by {plan.solver or '?'} "
                          f"({matrix.shape[0]} stages x {matrix.shape[1]} ops{binned})", fontsize=10)
    recomputed = int((matrix == RECOMPUTED).sum())
    handles = [
        Patch(color=colors[COMPUTED], label="computed (first time)"),
        Patch(color=colors[RECOMPUTED], label=f"recomputed ({recomputed})"),
        Patch(facecolor=colors[KEPT], edgecolor="0.6", label="kept in memory"),
    ]
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9)
    _save(fig, path)
    return fig


def _boundary_stage(plan: Plan) -> int | None:
    """The index of the first stage that starts at or after the plan's boundary."""
    seen: set[int] = set()
    stage = 0
    for i, ins in enumerate(plan.instructions):
        if ins.kind == COMPUTE and ins.target not in seen:
            if i >= plan.boundary:
                return stage
            seen.add(ins.target)
            stage += 1
    return None


# ------------------------------------------------------------------------------------ pareto


def plot_pareto(front: Mapping[str, Sequence[Plan | None]], path: str | os.PathLike | None = None, *,
                budgets: Iterable[int] | None = None, store_all_peak: int | None = None, ax=None,
                title: str | None = None):
    """Predicted compute overhead against the budget, one line per solver.

    ``front`` is a :class:`remat.ParetoFront` (or any mapping of solver name to one plan per
    budget, ``None`` where the solver has no plan within it); the budgets in bytes come from
    ``front.budgets`` unless ``budgets`` is given. Missing plans leave gaps in a solver's line.
    With the store-everything peak known (``front.store_all_peak``) it is marked as a vertical
    line. Returns the figure.
    """
    fig, ax = _figure_and_axes(ax, figsize=(8, 4.5))
    budgets = list(budgets if budgets is not None else getattr(front, "budgets", []))
    if store_all_peak is None:
        store_all_peak = getattr(front, "store_all_peak", None)
    known = [b for b in budgets if b is not None] + ([store_all_peak] if store_all_peak else [])
    scale, unit = _unit(max(known, default=0))
    markers = "osD^vP*X"
    drawn = 0
    for k, (solver, plans) in enumerate(front.items()):
        plans = list(plans)
        if len(plans) != len(budgets):
            raise ValueError(f"solver {solver!r} has {len(plans)} plans for {len(budgets)} budgets")
        points = sorted((b, p.overhead * 100) for b, p in zip(budgets, plans) if p is not None and b is not None)
        if not points:
            continue
        xs, ys = zip(*points)
        ax.plot(np.asarray(xs, dtype=float) / scale, ys, marker=markers[k % len(markers)], linewidth=1.4,
                markersize=5, label=solver)
        drawn += 1
    if store_all_peak:
        ax.axvline(store_all_peak / scale, color="0.4", linestyle=":", linewidth=1,
                   label=f"store-everything peak {format_bytes(store_all_peak)}")
        ref = store_all_peak / scale
        top = ax.secondary_xaxis("top", functions=(lambda x: x / ref * 100, lambda p: p * ref / 100))
        top.set_xlabel("budget as a share of the store-everything peak (%)", fontsize=8)
    ax.set_xlabel(f"budget ({unit})")
    ax.set_ylabel("predicted compute overhead over store_all (%)")
    ax.set_title(title or "overhead against budget" + ("" if drawn else " (no solver found a plan)"), fontsize=10)
    ax.grid(alpha=0.3)
    if drawn or store_all_peak:
        ax.legend(fontsize=8, framealpha=0.9)
    _save(fig, path)
    return fig


PLOT_KINDS.update(timeline=plot_timeline, schedule=plot_schedule)  # what Plan.plot draws

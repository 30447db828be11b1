"""``checkmate_swap``: Checkmate's MILP with swap decisions (POET-style), an exact reference for ``hybrid``.

The model extends :func:`remat.solvers.checkmate_model.build` (stages ``t``, recomputation
``R[t,i]``, device residency ``S[t,v]``, frees, memory rows; only forward nodes are
recomputed) with, per stage ``t`` and droppable forward value ``v``:

* ``OUT[t,v]`` binary — ``v`` is offloaded at the start of stage ``t`` (it must be on the
  device: ``OUT ≤ S[t,v]``; it cannot be read in stage ``t``, nor computed: ``R[t,p] + OUT ≤ 1``);
* ``IN[t,v]`` binary — ``v`` is reloaded at the start of stage ``t`` (``IN ≤ H[t,v]``);
* ``H[t,v]`` — ``v`` is on the host at the start of stage ``t``:
  ``H[t+1,v] = H[t,v] + OUT[t,v] - IN[t,v]``, ``H = 0`` before ``v`` exists and after its last
  possible reader (a host copy is always reloaded; dropping it instead is never better than
  freeing), ``S[t,v] + H[t,v] ≤ 1`` and ``R[t,p] + H[t,v] ≤ 1`` (an offloaded value is neither
  on the device nor computed again until it is reloaded).

Checkmate's rows change as follows: ``v`` is usable in stage ``t`` when computed there, or
``S[t,v] - OUT[t,v]`` (+ ``IN[t,v]`` with synchronous copies, see below); it is kept into stage
``t+1`` when ``S[t+1,v] ≤ R[t,p] + S[t,v] - OUT[t,v] + IN[t,v]``; the stage's memory starts
from ``Σ M_v (S[t,v] + IN[t,v])`` (``- OUT[t,v]`` with synchronous copies). Memory rows count
device bytes only; the host tier is unbounded here (the simulator reports its peak).

Time. A copy of ``v`` takes ``latency_s + M_v / bandwidth`` (:func:`~remat.plan.transfer_costs`);
``X_t`` is the copy time issued in stage ``t``, ``C_t`` the stage's compute
(``cost_t + Σ_i cost_i R[t,i]``). The objective is the predicted step time:

* ``overlap=False`` (the CPU file store: every copy blocks compute): ``Σ_t C_t + X_t``. The
  decoded plan issues stage ``t``'s offloads, then its reloads, right before its first compute;
  each copy ends before the next instruction, so offloaded bytes are gone before the stage's
  computes and reloaded values are usable in the stage itself. Time is **exact**: the
  simulator's step time of the decoded plan equals the objective. Memory: the swap terms are
  exactly the simulator's device bytes at each stage start; within a stage the rows are
  Checkmate's (see below).
* ``overlap=True`` (copies on a channel beside compute): stage ``t`` lasts
  ``D_t = max(C_t, X_t)`` — a barrier at the end of every stage, as in POET — and the
  objective is ``Σ_t D_t``; a value reloaded in stage ``t`` is usable from stage ``t+1`` and an
  offloaded one is counted on the device through stage ``t``. The simulator has no barrier:
  by induction over stages its clock and its channel are never later than the barrier
  model's, so the decoded plan's simulated step time is **at most** the model's (equal when
  no stage is channel-bound, ``X_t ≤ C_t``: then nothing ever stalls and the step is
  ``Σ C_t`` in both). Memory is exact-or-conservative only while no stage is channel-bound:
  an offload that the simulator finishes after stage ``t`` ends keeps its bytes longer than
  the model counts. So the plan is always re-simulated, and if it then peaks over the
  budget the model is solved again with ``X_t ≤ C_t`` in every stage ("no spill"), where the
  model and the simulator agree exactly on time and the model is conservative on memory.

One change to Checkmate's memory rows: Checkmate's blanket reserve for generator states is
replaced by ``Z_i ≥ R[t,i]`` per random node (its state counted from stage ``i`` on only when
the plan replays it). Checkmate's rows count the second copy of a forward output that a
recomputation makes (batch norm's running statistics) exactly, so the only way a decoded plan
can peak over the budget is the barrier model's spill: then the model is solved once more
without spill, and a plan over the budget after that is an internal error.

What the model leaves out (so its optimum is optimal among *its* plans, not among all plans):
copies only at stage starts (``hybrid`` may reload in the middle of a stage), no swapping
of backward-made values, tangents or forward outputs, and Checkmate's frontier-advancing
stages with forward-only recomputation.

The solver always re-simulates the decoded plan; a plan over the budget is never returned as
fitting. When no plan of the model fits, its smallest-peak plan is returned (over the budget,
status ``infeasible at …``) so that the caller can name the minimum, as ``checkmate`` does.
Warm start: the best of the baselines' plans, the ``hybrid`` greedy's plan (or ``warm_plans``)
that the model can express; when HiGHS stops before finding anything better, that start is the
plan returned. At the time limit the best plan found is returned with its gap and a
:class:`~remat.errors.SolverTimeLimitWarning`. ``plan.info`` holds the MILP objective (``objective_seconds``), its bound, the status,
the MIP gap, the simulated step time and which time model was solved. Graphs of more than
``MAX_NODES`` ops are refused (coarsen them first with :func:`remat.solvers.coarsen.coarsen_graph`).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..errors import RematError, SolverError, SolverTimeLimitWarning
from ..graph import Graph
from ..plan import COMPUTE, OFFLOAD, RELOAD, Plan, transfer_costs
from .registry import SOLVERS, register
from .checkmate_model import (Formulation, build, decode, schedule_from_R, set_start, solution_vector, to_highs,
                               value_roles)

DEFAULT_TIME_LIMIT = 60.0
WARM_GREEDY_TIME_LIMIT = 10.0  # for the hybrid greedy's plan that warm-starts the MILP
MAX_NODES = 200  # the model has O(nodes²) binaries: beyond this, coarsen the graph first


@dataclass
class SwapFormulation:
    """Checkmate's formulation plus the swap columns and the time model."""

    f: Formulation
    overlap: bool
    no_spill: bool
    OUT: dict[tuple[int, int], int] = field(default_factory=dict)  # (t, v) -> column
    IN: dict[tuple[int, int], int] = field(default_factory=dict)
    H: dict[tuple[int, int], int] = field(default_factory=dict)
    D: dict[int, int] = field(default_factory=dict)  # stage -> column: D_t - cost_t (barrier model)
    Z: dict[int, int] = field(default_factory=dict)  # random node -> column: it is recomputed somewhere
    out_seconds: dict[int, float] = field(default_factory=dict)  # value -> duration of its offload
    in_seconds: dict[int, float] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        if not self.overlap:
            return "synchronous copies (exact)"
        return "no spill: X_t <= C_t (exact time)" if self.no_spill else "stage barrier max(C_t, X_t) (time an upper bound)"


def _add(f: Formulation, row: int, col: int, coef: float) -> None:
    """Add ``coef`` to column ``col`` in existing row ``row``."""
    if coef == 0.0:
        return
    idx = f.row_index[row]
    if col in idx:
        f.row_value[row][idx.index(col)] += coef
    else:
        idx.append(col)
        f.row_value[row].append(coef)


def build_swap(graph: Graph, budget_bytes: int | None, *, no_spill: bool = False) -> SwapFormulation:
    """The swap MILP (see the module docstring) for ``graph`` under ``budget_bytes``
    (``None``: minimise the peak, then the step time)."""
    transfer = transfer_costs(graph)
    f = build(graph, budget_bytes)
    values, nodes = graph.values, graph.nodes
    variable, _ = value_roles(graph)
    overlap = transfer["overlap"]
    m = SwapFormulation(f, overlap, no_spill and overlap)
    same_stage = 0.0 if overlap else 1.0  # a reload is usable in its own stage only when synchronous
    for v in variable:
        m.out_seconds[v] = transfer["latency_s"] + values[v].bytes / transfer["d2h_bytes_per_s"]
        m.in_seconds[v] = transfer["latency_s"] + values[v].bytes / transfer["h2d_bytes_per_s"]

    # ---- columns: OUT while a later stage may read v; IN from two stages after v is made
    for v in sorted(variable):
        p, last = values[v].producer, f.need[v]
        if last <= p + 1:
            continue  # read only in the stage right after its own: nothing to swap around
        for t in range(p + 1, last):
            m.OUT[(t, v)] = f._col(0.0, 0.0, 1.0, True)
        for t in range(p + 2, last + 1):
            m.H[(t, v)] = f._col(0.0, 0.0, 1.0, False)
            if t < last or not overlap:
                m.IN[(t, v)] = f._col(0.0, 0.0, 1.0, True)

    # ---- host-tier rows
    swapped_values = {v for _, v in m.H}
    for v in swapped_values:
        p, last = values[v].producer, f.need[v]
        for t in range(p + 1, last + 1):
            h_next = m.H.get((t + 1, v))
            terms = {}
            if h_next is not None:
                terms[h_next] = 1.0
            for col, coef in ((m.H.get((t, v)), -1.0), (m.OUT.get((t, v)), -1.0), (m.IN.get((t, v)), 1.0)):
                if col is not None:
                    terms[col] = coef
            if terms:
                f._row(0.0, 0.0, terms)  # H[t+1] = H[t] + OUT[t] - IN[t]  (H[last+1] = 0)
            s = f.S[(t, v)]
            r = f.R.get((t, p))
            if (t, v) in m.OUT:
                f._row(-math.inf, 0.0, {m.OUT[(t, v)]: 1.0, s: -1.0})  # OUT <= S
                if r is not None:
                    f._row(-math.inf, 1.0, {m.OUT[(t, v)]: 1.0, r: 1.0})
            if (t, v) in m.H:
                h = m.H[(t, v)]
                f._row(-math.inf, 1.0, {s: 1.0, h: 1.0})  # on the device or on the host
                if r is not None:
                    f._row(-math.inf, 1.0, {r: 1.0, h: 1.0})
                if (t, v) in m.IN:
                    f._row(-math.inf, 0.0, {m.IN[(t, v)]: 1.0, h: -1.0})  # IN <= H

    # ---- Checkmate's rows, extended
    for t, v, row in f.read_rows:  # usable: R + S - OUT (+ IN when synchronous)
        if (t, v) in m.OUT:
            _add(f, row, m.OUT[(t, v)], 1.0)
        if (t, v) in m.IN:
            _add(f, row, m.IN[(t, v)], -same_stage)
    for (t, v), row in f.keep_rows.items():  # S[t+1] <= R + S - OUT + IN
        if (t, v) in m.OUT:
            _add(f, row, m.OUT[(t, v)], 1.0)
        if (t, v) in m.IN:
            _add(f, row, m.IN[(t, v)], -1.0)
    for (t, v), row in f.kept_cut_rows.items():  # a kept value is read, kept on, or offloaded
        if (t, v) in m.OUT:
            _add(f, row, m.OUT[(t, v)], -1.0)
    first_rows = {t: f.u_rows[f.U[(t, pos[0])]] for t, pos in enumerate(f.positions)}
    boundary_stage = f.num_forward
    for (t, v), col in m.IN.items():
        _add(f, first_rows[t], col, -values[v].bytes / f.scale)  # U - Σ M S - Σ M IN ... == const
        if t == boundary_stage and f.boundary_row is not None:
            _add(f, f.boundary_row, col, values[v].bytes / f.scale)
    if not overlap:  # a synchronous offload has left before the stage's first compute
        for (t, v), col in m.OUT.items():
            _add(f, first_rows[t], col, values[v].bytes / f.scale)
            if t == boundary_stage and f.boundary_row is not None:
                _add(f, f.boundary_row, col, -values[v].bytes / f.scale)

    _exact_rng_state(m)

    # ---- time
    copies_at: dict[int, dict[int, float]] = {}
    for (t, v), col in m.OUT.items():
        copies_at.setdefault(t, {})[col] = m.out_seconds[v]
    for (t, v), col in m.IN.items():
        copies_at.setdefault(t, {})[col] = m.in_seconds[v]
    if not overlap:  # copies block compute: their time adds
        for cols in copies_at.values():
            for col, sec in cols.items():
                f.col_cost[col] = sec / f.cost_scale
    else:
        for t, cols in sorted(copies_at.items()):
            compute = {f.R[(t, i)]: nodes[i].cost for i in f.positions[t][:-1]}
            own = nodes[t].cost
            if m.no_spill:  # X_t <= C_t
                terms = dict(cols)
                for col, c in compute.items():
                    terms[col] = -c
                f._row(-math.inf, own, terms)
                continue
            # D_t = max(C_t, X_t) - cost_t replaces the stage's recomputation costs in the objective
            d = f._col(1.0 / f.cost_scale, 0.0, math.inf, False)
            m.D[t] = d
            for col in compute:
                f.col_cost[col] = 0.0
            f._row(0.0, math.inf, {d: 1.0, **{col: -c for col, c in compute.items()}})
            f._row(-own, math.inf, {d: 1.0, **{col: -s for col, s in cols.items()}})
    return m


def _exact_rng_state(m: SwapFormulation) -> None:
    """Replace Checkmate's blanket reserve for generator states by ``Z_i ≥ R[t,i]`` per random node
    ``i`` that may be recomputed, counting ``rng_state_bytes · Z_i`` in every memory row from stage
    ``i`` on (the simulator holds the state from the first run to the last replay, all within those
    stages): a plan that recomputes no random node no longer pays for one."""
    f = m.f
    if f.rng_reserve <= 0:
        return
    graph = f.graph
    rng = int(graph.meta.get("rng_state_bytes", 0)) / f.scale
    stage_of_u = {col: t for (t, _), col in f.U.items()}
    row_stage = {}
    for r in f.memory_rows:
        if r == f.boundary_row:
            row_stage[r] = f.num_forward
        else:
            row_stage[r] = next(stage_of_u[c] for c in f.row_index[r] if c in stage_of_u)
    for r in f.memory_rows:
        f.row_upper[r] += f.rng_reserve / f.scale
    for i in range(f.num_forward):
        stages = [t for (t, k) in f.R if k == i]
        if not graph.nodes[i].random or not stages:
            continue
        z = m.Z[i] = f._col(0.0, 0.0, 1.0, False)
        for t in stages:
            f._row(-math.inf, 0.0, {f.R[(t, i)]: 1.0, z: -1.0})  # Z_i >= R[t,i]
        for r, t in row_stage.items():
            if t >= i:
                _add(f, r, z, rng)
    f.rng_reserve = 0


# ------------------------------------------------------------------------------ decoding
def model_seconds(m: SwapFormulation, R_on, OUT_on, IN_on) -> float:
    """The model's step time for an integral solution (what the objective says, in seconds)."""
    f, nodes = m.f, m.f.graph.nodes
    total = 0.0
    for t, pos in enumerate(f.positions):
        compute = nodes[t].cost + sum(nodes[i].cost for i in pos[:-1] if (t, i) in R_on)
        copies = sum(m.out_seconds[v] for (s, v) in OUT_on if s == t) + sum(m.in_seconds[v] for (s, v) in IN_on if s == t)
        total += compute + copies if not m.overlap else max(compute, copies)
    return total


def decode_plan(m: SwapFormulation, R_on, OUT_on, IN_on, **plan_kwargs) -> Plan:
    """The plan of an integral solution: Checkmate's schedule, then each stage's offloads and
    reloads right before its first compute (:meth:`~remat.plan.Plan.with_swaps`). A swap whose
    value is not read after its reload (a useless move the model may leave in) is dropped."""
    f, graph = m.f, m.f.graph
    forward, backward = schedule_from_R(f, R_on)
    sequence = forward + backward
    start: dict[int, int] = {}  # stage -> position of its first compute
    pos = 0
    for t, nodes_t in enumerate(f.positions):
        start[t] = pos
        pos += sum(1 for k in nodes_t if k == t or (t, k) in R_on)
    base = Plan.from_schedule(graph, forward, backward)
    computes = [i for i, ins in enumerate(base.instructions) if ins.kind == COMPUTE]
    offload_after: dict[int, list[int]] = {}
    reload_before: dict[int, list[int]] = {}
    for v in sorted({v for _, v in OUT_on}):
        outs = sorted(t for t, w in OUT_on if w == v)
        ins = sorted(t for t, w in IN_on if w == v)
        producer = graph.values[v].producer
        for t_out, t_in in zip(outs, ins):
            p_in = start[t_in]
            read = False  # is the instance read after the reload, before it is computed again?
            for q in range(p_in, len(sequence)):
                node = graph.nodes[sequence[q]]
                if v in node.inputs:
                    read = True
                    break
                if sequence[q] == producer:
                    break
            if not read:
                continue
            offload_after.setdefault(v, []).append(computes[start[t_out]] - 1)
            reload_before.setdefault(v, []).append(computes[p_in])
    return base.with_swaps(offload_after, reload_before, **plan_kwargs)


def _feasible(f: Formulation, x, tol: float = 1e-6) -> bool:
    """Does ``x`` meet every row and bound of ``f``?"""
    if np.any(x < np.asarray(f.col_lower) - tol) or np.any(x > np.asarray(f.col_upper) + tol):
        return False
    for r in range(f.num_rows):
        val = sum(a * x[c] for c, a in zip(f.row_index[r], f.row_value[r]))
        if val < f.row_lower[r] - tol or val > f.row_upper[r] + tol:
            return False
    return True


def _on(cols: dict, x) -> set:
    return {key for key, col in cols.items() if x[col] > 0.5}


def _warm_vector(m: SwapFormulation, plan: Plan):
    """A full solution vector for ``plan`` (recomputation and swaps), or None when its schedule is
    not frontier-advancing. Each offload is moved to the start of the stage of the compute after
    it, each reload likewise (one stage earlier when a reload is usable only in the next stage);
    HiGHS checks the vector and ignores it when that move breaks a row."""
    from .checkmate import stages_of

    f, graph = m.f, m.f.graph
    forward, backward = plan.schedule()
    base = Plan.from_schedule(graph, forward, backward)
    stages = stages_of(f, base)
    if stages is None:
        return None
    R_on, S_on = stages
    # the stage of every instruction of `plan`: that of the next compute
    stage_of, frontier, pending = {}, 0, []
    for i, ins in enumerate(plan.instructions):
        if ins.kind != COMPUTE:
            pending.append(i)
            continue
        for j in pending:
            stage_of[j] = frontier
        pending = []
        stage_of[i] = frontier
        if ins.target == frontier:
            frontier += 1
    OUT_on, IN_on = set(), set()
    first_read: dict[int, list[int]] = {}  # value -> stages where it is read
    for i, ins in enumerate(plan.instructions):
        if ins.kind == COMPUTE:
            for v in graph.nodes[ins.target].inputs:
                first_read.setdefault(v, []).append(stage_of[i])
    for i, ins in enumerate(plan.instructions):
        if ins.kind == OFFLOAD and i in stage_of:
            OUT_on.add((stage_of[i], ins.target))
        elif ins.kind == RELOAD and i in stage_of:
            t = stage_of[i]
            if m.overlap and t in first_read.get(ins.target, ()):
                t -= 1
            IN_on.add((t, ins.target))
    if not all(k in m.OUT for k in OUT_on) or not all(k in m.IN for k in IN_on):
        return None
    S_on = set(S_on)
    H_on = set()
    for v in {v for _, v in OUT_on}:
        outs = sorted(t for t, w in OUT_on if w == v)
        ins_ = sorted(t for t, w in IN_on if w == v)
        for t_out, t_in in zip(outs, ins_):
            for t in range(t_out + 1, t_in + 1):
                S_on.discard((t, v))
                H_on.add((t, v))
    x = solution_vector(f, R_on, S_on)
    for key in OUT_on:
        x[m.OUT[key]] = 1.0
    for key in IN_on:
        x[m.IN[key]] = 1.0
    for key in H_on:
        if key not in m.H:
            return None
        x[m.H[key]] = 1.0
    nodes = graph.nodes
    for t, col in m.D.items():
        compute = sum(nodes[i].cost for i in f.positions[t][:-1] if (t, i) in R_on)
        copies = sum(m.out_seconds[v] for (s, v) in OUT_on if s == t) + sum(m.in_seconds[v] for (s, v) in IN_on if s == t)
        x[col] = max(compute, copies - nodes[t].cost)
    for i, col in m.Z.items():
        x[col] = 1.0 if any((t, i) in R_on for t in range(len(f.positions))) else 0.0
    for u in sorted(f.U.values()):  # the memory recurrence again, now with the swaps
        r = f.u_rows[u]
        x[u] = f.row_lower[r] - sum(a * x[c] for c, a in zip(f.row_index[r], f.row_value[r]) if c != u)
    if f.budget_col is not None:
        x[f.budget_col] = max(
            sum(a * x[c] for c, a in zip(f.row_index[r], f.row_value[r]) if c != f.budget_col) - f.row_upper[r]
            for r in f.memory_rows
        )
    return x


# ------------------------------------------------------------------------------ solving
def solve_swap_milp(
    graph: Graph,
    budget_bytes: int | None,
    *,
    time_limit: float | None = None,
    gap: float = 1e-6,
    threads: int | None = None,
    no_spill: bool = False,
    warm_start: bool = True,
    quiet: bool = False,
    model_budget_bytes: int | None = None,
    repairs: int = 0,
    warm_plans=(),
) -> Plan:
    """The swap MILP's optimal (within ``gap``) plan of ``graph`` under ``budget_bytes``
    (``None``: the plan of smallest peak, then least step time). Raises :class:`SolverError`
    when HiGHS finds no solution in time. See the module docstring for the model.

    ``warm_start``: start HiGHS from the best of the baselines' plans, ``warm_plans`` and (when no
    ``warm_plans`` are given) the ``hybrid`` greedy's plan that the model can express.
    ``model_budget_bytes`` (default ``budget_bytes``): the budget inside the model. When the
    simulated plan of the barrier model peaks over ``budget_bytes`` (a channel-bound stage spilled
    past its barrier), the model is solved again without spill; ``repairs`` counts those re-solves."""
    import highspy

    from .checkmate import warm_start_plans, formulation_info, run_highs

    start = time.perf_counter()
    limit = DEFAULT_TIME_LIMIT if time_limit is None else float(time_limit)
    model_budget = budget_bytes if model_budget_bytes is None else model_budget_bytes
    m = build_swap(graph, model_budget, no_spill=no_spill)
    f = m.f
    h = to_highs(f)
    info: dict = {"formulation": {**formulation_info(f), "swap binaries": len(m.OUT) + len(m.IN)}, "time model": m.model_name}
    best = None  # (objective, vector, solver) of the best warm start
    if warm_start:
        plans = warm_start_plans(graph, model_budget if model_budget is not None else 0) + list(warm_plans)
        if model_budget is not None and not warm_plans:  # the greedy, when no caller passed its plan
            try:
                plans.append(SOLVERS["hybrid"](graph, model_budget, time_limit=max(1.0, min(WARM_GREEDY_TIME_LIMIT, limit / 4))))
            except RematError:
                pass
        for p in plans:
            x = _warm_vector(m, p)
            if x is not None and _feasible(f, x):
                value = float(np.dot(f.col_cost, x))
                if best is None or value < best[0]:
                    best = (value, x, p.solver)
        if best is not None:
            if set_start(h, best[1]):
                info["warm start"] = best[2]
    status, hinfo, x = run_highs(h, max(min(1.0, limit), limit - (time.perf_counter() - start)), gap, threads)
    info["solve seconds"] = round(h.getRunTime(), 3)
    status_name = h.modelStatusToString(status)
    if x is None and best is not None and status != highspy.HighsModelStatus.kInfeasible:
        x = best[1]  # stopped before reading the warm start
    if x is None:
        if status == highspy.HighsModelStatus.kInfeasible and budget_bytes is not None:  # no plan fits: the smallest
            plan = solve_swap_milp(graph, None, time_limit=max(1.0, limit - (time.perf_counter() - start)),
                                   gap=1e-4, threads=threads, no_spill=no_spill, warm_start=warm_start, quiet=True,
                                   warm_plans=warm_plans)
            if plan.peak_bytes <= budget_bytes:  # a repair's lowered model budget was too low; this fits
                plan.info["status"] = (f"no plan within the model's budget {model_budget} bytes; its smallest-peak plan "
                                       f"fits {budget_bytes} (not proven optimal)")
            else:
                plan.info["status"] = f"infeasible at {budget_bytes} bytes; smallest peak shown"
            return plan
        raise SolverError(
            f"checkmate_swap found no plan for {graph.name!r} within {limit:.3g} s (HiGHS: {status_name}); "
            "raise time_limit, or use solver='hybrid' or a coarser graph (remat.solvers.coarsen.coarsen_graph)"
        )
    R_on, _ = decode(f, x)
    OUT_on, IN_on = _on(m.OUT, x), _on(m.IN, x)
    optimal = status == highspy.HighsModelStatus.kOptimal
    minimising_time = budget_bytes is not None
    info.update(
        status="optimal" if optimal else status_name,
        gap=float(hinfo.mip_gap) if math.isfinite(hinfo.mip_gap) else None,
        objective_seconds=model_seconds(m, R_on, OUT_on, IN_on),
        bound_seconds=(hinfo.mip_dual_bound * f.cost_scale + f.constant_cost
                       if minimising_time and math.isfinite(hinfo.mip_dual_bound) else None),
        swaps=len(OUT_on),
    )
    plan = decode_plan(m, R_on, OUT_on, IN_on, solver="checkmate_swap", info=info)
    plan.info["simulated step seconds"] = plan.step_seconds
    if budget_bytes is not None and plan.peak_bytes > budget_bytes:
        if not (m.overlap and not m.no_spill):  # the rows are exact or conservative: this would be a bug
            raise SolverError(
                f"internal error: checkmate_swap's plan ({m.model_name}) peaks at {plan.peak_bytes} bytes over its "
                f"budget {budget_bytes}"
            )
        left = max(1.0, limit - (time.perf_counter() - start))
        retry = solve_swap_milp(graph, budget_bytes, time_limit=left, gap=gap, threads=threads, no_spill=True,
                                warm_start=warm_start, quiet=quiet, repairs=repairs + 1, warm_plans=warm_plans,
                                model_budget_bytes=model_budget)
        retry.info.setdefault("repairs", []).insert(0, (
            f"the plan of the {m.model_name} model at {model_budget} bytes peaked at {plan.peak_bytes} in the simulator: "
            "solved again without spill"))
        return retry
    if not optimal and not quiet:
        warnings.warn(
            f"checkmate_swap stopped at its time limit ({limit:.3g} s) on {graph.name!r}: returning its best plan, "
            f"within {100 * (info['gap'] or 0):.2f}% of the model's optimum (HiGHS: {status_name})",
            SolverTimeLimitWarning,
            stacklevel=3,
        )
    return plan


@register("checkmate_swap")
def checkmate_swap(
    graph: Graph,
    budget_bytes: int | None,
    *,
    time_limit: float | None = None,
    gap: float = 1e-6,
    threads: int | None = None,
    warm_start: bool = True,
    warm_plans=(),
    **options,
) -> Plan:
    """Recomputation and swapping, solved exactly on small graphs (see the module docstring)."""
    if options:
        raise SolverError(f"checkmate_swap takes time_limit, gap, threads, warm_start and warm_plans; got {sorted(options)}")
    from ..simulate import has_transfer_costs

    if not has_transfer_costs(graph):
        raise SolverError(f"checkmate_swap needs transfer costs (graph.meta['transfer']) on {graph.name!r}")
    if budget_bytes is None:
        return SOLVERS["store_all"](graph, None)  # nothing to trade: store everything
    if len(graph.nodes) > MAX_NODES:
        raise SolverError(
            f"checkmate_swap solves graphs of at most {MAX_NODES} ops exactly; {graph.name!r} has {len(graph.nodes)}. "
            "Plan its coarsened graph (remat.solvers.coarsen.coarsen_graph) or use solver='hybrid'"
        )
    return solve_swap_milp(graph, budget_bytes, time_limit=time_limit, gap=gap, threads=threads, warm_start=warm_start,
                           warm_plans=warm_plans)


__all__ = ["checkmate_swap", "solve_swap_milp", "build_swap", "decode_plan", "SwapFormulation", "MAX_NODES"]

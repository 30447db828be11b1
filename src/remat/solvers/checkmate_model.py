"""Checkmate's rematerialization MILP over a :class:`~remat.graph.Graph`, built for HiGHS.

Stages ``t = 0..n-1`` follow the graph's node order (forward nodes first); stage ``t``
computes node ``t`` for the first time ("frontier-advancing") and may recompute
earlier forward nodes before it. Variables (Jain et al., MLSys 2020):

* ``R[t,i]`` binary — node ``i`` runs in stage ``t`` (``R[t,t] = 1``; zero above the diagonal);
* ``S[t,v]`` binary — value ``v`` is kept from stage ``t-1`` into stage ``t``;
* ``FREE[t,v,k]`` — ``v`` is dropped right after node ``k`` runs in stage ``t``:
  ``FREE = R[t,k] · (1 - S[t+1,v]) · Π_{later users j of v in stage t} (1 - R[t,j])``,
  linearised as ``FREE ≤`` each factor (it only lowers memory, so the solver pushes it up
  to the product; it can stay continuous because the factors are binary);
* ``U[t,k]`` — bytes in use right after node ``k`` runs in stage ``t``, before any frees:
  ``U[t,k] = U[t,k⁻] - Σ_v M_v FREE[t,v,k⁻] + M_k R[t,k]`` from
  ``U[t,first] = C_t + Σ_v M_v S[t,v] + M_first R[t,first]``; ``U[t,k] + W_k R[t,k] ≤ budget``
  (``W_k``: the op's workspace, and for a replay of a random op, ``k < t``, the generator state it
  holds aside while it runs).

Constraints: ``R[t,j] ≤ R[t,i] + S[t,v]`` for every input ``v`` (made by ``i``) of ``j``, and
``S[t+1,v] ≤ R[t,i] + S[t,v]``. Objective: ``min Σ C_i R[t,i]``. It is the simulator's
memory model: an op's inputs, outputs and workspace count together; tangents arrive at
the boundary and die at their last use; forward outputs stay to the end; gradients are kept.

Forward outputs (the loss, an output the graph returns, batch norm's new running statistics)
are held by the user, so recomputing their producer ``i`` in the backward makes a *second
copy*, which later readers read and the plan keeps to its last reader before ``i`` runs again.
``COPY[t,v]`` (that copy lives into stage ``t``), ``MADE[t,i]`` (``i`` was recomputed before
stage ``t``) and ``COPY_FREE[t,v,k]`` count it exactly (see :func:`_second_copies`). A forward
node whose output is a gradient (a backward output) is never recomputed: its last copy would
have to live to the end of the step beside the first.

What makes the model small (all exact, none cuts off an optimal plan):

* only forward nodes are recomputed (backward nodes run once, in their own stage), so
  every value made in the backward, every tangent and every forward output has a fixed,
  known lifetime and enters ``C_t`` as a constant instead of as variables;
* ``R[t,i]`` and ``S[t,v]`` exist only up to the last stage that can still need them
  (the *horizon*: the last backward reader, through chains of forward readers);
* ``FREE[t,v,k]`` exists only for recomputations ``k < t`` (frees after node ``t`` end the
  stage and only matter through ``S[t+1]``), and not at all when node ``t`` reads ``v``;
* a node reading an input that the step mutates is never recomputed in the backward, and a
  node with a forward output only in the backward (the user holds the first copy);
* dominance cuts, which only remove plans that do useless work: ``R[t,i] + S[t,v] ≤ 1``
  (never recompute what is kept), ``R[t,i] ≤ Σ later readers R[t,j] + Σ S[t+1,out]`` (a
  recomputation is read or kept), ``S[t,v] ≤ Σ readers R[t,j] + S[t+1,v]`` (so is a kept value);
* memory is divided by a power of two (exact in floating point) to keep coefficients near 1,
  costs by their total.

A random node's replay holds a generator state: the budget is reduced by that state's size
for every random node that may be recomputed (a few KiB; conservative).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from ..graph import ACTIVATION, FORWARD, Graph


@dataclass
class Formulation:
    """Index maps of the variables and the sparse rows of the Checkmate MILP for one graph."""

    graph: Graph
    budget_bytes: int
    num_forward: int
    horizon: list[int]  # per forward node: the last stage in which it may run
    need: dict[int, int]  # per variable value: the last stage that may read it
    R: dict[tuple[int, int], int] = field(default_factory=dict)  # (t, node) -> column
    S: dict[tuple[int, int], int] = field(default_factory=dict)  # (t, value) -> column
    FREE: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (t, value, node) -> column
    U: dict[tuple[int, int], int] = field(default_factory=dict)  # (t, node) -> column
    # second copies of forward outputs made by recomputations (see _second_copies)
    COPY: dict[tuple[int, int], int] = field(default_factory=dict)  # (t, value) -> column: a copy lives into stage t
    MADE: dict[tuple[int, int], int] = field(default_factory=dict)  # (t, node) -> column: node recomputed before stage t
    COPY_FREE: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (t, value, node) -> column
    copy_producer: dict[int, int] = field(default_factory=dict)  # forward output -> its producer, when recomputable
    positions: list[list[int]] = field(default_factory=list)  # per stage: nodes that may run, in order
    constant_bytes: list[int] = field(default_factory=list)  # C_t
    scale: float = 1.0  # bytes per memory unit
    cost_scale: float = 1.0
    rng_reserve: int = 0
    budget_col: int | None = None  # the budget as a variable (peak minimisation)
    u_rows: dict[int, int] = field(default_factory=dict)  # U column -> the equality row defining it
    memory_rows: list[int] = field(default_factory=list)  # rows bounding memory by the budget
    # rows other models extend (checkmate_swap): where a value is read, kept on, or cut as useless
    read_rows: list[tuple[int, int, int]] = field(default_factory=list)  # (t, value, row): v usable in stage t
    keep_rows: dict[tuple[int, int], int] = field(default_factory=dict)  # (t, v) -> row S[t+1,v] <= R + S[t,v]
    kept_cut_rows: dict[tuple[int, int], int] = field(default_factory=dict)  # (t, v) -> row S[t,v] <= readers + S[t+1,v]
    boundary_row: int | None = None  # the memory row at the forward/backward boundary
    save_row: int | None = None  # the row bounding what the forward keeps (with a save budget)
    # the model
    col_cost: list[float] = field(default_factory=list)
    col_lower: list[float] = field(default_factory=list)
    col_upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    row_lower: list[float] = field(default_factory=list)
    row_upper: list[float] = field(default_factory=list)
    row_index: list[list[int]] = field(default_factory=list)
    row_value: list[list[float]] = field(default_factory=list)

    @property
    def num_cols(self) -> int:
        return len(self.col_cost)

    @property
    def num_rows(self) -> int:
        return len(self.row_lower)

    @property
    def num_nonzeros(self) -> int:
        return sum(len(r) for r in self.row_index)

    @property
    def constant_cost(self) -> float:
        return sum(n.cost for n in self.graph.nodes)

    # ------------------------------------------------------------------ building blocks
    def _col(self, cost: float, lower: float, upper: float, integer: bool) -> int:
        self.col_cost.append(cost)
        self.col_lower.append(lower)
        self.col_upper.append(upper)
        self.integer.append(integer)
        return len(self.col_cost) - 1

    def _row(self, lower: float, upper: float, terms: dict[int, float]) -> None:
        terms = {c: v for c, v in terms.items() if v != 0.0}
        self.row_lower.append(lower)
        self.row_upper.append(upper)
        self.row_index.append(list(terms))
        self.row_value.append(list(terms.values()))

    def r_term(self, t: int, i: int) -> tuple[int | None, float]:
        """``R[t,i]`` as (column or None, constant)."""
        if i == t:
            return None, 1.0
        col = self.R.get((t, i))
        return (col, 0.0) if col is not None else (None, 0.0)


def value_roles(graph: Graph) -> tuple[set[int], set[int]]:
    """(variable values: forward activations the plan may drop; pinned: forward values kept to the end)."""
    values, nodes = graph.values, graph.nodes
    pinned = {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}
    for v in graph.backward_outputs:
        p = values[v].producer
        if values[v].kind == ACTIVATION and p is not None and nodes[p].phase == FORWARD:
            pinned.add(v)
    variable = {
        v for n in graph.forward_nodes for v in n.outputs if v not in pinned
    }
    return variable, pinned


def horizons(graph: Graph, variable: set[int], recomputable: set[int]) -> tuple[list[int], dict[int, int]]:
    """Last stage each forward node may run in, and last stage each variable value may be read in.

    ``need(v) = max over readers u of (u if u is a backward node else horizon(u))`` and
    ``horizon(i) = max(i, need(outputs of i))`` for recomputable ``i``, else ``i``.
    """
    users = graph.users
    num_forward = len(graph.forward_nodes)
    horizon = [n.id for n in graph.forward_nodes]
    need: dict[int, int] = {}
    for node in reversed(graph.forward_nodes):
        last = node.id
        for v in node.outputs:
            if v not in variable:
                continue
            nv = node.id
            for u in users[v]:
                nv = max(nv, u if u >= num_forward else horizon[u])
            need[v] = nv
            last = max(last, nv)
        if node.id in recomputable:
            horizon[node.id] = last
    return horizon, need


def recompute_windows(graph: Graph, pinned: set[int], horizon: list[int]) -> list[range]:
    """Per forward node, the stages in which it may be recomputed (before that stage's own node).

    From ``i + 1`` to its horizon, except: a node making a gradient is never recomputed (its last
    copy would live to the end beside the first); a node reading an input the step mutates
    (``meta['no_backward_recompute']``) only in the forward; a node with a forward output only
    after the boundary (the user holds that output from its computation to the boundary)."""
    values, num_forward = graph.values, len(graph.forward_nodes)
    no_bwd = set(graph.meta.get("no_backward_recompute", ()))
    has_pinned_output = {values[v].producer for v in pinned}
    backward_outputs = set(graph.backward_outputs)
    makes_gradient = {values[v].producer for v in pinned if v in backward_outputs}
    windows = []
    for i in range(num_forward):
        if i in makes_gradient:
            windows.append(range(0))
            continue
        last = min(horizon[i], num_forward - 1) if i in no_bwd else horizon[i]
        first = max(i + 1, num_forward) if i in has_pinned_output else i + 1
        windows.append(range(first, last + 1))
    return windows


def build(
    graph: Graph, budget_bytes: int | None, *, dominance_cuts: bool = True, save_budget_bytes: int | None = None
) -> Formulation:
    """The MILP (all R and S binary) for ``graph`` under ``budget_bytes``.

    With ``budget_bytes=None`` the budget becomes a variable ``B`` and the objective
    ``B + ε·cost``: the smallest peak any frontier-advancing plan reaches (and, among
    those, nearly the cheapest). ``save_budget_bytes`` (Rockmate's second budget) bounds what
    the forward leaves for the backward: ``Σ_v M_v S[n_f, v] ≤ save budget`` over the
    droppable forward values kept into the first backward stage (forward outputs excluded).
    """
    values, nodes, users = graph.values, graph.nodes, graph.users
    n = len(nodes)
    num_forward = len(graph.forward_nodes)
    variable, pinned = value_roles(graph)
    held = {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}  # the user's copies
    backward_outputs = set(graph.backward_outputs)
    horizon, need = horizons(graph, variable, set(range(num_forward)))
    windows = recompute_windows(graph, pinned, horizon)
    window = windows.__getitem__

    rng_bytes = int(graph.meta.get("rng_state_bytes", 0))
    random_recomputable = sum(1 for i in range(num_forward) if nodes[i].random and len(window(i)))
    max_bytes = max([values[v].bytes for v in range(len(values))] + [budget_bytes or 0, 1])
    scale = 2.0 ** max(0, math.floor(math.log2(max_bytes)) - 10)  # ~1000 units for the largest
    total_cost = sum(nd.cost for nd in nodes)
    f = Formulation(graph, budget_bytes, num_forward, horizon, need, scale=scale)
    f.cost_scale = total_cost if total_cost > 0 else 1.0
    f.rng_reserve = rng_bytes * random_recomputable
    if budget_bytes is None:  # minimise the peak: B is a column, memory rows read "... - B <= -reserve"
        f.budget_col = f._col(1.0, 0.0, math.inf, False)
        cap = -f.rng_reserve / scale
        f.cost_scale *= 1e6  # costs only break ties between plans of the same peak
    else:
        cap = (budget_bytes - f.rng_reserve) / scale

    # ---- variables R and S
    for i in range(num_forward):
        for t in window(i):
            f.R[(t, i)] = f._col(nodes[i].cost / f.cost_scale, 0.0, 1.0, True)
    for v in sorted(variable):
        p = values[v].producer
        for t in range(p + 1, need[v] + 1):
            f.S[(t, v)] = f._col(0.0, 0.0, 1.0, True)
    copies = _second_copies(f, held, window)

    # ---- constant bytes at the start of each stage: values whose lifetime the model fixes
    delta = [0] * (n + 1)  # difference array over stages

    def live(v: int, first: int, last: int) -> None:
        if first <= last:
            delta[first] += values[v].bytes
            delta[last + 1] -= values[v].bytes

    for v in pinned:
        live(v, values[v].producer + 1, n - 1)
    for node in graph.backward_nodes:
        for v in node.outputs:
            last = n - 1 if v in backward_outputs else max(users[v], default=node.id)
            live(v, node.id + 1, last)
    for v in graph.tangents:
        last = n - 1 if v in backward_outputs or not users[v] else max(users[v])
        live(v, num_forward, last)
    running = 0
    for t in range(n):
        running += delta[t]
        f.constant_bytes.append(running)

    # ---- per stage: correctness, frees, memory
    for t in range(n):
        pos = [i for i in range(min(t, num_forward)) if (t, i) in f.R] + [t]
        f.positions.append(pos)
        running_nodes = set(pos)
        # correctness: every input of a node that runs is kept or computed in this stage
        for j in pos:
            rj, cj = f.r_term(t, j)
            for v in nodes[j].inputs:
                if v not in variable:
                    continue
                ri, _ = f.r_term(t, values[v].producer)
                terms = {f.S[(t, v)]: -1.0}
                if ri is not None:
                    terms[ri] = -1.0
                f.read_rows.append((t, v, f.num_rows))
                if rj is None:  # R[t,t] = 1
                    f._row(-math.inf, -cj, terms)
                else:
                    terms[rj] = terms.get(rj, 0.0) + 1.0
                    f._row(-math.inf, 0.0, terms)
        # S[t+1,v] <= R[t,p] + S[t,v]
        for v in variable:
            if (t + 1, v) not in f.S or (t, v) not in f.S:
                continue
            ri, _ = f.r_term(t, values[v].producer)
            terms = {f.S[(t + 1, v)]: 1.0, f.S[(t, v)]: -1.0}
            if ri is not None:
                terms[ri] = -1.0
            f.keep_rows[(t, v)] = f.num_rows
            f._row(-math.inf, 0.0, terms)
        # dominance: never recompute a node while one of its outputs is kept
        if dominance_cuts:
            for i in pos[:-1]:
                for v in nodes[i].outputs:
                    if (t, v) in f.S:
                        f._row(-math.inf, 1.0, {f.R[(t, i)]: 1.0, f.S[(t, v)]: 1.0})
        if dominance_cuts:
            # a recomputation is read later in the stage or kept; a kept value is read or kept on
            for i in pos[:-1]:
                terms = {f.R[(t, i)]: 1.0}
                useful = False
                for v in nodes[i].outputs:
                    readers = [j for j in users[v] if j in running_nodes and j > i]
                    if t in readers or v in pinned:
                        useful = True
                        break
                    for j in readers:
                        terms[f.R[(t, j)]] = terms.get(f.R[(t, j)], 0.0) - 1.0
                    if (t + 1, v) in f.S:
                        terms[f.S[(t + 1, v)]] = terms.get(f.S[(t + 1, v)], 0.0) - 1.0
                if not useful:
                    f._row(-math.inf, 0.0, terms)
            for v in variable:
                if (t, v) not in f.S:
                    continue
                readers = [j for j in users[v] if j in running_nodes]
                if t in readers:
                    continue
                terms = {f.S[(t, v)]: 1.0}
                for j in readers:
                    terms[f.R[(t, j)]] = -1.0
                if (t + 1, v) in f.S:
                    terms[f.S[(t + 1, v)]] = -1.0
                f.kept_cut_rows[(t, v)] = f.num_rows
                f._row(-math.inf, 0.0, terms)
        # FREE[t,v,k] for recomputations k < t
        frees_at: dict[int, list[tuple[int, int]]] = {}
        for k in pos[:-1]:
            rk = f.R[(t, k)]
            for v in dict.fromkeys(nodes[k].inputs + nodes[k].outputs):
                if v not in variable or t in users[v]:
                    continue
                nxt = f.S.get((t + 1, v))
                later = [j for j in users[v] if k < j and j in running_nodes]
                col = f._col(0.0, 0.0, 1.0, False)
                f.FREE[(t, v, k)] = col
                f._row(-math.inf, 0.0, {col: 1.0, rk: -1.0})
                if nxt is not None:
                    f._row(-math.inf, 1.0, {col: 1.0, nxt: 1.0})
                for j in later:
                    f._row(-math.inf, 1.0, {col: 1.0, f.R[(t, j)]: 1.0})
                frees_at.setdefault(k, []).append((v, col))
        for v in copies:
            _copy_frees(f, t, v, pos, frees_at)
        # memory after each position
        prev = None
        for k in pos:
            u = f._col(0.0, 0.0, math.inf, False)
            f.U[(t, k)] = u
            mk = sum(values[v].bytes for v in nodes[k].outputs) / scale
            rk, ck = f.r_term(t, k)
            terms: dict[int, float] = {u: 1.0}
            const = 0.0
            if rk is None:
                const += mk * ck
            else:
                terms[rk] = -mk
            if prev is None:
                const += f.constant_bytes[t] / scale
                for v in variable:
                    col = f.S.get((t, v))
                    if col is not None:
                        terms[col] = terms.get(col, 0.0) - values[v].bytes / scale
                for v in copies:
                    col = f.COPY.get((t, v))
                    if col is not None:
                        terms[col] = -values[v].bytes / scale
            else:
                terms[f.U[(t, prev)]] = -1.0
                for v, col in frees_at.get(prev, ()):
                    terms[col] = terms.get(col, 0.0) + values[v].bytes / scale
            f.u_rows[u] = f.num_rows
            f._row(const, const, terms)  # U - (…) == const
            ws = nodes[k].workspace / scale
            if nodes[k].random and k != t:  # a replay holds the generator's current state aside while it runs
                ws += rng_bytes / scale
            bound = {u: 1.0} if rk is None else {u: 1.0, rk: ws}
            if f.budget_col is not None:
                bound[f.budget_col] = -1.0
            f.memory_rows.append(f.num_rows)
            f._row(-math.inf, cap - ws if rk is None else cap, bound)
            prev = k
    # ---- the boundary: every tangent arrives while the forward's kept values are resident
    if num_forward < n:
        t = num_forward
        unused = sum(values[v].bytes for v in graph.tangents if not users[v] and v not in backward_outputs)
        const = (f.constant_bytes[t] + unused) / scale
        terms = {f.S[(t, v)]: values[v].bytes / scale for v in variable if (t, v) in f.S}
        if f.budget_col is not None:
            terms[f.budget_col] = -1.0
        f.memory_rows.append(f.num_rows)
        f.boundary_row = f.num_rows
        f._row(-math.inf, cap - const, terms)
    if save_budget_bytes is not None and num_forward < n:
        t = num_forward
        terms = {f.S[(t, v)]: values[v].bytes / scale for v in variable if (t, v) in f.S}
        if terms:
            f.save_row = f.num_rows
            f._row(-math.inf, save_budget_bytes / scale, terms)
    return f


def with_save_budget(f: Formulation, save_budget_bytes: int) -> Formulation:
    """``f`` (built with a save budget) under another save budget: only that row's bound differs."""
    if f.save_row is None:
        return f
    other = copy.copy(f)
    other.row_upper = list(f.row_upper)
    other.row_upper[f.save_row] = save_budget_bytes / f.scale
    return other


def _second_copies(f: Formulation, held: set[int], window) -> list[int]:
    """Columns and rows for the second copies of forward outputs; returns the values concerned.

    The user holds the first copy of a forward output ``v`` (made by node ``i``) to the end of the
    step; that copy is a constant in ``C_t``. Recomputing ``i`` in a backward stage makes a second
    copy, and every later reader of ``v`` reads the newest copy, which the plan keeps to its last
    reader before ``i`` runs again (:meth:`~remat.plan.Plan.from_schedule`). So the second copy
    lives into stage ``t`` exactly when a copy was made before ``t`` (``MADE[t,i]``), ``i`` does not
    run in ``t``, and ``v`` is read in ``t`` or the copy lives into ``t+1``::

        MADE[t,i] ≥ MADE[t-1,i],  MADE[t,i] ≥ R[t-1,i]
        COPY[t,v] ≥ COPY[t+1,v] - R[t,i]
        COPY[t,v] ≥ MADE[t,i] + R[t,j] - R[t,i] - 1     for every reader j of v that may run in t

    Both are continuous and only bounded below; memory grows with ``COPY``, so a solution may
    over-count but never under-count, and the cheapest setting is exact. ``COPY[t,v]`` is counted
    at the start of stage ``t`` like ``S[t,v]``; within a stage the copy is dropped by
    ``COPY_FREE`` (:func:`_copy_frees`).
    """
    graph = f.graph
    values, users, num_forward = graph.values, graph.users, f.num_forward
    concerned = []
    for v in sorted(held):
        i = values[v].producer
        stages = window(i)
        if i is None or not len(stages):
            continue
        concerned.append(v)
        f.copy_producer[v] = i
        last = max((u if u >= num_forward else f.horizon[u] for u in users[v]), default=-1)
        for t in range(stages.start + 1, last + 1):
            f.COPY[(t, v)] = f._col(0.0, 0.0, 1.0, False)
            if (t, i) not in f.MADE:
                f.MADE[(t, i)] = f._col(0.0, 0.0, 1.0, False)
                terms = {f.MADE[(t, i)]: -1.0}
                if (t - 1, i) in f.MADE:
                    f._row(-math.inf, 0.0, {**terms, f.MADE[(t - 1, i)]: 1.0})
                if (t - 1, i) in f.R:
                    f._row(-math.inf, 0.0, {**terms, f.R[(t - 1, i)]: 1.0})
    for (t, v), col in f.COPY.items():
        i = f.copy_producer[v]
        ri = f.R.get((t, i))
        nxt = f.COPY.get((t + 1, v))
        if nxt is not None:  # COPY[t+1] - COPY[t] - R[t,i] <= 0
            f._row(-math.inf, 0.0, {nxt: 1.0, col: -1.0, **({ri: -1.0} if ri is not None else {})})
        for j in users[v]:
            rj = f.R.get((t, j))
            if j != t and rj is None:
                continue
            terms = {f.MADE[(t, i)]: 1.0, col: -1.0}
            if ri is not None:
                terms[ri] = -1.0
            if j == t:  # R[t,t] = 1
                f._row(-math.inf, 0.0, terms)
            else:
                terms[rj] = 1.0
                f._row(-math.inf, 1.0, terms)
    return concerned


def _copy_frees(f: Formulation, t: int, v: int, pos: list[int], frees_at: dict) -> None:
    """``COPY_FREE[t,v,k]``: the second copy of forward output ``v`` is dropped right after node ``k``
    (its producer or a reader) runs in stage ``t``, before node ``t``:
    ``≤ R[t,k]``, ``≤ 1 - COPY[t+1,v]``, ``≤ 1 - R[t,j]`` for every later reader ``j`` in the stage,
    and, after a reader, ``≤ COPY[t,v] + R[t,i]`` (there is a copy to drop). As with ``FREE``, the
    solver pushes it up to the product; none when node ``t`` reads ``v`` (the stage ends with it)."""
    graph = f.graph
    users = graph.users
    i = f.copy_producer[v]
    if t in users[v]:
        return
    running = set(pos)
    here = f.COPY.get((t, v))
    ri = f.R.get((t, i))
    nxt = f.COPY.get((t + 1, v))
    for k in pos[:-1]:
        if k != i and k not in users[v]:
            continue
        if k != i and here is None and ri is None:
            continue  # no second copy can exist in this stage: a reader reads the user's copy
        col = f._col(0.0, 0.0, 1.0, False)
        f.COPY_FREE[(t, v, k)] = col
        f._row(-math.inf, 0.0, {col: 1.0, f.R[(t, k)]: -1.0})
        if nxt is not None:
            f._row(-math.inf, 1.0, {col: 1.0, nxt: 1.0})
        for j in users[v]:
            if k < j and j in running:
                f._row(-math.inf, 1.0, {col: 1.0, f.R[(t, j)]: 1.0})
        if k != i:
            terms = {col: 1.0}
            if here is not None:
                terms[here] = -1.0
            if ri is not None:
                terms[ri] = -1.0
            f._row(-math.inf, 0.0, terms)
        frees_at.setdefault(k, []).append((v, col))


def set_start(h, x) -> bool:
    """Hand HiGHS the vector ``x`` as a starting solution; whether it took it."""
    import highspy

    sol = highspy.HighsSolution()
    sol.col_value = list(x)
    sol.value_valid = True
    return h.setSolution(sol) == highspy.HighsStatus.kOk


def to_highs(f: Formulation, *, relax: bool = False):
    """A ``highspy.Highs`` instance holding ``f`` (``relax``: the LP relaxation)."""
    import highspy

    lp = highspy.HighsLp()
    lp.num_col_ = f.num_cols
    lp.num_row_ = f.num_rows
    lp.col_cost_ = np.asarray(f.col_cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(f.col_lower, dtype=np.float64)
    lp.col_upper_ = np.asarray([min(u, highspy.kHighsInf) for u in f.col_upper], dtype=np.float64)
    lp.row_lower_ = np.asarray([max(x, -highspy.kHighsInf) for x in f.row_lower], dtype=np.float64)
    lp.row_upper_ = np.asarray([min(x, highspy.kHighsInf) for x in f.row_upper], dtype=np.float64)
    starts = np.zeros(f.num_rows + 1, dtype=np.int32)
    starts[1:] = np.cumsum([len(r) for r in f.row_index])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = f.num_cols
    lp.a_matrix_.num_row_ = f.num_rows
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = np.asarray([c for r in f.row_index for c in r], dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray([x for r in f.row_value for x in r], dtype=np.float64)
    if not relax:
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in f.integer]
    h = highspy.Highs()
    h.silent()
    h.passModel(lp)
    return h


def schedule_from_R(f: Formulation, R_on: set[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The (forward, backward) compute sequences of a solution: stage by stage, nodes in order."""
    forward: list[int] = []
    backward: list[int] = []
    for t, pos in enumerate(f.positions):
        seq = forward if t < f.num_forward else backward
        seq.extend(k for k in pos if k == t or (t, k) in R_on)
    return forward, backward


def solution_vector(f: Formulation, R_on: set[tuple[int, int]], S_on: set[tuple[int, int]]) -> np.ndarray:
    """A full column vector for integral (R, S): FREE set to its product, U by the recurrence."""
    x = np.zeros(f.num_cols)
    for key, col in f.R.items():
        x[col] = 1.0 if key in R_on else 0.0
    for key, col in f.S.items():
        x[col] = 1.0 if key in S_on else 0.0
    users = f.graph.users
    for (t, v, k), col in f.FREE.items():
        if (t, k) not in R_on or (t + 1, v) in S_on:
            continue
        if any(k < j and (t, j) in R_on for j in users[v]):
            continue
        x[col] = 1.0
    _copy_solution(f, R_on, x)
    # each U is defined by one equality row over earlier columns: evaluate the rows in order
    for u in sorted(f.U.values()):
        r = f.u_rows[u]
        x[u] = f.row_lower[r] - sum(a * x[c] for c, a in zip(f.row_index[r], f.row_value[r]) if c != u)
    if f.budget_col is not None:  # the smallest budget this solution meets: the tightest memory row
        x[f.budget_col] = max(
            sum(a * x[c] for c, a in zip(f.row_index[r], f.row_value[r]) if c != f.budget_col) - f.row_upper[r]
            for r in f.memory_rows
        )
    return x


def _copy_solution(f: Formulation, R_on: set[tuple[int, int]], x: np.ndarray) -> None:
    """Set ``MADE``, ``COPY`` and ``COPY_FREE`` in ``x`` to their exact values for the recomputations ``R_on``."""
    users = f.graph.users
    for (t, i), col in f.MADE.items():
        x[col] = 1.0 if any((s, i) in R_on for s in range(t)) else 0.0
    copy: dict[tuple[int, int], bool] = {}
    for (t, v) in sorted(f.COPY, reverse=True):  # from the last stage back
        i = f.copy_producer[v]
        read = any(j == t or (t, j) in R_on for j in users[v])
        alive = x[f.MADE[(t, i)]] > 0.5 and (t, i) not in R_on and (read or copy.get((t + 1, v), False))
        copy[(t, v)] = alive
        x[f.COPY[(t, v)]] = 1.0 if alive else 0.0
    for (t, v, k), col in f.COPY_FREE.items():
        i = f.copy_producer[v]
        exists = k == i or copy.get((t, v), False) or (t, i) in R_on
        later = any(k < j and (t, j) in R_on for j in users[v])
        x[col] = 1.0 if (t, k) in R_on and exists and not later and not copy.get((t + 1, v), False) else 0.0


def decode(f: Formulation, x) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(R entries on, S entries on) of a solution vector, rounding at 0.5."""
    R_on = {key for key, col in f.R.items() if x[col] > 0.5}
    S_on = {key for key, col in f.S.items() if x[col] > 0.5}
    return R_on, S_on


__all__ = ["Formulation", "build", "recompute_windows", "value_roles", "horizons", "to_highs", "schedule_from_R", "solution_vector", "decode", "with_save_budget", "set_start"]

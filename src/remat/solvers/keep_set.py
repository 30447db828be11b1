"""The cheapest schedule of a graph when only what its forward keeps is bounded.

Rockmate's block menus (:mod:`remat.solvers.hierarchical`) ask, for a grid of *save budgets*
``s``: what is the least compute with which the block's backward can run if its forward keeps
at most ``s`` bytes for it, memory being otherwise unbounded? The Checkmate MILP answers that
with thousands of variables (every stage, every value); without a peak to respect the question
is much smaller, and this module answers it exactly with a MILP of one variable per forward node
and per forward value.

With memory unbounded, a schedule is fixed by the set ``K`` of forward values kept across the
boundary: the forward runs once; before each backward op, the producers of what it reads that
is neither kept nor recomputed yet are recomputed (recursively, from kept values and inputs),
and what is recomputed stays until its last use. Recomputing a node twice never pays, so the
least compute is::

    min  Σ_i c_i X_i
    s.t. K_v + X_p(v) ≥ 1            for every droppable forward value v a backward op reads
         K_u + X_p(u) ≥ X_i          for every droppable input u of a forward node i
         Σ_v M_v K_v ≤ s
         X_i = 0                     where node i cannot run in the backward (reads a mutated input)

over binary ``X_i`` (node ``i`` is recomputed) and ``K_v`` (value ``v`` is kept), "droppable"
being the forward values that are not forward outputs (:func:`~remat.solvers.checkmate_model.value_roles`).
Among the cheapest, a second solve keeps the fewest bytes. The schedule is then built by
:func:`~remat.solvers.schedule.backward_with_recomputation`, whose recomputations are exactly the
nodes the kept set forces, so its compute is the optimum. It is also a feasible point of the
Checkmate MILP with the same save budget whenever the latter's peak bound is at least this
schedule's peak, and then an optimal one.
"""

from __future__ import annotations

import math

import numpy as np

from ..graph import Graph
from .checkmate_model import value_roles
from .schedule import backward_with_recomputation


class KeepSetModel:
    """The MILP of the module docstring for one graph; :meth:`solve` per save budget."""

    def __init__(self, graph: Graph):
        self.graph = graph
        values, nodes = graph.values, graph.nodes
        variable, _pinned = value_roles(graph)
        fixed = set(graph.meta.get("no_backward_recompute", ()))
        forward = [n.id for n in graph.forward_nodes]
        self.x_col = {i: k for k, i in enumerate(forward)}
        self.k_col = {v: len(forward) + k for k, v in enumerate(sorted(variable))}
        self.num_cols = len(forward) + len(variable)
        self.variable = variable
        rows: list[tuple[float, dict[int, float]]] = []  # (lower bound, terms) of "terms >= lower"
        read_by_backward = {v for n in graph.backward_nodes for v in n.inputs if v in variable}
        for v in sorted(read_by_backward):
            rows.append((1.0, {self.k_col[v]: 1.0, self.x_col[values[v].producer]: 1.0}))
        for i in forward:
            for u in dict.fromkeys(nodes[i].inputs):
                if u in variable:
                    rows.append((0.0, {self.k_col[u]: 1.0, self.x_col[values[u].producer]: 1.0,
                                       self.x_col[i]: -1.0}))
        self.rows = rows
        self.upper = np.ones(self.num_cols)
        for i in fixed:
            if i in self.x_col:
                self.upper[self.x_col[i]] = 0.0
        total_cost = sum(nodes[i].cost for i in forward)
        self.cost_scale = total_cost if total_cost > 0 else 1.0
        self.cost = np.zeros(self.num_cols)
        for i in forward:
            self.cost[self.x_col[i]] = nodes[i].cost / self.cost_scale
        total_bytes = sum(values[v].bytes for v in variable)
        self.byte_scale = float(total_bytes) if total_bytes > 0 else 1.0
        self.bytes = np.zeros(self.num_cols)
        for v in variable:
            self.bytes[self.k_col[v]] = values[v].bytes / self.byte_scale

    def _highs(self, objective: np.ndarray, extra_rows: list[tuple[float, float, np.ndarray]]):
        import highspy

        lp = highspy.HighsLp()
        n = self.num_cols
        lp.num_col_ = n
        lower = [r[0] for r in self.rows] + [r[0] for r in extra_rows]
        upper = [highspy.kHighsInf] * len(self.rows) + [r[1] for r in extra_rows]
        index = [list(r[1]) for r in self.rows] + [list(np.flatnonzero(r[2])) for r in extra_rows]
        value = [list(r[1].values()) for r in self.rows] + [list(r[2][np.flatnonzero(r[2])]) for r in extra_rows]
        lp.num_row_ = len(lower)
        lp.col_cost_ = np.asarray(objective, dtype=np.float64)
        lp.col_lower_ = np.zeros(n)
        lp.col_upper_ = np.asarray(self.upper, dtype=np.float64)
        lp.row_lower_ = np.asarray([max(x, -highspy.kHighsInf) for x in lower], dtype=np.float64)
        lp.row_upper_ = np.asarray(upper, dtype=np.float64)
        starts = np.zeros(len(lower) + 1, dtype=np.int32)
        starts[1:] = np.cumsum([len(r) for r in index])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_ = n
        lp.a_matrix_.num_row_ = len(lower)
        lp.a_matrix_.start_ = starts
        lp.a_matrix_.index_ = np.asarray([c for r in index for c in r], dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray([x for r in value for x in r], dtype=np.float64)
        lp.integrality_ = [highspy.HighsVarType.kInteger] * n
        h = highspy.Highs()
        h.silent()
        h.passModel(lp)
        h.setOptionValue("mip_rel_gap", 0.0)
        h.setOptionValue("mip_abs_gap", 1e-12)
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        return np.round(np.asarray(h.getSolution().col_value))

    def solve(self, save_budget_bytes: int) -> set[int] | None:
        """The kept set of least compute within ``save_budget_bytes`` of droppable forward values,
        fewest bytes among the cheapest (None when none fits: nodes that cannot be recomputed need
        more)."""
        budget = save_budget_bytes / self.byte_scale * (1 + 1e-12)
        x = self._highs(self.cost, [(-math.inf, budget, self.bytes)])
        if x is None:
            return None
        best = float(self.cost @ x)
        y = self._highs(self.bytes, [(-math.inf, budget, self.bytes),
                                     (-math.inf, best + 1e-9 * max(best, 1.0), self.cost)])
        if y is not None:
            x = y
        return {v for v, col in self.k_col.items() if x[col] > 0.5}

    def schedule(self, kept: set[int], *, lean: bool = False) -> tuple[list[int], list[int]]:
        """The (forward, backward) schedule keeping ``kept``: recomputed values stay until their last
        use, or with ``lean`` only until the backward op that needs them (more compute, lower peak)."""
        forward = [n.id for n in self.graph.forward_nodes]
        backward = backward_with_recomputation(self.graph, kept=kept, segment_of={i: i for i in forward},
                                               drop_after_each_op=lean)
        return forward, backward


__all__ = ["KeepSetModel"]

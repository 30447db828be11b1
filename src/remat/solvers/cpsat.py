"""Moccasin's interval formulation on OR-Tools CP-SAT (``cpsat``): Checkmate's plans, O(n) variables.

The plan space is the MILP's (:mod:`remat.solvers.checkmate_model`): stage ``t`` runs node ``t``,
before it forward nodes may be recomputed, in graph order, within the node's window
(:func:`~remat.solvers.checkmate_model.recompute_windows`). Instead of a binary per (stage, node)
and per (stage, value), each forward node ``i`` has at most ``copies`` computations (Bartan et al.,
ICML 2023), the first fixed and the others optional, and each value a *retention interval* per
computation. The stages are laid out on one time line of positions ``P(t, k)``: stage ``t``'s
recomputations in graph order, then node ``t``.

* ``present[i,d]`` (``d ≥ 1``) — the ``d``-th recomputation of ``i`` happens, at position
  ``start[i,d] ∈ {P(t, i) : t in window(i)}``; copies are ordered: ``present[i,d+1] ⇒ present[i,d]``
  and ``start[i,d+1] > start[i,d]``; copy ``0`` is the first computation, at ``P(i, i)``;
* ``end[v,d]`` — the last position at which copy ``d`` of value ``v`` is resident;
* every computation at position ``r`` reads the *newest* copy of each input made before ``r``
  (as :meth:`~remat.plan.Plan.from_schedule` runs it), so for each input ``v`` of it and copy ``d``
  of ``v``'s producer: ``started(d, r) ∧ ¬started(d+1, r) ⇒ end[v,d] ≥ r``, with the literal
  ``started(d, r) ⇔ present[i,d] ∧ start[i,d] ≤ r``;
* memory: one cumulative constraint over the time line, every interval ``[start, end]`` demanding
  its value's bytes, each computation its workspace at its position, plus fixed intervals for what
  the plan does not choose (backward values and tangents to their last reader, forward outputs
  the user holds and gradients to the end, and a random node's generator state from its first
  run to its last replay, as the simulator counts it -- the MILP reserves it for the whole step;
  a replay also holds the generator's current state aside at its position, like a workspace);
  capacity = budget;
* objective: ``min Σ cost(i) · present[i,d]`` (costs in integer units of ``1e-7`` of the largest).

A position where nothing runs holds no more than the next position where something does, so the
cumulative bound is exactly the simulator's peak for the tightest ends. With ``copies`` at least the
most times an optimal plan computes one node, the optimum is the MILP's; each extra copy adds
variables, so the default (3: two recomputations per node) is a trade. Values are counted in units of
the greatest common divisor of all sizes, exactly. The search is warm-started (a hint) from the
cheapest heuristic plan that fits, among them the plan of the stage bound's solution
(:func:`~remat.solvers.stage_bound.guided_plan`: when it fits, it often costs the bound); a start
whose recomputation meets the stage bound (below) is returned as it is, proven optimal, with no
search. At the time limit the best plan found is returned with its gap.
It stops earlier once its plan is proven within ``NEGLIGIBLE_OVERHEAD`` (0.1%) of store_all's
compute of the optimum (an absolute gap limit): that plan is reported ``"optimal"`` with its
remaining gap in ``info["gap"]`` and as a fraction of the step in ``info["gap_of_step"]``.
When nothing fits, the same model with the capacity as a variable finds the smallest peak.
Under a budget the objective is also bounded below by :mod:`remat.solvers.stage_bound` (the cheapest
recomputation one stage alone needs, the largest over the stages): CP-SAT's own bound is weak on
these models (ResNet-18 at 70%: a gap of 50% after 60 s), and a plan that meets the stage bound is
proven optimal at once.
"""

from __future__ import annotations

import copy as copy_module
import math
import time
import warnings
from dataclasses import dataclass, field

from ..errors import SolverError, SolverTimeLimitWarning
from ..graph import ACTIVATION, Graph
from ..plan import Plan
from ..simulate import COMPUTE, fixed_order_lower_bound
from .checkmate_model import horizons, recompute_windows, value_roles
from .registry import SOLVERS, register
from .stage_bound import guided_plan, stage_bound, time_for_bound

DEFAULT_TIME_LIMIT = 120.0
DEFAULT_COPIES = 3
DEFAULT_WORKERS = 8
COST_UNITS = 10_000_000  # the largest node's cost, in the objective's integer units
# A plan whose recomputations are proven to cost at most this fraction of the step more than the
# best plan's is final: the search stops there ("optimal" within that tolerance, ``info["gap_of_step"]``)
NEGLIGIBLE_OVERHEAD = 1e-3


def cost_units(graph: Graph) -> tuple[dict[int, int], float]:
    """(each forward node's cost in the objective's integer units, the largest ``COST_UNITS``;
    store_all's compute in those units)."""
    nodes = graph.nodes
    largest_cost = max((nd.cost for nd in nodes), default=0.0) or 1.0
    units = {i: int(round(nodes[i].cost / largest_cost * COST_UNITS)) for i in range(len(graph.forward_nodes))}
    return units, graph.store_all_seconds / largest_cost * COST_UNITS


@dataclass
class Timeline:
    """Positions of the stages on one line: ``index[(t, k)]`` for every node ``k`` that may run in stage ``t``."""

    graph: Graph
    windows: list[range]
    stages: list[list[int]] = field(default_factory=list)
    index: dict[tuple[int, int], int] = field(default_factory=dict)
    stage_of: dict[int, tuple[int, int]] = field(default_factory=dict)  # position -> (stage, node)

    @classmethod
    def of(cls, graph: Graph, windows: list[range]) -> "Timeline":
        line = cls(graph, windows)
        recomputed_in: dict[int, list[int]] = {}
        for i, window in enumerate(windows):
            for t in window:
                recomputed_in.setdefault(t, []).append(i)
        for t in range(len(graph.nodes)):
            stage = recomputed_in.get(t, []) + [t]
            line.stages.append(stage)
            for k in stage:
                line.stage_of[len(line.index)] = (t, k)
                line.index[(t, k)] = len(line.index)
        return line

    @property
    def length(self) -> int:
        return len(self.index)

    def own(self, k: int) -> int:
        """Position of node ``k``'s first computation (its own stage)."""
        return self.index[(k, k)]

    def last_of_stage(self, t: int) -> int:
        return self.index[(t, t)]


@dataclass
class Model:
    """The CP-SAT model of one graph and budget, with the variables a plan is read from."""

    cp: object
    line: Timeline
    present: dict[tuple[int, int], object]  # (node, copy >= 1) -> literal
    start: dict[tuple[int, int], object]  # (node, copy >= 1) -> position variable
    end: dict[tuple[int, int], object]  # (value, copy) -> last resident position (variable)
    capacity: object  # int, or the variable minimised when looking for the smallest peak
    unit: int  # bytes per memory unit
    cost_units: dict[int, int]
    copies: int
    step_units: float = 0.0  # store_all's compute in the objective's units
    info: dict = field(default_factory=dict)


def _gcd_of(numbers) -> int:
    g = 0
    for x in numbers:
        g = math.gcd(g, int(x))
    return g or 1


def build_model(graph: Graph, budget_bytes: int | None, *, copies: int = DEFAULT_COPIES) -> Model:
    """The CP-SAT model of ``graph`` under ``budget_bytes`` (``None``: the capacity is a variable)."""
    b = _Builder(graph, copies)
    b.computations()
    b.generator_states()
    b.residency()
    b.fixed_lifetimes()
    b.newest_copy_reads()
    if budget_bytes is None:
        capacity = b.cp.new_int_var(0, sum(b.demands), "capacity")
    else:
        capacity = budget_bytes // b.unit
    b.cp.add_cumulative(b.intervals, b.demands, capacity)
    model = Model(b.cp, b.line, b.present, b.start, b.end, capacity, b.unit, b.cost_units, copies, b.step_units)
    model.info = {"intervals": len(b.intervals), "positions": b.line.length, "copies": copies, "memory unit bytes": b.unit}
    return model


class _Builder:
    """Builds :func:`build_model`'s variables and constraints, one kind per method."""

    def __init__(self, graph: Graph, copies: int):
        from ortools.sat.python import cp_model

        self.graph, self.copies, self.cp_model = graph, copies, cp_model
        self.cp = cp_model.CpModel()
        nodes, values = graph.nodes, graph.values
        self.num_forward = len(graph.forward_nodes)
        self.variable, self.pinned = value_roles(graph)
        self.horizon, self.need = horizons(graph, self.variable, set(range(self.num_forward)))
        self.windows = recompute_windows(graph, self.pinned, self.horizon)
        self.line = Timeline.of(graph, self.windows)
        self.end_of_step = self.line.length - 1
        self.rng_bytes = int(graph.meta.get("rng_state_bytes", 0))
        sizes = [v.bytes for v in values] + [nd.workspace for nd in nodes] + [self.rng_bytes]
        self.unit = _gcd_of(sizes)  # every demand a whole number of units: exact
        self.cost_units, self.step_units = cost_units(graph)
        self.intervals: list = []
        self.demands: list[int] = []
        self.present: dict[tuple[int, int], object] = {}
        self.start: dict[tuple[int, int], object] = {}
        self.end: dict[tuple[int, int], object] = {}

    def demand(self, interval, nbytes: int) -> None:
        self.intervals.append(interval)
        self.demands.append(nbytes // self.unit)

    def hold(self, first: int, last: int, nbytes: int) -> None:
        """A fixed interval [first, last] of positions holding ``nbytes``."""
        if nbytes and first <= last:
            self.demand(self.cp.new_fixed_size_interval_var(first, last - first + 1, ""), nbytes)

    def computations(self) -> None:
        """Copy 0 of each node at its own position; copies 1.. optional, ordered, in its window; workspaces
        (a random node's copies also hold the generator's current state aside: they are replays)."""
        cp, line, nodes = self.cp, self.line, self.graph.nodes
        for i in range(self.num_forward):
            positions = [line.index[(t, i)] for t in self.windows[i]]
            replay_bytes = nodes[i].workspace + (self.rng_bytes if nodes[i].random else 0)
            for d in range(1, self.copies if positions else 1):
                self.present[(i, d)] = cp.new_bool_var(f"p{i}_{d}")
                self.start[(i, d)] = cp.new_int_var_from_domain(self.cp_model.Domain.from_values(positions), f"s{i}_{d}")
                if d > 1:
                    cp.add_implication(self.present[(i, d)], self.present[(i, d - 1)])
                    cp.add(self.start[(i, d)] > self.start[(i, d - 1)]).only_enforce_if(self.present[(i, d)])
                if replay_bytes:
                    self.demand(cp.new_optional_fixed_size_interval_var(self.start[(i, d)], 1, self.present[(i, d)], ""),
                                replay_bytes)
        for node in nodes:
            self.hold(line.own(node.id), line.own(node.id), node.workspace)

    def generator_states(self) -> None:
        """A random node computed again keeps its generator state from its first run to its last replay
        (the state each replay holds aside: :meth:`computations`)."""
        cp, line = self.cp, self.line
        for i in range(self.num_forward):
            if not (self.graph.nodes[i].random and self.rng_bytes and (i, 1) in self.present):
                continue
            last = cp.new_int_var(line.own(i), self.end_of_step, f"rng{i}")
            for d in range(1, self.copies):
                if (i, d) in self.present:
                    cp.add(last >= self.start[(i, d)]).only_enforce_if(self.present[(i, d)])
            size = cp.new_int_var(1, self.end_of_step + 1, "")
            self.demand(cp.new_optional_interval_var(line.own(i), size, last + 1, self.present[(i, 1)], ""),
                        self.rng_bytes)

    def residency(self) -> None:
        """A retention interval ``[start, end]`` per copy of each forward value (the user's copy of a
        held output: fixed, to the end of the step)."""
        cp, line, values = self.cp, self.line, self.graph.values
        for i in range(self.num_forward):
            for v in self.graph.nodes[i].outputs:
                # a value is read up to stage need[v]; a recomputed copy may be made as late as horizon[i]
                reach = (self.end_of_step if v not in self.variable
                         else line.last_of_stage(max(self.need[v], self.horizon[i])))
                own = line.own(i)
                if v in self.pinned:
                    self.hold(own, self.end_of_step, values[v].bytes)
                else:
                    self.end[(v, 0)] = end = cp.new_int_var(own, reach, f"e{v}_0")
                    self.demand(cp.new_interval_var(own, end - own + 1, end + 1, ""), values[v].bytes)
                for d in range(1, self.copies):
                    if (i, d) not in self.present:
                        break
                    self.end[(v, d)] = end = cp.new_int_var(0, reach, f"e{v}_{d}")
                    size = cp.new_int_var(1, reach + 1, "")  # start + size = end + 1: resident from its computation
                    self.demand(cp.new_optional_interval_var(self.start[(i, d)], size, end + 1, self.present[(i, d)], ""),
                                values[v].bytes)

    def fixed_lifetimes(self) -> None:
        """What no plan changes: backward values to their last reader (gradients to the end), tangents
        from the boundary to their last reader."""
        graph, line = self.graph, self.line
        n, users, values = len(graph.nodes), graph.users, graph.values
        backward_outputs = set(graph.backward_outputs)
        for node in graph.backward_nodes:
            for v in node.outputs:
                last = n - 1 if v in backward_outputs else max(users[v], default=node.id)
                self.hold(line.own(node.id), line.last_of_stage(last), values[v].bytes)
        if self.num_forward < n:
            first_backward = line.index[(self.num_forward, line.stages[self.num_forward][0])]
            for v in graph.tangents:
                # an unread tangent goes after the first backward op
                last = n - 1 if v in backward_outputs else max(users[v], default=self.num_forward)
                self.hold(first_backward, line.last_of_stage(last), values[v].bytes)

    def newest_copy_reads(self) -> None:
        """Every computation reads the newest copy of each input made before it: that copy's
        interval reaches the reader (``started(d) ∧ ¬started(d+1) ⇒ end[v,d] ≥ r``)."""
        cp, graph = self.cp, self.graph
        values, nodes = graph.values, graph.nodes
        for j in range(len(nodes)):
            readings = [(None, self.line.own(j))]  # (presence literal, or None when certain; position)
            readings += [(self.present[(j, d)], self.start[(j, d)]) for d in range(1, self.copies) if (j, d) in self.present]
            for v in dict.fromkeys(nodes[j].inputs):
                i = values[v].producer
                if i is None or i >= self.num_forward or values[v].kind != ACTIVATION:
                    continue
                made = [0] + [d for d in range(1, self.copies) if (i, d) in self.present]
                if len(made) == 1 and (v, 0) not in self.end:
                    continue  # only the user's copy: resident throughout
                for occurring, r in readings:
                    started = [True] + [_started(cp, self.present[(i, d)], self.start[(i, d)], r) for d in made[1:]]
                    for d in made[2:]:
                        if started[d] is not None and started[d - 1] is not None:
                            cp.add_implication(started[d], started[d - 1])
                    for d in made:
                        if (v, d) not in self.end or started[d] is None:
                            continue  # the user's copy needs nothing; a copy not made by r serves nothing
                        enforce = [] if occurring is None else [occurring]
                        if started[d] is not True:
                            enforce.append(started[d])
                        if d + 1 < len(made) and started[d + 1] is not None:
                            enforce.append(started[d + 1].negated())
                        cp.add(self.end[(v, d)] >= r).only_enforce_if(enforce)


def _started(cp, present, start, r):
    """A literal for "this copy was made (``present``) at ``start`` no later than position ``r``",
    or None when it cannot have been (every position it may take is after ``r``)."""
    if isinstance(r, int) and min(_domain(start)) > r:
        return None
    lit = cp.new_bool_var("")
    cp.add_implication(lit, present)
    cp.add(start <= r).only_enforce_if(lit)
    cp.add(start > r).only_enforce_if([present, lit.negated()])
    return lit


def _domain(var) -> list[int]:
    bounds = list(var.proto.domain)
    return bounds[0::2]


# ------------------------------------------------------------------------------ plans in and out
def recomputations(plan: Plan, line: Timeline) -> dict[int, list[int]] | None:
    """Per forward node, the stages a frontier-advancing plan recomputes it in (None if the plan is
    not one the model can express)."""
    stages: dict[int, list[int]] = {}
    frontier, last_in_stage = 0, -1
    for ins in plan.instructions:
        if ins.kind != COMPUTE:
            continue
        c = ins.target
        if c == frontier:
            frontier, last_in_stage = frontier + 1, -1
            continue
        if c > frontier or (frontier, c) not in line.index or c <= last_in_stage:
            return None
        stages.setdefault(c, []).append(frontier)
        last_in_stage = c
    return stages


def hint(model: Model, stages: dict[int, list[int]]) -> bool:
    """Hint the solver with a plan's recomputations, its residency ends worked out as the plan
    frees (each read extends the newest copy). False if the model has too few copies for it."""
    if any(ts and (i, len(ts)) not in model.present for i, ts in stages.items()):
        return False
    graph, line, cp = model.line.graph, model.line, model.cp
    runs = sorted([(line.own(k), k, 0) for k in range(len(graph.nodes))]
                  + [(line.index[(t, i)], i, d + 1) for i, ts in stages.items() for d, t in enumerate(ts)])
    newest: dict[int, int] = {}
    ends: dict[tuple[int, int], int] = {}
    for r, k, d in runs:
        for v in graph.nodes[k].inputs:
            i = graph.values[v].producer
            key = (v, newest.get(i, 0))
            if key in model.end:
                ends[key] = max(ends.get(key, r), r)
        newest[k] = d
        for v in graph.nodes[k].outputs:
            if (v, d) in model.end:
                ends.setdefault((v, d), r)
    for (i, d), lit in model.present.items():
        made = d <= len(stages.get(i, ()))
        cp.add_hint(lit, made)
        if made:
            cp.add_hint(model.start[(i, d)], line.index[(stages[i][d - 1], i)])
    for key, var in model.end.items():
        if key in ends:
            cp.add_hint(var, ends[key])
    return True


def decode(model: Model, solver) -> Plan:
    """The plan of a solution: stage by stage, the recomputations in graph order, then the stage's node."""
    line = model.line
    recomputed = {line.stage_of[solver.value(model.start[key])] for key, lit in model.present.items() if solver.value(lit)}
    num_forward = len(line.graph.forward_nodes)
    forward: list[int] = []
    backward: list[int] = []
    for t, stage in enumerate(line.stages):
        (forward if t < num_forward else backward).extend(k for k in stage if k == t or (t, k) in recomputed)
    return Plan.from_schedule(line.graph, forward, backward, solver="cpsat")


# ------------------------------------------------------------------------------ solving
def _solver(time_limit: float, threads: int | None):
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, float(time_limit))
    # CP-SAT's portfolio (search, LP bounds, local search) wants about eight workers; fewer leave
    # the bound far behind (ResNet-18 at 70%: gap 0.95 with two, 0.59 with eight, on two cores)
    solver.parameters.num_workers = int(threads or DEFAULT_WORKERS)
    return solver


def solve_cpsat(
    graph: Graph,
    budget_bytes: int | None,
    *,
    time_limit: float | None = None,
    copies: int | None = DEFAULT_COPIES,
    threads: int | None = None,
    warm_plans=(),
    baselines: bool = True,
    quiet: bool = False,
    grow_copies: bool = True,
    _grown: bool = False,
) -> Plan:
    """The cheapest plan of ``graph`` under ``budget_bytes`` with at most ``copies - 1``
    recomputations per node (proven optimal unless ``plan.info['status']`` says otherwise);
    ``budget_bytes=None``: the plan of smallest peak. When no plan with ``copies`` fits, the count is
    doubled until it is :func:`most_copies` (``copies=None``: that count from the start), so an
    infeasible answer is the MILP's."""
    from ortools.sat.python import cp_model

    from .checkmate import proven_smallest

    began = time.perf_counter()
    limit = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    if budget_bytes is not None and budget_bytes < fixed_order_lower_bound(graph):
        if not grow_copies:
            return _baselines_smallest(graph, budget_bytes, "below the lower bound of every plan in the graph's order")
        return _smallest_peak(graph, budget_bytes, limit, threads)
    most = most_copies(graph)
    copies = most if copies is None or budget_bytes is None else min(copies, most)
    candidates = _warm_candidates(graph, budget_bytes, warm_plans, baselines, limit)
    if budget_bytes is None and (proven := proven_smallest(graph, candidates)) is not None:
        return proven  # a quick plan peaks at the lower bound: nothing to search
    line = Timeline.of(graph, _windows(graph))

    def first_in_the_model(plans):  # the cheapest plan the model can express, and its recomputations
        return next(((p, st) for p in plans if (st := recomputations(p, line)) is not None), (None, None))

    warm, stages = first_in_the_model(candidates)
    floor = None
    if budget_bytes is not None:  # no plan in the order costs less; the plan of its solution often costs that
        units = cost_units(graph)[0]

        def warm_units():  # the warm start's recomputation, in the objective's units
            return None if stages is None else sum(units[i] * len(ts) for i, ts in stages.items())

        floor = stage_bound(graph, budget_bytes, costs=units, time_limit=time_for_bound(limit), enough=warm_units())
        if baselines and (guided := guided_plan(graph, budget_bytes, floor)) is not None:
            warm, stages = first_in_the_model(sorted([guided, *candidates], key=lambda p: p.compute_seconds))
        cost = warm_units()
        if cost is not None and floor.cost < math.inf and cost <= floor.cost * (1 + 1e-6):
            return _proven_by_the_bound(warm, cost, floor.cost, began)  # a plan at the bound: nothing to search
    if stages:  # room for the warm start's recomputations, so that the search starts from a plan
        copies = max(copies, min(most, 1 + max(len(ts) for ts in stages.values())))
    model = build_model(graph, budget_bytes, copies=copies)
    cp = model.cp
    info = {"model": dict(model.info), "setup seconds": 0.0}
    if budget_bytes is None:
        cp.minimize(model.capacity)
    else:
        recomputation = sum(model.cost_units[i] * lit for (i, _), lit in model.present.items())
        cp.minimize(recomputation)
        info["stage bound units"] = floor.cost  # CP-SAT's bound starts there
        if model.present and 0 < floor.cost < math.inf:
            # (1e-6 below: HiGHS's tolerances must never cut the optimum off)
            cp.add(recomputation >= math.ceil(floor.cost * (1 - 1e-6)))
    if warm is not None and hint(model, stages):
        info["warm start"] = f"{warm.solver} ({warm.overhead * 100:+.1f}%)"
    else:
        warm = None
    info["setup seconds"] = round(time.perf_counter() - began, 3)
    solver = _solver(limit - (time.perf_counter() - began), threads)
    if budget_bytes is not None:  # stop once the plan is within NEGLIGIBLE_OVERHEAD of the step of the bound
        solver.parameters.absolute_gap_limit = float(int(NEGLIGIBLE_OVERHEAD * model.step_units))
    status = solver.solve(cp)
    info["solve seconds"] = round(solver.wall_time, 3)
    status_name = solver.status_name(status)
    left = limit - (time.perf_counter() - began)
    if status == cp_model.INFEASIBLE and budget_bytes is not None and not grow_copies:
        return _baselines_smallest(graph, budget_bytes, f"no plan with {copies - 1} recomputations per node fits", info)
    if status == cp_model.INFEASIBLE and budget_bytes is not None and copies < most and left > 0:
        # more recomputations per node may fit: the plan space grows until it is the MILP's
        return solve_cpsat(graph, budget_bytes, time_limit=left, copies=min(most, 2 * copies), threads=threads,
                           warm_plans=warm_plans, baselines=baselines, quiet=quiet, grow_copies=grow_copies,
                           _grown=True)
    if status == cp_model.INFEASIBLE and budget_bytes is not None:
        return _smallest_peak(graph, budget_bytes, left, threads)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if _grown and not candidates:
            # fewer copies were proven infeasible, and the time ran out with more
            return _baselines_smallest(graph, budget_bytes, f"none with fewer recomputations per node, none found with "
                                       f"up to {copies - 1} within {limit:.0f} s", info)
        fallback = warm or (candidates[0] if candidates else None)  # the best plan there is
        if fallback is not None:
            fallback = copy_module.copy(fallback)
            fits = budget_bytes is None or fallback.peak_bytes <= budget_bytes
            # the time ran out before the search improved on its start: a time limit like any other
            # (said so, gap unknown: 1.0), with the start as the best plan
            fallback.info = {**fallback.info, **info, "status": "time limit" if fits else f"no plan ({status_name})",
                             "gap": 1.0, "detail": f"cpsat found nothing better in {limit:.0f} s ({status_name})"}
            if fits and not quiet:
                warnings.warn(f"cpsat stopped at its time limit ({limit:.0f} s) on {graph.name!r}: it found no plan "
                              f"better than its start, {fallback.solver}'s, which it returns (no bound proven)",
                              SolverTimeLimitWarning, stacklevel=2)
            return fallback
        raise SolverError(
            f"cpsat found no plan for {graph.name!r} within {limit:.0f} s ({status_name}); raise time_limit, "
            "or use solver='checkmate_lp' or a coarser graph"
        )
    objective, bound = solver.objective_value, solver.best_objective_bound
    optimal = status == cp_model.OPTIMAL  # also when objective - bound <= tolerance (then "optimal" within it)
    plan = decode(model, solver)
    info.update(status="optimal" if optimal else "time limit", gap=_gap(objective, bound),
                objective_units=objective, bound_units=bound)
    if budget_bytes is not None:
        info["gap_of_step"] = (objective - bound) / model.step_units if model.step_units else 0.0
    plan.info.update(info)
    from .checkmate import finish_exact

    return finish_exact(plan, budget_bytes, optimal=optimal, quiet=quiet, limit=limit, gap=info["gap"])


def _proven_by_the_bound(warm: Plan, cost_units: float, bound_units: float, began: float) -> Plan:
    """``warm``, whose recomputation (``cost_units``) meets the stage bound: optimal, as CP-SAT's plan."""
    plan = copy_module.copy(warm)
    plan.solver = "cpsat"
    plan.info = {**warm.info, "status": "optimal", "gap": 0.0, "gap_of_step": 0.0, "proven_by": "the stage bound",
                 "warm start": f"{warm.solver} ({warm.overhead * 100:+.1f}%)", "objective_units": cost_units,
                 "bound_units": bound_units, "stage bound units": bound_units, "solve seconds": 0.0,
                 "setup seconds": round(time.perf_counter() - began, 3)}
    return plan


def _baselines_smallest(graph: Graph, budget_bytes: int, why: str, info=None) -> Plan:
    """The baselines' plan of smallest peak, over ``budget_bytes``, saying ``why`` (not the minimum)."""
    from .checkmate import smallest_first_plans

    plan = copy_module.copy(smallest_first_plans(graph)[0])
    plan.info = {**plan.info, **(info or {}),
                 "status": f"infeasible at {budget_bytes} bytes: {why}; the baselines' smallest peak shown"}
    return plan


def _gap(objective: float, bound: float) -> float:
    return 0.0 if objective <= 0 else max(0.0, (objective - bound) / objective)


def _windows(graph: Graph) -> list[range]:
    """Each forward node's recomputation window (memoised per graph)."""
    def windows() -> list[range]:
        variable, pinned = value_roles(graph)
        horizon, _ = horizons(graph, variable, set(range(len(graph.forward_nodes))))
        return recompute_windows(graph, pinned, horizon)

    return graph.memo.cached(("cpsat_windows",), windows)


def most_copies(graph: Graph) -> int:
    """Computations of one node beyond which the plan space cannot grow: its first, plus one per
    stage of the longest recomputation window (then the space is the MILP's)."""
    return 1 + max((len(w) for w in _windows(graph)), default=0)


def _warm_candidates(graph: Graph, budget_bytes: int | None, warm_plans, baselines: bool,
                     time_limit: float | None = None) -> list[Plan]:
    """Plans to start from, best first: the cheapest that fit (``None``: the smallest peaks)."""
    from .checkmate import keep_set_plans, smallest_first_plans, warm_start_plans

    if budget_bytes is None:
        return smallest_first_plans(graph)
    plans = (warm_start_plans(graph, budget_bytes) + keep_set_plans(graph, budget_bytes, time_limit)
             if baselines else []) + list(warm_plans)
    return sorted((p for p in plans if p.peak_bytes <= budget_bytes), key=lambda p: p.compute_seconds)


def _smallest_peak(graph: Graph, budget_bytes: int, time_limit: float, threads) -> Plan:
    """No plan fits: the plan of smallest peak (over budget) in the whole plan space, found once per
    graph, not once per budget (again only for a call with more than twice the time, when not proven)."""
    from .checkmate import known_smallest_peak, remember_smallest_peak

    time_limit = max(1.0, time_limit)
    known = known_smallest_peak(graph, "cpsat_smallest_peak", time_limit)
    if known is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SolverTimeLimitWarning)
            known = solve_cpsat(graph, None, time_limit=time_limit, copies=None, threads=threads)
        remember_smallest_peak(graph, "cpsat_smallest_peak", known, time_limit)
    plan = copy_module.copy(known)
    plan.info = {**known.info, "status": f"infeasible at {budget_bytes} bytes; smallest peak shown"}
    return plan


@register("cpsat")
def cpsat(graph: Graph, budget_bytes: int | None, *, time_limit: float | None = None, coarsen="auto",
          copies: int = DEFAULT_COPIES, threads: int | None = None, warm_plans=(), grow_copies: bool = True,
          **options) -> Plan:
    """``warm_plans``: plans of ``graph`` to start from too (used when ``graph`` is planned uncoarsened);
    ``grow_copies=False``: an infeasible budget is answered at ``copies`` (a baseline's smallest plan
    is returned) instead of growing the plan space to the MILP's."""
    if budget_bytes is None:
        return SOLVERS["store_all"](graph, None)
    from .coarsen import planned_on_coarse_graph

    return planned_on_coarse_graph(
        graph, coarsen,
        lambda g: solve_cpsat(g, budget_bytes, time_limit=time_limit, copies=copies, threads=threads,
                              warm_plans=warm_plans if g is graph else (), grow_copies=grow_copies),
        solver="cpsat",
    )


__all__ = ["solve_cpsat", "build_model", "Timeline", "recomputations"]

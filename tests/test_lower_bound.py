"""The peak's lower bound, and infeasible budgets answered without searching.

``peak_lower_bound`` must never exceed the peak of any plan the simulator accepts: checked against
the exhaustive search's smallest feasible budget on random training graphs, against every solver's
smallest plan on real captured graphs (Inductor's fused graph with in-place writes included), and a
budget below it must be refused without running the solvers that search. ``fixed_order_lower_bound``
likewise for the plans in the graph's order (the MILP's and CP-SAT's), and ``dependency_lower_bound``
for every solver's, the chain planners' reordered backward included.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remat
from remat import models
from remat.errors import InfeasibleBudgetError
from remat.graph import BACKWARD
from remat.plan import Plan
from remat.simulate import dependency_lower_bound, fixed_order_lower_bound, peak_lower_bound
from remat.solvers import SOLVERS, solve
from remat.solvers import checkmate as checkmate_module
from remat.solvers.planner import QUICK_MINIMUM_SOLVERS, make_plan, smallest_plan

from .exhaustive import cheapest_plan
from .swap_graphs import with_synchronous_copies
from .test_checkmate import random_training_graph


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_no_plan_peaks_below_the_bound_on_random_graphs(data):
    g = random_training_graph(data.draw, held_outputs=data.draw(st.booleans()))
    bound = peak_lower_bound(g)
    assert cheapest_plan(g, bound - 1) is None  # the exhaustive search finds nothing below it
    smallest = solve("checkmate", g, 0)
    assert bound <= smallest.peak_bytes
    for name in ("store_all", "checkpoint_all", "chen_greedy"):
        assert bound <= solve(name, g, None if name == "store_all" else 0).peak_bytes


def _graph(name):
    ex = models.build(name, size="tiny")
    return remat.plan(ex.model, *ex.args, solver="store_all", cache=False, **ex.kwargs).graph


@pytest.mark.parametrize("name", ["resnet", "gpt2", "cnn_bn", "tied"])
def test_no_solver_goes_below_the_bound_on_captured_graphs(name):
    g = _graph(name)
    bound = peak_lower_bound(g)
    assert 0 < bound <= smallest_plan(g, "auto", thorough=False).peak_bytes
    for solver in ("checkpoint_all", "chen_sqrt", "chen_greedy", "rotor"):
        assert bound <= solve(solver, g, 0).peak_bytes, solver


def test_the_bound_holds_on_inductors_fused_graph_with_in_place_writes():
    ex = models.build("gpt2", size="tiny")
    m = remat.compile(ex.model, *ex.args, budget="min", cache=False, calibrate=False, example_kwargs=ex.kwargs)
    g = m.plan.graph
    assert g.meta.get("inplace_reuse"), "the fused graph lists in-place writes"
    assert 0 < peak_lower_bound(g) <= m.plan.peak_bytes


def test_a_budget_below_the_bound_is_refused_without_searching(monkeypatch):
    g = _graph("unet")  # branchy: the MILP took minutes to say a small budget was infeasible

    def searching(*_args, **_kwargs):
        raise AssertionError("a searching solver ran")

    for name in ("checkmate", "checkmate_lp", "hierarchical", "keep_set", "rotor", "hybrid"):
        monkeypatch.setitem(SOLVERS, name, searching)
    with pytest.raises(InfeasibleBudgetError, match="no plan can peak below") as info:
        make_plan(g, 1024)
    err = info.value
    assert err.lower_bound_bytes == peak_lower_bound(g) <= err.min_budget_bytes
    monkeypatch.undo()
    # the budget it names plans: it is the smallest peak of one of the quick planners (which one
    # depends on the CPU: oneDNN's convolution workspaces vary between Intel and AMD)
    fitting = []
    for name in QUICK_MINIMUM_SOLVERS:
        try:
            fitting.append(make_plan(g, err.min_budget_bytes, solver=name))
        except InfeasibleBudgetError:
            pass
    assert fitting and all(plan.peak_bytes <= err.min_budget_bytes for plan in fitting)


def _count_milps(monkeypatch) -> list:
    """The budgets of every ``solve_milp`` call from now on (``None``: the smallest-peak MILP)."""
    calls = []
    real = checkmate_module.solve_milp

    def counting(graph, budget_bytes, **kwargs):
        calls.append(budget_bytes)
        return real(graph, budget_bytes, **kwargs)

    monkeypatch.setattr(checkmate_module, "solve_milp", counting)
    return calls


def test_checkmates_smallest_peak_is_solved_once_per_graph(monkeypatch):
    g = _graph("mlp")
    smallest = solve("checkmate", g, 0)
    calls = _count_milps(monkeypatch)
    for budget in (1, 1024, smallest.peak_bytes - 1):
        plan = solve("checkmate", g, budget, coarsen=None)
        assert plan.peak_bytes == smallest.peak_bytes and "infeasible" in plan.info["status"]
    assert calls.count(None) == 0  # the smallest-peak MILP ran when checkmate first missed, not again


def test_a_named_recomputation_solver_shares_its_work_with_the_graph_without_offload_costs(monkeypatch):
    """The offload tier's costs change no recomputation plan: a named recomputation solver plans a graph
    that has them on its twin without them (``recomputation_twin``), as ``auto`` does, so the smallest-peak
    MILP that names the minimum runs once for both (a sweep asked it once per graph: 5 s, then 10 s)."""
    from remat.solvers.planner import RECOMPUTATION_SOLVERS, SWAPPING_SOLVERS, clear_caches

    assert all(name in SOLVERS and name not in SWAPPING_SOLVERS for name in RECOMPUTATION_SOLVERS)
    clear_caches()
    g = _graph("mlp")
    with_costs = with_synchronous_copies(g)
    calls = _count_milps(monkeypatch)
    minima = []
    for graph in (with_costs, g):
        with pytest.raises(InfeasibleBudgetError) as err:
            make_plan(graph, peak_lower_bound(graph) + 1, solver="checkmate")
        minima.append(err.value.min_budget_bytes)
    assert minima[0] == minima[1]
    assert calls.count(None) == 1
    plan = make_plan(with_costs, minima[0], solver="checkmate")
    assert plan.graph is with_costs and plan.peak_bytes <= minima[0]


# ------------------------------------------------------------------ the bounds that count the backward
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_no_plan_in_the_graphs_order_peaks_below_its_bound_on_random_graphs(data):
    """The exhaustive search's plan space is the MILP's (backward nodes once, in the graph's order):
    nothing in it fits below the fixed-order bound; the dependency bound (any order) lies between
    that and the bound over every order."""
    g = random_training_graph(data.draw, held_outputs=data.draw(st.booleans()))
    fixed, any_order = fixed_order_lower_bound(g), dependency_lower_bound(g)
    assert peak_lower_bound(g) <= any_order <= fixed
    assert cheapest_plan(g, fixed - 1) is None
    assert fixed <= solve("checkmate", g, 0).peak_bytes
    for name, plan in _smallest_plans(g, ("store_all", "checkpoint_all", "chen_greedy", "rotor", "reorder")):
        assert any_order <= plan.peak_bytes, name


def _smallest_plans(g, names):
    """``(name, plan)``: each solver's plan at budget 0 (store_all's and reorder's without a budget),
    for the solvers of ``names`` that apply to ``g``."""
    for name in names:
        try:
            yield name, solve(name, g, None if name in ("store_all", "reorder") else 0)
        except remat.RematError:  # rotor: not a chain
            continue


def _backward_orders(graph, limit=400):
    """Up to ``limit`` orders of the backward nodes that the data allows (depth first)."""
    nodes = [n.id for n in graph.backward_nodes]
    needs = {n: {graph.values[v].producer for v in graph.nodes[n].inputs} & set(nodes) for n in nodes}
    found = []

    def extend(order, done):
        if len(found) >= limit:
            return
        if len(order) == len(nodes):
            found.append(list(order))
            return
        for n in nodes:
            if n not in done and needs[n] <= done:
                extend(order + [n], done | {n})

    extend([], set())
    return found


def _just_in_time(graph, order):
    """``order`` with each backward node's forward inputs recomputed right before it (from the
    step's inputs): the plan that keeps no forward value across the boundary."""
    seq = []
    for n in order:
        need, stack = set(), [graph.values[v].producer for v in graph.nodes[n].inputs]
        while stack:
            p = stack.pop()
            if p is not None and graph.nodes[p].phase != BACKWARD and p not in need:
                need.add(p)
                stack += [graph.values[v].producer for v in graph.nodes[p].inputs]
        seq += sorted(need) + [n]
    return seq


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_no_order_of_a_backward_with_weight_gradient_ops_peaks_below_the_dependency_bound(data):
    """A weight gradient made by an op of its own may run early (its gradient then lives to the end)
    or late (the gradient it reads lives until then): the dependency bound counts the cheaper of the
    two. Every order of the backward, keeping every forward value or recomputing each just in time,
    and every solver's plan stay at or above it."""
    g = random_training_graph(data.draw, max_forward=4, held_outputs=data.draw(st.booleans()), weight_ops=True)
    bound = dependency_lower_bound(g)
    assert peak_lower_bound(g) <= bound <= fixed_order_lower_bound(g)
    forward = [n.id for n in g.nodes if n.phase != BACKWARD and n.outputs]
    for order in _backward_orders(g):
        for backward in (order, _just_in_time(g, order)):
            plan = Plan.from_schedule(g, forward, backward)
            assert bound <= plan.peak_bytes, (order, backward)
    for name, plan in _smallest_plans(g, ("checkpoint_all", "chen_greedy", "rotor", "hierarchical", "reorder", "checkmate")):
        assert bound <= plan.peak_bytes, name


def test_an_mlps_deferrable_weight_gradients_are_counted():
    """On an MLP each layer's weight gradient has an op of its own, which the chain planners may
    defer: before it runs, the output gradient it reads is alive, after, the weight's gradient. The
    bound counts the smaller, and comes within 1% of the smallest peak."""
    ex = models.build("mlp", size="tiny", batch=512)  # activations larger than the weights, as in training
    g = remat.plan(ex.model, *ex.args, solver="store_all", cache=False, **ex.kwargs).graph
    smallest = smallest_plan(g, "auto", thorough=False).peak_bytes
    assert dependency_lower_bound(g) <= smallest < 1.01 * dependency_lower_bound(g)  # 10.8% below it before


def _deferring_chain():
    """A 3-stage chain whose backward the chain planners reorder: the gradient-only op ``bg`` runs
    after ``c`` in their stage order (its 100 bytes then live shorter), below every plan in the
    graph's order (found by a review of the bound's first version, which refused rotor's budget)."""
    from remat.graph import GraphBuilder

    b = GraphBuilder("deferring")
    x = b.input("x", 1)
    a0, m0 = b.op("f0", [x], [1, 1])
    a1, m1 = b.op("f1", [a0], [1, 100])
    loss, m2 = b.op("f2", [a1], [1, 150])
    t = b.tangent("t", 1)
    (g1,) = b.op("b2", [t, m2], [1], phase="backward")
    (h,) = b.op("bg", [g1], [100], phase="backward")
    (g0,) = b.op("c", [g1, m1], [1], phase="backward")
    (gx,) = b.op("b0", [g0, h, m0, g1], [1], phase="backward")
    return b.build(forward_outputs=[loss], backward_outputs=[gx])


def test_the_chain_planners_reordered_backward_stays_above_the_dependency_bound_and_plans():
    g = _deferring_chain()
    rotor = solve("rotor", g, 0)
    assert dependency_lower_bound(g) <= rotor.peak_bytes < fixed_order_lower_bound(g)
    assert make_plan(g, rotor.peak_bytes).peak_bytes <= rotor.peak_bytes  # auto plans there, not refused


@pytest.mark.filterwarnings("ignore::remat.errors.SolverTimeLimitWarning")
@pytest.mark.parametrize("name", ["mlp", "cnn_bn"])
def test_no_solver_goes_below_its_bound_on_captured_graphs(name):
    """Every solver at two budgets stays at or above the dependency bound; the MILP and CP-SAT (stages
    in the graph's order) at or above the fixed-order bound."""
    from remat.execute.transfer import make_transfer_meta

    g = _graph(name)
    with_copies = dataclasses.replace(g, meta={**g.meta, "transfer": dict(make_transfer_meta("cpu"))})
    fixed, any_order = fixed_order_lower_bound(g), dependency_lower_bound(g)
    assert peak_lower_bound(g) <= any_order <= fixed
    store = solve("store_all", g, None).peak_bytes
    ran = set()
    for solver in sorted(SOLVERS):
        graph = with_copies if solver in ("hybrid", "checkmate_swap") else g
        bound = fixed if solver in ("checkmate", "checkmate_lp", "cpsat") else any_order
        for fraction in (0, 0.6):
            try:
                plan = solve(solver, graph, int(fraction * store), time_limit=1)
            except remat.RematError:  # a solver that does not apply to this graph
                continue
            ran.add(solver)
            assert plan.peak_bytes >= bound, (solver, fraction, plan.peak_bytes, bound)
    assert {"checkmate", "cpsat", "rotor", "hierarchical", "hybrid", "keep_set", "reorder", "chen_greedy"} <= ran


def test_a_budget_between_the_bounds_is_refused_without_an_exact_search(monkeypatch):
    """The tiny CNN with BatchNorm: a budget at least the bound over every order, but below the
    dependency bound, is refused at once; neither the MILP, CP-SAT, keep_set nor the hybrid runs."""
    g = _graph("cnn_bn")
    any_order = dependency_lower_bound(g)
    assert peak_lower_bound(g) < any_order
    searching = []
    for name in ("checkmate", "checkmate_lp", "cpsat", "keep_set", "hybrid"):
        monkeypatch.setitem(SOLVERS, name, lambda *a, _n=name, **k: searching.append(_n))
    with pytest.raises(InfeasibleBudgetError) as info:
        make_plan(g, any_order - 1)
    assert not searching
    err = info.value
    assert err.lower_bound_bytes == any_order <= err.min_budget_bytes
    monkeypatch.undo()
    assert make_plan(g, err.min_budget_bytes).peak_bytes <= err.min_budget_bytes  # the budget it names plans

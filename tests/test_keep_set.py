"""The keep-set model (block menus with the peak unbounded) is exact: it matches the Checkmate MILP; the
``keep_set`` solver built on it, alone and as one of ``auto``'s solvers."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remat
from remat.errors import SolverError
from remat.plan import Plan
from remat.solvers.planner import make_plan
from remat.solvers import solve
from remat.solvers.checkmate import solve_milp
from remat.solvers.checkmate_model import value_roles
from remat.solvers.keep_set import KeepSetModel, keep_set_planner

from .models.helpers import assert_bitwise, fresh, optimized, run_step
from .test_checkmate import random_training_graph
from .test_plan import chain


def kept_bytes(graph, plan) -> int:
    variable, _ = value_roles(graph)
    return sum(graph.values[v].bytes for v in plan.saved_values if v in variable)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_keep_set_matches_the_milp_with_the_peak_unbounded(data):
    g = random_training_graph(data.draw, max_forward=5)
    store_all = solve("store_all", g, None)
    unbounded = 100 * store_all.peak_bytes + 10**6
    model = KeepSetModel(g)
    for save in sorted({0, store_all.saved_bytes // 3, store_all.saved_bytes}):
        kept = model.solve(save)
        milp = solve_milp(g, unbounded, save_budget_bytes=save, gap=1e-9)
        assert kept is not None
        for lean in (False, True):
            plan = Plan.from_schedule(g, *model.schedule(kept, lean=lean))
            assert kept_bytes(g, plan) <= save
            if not lean:  # the cheapest; the lean variant pays more for a lower peak
                assert plan.compute_seconds == pytest.approx(milp.compute_seconds, rel=1e-9)
            else:
                assert plan.compute_seconds >= milp.compute_seconds - 1e-9


def test_keep_set_on_a_chain_trades_saved_bytes_for_recomputation():
    g = chain(n=6, size=100)
    model = KeepSetModel(g)
    plans = [Plan.from_schedule(g, *model.schedule(model.solve(save))) for save in (600, 300, 0)]
    assert [kept_bytes(g, p) <= s for p, s in zip(plans, (600, 300, 0))] == [True] * 3
    costs = [p.compute_seconds for p in plans]
    assert costs[0] == pytest.approx(g.store_all_seconds)  # everything kept: nothing recomputed
    assert costs[0] < costs[1] < costs[2]


def test_keep_set_solver_returns_the_cheapest_fitting_plan_of_the_save_budgets_it_tried():
    g = chain(n=8, size=100)
    store_all = solve("store_all", g, None)
    assert solve("keep_set", g, None).compute_seconds == pytest.approx(store_all.compute_seconds)
    smallest = solve("keep_set", g, 0)  # nothing fits: the smallest peak
    budget = (smallest.peak_bytes + store_all.peak_bytes) // 2
    plan = solve("keep_set", g, budget)
    assert plan.solver == "keep_set" and plan.peak_bytes <= budget < store_all.peak_bytes
    tried = list(keep_set_planner(g)._plans.values())
    assert len(tried) > 2 * 21 // 2, "a grid of save budgets, plain and lean schedules, then bisection"
    cheapest_tried = min(p.compute_seconds for p in tried if p.peak_bytes <= budget)
    # recompute_less takes out of the cheapest ones what the budget does not need
    assert plan.compute_seconds == cheapest_tried or (plan.compute_seconds < cheapest_tried
                                                      and plan.info["recomputations taken out"] > 0)
    assert smallest.peak_bytes == min(p.peak_bytes for p in tried)
    with pytest.raises(SolverError, match="keep_set takes no options"):
        solve("keep_set", g, budget, gap=0.1)


def test_a_kept_set_over_the_budget_is_not_scheduled_and_changes_no_plan(monkeypatch):
    """Every value of a kept set is resident when the forward ends: a set whose bytes alone exceed the
    budget cannot fit, and its schedules are neither built nor simulated; the plan is the same."""
    from remat.solvers.keep_set import KeepSetPlanner
    from remat.solvers.planner import clear_caches

    g = chain(n=8, size=100)
    store_all = solve("store_all", g, None)
    budget = (solve("keep_set", g, 0).peak_bytes + store_all.peak_bytes) // 2
    clear_caches()
    plan = solve("keep_set", g, budget)
    planner = keep_set_planner(g)
    over = [key for key, kept in planner._kept.items() if kept and sum(g.values[v].bytes for v in kept) > budget]
    assert over and not any(key + (lean,) in planner._plans for key in over for lean in (False, True))
    clear_caches()
    real = KeepSetPlanner.plans_at
    monkeypatch.setattr(KeepSetPlanner, "plans_at",
                        lambda self, save, limit, budget_bytes=None, over_budget_too=False, **kw:
                        real(self, save, limit, budget_bytes, over_budget_too=True, **kw))
    every = solve("keep_set", g, budget)
    assert (every.peak_bytes, every.compute_seconds) == (plan.peak_bytes, plan.compute_seconds)
    assert all(key + (False,) in keep_set_planner(g)._plans for key in over)


def test_auto_also_runs_keep_set_where_it_runs_the_hierarchical_planner():
    g = chain(n=60, size=100)  # more ops than auto's MILP takes: the hierarchical planner's graph
    budget = solve("store_all", g, None).peak_bytes * 6 // 10
    plan = make_plan(g, budget)
    assert "hierarchical" in plan.info["chosen by"] and "keep_set" in plan.info["chosen by"]
    assert plan.peak_bytes <= budget
    for name in ("hierarchical", "keep_set"):
        assert plan.compute_seconds <= solve(name, g, budget).compute_seconds + 1e-12


def test_a_keep_set_plan_runs_with_the_unplanned_steps_gradients_bitwise():
    ex = fresh("resnet18")  # batch norm: its statistics updated once
    ref = run_step(ex, optimized(fresh("resnet18"), solver="store_all"))
    module = optimized(ex, solver="keep_set", budget="min")  # (0.7 missed it on an AMD EPYC: 0.758)
    assert module.plan.solver == "keep_set" and module.plan.recomputations > 0
    assert_bitwise(run_step(ex, module), ref)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_solvers_kept_sets_are_within_its_gap_of_the_least(data):
    """The keep_set solver's route (the LP relaxation, then the MILP over its fractional columns, taken
    within GAP of the LP's bound) never costs more than GAP x the forward's compute over the exact least."""
    from remat.solvers.keep_set import GAP

    g = random_training_graph(data.draw, max_forward=6)
    store_all = solve("store_all", g, None)
    unbounded = 100 * store_all.peak_bytes + 10**6
    forward_seconds = sum(n.cost for n in g.forward_nodes)
    model = KeepSetModel(g)
    for save in sorted({0, store_all.saved_bytes // 4, store_all.saved_bytes // 2, store_all.saved_bytes}):
        kept = model.solve(save, gap=GAP)
        exact = solve_milp(g, unbounded, save_budget_bytes=save, gap=1e-9)
        plan = Plan.from_schedule(g, *model.schedule(kept))
        assert kept_bytes(g, plan) <= save
        assert exact.compute_seconds - 1e-9 <= plan.compute_seconds <= exact.compute_seconds + GAP * forward_seconds + 1e-9


def test_a_fractional_lp_still_gives_the_exact_least_without_a_gap():
    """On a chain a save budget between two values' sizes leaves the LP keeping half a value: the exact
    route (gap 0) then solves the MILP, and matches it."""
    g = chain(n=6, size=100)
    model = KeepSetModel(g)
    relaxed = model._highs(model.cost, [(-float("inf"), 250 / model.byte_scale, model.bytes)], integer=False)
    assert ((relaxed > 1e-6) & (relaxed < 1 - 1e-6)).any()  # the premise: a fractional LP
    store_all = solve("store_all", g, None)
    exact = solve_milp(g, 100 * store_all.peak_bytes, save_budget_bytes=250, gap=1e-9)
    plan = Plan.from_schedule(g, *model.schedule(model.solve(250)))
    assert plan.compute_seconds == pytest.approx(exact.compute_seconds, rel=1e-9)


def test_below_every_plans_bound_the_sweep_takes_kept_sets_near_the_cheapest_and_the_best_one_exact(monkeypatch):
    """budget 0 (``budget="min"``): nothing fits, so the sweep over save budgets seeks the smallest peak, and
    each save budget's kept set is taken within SMALLEST_GAP of the least compute (the LP's rounding, where
    the exact MILP can spend its time limit at every save budget); the smallest peak's save budget is then
    solved exactly as well and the better plan kept; planning at that peak then sweeps no more. At a budget
    above it, every kept set is exact (GAP)."""
    from remat.models import registry as zoo
    from remat.solvers import keep_set as ks
    from remat.solvers.planner import clear_caches

    ex = zoo.build("gpt2", size="tiny")
    g = remat.plan(ex.model, *ex.args, **ex.kwargs, budget=1.0, cache=False, split="off").graph
    model = KeepSetModel(g)
    solved = []
    real = KeepSetModel.solve
    monkeypatch.setattr(KeepSetModel, "solve", lambda self, save, limit=None, gap=0.0:
                        solved.append((save, gap)) or real(self, save, limit, gap))
    clear_caches()
    smallest = solve("keep_set", g, 0)
    loose = [save for save, gap in solved if gap == ks.SMALLEST_GAP]
    exact = [save for save, gap in solved if gap == ks.GAP]
    assert len(loose) == smallest.info["save budgets tried"] and len(exact) == 1 and exact[0] in loose
    planner = keep_set_planner(g)
    candidates = [p for (save, gap, lean), p in planner._plans.items()]
    assert (smallest.peak_bytes, smallest.compute_seconds) == min((p.peak_bytes, p.compute_seconds) for p in candidates)
    forward = sum(n.cost for n in g.forward_nodes)
    for save in loose[::4]:  # near the cheapest: within the gap of the exact kept set's recomputation
        near, least = planner._kept[(save, ks.SMALLEST_GAP)], real(model, save, None, 0.0)
        recomputed = lambda kept: Plan.from_schedule(g, *model.schedule(kept)).compute_seconds
        assert recomputed(near) <= recomputed(least) + ks.SMALLEST_GAP * forward + 1e-12
    solved.clear()  # budget="min" then plans at that peak: the sweep's answer, not a sweep again
    assert solve("keep_set", g, smallest.peak_bytes) is planner._smallest and not solved
    clear_caches()
    fitting = solve("keep_set", g, (smallest.peak_bytes + solve("store_all", g, None).peak_bytes) // 2)
    assert solved and all(gap == ks.GAP for _, gap in solved) and fitting.peak_bytes > 0

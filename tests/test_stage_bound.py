"""The stage bound (:mod:`remat.solvers.stage_bound`) never exceeds the cheapest plan in the graph's
order, and CP-SAT proves a plan that meets it optimal at once."""

import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remat
from remat import models as zoo
from remat.cost.flops import FlopsCostModel
from remat.cost.machine import Roofline
from remat.solvers import solve
import remat.solvers.stage_bound as stage_bound_module
from remat.solvers.cpsat import NEGLIGIBLE_OVERHEAD, solve_cpsat
from remat.solvers.stage_bound import guided_plan, stage_bound

from .exhaustive import cheapest_plan
from .models.helpers import assert_bitwise, assert_close, fresh, optimized, run_step
from .models.test_memory import agrees, measured_peak
from .test_checkmate import random_training_graph
from .test_plan import chain


# a roofline fixed (the one measured on the benchmark's machine), so that ``flops`` costs are too
FIXED_ROOFLINE = Roofline(flops_per_second=1.475e11, bytes_per_second=1.567e10, op_overhead_seconds=3.9e-6,
                          device_name="fixed")


def budgets_around(graph, count=5):
    """From just below the smallest peak of any plan in the order to store-all's peak."""
    hi = solve("store_all", graph, None).peak_bytes
    lo = solve("checkmate", graph, 0).peak_bytes
    return sorted({lo - 1, *(lo + (hi - lo) * j // (count - 1) for j in range(count))})


def assert_below_the_cheapest_plan(graph, budget):
    found = stage_bound(graph, budget)
    bound = found.cost
    assert bound >= found.joint  # the joint bound over the stages solved is part of it
    store_all_seconds = solve("store_all", graph, None).compute_seconds
    guided = guided_plan(graph, budget, found)  # a plan in the order, when it fits
    if guided is not None:  # (the exhaustive search below never reruns a node with a held output: not compared)
        assert guided.peak_bytes <= budget and guided.compute_seconds - store_all_seconds >= bound - 1e-9
    best = cheapest_plan(graph, budget)  # exhaustive search over the plans in the order
    if best is None:
        return  # nothing fits: any bound holds (the bound is often infinite then, not always)
    extra = best.compute_seconds - store_all_seconds
    assert bound <= extra + 1e-9, (budget, bound, extra)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.data())
def test_the_bound_never_exceeds_the_cheapest_plan_on_random_dags(data):
    g = random_training_graph(data.draw, max_forward=6, held_outputs=data.draw(st.booleans()),
                              weight_ops=data.draw(st.booleans()))
    for budget in budgets_around(g):
        assert_below_the_cheapest_plan(g, budget)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.data())
def test_the_joint_bound_following_long_chains_never_exceeds_the_cheapest_plan(data):
    """The joint bound's chains of absent inputs (``JOINT_DEPTH``, 2 by default) followed 6 deep."""
    g = random_training_graph(data.draw, max_forward=6, held_outputs=data.draw(st.booleans()),
                              weight_ops=data.draw(st.booleans()))
    depth = stage_bound_module.JOINT_DEPTH
    stage_bound_module.JOINT_DEPTH = 6
    try:
        for budget in budgets_around(g):
            g.memo.clear()
            assert_below_the_cheapest_plan(g, budget)
    finally:
        stage_bound_module.JOINT_DEPTH = depth
        g.memo.clear()


def test_the_joint_bound_restores_a_chain_of_absent_inputs_before_the_reader_that_needs_it(monkeypatch):
    """The zoo's small U-Net at half its peak (``flops`` costs). Freeing a concatenation's output
    across the decoder means recomputing it before its next reader, and with it each of its inputs
    absent then: following those chains two inputs deep raises the bound to +13.76% of the step, from
    +13.67% one input deep: the cost of the plan of its solution (the last test here), which is so optimal."""
    from remat.api import capture_and_plan

    ex = zoo.build("unet", size="small")
    store, _ = capture_and_plan(ex.model, *ex.args, **ex.kwargs, budget=None, solver="store_all",
                                cost_model=FlopsCostModel(roofline=FIXED_ROOFLINE).node_seconds)
    graph = store.graph
    budget = int(0.5 * store.peak_bytes)
    bounds = {}
    for depth in (1, 2):
        graph.memo.clear()
        monkeypatch.setattr(stage_bound_module, "JOINT_DEPTH", depth)
        bounds[depth] = stage_bound(graph, budget, time_limit=60).cost / store.compute_seconds
    graph.memo.clear()
    assert bounds[1] < 0.1370 and 0.1374 < bounds[2] < 0.1378


@pytest.mark.parametrize("n", [3, 6, 9])
def test_the_bound_never_exceeds_the_cheapest_plan_on_chains_and_is_infinite_where_nothing_fits(n):
    g = chain(n=n, size=100)
    for budget in budgets_around(g, 6):
        assert_below_the_cheapest_plan(g, budget)
    assert stage_bound(g, 0).cost == math.inf  # not even the inputs of the loss's gradient fit
    assert stage_bound(g, solve("store_all", g, None).peak_bytes).cost == 0.0  # everything kept fits


def test_cpsat_proves_a_plan_that_meets_the_bound_optimal_where_its_own_bound_is_weak():
    """The zoo's MLP (63 ops) at 70%: CP-SAT alone stops at its time limit with a gap (the test of
    that in ``test_cpsat.py`` takes the stage bound away); with it, its plan is proven optimal in about
    a second, the bound being the plan's recomputation or below it by less than CP-SAT's tolerance."""
    ex = zoo.build("mlp", size="small")
    graph = remat.plan(ex.model, *ex.args, solver="store_all").graph
    for fraction in (0.8, 0.6):
        budget = int(fraction * solve("store_all", graph, None).peak_bytes)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no time-limit warning
            plan = solve_cpsat(graph, budget, time_limit=30, threads=2)
        assert plan.peak_bytes <= budget and plan.info["status"] == "optimal"
        assert plan.info["solve seconds"] < 10
        assert 0 < plan.info["stage bound units"] <= plan.info["objective_units"]
        # the bound in seconds: at most the plan's recomputation, and below it by no more than CP-SAT's
        # tolerance (NEGLIGIBLE_OVERHEAD of the step; its integer costs round each op's)
        extra = plan.compute_seconds - graph.store_all_seconds
        bound = stage_bound(graph, budget).cost
        assert bound <= extra * (1 + 1e-3) and extra - bound <= (NEGLIGIBLE_OVERHEAD + 1e-4) * graph.store_all_seconds


def test_the_bound_ignores_in_place_reuse_as_the_exact_planners_models_do():
    """A graph whose simulator credits outputs written into dying inputs: the bound is that of the
    same graph without the credit (the models plan without it; the simulator's peak is lower)."""
    import dataclasses

    ex = zoo.build("resnet", size="tiny")
    graph = remat.plan(ex.model, *ex.args, solver="store_all").graph
    assert graph.meta.get("inplace_reuse")  # remat's eager lowering writes some outputs in place
    plain = dataclasses.replace(graph, meta={k: v for k, v in graph.meta.items() if k != "inplace_reuse"})
    budget = int(0.85 * solve("store_all", plain, None).peak_bytes)
    assert stage_bound(graph, budget).cost == stage_bound(plain, budget).cost


def test_cpsat_starts_from_the_plan_of_the_bounds_solution_and_it_trains_bitwise_and_peaks_as_predicted(monkeypatch):
    """The zoo's small U-Net at 50% (``flops`` costs, the roofline fixed): no heuristic plan meets the
    bound, but the plan of the joint bound's solution (:func:`~remat.solvers.stage_bound.guided_plan`)
    fits and costs the bound, so CP-SAT returns it, proven optimal with no search; it runs exactly and
    as predicted."""
    name, size = "unet", "small"
    cost_model = FlopsCostModel(roofline=FIXED_ROOFLINE).node_seconds
    eager = run_step(ex := fresh(name, size), ex.model, steps=2)
    store = run_step(ex := fresh(name, size), optimized(ex, solver="store_all", cost_model=cost_model), steps=2)
    ex = fresh(name, size)
    graph = remat.plan(ex.model, *ex.args, **ex.kwargs, solver="store_all", cost_model=cost_model).graph
    budget = int(0.5 * solve("store_all", graph, None).peak_bytes)
    monkeypatch.setattr(stage_bound_module, "BOUND_SECONDS", 30.0)  # its joint MILP in time on a loaded machine
    plan = solve_cpsat(graph, budget, time_limit=300, threads=2)
    assert plan.info["status"] == "optimal" and plan.info["proven_by"] == "the stage bound"
    assert plan.info["warm start"].startswith("stage_bound") and plan.peak_bytes <= budget
    module = optimized(ex, solver="cpsat", budget=budget, cost_model=cost_model, time_limit=300)
    assert module.plan.info["warm start"].startswith("stage_bound")
    got = run_step(ex, module, steps=2)
    assert_bitwise(got, store)
    assert_close(got, eager)
    graph = module.plan.graph
    assert agrees(measured_peak(ex, module), module.plan.peak_bytes, sum(graph.values[t].bytes for t in graph.tangents))

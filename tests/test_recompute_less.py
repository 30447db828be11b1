"""recompute_less takes out the recomputations a budget does not need; its plans run exactly and as predicted."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remat
from remat.errors import InvalidPlanError
from remat.plan import Plan
from remat.solvers import solve
from remat.solvers.keep_set import KeepSetModel
from remat.solvers.planner import make_plan
from remat.solvers.recompute_less import recompute_less, repeated_positions

from .models.helpers import assert_bitwise, assert_close, fresh, optimized, run_step
from .models.test_equality import reference
from .models.test_memory import agrees, measured_peak
from .test_checkmate import random_training_graph
from .swap_graphs import transfer_chain
from .test_plan import chain


def lean_plan(graph) -> Plan:
    """keep_set's lean schedule keeping nothing: every forward value the backward reads is recomputed
    again for each backward op that reads it, the most recomputation of any of its schedules."""
    return Plan.from_schedule(graph, *KeepSetModel(graph).schedule(set(), lean=True))


def without(plan: Plan, k: int) -> Plan | None:
    """``plan``'s schedule without the computation at position ``k`` (None: not a valid plan)."""
    forward, backward = plan.schedule()
    sequence, boundary = forward + backward, len(forward)
    shorter, boundary = sequence[:k] + sequence[k + 1:], boundary - (k < boundary)
    try:
        return Plan.from_schedule(plan.graph, shorter[:boundary], shorter[boundary:])
    except InvalidPlanError:
        return None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_taken_out_recomputations_keep_the_budget_never_cost_more_and_none_left_could_go(data):
    graph = random_training_graph(data.draw, max_forward=6, held_outputs=data.draw(st.booleans()))
    lean = lean_plan(graph)
    store_all = solve("store_all", graph, None)
    budget = data.draw(st.integers(lean.peak_bytes, max(lean.peak_bytes, store_all.peak_bytes)))
    got = recompute_less(lean, budget)
    assert got.peak_bytes <= budget
    assert got.compute_seconds <= lean.compute_seconds
    assert got.recomputations <= lean.recomputations
    assert got is lean or got.recomputations < lean.recomputations
    if store_all.peak_bytes <= budget:  # every recomputation can go
        assert got.recomputations == 0 and got.compute_seconds == store_all.compute_seconds
    forward, backward = got.schedule()
    for k in repeated_positions(forward + backward):  # a local optimum: no single one more can go
        shorter = without(got, k)
        assert shorter is None or shorter.peak_bytes > budget


def test_a_plan_with_swaps_over_its_budget_or_without_one_is_returned_as_it_is():
    graph = transfer_chain(8)
    lean = lean_plan(graph)
    assert lean.recomputations > 0
    assert recompute_less(lean, None) is lean
    assert recompute_less(lean, lean.peak_bytes - 1) is lean
    model = KeepSetModel(graph)
    value = min(model.variable)  # kept from the forward, swapped out and back
    kept = Plan.from_schedule(graph, *model.schedule({value}, lean=True))
    assert value in kept.saved_values and kept.recomputations > 0
    last_forward_use = max(i for i, ins in enumerate(kept.forward_instructions) if value in graph.nodes[ins.target].inputs
                           or ins.target == graph.values[value].producer)
    swapped = kept.with_swaps(offload_after={value: last_forward_use}, reload_before={value: kept.boundary})
    assert recompute_less(swapped, swapped.peak_bytes + 10**9) is swapped


def test_keep_sets_plan_takes_out_recomputations_and_trains_bitwise_and_peaks_as_predicted():
    """The zoo U-Net (skip connections: values read by far-apart backward ops) a quarter of the way
    from keep_set's smallest peak to store_all's: keep_set's best schedule is lean, and recompute_less
    takes recomputations out of it."""
    name = "unet"
    eager, store = reference(name)
    ex = fresh(name)
    smallest = remat.plan(ex.model, *ex.args, **ex.kwargs, solver="keep_set", budget="min").peak_bytes
    store_all = remat.plan(ex.model, *ex.args, **ex.kwargs, solver="store_all").peak_bytes
    module = optimized(ex, solver="keep_set", budget=smallest + (store_all - smallest) // 4)
    plan = module.plan
    assert plan.info.get("recomputations taken out", 0) > 0
    assert plan.peak_bytes <= plan.budget_bytes
    got = run_step(ex, module, steps=2)
    assert_bitwise(got, store)
    assert_close(got, eager)
    graph = plan.graph
    assert agrees(measured_peak(ex, module), plan.peak_bytes, sum(graph.values[t].bytes for t in graph.tangents))


def test_autos_plan_keeps_no_recomputation_its_budget_does_not_need():
    """auto thins every fitting plan it compares (here the hierarchical planner's, which it picks)."""
    graph = chain(n=120, size=100)
    budget = int(0.3 * solve("store_all", graph, None).peak_bytes)
    plan = make_plan(graph, budget)
    assert plan.solver == "hierarchical" and plan.info["recomputations taken out"] > 0
    assert plan.peak_bytes <= budget
    assert plan.compute_seconds < solve("hierarchical", graph, budget).compute_seconds
    forward, backward = plan.schedule()
    for k in repeated_positions(forward + backward):
        shorter = without(plan, k)
        assert shorter is None or shorter.peak_bytes > budget

"""The keep-set model (block menus with the peak unbounded) is exact: it matches the Checkmate MILP."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat.plan import Plan
from remat.solvers import solve
from remat.solvers.checkmate import solve_milp
from remat.solvers.checkmate_model import value_roles
from remat.solvers.keep_set import KeepSetModel

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

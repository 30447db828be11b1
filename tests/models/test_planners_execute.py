"""Every planner's plan fits its budget in the simulator and trains exactly like eager PyTorch.

For each pipeline test model the budget is halfway between checkpoint_all's peak and
store_all's (or the solver's own smallest peak, when it cannot go that low), so that the
planners must recompute. Results are compared with eager PyTorch (tight tolerance) and
bitwise with store_all through the same graph (the ops are the same).
"""

import pytest

from remat.api import capture_and_plan
from remat.errors import SolverError
from remat.solvers import solve

from .helpers import assert_bitwise, assert_close, fresh, optimized, run_step
from .test_equality import MODELS, reference

PLANNERS = ["checkmate", "checkmate_lp", "chen_greedy", "chen_greedy_ap", "chen_sqrt_ap", "revolve", "rotor", "hierarchical"]

_budgets: dict = {}


def budget_for(name: str, solver: str):
    """(budget bytes, graph) for a model and solver, or None when the solver does not apply."""
    if name not in _budgets:
        ex = fresh(name)
        store, _ = capture_and_plan(ex.model, *ex.args, **ex.kwargs, budget=None, solver="store_all", cost_model="unit")
        lowest = solve("checkpoint_all", store.graph, None).peak_bytes
        _budgets[name] = (store.graph, (store.peak_bytes + lowest) // 2)
    graph, mid = _budgets[name]
    if solver.startswith("checkmate"):
        return mid
    try:
        own = solve(solver, graph, 0).peak_bytes
    except SolverError:
        return None
    return max(mid, own)


@pytest.mark.parametrize("solver", PLANNERS)
@pytest.mark.parametrize("name", MODELS)
def test_planner_fits_and_matches_eager_and_store_all(name, solver):
    budget = budget_for(name, solver)
    if budget is None:
        with pytest.raises(SolverError, match="chain"):
            optimized(fresh(name), solver=solver, cost_model="unit")
        return
    eager, store = reference(name)
    ex = fresh(name)
    module = optimized(ex, solver=solver, budget=budget, cost_model="unit", time_limit=60)
    assert module.plan.peak_bytes <= budget
    got = run_step(ex, module, steps=2)
    assert_close(got, eager)
    assert_bitwise(got, store)

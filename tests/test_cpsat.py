"""CP-SAT (Moccasin's intervals) finds the MILP's optimum, its plans run exactly and as predicted."""

import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import remat
from remat import models as zoo
from remat.errors import InfeasibleBudgetError, SolverTimeLimitWarning
from remat.graph import BACKWARD, GraphBuilder
from remat.solvers import solve
from remat.solvers.checkmate import solve_milp
from remat.solvers.cpsat import most_copies, solve_cpsat

from .exhaustive import cheapest_plan
from .models.helpers import assert_bitwise, assert_close, fresh, optimized, run_step
from .models.test_equality import reference
from .models.test_memory import MiB, agrees, measured_peak
from .test_checkmate import budgets_between, random_training_graph
from .test_plan import chain


def same_answer(graph, budget, got, want):
    """Both fit (at the same cost, to the integer rounding of CP-SAT's objective) or neither does."""
    assert (got.peak_bytes <= budget) == (want.peak_bytes <= budget), (budget, got.peak_bytes, want.peak_bytes)
    if want.peak_bytes <= budget:
        assert got.compute_seconds == pytest.approx(want.compute_seconds, rel=1e-6)
        assert got.info["status"] == "optimal"


@pytest.mark.parametrize("n", [2, 5, 8])
def test_cpsat_is_optimal_on_chains_down_to_the_smallest_peak(n):
    g = chain(n=n, size=100)
    for budget in budgets_between(g, 5):  # the lowest is the MILP's smallest peak: many recomputations of one node
        plan = solve_cpsat(g, budget, threads=2)
        same_answer(g, budget, plan, cheapest_plan(g, budget))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.data())
def test_cpsat_matches_the_milp_on_random_dags(data):
    g = random_training_graph(data.draw, max_forward=6, held_outputs=data.draw(st.booleans()))
    for budget in budgets_between(g, 4):
        same_answer(g, budget, solve_cpsat(g, budget, threads=2), solve_milp(g, budget))


def random_and_mutating_graph():
    """A chain whose second op draws random numbers and whose third reads an input the step mutates."""
    b = GraphBuilder("rng")
    x = b.input("x", 10)
    (a,) = b.op("a", [x], [40], cost=3)
    (d,) = b.op("drop", [a], [40], cost=1, random=True)
    (m,) = b.op("m", [d], [40], cost=2)
    (y,) = b.op("y", [m], [40], cost=4)
    (loss,) = b.op("loss", [y], [1], cost=1)
    t = b.tangent("t", 1)
    (gy,) = b.op("gy", [t, y], [40], phase=BACKWARD, cost=1)
    (gm,) = b.op("gm", [gy, m], [40], phase=BACKWARD, cost=1)
    (gd,) = b.op("gd", [gm, d], [40], phase=BACKWARD, cost=1)
    (ga, w) = b.op("ga", [gd, a], [40, 8], phase=BACKWARD, cost=1)
    return b.build(forward_outputs=[loss], backward_outputs=[w],
                   meta={"rng_state_bytes": 16, "no_backward_recompute": [2]})


def test_generator_states_and_mutated_inputs_are_planned_at_least_as_well_as_the_milp_plans_them():
    """The MILP reserves a generator state for the whole step; CP-SAT counts it as the simulator
    does, from the first run to the last replay, so it fits wherever the MILP fits, as cheaply."""
    g = random_and_mutating_graph()
    for budget in budgets_between(g, 5) + [solve_milp(g, None).peak_bytes - 8]:
        got, want = solve_cpsat(g, budget, threads=2), solve_milp(g, budget)
        if want.peak_bytes <= budget:
            assert got.peak_bytes <= budget
            assert got.compute_seconds <= want.compute_seconds * (1 + 1e-6)
        m_runs = sum(1 for ins in got.instructions if ins.kind == "compute" and ins.target == 2)
        assert m_runs == 1 or all(ins.target != 2 for ins in got.instructions[got.boundary:] if ins.kind == "compute")


def test_too_few_copies_grow_until_the_plan_space_is_the_milps():
    g = chain(n=8, size=100)
    smallest = solve("checkmate", g, 0).peak_bytes
    plan = solve_cpsat(g, smallest, copies=2, threads=2)  # one recomputation per node cannot reach it
    assert plan.peak_bytes <= smallest
    assert 2 < plan.info["model"]["copies"] <= most_copies(g)


def test_a_budget_below_the_smallest_peak_is_answered_with_it_and_named_by_the_planner():
    g = chain(n=6, size=100)
    smallest = solve("checkmate", g, 0).peak_bytes
    plan = solve("cpsat", g, smallest - 1)
    assert plan.peak_bytes == smallest and plan.info["status"].startswith("infeasible")
    ex = zoo.build("mlp", size="tiny")
    with pytest.raises(InfeasibleBudgetError) as err:
        remat.plan(ex.model, *ex.args, budget=1, solver="cpsat")
    assert err.value.min_budget_bytes > 1


def test_at_its_time_limit_cpsat_returns_its_best_plan_with_the_gap_and_says_so(monkeypatch):
    from remat.solvers import cpsat
    from remat.solvers.stage_bound import StageBound

    # 63 ops that CP-SAT alone does not prove in 30 s at 70% (with the stage bound: in 0.4 s)
    monkeypatch.setattr(cpsat, "stage_bound", lambda *a, **k: StageBound(0.0, None, 0, 0))
    ex = zoo.build("mlp", size="small")
    graph = remat.plan(ex.model, *ex.args, solver="store_all", cost_model="flops").graph
    budget = int(0.7 * solve("store_all", graph, None).peak_bytes)
    with pytest.warns(SolverTimeLimitWarning, match="cpsat stopped at its time limit"):
        plan = solve_cpsat(graph, budget, time_limit=1.0, threads=2)
    assert plan.peak_bytes <= budget
    assert plan.info["status"] == "time limit" and 0 < plan.info["gap"] <= 1


@pytest.mark.parametrize("name", ["resnet"])  # GPT-2's coarse graph: 15 s of search, 8 workers beside the other tests
def test_cpsat_plans_train_like_eager_and_peak_as_predicted(name):
    eager, store = reference(name)
    ex = fresh(name)
    graph_peak = remat.plan(ex.model, *ex.args, **ex.kwargs, solver="store_all", cost_model="unit").peak_bytes
    lowest = remat.plan(ex.model, *ex.args, **ex.kwargs, solver="checkpoint_all", cost_model="unit").peak_bytes
    budget = (graph_peak + lowest) // 2
    with warnings.catch_warnings():
        # on GPT-2's coarse graph the coarse model misses the budget: the smallest peak of its whole plan
        # space is searched, and expanded it fits; unit costs tie everywhere, so the proofs are slow
        warnings.simplefilter("ignore", SolverTimeLimitWarning)
        module = optimized(ex, solver="cpsat", budget=budget, cost_model="unit", time_limit=15)
    assert module.plan.peak_bytes <= budget and module.plan.solver == "cpsat"
    got = run_step(ex, module, steps=2)
    assert_close(got, eager)
    assert_bitwise(got, store)


def test_cpsat_measured_peak_agrees_with_its_prediction():
    ex = zoo.build("cnn_bn", size="small")
    store = remat.plan(ex.model, *ex.args, **ex.kwargs, solver="store_all")
    budget = int(0.7 * store.peak_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeLimitWarning)
        module = remat.optimize(ex.model, *ex.args, **ex.kwargs, budget=budget, solver="cpsat", time_limit=60)
    predicted = module.plan.peak_bytes
    assert predicted <= budget
    measured = measured_peak(ex, module)
    graph = module.plan.graph
    assert agrees(measured, predicted, sum(graph.values[t].bytes for t in graph.tangents)), (
        f"measured {measured / MiB:.2f} MiB, predicted {predicted / MiB:.2f} MiB")


def test_auto_stops_at_cpsats_proven_optimum_on_a_small_graph(monkeypatch):
    from remat.solvers import checkmate as checkmate_module
    from remat.solvers.planner import make_plan

    milps = []
    original = checkmate_module.solve_milp
    monkeypatch.setattr(checkmate_module, "solve_milp", lambda *a, **k: milps.append(1) or original(*a, **k))
    g = chain(n=8, size=100)
    budget = (solve("store_all", g, None).peak_bytes + solve("checkpoint_all", g, None).peak_bytes) // 2
    plan = make_plan(g, budget, "auto")
    assert plan.solver == "cpsat" and plan.info["status"] == "optimal" and plan.peak_bytes <= budget
    assert plan.info["chosen by"] == "auto among cpsat, keep_set" or "checkmate" not in plan.info["chosen by"]
    assert not milps
    assert plan.compute_seconds == pytest.approx(cheapest_plan(g, budget).compute_seconds)


def test_auto_hands_cpsats_plan_to_the_milp_when_it_is_not_proven(monkeypatch):
    from remat.solvers import cpsat
    from remat.solvers.planner import _smallest_key, make_plan
    from remat.solvers.stage_bound import StageBound

    monkeypatch.setattr(cpsat, "stage_bound", lambda *a, **k: StageBound(0.0, None, 0, 0))  # (it proves 70% at once)
    ex = zoo.build("mlp", size="small")
    graph = remat.plan(ex.model, *ex.args, solver="store_all").graph
    budget = int(0.7 * solve("store_all", graph, None).peak_bytes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeLimitWarning)
        plan = make_plan(graph, budget, "auto", time_limit=4)
    cpsats = graph.memo[_smallest_key("cpsat", {})]  # the one plan CP-SAT made in this run
    assert cpsats.info["status"] == "time limit" and cpsats.peak_bytes <= budget
    assert plan.peak_bytes <= budget and "cpsat, checkmate" in plan.info["chosen by"]
    assert plan.compute_seconds <= cpsats.compute_seconds  # the MILP started from CP-SAT's plan


def test_a_time_budget_bounds_every_solve_inside_it_together():
    import time

    from remat.solvers import time_budget
    from remat.tools.pareto import pareto_of_graph

    ex = zoo.build("mlp", size="small")  # neither exact solver proves 70% or 50% on it in 30 s
    graph = remat.plan(ex.model, *ex.args, solver="store_all").graph
    start = time.perf_counter()
    with warnings.catch_warnings(), time_budget(4.0):
        warnings.simplefilter("ignore", SolverTimeLimitWarning)
        front = pareto_of_graph(graph, solvers=["checkmate", "cpsat"], budgets=[0.7, 0.5], cache=False)
    took = time.perf_counter() - start
    assert took < 4.0 + 3.0, f"{took:.1f} s for a 4 s budget"  # slack: warm starts, model building
    for name in ("checkmate", "cpsat"):
        assert all(p is not None and p.peak_bytes <= b for p, b in zip(front[name], front.budgets))


def test_a_time_limit_bounds_the_whole_of_auto():
    """``make_plan(..., time_limit=T)`` bounds the whole call: ``auto`` on the U-Net's graph with
    transfer costs runs the hierarchical planner (CP-SAT on its coarse graph, which has no blocks),
    ``keep_set`` and the hybrid's greedy, each given T (together 7.7 s for a 4 s limit before)."""
    import time

    from remat.solvers.planner import make_plan

    from .swap_graphs import with_synchronous_copies

    ex = zoo.build("unet", size="small")
    graph = with_synchronous_copies(remat.plan(ex.model, *ex.args, solver="store_all").graph)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeLimitWarning)
        plan = make_plan(graph, 0.5, "auto", time_limit=4.0)
    took = time.perf_counter() - start
    assert took < 4.0 + 3.0, f"{took:.1f} s for a 4 s limit"  # slack: warm starts, model building
    assert plan.peak_bytes <= plan.budget_bytes and "hybrid" in plan.info["chosen by"]


def test_when_the_coarse_model_misses_the_budget_and_time_runs_out_a_plan_still_comes_back():
    """GPT-2's coarse graph at this budget: two recomputations per op are proven too few, and with
    more CP-SAT finds nothing in a second; the baselines' smallest plan comes back, and expanded to
    the op graph it fits."""
    ex = fresh("gpt2")
    store = remat.plan(ex.model, *ex.args, **ex.kwargs, solver="store_all", cost_model="unit")
    graph = store.graph
    budget = (store.peak_bytes + solve("checkpoint_all", graph, None).peak_bytes) // 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeLimitWarning)
        plan = solve("cpsat", graph, budget, time_limit=1, threads=2)
    assert "coarsened" in plan.info and plan.peak_bytes <= budget


def test_cpsat_stops_once_its_plan_is_within_a_negligible_share_of_the_step(monkeypatch):
    """Every plan costs at least store_all's compute, so a plan whose recomputations are proven within
    NEGLIGIBLE_OVERHEAD of the step of the bound is final, however weak the bound: CP-SAT gets that as
    its absolute gap limit, in its cost units (on the tiny U-Net at 80% the search used to run to its
    limit, then HiGHS to its own, for a +0.01% plan), and says how far from the bound it stopped."""
    from remat.solvers import cpsat as cpsat_module
    from remat.solvers.cpsat import COST_UNITS, NEGLIGIBLE_OVERHEAD
    from remat.solvers.stage_bound import StageBound

    # (with the stage bound, a warm start that meets it is returned with no search)
    monkeypatch.setattr(cpsat_module, "stage_bound", lambda *a, **k: StageBound(0.0, None, 0, 0))
    made = []
    real = cpsat_module._solver
    monkeypatch.setattr(cpsat_module, "_solver", lambda *a: made.append(real(*a)) or made[-1])
    g = chain(n=6, size=100)
    budget = budgets_between(g, 4)[1]
    plan = solve_cpsat(g, budget, time_limit=30, threads=2)
    largest = max(n.cost for n in g.nodes)
    assert made[0].parameters.absolute_gap_limit == int(NEGLIGIBLE_OVERHEAD * g.store_all_seconds / largest * COST_UNITS)
    assert plan.info["status"] == "optimal" and 0 <= plan.info["gap_of_step"] <= NEGLIGIBLE_OVERHEAD


def test_exact_planning_keeps_cpsats_fitting_plan_without_the_milp_above_its_size(monkeypatch):
    """Above ``AUTO_MILP_NODES`` nodes (the hierarchical planner's fallback on a branchy graph) a plan
    CP-SAT finds within the budget is kept and the MILP is not run after it; at most that size, and
    where CP-SAT finds no plan, the MILP still runs."""
    from remat.solvers import planner

    ran = []
    real_run = planner._run

    def run(name, *args, **kwargs):
        ran.append(name)
        return real_run(name, *args, **kwargs)

    monkeypatch.setattr(planner, "_run", run)
    store = solve("store_all", chain(n=60), None).peak_bytes  # 122 nodes
    graph = chain(n=60)
    assert len(graph.nodes) > planner.AUTO_MILP_NODES
    names, plans = planner._exact(graph, int(store * 0.6), 4.0, {})
    assert names == ran == ["cpsat"] and plans[0].peak_bytes <= int(store * 0.6)
    ran.clear()
    small = chain(n=20)
    assert len(small.nodes) <= planner.AUTO_MILP_NODES
    small_store = solve("store_all", small, None).peak_bytes
    names, plans = planner._exact(small, int(small_store * 0.6), 4.0, {})
    assert ran[0] == "cpsat" and (names == ["cpsat"]) == (plans[0].info.get("status") == "optimal")

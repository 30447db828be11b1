"""The swap MILP (``checkmate_swap``): Checkmate's recomputation MILP with offload/reload decisions.

Hand-built graphs carry their own transfer costs (graph.meta["transfer"]), so nothing here
depends on measured bandwidths; the end-to-end test uses the CPU's file store."""

from __future__ import annotations

import warnings

import pytest

from remat.errors import SolverError, SolverTimeLimitWarning
from remat.graph import Graph, GraphBuilder
from remat.plan import OFFLOAD, RELOAD
from remat.solvers.planner import clear_caches
from remat.solvers import available, solve

from .swap_graphs import transfer_chain

MiB = 2**20


@pytest.fixture(autouse=True)
def _fresh_caches():
    clear_caches()
    yield
    clear_caches()


def chain(n=5, act=100, cost=1.0, bandwidth=1000.0, overlap=False, pinned_forward=False) -> Graph:
    """The shared transfer chain (tests/swap_graphs.py), synchronous copies unless ``overlap``."""
    return transfer_chain(n, act, cost, bandwidth, overlap, pinned_forward)


def skips(n=5, act=100, bandwidth=1000.0, overlap=False) -> Graph:
    """A chain with skip connections: f_i reads h_{i-1} and h_{i-2}, its backward both (values
    with two forward readers and several backward ones, costs 1..n)."""
    b = GraphBuilder("skips")
    hs = [b.input("x", 10)]
    for i in range(n):
        hs += b.op(f"f{i}", hs[-2:], [act + 20 * i], cost=1.0 + i)
    (loss,) = b.op("loss", [hs[-1]], [4], cost=1.0)
    (g,) = b.op("loss_bwd", [b.tangent("dloss", 4), hs[-1]], [act], phase="backward", cost=1.0)
    for i in range(n - 1, -1, -1):
        (g,) = b.op(f"f{i}_bwd", [g, *hs[max(i - 1, 1): i + 1]] if i else [g], [act if i else 10],
                    phase="backward", cost=2.0 + i)
    meta = {"transfer": {"d2h_bytes_per_s": bandwidth, "h2d_bytes_per_s": bandwidth, "overlap": overlap,
                         "latency_s": 0.01}}
    return b.build(forward_outputs=[loss], backward_outputs=[g], meta=meta)


def budgets(g: Graph) -> list[int]:
    """Checkmate's smallest peak, the middle, and just under store_all."""
    store = solve("store_all", g, None).peak_bytes
    low = solve("checkmate", g, 0).peak_bytes
    return [low, (low + store) // 2, store - 1]


def test_registered_and_plain_cases():
    assert "checkmate_swap" in available()
    g = chain()
    assert solve("checkmate_swap", g, None).peak_bytes == solve("store_all", g, None).peak_bytes
    plain = Graph(g.nodes, g.values, g.forward_outputs, g.backward_outputs, g.name, {})
    with pytest.raises(SolverError, match="transfer costs"):
        solve("checkmate_swap", plain, 300)


@pytest.mark.parametrize("overlap", [False, True])
def test_never_slower_than_recomputation_alone(overlap):
    """(a) wherever Checkmate fits, the swap model (a superset of its plans) is at least as fast."""
    g = chain(bandwidth=1000.0, overlap=overlap)
    for budget in budgets(g):
        ck = solve("checkmate", g, budget)
        assert ck.peak_bytes <= budget
        plan = solve("checkmate_swap", g, budget, time_limit=30)
        assert plan.solver == "checkmate_swap" and plan.info["status"] == "optimal"
        assert plan.peak_bytes <= budget
        assert plan.step_seconds <= ck.step_seconds + 1e-9


@pytest.mark.parametrize("overlap", [False, True])
def test_fits_below_what_recomputation_can(overlap):
    """(b) nothing can be recomputed: only offloading gets under the store-all peak."""
    g = chain(pinned_forward=True, bandwidth=1e4, overlap=overlap)
    store = solve("store_all", g, None).peak_bytes
    assert solve("checkmate", g, 0).peak_bytes == store  # recomputation's minimum
    budget = store - 200  # two activations fewer
    plan = solve("checkmate_swap", g, budget, time_limit=30)
    assert plan.peak_bytes <= budget
    kinds = {ins.kind for ins in plan.instructions}
    assert OFFLOAD in kinds and RELOAD in kinds
    assert plan.recomputations == 0
    assert plan.step_seconds >= plan.compute_seconds
    assert plan.info["swaps"] >= 2


@pytest.mark.parametrize("make", [chain, skips])
@pytest.mark.parametrize("bandwidth", [20.0, 1000.0, 1e6])
def test_greedy_is_never_below_the_exact_optimum(make, bandwidth):
    """(c) with synchronous copies the model is exact: its objective is the simulator's step
    time, and no plan the hybrid greedy finds can be faster than the proven optimum."""
    g = make(n=6, bandwidth=bandwidth, overlap=False)
    store = solve("store_all", g, None).peak_bytes
    greedy_min = solve("hybrid", g, 0).peak_bytes
    for budget in (greedy_min, (greedy_min + store) // 2, store - 1):
        greedy = solve("hybrid", g, budget)
        plan = solve("checkmate_swap", g, budget, time_limit=30)
        assert plan.info["status"] == "optimal"
        assert plan.peak_bytes <= budget
        assert plan.step_seconds == pytest.approx(plan.info["objective_seconds"], rel=1e-9)
        assert plan.info["bound_seconds"] <= plan.step_seconds * (1 + 1e-6)
        if greedy.peak_bytes <= budget:
            assert greedy.step_seconds >= plan.step_seconds - 1e-9, (budget, greedy.step_seconds, plan.step_seconds)


def test_overlapped_copies_model_bounds_the_simulator():
    """With copies beside compute the model's stage time is max(compute, copies): the simulated
    step of its plan is never longer than the model says, and the plan fits."""
    for bandwidth in (30.0, 1000.0):
        g = chain(n=5, bandwidth=bandwidth, overlap=True)
        for budget in budgets(g):
            plan = solve("checkmate_swap", g, budget, time_limit=30)
            assert plan.peak_bytes <= budget
            assert plan.step_seconds <= plan.info["objective_seconds"] + 1e-9


def test_time_limit_returns_the_incumbent_and_says_so():
    g = chain(n=8, pinned_forward=True, bandwidth=1e4)
    budget = solve("store_all", g, None).peak_bytes - 300
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = solve("checkmate_swap", g, budget, time_limit=0.001)
    if plan.info["status"] != "optimal":  # HiGHS may still prove it at once on a fast machine
        assert any(issubclass(w.category, SolverTimeLimitWarning) for w in caught)
        assert plan.info["gap"] is None or plan.info["gap"] >= 0
    assert plan.peak_bytes <= budget and plan.offloaded_values  # the incumbent: at worst the greedy's plan
    assert plan.step_seconds == pytest.approx(plan.info["objective_seconds"], rel=1e-9)


def test_zoo_plan_runs_bitwise_and_peaks_as_predicted():
    """(d) end to end on the CPU file store: a zoo model with dropout (its replays must draw the
    same numbers), planned by the swap MILP at a budget where it offloads; gradients bitwise
    those of store_all, measured peak as predicted."""
    from remat.measure import measure_step

    from .models.helpers import assert_bitwise, fresh, optimized, run_step

    ex = fresh("dropout_mlp")
    reference = optimized(ex, solver="store_all", cost_model="unit", cache=False)
    ref, store = run_step(ex, reference, steps=2), reference.plan.peak_bytes
    ex = fresh("dropout_mlp")
    module = optimized(ex, solver="checkmate_swap", budget=int(0.9 * store), cost_model="unit", cache=False,
                       solver_options={"warm_start": False})  # the greedy's warm start is tested on the chains
    plan = module.plan
    assert plan.solver == "checkmate_swap" and plan.peak_bytes <= int(0.9 * store)
    assert plan.simulation.offloaded > 0 and plan.info["status"] == "optimal"
    assert plan.graph.meta["transfer"]["overlap"] is False  # the exact model
    assert plan.step_seconds == pytest.approx(plan.info["objective_seconds"], rel=1e-9)
    assert_bitwise(run_step(ex, module, steps=2), ref)

    def step():
        ex.loss(module(*ex.args, **ex.kwargs)).backward()

    measured = measure_step(step, setup=lambda: ex.model.zero_grad(set_to_none=True), warmup=1, repeats=1).peak_bytes
    assert abs(measured - plan.peak_bytes) <= max(0.05 * plan.peak_bytes, 2 * MiB), (measured, plan.peak_bytes)


def test_recomputed_batch_norm_needs_no_repair():
    """Regression: a batch norm recomputed in the backward remakes its running statistic (a forward
    output) and that copy lives to the batch norm's backward. Checkmate's rows used to count it only
    in the stage that made it, so at this budget the model's plan peaked at 289 in the simulator and
    was re-solved with a lowered budget; the rows now count the copy and the first plan fits."""
    from .test_checkmate import bn_net

    g = bn_net((50, 50, 50), (4, 16, 32))
    meta = {"transfer": {"d2h_bytes_per_s": 1.0, "h2d_bytes_per_s": 1.0, "overlap": False, "latency_s": 0.0}}
    g = Graph(g.nodes, g.values, g.forward_outputs, g.backward_outputs, g.name, meta)
    plan = solve("checkmate_swap", g, 285)
    assert plan.peak_bytes <= 285 and "repairs" not in plan.info and plan.info["status"] == "optimal"
    assert plan.step_seconds == pytest.approx(plan.info["objective_seconds"], rel=1e-9)

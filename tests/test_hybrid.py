"""The hybrid solver (recomputation + swapping, Libra's greedy) and its use by ``auto``.

Hand-built graphs carry their own transfer costs (graph.meta["transfer"]), so nothing here
depends on measured bandwidths."""

from __future__ import annotations

import pytest

import remat
from remat import models as zoo
from remat.errors import InfeasibleBudgetError, SolverError
from remat.graph import Graph
from remat.plan import OFFLOAD, RELOAD
from remat.solvers.planner import clear_caches, make_plan, recomputation_plan, smallest_plan
from remat.solvers import solve

from .swap_graphs import fresh_planner_caches, transfer_chain, with_synchronous_copies


pytestmark = pytest.mark.usefixtures("fresh_planner_caches")


def chain(n=6, act=100, cost=1.0, bandwidth=1000.0, pinned_forward=False) -> Graph:
    """The shared transfer chain (tests/swap_graphs.py), copies beside compute."""
    return transfer_chain(n, act, cost, bandwidth, pinned_forward=pinned_forward)


def without_transfer(graph: Graph) -> Graph:
    meta = {k: v for k, v in graph.meta.items() if k != "transfer"}
    return Graph(graph.nodes, graph.values, graph.forward_outputs, graph.backward_outputs, graph.name, meta)


def test_reaches_below_what_recomputation_can():
    g = chain(pinned_forward=True)
    recompute_min = smallest_plan(g, swaps=False).peak_bytes
    assert recompute_min == solve("store_all", g, None).peak_bytes  # nothing can be recomputed
    plan = solve("hybrid", g, 0)  # its smallest plan
    assert plan.peak_bytes < 0.5 * recompute_min
    assert plan.offloaded_values and plan.step_seconds >= plan.compute_seconds
    kinds = {ins.kind for ins in plan.instructions}
    assert OFFLOAD in kinds and RELOAD in kinds
    # at a budget between the two, the plan fits
    budget = (plan.peak_bytes + recompute_min) // 2
    mid = solve("hybrid", g, budget)
    assert mid.peak_bytes <= budget


def test_auto_uses_hybrid_below_recomputation_and_names_its_minimum():
    g = chain(pinned_forward=True)
    recompute_min = smallest_plan(g, swaps=False).peak_bytes
    hybrid_min = smallest_plan(g).peak_bytes
    assert hybrid_min < recompute_min
    plan = make_plan(g, recompute_min - 1)
    assert plan.solver == "hybrid" and plan.peak_bytes <= recompute_min - 1
    with pytest.raises(InfeasibleBudgetError) as e:
        make_plan(g, hybrid_min - 1)
    assert e.value.min_budget_bytes == hybrid_min
    assert make_plan(g, e.value.min_budget_bytes).peak_bytes <= hybrid_min  # the minimum named plans
    assert make_plan(g, "min").peak_bytes == hybrid_min
    # without transfer costs, auto knows only recomputation
    plain = without_transfer(g)
    with pytest.raises(InfeasibleBudgetError) as e:
        make_plan(plain, recompute_min - 1)
    assert e.value.min_budget_bytes == recompute_min
    with pytest.raises(SolverError):
        solve("hybrid", plain, recompute_min)


@pytest.mark.parametrize("bandwidth", [1.0, 1000.0, 1e6])
def test_never_slower_than_its_start_when_that_fits(bandwidth):
    g = chain(n=8, bandwidth=bandwidth)
    store = solve("store_all", g, None).peak_bytes
    low = smallest_plan(g, swaps=False).peak_bytes
    for budget in (low, (low + store) // 2, store - 1):
        start = recomputation_plan(g, budget)
        assert start.peak_bytes <= budget
        plan = solve("hybrid", g, budget)
        assert plan.peak_bytes <= budget
        assert plan.step_seconds <= start.step_seconds + 1e-12


def test_auto_picks_hybrid_only_when_faster():
    store_peak = solve("store_all", chain(n=8), None).peak_bytes
    budget = int(0.6 * store_peak)
    # copies far slower than compute: swapping only stalls, recomputation stays
    slow = chain(n=8, bandwidth=1.0)
    plan = make_plan(slow, budget)
    assert plan.solver != "hybrid"
    assert plan.step_seconds == recomputation_plan(slow, budget).step_seconds
    # copies nearly free: moving a value out and back beats recomputing it
    clear_caches()
    fast = chain(n=8, bandwidth=1e9)
    start = recomputation_plan(fast, budget)
    assert start.recomputations > 0
    plan = make_plan(fast, budget)
    assert plan.solver == "hybrid" and plan.peak_bytes <= budget
    assert plan.step_seconds < start.step_seconds
    assert "hybrid" in plan.info["chosen by"]
    # a graph without transfer costs never gets it
    clear_caches()
    assert make_plan(without_transfer(fast), budget).solver != "hybrid"


def test_recomputation_is_planned_once_for_a_step_with_and_without_transfer_costs(monkeypatch):
    """The recomputation solvers do not read the transfer costs: ``auto`` plans them on the step
    without those costs, so where that step was planned already (``remat.compile`` plans a step both
    ways) they do not run again, and the hybrid starts from that plan, as a plan of the costed step."""
    import remat.solvers.planner as planner

    g = chain(n=8, bandwidth=1e9)
    budget = int(0.6 * solve("store_all", g, None).peak_bytes)
    plain = make_plan(without_transfer(g), budget)
    runs = []
    real = planner._auto_recompute
    monkeypatch.setattr(planner, "_auto_recompute", lambda *args, **kwargs: runs.append(args) or real(*args, **kwargs))
    plan = make_plan(g, budget)
    assert runs == [] and plan.graph is g and plan.peak_bytes <= budget and "hybrid" in plan.info["chosen by"]
    start = recomputation_plan(g, budget)
    assert start.graph is g and start.schedule() == plain.schedule() and start.peak_bytes == plain.peak_bytes


def test_the_smallest_budget_of_a_step_with_transfer_costs_runs_no_recomputation_solver_twice(monkeypatch):
    """``budget="min"`` looks up every solver's minimum, then plans: a solver that does not swap runs on
    the step without its transfer costs only (its minimum learnt from there), not on both."""
    import remat.solvers.planner as planner

    g = chain(n=8, bandwidth=1e9)
    runs = []
    real = planner._run
    monkeypatch.setattr(planner, "_run", lambda name, graph, *args, **kwargs: runs.append((name, graph))
                        or real(name, graph, *args, **kwargs))
    plan = make_plan(g, "min")
    assert plan.graph is g and plan.peak_bytes == smallest_plan(g).peak_bytes
    on_costed = [name for name, graph in runs if graph is g]
    assert on_costed and set(on_costed) <= set(planner.SWAPPING_SOLVERS)


def test_no_budget_is_store_all():
    g = chain()
    plan = solve("hybrid", g, None)
    assert plan.peak_bytes == solve("store_all", g, None).peak_bytes and not plan.offloaded_values


@pytest.fixture(scope="module")
def resnet_graph():
    """resnet (tiny) without its ops' workspaces: on the CPU a tiny convolution's scratch buffers
    (4x its output) set a floor no schedule goes below, which would hide what swapping can do."""
    ex = zoo.build("resnet", size="tiny")
    g = remat.plan(ex.model, *ex.args, solver="store_all", workspace="none", **ex.kwargs).graph
    meta = {**g.meta, "transfer": {"d2h_bytes_per_s": 5e9, "h2d_bytes_per_s": 5e9}}
    return Graph(g.nodes, g.values, g.forward_outputs, g.backward_outputs, g.name, meta)


def test_zoo_tiny_below_recomputation_minimum(resnet_graph):
    g = resnet_graph
    recompute_min = smallest_plan(g, thorough=False, swaps=False).peak_bytes
    plan = solve("hybrid", g, recompute_min - 1)
    assert plan.peak_bytes <= recompute_min - 1
    assert plan.offloaded_values


def test_hybrid_plan_runs_with_store_all_gradients_bitwise():
    """End to end on the CPU file store: the hybrid's smallest plan offloads, and the step's
    gradients are bitwise those of store_all."""
    from .models.helpers import assert_bitwise, fresh, optimized, run_step

    ex = fresh("resnet")
    ref = run_step(ex, optimized(ex, solver="store_all", cost_model="unit", cache=False), steps=2)
    ex = fresh("resnet")
    # the exact solvers making the greedy's start get 5 s, not 30: the start and the plan are the same
    # (the greedy converges in 18 rounds), the test is of the offloading step's gradients
    module = optimized(ex, solver="hybrid", budget="min", cost_model="unit", cache=False, time_limit=5)
    assert module.plan.solver == "hybrid" and module.plan.simulation.offloaded > 0
    assert_bitwise(run_step(ex, module, steps=2), ref)


def test_within_budget_the_greedy_keeps_recomputed_values_instead_of_recomputing():
    """From checkpoint_all's schedule at store_all's budget, the *keep* switch (drop a recomputation,
    keep its values) leads back to store_all's step: no recomputation and no copy (copies here are
    synchronous, so a swapped value would cost time)."""
    from remat.solvers.hybrid_search import GreedySearch, State

    g = transfer_chain(5, overlap=False)
    store = solve("store_all", g, None)
    start = solve("checkpoint_all", g, None)
    assert start.recomputations > 0
    fwd, bwd = start.schedule()
    fit, _, _ = GreedySearch(g, store.peak_bytes).refine(State(tuple(fwd), tuple(bwd), ()), float("inf"))
    assert fit.plan.recomputations == 0 and not fit.plan.offloaded_values
    assert fit.step == pytest.approx(store.step_seconds)


def test_synchronous_copies_reload_just_before_use_and_reach_the_swap_milps_optimum():
    """dropout_mlp (tiny) with the CPU file store's synchronous copies, at the greedy's smallest budget:
    the swap MILP proves an optimum of one swap and four recomputations, which the greedy reaches by
    swapping a value with its reload placed after the peak (no earlier reload helps a synchronous copy).
    The graph is without workspaces (``native_dropout``'s scratch), as when this optimum was proven."""
    ex = zoo.build("dropout_mlp", size="tiny")
    g = remat.plan(ex.model, *ex.args, solver="store_all", workspace="none", **ex.kwargs).graph
    meta = {**g.meta, "transfer": {"d2h_bytes_per_s": 8.15e8, "h2d_bytes_per_s": 8.56e8, "latency_s": 1.2e-4,
                                   "overlap": False}}  # the CPU file store as measured here once
    g = Graph(g.nodes, g.values, g.forward_outputs, g.backward_outputs, g.name, meta)
    budget = solve("hybrid", g, 0).peak_bytes
    greedy = solve("hybrid", g, budget)
    optimum = solve("checkmate_swap", g, budget, time_limit=30)
    assert optimum.info["status"] == "optimal" and greedy.peak_bytes <= budget
    assert greedy.step_seconds <= 1.05 * optimum.step_seconds, (greedy.step_seconds, optimum.step_seconds)


def test_at_its_smallest_budget_with_measured_workspaces_the_greedy_is_within_5_percent_of_the_swap_milp():
    """dropout_mlp (tiny) as captured, workspaces measured (``native_dropout``'s scratch included), with
    the CPU file store's synchronous copies, at the greedy's own smallest budget. The recomputation plan
    it starts from may recompute more than needed (hierarchical's recomputes 7 nodes where the MILP's
    optimum recomputes 4); from there only a move through plans over the budget (a kick: keep a
    recomputed value, then recompute another one to fit again) reaches the optimum the MILP proves."""
    ex = zoo.build("dropout_mlp", size="tiny")
    g = remat.plan(ex.model, *ex.args, solver="store_all", cache=False, **ex.kwargs).graph
    meta = {**g.meta, "transfer": {"d2h_bytes_per_s": 8.15e8, "h2d_bytes_per_s": 8.56e8, "latency_s": 1.2e-4,
                                   "overlap": False}}  # the CPU file store as measured here once
    g = Graph(g.nodes, g.values, g.forward_outputs, g.backward_outputs, g.name, meta)
    budget = solve("hybrid", g, 0, time_limit=2).peak_bytes
    greedy = solve("hybrid", g, budget, time_limit=2)
    optimum = solve("checkmate_swap", g, budget, time_limit=20)
    assert optimum.info["status"] == "optimal" and greedy.peak_bytes <= budget
    assert greedy.step_seconds <= 1.05 * optimum.step_seconds, (greedy.step_seconds, optimum.step_seconds)


def test_a_descent_stalled_above_the_budget_backs_up_from_the_lowest_plan(monkeypatch):
    """Where every start's descent stalls above the budget (on ResNet-18 under Inductor no single
    switch lowers the stem's backward), the greedy descends with budget 0 as far as it goes and
    refines that plan at the budget: it fits, and the memory left buys time back. The stall is
    forced here: the starts' descents return at once."""
    import remat.solvers.hybrid as hybrid

    g = chain(10, pinned_forward=True)
    lowest = solve("hybrid", g, 0)
    budget = (lowest.peak_bytes + smallest_plan(g, swaps=False).peak_bytes) // 2
    clear_caches()
    starts = []
    real_starts, real_refine = hybrid._starts, hybrid.GreedySearch.refine
    monkeypatch.setattr(hybrid, "_starts", lambda *a: starts.extend(real_starts(*a)) or list(starts))
    stalled = []

    def refine(self, start, deadline):
        if self.budget == budget and len(stalled) < len(starts):  # each start: stalled where it began
            stalled.append(start)
            return None, self.build(start), 0
        return real_refine(self, start, deadline)

    monkeypatch.setattr(hybrid.GreedySearch, "refine", refine)
    plan = solve("hybrid", g, budget)
    assert len(stalled) == len(starts) >= 1
    assert plan.peak_bytes <= budget and plan.step_seconds < lowest.step_seconds

    clear_caches()
    stalled.clear()
    starts.clear()
    monkeypatch.setattr(hybrid, "_lowest_state", lambda graph, state, limit: (hybrid.GreedySearch(graph, 0).build(state), 0))
    assert solve("hybrid", g, budget).peak_bytes > budget  # without backing up: nothing fits


def layered(n: int, overlap: bool = False) -> Graph:
    """``n`` identical layers (op ``linear``, module ``layers.<i>``), each one's backward reading its
    input; copies synchronous (``overlap=False``: every swap stalls) or beside compute."""
    from remat.graph import GraphBuilder

    b = GraphBuilder("layers")
    hs = [b.input("x", 10)]
    for i in range(n):
        hs += b.op(f"f{i}", [hs[-1]], [100], cost=1.0, op="linear", module=f"layers.{i}")
    (loss,) = b.op("loss", [hs[-1]], [4], op="loss")
    (g,) = b.op("loss_bwd", [b.tangent("dloss", 4), hs[-1]], [100], phase="backward", op="loss_bwd")
    for i in range(n - 1, -1, -1):
        (g,) = b.op(f"f{i}_bwd", [g, hs[i]] if i else [g], [100 if i else 10], phase="backward", cost=2.0,
                    op="linear_bwd", module=f"layers.{i}")
    meta = {"transfer": {"d2h_bytes_per_s": 1000.0, "h2d_bytes_per_s": 1000.0, "overlap": overlap}}
    return b.build(forward_outputs=[loss], backward_outputs=[g], meta=meta)


def test_alike_switches_of_identical_layers_are_taken_together():
    """From checkpoint_all's schedule at store_all's budget, keeping each layer's recomputed value is
    the same switch in each of 12 layers: the descent takes the best one and then all the others
    with it (one more simulation, as they fit together), instead of one layer per round."""
    from remat.solvers.hybrid_search import GreedySearch, State

    g = layered(12)
    store = solve("store_all", g, None)
    start = solve("checkpoint_all", g, None)
    assert start.recomputations >= 10
    fwd, bwd = start.schedule()
    search = GreedySearch(g, store.peak_bytes)
    first = search.build(State(tuple(fwd), tuple(bwd), ()))
    keeps = [c for c in search.candidates(first, limit=None) if c[1] == "keep"]
    kinds = {search.alike(first.state, "keep", target) for _, _, target in keeps}
    assert len(keeps) >= 10 and len(kinds) == 1  # the same keep in every layer
    fit, _, rounds = search.descend(first, float("inf"))
    assert fit.plan.recomputations == 0 and not fit.plan.offloaded_values
    assert fit.step == pytest.approx(store.step_seconds)
    # one layer per round took 13 rounds and 196 simulations
    assert rounds <= 3 and search.simulations <= 40, (rounds, search.simulations)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_step_floor_is_exact_for_synchronous_copies_and_a_bound_otherwise(overlap, monkeypatch):
    """The greedy skips switches whose step cannot beat the current one by :meth:`step_floor`;
    with synchronous copies every copy stalls for its whole length, so the floor is the simulator's
    step time exactly, and beside compute it is at most that. Checked on every state a search of
    the layered graph builds, offloading ones included."""
    from remat.solvers import hybrid

    g = layered(6, overlap=overlap)
    built = []
    original = hybrid.GreedySearch.build

    def build(self, state):
        ev = original(self, state)
        if ev is not None:
            built.append((self, ev))
        return ev

    monkeypatch.setattr(hybrid.GreedySearch, "build", build)
    solve("hybrid", g, 0)  # its smallest plan: swaps
    solve("hybrid", g, solve("store_all", g, None).peak_bytes * 3 // 4)
    assert any(ev.plan.offloaded_values for _, ev in built)
    for search, ev in built:
        floor = search.step_floor(ev.state)
        if overlap:
            assert floor <= ev.step + 1e-12
        else:
            assert floor == pytest.approx(ev.step, rel=1e-12, abs=1e-12)


def test_a_round_simulates_different_switches_not_one_switch_in_many_layers():
    """Within the budget every layer offers the same keep: a round's candidates hold at most
    ``PER_KIND`` of each kind of alike switches, so the rest of its candidates are other switches."""
    from remat.solvers.hybrid_search import PER_KIND, GreedySearch, State

    g = layered(12)
    start = solve("checkpoint_all", g, None)
    fwd, bwd = start.schedule()
    search = GreedySearch(g, solve("store_all", g, None).peak_bytes)
    first = search.build(State(tuple(fwd), tuple(bwd), ()))
    every = search.candidates(first, limit=None)
    chosen = search.candidates(first)
    kinds = [search.alike(first.state, kind, target) for _, kind, target in chosen]
    assert len(every) > len(chosen)
    assert max(kinds.count(k) for k in kinds) == PER_KIND
    assert {search.alike(first.state, kind, t) for _, kind, t in every} == set(kinds)  # every kind offered


def test_over_the_budget_alike_swaps_are_taken_together_as_far_as_the_budget_needs():
    """From store-all's schedule over the budget, swapping each layer's saved value is the same
    switch in every layer: one round takes the shortest prefix of them that fits, not one layer per
    round, and no more than the budget needs."""
    from remat.solvers.hybrid_search import GreedySearch, State

    g = layered(12)
    store = solve("store_all", g, None)
    budget = store.peak_bytes - 5 * 100  # five saved values must go
    fwd, bwd = store.schedule()
    search = GreedySearch(g, budget)
    first = search.build(State(tuple(fwd), tuple(bwd), ()))
    assert not first.fits
    fit, _, rounds = search.descend(first, float("inf"), recompute=False)
    assert fit is not None and fit.peak <= budget
    assert rounds <= 3, rounds
    assert 5 <= len(fit.state.reloads) < 11  # the shortest prefix that fits, not every layer's


def _record_cannot_fit(monkeypatch) -> list:
    """The (search, state, verdict) of every ``cannot_fit`` call from now on, in a list."""
    from remat.solvers import hybrid

    judged = []
    original = hybrid.GreedySearch.cannot_fit

    def cannot_fit(self, ev, state):
        verdict = original(self, ev, state)
        judged.append((self, state, verdict))
        return verdict

    monkeypatch.setattr(hybrid.GreedySearch, "cannot_fit", cannot_fit)
    return judged


def test_a_switch_judged_unable_to_fit_never_fits(monkeypatch):
    """``cannot_fit`` skips a switch within the budget without simulating it: checked against the
    simulator on every switch the searches from checkpoint_all's schedule of the layered graph
    consider, with room for two kept values (copies synchronous and beside compute), so that the
    skip only ever drops switches whose plan misses the budget."""
    from remat.solvers import hybrid

    judged = _record_cannot_fit(monkeypatch)
    for overlap in (False, True):
        g = layered(12, overlap=overlap)
        start = solve("checkpoint_all", g, None)
        fwd, bwd = start.schedule()
        search = hybrid.GreedySearch(g, start.peak_bytes + 250)  # room for two kept values
        search.descend(search.build(hybrid.State(tuple(fwd), tuple(bwd), ())), float("inf"))
    refused = [(search, state) for search, state, verdict in judged if verdict]
    assert refused and len(refused) < len(judged), (len(refused), len(judged))
    for search, state in refused:
        ev = search.build(state)
        assert ev is None or ev.peak > search.budget


def test_where_nothing_fits_the_smallest_plan_is_made_faster_within_its_own_peak(resnet_graph):
    """Below every plan's reach the answer is the plan of smallest peak; the memory its own peak
    leaves buys time back: faster than the descent's smallest plan, at the same peak (the zoo's tiny
    ResNet with synchronous copies, as remat's CPU file store makes them)."""
    from remat.solvers import hybrid

    g = with_synchronous_copies(resnet_graph)
    original = hybrid._fastest_at_peak
    seen = []

    def fastest(graph, smallest, limit):
        got = original(graph, smallest, limit)
        seen.append((smallest, got[0]))
        return got

    hybrid._fastest_at_peak = fastest
    try:
        plan = solve("hybrid", g, 1)  # far below any plan
    finally:
        hybrid._fastest_at_peak = original
    (smallest, chosen), = seen
    assert plan.peak_bytes == chosen.peak <= smallest.peak and not chosen.fits  # judged at the caller's budget
    assert plan.step_seconds < smallest.step


def _chain_with_a_big_value(overlap: bool) -> Graph:
    """x -> a1 (12 B) -> a2 .. a5 (10 B) -> v (100 B) -> w (50 B) -> loss; the backward of w (cost 10)
    then of v; copies at 20 B/s: a 100-byte offload takes 5 s, longer than the rest of the forward."""
    from remat.graph import GraphBuilder

    b = GraphBuilder("big value")
    h = b.input("x", 10)
    for i, nbytes in enumerate((12, 10, 10, 10, 10)):
        (h,) = b.op(f"a{i + 1}", [h], [nbytes], cost=1.0)
    (v,) = b.op("v", [h], [100], cost=1.0)
    (w,) = b.op("w", [v], [50], cost=1.0)
    (loss,) = b.op("loss", [w], [4], cost=1.0)
    (gw,) = b.op("bw", [b.tangent("dloss", 4), w], [10], phase="backward", cost=10.0)
    (gv,) = b.op("bv", [gw, v], [10], phase="backward", cost=1.0)
    meta = {"transfer": {"d2h_bytes_per_s": 20.0, "h2d_bytes_per_s": 20.0, "overlap": overlap}}
    return b.build(forward_outputs=[loss], backward_outputs=[gv], meta=meta)


def _dropout_chain() -> Graph:
    """lin -> drop (random) -> m -> big (500 B) -> loss; the backward reads drop's output after the
    loss's: checkpoint_all's schedule replays lin and drop there, holding the 16-byte generator state."""
    from remat.graph import GraphBuilder

    b = GraphBuilder("dropout")
    x = b.input("x", 10)
    (h,) = b.op("lin", [x], [40], cost=1.0)
    (d,) = b.op("drop", [h], [40], cost=1.0, random=True)
    (m,) = b.op("m", [d], [40], cost=1.0)
    (big,) = b.op("big", [m], [500], cost=1.0)
    (loss,) = b.op("loss", [big], [4], cost=1.0)
    (g1,) = b.op("bwd1", [b.tangent("dloss", 4), big], [4], phase="backward", cost=1.0)
    (g2,) = b.op("bwd2", [g1, d], [10], phase="backward", cost=1.0)
    meta = {"transfer": {"d2h_bytes_per_s": 1000.0, "h2d_bytes_per_s": 1000.0, "overlap": False},
            "rng_state_bytes": 16}
    return b.build(forward_outputs=[loss], backward_outputs=[g2], meta=meta)


@pytest.mark.parametrize("overlap", [False, True])
def test_cannot_fit_never_refuses_a_plan_that_fits_where_copies_or_replays_change(overlap):
    """The property ``cannot_fit`` rests on, where copies or replays change the memory at the forward's
    end: every switch of a state with a swapped value (its offload still copying when the forward
    ends, beside compute) and of a state that replays a random node (its generator state held), at
    every budget up to 40 bytes above where both plans fit: ``cannot_fit`` never refuses a fitting
    plan. (A review found two such refusals in the first version, one of each kind, on graphs like
    these; ``cannot_fit`` now judges only states with the same copies in the forward and counts the
    generator states.)"""
    from remat.solvers.hybrid_search import GreedySearch, State

    cases = []
    g = _chain_with_a_big_value(overlap)
    fwd, bwd = solve("store_all", g, None).schedule()
    v = next(val.id for val in g.values if val.name == "v")
    probe = GreedySearch(g, 10**9)
    info = probe.instances(tuple(fwd), tuple(bwd))
    cases.append((g, State(tuple(fwd), tuple(bwd), ((v, len(fwd) + 1),))))  # v swapped, reloaded before bv
    g = _dropout_chain()
    fwd, bwd = solve("checkpoint_all", g, None).schedule()
    assert any(g.nodes[n].random for n in bwd)  # the backward replays drop
    cases.append((g, State(tuple(fwd), tuple(bwd), ())))
    checked = 0
    for g, state in cases:
        probe = GreedySearch(g, 10**9)
        ev = probe.build(state)
        assert ev is not None and info
        for _, kind, target in probe.candidates(ev, limit=None) + [(0, "recompute", v) for v in probe.instances(state.forward, state.backward)]:
            changed = probe.apply(state, kind, target, probe.peak_position(ev))
            trial = None if changed is None else probe.build(changed)
            if trial is None:
                continue
            lowest = max(trial.peak, ev.peak)  # both fit from here on: up to 40 bytes more than the tighter
            for budget in range(lowest, lowest + 40):
                search = GreedySearch(g, budget)
                here = search.build(state)
                if here.fits:
                    assert not search.cannot_fit(here, changed), (kind, target, budget)
                    checked += 1
    assert checked >= 3


def test_over_the_budget_a_switch_that_fits_alone_takes_no_alike_ones():
    """Over the budget, where the chosen switch alone reaches it, no alike switch is added (a
    first version added at least one: an extra swap, and its copies, on a plan that already fit)."""
    from remat.solvers.hybrid_search import GreedySearch, State

    g = layered(12)
    store = solve("store_all", g, None)
    fwd, bwd = store.schedule()
    search = GreedySearch(g, store.peak_bytes - 100)  # one saved value must go
    first = search.build(State(tuple(fwd), tuple(bwd), ()))
    peak_pos = search.peak_position(first)
    fitting = [(kind, target, ev) for _, kind, target in search.candidates(first, recompute=False, limit=None)
               if (state := search.apply(first.state, kind, target, peak_pos)) is not None
               and (ev := search.build(state)) is not None and ev.fits]
    assert fitting
    for kind, target, ev in fitting:
        assert search.take_alike_over(first, ev, kind, target, peak_pos, float("inf")) is ev


def uneven_chain(overlap: bool) -> Graph:
    """A chain whose layers differ in output size and cost, so that the switches of one plan differ
    in what they save, what they cost and whether they fit."""
    from remat.graph import GraphBuilder

    sizes, costs = [100, 300, 50, 200, 120, 260, 80, 180], [1.0, 3.0, 0.5, 2.0, 1.5, 2.5, 0.7, 1.8]
    b = GraphBuilder("uneven")
    hs = [b.input("x", 10)]
    for i, (size, cost) in enumerate(zip(sizes, costs)):
        hs += b.op(f"f{i}", [hs[-1]], [size], cost=cost)
    (loss,) = b.op("loss", [hs[-1]], [4])
    (g,) = b.op("loss_bwd", [b.tangent("dloss", 4), hs[-1]], [sizes[-1]], phase="backward")
    for i in range(len(sizes) - 1, -1, -1):
        (g,) = b.op(f"f{i}_bwd", [g, hs[i]] if i else [g], [sizes[i - 1] if i else 10], phase="backward",
                    cost=2 * costs[i])
    meta = {"transfer": {"d2h_bytes_per_s": 400.0, "h2d_bytes_per_s": 400.0, "latency_s": 0.05, "overlap": overlap}}
    return b.build(forward_outputs=[loss], backward_outputs=[g], meta=meta)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_round_within_the_budget_simulates_best_first_and_chooses_as_simulating_every_switch_would(overlap):
    """From checkpoint_all's schedule at a budget a twentieth of the way to store_all's peak, the round's choice (the
    fitting switch of least (step, peak)) is the one every switch simulated gives; the round simulates
    in the order of the step floors and stops at the first floor above its best step. With synchronous
    copies the floor is the step, so it simulates fewer switches than there are."""
    from remat.solvers.hybrid_search import GreedySearch, State

    g = uneven_chain(overlap)
    start, store = solve("checkpoint_all", g, None), solve("store_all", g, None)
    budget = start.peak_bytes + (store.peak_bytes - start.peak_bytes) // 20
    fwd, bwd = start.schedule()
    search = GreedySearch(g, budget)
    cur = search.build(State(tuple(fwd), tuple(bwd), ()))
    assert cur.fits
    switches = search.candidates(cur)
    exhaustive = GreedySearch(g, budget)
    trials = [(exhaustive.build(s), kind, target) for _, kind, target in switches
              if (s := exhaustive.apply(cur.state, kind, target)) is not None]
    faster = [t for t in trials if t[0] is not None and t[0].fits and t[0].step < cur.step - 1e-12]
    assert faster and len(faster) < len(trials)  # some switches fit and gain, others do not
    best = min(faster, key=lambda t: (t[0].step, t[0].peak))
    before = search.simulations
    choice = search._fastest_fitting(cur, switches, float("inf"))
    assert (choice[0].step, choice[0].peak) == (best[0].step, best[0].peak)
    if not overlap:
        assert search.simulations - before < len(trials)


def test_a_descent_over_the_budget_gives_up_once_its_step_floor_cannot_beat_the_plan_to_beat():
    """With synchronous copies every swap adds its copy to the step: a descent over the budget (a
    kick's way back) is given up at once when the plan it must beat (``beat``) is no slower than its
    compute; without ``beat`` the same descent reaches the budget."""
    from remat.solvers.hybrid_search import GreedySearch, State

    g = uneven_chain(False)
    store = solve("store_all", g, None)
    budget = int(0.8 * store.peak_bytes)
    fwd, bwd = store.schedule()
    search = GreedySearch(g, budget)
    first = search.build(State(tuple(fwd), tuple(bwd), ()))
    assert not first.fits
    fit, _, rounds = search.descend(first, float("inf"), recompute=False, beat=store.step_seconds)
    assert fit is None and rounds == 0
    fit, _, rounds = search.descend(first, float("inf"), recompute=False)
    assert fit is not None and rounds > 0 and fit.step > store.step_seconds


@pytest.mark.parametrize("model", ["gpt2", "vit"])
def test_cannot_fit_judged_into_the_backward_never_refuses_a_plan_that_fits(monkeypatch, model):
    """``cannot_fit`` carries the difference in held bytes from the forward's end into the backward,
    up to the first computation a keep or a drop removes. Checked against the simulator on captured
    graphs (GPT-2, ViT: in-place writes into dying inputs, dropout replays) with synchronous copies: the
    greedy from checkpoint_all's schedule, within a budget halfway to store_all's peak; every switch
    refused is simulated and misses the budget, and some were refused for a peak past the forward's
    end (the part this adds)."""
    from remat.solvers import hybrid

    ex = zoo.build(model, size="tiny")
    g = with_synchronous_copies(remat.plan(ex.model, *ex.args, solver="store_all", **ex.kwargs).graph)
    judged = _record_cannot_fit(monkeypatch)
    start = solve("checkpoint_all", g, None)
    budget = (start.peak_bytes + solve("store_all", g, None).peak_bytes) // 2
    fwd, bwd = start.schedule()
    search = hybrid.GreedySearch(g, budget)
    search.refine(hybrid.State(tuple(fwd), tuple(bwd), ()), float("inf"))
    refused = [state for _, state, verdict in judged if verdict]
    assert refused, len(judged)
    past_the_forward = 0
    for state in refused:
        ev = search.build(state)
        assert ev is None or ev.peak > budget
        if ev is not None:
            timeline, boundary = ev.plan.simulation.timeline, ev.plan.boundary
            past_the_forward += max(timeline[:boundary]) <= budget < ev.peak
    assert past_the_forward, len(refused)

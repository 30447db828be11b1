"""Swaps judged without simulating them where copies are synchronous (``solvers/hybrid_swaps.py``):
the predicted key is the simulator's, checked on captured graphs; the greedy makes the plans it made
by simulating every switch, with fewer simulations; a wrong prediction is caught and the search
simulates from then on."""

from __future__ import annotations

import random

import pytest

import remat
from remat import models as zoo
from remat.plan import Plan
from remat.simulate import simulate
from remat.solvers import hybrid_search, hybrid_swaps, solve
from remat.solvers.hybrid_search import GreedySearch, State
from remat.solvers.planner import clear_caches

from .swap_graphs import fresh_planner_caches, with_synchronous_copies


pytestmark = pytest.mark.usefixtures("fresh_planner_caches")


@pytest.fixture(scope="module", params=["gpt2", "vit"])
def graph(request):
    """A captured tiny model (in-place writes into dying inputs, dropout replays) with the CPU file
    store's synchronous copies."""
    ex = zoo.build(request.param, size="tiny")
    return with_synchronous_copies(remat.plan(ex.model, *ex.args, solver="store_all", **ex.kwargs).graph)


def _swap_sets(search: GreedySearch, fwd: tuple, bwd: tuple, rng: random.Random, count: int):
    """``count`` random swap sets on the schedule: reloads anywhere in (last forward use, first
    backward use], the ends included (the boundary's gap, the first use itself), and some outside."""
    info = search.instances(fwd, bwd)
    values = sorted(info)
    for _ in range(count):
        chosen = rng.sample(values, rng.randint(1, min(len(values), 8)))
        reloads = []
        for v in chosen:
            last, first = info[v]
            r = rng.choice([last + 1, first, len(fwd), rng.randint(last + 1, first)])
            if rng.random() < 0.05:
                r = last  # invalid: the build rejects it, and so must the prediction
            reloads.append((v, min(max(r, last), first)))
        yield State(fwd, bwd, tuple(sorted(reloads)))


@pytest.mark.parametrize("schedule", ["store_all", "chen_sqrt"])
def test_the_predicted_key_is_the_simulators(graph, schedule):
    """On store-all's schedule and on chen_sqrt's (recomputations in the backward), for random
    sets of swaps: the prediction is None exactly where the simulator rejects the plan, and otherwise
    gives its peak and its bytes over the budget exactly, and its step to rounding."""
    fwd, bwd = solve(schedule, graph, None).schedule()
    budget = solve("store_all", graph, None).peak_bytes // 2
    search = GreedySearch(graph, budget)
    assert search.swap_keys is not None
    rng = random.Random(0)
    compared = 0
    for state in _swap_sets(search, tuple(fwd), tuple(bwd), rng, 150):
        predicted, simulated = search.swap_keys.predict(state), search.build(state)
        assert (predicted is None) == (simulated is None), state
        if simulated is not None:
            compared += 1
            assert (predicted.peak, predicted.excess) == (simulated.peak, simulated.key()[1])
            assert predicted.step == pytest.approx(simulated.step, rel=1e-12)
            assert predicted.fits == simulated.fits
    assert compared > 100


def test_highs_are_each_instructions_most_bytes_and_their_maximum_is_the_peak(graph):
    fwd, bwd = solve("chen_sqrt", graph, None).schedule()
    search = GreedySearch(graph, 0)
    plan = next(ev.plan for state in _swap_sets(search, tuple(fwd), tuple(bwd), random.Random(1), 20)
                if (ev := search.build(state)) is not None)
    assert plan.offloaded_values
    sim = simulate(graph, plan.instructions, plan.boundary, record_highs=True)
    assert len(sim.highs) == len(sim.timeline) == len(plan.instructions)
    assert all(h >= t for h, t in zip(sim.highs, sim.timeline))
    assert max(sim.highs) == sim.peak_bytes == plan.peak_bytes
    assert Plan(graph, plan.instructions, plan.boundary).simulation.highs == ()  # only when asked


def _without_predictions(monkeypatch):
    monkeypatch.setattr(hybrid_search, "SwapKeys", lambda search: None)


def test_the_greedy_makes_the_same_plan_with_fewer_simulations(graph, monkeypatch):
    """The hybrid's smallest plan (budget 0) and its plan at 60% of store-all's peak, with
    predictions and without (every switch simulated, as before them): the same peak and step; fewer
    simulations."""
    store = solve("store_all", graph, None).peak_bytes
    counted = {}
    original_build = GreedySearch._build

    def counting(self, state):
        counted[mode] = counted.get(mode, 0) + 1
        return original_build(self, state)

    monkeypatch.setattr(GreedySearch, "_build", counting)
    original_predict = hybrid_swaps.SwapKeys.predict

    def predict(self, state):
        counted["predictions"] = counted.get("predictions", 0) + 1
        return original_predict(self, state)

    monkeypatch.setattr(hybrid_swaps.SwapKeys, "predict", predict)
    plans = {}
    for mode in ("predicted", "simulated"):
        with monkeypatch.context() as m:
            if mode == "simulated":
                _without_predictions(m)
            clear_caches()
            plans[mode] = [solve("hybrid", graph, int(f * store), time_limit=600) for f in (0, 0.6)]
    for a, b in zip(plans["predicted"], plans["simulated"]):
        assert a.peak_bytes == b.peak_bytes and a.step_seconds == pytest.approx(b.step_seconds, rel=1e-9)
    assert counted["predictions"] > 0 and counted["predicted"] < counted["simulated"], counted


def test_a_wrong_prediction_is_caught_and_the_search_simulates_from_then_on(graph, monkeypatch):
    """Predictions made one byte low: the first switch taken on one is simulated, disagrees, and
    from then on every switch is simulated; the plan (the smallest) is the one simulating everything
    gives."""
    budget = 0
    with monkeypatch.context() as m:
        _without_predictions(m)
        reference = solve("hybrid", graph, budget, time_limit=600)
    clear_caches()
    original = hybrid_swaps.SwapKeys.predict
    searches = []

    def off_by_one(self, state):
        searches.append(self)
        p = original(self, state)
        return None if p is None else hybrid_swaps.Predicted(p.state, p.peak - 1, p.excess, p.step, p.budget)

    monkeypatch.setattr(hybrid_swaps.SwapKeys, "predict", off_by_one)
    plan = solve("hybrid", graph, budget, time_limit=600)
    assert searches and all(k.mismatches <= 1 for k in searches) and any(k.mismatches for k in searches)
    assert all(k.search.swap_keys is None for k in searches if k.mismatches)
    assert plan.peak_bytes == reference.peak_bytes and plan.step_seconds == pytest.approx(reference.step_seconds)

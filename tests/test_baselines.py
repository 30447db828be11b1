"""Classic baselines on hand-built graphs: Chen's √n and greedy segments (cut anywhere or only at
articulation points) and Griewank's Revolve, plus a quick check on two zoo models."""

from functools import lru_cache

import pytest

import remat
from remat import models as zoo
from remat.errors import SolverError
from remat.graph import BACKWARD, GraphBuilder
from remat.solvers import SOLVERS, solve
from remat.solvers.chen import greedy_sweep
from remat.solvers.revolve import min_advances
from remat.solvers.schedule import forward_articulation_points

from .test_plan import chain


def residual(blocks=4, size=100):
    """stem, then ``blocks`` residual blocks h' = c(a(h)) + h, then a loss; backward in reverse."""
    b = GraphBuilder("residual")
    x = b.input("x", 1000)
    t = b.tangent("t", 1)
    (h,) = b.op("stem", [x], [size])
    hs, inner = [h], []
    for i in range(blocks):
        (a,) = b.op(f"a{i}", [h], [size])
        (c,) = b.op(f"c{i}", [a], [size])
        (h,) = b.op(f"add{i}", [c, h], [size])
        inner.append(a)
        hs.append(h)
    (loss,) = b.op("loss", [h], [1])
    grad, grads = t, []
    for i in reversed(range(blocks)):
        (g_a, w_c) = b.op(f"c{i}_bwd", [grad, inner[i]], [size, 10], phase=BACKWARD, cost=2.0)
        (g_h, w_a) = b.op(f"a{i}_bwd", [g_a, hs[i]], [size, 10], phase=BACKWARD, cost=2.0)
        (grad,) = b.op(f"add{i}_bwd", [g_h, grad], [size], phase=BACKWARD)
        grads += [w_c, w_a]
    (w_s,) = b.op("stem_bwd", [grad, x], [10], phase=BACKWARD, cost=2.0)
    return b.build(forward_outputs=[loss], backward_outputs=grads + [w_s])


def diamond(size=100):
    """x -> a -> (b, c) -> d = b + c -> loss: not a chain."""
    bld = GraphBuilder("diamond")
    x = bld.input("x", 1000)
    t = bld.tangent("t", 1)
    (a,) = bld.op("a", [x], [size])
    (b,) = bld.op("b", [a], [size])
    (c,) = bld.op("c", [a], [size])
    (d,) = bld.op("d", [b, c], [size])
    (loss,) = bld.op("loss", [d], [1])
    (g_b, g_c) = bld.op("d_bwd", [t, b, c], [size, size], phase=BACKWARD)
    (g_a1, w_b) = bld.op("b_bwd", [g_b, a], [size, 10], phase=BACKWARD)
    (g_a2, w_c) = bld.op("c_bwd", [g_c, a], [size, 10], phase=BACKWARD)
    (w_a,) = bld.op("a_bwd", [g_a1, g_a2, x], [10], phase=BACKWARD)
    return bld.build(forward_outputs=[loss], backward_outputs=[w_b, w_c, w_a])


def names(g, ids):
    return [g.nodes[i].name for i in ids]


def test_registered():
    for name in ("chen_sqrt", "chen_sqrt_ap", "chen_greedy", "chen_greedy_ap", "revolve"):
        assert name in SOLVERS


# ------------------------------------------------------------------------ articulation points
def test_articulation_points():
    g = chain(n=5)
    assert forward_articulation_points(g) == [n.id for n in g.forward_nodes]
    g = residual(blocks=3)
    assert names(g, forward_articulation_points(g)) == ["stem", "add0", "add1", "add2", "loss"]
    g = diamond()
    assert names(g, forward_articulation_points(g)) == ["a", "d", "loss"]


# ------------------------------------------------------------------------ Chen √n
def test_chen_sqrt_cuts_option():
    g = chain(n=16)
    linear, ap = solve("chen_sqrt", g, None), solve("chen_sqrt_ap", g, None)
    assert linear.info["cuts"] == "linear" and ap.info["cuts"] == "articulation"
    assert ap.solver == "chen_sqrt_ap"
    assert ap.instructions == linear.instructions  # on a chain every node is a cut point

    g = residual(blocks=6)
    aps = set(forward_articulation_points(g))
    ap = solve("chen_sqrt_ap", g, None)
    same = solve("chen_sqrt", g, None, cuts="articulation")
    assert same.instructions == ap.instructions
    assert 1 < ap.info["segments"] <= len(aps)
    # only articulation points' outputs cross the cuts, so only they are saved for the backward
    assert ap.saved_values and all(g.values[v].producer in aps for v in ap.saved_values)
    store, ckpt = solve("store_all", g, None), solve("checkpoint_all", g, None)
    assert ckpt.peak_bytes <= ap.peak_bytes < store.peak_bytes
    with pytest.raises(SolverError, match="cuts must be 'linear'.*'articulation'"):
        solve("chen_sqrt", g, None, cuts="anywhere")


# ------------------------------------------------------------------------ Chen greedy
@pytest.mark.parametrize("cuts", ["linear", "articulation"])
@pytest.mark.parametrize("make", [lambda: chain(n=12), lambda: residual(blocks=5)], ids=["chain", "residual"])
def test_chen_greedy_fits_whenever_a_sweep_point_fits(make, cuts):
    g = make()
    name = "chen_greedy" if cuts == "linear" else "chen_greedy_ap"
    sweep = greedy_sweep(g, cuts=cuts)
    assert len(sweep) > 2
    segments = [p.info["segments"] for p in sweep]  # thresholds ascend: fewer, longer segments
    assert segments == sorted(segments, reverse=True)
    for point in sweep:
        best = solve(name, g, point.peak_bytes)
        assert best.peak_bytes <= point.peak_bytes
        assert best.compute_seconds <= point.compute_seconds + 1e-9
        assert best.info["cuts"] == cuts and "threshold_bytes" in best.info
    smallest = min(p.peak_bytes for p in sweep)
    assert solve(name, g, smallest - 1).peak_bytes == smallest  # nothing fits: the smallest peak
    assert solve(name, g, None).compute_seconds == min(p.compute_seconds for p in sweep)
    store = solve("store_all", g, None)
    assert smallest < store.peak_bytes


def test_chen_greedy_ap_cuts_only_at_articulation_points():
    g = residual(blocks=5)
    aps = set(forward_articulation_points(g))
    for plan in greedy_sweep(g, cuts="articulation"):
        assert all(g.values[v].producer in aps for v in plan.saved_values)


# ------------------------------------------------------------------------ Revolve
@lru_cache(maxsize=None)
def fewest_advances(l, s):
    """Independent DP: forward steps (besides one tape per step) to reverse l steps with s snapshots."""
    if l == 1:
        return 0
    if s == 0:  # from x_0 every time: 0 + 1 + … + (l − 1)
        return l * (l - 1) // 2
    return min(m + fewest_advances(l - m, s - 1) + fewest_advances(m, s) for m in range(1, l))


def test_binomial_formula_matches_the_dp():
    # Griewank's p(10, c) with c = s + 1 checkpoints counting x_0: 20 (c = 2) and 15 (c = 3)
    assert fewest_advances(10, 1) == 20 and fewest_advances(10, 2) == 15
    for l in range(1, 40):
        for s in range(0, 8):
            assert min_advances(l, s) == fewest_advances(l, s), (l, s)


def test_revolve_recomputes_the_binomial_count_and_memory_falls_with_snapshots():
    for n in range(1, 10):
        g = chain(n=n)
        l = n + 1  # the loss is the last step
        peaks = []
        for s in range(0, l + 1):
            plan = solve("revolve", g, None, snapshots=s)
            assert plan.recomputations == fewest_advances(l, s), (l, s)
            assert plan.info["snapshots"] == s
            peaks.append(plan.peak_bytes)
        assert peaks == sorted(peaks)
        if l >= 5:
            assert peaks[0] < peaks[-1] <= solve("store_all", g, None).peak_bytes
            assert peaks[0] <= solve("checkpoint_all", g, None).peak_bytes


def test_revolve_sweep_returns_cheapest_fitting_plan():
    g = chain(n=10)
    fixed = [solve("revolve", g, None, snapshots=s) for s in range(0, 11)]
    for p in fixed:
        best = solve("revolve", g, p.peak_bytes)
        assert best.peak_bytes <= p.peak_bytes and best.compute_seconds <= p.compute_seconds
    least = min(p.peak_bytes for p in fixed)
    assert solve("revolve", g, least - 1).peak_bytes == least
    assert solve("revolve", g, None).compute_seconds == min(p.compute_seconds for p in fixed)


def test_revolve_backward_reading_far_back_stays_valid():
    b = GraphBuilder("chain_far")
    x = b.input("x", 1000)
    t = b.tangent("t", 1)
    acts = [x]
    for i in range(1, 9):
        acts.append(b.op(f"f{i}", [acts[-1]], [100])[0])
    (loss,) = b.op("loss", [acts[-1]], [1])
    grad, grads = t, []
    for i in range(8, 0, -1):
        extra = [acts[1]] if i == 6 else []  # reads a value far before its step
        grad, g_w = b.op(f"b{i}", [grad, acts[i], acts[i - 1], *extra], [100, 10], phase=BACKWARD)
        grads.append(g_w)
    g = b.build(forward_outputs=[loss], backward_outputs=grads)
    for s in range(0, 9):
        solve("revolve", g, None, snapshots=s)  # the simulator validates every plan


def test_revolve_needs_a_chain():
    with pytest.raises(SolverError, match="revolve needs a chain: forward node c reads a produced by non-adjacent node a"):
        solve("revolve", diamond(), None)
    with pytest.raises(SolverError, match="use chen_sqrt_ap / checkmate"):
        solve("revolve", residual(), None)


# ------------------------------------------------------------------------ real models
@pytest.mark.parametrize("model", ["mlp", "resnet"])
def test_zoo_models(model):
    ex = zoo.build(model, size="tiny")
    for name in ("chen_greedy", "chen_greedy_ap", "chen_sqrt_ap"):
        plan = remat.plan(ex.model, *ex.args, solver=name, budget=None, cost_model="unit")
        assert plan.solver == name and plan.overhead >= 0
    if model == "mlp":
        plan = remat.plan(ex.model, *ex.args, solver="revolve", budget=None, cost_model="unit")
        assert plan.solver == "revolve" and plan.info["steps"] == plan.info["snapshots"] + 1
    else:
        with pytest.raises(SolverError, match="revolve needs a chain"):
            remat.plan(ex.model, *ex.args, solver="revolve", budget=None, cost_model="unit")


def test_chen_greedys_sweep_is_made_once_per_graph_and_its_plans_are_never_handed_out_shared():
    g = chain(n=8, size=100)
    sweep = greedy_sweep(g)
    assert greedy_sweep(g) is sweep  # the memo: a Pareto sweep's budgets and the MILP's warm starts share it
    store = solve("store_all", g, None).peak_bytes
    a, b = solve("chen_greedy", g, store), solve("chen_greedy", g, store // 2)
    assert a is not b and all(p is not a and p is not b for p in sweep)
    assert (a.budget_bytes, b.budget_bytes) == (store, store // 2)
    assert all(p.budget_bytes is None for p in sweep)

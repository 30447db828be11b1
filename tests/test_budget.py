"""What a budget means: fixed bytes, fractions of the changeable part, "min", and the minimum
InfeasibleBudgetError names (in bytes and as a fraction), which must always plan."""

import re

import pytest

import remat
from remat import models as zoo
from remat.budget import (BudgetError, bytes_to_fraction, fixed_bytes, fraction_to_bytes, is_min,
                          resolve_budget)
from remat.graph import GraphBuilder
from remat.solvers.planner import FAST_SOLVERS, make_plan, resolve
from remat.solvers import solve


def small_graph():
    """w, x -> h -> y (the loss, held by the caller); backward: dh, dw (the gradient)."""
    b = GraphBuilder("small")
    w = b.input("w", 100)
    x = b.input("x", 10)
    (h,) = b.op("f", [w, x], [40])
    (y,) = b.op("loss", [h], [4])
    (t,) = [b.tangent("t", 4)]
    (dh,) = b.op("loss_bwd", [t, h], [40], phase="backward")
    (dw,) = b.op("f_bwd", [dh, x], [100], phase="backward")
    return b.build(forward_outputs=[y, x], backward_outputs=[dw]), {"y": y, "dw": dw, "h": h}


def test_fixed_bytes_are_the_gradients_and_the_held_outputs():
    g, _ = small_graph()
    assert fixed_bytes(g) == 100 + 4  # dw and the loss; the input x is outside the budget
    # a value both handed back and held is counted once
    b = GraphBuilder()
    w = b.input("w", 8)
    (y,) = b.op("f", [w], [16])
    (g2,) = b.op("g", [y], [8], phase="backward")
    assert fixed_bytes(b.build(forward_outputs=[y], backward_outputs=[g2, y])) == 24


def test_no_plan_goes_below_the_fixed_bytes():
    g, _ = small_graph()
    for name in ("store_all", "checkpoint_all", "checkmate"):
        assert solve(name, g, 0).peak_bytes >= fixed_bytes(g)


def test_a_fraction_scales_only_what_a_plan_can_change():
    assert resolve_budget(1.0, 1000, 200) == 1000  # all of the store-everything peak
    assert resolve_budget(0.5, 1000, 200) == 600  # the fixed 200 plus half of the other 800
    assert resolve_budget(0.25, 1000, 200) == 400
    assert resolve_budget(1, 1000, 200) == 1  # an int is bytes: one byte
    assert resolve_budget("2KiB", 1000, 200) == 2048
    assert resolve_budget(None, 1000, 200) is None
    assert resolve_budget("min", 1000, 200, smallest=lambda: 777) == 777
    assert resolve_budget(" MIN ", 1000, 200, smallest=lambda: 777) == 777
    assert is_min("Min") and not is_min("minimum") and not is_min(0.5)
    with pytest.raises(BudgetError, match="min"):
        resolve_budget("min", 1000, 200)  # only the planner can find the minimum
    for bad in (1.5, 0.0, -3, True, [1], "lots"):
        with pytest.raises(BudgetError):
            resolve_budget(bad, 1000, 200)


def test_bytes_to_fraction_is_the_smallest_fraction_that_reaches_them():
    peak, fixed = 987_654_321, 123_456_789
    for n in range(fixed, peak + 1, 7_777_777):
        f = bytes_to_fraction(n, peak, fixed)
        assert 0 < f <= 1 and fraction_to_bytes(f, peak, fixed) >= n
        if f > 1e-4:
            assert fraction_to_bytes(round(f - 1e-4, 4), peak, fixed) < n
    assert bytes_to_fraction(peak, peak, fixed) == 1.0
    assert bytes_to_fraction(peak + 1, peak, fixed) is None  # no fraction reaches above the peak
    assert bytes_to_fraction(50, 50, 50) == 1.0  # nothing to change: every fraction is the peak


def test_resolve_on_a_graph_uses_its_store_all_peak_and_fixed_bytes():
    g, _ = small_graph()
    store, fixed = solve("store_all", g, None).peak_bytes, fixed_bytes(g)
    assert resolve(g, 1.0) == store
    assert resolve(g, 0.5) == fixed + (store - fixed) // 2
    smallest = min(solve(n, g, 0).peak_bytes for n in ("store_all", "checkpoint_all", "checkmate"))
    assert resolve(g, "min") == smallest
    plan = make_plan(g, "min")
    assert plan.peak_bytes <= plan.budget_bytes == smallest


@pytest.fixture(scope="module")
def graphs():
    """The captured graphs of a few small zoo models (captured once)."""
    out = {}
    for name in ("mlp", "cnn_bn", "dropout_mlp", "gpt2"):
        ex = zoo.build(name, size="tiny")
        out[name] = remat.plan(ex.model, *ex.args, solver="store_all", **ex.kwargs).graph
    return out


@pytest.mark.filterwarnings("ignore::remat.errors.SolverTimeLimitWarning")  # the MILP stops at 1 s
@pytest.mark.parametrize("name", ["mlp", "cnn_bn", "dropout_mlp", "gpt2"])
def test_the_minimum_named_is_the_smallest_and_plans(graphs, name):
    g = graphs[name]
    with pytest.raises(remat.InfeasibleBudgetError) as info:
        make_plan(g, 1e-4, time_limit=1)  # the fixed bytes and next to nothing: below every plan
    err = info.value
    fast = min(solve(n, g, 0).peak_bytes for n in FAST_SOLVERS + ("store_all",))
    assert fixed_bytes(g) <= err.min_budget_bytes <= fast
    msg = str(err)
    assert f"({err.min_budget_bytes} bytes, fraction {err.min_budget_fraction:.4f})" in msg
    assert err.budget_fraction == 1e-4 and err.budget_bytes == resolve(g, 1e-4)
    exact = make_plan(g, "min", time_limit=1).peak_bytes
    if err.lower_bound_bytes is None:  # at or above the lower bound: the search named the exact minimum
        assert err.min_budget_bytes == exact
        listed = [int(b) for b in re.findall(r"(\d+) bytes: ", msg)]
        assert listed and min(listed) == err.min_budget_bytes
    else:  # refused below the lower bound without searching: the bound, and a budget that plans above it
        assert fixed_bytes(g) <= err.lower_bound_bytes <= exact <= err.min_budget_bytes
        assert "no plan can peak below" in msg or err.lower_bound_bytes == err.min_budget_bytes
    # once the exact minimum is known for the graph, the same refusal names it
    with pytest.raises(remat.InfeasibleBudgetError) as again:
        make_plan(g, 1e-4, time_limit=1)
    assert again.value.min_budget_bytes == exact
    # the budget named plans, as bytes, as a fraction and as "min"
    for budget in (err.min_budget_bytes, err.min_budget_fraction, "min"):
        plan = make_plan(g, budget, time_limit=1)
        assert plan.peak_bytes <= plan.budget_bytes
        assert plan.peak_bytes <= err.min_budget_bytes
    assert resolve(g, err.min_budget_fraction) >= err.min_budget_bytes


def test_named_solver_falls_back_to_its_smallest_plan_and_names_its_own_minimum(graphs):
    g = graphs["cnn_bn"]
    own = solve("chen_sqrt", g, 0).peak_bytes
    plan = make_plan(g, own, "chen_sqrt")
    assert plan.peak_bytes <= own and plan.solver == "chen_sqrt"
    with pytest.raises(remat.InfeasibleBudgetError) as info:
        make_plan(g, own - 1, "chen_sqrt")
    assert info.value.min_budget_bytes == own and info.value.solver == "chen_sqrt"
    assert "with solver 'chen_sqrt'" in str(info.value)


def test_pareto_accepts_min_and_reports_fixed_bytes():
    ex = zoo.build("mlp", size="tiny")
    front = remat.pareto(ex.model, *ex.args, solvers=["rotor", "reorder"], budgets=[1.0, "min"], **ex.kwargs)
    assert front.fixed_bytes == fixed_bytes(front["rotor"][0].graph) < front.store_all_peak
    # on the tiny MLP no recomputation lowers the peak, and reordering lowers it by a few bytes
    assert front.budgets[0] == front.store_all_peak and front["reorder"][1].peak_bytes == front.budgets[1]


def test_a_budget_string_means_the_same_in_python_and_on_the_command_line():
    """One parser: ``"0.5"`` is a fraction in Python as in ``--budget 0.5`` and ``REMAT_BUDGET``, a
    bare number above 1 needs a unit everywhere, and the plan cache keys "0.5" as 0.5."""
    from remat.budget import parse_budget_text
    from remat.solvers.cache import _budget_key

    assert resolve_budget("0.5", 1000, 200) == resolve_budget(0.5, 1000, 200) == 600
    assert resolve_budget(" 1 ", 1000, 200) == 1000 and resolve_budget("123B", 1000, 200) == 123
    for text in ("1e3", "1000", "0", "-0.5"):
        with pytest.raises(BudgetError) as in_python:
            resolve_budget(text, 1000, 200)
        with pytest.raises(BudgetError) as on_the_command_line:
            parse_budget_text(text)
        assert str(in_python.value) == str(on_the_command_line.value)
    assert _budget_key("0.5") == _budget_key(0.5) and _budget_key("2KiB") == _budget_key(2048)

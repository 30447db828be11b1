"""remat.tools.plots on hand-built graphs: the schedule matrix's stages, and every plot written and read back."""

import matplotlib.image
import numpy as np
import pytest

from remat.tools import plots as viz
from remat.tools.pareto import ParetoFront
from remat.measure import StepMeasurement
from remat.solvers import solve

from .test_plan import chain

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert image[..., :3].std() > 0.01  # something was drawn


def assert_svg(path):
    text = path.read_text()
    assert "<svg" in text and "</svg>" in text


def test_schedule_matrix_of_store_all_is_the_diagonal_with_what_backward_reads_kept():
    g = chain(n=4)
    plan = solve("store_all", g, None)
    m = viz.schedule_matrix(plan)
    n = len(g.nodes)
    assert m.shape == (n, n)
    assert (np.diag(m) == viz.COMPUTED).all()  # each op computed once, in graph order
    assert not (m == viz.RECOMPUTED).any()
    # f1's output is read by b2 and b1 (the last two ops): kept in every stage from f2 up to b1
    f1 = next(nd.id for nd in g.nodes if nd.name == "f1")
    b1 = next(nd.id for nd in g.nodes if nd.name == "b1")
    assert (m[f1 + 1 : b1 + 1, f1] == viz.KEPT).all()
    assert not (np.triu(m, 1) != viz.EMPTY).any()  # nothing right of the diagonal: not computed yet


def test_schedule_matrix_counts_the_plans_recomputations():
    g = chain(n=6)
    for solver in ("checkpoint_all", "chen_sqrt"):
        plan = solve(solver, g, None)
        m = viz.schedule_matrix(plan)
        assert m.shape[0] == len(g.nodes)  # one stage per op's first computation
        assert plan.recomputations > 0
        # a stage recomputes an op at most once here, so cells equal recomputations
        assert int((m == viz.RECOMPUTED).sum()) == plan.recomputations
        assert (np.tril(m == viz.RECOMPUTED, -1) == (m == viz.RECOMPUTED)).all()  # only left of the diagonal


def test_binning_keeps_the_strongest_mark():
    g = chain(n=30)
    plan = solve("checkpoint_all", g, None)
    full = viz.schedule_matrix(plan)
    shown, fr, fc = viz._binned(full, 8)
    assert fr > 1 and fc > 1 and max(shown.shape) <= 8
    assert (shown == viz.RECOMPUTED).any()
    assert shown.max() == full.max()


def test_plot_timeline_png_and_svg_with_measured_overlays(tmp_path):
    g = chain(n=5)
    plan = solve("chen_sqrt", g, None)
    plan.budget_bytes = plan.peak_bytes + 50
    viz.plot_timeline(plan, tmp_path / "t.png", measured=plan.peak_bytes + 10)
    assert_png(tmp_path / "t.png")
    series = [0, 100, plan.peak_bytes, 20]
    fig = viz.plot_timeline(plan, tmp_path / "t.svg", measured=series)
    assert_svg(tmp_path / "t.svg")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("budget" in t for t in labels) and any("measured peak" in t for t in labels)
    m = StepMeasurement(peak_bytes=plan.peak_bytes, seconds=0.1, samples=(0.1,), device="cpu")
    fig = viz.plot_timeline(plan, measured=m)
    assert any("measured peak" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    with pytest.raises(ValueError, match="at least one"):
        viz.plot_timeline(plan, measured=[])


def test_plot_refuses_an_unknown_suffix(tmp_path):
    plan = solve("store_all", chain(n=2), None)
    with pytest.raises(ValueError, match=".png"):
        viz.plot_schedule(plan, tmp_path / "s.txt")


def test_plot_schedule_png(tmp_path):
    plan = solve("checkpoint_all", chain(n=8), None)
    viz.plot_schedule(plan, tmp_path / "s.png")
    assert_png(tmp_path / "s.png")
    big = solve("checkpoint_all", chain(n=300), None)  # binned: > 400 ops
    fig = viz.plot_schedule(big, tmp_path / "big.png")
    assert "binned" in fig.axes[0].get_title()
    assert_png(tmp_path / "big.png")


def test_plot_pareto_one_line_per_solver_with_gaps(tmp_path):
    g = chain(n=6)
    store, chen = solve("store_all", g, None), solve("chen_sqrt", g, None)
    front = ParetoFront()
    front.budgets = [store.peak_bytes, chen.peak_bytes, chen.peak_bytes // 2]
    front.store_all_peak = store.peak_bytes
    front["store_all"] = [store, None, None]
    front["chen_sqrt"] = [chen, chen, None]
    fig = viz.plot_pareto(front, tmp_path / "p.png")
    assert_png(tmp_path / "p.png")
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert len(lines["chen_sqrt"].get_xdata()) == 2 and len(lines["store_all"].get_xdata()) == 1
    assert list(lines["chen_sqrt"].get_ydata()) == pytest.approx([chen.overhead * 100] * 2)
    with pytest.raises(ValueError, match="2 plans for 3 budgets"):
        viz.plot_pareto({"x": [store, chen]}, budgets=front.budgets)

"""Coarsening: module-level graphs are valid, never under-state memory, and expand to valid plans."""

import pytest

from remat import models as zoo
from remat.api import capture_and_plan
from remat.solvers.coarsen import AUTO_MAX_NODES, coarsen_graph, group_nodes, resolve_level
from remat.errors import SolverError
from remat.solvers import solve


@pytest.fixture(scope="module")
def resnet_graph():
    ex = zoo.build("resnet", size="tiny")
    plan, _ = capture_and_plan(ex.model, *ex.args, budget=None, solver="store_all", cost_model="unit")
    return plan.graph


def test_groups_are_contiguous_and_cover_every_node(resnet_graph):
    g = resnet_graph
    for level in ("module", 2, 1):
        groups = group_nodes(g, level)
        assert [n for grp in groups for n in grp] == list(range(len(g.nodes)))
        assert all(len({g.nodes[n].phase for n in grp}) == 1 for grp in groups)
        assert len(groups) < len(g.nodes)
    assert len(group_nodes(g, 1)) < len(group_nodes(g, "module"))


@pytest.mark.parametrize("solver", ["store_all", "checkpoint_all", "chen_sqrt"])
def test_expanded_plan_is_valid_and_never_above_the_coarse_prediction(resnet_graph, solver):
    coarse = coarsen_graph(resnet_graph, "module")
    assert coarse.graph.store_all_seconds == pytest.approx(resnet_graph.store_all_seconds)
    coarse_plan = solve(solver, coarse.graph, None)
    plan = coarse.expand(coarse_plan)  # validated by the simulator on the op graph
    assert plan.peak_bytes <= coarse_plan.peak_bytes
    assert plan.compute_seconds == pytest.approx(coarse_plan.compute_seconds)


def test_checkmate_on_a_coarse_graph_fits_the_budget(resnet_graph):
    store = solve("store_all", resnet_graph, None).peak_bytes
    low = solve("checkpoint_all", resnet_graph, None).peak_bytes
    budget = (store + low) // 2
    plan = solve("checkmate", resnet_graph, budget, coarsen="module")
    assert "coarsened" in plan.info and plan.graph is resnet_graph
    assert plan.peak_bytes <= budget
    exact = solve("checkmate", resnet_graph, budget, coarsen=None)
    assert exact.compute_seconds <= plan.compute_seconds + 1e-9  # coarsening only restricts the plans


def test_auto_level(resnet_graph):
    assert resolve_level(resnet_graph, "auto") is None  # small enough already
    assert resolve_level(resnet_graph, None) is None
    assert resolve_level(resnet_graph, 2) == 2
    with pytest.raises(SolverError, match="coarsen"):
        resolve_level(resnet_graph, "layers")
    assert AUTO_MAX_NODES > len(resnet_graph.nodes)

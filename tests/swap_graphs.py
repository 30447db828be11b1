"""Hand-built graphs with transfer costs, shared by the swapping tests (hybrid, checkmate_swap)."""

from __future__ import annotations

import pytest

from remat.graph import Graph, GraphBuilder
from remat.solvers.planner import clear_caches


@pytest.fixture
def fresh_planner_caches():
    """The planner's caches emptied before and after a test (a module asks for it in ``pytestmark``)."""
    clear_caches()
    yield
    clear_caches()


# remat's CPU file store as measured here: every copy stalls compute
SYNCHRONOUS_COPIES = {"d2h_bytes_per_s": 1.8e9, "h2d_bytes_per_s": 1.6e9, "latency_s": 2.5e-4, "overlap": False}


def with_synchronous_copies(graph: Graph) -> Graph:
    """``graph`` with the transfer costs of ``SYNCHRONOUS_COPIES``."""
    return Graph(graph.nodes, graph.values, graph.forward_outputs, graph.backward_outputs, graph.name,
                 {**graph.meta, "transfer": dict(SYNCHRONOUS_COPIES)})


def transfer_chain(n: int, act: int = 100, cost: float = 1.0, bandwidth: float = 1000.0, overlap: bool = True,
                   pinned_forward: bool = False) -> Graph:
    """x -> f0 -> ... -> f{n-1} -> loss, each f_i's backward reading its input; copies take
    ``bytes / bandwidth`` seconds, beside compute (``overlap``) or synchronous.
    ``pinned_forward``: every forward node reads an input the step mutates (as batch norm does),
    so recomputation cannot run it again in the backward (only swapping can lower the peak)."""
    b = GraphBuilder("chain")
    hs = [b.input("x", 10)]
    for i in range(n):
        hs += b.op(f"f{i}", [hs[-1]], [act], cost=cost)
    (loss,) = b.op("loss", [hs[-1]], [4], cost=cost)
    (g,) = b.op("loss_bwd", [b.tangent("dloss", 4), hs[-1]], [act], phase="backward", cost=cost)
    for i in range(n - 1, -1, -1):
        (g,) = b.op(f"f{i}_bwd", [g, hs[i]] if i else [g], [act if i else 10], phase="backward", cost=2 * cost)
    meta = {"transfer": {"d2h_bytes_per_s": bandwidth, "h2d_bytes_per_s": bandwidth, "overlap": overlap}}
    graph = b.build(forward_outputs=[loss], backward_outputs=[g], meta=meta)
    if pinned_forward:
        meta["no_backward_recompute"] = [nd.id for nd in graph.forward_nodes]
        graph = Graph(graph.nodes, graph.values, graph.forward_outputs, graph.backward_outputs, graph.name, meta)
    return graph

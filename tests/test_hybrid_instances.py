"""The hybrid greedy's bookkeeping of saved activations (``solvers/hybrid_instances.py``) and of the
recomputations a keep or drop removes (``hybrid_prune.pruned_removal``), held against walks of the
whole schedule written here from their definitions, on the schedules of captured models."""

from __future__ import annotations

import random

import pytest

import remat
from remat import models as zoo
from remat.graph import ACTIVATION, FORWARD
from remat.solvers import solve
from remat.solvers.hybrid_instances import BackwardReads, ForwardUses, instances, instances_after_removal
from remat.solvers.hybrid_prune import pruned_removal

from .swap_graphs import fresh_planner_caches  # noqa: F401 (the fixture pytestmark names)


pytestmark = pytest.mark.usefixtures("fresh_planner_caches")


@pytest.fixture(scope="module", params=["gpt2", "vit"])
def graph(request):
    ex = zoo.build(request.param, size="tiny")
    return remat.plan(ex.model, *ex.args, solver="store_all", **ex.kwargs).graph


def _kept_to_the_end(graph) -> set[int]:
    return set(graph.forward_outputs) | set(graph.backward_outputs)


def _walked_instances(graph, fwd, bwd, kept) -> list:
    """Definition: walking forward then backward, the first backward read of each value the forward
    made, while that instance is still current (not made again in the backward); with the position
    of its last forward use; in the order the walk meets them."""
    nf, made, last, first = len(fwd), set(), {}, {}
    for pos, nid in enumerate(fwd + bwd):
        node = graph.nodes[nid]
        for v in node.inputs:
            if v in made:
                if pos < nf:
                    last[v] = pos
                else:
                    first.setdefault(v, pos)
        for v in node.outputs:
            if pos < nf:
                made.add(v)
                last[v] = pos
            else:
                made.discard(v)
    return [(v, (last[v], q)) for v, q in first.items() if graph.values[v].kind == ACTIVATION and v not in kept]


def _walked_removal(graph, nf, bwd, positions, kept) -> set[int]:
    """Definition: from the backward's end, a recomputation none of whose outputs is read later
    (before that output's next remaining computation) nor kept to the end is removed too."""
    removed, needed = set(positions), set()
    for k in range(len(bwd) - 1, -1, -1):
        if nf + k in removed:
            continue
        node = graph.nodes[bwd[k]]
        if node.phase == FORWARD and not any(v in needed or v in kept for v in node.outputs):
            removed.add(nf + k)
            continue
        needed.difference_update(node.outputs)
        needed.update(node.inputs)
    return removed


@pytest.mark.parametrize("schedule", ["store_all", "chen_sqrt", "checkpoint_all"])
def test_instances_and_their_order_are_a_walks(graph, schedule):
    fwd, bwd = (tuple(s) for s in solve(schedule, graph, None).schedule())
    kept = _kept_to_the_end(graph)
    got = instances(graph, ForwardUses(graph, fwd), len(fwd), bwd, kept)
    assert list(got.items()) == _walked_instances(graph, fwd, bwd, kept)
    assert bool(got) == (schedule != "checkpoint_all")  # (checkpointing everything saves no activation)


@pytest.mark.parametrize("schedule", ["chen_sqrt", "checkpoint_all"])
def test_a_removal_takes_out_what_a_walk_does_and_carries_the_instances(graph, schedule):
    """Random sets of recomputations removed (as keeps and drops do, several at once as alike ones
    are): the recomputations orphaned with them are a walk's, and the instances of the schedule left
    are those found anew, in the same order."""
    fwd, bwd = (tuple(s) for s in solve(schedule, graph, None).schedule())
    nf, kept, rng = len(fwd), _kept_to_the_end(graph), random.Random(0)
    forward = ForwardUses(graph, fwd)
    reads = BackwardReads(graph, forward, nf, bwd)
    old = instances(graph, forward, nf, bwd, kept)
    recomputations = [nf + k for k, nid in enumerate(bwd) if graph.nodes[nid].phase == FORWARD]
    assert len(recomputations) > 10
    cascades = 0
    for _ in range(60):
        positions = rng.sample(recomputations, rng.randint(1, 6))
        removed = pruned_removal(graph, nf, bwd, positions, reads, kept)
        assert removed == _walked_removal(graph, nf, bwd, positions, kept)
        cascades += len(removed) > len(positions)
        new_bwd = tuple(nid for k, nid in enumerate(bwd) if nf + k not in removed)
        carried = instances_after_removal(graph, forward, nf, bwd, old, reads, removed, kept, new_bwd)
        assert list(carried.items()) == _walked_instances(graph, fwd, new_bwd, kept)
    assert cascades  # some removals orphan the recomputations that fed them

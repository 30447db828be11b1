"""Lowering: what the forward and backward graphs of a plan contain."""

import torch

import remat
from remat import models as zoo
from remat.execute.lowering import BATCH_NORM_NO_STATS, lower
from remat.execute.runtime import replay_random, rng_state


def lowered(name, solver):
    ex = zoo.build(name, size="tiny")
    plan, cap = remat.capture_and_plan(ex.model, *ex.args, **ex.kwargs, solver=solver, cost_model="unit")
    fwd, bwd = lower(cap, plan)
    return plan, cap, fwd, bwd


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_store_all_needs_no_replays_and_saves_what_the_simulator_says():
    plan, cap, fwd, bwd = lowered("dropout_mlp", "store_all")
    assert replay_random not in targets(fwd) + targets(bwd)
    saved = [n for n in bwd.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    saved_activations = {n.name for n in saved if not n.name.startswith("primals")}
    assert saved_activations == {plan.graph.values[v].name for v in plan.saved_values}


def test_recomputed_dropout_is_replayed_from_its_saved_state():
    plan, cap, fwd, bwd = lowered("dropout_mlp", "checkpoint_all")
    assert targets(fwd).count(rng_state) == sum(1 for n in plan.graph.forward_nodes if n.random)
    assert replay_random in targets(bwd)
    states = [n for n in bwd.graph.nodes if n.op == "placeholder" and n.name.startswith("rng_state")]
    assert states, "the backward must receive the generator states of the dropouts it replays"


def test_batch_norm_recomputed_in_backward_leaves_running_stats_alone():
    plan, cap, fwd, bwd = lowered("cnn_bn", "checkpoint_all")
    assert BATCH_NORM_NO_STATS in targets(bwd)
    mutated = {plan.graph.values[v].name for v in plan.graph.meta["mutated_inputs"]}
    read_in_bwd = {n.name for n in bwd.graph.nodes if n.op == "placeholder"}
    assert not (mutated & read_in_bwd), "running statistics must not be read after the forward updated them"


def test_boxed_graphs_empty_their_argument_list():
    """The boxed convention lets every input die at its last use instead of living in the caller's list."""
    from remat.execute.runtime import boxed

    plan, cap, fwd, bwd = lowered("mlp", "store_all")
    gm = boxed(fwd)
    assert gm._boxed_call
    args = [torch.randn(p.meta["val"].shape) for p in gm.graph.nodes if p.op == "placeholder"]
    gm(args)
    assert args == []

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


class _TiedLM(torch.nn.Module):
    """An embedding whose weight is also the output head's: its gradient is the sum of two full-size
    parts, ``add(head part, embedding part)``."""

    def __init__(self, vocab=4096, width=64):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.mix = torch.nn.Linear(width, width)

    def forward(self, ids):
        h = torch.tanh(self.mix(self.embed(ids)))
        return torch.nn.functional.cross_entropy(h @ self.embed.weight.t(), ids.flatten())


def test_an_add_whose_input_dies_there_is_written_into_it():
    """The tied weight's gradient sum takes the storage of a part: one vocabulary-sized tensor less at
    the peak, the same gradients as eager PyTorch, measured peak equal to the prediction."""
    import copy
    import dataclasses

    from remat.measure import measure_step
    from remat.simulate import simulate

    torch.manual_seed(0)
    model, ids = _TiedLM(), torch.randint(0, 4096, (16,))  # few tokens: the weight sets the peak
    eager = copy.deepcopy(model)
    m = remat.optimize(model, ids, budget=None, cache=False)
    plan = m.plan
    assert plan.simulation.reused and plan.graph.meta["inplace_eager"]
    weight_bytes = 4096 * 64 * 4
    out_of_place = dataclasses.replace(plan.graph, meta={k: v for k, v in plan.graph.meta.items()
                                                         if k not in ("inplace_reuse", "inplace_eager")})
    before = simulate(out_of_place, plan.instructions, plan.boundary).peak_bytes
    assert plan.peak_bytes <= before - 0.99 * weight_bytes
    m(ids).backward()
    eager(ids).backward()
    for a, b in zip(model.parameters(), eager.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=1e-7)
    measured = measure_step(lambda: m(ids).backward(), setup=lambda: model.zero_grad(set_to_none=True))
    assert measured.peak_bytes == plan.peak_bytes

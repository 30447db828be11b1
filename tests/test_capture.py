"""The Graph that capture builds from a real joint graph."""

import pytest
import torch

import remat
from remat import models as zoo
from remat.graph import ACTIVATION, BACKWARD, FORWARD, INPUT, TANGENT


def captured(name="gpt2", size="tiny", **kw):
    ex = zoo.build(name, size=size)
    plan, capture = remat.capture_and_plan(ex.model, *ex.args, **ex.kwargs, solver="store_all", **kw)
    return ex, plan, capture


def test_views_are_folded_and_sizes_exact():
    _ex, plan, cap = captured("inplace_views")
    g = plan.graph
    assert not any(n.op.split(".")[1] in ("view", "t", "transpose", "permute", "expand", "detach")
                   for n in g.nodes if n.op.startswith("aten."))
    assert cap.alias_base, "the model has views: they must be recorded as aliases"
    for v in g.values:
        if v.kind == ACTIVATION and v.shape:
            fx_val = cap.value_node[v.id].meta["val"]
            assert v.bytes == fx_val.untyped_storage().nbytes()


def test_phases_inputs_tangents_outputs():
    _ex, plan, _cap = captured("two_outputs")
    g = plan.graph
    assert g.forward_nodes and g.backward_nodes
    assert all(n.phase in (FORWARD, BACKWARD) for n in g.nodes)
    assert len(g.tangents) == 2  # one per differentiable output
    assert all(g.values[t].kind == TANGENT for t in g.tangents)
    assert len(g.forward_outputs) == 2
    tangents = set(g.tangents)
    assert tangents <= set(g.backward_outputs), "autograd holds the tangents until the backward returns"
    assert all(g.values[v].kind == ACTIVATION for v in g.backward_outputs if v not in tangents)  # parameter gradients
    params = sum(1 for _ in _ex.model.parameters())
    assert sum(1 for v in g.values if v.kind == INPUT) >= params


def test_random_ops_and_mutated_buffers_are_flagged():
    _ex, plan, _cap = captured("dropout_mlp")
    assert any(n.random and "dropout" in n.op for n in plan.graph.nodes)
    _ex, plan, _cap = captured("cnn_bn")
    assert plan.graph.meta["mutated_inputs"], "BatchNorm running statistics are mutated inputs"


def test_structural_hash_is_stable_and_shape_sensitive():
    a = captured("mlp")[1].graph.structural_hash
    b = captured("mlp")[1].graph.structural_hash
    ex = zoo.build("mlp", size="tiny")
    x2 = torch.cat([ex.args[0], ex.args[0]])
    c = remat.plan(ex.model, x2, solver="store_all").graph.structural_hash
    assert a == b != c


def test_costs_and_workspace_come_from_the_cost_models():
    _ex, plan, _cap = captured("cnn_bn", size="small")
    g = plan.graph
    assert all(n.cost >= 0 for n in g.nodes) and g.store_all_seconds > 0
    conv = [n for n in g.nodes if "convolution" in n.op]
    assert conv and all(n.cost > 0 for n in conv)
    assert any(n.workspace > 0 for n in conv), "CPU convolutions need column buffers"
    _ex, unit, _cap = captured("cnn_bn", size="small", cost_model="unit", workspace="none")
    assert all(n.cost == 1.0 and n.workspace == 0 for n in unit.graph.nodes)


def test_sizes_are_what_the_devices_allocator_counts():
    """CUDA's caching allocator rounds every block up to 512 bytes, so a graph of small CUDA tensors
    would be measured above its prediction by up to 511 bytes per live value; the CPU's is exact."""
    from remat.capture import allocated_bytes

    assert allocated_bytes(1, "cuda") == 512 and allocated_bytes(513, torch.device("cuda", 1)) == 1024
    assert allocated_bytes(1024, "cuda") == 1024 and allocated_bytes(0, "cuda") == 0
    assert allocated_bytes(513, "cpu") == 513 and allocated_bytes(513, None) == 513


def test_a_recurrent_module_is_named_with_what_to_do_instead():
    """nn.LSTM cannot be captured in one graph (Dynamo refuses it): the error names the module and
    points to the cell modules, which plan like any layer, not to rewriting control flow."""
    import remat

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.LSTM(8, 16, batch_first=True)
            self.head = torch.nn.Linear(16, 2)

        def forward(self, x):
            y, _ = self.encoder(x)
            return self.head(y[:, -1]).sum()

    with pytest.raises(remat.CaptureError, match=r"recurrent modules \(encoder\).*nn\.LSTMCell") as err:
        remat.optimize(Tagger(), torch.randn(4, 10, 8))
    assert "control flow" not in str(err.value)

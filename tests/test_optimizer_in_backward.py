"""The optimizer step inside the backward: exact updates, gradients no longer held, refusals."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import remat
from remat.budget import fixed_bytes
from remat.errors import InvalidPlanError
from remat.execute.optimizer import OptimizerInBackwardError
from remat.graph import BACKWARD, GraphBuilder
from remat.measure import measure_step
from remat.models import build
from remat.simulate import COMPUTE, FREE, Instruction, simulate

MiB = 2**20


def _largest_difference(a: nn.Module, b: nn.Module) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a.parameters(), b.parameters()))


def test_adamw_inside_the_backward_updates_like_eager_over_batches_of_many_lengths():
    """GPT-2 (dropout on) under a budget that recomputes, four batches of four lengths (size buckets):
    every parameter bitwise equal to eager PyTorch's after ``loss.backward(); opt.step()``."""
    ex = build("gpt2", size="tiny")
    model, eager = ex.model, copy.deepcopy(ex.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-3, weight_decay=0.1)
    m = remat.optimize(model, *ex.args, budget="2.5MiB", optimizer=opt, cache=False, **ex.kwargs)
    assert m.plan.recomputations > 0
    g = torch.Generator().manual_seed(1)
    for step, length in enumerate([32, 20, 45, 17]):
        ids = torch.randint(0, 1000, (2, length), generator=g)
        torch.manual_seed(step)  # the same dropout masks in both
        m(input_ids=ids, labels=ids).backward()
        assert all(p.grad is None for p in model.parameters())
        torch.manual_seed(step)
        eager(input_ids=ids, labels=ids).backward()
        eager_opt.step()
        eager_opt.zero_grad()
        assert _largest_difference(model, eager) == 0.0
    assert len(m.plans) >= 3  # the first shape, then a plan per size bucket met
    assert all(int(state["step"]) == 4 for state in opt.state.values())


class Wide(nn.Module):
    """Wide layers, a small batch: the gradients are most of the step's memory."""

    def __init__(self, width=512, depth=4):
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth)])

    def forward(self, x):
        return self.layers(x).square().mean()


@pytest.mark.parametrize("make_opt", [lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                                      lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True)], ids=["sgd", "fused-adam"])
def test_gradients_are_no_longer_held_and_measured_peak_equals_prediction(make_opt):
    torch.manual_seed(0)
    small, large = torch.randn(16, 512), torch.randn(256, 512)
    model = Wide()
    reference = copy.deepcopy(model)
    grads = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = make_opt(model.parameters())
    m = remat.optimize(model, small, budget=None, optimizer=opt, cache=False)
    plain = remat.optimize(reference, small, budget=None, cache=False)
    assert fixed_bytes(plain.plan.graph) >= grads and fixed_bytes(m.plan.graph) < MiB // 64
    # a small batch peaks at the end, holding every gradient; inside the backward, one layer's at most
    assert m.plan.peak_bytes <= plain.plan.peak_bytes - grads * 0.7
    recomputing = remat.optimize(model, large, budget=0.75, solver="keep_set", optimizer=opt, cache=False)
    assert recomputing.plan.recomputations > 0
    for wrapped, x in ((m, small), (recomputing, large)):
        measured = measure_step(lambda: wrapped(x).backward(), warmup=2, repeats=2)  # first step: optimizer state
        assert abs(measured.peak_bytes - wrapped.plan.peak_bytes) <= max(0.05 * wrapped.plan.peak_bytes, MiB // 8)
        assert all(p.grad is None for p in model.parameters())


def test_parameters_outside_the_optimizer_keep_their_gradients():
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model[2].parameters(), lr=0.5)  # the last layer only
    m = remat.optimize(model, x, budget=None, optimizer=opt, cache=False)
    m(x).sum().backward()
    reference(x).sum().backward()
    assert model[2].weight.grad is None
    assert torch.equal(model[0].weight.grad, reference[0].weight.grad)
    assert torch.equal(model[2].weight, reference[2].weight - 0.5 * reference[2].weight.grad)


def test_what_cannot_combine_with_it_is_refused():
    torch.manual_seed(0)
    x = torch.randn(8, 64)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters())
    m = remat.optimize(model, x, budget=None, optimizer=opt, cache=False)
    m(x).sum().backward()
    with pytest.raises(OptimizerInBackwardError, match="Remove opt.step"):  # a loop that steps, clips or accumulates
        opt.step()
    model[0].weight.grad = torch.zeros_like(model[0].weight)  # a gradient accumulated by another backward
    with pytest.raises(OptimizerInBackwardError, match="accumulated"):
        m(x).sum().backward()
    with pytest.raises(OptimizerInBackwardError, match="closure"):
        remat.optimize(model, x, optimizer=torch.optim.LBFGS(model.parameters()))
    with pytest.raises(OptimizerInBackwardError, match="eager"):
        remat.optimize(model, x, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), compiler="inductor")


def test_the_simulator_refuses_a_read_of_a_parameter_after_its_update():
    """forward ``h = x @ w``; backward: ``dw``, the update of ``w``, then a recomputation of ``h``."""
    b = GraphBuilder("update")
    w, x = b.input("w", 64), b.input("x", 64)
    (h,) = b.op("h", [x, w], [64])
    (dh,) = b.op("dh", [h], [64], phase=BACKWARD)
    (dw,) = b.op("dw", [dh, x], [64], phase=BACKWARD)
    (token,) = b.op("update_w", [dw], [0], phase=BACKWARD)
    (again,) = b.op("uses_h", [h], [64], phase=BACKWARD)
    graph = b.build([], [token, again], meta={"optimizer_updates": [[3, w]]})
    fine = [Instruction(COMPUTE, 0), Instruction(COMPUTE, 1), Instruction(COMPUTE, 2), Instruction(FREE, dh),
            Instruction(COMPUTE, 4), Instruction(COMPUTE, 3), Instruction(FREE, dw), Instruction(FREE, h)]
    simulate(graph, fine, 1)
    late = [Instruction(COMPUTE, 0), Instruction(COMPUTE, 1), Instruction(FREE, h), Instruction(COMPUTE, 2),
            Instruction(FREE, dh), Instruction(COMPUTE, 3), Instruction(FREE, dw), Instruction(COMPUTE, 0),
            Instruction(COMPUTE, 4), Instruction(FREE, h)]
    with pytest.raises(InvalidPlanError, match="updated already"):
        simulate(graph, late, 1)
    twice = fine[:6] + [Instruction(FREE, token), Instruction(COMPUTE, 3)]
    with pytest.raises(InvalidPlanError, match="second time"):
        simulate(graph, twice, 1)


def test_batch_norm_running_statistics_and_updates_match_eager():
    """The rewrite keeps what the joint graph says about mutated inputs (BatchNorm's statistics)."""
    from .test_split_batch import ConvBN

    torch.manual_seed(0)
    model = ConvBN()
    eager = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    x, target = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    m = remat.optimize(model, x, target, budget=0.9, solver="keep_set", optimizer=opt, cache=False)
    assert m.plan.recomputations > 0 and m.plan.graph.meta["mutated_inputs"]
    for _ in range(3):
        m(x, target).backward()
        eager(x, target).backward()
        eager_opt.step()
        eager_opt.zero_grad()
    assert _largest_difference(model, eager) < 1e-5
    for a, b in zip(model.buffers(), eager.buffers()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6)

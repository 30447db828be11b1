"""Models that broke early versions: each must run under every solver with eager's results."""

import copy

import pytest
import torch
import torch.nn as nn

import remat

SOLVERS = ["store_all", "chen_sqrt", "checkpoint_all"]


class GradIsTangent(nn.Module):
    """p's gradient is the output's gradient itself (no op computes it)."""

    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.randn(4, 8))
        self.w = nn.Parameter(torch.randn(4, 8))

    def forward(self, x):
        return self.p + x * self.w


class RandomWithDevice(nn.Module):
    """A random op with its own device= argument, recomputed in the backward."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return (self.lin(x) * torch.randn(4, 8)).sin()


class TensorConstant(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.lin(x) * torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 8]))


class OutputIsViewOfInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).relu() + x.t().t()


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("cls", [GradIsTangent, RandomWithDevice, TensorConstant, OutputIsViewOfInput])
def test_matches_eager(cls, solver):
    torch.manual_seed(0)
    model, x = cls(), torch.randn(4, 8)
    ref = copy.deepcopy(model)
    module = remat.optimize(model, x, solver=solver, cost_model="unit")
    torch.manual_seed(3)
    got = module(x)
    got.sum().backward()
    torch.manual_seed(3)
    want = ref(x)
    want.sum().backward()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_non_persistent_buffers_and_deepcopy():
    model = nn.Sequential(nn.Linear(8, 8))
    model.register_buffer("scratch", torch.ones(1), persistent=False)
    module = remat.optimize(model, torch.randn(4, 8))
    assert list(module.state_dict()) == list(model.state_dict())
    copy.deepcopy(module)


def test_many_input_shapes():
    module = remat.optimize(nn.Linear(8, 8), torch.randn(2, 8), cost_model="unit")
    for batch in range(3, 14):
        module(torch.randn(batch, 8)).sum().backward()
    assert module.plan is not None


def test_named_solver_reports_its_own_minimum():
    model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(64, 64), nn.Tanh())])
    x = torch.randn(256, 64)
    with pytest.raises(remat.InfeasibleBudgetError) as info:
        remat.optimize(model, x, solver="store_all", budget=0.8)
    module = remat.optimize(model, x, solver="store_all", budget=info.value.min_budget_bytes)
    assert module.plan.peak_bytes <= info.value.min_budget_bytes


def test_capture_run_leaves_example_inputs_alone():
    class Mutates(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            x.mul_(2)
            return self.lin(x)

    x = torch.randn(4, 8)
    before = x.clone()
    remat.optimize(Mutates(), x, cost_model="unit")
    assert torch.equal(x, before)


def test_frozen_model_is_a_clear_error():
    model = nn.Linear(8, 8).requires_grad_(False)
    with pytest.raises(remat.CaptureError, match="requires_grad"):
        remat.optimize(model, torch.randn(4, 8))

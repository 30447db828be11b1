"""A saved plan run on a model: checked on the captured graph at its first use (issue 31, item 9).

``Plan.load(path)`` without a graph used to check nothing about the model it was later run with;
``remat.optimize(model, x, plan=path)`` and ``torch.compile(..., options={"plan": ...})`` now check
the live graph's structural hash and re-simulate the plan on it before any step runs.
"""

from __future__ import annotations

import copy

import pytest
import torch

import remat
from remat.errors import InvalidPlanError
from remat.models.small import MLP
from remat.plan import Plan, PlanGraphMismatchError


def _model():
    torch.manual_seed(0)
    return MLP(16, 32, 6, 4)


def _grads(model, x):
    model.zero_grad(set_to_none=True)
    model(x).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.fixture
def saved(tmp_path):
    model = _model()
    plan = remat.plan(model, torch.randn(256, 16), budget=0.8, solver="chen_sqrt", cache=False)
    assert plan.overhead > 0  # the plan recomputes: running it is not running store_all
    path = tmp_path / "plan.json"
    plan.save(path)
    return plan, path


def test_a_loaded_plan_runs_on_its_model_with_its_gradients(saved):
    plan, path = saved
    model, x = _model(), torch.randn(256, 16)
    eager = _grads(copy.deepcopy(model), x)
    m = remat.optimize(model, x, plan=str(path), cache=False)
    assert m.plan.instructions == plan.instructions and m.plan.peak_bytes == plan.peak_bytes
    assert m.plan.info.get("given")
    for a, b in zip(_grads(m, x), eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_loaded_plan_is_refused_on_another_shape_before_anything_runs(saved):
    _plan, path = saved
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(PlanGraphMismatchError, match="another graph"):
        remat.optimize(model, torch.randn(384, 16), plan=str(path), cache=False)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_a_loaded_plan_is_refused_on_another_model_through_torch_compile(saved):
    _plan, path = saved
    model = MLP(16, 32, 5, 4)  # one layer fewer
    compiled = torch.compile(model, backend="remat", options={"plan": Plan.load(path)}, dynamic=False)
    with pytest.raises(PlanGraphMismatchError):
        compiled(torch.randn(256, 16)).sum().backward()


def test_a_plan_above_the_budget_it_is_given_with_is_refused(saved):
    plan, path = saved
    with pytest.raises(InvalidPlanError, match="above the budget"):
        remat.optimize(_model(), torch.randn(256, 16), plan=path, budget=plan.peak_bytes - 1, cache=False)
    m = remat.optimize(_model(), torch.randn(256, 16), plan=path, budget=plan.peak_bytes, cache=False)
    assert m.plan.peak_bytes == plan.peak_bytes


def test_lowering_refuses_a_plan_for_another_graph():
    from remat.api import capture_and_plan
    from remat.execute.lowering import lower

    _plan, capture = capture_and_plan(_model(), torch.randn(256, 16), cache=False)
    other = remat.plan(_model(), torch.randn(128, 16), cache=False)
    with pytest.raises(PlanGraphMismatchError):
        lower(capture, other)


def test_a_saved_plan_that_offloads_runs_when_loaded(tmp_path):
    """``remat plan ... --save`` then ``optimize(plan=path)`` (the README's workflow): a ``hybrid`` plan
    offloads, so the loading capture measures the offload tier too (it used to have no transfer costs,
    and the saved plan was refused as invalid on its own graph)."""
    model, x = _model(), torch.randn(256, 16)
    # unit costs: every op as slow as a copy, so the smallest plan swaps (measured costs here recompute)
    plan = remat.plan(model, x, budget="min", solver="hybrid", cost_model="unit", cache=False, time_limit=5)
    assert plan.offloaded_values  # the premise: the plan swaps
    path = tmp_path / "hybrid.json"
    plan.save(path)
    eager = _grads(copy.deepcopy(model), x)
    m = remat.optimize(model, x, plan=str(path), cache=False)
    assert m.plan.instructions == plan.instructions and m.plan.info.get("given")
    for a, b in zip(_grads(m, x), eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)

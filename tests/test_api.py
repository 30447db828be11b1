"""The public API: budgets, solver choice, the torch.compile backend, and the errors users see."""

import warnings

import pytest
import torch
import torch.nn as nn

import remat
from remat import models as zoo
from remat.budget import BudgetError, parse_size, resolve_budget

from .models.helpers import assert_bitwise, run_step


def test_parse_size():
    assert parse_size("1.5GiB") == 3 * 2**29
    assert parse_size("800MB") == 800 * 10**6
    assert parse_size("512 KiB") == 512 * 1024
    assert parse_size("1e9") == 10**9
    with pytest.raises(BudgetError, match="'lots'"):
        parse_size("lots")


def test_budget_types_decide_units():
    # store-everything peak 1000, of which 200 no plan changes (see test_budget.py)
    assert resolve_budget(1, 1000, 200) == 1  # an int is bytes: one byte
    assert resolve_budget(1.0, 1000, 200) == 1000  # a float is a fraction of what a plan can change
    assert resolve_budget(0.25, 1000, 200) == 400
    assert resolve_budget("2KiB", 1000, 200) == 2048
    assert resolve_budget(None, 1000, 200) is None
    for bad in (1.5, 0.0, -3, True, [1]):
        with pytest.raises(BudgetError):
            resolve_budget(bad, 1000, 200)


def test_auto_picks_cheapest_plan_that_fits():
    ex = zoo.build("mlp", size="tiny")
    everything = remat.plan(ex.model, *ex.args, budget=1.0)
    assert everything.solver == "store_all" and everything.overhead == pytest.approx(0.0)
    store = remat.plan(ex.model, *ex.args, solver="store_all")
    chen = remat.plan(ex.model, *ex.args, solver="chen_sqrt")
    between = remat.plan(ex.model, *ex.args, budget=(chen.peak_bytes + store.peak_bytes) // 2)
    assert between.peak_bytes <= between.budget_bytes
    assert between.compute_seconds <= chen.compute_seconds + 1e-12


@pytest.mark.filterwarnings("ignore::remat.errors.SolverTimeLimitWarning")  # the MILP stops at 1 s
def test_infeasible_budget_names_the_minimum():
    ex = zoo.build("cnn_bn", size="tiny")
    with pytest.raises(remat.InfeasibleBudgetError) as info:
        remat.optimize(ex.model, *ex.args, budget=1, time_limit=1)
    err = info.value
    assert err.budget_bytes == 1
    assert err.min_budget_bytes > 1
    assert 0 < err.min_budget_fraction <= 1
    assert str(err.min_budget_bytes) in str(err) and "Raise the budget" in str(err)
    assert f"{err.min_budget_fraction:.4f}" in str(err) and "budget='min'" in str(err)
    # the minimum it names is feasible, in bytes, as a fraction, and as "min"
    module = remat.optimize(ex.model, *ex.args, budget=err.min_budget_bytes, time_limit=1)
    assert module.plan.peak_bytes <= err.min_budget_bytes
    module = remat.optimize(ex.model, *ex.args, budget=err.min_budget_fraction, time_limit=1)
    assert module.plan.peak_bytes <= module.plan.budget_bytes
    smallest = remat.optimize(ex.model, *ex.args, budget="min", time_limit=1)
    assert smallest.plan.peak_bytes <= smallest.plan.budget_bytes <= err.min_budget_bytes


def test_a_step_with_little_to_free_is_refused_saying_why_and_what_helps():
    """A small model at a small batch: its gradients are nearly its whole peak, so no fraction below about
    1 plans. The refusal says so, and names what helps (a larger batch, the optimizer inside the backward);
    a refusal with room to free says nothing of it."""
    from remat.errors import LITTLE_TO_FREE, InfeasibleBudgetError

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10))
    with pytest.raises(remat.InfeasibleBudgetError) as info:
        remat.optimize(model, torch.randn(64, 256), budget=0.5, cache=False)
    err = info.value
    assert err.min_budget_fraction >= LITTLE_TO_FREE
    assert "Little of this step can be freed" in str(err) and "optimizer=opt" in str(err) and "larger batch" in str(err)
    assert "Little" not in str(InfeasibleBudgetError(100, 200, min_budget_fraction=0.5))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        if h.sum().item() > 0:  # data-dependent control flow: Dynamo cannot keep one graph
            return h.relu().sum()
        return h.sum()


class TensorIf(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:  # a Python branch on a tensor's value
            h = h * 2
        return h.sum()


@pytest.mark.parametrize("model, source", [(Branchy, "if h.sum().item() > 0:"), (TensorIf, "if h.sum() > 0:")])
def test_capture_error_names_the_users_file_line_and_source(model, source):
    with pytest.raises(remat.CaptureError) as info:
        remat.optimize(model(), torch.randn(4, 8))
    err, msg = info.value, str(info.value)
    lineno = next(i for i, text in enumerate(open(__file__), 1) if text.strip().startswith(source))
    assert (err.filename, err.lineno) == (__file__, lineno) and err.line.startswith(source)
    assert "one graph" in msg and f"{__file__}, line {lineno}: `{source}" in msg
    assert "torch.where" in msg  # what to do


def test_remat_errors_through_torch_compile_are_remats_own():
    ex = zoo.build("mlp", size="tiny")
    compiled = torch.compile(ex.model, backend="remat", dynamic=False, options={"budget": 10})
    with pytest.raises(remat.InfeasibleBudgetError) as info:
        ex.loss(compiled(*ex.args, **ex.kwargs)).backward()
    err = info.value
    assert not isinstance(err, torch._dynamo.exc.BackendCompilerFailed)
    assert type(err).__name__ == "InfeasibleBudgetError" and type(err).__module__ == "remat.errors"
    assert str(err).startswith("no plan fits a budget of 10 B") and "TORCHDYNAMO" not in str(err)
    assert err.budget_bytes == 10 and err.min_budget_bytes > 10


def test_eval_mode_warns_that_the_eval_step_is_planned():
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 1)).eval()
    x = torch.randn(4, 8)
    with pytest.warns(remat.NotTrainingWarning, match="eval mode.*model.train()") as record:
        remat.optimize(model, x)
    assert record[0].filename == __file__  # points at the user's call
    with pytest.warns(remat.NotTrainingWarning, match="eval mode"):
        remat.plan(model, x)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", remat.NotTrainingWarning)
        remat.optimize(model, x)


def test_optimize_without_gradients_warns_and_still_plans_the_training_step():
    model, x = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1)), torch.randn(4, 8)
    for context in (torch.no_grad, torch.inference_mode):
        with context(), pytest.warns(remat.NotTrainingWarning, match="gradients disabled"):
            module = remat.optimize(model, x)
        assert module.plan is not None and module.plan.graph.backward_nodes
    with torch.no_grad(), warnings.catch_warnings():  # plan() runs nothing: planning without gradients is fine
        warnings.simplefilter("error", remat.NotTrainingWarning)
        assert remat.plan(model, x).graph.backward_nodes


def test_unknown_solver_is_a_clear_error():
    ex = zoo.build("mlp", size="tiny")
    with pytest.raises(remat.SolverError, match="unknown solver 'magic'.*chen_sqrt"):
        remat.plan(ex.model, *ex.args, solver="magic")


def test_registered_backend_runs_the_plan():
    ex = zoo.build("cnn_bn", size="tiny")
    ref = run_step(ex, remat.optimize(ex.model, *ex.args, solver="chen_sqrt"))
    ex2 = zoo.build("cnn_bn", size="tiny")
    compiled = torch.compile(ex2.model, backend="remat", dynamic=False, options={"budget": 1.0, "solver": "chen_sqrt"})
    got = run_step(ex2, compiled)
    got.grads = {k.removeprefix("_orig_mod."): v for k, v in got.grads.items()}
    got.buffers = {k.removeprefix("_orig_mod."): v for k, v in got.buffers.items()}
    assert_bitwise(got, ref)


def test_plan_runs_nothing():
    ex = zoo.build("cnn_bn", size="tiny")
    before = {k: v.clone() for k, v in ex.model.state_dict().items()}
    state = torch.get_rng_state()
    plan = remat.plan(ex.model, *ex.args, budget=0.95)
    assert plan.peak_bytes <= plan.budget_bytes
    assert all(torch.equal(before[k], v) for k, v in ex.model.state_dict().items())
    assert torch.equal(state, torch.get_rng_state())
    assert all(p.grad is None for p in ex.model.parameters())


def test_optimize_leaves_buffers_and_rng_untouched():
    ex = zoo.build("cnn_bn", size="tiny")
    before = {k: v.clone() for k, v in ex.model.state_dict().items()}
    state = torch.get_rng_state()
    remat.optimize(ex.model, *ex.args, budget=0.95)
    assert all(torch.equal(before[k], v) for k, v in ex.model.state_dict().items())
    assert torch.equal(state, torch.get_rng_state())


def test_eval_and_no_grad_use_the_original_model():
    ex = zoo.build("cnn_bn", size="tiny")
    module = remat.optimize(ex.model, *ex.args, solver="chen_sqrt")
    module.eval()
    assert not ex.model.training
    with torch.no_grad():
        torch.testing.assert_close(module(*ex.args), ex.model(*ex.args))
    module.train()
    assert ex.model.training


def test_plan_summary_mentions_what_matters():
    ex = zoo.build("mlp", size="tiny")
    text = remat.plan(ex.model, *ex.args, budget=1.0).summary()
    for word in ("predicted peak", "budget", "overhead", "solve time"):
        assert word in text


class _RaisesOnBatchOfThree(nn.Module):
    """A model whose forward raises the user's own exception for some inputs."""

    class NotThree(ValueError):
        pass

    def __init__(self, error):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.error = error

    def forward(self, x):
        y = self.lin(x)
        if x.shape[0] == 3:
            raise self.error("a batch of 3 is not allowed")
        return y.sum()


@pytest.mark.parametrize("error", [RuntimeError, _RaisesOnBatchOfThree.NotThree])
def test_the_users_own_exception_reaches_them_unchanged(error):
    """An exception the model's forward raises is the user's (type, message), as with plain PyTorch,
    not a CaptureError advising to rewrite the line: at optimize, at a later shape, and in remat.plan."""
    model = _RaisesOnBatchOfThree(error)
    with pytest.raises(error, match="a batch of 3 is not allowed") as caught:
        remat.optimize(model, torch.randn(3, 8))
    assert not isinstance(caught.value, remat.CaptureError) and "run by remat" in str(caught.value.__notes__)
    with pytest.raises(error, match="a batch of 3"):
        remat.plan(model, torch.randn(3, 8), solver="store_all")
    m = remat.optimize(model, torch.randn(4, 8), solver="store_all")
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(error, match="a batch of 3"):
        m(torch.randn(3, 8))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    m(torch.randn(4, 8)).backward()  # still usable
    assert model.lin.weight.grad is not None


def test_a_model_on_the_meta_device_is_a_capture_error_that_says_what_to_do():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    for call in (lambda: remat.optimize(model, torch.randn(4, 8), budget=0.5),
                 lambda: remat.plan(model, torch.randn(4, 8), budget=0.5),
                 lambda: remat.compile(model, budget=0.5)):
        with pytest.raises(remat.CaptureError, match=r"meta device.*to_empty"):
            call()
    real = nn.Linear(8, 2)
    with pytest.raises(remat.CaptureError, match="the example inputs are on the meta device"):
        remat.optimize(real, torch.randn(4, 8, device="meta"))

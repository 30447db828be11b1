"""Measured peak memory of planned steps agrees with the simulator, on models with >= 20 MiB
of activations; checkpoint_all really lowers the measured peak.

The step keeps the model's output alive until the backward ends, as a training loop that
writes ``out = model(x); loss = f(out); loss.backward()`` does: that is what the budget
assumes (forward outputs belong to the caller until the step ends).
"""

import pytest
import torch

import remat
from remat import zoo
from remat.measure import measure_step

MiB = 2**20
MODELS = ["mlp", "cnn_bn", "dropout_mlp", "inplace_views", "tied", "two_outputs", "resnet", "gpt2"]
SOLVERS = ["store_all", "chen_sqrt", "checkpoint_all"]


def measured_peak(ex: zoo.Example, module) -> int:
    def step():
        out = module(*ex.args, **ex.kwargs)
        ex.loss(out).backward()

    return measure_step(step, setup=lambda: ex.model.zero_grad(set_to_none=True), warmup=1, repeats=1).peak_bytes


def agrees(measured: int, predicted: int) -> bool:
    return abs(measured - predicted) <= max(0.05 * predicted, 2 * MiB)


@pytest.mark.parametrize("name", MODELS)
def test_measured_peak_matches_simulation(name):
    ex = zoo.build(name, size="small")
    peaks = {}
    for solver in SOLVERS:
        module = remat.optimize(ex.model, *ex.args, **ex.kwargs, solver=solver)
        predicted = module.plan.peak_bytes
        measured = measured_peak(ex, module)
        peaks[solver] = measured
        assert agrees(measured, predicted), (
            f"{name}/{solver}: measured {measured / MiB:.2f} MiB, predicted {predicted / MiB:.2f} MiB"
        )
        if solver == "store_all":
            assert predicted >= 20 * MiB, "memory tests need tens of MiB to be meaningful"
    # every test model has more than one layer: recomputing everything must lower the peak
    assert peaks["checkpoint_all"] < 0.8 * peaks["store_all"], {k: v / MiB for k, v in peaks.items()}


def test_budget_is_respected_when_measured():
    ex = zoo.build("gpt2", size="small")
    store = remat.plan(ex.model, *ex.args, **ex.kwargs, solver="store_all")
    budget = int(0.7 * store.peak_bytes)
    module = remat.optimize(ex.model, *ex.args, **ex.kwargs, budget=budget)
    assert module.plan.peak_bytes <= budget
    measured = measured_peak(ex, module)
    assert measured <= budget + 2 * MiB, f"measured {measured / MiB:.1f} MiB over a {budget / MiB:.1f} MiB budget"
    torch.testing.assert_close(torch.tensor(measured / module.plan.peak_bytes), torch.tensor(1.0), atol=0.05, rtol=0)

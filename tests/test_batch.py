"""remat.max_batch_size: measured search over the batch size, OOM handling, limits below batch 1."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn as nn

import remat
from remat.tools.max_batch import BatchSearchError, _is_oom, _search
from remat.errors import InfeasibleBudgetError
from remat.measure import peak_memory_growth

D = 64


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(D, D), nn.Tanh()) for _ in range(6)], nn.Linear(D, 1))


def make_batch(n: int) -> torch.Tensor:
    return torch.randn(n, D)


def fixed_bytes(model: nn.Module, x: torch.Tensor) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters()) + x.numel() * x.element_size()


def measured_total(n: int, limit: int, solver: str | None) -> int | None:
    """The test's own measurement: total bytes of a step at batch n (None: no plan fits)."""
    model, x = make_model(), make_batch(n)
    fixed = fixed_bytes(model, x)
    if solver is None:
        runner = model
    else:
        try:
            runner = remat.optimize(model, x, budget=limit - fixed, solver=solver)
        except InfeasibleBudgetError:
            return None

    def step():
        runner(x).sum().backward()

    step()
    model.zero_grad(set_to_none=True)
    peak, _ = peak_memory_growth(step, "cpu")
    return fixed + peak


LIMIT = 300_000  # plain PyTorch fits ~86 samples, remat ~110


def test_largest_batch_fits_and_next_does_not():
    seen = []
    result = remat.max_batch_size(make_model, make_batch, LIMIT, solver="chen_sqrt", start=32,
                                  on_try=seen.append)
    assert seen == result.tries and seen
    assert {t.method for t in result.tries} == {"remat", "plain"}
    b, p = result.batch_size, result.plain_batch_size
    assert b >= 1 and p >= 1
    assert result.plan is not None and result.plan.solver == "chen_sqrt"
    # measured independently: the batch found fits, the next one does not
    for n, solver in ((b, "chen_sqrt"), (p, None)):
        total = measured_total(n, LIMIT, solver)
        assert total is not None and total <= LIMIT, (n, solver, total)
        after = measured_total(n + 1, LIMIT, solver)
        assert after is None or after > LIMIT, (n + 1, solver, after)
    assert b >= p  # remat never fits less: its plans include store_all
    best = next(t for t in result.tries if t.method == "remat" and t.batch == b)
    assert best.fits and best.measured_bytes <= LIMIT and best.predicted_bytes is not None
    assert "remat" in result.summary() and "plain" in result.summary()


def test_out_of_memory_counts_as_does_not_fit_and_process_stays_usable():
    def oom_batch(n: int) -> torch.Tensor:
        if n >= 6:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
        return make_batch(n)

    result = remat.max_batch_size(make_model, oom_batch, "1GiB", solver="chen_sqrt")
    assert result.batch_size == 5 and result.plain_batch_size == 5
    oom = [t for t in result.tries if not t.fits]
    assert oom and all(t.reason.startswith("out of memory") and t.measured_bytes is None for t in oom)
    # the next training step works
    model = make_model()
    remat.optimize(model, make_batch(4), solver="chen_sqrt")(make_batch(4)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_out_of_memory_is_recognised_through_wrappers():
    inner = torch.OutOfMemoryError("CUDA out of memory")
    try:
        try:
            raise inner
        except Exception as e:
            raise RuntimeError("backend compiler failed") from e
    except RuntimeError as wrapped:
        assert _is_oom(wrapped)
    assert _is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"))
    assert not _is_oom(RuntimeError("shape mismatch"))


def test_other_errors_propagate():
    def bad_batch(n):
        raise KeyError("not an OOM")

    with pytest.raises(BatchSearchError, match="not an OOM") as info:  # not counted as "does not fit"
        remat.max_batch_size(make_model, bad_batch, "1GiB", solver="chen_sqrt")
    assert isinstance(info.value.__cause__, KeyError)


def test_limit_below_batch_one_gives_zero():
    result = remat.max_batch_size(make_model, make_batch, 10_000, solver="chen_sqrt")
    assert result.batch_size == 0 and result.plain_batch_size == 0 and result.plan is None
    assert [t.batch for t in result.tries] == [1, 1]
    assert all("parameters, buffers and batch alone" in t.reason for t in result.tries)
    # above the parameters but below a step's gradients: nothing runs out of the limit either
    params = fixed_bytes(make_model(), make_batch(1))
    result = remat.max_batch_size(make_model, make_batch, params + 1000, solver="chen_sqrt")
    assert result.batch_size == 0 and result.plain_batch_size == 0


def test_max_batch_caps_the_search_and_kwargs_batches():
    class KwModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(D, D)

        def forward(self, x, *, scale):
            return (self.lin(x) * scale).tanh()

    result = remat.max_batch_size(KwModel, lambda n: ((make_batch(n),), {"scale": 2.0}), "1GiB",
                                  start=2, max_batch=5, compare_plain=False)
    assert result.batch_size == 5 and result.plain_batch_size is None
    assert [t.batch for t in result.tries] == [2, 4, 5]


def test_tries_free_their_models():
    refs = []

    def tracked_model():
        m = make_model()
        refs.append(weakref.ref(m))
        return m

    remat.max_batch_size(tracked_model, make_batch, "1GiB", solver="chen_sqrt", max_batch=2)
    gc.collect()
    assert refs and all(r() is None for r in refs)


def test_search_is_exponential_then_binary():
    calls = []

    def fits(n):
        calls.append(n)
        return n <= 37

    assert _search(fits, 1, None) == 37
    assert calls[:7] == [1, 2, 4, 8, 16, 32, 64]
    assert _search(lambda n: False, 4, None) == 0
    assert _search(lambda n: n <= 2, 4, None) == 2


def test_bad_arguments():
    with pytest.raises(BatchSearchError):
        remat.max_batch_size(make_model, make_batch, 0)
    with pytest.raises(BatchSearchError):
        remat.max_batch_size(make_model, make_batch, "1GiB", start=0)
    with pytest.raises(remat.RematError):
        remat.max_batch_size(make_model, make_batch, "lots")


def test_a_step_that_fails_for_another_reason_is_a_clear_error():
    """BatchNorm cannot train on one sample: the search stops with advice, not Dynamo's traceback."""
    def bn_model() -> nn.Module:
        return nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8))

    with pytest.raises(BatchSearchError, match="start the search at a larger batch"):
        remat.max_batch_size(bn_model, lambda n: torch.randn(n, 8), "1MiB", start=1, compare_plain=False)

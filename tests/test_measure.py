"""Tests for remat.measure: the measured peaks must match bytes we can count by hand."""

from __future__ import annotations

import statistics

import pytest
import torch

from remat import measure
from remat.measure import StepMeasurement, measure_step, peak_memory_growth

MiB = 2**20
F32 = 4  # bytes per float32

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _alloc(nbytes: int) -> None:
    """Allocate and touch `nbytes` of float32, then free it (all inside the call)."""
    t = torch.empty(nbytes // F32).fill_(1.0)
    del t


def _mlp(width: int, layers: int, device: str = "cpu") -> torch.nn.Sequential:
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods).to(device)


# Shape of the MLP in test (b) and the bytes the eager step must peak at.
BATCH, WIDTH, LAYERS = 4096, 1024, 4
ACT = BATCH * WIDTH * F32  # one activation / activation gradient: 16 MiB
WGRAD = WIDTH * WIDTH * F32  # one weight gradient: 4 MiB
BGRAD = WIDTH * F32  # one bias gradient: 4 KiB

# Eager autograd on Sequential(Linear, ReLU) x 4 with loss = out.sum(); the input x does not
# require grad, so it is never differentiated. Write z_i = addmm(b_i, h_{i-1}, W_i^T) and
# h_i = relu(z_i), each ACT bytes.
#   * Saved for backward: addmm_i saves its input h_{i-1} (x for i = 1: outside the budget);
#     relu_i saves its *output* h_i (threshold_backward needs only the result). z_i is saved by
#     nobody and dies right after relu_i. sum saves only a shape.
#   * Forward peak, at relu_4: h_1, h_2, h_3 (saved), z_4 (input) and h_4 (output) = 5 ACT.
#     After it z_4 dies: 4 ACT held for the backward.
#   * Backward: sum's gradient is a stride-0 expand of a scalar (no memory).
#     relu_4 backward allocates dz_4: 5 ACT; the engine then releases h_4 -> 4 ACT.
#     addmm_4 backward, on top of h_1..h_3 and dz_4, allocates db_4 (BGRAD), dh_3 = dz_4 @ W_4
#     (ACT) and dW_4 = dz_4^T h_3 (WGRAD, computed directly in W's layout, so AccumulateGrad
#     steals it into W_4.grad without a copy): 5 ACT + WGRAD + BGRAD.  <-- the peak
#     Then dz_4 dies; relu_3 backward allocates dz_3 and frees dh_3 and h_3, so every later
#     layer sits lower (3 ACT + 2 WGRAD + ... at addmm_3, and so on); addmm_1 needs no dx.
FORWARD_PEAK = 5 * ACT  # 80 MiB
STEP_PEAK = 5 * ACT + WGRAD + BGRAD  # 84 MiB + 4 KiB


# ---------------------------------------------------------------------------------------------
# (a) CPU: a known allocation, and the high-water mark really resets
# ---------------------------------------------------------------------------------------------


def test_cpu_single_allocation_is_measured_exactly():
    peak_memory_growth(lambda: _alloc(64 * MiB))  # first call: any lazy initialization
    peak, result = peak_memory_growth(lambda: _alloc(64 * MiB) or "done")
    assert result == "done"
    assert abs(peak - 64 * MiB) <= 1 * MiB, peak / MiB


def test_cpu_high_water_mark_resets_after_a_larger_freed_allocation():
    peak_memory_growth(lambda: _alloc(64 * MiB))
    big, _ = peak_memory_growth(lambda: _alloc(160 * MiB))
    assert abs(big - 160 * MiB) <= 1 * MiB, big / MiB
    # The 160 MiB block has been freed: its high-water mark must not leak into the next reading.
    peak, _ = peak_memory_growth(lambda: _alloc(64 * MiB))
    assert abs(peak - 64 * MiB) <= 1 * MiB, peak / MiB
    # Memory that was live before fn started, and still is, is not part of the growth.
    kept = torch.empty(32 * MiB // F32).fill_(1.0)
    peak, _ = peak_memory_growth(lambda: _alloc(64 * MiB))
    assert abs(peak - 64 * MiB) <= 1 * MiB, peak / MiB
    del kept


def test_peak_is_never_negative_when_fn_frees_memory():
    held = [torch.empty(16 * MiB // F32).fill_(1.0)]
    peak, _ = peak_memory_growth(lambda: held.clear())
    assert 0 <= peak <= 1 * MiB


# ---------------------------------------------------------------------------------------------
# (b) CPU: an eager MLP step peaks where the hand count says
# ---------------------------------------------------------------------------------------------


def test_cpu_mlp_step_peak_matches_hand_count():
    model = _mlp(WIDTH, LAYERS)
    x = torch.randn(BATCH, WIDTH)

    def step():
        model(x).sum().backward()

    m = measure_step(step, warmup=1, repeats=2, setup=lambda: model.zero_grad(set_to_none=True))
    print(
        f"\nMLP {BATCH}x{WIDTH}x{LAYERS} float32 step: expected {STEP_PEAK / MiB:.3f} MiB, "
        f"measured {[p / MiB for p in m.peak_samples]} MiB; {m.summary()}"
    )
    assert abs(m.peak_bytes - STEP_PEAK) <= 0.05 * STEP_PEAK
    # All parameter gradients are now alive: 4 weights + 4 biases.
    assert all(p.grad is not None for p in model.parameters())

    # The forward alone peaks at relu_4 (no gradients yet); its autograd graph dies with the
    # loss tensor, since only the Python float comes back.
    fwd, loss = peak_memory_growth(lambda: model(x).sum().item())
    print(f"MLP forward: expected {FORWARD_PEAK / MiB:.3f} MiB, measured {fwd / MiB:.3f} MiB")
    assert isinstance(loss, float)
    assert abs(fwd - FORWARD_PEAK) <= 0.05 * FORWARD_PEAK


# ---------------------------------------------------------------------------------------------
# (c) measure_step bookkeeping
# ---------------------------------------------------------------------------------------------


def test_measure_step_returns_sane_measurement():
    calls = []
    setups = []

    def step():
        calls.append(1)
        return torch.ones(1024).sum()

    m = measure_step(step, warmup=2, repeats=5, setup=lambda: setups.append(1))
    assert isinstance(m, StepMeasurement)
    # 2 warm-up + 5 timed + 2 untimed memory runs (allocator method)
    assert len(calls) == 9 and len(setups) == 9
    assert m.device == "cpu"
    assert len(m.samples) == 5 and len(m.peak_samples) == 2
    rss = measure_step(step, warmup=0, repeats=3, cpu_method="rss")
    assert len(rss.samples) == 3 and len(rss.peak_samples) == 3
    assert all(s > 0 for s in m.samples)
    assert m.seconds > 0 and m.seconds == statistics.median(m.samples)
    assert m.peak_bytes == max(m.peak_samples) >= 0
    assert "cpu" in m.summary() and "peak" in m.summary()
    assert measure_step(step, device="cpu", warmup=0, repeats=1).device == "cpu"


def test_measure_step_validates_arguments():
    with pytest.raises(ValueError):
        measure_step(lambda: None, repeats=0)
    with pytest.raises(ValueError):
        measure_step(lambda: None, warmup=-1)


def test_summary_formats_bytes():
    m = StepMeasurement(peak_bytes=84 * MiB, seconds=0.25, samples=(0.2, 0.25, 0.3), device="cpu")
    assert m.summary() == "peak 84.0 MiB, 0.25 s/step (median of 3, 0.2-0.3 s) on cpu"


def test_enable_cpu_memory_tracking_is_idempotent_and_fails_clearly(monkeypatch):
    measure.enable_cpu_memory_tracking()
    measure.enable_cpu_memory_tracking()
    monkeypatch.setattr(measure, "_libc", None)
    monkeypatch.setattr(measure, "_PROC_STATUS", "/nonexistent/status")
    with pytest.raises(RuntimeError, match="Linux"):
        measure.enable_cpu_memory_tracking()


# ---------------------------------------------------------------------------------------------
# (d) CUDA
# ---------------------------------------------------------------------------------------------


def test_accelerator_path_bookkeeping_with_a_fake_allocator(monkeypatch):
    """The CUDA branch's arithmetic, runnable without a GPU: a fake allocator's counters."""
    state = {"allocated": 10 * MiB, "peak": 500 * MiB, "log": []}  # stale peak from before

    def allocate(nbytes):
        state["allocated"] += nbytes
        state["peak"] = max(state["peak"], state["allocated"])

    def reset_peak(dev):
        state["log"].append("reset")
        state["peak"] = state["allocated"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: state["log"].append("sync"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev=None: state["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset_peak)

    def step():
        state["log"].append("step")
        allocate(30 * MiB)  # a temporary ...
        allocate(-30 * MiB)
        allocate(4 * MiB)  # ... and a gradient that outlives the step

    m = measure_step(step, device="cuda", warmup=1, repeats=2, setup=lambda: None)
    assert m.device == "cuda:0"
    assert m.peak_samples == (30 * MiB, 30 * MiB)  # growth over each run's own start
    assert state["log"] == ["step", "sync"] + ["sync", "reset", "step", "sync"] * 2
    peak, _ = peak_memory_growth(lambda: allocate(-8 * MiB), "cuda")
    assert peak == 0



@cuda
def test_cuda_single_allocation_is_exact():
    def alloc():
        t = torch.empty(64 * MiB // F32, device="cuda").fill_(1.0)
        del t
        return "done"

    peak_memory_growth(alloc, "cuda")
    kept = torch.empty(160 * MiB // F32, device="cuda")
    peak, result = peak_memory_growth(alloc, "cuda")
    del kept
    assert result == "done"
    # Tensor bytes as the caching allocator rounds them; a reused cached block may be a bit larger.
    assert 64 * MiB <= peak < 66 * MiB, peak / MiB


@cuda
def test_cuda_mlp_step_peak_matches_hand_count():
    model = _mlp(WIDTH, LAYERS, "cuda")
    x = torch.randn(BATCH, WIDTH, device="cuda")

    def step():
        model(x).sum().backward()

    m = measure_step(
        step, device="cuda", warmup=1, repeats=3, setup=lambda: model.zero_grad(set_to_none=True)
    )
    expected = STEP_PEAK + _bias_grad_reduction_scratch()
    print(f"\nCUDA MLP step: expected {expected / MiB:.3f} MiB, {m.summary()}")
    assert m.device == f"cuda:{torch.cuda.current_device()}"
    assert len(m.samples) == 3 and all(s > 0 for s in m.samples)
    assert abs(m.peak_bytes - expected) <= 0.05 * expected


def _bias_grad_reduction_scratch() -> int:
    """Bytes the bias gradient's reduction ``dz.sum(0)`` over ``BATCH`` rows allocates beyond its output
    on this GPU. CUDA's reduction kernel stages partial sums in a buffer of the caching allocator: on
    an H100 (torch 2.11) 32 MiB for this [4096, 1024] input, allocated at the step's peak (after dW_4),
    so the step measured 116 MiB against the 84 MiB of tensors counted above. The CPU kernel has none."""
    dz = torch.randn(BATCH, WIDTH, device="cuda")
    dz.sum(0)  # warm-up
    peak, out = peak_memory_growth(lambda: dz.sum(0), "cuda")
    return peak - out.untyped_storage().nbytes()


def test_allocator_method_counts_tensors_exactly():
    def two_live_then_one():
        a = torch.empty(8 * MiB // F32).fill_(1.0)
        b = torch.empty(4 * MiB // F32).fill_(1.0)
        del a
        c = torch.empty(2 * MiB // F32).fill_(1.0)
        return b, c

    peak, _ = peak_memory_growth(two_live_then_one)
    assert peak == 12 * MiB


def test_allocator_method_rejects_unknown_method():
    with pytest.raises(ValueError, match="cpu_method"):
        peak_memory_growth(lambda: None, cpu_method="magic")


def test_cuda_allocator_rounding_warning_once_unless_expandable_segments(monkeypatch):
    """On CUDA without expandable segments the caching allocator may hand a tensor a block up to 1 MiB
    larger (measured on an H100: plans 1-6 MiB above their predictions): remat warns once per process
    and says how to turn it off; with the setting, or off CUDA, it says nothing. (No GPU needed: only
    the device's type and the environment are read.)"""
    import warnings

    import remat.measure as measure
    from remat.errors import AllocatorRoundingWarning

    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(measure, "_ROUNDING_WARNED", False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        measure.warn_if_cuda_blocks_rounded("cpu")
        measure.warn_if_cuda_blocks_rounded("cuda")
        measure.warn_if_cuda_blocks_rounded("cuda:0")
    assert [type(w.message) for w in seen] == [AllocatorRoundingWarning]
    assert "expandable_segments:True" in str(seen[0].message)

    monkeypatch.setattr(measure, "_ROUNDING_WARNED", False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128, expandable_segments:True")
    assert measure.cuda_expandable_segments()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        measure.warn_if_cuda_blocks_rounded("cuda")
    assert not seen
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    assert not measure.cuda_expandable_segments()

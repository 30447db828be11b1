"""Measured peak memory and wall time of one training step.

This is what a :class:`~remat.plan.Plan`'s simulated peak is held against. The quantity
measured is the one remat budgets (see docs/design.md, "The budget"): the **peak growth of memory
during one step over what was live when the step began**. Parameters, buffers, inputs and
anything else already alive at the start are outside it; activations, temporaries and the
gradients the step produces are inside it.

Method
------
CUDA (and other accelerators with a PyTorch caching allocator)
    Synchronize, read ``memory_allocated(dev)`` as the start, ``reset_peak_memory_stats(dev)``
    (which sets the peak to the current value), run, synchronize, and report
    ``max_memory_allocated(dev) - start``. This counts bytes held by live tensors (block sizes
    as the caching allocator rounds them), not the allocator's reserved pool, and is exact.

CPU, default (``cpu_method="allocator"``)
    ``torch.profiler`` with ``profile_memory=True`` records every allocation and free of
    torch's CPU allocator; the peak of their running sum during the step is the growth, the
    same quantity as on CUDA, exact to the byte. It sees only memory allocated through torch
    (not Python objects or libraries' private buffers), and the profiler slows the step down,
    so memory is measured in separate, untimed runs.

CPU, ``cpu_method="rss"`` (Linux with glibc only; a second opinion)
    The process's resident set size, read from ``/proc/self/status``. It was found to read
    several MiB low on multi-threaded steps (the kernel batches RSS counters per CPU: 9.6 MiB
    read while 14.3 MiB of tensors were alive on a GPT-2 step), hence not the default.
    Three things make it as faithful as it gets:

    1. :func:`enable_cpu_memory_tracking` calls ``mallopt(M_MMAP_THRESHOLD, 65536)``, so every
       block of 64 KiB or more gets its own ``mmap`` and is ``munmap``-ed -- returned to the
       OS, and dropped from RSS -- as soon as it is freed. Without it glibc keeps freed blocks
       in its heap: the memory stays resident, is reused silently, and the measured "growth" is
       meaningless.
    2. The heap is *not* trimmed before the step. Small (< 64 KiB) blocks then reuse pages
       earlier steps left resident and are not counted; they are a few hundred KiB at most in
       the steps remat plans. Trimming (``malloc_trim(0)``) would count them, but would also
       count every heap page the step's small-block churn touches, freed or not: on a ResNet
       step that read 7 MiB above the tensors actually alive (checked on torch 2.13 CPU).
    3. Writing ``5`` to ``/proc/self/clear_refs`` resets the kernel's high-water mark
       ``VmHWM`` to the current RSS. The kernel updates the mark every time memory is
       unmapped, so after the step ``VmHWM`` is the highest RSS reached during it, and
       ``VmHWM - VmRSS(start)`` is the peak growth.

    Limits: RSS counts everything in the process (allocator headers, C++ autograd nodes,
    Python objects, code pages touched for the first time, thread stacks and per-thread
    buffers of BLAS/OpenMP pools), so run the step at least once beforehand (``warmup``) and
    use tensors of tens of MiB or more. The kernel records the high-water mark from its
    approximate per-CPU RSS counters, so the peak can read low by up to the pages not yet
    folded in (at most a batch of 32 or more pages per CPU): 0.05-0.2 MiB on a 2-core VM,
    possibly a few MiB on a machine with many cores.
    Call :func:`enable_cpu_memory_tracking` as early as possible -- ideally before the model
    is built -- since blocks already sitting in glibc's heap when it is called are not moved.
    Memory of other processes (e.g. DataLoader workers) is not seen.

Timing is ``time.perf_counter`` around the step only; all the bookkeeping above (garbage
collection, profiling, ``/proc`` reads, device synchronization before the step) happens outside
the timed interval.
"""

from __future__ import annotations

import ctypes
import gc
import os
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = [
    "allocated_bytes",
    "CUDA_BLOCK_BYTES",
    "StepMeasurement",
    "enable_cpu_memory_tracking",
    "measure_step",
    "peak_memory_growth",
]

#: glibc ``mallopt`` parameter number (``<malloc.h>``).
_M_MMAP_THRESHOLD = -3

#: Blocks at least this large are served by their own ``mmap`` once CPU tracking is enabled.
MMAP_THRESHOLD_BYTES = 65536

_PROC_STATUS = "/proc/self/status"
_PROC_CLEAR_REFS = "/proc/self/clear_refs"

_lock = threading.Lock()
_libc: ctypes.CDLL | None = None  # set once CPU tracking is enabled


CUDA_BLOCK_BYTES = 512  # the CUDA caching allocator rounds every allocation up to a multiple of this


def allocated_bytes(nbytes: int, device: torch.device | str | None) -> int:
    """Bytes the allocator of ``device`` counts for a storage of ``nbytes``: what the measured peak
    (``torch.cuda.max_memory_allocated``, torch's CPU allocator events) adds up. CUDA's caching
    allocator hands out multiples of 512 bytes; the CPU allocator exactly what was asked."""
    if nbytes > 0 and torch.device(device or "cpu").type == "cuda":
        return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
    return nbytes


# --------------------------------------------------------------------------------------------
# Result type
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepMeasurement:
    """Measured cost of one training step, as returned by :func:`measure_step`.

    Attributes:
        peak_bytes: peak growth of memory during one step over what was live when the step
            began, in bytes; the largest over the timed runs (see :func:`measure_step`).
        seconds: median wall time of one step, in seconds.
        samples: the wall time of every timed run, in seconds, in the order they ran.
        device: the device measured, ``"cpu"`` or ``"cuda:0"`` (type and index).
        peak_samples: the peak growth of every timed run, in bytes, in the order they ran.
    """

    peak_bytes: int
    seconds: float
    samples: tuple[float, ...]
    device: str
    peak_samples: tuple[int, ...] = ()

    def summary(self) -> str:
        """One line for humans.

        E.g. ``"peak 84.0 MiB, 0.452 s/step (median of 3, 0.44-0.47 s) on cpu"``.
        """
        n = len(self.samples)
        if n > 1:
            spread = f"median of {n}, {min(self.samples):.3g}-{max(self.samples):.3g} s"
        else:
            spread = f"{n} run"
        return (
            f"peak {_format_bytes(self.peak_bytes)}, {self.seconds:.3g} s/step "
            f"({spread}) on {self.device}"
        )


def _format_bytes(n: int) -> str:
    sign = "-" if n < 0 else ""
    value = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024.0 or unit == "GiB":
            return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------------------------
# CPU: glibc + /proc
# --------------------------------------------------------------------------------------------


def enable_cpu_memory_tracking() -> None:
    """Make the process's RSS follow the bytes it has allocated; idempotent.

    Calls glibc's ``mallopt(M_MMAP_THRESHOLD, 65536)`` through :mod:`ctypes`, so that every
    block of 64 KiB or more is served by its own ``mmap`` and returned to the OS when freed
    (the same as starting Python with ``MALLOC_MMAP_THRESHOLD_=65536``). The setting is
    process-wide and stays for the life of the process; it also turns off glibc's dynamic
    adjustment of the threshold. It costs some speed on the CPU: large blocks are no longer
    recycled inside the heap, so each step faults in (and the kernel zeroes) its big
    buffers afresh.

    ``M_TRIM_THRESHOLD`` is deliberately left at its default (128 KiB): freed small blocks
    are pinned below the top of the heap by live neighbours far more often than they sit at
    its top, so lowering it made no measurable difference (checked on torch 2.13 CPU).

    Also checks that the high-water mark can be reset (``/proc/self/clear_refs``, Linux 4.0+).
    Call this as early as possible, ideally before the model is built: blocks already in the
    heap when it is called stay there.

    Raises:
        RuntimeError: not Linux (no ``/proc/self/status``), C library not glibc, ``mallopt``
            refused, or ``/proc/self/clear_refs`` not writable (some sandboxes, e.g. gVisor).
    """
    global _libc
    with _lock:
        if _libc is not None:
            return
        if not sys.platform.startswith("linux") or not os.path.exists(_PROC_STATUS):
            raise RuntimeError(
                "CPU memory measurement needs Linux: it reads VmRSS/VmHWM from "
                f"{_PROC_STATUS}, which does not exist here (platform {sys.platform!r}). "
                "Measure on a CUDA device instead, or on a Linux machine."
            )
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.gnu_get_libc_version  # only glibc has it  # noqa: B018
            mallopt = libc.mallopt
            libc.malloc_trim  # noqa: B018
        except (OSError, AttributeError) as exc:
            raise RuntimeError(
                "CPU memory measurement needs glibc (it calls mallopt and malloc_trim); "
                "this process's C library is not glibc (musl-based images such as Alpine "
                "are not supported)."
            ) from exc
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
            raise RuntimeError(
                f"glibc mallopt(M_MMAP_THRESHOLD, {MMAP_THRESHOLD_BYTES}) failed; "
                "CPU memory cannot be measured."
            )
        try:
            _reset_high_water_mark()
        except OSError as exc:
            raise RuntimeError(
                f"cannot reset the RSS high-water mark: writing '5' to {_PROC_CLEAR_REFS} "
                f"failed ({exc}). It needs Linux 4.0 or later and a kernel that is not "
                "emulated (gVisor, WSL1 and some sandboxes do not support it)."
            ) from exc
        _libc = libc


def _read_rss_and_hwm() -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` of this process, in bytes."""
    rss = hwm = None
    with open(_PROC_STATUS, encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024  # the kernel reports kB (KiB)
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) * 1024
    if rss is None or hwm is None:
        raise RuntimeError(f"{_PROC_STATUS} has no VmRSS/VmHWM lines")
    return rss, hwm


def _reset_high_water_mark() -> None:
    with open(_PROC_CLEAR_REFS, "w", encoding="ascii") as f:
        f.write("5")


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------


def _resolve_device(device: torch.device | str | int | None) -> torch.device:
    """A concrete device: ``None`` means the CPU; an accelerator gets its current index."""
    if device is None:
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"cannot measure on {dev}: CUDA is not available")
        return dev if dev.index is not None else torch.device("cuda", torch.cuda.current_device())
    accel = torch.accelerator.current_accelerator(check_available=True)
    if accel is None or accel.type != dev.type:
        raise ValueError(
            f"cannot measure memory on device {dev}: supported are 'cpu', 'cuda' and the "
            f"current accelerator ({accel.type if accel is not None else 'none available'})"
        )
    if dev.index is None:
        dev = torch.device(dev.type, torch.accelerator.current_device_index())
    return dev


def _synchronize(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type != "cpu":
        torch.accelerator.synchronize(dev)


def _measure_once(fn: Callable[[], Any], dev: torch.device) -> tuple[int, float, Any]:
    """Run ``fn`` once; return (peak growth in bytes, seconds of ``fn`` alone, its result)."""
    if dev.type == "cpu":
        enable_cpu_memory_tracking()
        assert _libc is not None
        gc.collect()
        start, _ = _read_rss_and_hwm()
        _reset_high_water_mark()
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
        _, hwm = _read_rss_and_hwm()
        # VmHWM is never below the RSS at the reset; a reading below `start` is counter noise.
        return max(hwm - start, 0), seconds, result

    mem = torch.cuda if dev.type == "cuda" else torch.accelerator
    gc.collect()
    _synchronize(dev)
    start = mem.memory_allocated(dev)
    mem.reset_peak_memory_stats(dev)  # peak := current allocation
    t0 = time.perf_counter()
    result = fn()
    _synchronize(dev)
    seconds = time.perf_counter() - t0
    return max(mem.max_memory_allocated(dev) - start, 0), seconds, result


def allocator_timeline_cpu(fn: Callable[[], Any], collect_garbage: bool = True) -> tuple[list[int], Any]:
    """Bytes held by torch's CPU allocator while ``fn`` runs, relative to the start: one reading
    before ``fn`` (0) and one after each allocation or free; and ``fn``'s result.

    ``torch.profiler`` with ``profile_memory=True`` reports every CPU allocation and free
    (``[memory]`` events, bytes signed); their running sum in time order is the memory in use.
    Exact to the byte, blind to memory not allocated through torch (Python objects, some
    libraries' own scratch buffers), and slows the step down, so it is never used for timing."""
    from torch.profiler import ProfilerActivity, profile

    # kineto prints two lines per session at its default log level; it reads this when first used
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    if collect_garbage:  # ~0.2 s with torch loaded: worth it for a step, not for one op
        gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    cpu = torch._C._autograd.DeviceType.CPU
    events = sorted(
        ((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
         if e.name() == "[memory]" and e.device_type() == cpu),
        key=lambda ev: ev[0],
    )
    series, in_use = [0], 0
    for _, nbytes in events:
        in_use += nbytes
        series.append(in_use)
    return series, result


def _allocator_peak_cpu(fn: Callable[[], Any], collect_garbage: bool = True) -> tuple[int, Any]:
    """Peak growth of bytes held by torch's CPU allocator while ``fn`` runs (the maximum of
    :func:`allocator_timeline_cpu`): the CPU analogue of CUDA's ``max_memory_allocated`` growth."""
    series, result = allocator_timeline_cpu(fn, collect_garbage)
    return max(series), result


# --------------------------------------------------------------------------------------------
# CUDA allocator settings
# --------------------------------------------------------------------------------------------

_ROUNDING_WARNED = False


def cuda_expandable_segments() -> bool:
    """Whether the CUDA caching allocator was configured with expandable segments, read from
    ``PYTORCH_CUDA_ALLOC_CONF`` (or ``PYTORCH_ALLOC_CONF``), the way a process sets it before its first
    CUDA allocation. (A setting changed at run time through torch's private API is not seen.)"""
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for item in os.environ.get(var, "").split(","):
            key, _, value = item.partition(":")
            if key.strip() == "expandable_segments":
                return value.strip().lower() == "true"
    return False


def warn_if_cuda_blocks_rounded(device) -> None:
    """Warn once per process, for a CUDA ``device``, when expandable segments are off.

    The caching allocator serves a request over 1 MiB from the smallest cached block that fits and
    splits that block only when more than 1 MiB would remain; otherwise the tensor holds the whole
    block, and ``memory_allocated`` (what the budget bounds) counts it: up to 1 MiB more than the
    tensor, depending on which blocks the cache holds. On an H100 this put plans 1-6 MiB above their
    predictions (a GPT-2 plan of 397 MiB, an attention block of 14 MiB). With expandable segments it
    splits down to 512-byte granularity, which is what the simulator counts."""
    global _ROUNDING_WARNED
    if _ROUNDING_WARNED or torch.device(device).type != "cuda" or cuda_expandable_segments():
        return
    _ROUNDING_WARNED = True
    from .errors import AllocatorRoundingWarning

    warnings.warn(AllocatorRoundingWarning(
        "CUDA's caching allocator runs without expandable segments: it may give a tensor over 1 MiB a cached "
        "block up to 1 MiB larger and count all of it, so measured peaks can exceed the plan by up to 1 MiB "
        "per such tensor alive at the peak. Start the process with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for peaks that match the plan"), stacklevel=3)


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------

CPU_METHODS = ("allocator", "rss")


def peak_memory_growth(
    fn: Callable[[], Any],
    device: torch.device | str = "cpu",
    *,
    cpu_method: str = "allocator",
    collect_garbage: bool = True,
) -> tuple[int, Any]:
    """Run ``fn()`` once and return ``(peak growth in bytes, fn's result)``.

    The peak growth is the highest memory in use while ``fn`` ran, minus what was in use
    just before it started (after a ``gc.collect()``); it is never negative.

    * ``device`` of type ``cuda`` (or the current accelerator): synchronize, read
      ``memory_allocated(device)``, ``reset_peak_memory_stats(device)``, run, synchronize,
      then ``max_memory_allocated(device)`` minus the start. Only that device's tensor memory
      is counted.
    * ``"cpu"`` with ``cpu_method="allocator"`` (the default): every allocation and free of
      torch's CPU allocator, recorded by ``torch.profiler``; the peak of their running sum.
      The same quantity as on CUDA, exact, independent of the kernel's counters.
    * ``"cpu"`` with ``cpu_method="rss"``: :func:`enable_cpu_memory_tracking`, ``gc.collect()``,
      read ``VmRSS``, reset ``VmHWM`` through ``/proc/self/clear_refs``, run, and return
      ``VmHWM`` minus that ``VmRSS``. This is the whole process's resident memory, so run
      ``fn`` once before measuring it if it has first-call costs (lazy initialization,
      thread pools, code paged in), and expect it to read ~0.1 MiB low (kernel counter
      lag). See the module docstring.

    The RSS method reads the kernel's per-CPU-batched RSS counters: with several threads
    hopping over many CPUs they lag by several MiB (seen on torch 2.13: 9.6 MiB read while
    14.3 MiB of tensors were alive), which is why the allocator method is the default.

    The result of ``fn`` is still alive when the peak is read, so it is part of the peak.
    """
    dev = _resolve_device(device)
    if cpu_method not in CPU_METHODS:
        raise ValueError(f"cpu_method must be one of {CPU_METHODS}, got {cpu_method!r}")
    if dev.type == "cpu" and cpu_method == "allocator":
        return _allocator_peak_cpu(fn, collect_garbage)
    peak, _, result = _measure_once(fn, dev)
    return peak, result


def measure_step(
    step: Callable[[], Any],
    *,
    device: torch.device | str | None = None,
    warmup: int = 1,
    repeats: int = 3,
    setup: Callable[[], Any] | None = None,
    cpu_method: str = "allocator",
) -> StepMeasurement:
    """Measure the peak memory growth and the wall time of one training step.

    ``step`` is run ``warmup`` times untimed (``torch.compile`` compilation, allocator and
    thread-pool warm-up, lazy initialization, first-touch of code pages), then ``repeats``
    times timed. Each timed run is bracketed exactly as in :func:`peak_memory_growth` and the
    timer (``time.perf_counter``, with a device synchronization before the run and inside the
    timed interval after it) covers the step alone, not the bookkeeping.

    Memory and time come from **the same timed runs**, and ``peak_bytes`` is the **largest**
    of their peaks: the bookkeeping is outside the timed interval, so neither measurement
    disturbs the other and a separate memory run would only add time; every run gives an
    independent reading of the peak, and the largest is the safe one to hold against a
    budget (on the CPU it also absorbs the kernel's RSS counter noise). All readings are in
    ``peak_samples``; ``seconds`` is the median of ``samples``.

    The step must be repeatable with no state growing across calls, and must **start from
    ``.grad`` set to ``None``** on every parameter (that is what the budget means: the
    gradients the step produces count, gradients left over from a previous step do not).
    Do not set gradients to ``None`` inside ``step`` -- memory freed during the step is
    subtracted from the growth -- pass ``setup=lambda: model.zero_grad(set_to_none=True)``
    instead: ``setup`` runs before every run (warm-up and timed), outside both the timed
    interval and the memory measurement. The step's return value is dropped before the next
    run. On the CPU, timings include the page faults that the tracking allocator policy
    causes (see :func:`enable_cpu_memory_tracking`), so they are somewhat pessimistic.

    Args:
        step: the training step, e.g. ``lambda: model(x).sum().backward()``.
        device: where the step's memory lives; ``None`` means ``"cpu"``. ``"cuda"`` means the
            current CUDA device.
        warmup: untimed runs before measuring (>= 0).
        repeats: timed runs (>= 1).
        setup: called before every run, outside the measurement.
        cpu_method: ``"allocator"`` (default: torch's allocator events, in up to two extra
            untimed runs) or ``"rss"`` (the process's resident memory, in the timed runs).

    Returns:
        A :class:`StepMeasurement`.
    """
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if cpu_method not in CPU_METHODS:
        raise ValueError(f"cpu_method must be one of {CPU_METHODS}, got {cpu_method!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    dev = _resolve_device(device)
    if dev.type == "cpu" and cpu_method == "rss":
        # Before the warm-up: blocks it allocates and frees must not linger in glibc's heap.
        enable_cpu_memory_tracking()

    for _ in range(warmup):
        if setup is not None:
            setup()
        step()
        _synchronize(dev)

    samples: list[float] = []
    peaks: list[int] = []
    separate_memory_runs = dev.type == "cpu" and cpu_method == "allocator"
    for _ in range(repeats):
        if setup is not None:
            setup()
        if separate_memory_runs:  # the profiler would slow the timed run down
            _synchronize(dev)
            t0 = time.perf_counter()
            result = step()
            samples.append(time.perf_counter() - t0)
        else:
            peak, seconds, result = _measure_once(step, dev)
            samples.append(seconds)
            peaks.append(peak)
        del result
    if separate_memory_runs:
        for _ in range(min(repeats, 2)):
            if setup is not None:
                setup()
            peak, result = _allocator_peak_cpu(step)
            del result
            peaks.append(peak)

    return StepMeasurement(
        peak_bytes=max(peaks),
        seconds=statistics.median(samples),
        samples=tuple(samples),
        device=str(dev),
        peak_samples=tuple(peaks),
    )

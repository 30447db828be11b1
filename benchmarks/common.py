"""What every benchmark in this folder shares: process set-up, steps, timing, peaks, models, reports.

The scripts are run as ``python benchmarks/NAME.py``, so this folder is on ``sys.path`` and they
``import common``. This module imports only the standard library at import time (torch and remat
are imported inside the functions that need them), so that a script can set the environment
(:func:`single_thread_env`) and put the checkout's ``src/`` on the path (:func:`use_checkout_src`)
before torch or remat is imported.

Methodology, shared by all scripts:

* **time** a step with :func:`timed_step` (``.grad`` set to None first, untimed; device
  synchronized around it), in rounds (:func:`alternating_rounds`, :func:`time_against`): warm-up
  runs first, then per round each variant back to back with its baseline(s), optionally in reverse
  order every other round; statistics are medians (of the per-round ratios for ratios);
* **peak**: :func:`measured_peak`, ``remat.measure.peak_memory_growth`` of one step with ``.grad``
  set to None beforehand, in a separate untimed run;
* **provenance**: :func:`git_revision` and :func:`machine_facts` in every report's header.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Callable, Iterator, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SRC = ROOT / "src"
MiB = 2**20

#: The 8-layer GPT-2 that runs a step on the CPU in well under a second: hierarchical.py's sections
#: 2-3 (its ``SMALL``), inductor.py's GPT-2 and hybrid.py's deeper chain.
GPT2_8LAYER = dict(n_layer=8, n_embd=256, n_head=4, vocab=2000, positions=256, batch=4, seq=256)
M_MMAP_THRESHOLD, M_TRIM_THRESHOLD = -3, -1  # glibc mallopt parameters (<malloc.h>)


# ---------------------------------------------------------------------------------------------
# Process set-up


def single_thread_env(omp: bool = False, compile_threads: bool = False) -> None:
    """Default ``OMP_NUM_THREADS`` (one torch thread) and/or ``TORCHINDUCTOR_COMPILE_THREADS`` (no
    compile worker pool) to 1 unless set: the machine is shared. Call it before torch is imported."""
    if omp:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if compile_threads:
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def use_checkout_src() -> None:
    """Put this checkout's ``src/`` first on ``sys.path``, so that its remat is imported."""
    sys.path.insert(0, str(SRC))


def process_setup(threads: int | None = None, seed: int | None = None, quiet_future: bool = False) -> None:
    """torch's thread count (if given), its global seed (if given), and FutureWarnings silenced."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    if quiet_future:
        warnings.filterwarnings("ignore", category=FutureWarning)
    if seed is not None:
        torch.manual_seed(seed)


def keep_freed_cpu_memory() -> str:
    """Have glibc's malloc keep the memory a step frees, as CUDA's caching allocator does; returns
    what the report says about it.

    By default glibc returns large freed blocks to the OS (``munmap``, or trimming the heap's top),
    and the next allocation of that size page-faults them in again: time that depends on the
    allocation pattern, not on the computation. remat's compiled graphs allocate every buffer anew
    (``allow_buffer_reuse=False``), so they paid most of it, with most of the run-to-run spread
    (8-layer GPT-2 at a matched 147 MiB, 5 rounds in each of two processes: remat 654-666 ms a step
    with glibc's defaults, 650-653 ms with trimming off; Inductor's default 660-680 and 656-674 ms).
    Peaks are unaffected: they count torch's allocations, not resident memory."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only)
    except (OSError, AttributeError):
        return "C library not glibc: its allocator's defaults"
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    mmap_ok = libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)  # blocks below 32 MiB (glibc's maximum) from the heap
    trim_ok = libc.mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1)  # and the heap never trimmed
    if mmap_ok != 1 or trim_ok != 1:
        return "glibc's defaults (mallopt refused)"
    return ("glibc's malloc keeps freed memory in the process (`M_MMAP_THRESHOLD` 32 MiB, no trimming), as CUDA's "
            "caching allocator does, for every method alike; `--system-malloc` keeps glibc's defaults")


@contextlib.contextmanager
def quiet(category: type[Warning] = Warning) -> Iterator[None]:
    """Warnings of ``category`` (default: all) ignored inside the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category)
        yield


# ---------------------------------------------------------------------------------------------
# Logging and formatting


def log(msg: str) -> None:
    """A time-stamped progress line on stderr (reports go to stdout)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted with ``spec``, or "–" for None."""
    return "–" if x is None else format(x, spec)


def mib(n: float | None, digits: int = 1) -> str:
    """Bytes as MiB with ``digits`` decimals, or "–" for None."""
    return "–" if n is None else f"{n / MiB:.{digits}f}"


def pct(x: float | None) -> str:
    """A ratio minus 1 as a signed percentage, or "–" for None."""
    return "–" if x is None else f"{x * 100:+.1f}%"


# ---------------------------------------------------------------------------------------------
# Steps, timing and peaks


def make_step(fn: Callable, args: tuple = (), kwargs: dict | None = None, loss: Callable | None = None) -> Callable[[], None]:
    """One training step: ``fn(*args, **kwargs)`` (through ``loss`` if given), then ``.backward()``."""
    kwargs = kwargs or {}
    if loss is None:
        def step():
            fn(*args, **kwargs).backward()
    else:
        def step():
            loss(fn(*args, **kwargs)).backward()
    return step


def sync(device=None) -> None:
    """Wait for a CUDA device's queued work; nothing elsewhere."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timed_step(model, step: Callable[[], None], device=None) -> float:
    """Seconds of one ``step()``: ``model``'s ``.grad`` set to None first (untimed; skipped for None),
    the device synchronized before and, inside the timed interval, after it."""
    if model is not None:
        model.zero_grad(set_to_none=True)
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - t0


def measured_peak(model, step: Callable[[], None], device="cpu") -> int:
    """``remat.measure.peak_memory_growth`` of one ``step()``, ``model``'s ``.grad`` set to None first
    (skipped for None): bytes, in a run of its own (never a timed one)."""
    from remat.measure import peak_memory_growth

    if model is not None:
        model.zero_grad(set_to_none=True)
    return int(peak_memory_growth(step, device)[0])


def grads(model) -> list:
    """Copies of ``model``'s parameter gradients (None where a parameter has none)."""
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def seeded_grads(model, step: Callable[[], None], seed: int = 0, device=None) -> list:
    """The gradients one ``step()`` leaves, ``.grad`` None and torch seeded with ``seed`` first."""
    import torch

    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    step()
    sync(device)
    return grads(model)


def grad_errors(got: list, ref: list, names: list[str] | None = None) -> dict:
    """Two :func:`grads` lists compared: ``max_rel``, the largest over parameters of max|got - ref| /
    max|ref| (a gradient near zero everywhere makes it large), ``where`` its parameter (from ``names``),
    and ``l2``, the relative L2 norm of the difference over all parameters together."""
    worst, where, num, den = 0.0, None, 0.0, 0.0
    for a, b, name in zip(got, ref, names or [None] * len(ref)):
        if a is None or b is None:
            continue
        a, b = a.double(), b.double()
        d = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        if d > worst:
            worst, where = d, name
        num += float(((a - b) ** 2).sum())
        den += float((b ** 2).sum())
    return dict(max_rel=worst, where=where, l2=(num / den) ** 0.5 if den else 0.0)


def bitwise_equal(got: list, ref: list) -> bool:
    """Whether two :func:`grads` lists are equal bit for bit (None where the other is None)."""
    import torch

    return all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
               for a, b in zip(got, ref))


def median(xs: Sequence[float]) -> float | None:
    """The median, or None for no samples."""
    return statistics.median(xs) if xs else None


def alternating_rounds(bases: Sequence[Callable[[], float]], variants: Sequence[Callable[[], float]], rounds: int, *,
                       alternate: bool = False, warmup: int = 1,
                       after_round: Callable[[int], None] | None = None) -> list[list[tuple[float, ...]]]:
    """Time ``variants`` against ``bases`` in rounds, so that machine noise hits both alike.

    Every callable runs one step and returns its seconds (e.g. ``lambda: timed_step(model, step)``).
    First each base, then each variant, runs ``warmup`` times (untimed). Then each round runs, for
    each variant in turn, the bases (in their order) and the variant, back to back; with
    ``alternate``, every other round (the second, fourth, ...) runs that group in reverse order.
    ``after_round(r)`` is called after round ``r`` (from 0). Returns, per variant, one tuple per round:
    the bases' seconds, then the variant's."""
    for fn in (*bases, *variants):
        for _ in range(warmup):
            fn()
    samples: list[list[tuple[float, ...]]] = [[] for _ in variants]
    for r in range(rounds):
        for variant, out in zip(variants, samples):
            group = (*bases, variant)
            order = range(len(group))
            seconds = [0.0] * len(group)
            for i in (reversed(order) if alternate and r % 2 else order):
                seconds[i] = group[i]()
            out.append(tuple(seconds))
        if after_round is not None:
            after_round(r)
    return samples


def time_against(base: tuple, variants: dict[str, tuple], rounds: int, *, device=None, alternate: bool = False,
                 warmup: int = 1) -> tuple[float | None, dict[str, float | None], dict[str, float | None]]:
    """:func:`alternating_rounds` of ``(model, step)`` pairs, each run by :func:`timed_step`: the base
    against each variant. Returns the median base step (None without variants) and, per variant, the
    median step and the median of the per-round ratios variant / base."""
    def run(pair):
        return lambda: timed_step(*pair, device)

    samples = alternating_rounds([run(base)], [run(v) for v in variants.values()], rounds,
                                 alternate=alternate, warmup=warmup)
    base_t = [b for per in samples for b, _ in per]
    return (median(base_t), {k: median([t for _, t in per]) for k, per in zip(variants, samples)},
            {k: median([t / b for b, t in per]) for k, per in zip(variants, samples)})


# ---------------------------------------------------------------------------------------------
# Models, capture, compilation


def gpt2(cfg: dict):
    """``(model, args, kwargs)``: a zoo GPT-2 LM from ``transformers`` (returns its loss; train mode)
    built from ``cfg``; the same weights and inputs on every call (seed 0)."""
    import torch
    from remat import models as zoo

    torch.manual_seed(0)
    model, args, kwargs = zoo._BUILDERS["gpt2"](**cfg)
    return model.train(), args, kwargs


def lognormal_lengths(steps: int, median: int, low: int, high: int, seed: int = 0) -> list[int]:
    """``steps`` sequence lengths drawn log-normal (``median``, sigma 0.8), clipped to ``low..high``."""
    import math
    import random

    rng = random.Random(seed)
    return [min(high, max(low, int(rng.lognormvariate(math.log(median), 0.8)))) for _ in range(steps)]


def bucket_plans(plans) -> list[tuple]:
    """``[(((symbol, edge), ...), plan), ...]`` of the plans made for a size bucket, by bucket."""
    return sorted(((tuple(sorted(p.info["bucket"].items())), p) for p in plans if p.info.get("bucket")),
                  key=lambda kv: kv[0])


def grad_bytes(model) -> int:
    """Bytes of the parameter gradients one step produces: a floor every method pays."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def capture_store_all(model, args: tuple, kwargs: dict, **options):
    """``(module, seconds)``: ``remat.optimize(model, ..., solver="store_all", **options)`` (capture and
    the store-everything plan), warnings silenced, and how long it took."""
    import remat

    t0 = time.perf_counter()
    with quiet():
        module = remat.optimize(model, *args, solver="store_all", **options, **kwargs)
    return module, time.perf_counter() - t0


def entry_point(model, tag: str):
    """A function calling ``model`` with a code object of its own, so Dynamo keeps one compiled
    graph per budget side by side (its cache lives on the code object; see remat.api)."""

    def compiled_step(*args, **kwargs):
        return model(*args, **kwargs)

    code = compiled_step.__code__.replace(co_name=f"compiled_step_{tag}")
    return types.FunctionType(code, compiled_step.__globals__, code.co_name, None, compiled_step.__closure__)


def compiled_step(model, args: tuple, kwargs: dict | None, tag: str, budget: float = 1.0,
                  backend: str = "inductor") -> tuple[Callable[[], None], float]:
    """``(step, seconds)``: ``torch.compile(backend)`` of ``model`` (fullgraph, entry point ``tag``) at
    ``activation_memory_budget=budget``, compiled now by one step (``.grad`` None first), and the
    seconds that took."""
    import torch

    step = make_step(torch.compile(entry_point(model, tag), backend=backend, fullgraph=True), args, kwargs)
    t0 = time.perf_counter()
    with torch._functorch.config.patch(activation_memory_budget=budget), quiet():
        timed_step(model, step)  # compiles forward and backward with this budget
    return step, time.perf_counter() - t0


def zoo_batch_factories(name: str, size: str):
    """``(make_model, make_batch)`` for ``remat.max_batch_size``: zoo model ``name`` at ``size``, its
    batch overridden by ``make_batch(n)``."""
    from remat import models as zoo

    def make_model():
        return zoo.build(name, size=size).model

    def make_batch(n):
        ex = zoo.build(name, size=size, batch=n)
        return ex.args, ex.kwargs

    return make_model, make_batch


def best_try(result, method: str):
    """The fitting try of ``method`` ("plain" or "remat") at ``result``'s largest batch, if any."""
    size = result.batch_size if method == "remat" else result.plain_batch_size
    return next((t for t in result.tries if t.method == method and t.batch == size and t.fits), None)


# ---------------------------------------------------------------------------------------------
# Provenance and reports


def git_revision() -> str:
    """The commit the run used, and whether src/ had uncommitted changes (read-only git calls)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    try:
        rev, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "src")
    except OSError:
        return "unknown"
    return f"{rev}{' with uncommitted changes in src/' if dirty else ''}"


def cpu_name() -> str:
    """The processor as ``platform`` names it (or the machine type)."""
    return platform.processor() or platform.machine()


def machine_facts() -> str:
    """CPU model, visible cores, torch and its thread count, Python and transformers versions."""
    import torch

    cpu = cpu_name()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import transformers

        hf = f", transformers {transformers.__version__}"
    except ImportError:
        hf = ""
    return (f"{cpu}, {os.cpu_count()} cores visible, torch {torch.__version__} with {torch.get_num_threads()} "
            f"thread(s) (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
            f"Python {platform.python_version()}{hf}")


def made_by(script: str, revision: str, started: str, machine: str) -> str:
    """A report's provenance sentence (without its full stop)."""
    return f"Made by `benchmarks/{script}` (remat at commit {revision}, {started}) on {machine}"


def shared_machine_note(load_before: float, load_after: float) -> str:
    """The warning about a shared machine, with its load averages (continues after "noisy; ")."""
    return (f"The machine was **shared with other jobs** while this ran (load average {load_before:.1f} before, "
            f"{load_after:.1f} after, on {os.cpu_count()} cores): absolute times are inflated and noisy; ")


def write_report(name: str, title: str, started: str, intro: str, rows: Sequence[str], save: bool) -> None:
    """Print the report of ``benchmarks/{name}.py``: its title, the command, commit, start time and
    machine, ``intro``, then ``rows``; with ``save``, also write it to ``benchmarks/{name}.md``."""
    text = "\n".join([
        f"# {title}", "",
        f"`benchmarks/{name}.py {' '.join(sys.argv[1:])}` at {git_revision()}, {started}; {machine_facts()}.", "",
        intro, "", *rows, ""])
    if save:
        (HERE / f"{name}.md").write_text(text)
    print(text)


def md_header(columns: Sequence[str]) -> list[str]:
    """A markdown table's header row and its separator."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def write_json(path, data, indent: int | None = 1) -> None:
    """Measurements as JSON (to re-render a report without measuring again)."""
    Path(path).write_text(json.dumps(data, indent=indent))


def publish(text: str, path=None, echo: bool = True) -> None:
    """Print a report (if ``echo``) and, given a ``path``, write it there and log that."""
    if echo:
        print(text)
    if path is not None:
        Path(path).write_text(text)
        log(f"wrote {path}")

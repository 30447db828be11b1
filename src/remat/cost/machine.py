"""The machine's roofline: peak compute rate, streaming bandwidth, per-op overhead.

Three numbers describe how fast a device runs one ATen op in the analytic cost model
(see :mod:`remat.cost.flops`)::

    seconds(op) = max(flops / flops_per_second, bytes / bytes_per_second) + op_overhead_seconds

They are measured once per machine and cached on disk as JSON, so that every later
process (and every plan) uses the very same numbers::

    from remat.cost.machine import machine_roofline
    r = machine_roofline("cpu")      # ~1 s the first time, then read from the cache
    r.flops_per_second, r.bytes_per_second, r.op_overhead_seconds
    # e.g. (2.3e+11, 3.0e+10, 1.3e-06) on 2 cores of an AMD EPYC
    r = machine_roofline("cpu", refresh=True)   # measure again, overwrite the cache

What is measured (best of a few runs each, so noise can only make a number look slower):

- ``flops_per_second``: a float32 ``mm`` of a size large enough to be compute-bound
  (grown until one product takes a few milliseconds), ``2·m·n·k / time``, the count
  that ``torch.utils.flop_counter`` uses.
- ``bytes_per_second``: a float32 ``add(a, b, out=c)`` on tensors much larger than the
  last-level cache, ``(bytes of a + b + c) / time``, i.e. bytes read plus bytes written,
  the same count as :func:`remat.cost.flops.node_bytes`.
- ``op_overhead_seconds``: ``torch.ops.aten.add.Tensor`` on one-element tensors in a loop,
  the fixed price of dispatching (and on CUDA, launching) one op.

The cache lives in ``$XDG_CACHE_HOME/remat`` (``~/.cache/remat`` when that is unset),
one file per key, the key being (device kind, device name, number of torch threads,
torch version, measurement method version). Files are written atomically
(temporary file + ``os.replace``), so processes racing to measure are harmless.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["Roofline", "machine_roofline", "cache_dir"]

# Bump when the measurement procedure changes, so old cache files are not reused.
_METHOD_VERSION = 3  # 2: measured outside any fake/dispatch mode (1 could be measured on fake tensors); 3: RNG rate


@dataclass(frozen=True)
class Roofline:
    """Peak rates of one device, as used by the ``flops`` cost model.

    ``seconds(flops, nbytes)`` is the roofline time of one op.
    """

    flops_per_second: float
    bytes_per_second: float
    op_overhead_seconds: float
    device_name: str
    # elements a random op (dropout) draws per second: on a CPU generating random numbers, not
    # moving bytes, bounds it (8 dropout replays cost 36 ms where the bytes said 1 ms)
    random_elements_per_second: float = float("inf")

    def seconds(self, flops: float, nbytes: float) -> float:
        """``max(flops / flops_per_second, nbytes / bytes_per_second) + op_overhead_seconds``."""
        return (
            max(flops / self.flops_per_second, nbytes / self.bytes_per_second)
            + self.op_overhead_seconds
        )


def cache_dir() -> Path:
    """Directory of remat's on-disk caches: ``$XDG_CACHE_HOME/remat`` or ``~/.cache/remat``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "remat"


# In-process memo: cache file path -> Roofline (so repeated calls do not even read the disk).
_MEMO: dict[str, Roofline] = {}
_LOCK = threading.Lock()


def machine_roofline(device: torch.device | str = "cpu", *, refresh: bool = False) -> Roofline:
    """The roofline of ``device``, measured once per machine and cached on disk.

    ``refresh=True`` measures again and overwrites the cache entry.
    """
    dev = _normalize_device(device)
    key = cache_key(dev)
    path = cache_dir() / f"roofline-{key_hash(key)}.json"
    memo_key = str(path)
    with _LOCK:
        if not refresh:
            if memo_key in _MEMO:
                return _MEMO[memo_key]
            roofline = _load(path, key)
            if roofline is not None:
                _MEMO[memo_key] = roofline
                return roofline
        t0 = time.perf_counter()
        # the cost model is built inside torch.compile, under AOTAutograd's fake mode: measure real tensors
        with _disable_current_modes():
            flops_ps, bytes_ps, overhead, random_ps = _measure(dev)
        elapsed = time.perf_counter() - t0
        roofline = Roofline(
            flops_per_second=float(flops_ps),
            bytes_per_second=float(bytes_ps),
            op_overhead_seconds=float(overhead),
            device_name=key["device_name"],
            random_elements_per_second=float(random_ps),
        )
        _store(path, key, roofline, elapsed)
        _MEMO[memo_key] = roofline
        return roofline


# ----------------------------------------------------------------------------- cache


def _normalize_device(device: torch.device | str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(
            f"machine_roofline: device {dev} is not supported; use 'cpu' or 'cuda[:index]'."
        )
    return dev


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown-cpu"


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return _cpu_name()


def cache_key(dev: torch.device, method_version: int = _METHOD_VERSION) -> dict:
    """What a cached measurement on ``dev`` depends on (device, threads, torch, method)."""
    return {
        "device_type": dev.type,
        "device_name": _device_name(dev),
        "num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "method_version": method_version,
    }


def key_hash(key: dict) -> str:
    """A short stable hash of a cache key, for file names."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def read_json_entry(path, key: dict, field: str):
    """``data[field]`` of the JSON cache file at ``path`` if it parses and was written for
    ``key``; else None (a missing, corrupt or stale file is simply measured again)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    return data.get(field)


def _load(path: Path, key: dict) -> Roofline | None:
    r = read_json_entry(path, key, "roofline")
    if r is None:
        return None
    try:
        roofline = Roofline(
            flops_per_second=float(r["flops_per_second"]),
            bytes_per_second=float(r["bytes_per_second"]),
            op_overhead_seconds=float(r["op_overhead_seconds"]),
            device_name=str(r["device_name"]),
            random_elements_per_second=float(r["random_elements_per_second"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (roofline.flops_per_second > 0 and roofline.bytes_per_second > 0
            and roofline.op_overhead_seconds >= 0 and roofline.random_elements_per_second > 0):
        return None
    return roofline


def _store(path: Path, key: dict, roofline: Roofline, elapsed: float) -> None:
    data = {
        "key": key,
        "roofline": asdict(roofline),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "measurement_seconds": round(elapsed, 3),
    }
    write_json_atomic(path, data, "its roofline cache", "the measurement will be repeated in the next process")


TMP_SUFFIX = ".tmp"
STALE_UNOWNED_SECONDS = 24 * 3600  # a temporary file of an older remat (no pid in its name) this old is stale
_SWEPT: set = set()


def process_running(pid: int) -> bool:
    """Whether a process ``pid`` runs (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def remove_stale_temp_files(folder: Path) -> list[tuple[Path, int]]:
    """Remove the temporary files of cache writes that never finished (the writer was killed): those
    whose writer's pid (``.<name>-<pid>-<random>.tmp``) is not running, and those without a pid older
    than a day. Returns ``(path, bytes)`` for each file removed."""
    removed = []
    try:
        candidates = [e for e in os.scandir(folder) if e.name.startswith(".") and e.name.endswith(TMP_SUFFIX)]
    except OSError:
        return removed
    for entry in candidates:
        parts = entry.name[1:-len(TMP_SUFFIX)].split("-")  # name, pid, mkstemp's random part (no "-")
        pid = int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None
        try:
            stat = entry.stat(follow_symlinks=False)
            if pid is not None and process_running(pid):
                continue  # its writer runs
            if pid is None and time.time() - stat.st_mtime < STALE_UNOWNED_SECONDS:
                continue
            os.unlink(entry.path)
            removed.append((Path(entry.path), stat.st_size))
        except OSError:
            continue
    return removed


def write_json_atomic(path: Path, data: dict, what: str, consequence: str) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace`` (readers never see half
    a file); on failure warn, naming ``what`` could not be written and its ``consequence``."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent not in _SWEPT:  # what writes killed mid-way left here (once per folder and process)
            _SWEPT.add(path.parent)
            remove_stale_temp_files(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-{os.getpid()}-", suffix=TMP_SUFFIX)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the cache is not secret
        os.replace(tmp, path)
    except OSError as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        warnings.warn(
            f"remat could not write {what} {path} ({e}); {consequence}. "
            f"Set XDG_CACHE_HOME to a writable directory.",
            RuntimeWarning,
            stacklevel=4,
        )


# ----------------------------------------------------------------------------- measurement


def _seconds(fn: Callable[[], object], sync: Callable[[], None], inner: int = 1) -> float:
    """Mean time of ``inner`` back-to-back calls of ``fn``."""
    sync()
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    sync()
    return (time.perf_counter() - t0) / inner


def _llc_bytes() -> int:
    """Size of the largest CPU cache level (bytes), 32 MiB when unknown."""
    best = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in base.glob("index*"):
            text = (index / "size").read_text().strip().upper()
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            digits = text[:-1] if text[-1:] in "KMG" else text
            best = max(best, int(digits) * mult)
    except (OSError, ValueError):
        pass
    return best or (32 << 20)


def _measure(dev: torch.device) -> tuple[float, float, float, float]:
    """Measure (flops/s, bytes/s, seconds per op, dropout elements/s) on ``dev``; 0.3 to 1.5 s on a 2-core CPU.

    The three benchmarks run interleaved, in rounds, and each keeps its best round: on a
    machine shared with other processes this catches the quiet moments.
    """
    if dev.type == "cuda":
        def sync() -> None:
            torch.cuda.synchronize(dev)
        n, max_n, min_mm_seconds = 2048, 8192, 2e-3
        stream_bytes = 256 << 20
        overhead_iters = 2000
    else:
        def sync() -> None:
            pass
        n, max_n, min_mm_seconds = 1024, 4096, 5e-3
        stream_bytes = min(max(2 * _llc_bytes(), 64 << 20), 256 << 20)
        overhead_iters = 500
    min_rounds, max_rounds, time_limit = 4, 12, 1.0

    with torch.no_grad():
        # Matmul operands: grow n until one product is clearly compute-bound.
        while True:
            a = torch.ones(n, n, device=dev)
            b = torch.ones(n, n, device=dev)
            c = torch.empty(n, n, device=dev)
            mm = lambda: torch.mm(a, b, out=c)  # noqa: E731
            mm()  # warm-up
            t_mm = _seconds(mm, sync)
            if t_mm >= min_mm_seconds or n >= max_n:
                break
            n *= 2
        mm_inner = max(1, round(10e-3 / max(t_mm, 1e-9)))

        # Streaming operands: an add much larger than the caches.
        numel = stream_bytes // 4
        x = torch.ones(numel, device=dev)
        y = torch.ones(numel, device=dev)
        z = torch.empty(numel, device=dev)
        add_big = lambda: torch.add(x, y, out=z)  # noqa: E731
        add_big()  # warm-up (first touch of z)
        t_add = _seconds(add_big, sync)
        add_inner = max(1, round(5e-3 / max(t_add, 1e-9)))

        # A one-element op, allocating its output like graph code does.
        s = torch.ones(1, device=dev)
        add = torch.ops.aten.add.Tensor

        def tiny_loop() -> None:
            for _ in range(overhead_iters):
                add(s, s)

        tiny_loop()  # warm-up

        # A dropout of 4M elements: the rate at which random ops draw
        r_numel = 1 << 22
        r_in = torch.ones(r_numel, device=dev)
        dropout = lambda: torch.ops.aten.native_dropout.default(r_in, 0.1, True)  # noqa: E731
        dropout()  # warm-up
        t_rand = _seconds(dropout, sync)

        t_tiny = float("inf")
        start = time.perf_counter()
        for r in range(max_rounds):
            t_mm = min(t_mm, _seconds(mm, sync, mm_inner))
            t_add = min(t_add, _seconds(add_big, sync, add_inner))
            t_tiny = min(t_tiny, _seconds(tiny_loop, sync) / overhead_iters)
            t_rand = min(t_rand, _seconds(dropout, sync))
            if r + 1 >= min_rounds and time.perf_counter() - start > time_limit:
                break
    return 2.0 * n * n * n / t_mm, 3.0 * numel * 4 / t_add, t_tiny, r_numel / t_rand

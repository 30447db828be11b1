"""Transfer costs: how fast values move to the offload tier and back.

The simulator times ``offload``/``reload`` copies as ``latency_s + bytes / bandwidth`` in each
direction (:func:`remat.plan.simulate`). The figures are measured once per device and offload
store, by running the real store (:class:`remat.execute.offload.OffloadStore`) on a few MiB, and cached
on disk beside the roofline (:func:`remat.cost.machine.cache_dir`)::

    costs = transfer_costs("cpu")          # ~0.05 s the first time, then read from the cache
    graph.meta["transfer"] == costs.as_meta()   # what capture records

* ``file`` store (the CPU default): the tensor's bytes are written to a file in a temporary
  folder and read back (mostly the page cache); both are synchronous, so ``overlap=False``:
  every copy stalls compute for its whole duration.
* ``pinned`` store (CUDA): device -> pinned host copies on a side stream and back;
  ``overlap=True``: copies run beside compute on one channel.

The latency is the time of a 4 KiB copy; the bandwidth is the extra bytes of a larger copy
over its extra time. Each figure is the best of a few repetitions.
"""

from __future__ import annotations

import threading
import time
import warnings
from dataclasses import asdict, dataclass

import torch

from ..cost import machine
from ..errors import OffloadError

_METHOD_VERSION = 2  # 2: the file store checksums beside its copies
_SMALL = 4096
_LARGE = {"file": 8 * 2**20, "pinned": 64 * 2**20}
_REPEATS = 3

_MEMO: dict[str, "TransferCosts"] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class TransferCosts:
    d2h_bytes_per_s: float  # device -> offload tier
    h2d_bytes_per_s: float  # offload tier -> device
    latency_s: float  # fixed time of one copy
    overlap: bool  # copies run beside compute (True) or block it (False)
    store: str  # "file" or "pinned"

    def as_meta(self) -> dict:
        """The form of ``graph.meta["transfer"]``."""
        return asdict(self)


def default_store(device: torch.device | str) -> str:
    return "pinned" if torch.device(device).type == "cuda" else "file"


def transfer_costs(device: torch.device | str = "cpu", store: str | None = None, *,
                   refresh: bool = False) -> TransferCosts:
    """The transfer costs of ``device`` with offload ``store`` (default: pinned on CUDA, file
    elsewhere), measured once per machine and cached; ``refresh=True`` measures again."""
    dev = machine._normalize_device(device)
    store = store or default_store(dev)
    key = {**machine.cache_key(dev, _METHOD_VERSION), "store": store}
    if store == "file":
        from .offload import offload_directory

        key["temp_dir"] = offload_directory()  # where the store writes: $REMAT_OFFLOAD_DIR or TMPDIR
    path = machine.cache_dir() / f"transfer-{machine.key_hash(key)}.json"
    with _LOCK:
        if not refresh:
            if str(path) in _MEMO:
                return _MEMO[str(path)]
            costs = _load(path, key)
            if costs is not None:
                _MEMO[str(path)] = costs
                return costs
        t0 = time.perf_counter()
        try:
            with machine._disable_current_modes():  # may be called under AOTAutograd's fake mode
                costs = _measure(dev, store)
        except (OSError, OffloadError) as err:  # e.g. a temporary folder with no room for the test copies
            costs = _conservative(store)
            warnings.warn(
                f"remat could not measure the {store} offload store's bandwidth ({err}); plans assume a slow "
                f"{costs.d2h_bytes_per_s / 1e6:.0f} MB/s each way instead, so they offload only where that "
                "still pays. Free space in the temporary folder (TMPDIR) to have it measured.",
                stacklevel=2,
            )
            _MEMO[str(path)] = costs  # for this process only: the next one measures again
            return costs
        data = {"key": key, "transfer": asdict(costs), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "measurement_seconds": round(time.perf_counter() - t0, 3)}
        machine.write_json_atomic(path, data, "its transfer cost cache", "the measurement will be repeated in the next process")
        _MEMO[str(path)] = costs
        return costs


def _conservative(store: str) -> TransferCosts:
    """Costs to plan with when the store cannot be measured: slow, synchronous copies (a tenth of a
    spinning disk's bandwidth for files), so that a plan offloads only where that still pays."""
    rate = 10e6 if store == "file" else 1e9
    return TransferCosts(rate, rate, 1e-3, overlap=False, store=store)


def _load(path, key) -> TransferCosts | None:
    t = machine.read_json_entry(path, key, "transfer")
    if t is None:
        return None
    try:
        costs = TransferCosts(float(t["d2h_bytes_per_s"]), float(t["h2d_bytes_per_s"]), float(t["latency_s"]),
                              bool(t["overlap"]), str(t["store"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (costs.d2h_bytes_per_s > 0 and costs.h2d_bytes_per_s > 0 and costs.latency_s >= 0):
        return None
    return costs


def _measure(dev: torch.device, store_kind: str) -> TransferCosts:
    from .offload import OffloadStore

    store = OffloadStore(store_kind)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def one_round(nbytes: int) -> tuple[float, float]:
        t = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
        sync()
        t0 = time.perf_counter()
        handle = store.offload(t)
        sync()
        t1 = time.perf_counter()
        back = store.reload(handle)
        back = store.wait(handle, back)
        sync()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    try:
        one_round(_SMALL)  # warm up (file creation paths, pinned allocator, streams)
        small = [one_round(_SMALL) for _ in range(_REPEATS)]
        large = [one_round(_LARGE[store_kind]) for _ in range(_REPEATS)]
    finally:
        store.close()
    lat_out, lat_in = min(s[0] for s in small), min(s[1] for s in small)
    extra = _LARGE[store_kind] - _SMALL
    out_s = max(min(s[0] for s in large) - lat_out, 1e-9)
    in_s = max(min(s[1] for s in large) - lat_in, 1e-9)
    return TransferCosts(
        d2h_bytes_per_s=extra / out_s,
        h2d_bytes_per_s=extra / in_s,
        latency_s=(lat_out + lat_in) / 2,
        overlap=store_kind == "pinned",
        store=store_kind,
    )


def make_transfer_meta(device: torch.device | str = "cpu", store: str | None = None) -> dict:
    """``graph.meta["transfer"]`` for ``device``: the measured (cached) costs of its offload store."""
    return transfer_costs(device, store).as_meta()


__all__ = ["TransferCosts", "transfer_costs", "default_store", "make_transfer_meta"]

"""Offload stores: the second memory tier an offloading plan moves saved values to and back.

``offload(v)`` in a plan lowers to ``h = offload(store_id, v)`` and ``reload(v)`` to
``t = reload(store_id, h)``, then ``t = wait(store_id, h, t)`` right before the first op that
reads t (so that on CUDA the copy overlaps the ops in between).

The handle h is a 0-d int64 CPU tensor holding the entry's key in its store. A tensor, because
AOTAutograd hands the backward what the forward saved as tensors (``save_for_backward``) in the
boxed calling convention; a value offloaded when the forward ends is saved as its handle, and
the backward reloads it. Its 8 bytes live in numpy's memory, not torch's allocator: they are the
store's bookkeeping, like its entries, not step memory (made by ``torch.tensor``, one handle per
value out counted on the CPU: a hybrid plan measured 72 bytes over its budget). Entries are
cleaned up when the handle tensor dies: after the reload (the backward drops it), or when
autograd frees the forward's saved tensors because the step was abandoned (an exception after
the forward, a graph dropped without backward). The store's
private folder (one per lowered graph, made with tempfile.mkdtemp) exists only while it holds
entries: it is made by the first offload and removed with the last entry, so nothing is left on
disk between steps, whoever keeps the compiled graphs alive (Dynamo's caches do); it is also
removed when the store is garbage collected and at interpreter exit (weakref.finalize).

A process killed mid-step (SIGKILL, the OOM killer) cannot remove its folder. So each folder is
named after its owner (``remat-offload-<pid>-...``) and holds a lock file the owner keeps locked
(``flock``) while the folder lives; the kernel drops the lock when the process dies. The first
folder a process makes in a directory is preceded by a sweep of that directory
(:func:`remove_orphans`) that removes the folders whose lock is free; ``remat clean`` sweeps on
request, older remat's unlocked folders included.

Stores are found by an integer id (FX code cannot carry arbitrary objects as arguments); the
registry holds them weakly, the lowered GraphModules hold them strongly.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import tempfile
import threading
import warnings
import weakref
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy
import torch

try:
    import fcntl
except ImportError:  # not POSIX: orphans are found by their owner's pid alone
    fcntl = None

from ..cost.machine import process_running
from ..errors import OffloadError

FILE_STORE = "file"
PINNED_STORE = "pinned"
# The file store checks what it reads back against a CRC-32 of each CHECK_CHUNK_BYTES of what it
# wrote. The checksums run on CHECK_THREADS threads beside the copy itself (zlib releases the GIL).
# Computed after the copy (CRC-32 at ~7 GB/s, page-cache writes at ~5 GB/s and reads at 5-20 GB/s),
# they held offloads to 3.0-3.4 GB/s instead of 4.6-5.8 and reloads to 3.8-4.2 instead of 3.9-4.7
# (measured on a 2-core machine, cost/transfer.py's method).
CHECK_CHUNK_BYTES = 2**20
CHECK_THREADS = max(1, min(4, os.cpu_count() or 1))
_CHECKERS: ThreadPoolExecutor | None = None
_CHECKERS_LOCK = threading.Lock()


def _checkers() -> ThreadPoolExecutor:
    """The threads that checksum file-store copies, started on first use."""
    global _CHECKERS
    with _CHECKERS_LOCK:
        if _CHECKERS is None:
            _CHECKERS = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="remat-offload-crc")
        return _CHECKERS


def _forget_checkers_after_fork() -> None:
    """A forked child (a DataLoader worker, say) has none of its parent's threads: it starts its own."""
    global _CHECKERS, _CHECKERS_LOCK
    _CHECKERS, _CHECKERS_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_checkers_after_fork)


def _chunks(buf) -> list[memoryview]:
    view = memoryview(buf).cast("B")
    return [view[i:i + CHECK_CHUNK_BYTES] for i in range(0, len(view), CHECK_CHUNK_BYTES)]


def _checksum(pool: ThreadPoolExecutor | None, chunk: memoryview):
    """A future of ``chunk``'s CRC-32: on ``pool``, or computed now when there is none."""
    if pool is None:
        done = Future()
        done.set_result(zlib.crc32(chunk))
        return done
    return pool.submit(zlib.crc32, chunk)


def _pool_for(chunks: list) -> ThreadPoolExecutor | None:
    """The checksum threads, where there is more than one chunk to check."""
    return _checkers() if len(chunks) > 1 else None


_STORES: "weakref.WeakValueDictionary[int, OffloadStore]" = weakref.WeakValueDictionary()
_STORE_IDS = itertools.count(1)


@dataclass
class _Entry:
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device
    extent: int  # elements of the storage span the tensor covers
    nbytes: int
    path: str | None = None  # file store
    crcs: list = field(default_factory=list)  # file store: CRC-32 of each CHECK_CHUNK_BYTES
    host: torch.Tensor | None = None  # pinned store: the host copy
    done: object = None  # pinned store: CUDA event recorded after the copy


class OffloadStore:
    """Where offloaded tensors live between ``offload`` and ``reload``.

    ``kind="file"`` (the CPU default, usable on any device): each tensor's bytes go to a file in a
    private temporary folder, with their size and CRC-32s (one per ``CHECK_CHUNK_BYTES``, computed
    on ``CHECK_THREADS`` threads while the bytes are written and read) checked when read back; reads
    and writes are synchronous. ``kind="pinned"`` (CUDA): copies to pinned host buffers on a side
    stream; the device tensor is marked used by that stream (``record_stream``), so the caching
    allocator never reuses it before the copy has read it, and the reload's consumer waits on the
    copy's event.
    """

    def __init__(self, kind: str = FILE_STORE, dir: str | None = None):
        """``dir``: where the private folders are made (see :func:`offload_directory`)."""
        if kind not in (FILE_STORE, PINNED_STORE):
            raise ValueError(f"unknown offload store {kind!r}; use {FILE_STORE!r} or {PINNED_STORE!r}")
        self.kind = kind
        self.dir = offload_directory(dir) if kind == FILE_STORE else dir
        self.id = next(_STORE_IDS)
        self.entries: dict[int, _Entry] = {}
        self._keys = itertools.count()
        self._lock = threading.RLock()  # a handle finalizer may run (gc) while it is held
        self._streams: dict = {}
        self.folder: str | None = None  # the private folder, while entries live
        self._finalizer = None
        _STORES[self.id] = self

    def __deepcopy__(self, memo):  # graph copies share the store: it is a run-time resource
        return self

    def close(self) -> None:
        """Drop every entry and remove the folder (also done at garbage collection and exit)."""
        with self._lock:
            self.entries.clear()
            self._remove_folder()

    def files(self) -> list[str]:
        """Offload files now in the store's folder (for tests and diagnostics; not its lock file)."""
        if self.folder is None or not os.path.isdir(self.folder):
            return []
        return sorted(f for f in os.listdir(self.folder) if f != LOCK_FILE)

    # ------------------------------------------------------------------ offload / reload
    def offload(self, tensor: torch.Tensor) -> torch.Tensor:
        t = tensor.detach()
        extent = _extent(t)
        entry = _Entry(tuple(t.shape), tuple(t.stride()), t.dtype, t.device, extent, extent * t.element_size())
        with self._lock:
            key = next(self._keys)
            self.entries[key] = entry
        span = torch.as_strided(t, (extent,), (1,), t.storage_offset())  # the storage bytes it covers
        if self.kind == FILE_STORE:
            try:
                self._write(key, entry, span)
            except OSError as err:  # disk full, read-only folder ...: no partial file, the store usable
                self._discard(key)
                where = entry.path or f"a new folder in {self.dir}"
                raise OffloadError(
                    f"remat could not offload {entry.nbytes} bytes to {where}: {err.strerror or err}. "
                    f"Free space there, or move the offload files elsewhere (offload_dir=, {OFFLOAD_DIR_ENV}); "
                    "the step was stopped and its files removed, and the next step can run"
                ) from err
        else:
            stream = self._side_stream(t.device)
            current = torch.cuda.current_stream(t.device)
            stream.wait_stream(current)  # the copy reads t only once the ops writing it are done
            with torch.cuda.stream(stream):
                entry.host = torch.empty(extent, dtype=t.dtype, pin_memory=True)
                entry.host.copy_(span, non_blocking=True)
                entry.done = torch.cuda.Event()
                entry.done.record(stream)
            t.record_stream(stream)  # not reused before the copy has read it
        handle = torch.from_numpy(numpy.array(key, dtype=numpy.int64))  # outside torch's allocator: see above
        weakref.finalize(handle, self._discard, key)
        return handle

    def reload(self, handle: torch.Tensor) -> torch.Tensor:
        key = int(handle)
        with self._lock:
            entry = self.entries.get(key)
        if entry is None:
            raise OffloadError(f"offload store {self.id} has no entry {key}: it was already reloaded or dropped")
        out = torch.empty_strided(entry.shape, entry.stride, dtype=entry.dtype, device=entry.device)
        span = torch.as_strided(out, (entry.extent,), (1,), 0)
        if self.kind == FILE_STORE:
            cpu_span = span if entry.device.type == "cpu" else torch.empty(entry.extent, dtype=entry.dtype)
            self._read(entry, cpu_span)
            if cpu_span is not span:
                span.copy_(cpu_span)
            self._discard(key)
        else:
            stream = self._side_stream(entry.device)
            stream.wait_stream(torch.cuda.current_stream(entry.device))  # out's memory is free to write
            with torch.cuda.stream(stream):
                stream.wait_event(entry.done)
                span.copy_(entry.host, non_blocking=True)
                entry.done = torch.cuda.Event()
                entry.done.record(stream)
            out.record_stream(stream)
        return out

    def wait(self, handle: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (the reload of ``handle``), once its copy has landed (CUDA: the current stream
        waits on the copy's event; the file store's reads are already done)."""
        if self.kind == PINNED_STORE:
            key = int(handle)
            with self._lock:
                entry = self.entries.pop(key, None)
            if entry is not None:
                torch.cuda.current_stream(tensor.device).wait_event(entry.done)
        return tensor

    # ------------------------------------------------------------------ internals
    def _write(self, key: int, entry: _Entry, span: torch.Tensor) -> None:
        """Write ``span``'s bytes to the entry's file (making the private folder first if needed),
        with the CRC-32 of each chunk computed beside the write."""
        with self._lock:
            if self.folder is None:
                self.folder, lock = _make_folder(self.dir)
                self._finalizer = weakref.finalize(self, _remove_folder, self.folder, lock)
            entry.path = os.path.join(self.folder, f"{key}.bin")
        data = span.cpu().view(torch.uint8).numpy() if entry.extent else b""
        chunks = _chunks(data)
        pool = _pool_for(chunks)
        checksums = [_checksum(pool, c) for c in chunks]  # beside the write
        try:
            with open(entry.path, "wb") as f:
                f.write(data)
        finally:
            entry.crcs = [c.result() for c in checksums]  # the checkers are done with data either way

    def _read(self, entry: _Entry, span: torch.Tensor) -> None:
        what = f"offload file {entry.path}"
        try:
            size = os.path.getsize(entry.path)
        except OSError as e:
            raise OffloadError(f"{what} is missing ({e.strerror}); the step cannot continue without it") from e
        if size != entry.nbytes:
            raise OffloadError(f"{what} is corrupt: {size} bytes instead of {entry.nbytes}")
        if entry.extent:
            chunks = _chunks(span.view(torch.uint8).numpy())
            pool = _pool_for(chunks)
            checksums, complete = [], True
            with open(entry.path, "rb") as f:
                for chunk in chunks:  # each chunk's checksum runs while the next one is read
                    complete = complete and f.readinto(chunk) == len(chunk)
                    checksums.append(_checksum(pool, chunk))
            if not complete or [c.result() for c in checksums] != entry.crcs:
                raise OffloadError(f"{what} is corrupt: its checksum does not match what was written")

    def _discard(self, key: int) -> None:
        with self._lock:
            entry = self.entries.pop(key, None)
            if entry is not None and entry.path is not None:
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
            if not self.entries:
                self._remove_folder()

    def _remove_folder(self) -> None:  # under self._lock
        if self._finalizer is not None:
            self._finalizer()  # _remove_folder(folder, lock), once
            self._finalizer = None
        self.folder = None

    def _side_stream(self, device: torch.device):
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]


OFFLOAD_DIR_ENV = "REMAT_OFFLOAD_DIR"
COMPILED_DIRS: dict[int, str] = {}  # a compiled graph's store id -> the offload_dir it was lowered with
_TMPDIR_WARNED: list = []


def offload_directory(dir: str | None = None) -> str:
    """Where the file store makes its folders: ``dir`` (``offload_dir=``), else ``$REMAT_OFFLOAD_DIR``,
    else the temporary directory (``$TMPDIR``). A directory named is made if missing and must be
    writable, or :class:`~remat.errors.OffloadError` says so; a ``$TMPDIR`` Python cannot use (it
    then falls back to another temporary directory) is said in a warning."""
    source = "offload_dir"
    if not dir and os.environ.get(OFFLOAD_DIR_ENV, "").strip():
        dir, source = os.environ[OFFLOAD_DIR_ENV].strip(), f"${OFFLOAD_DIR_ENV}"
    if dir:
        try:
            os.makedirs(dir, exist_ok=True)
        except OSError as err:
            raise OffloadError(f"{source} {dir!r} cannot be made ({err.strerror or err}): name a writable "
                               "directory for the offloaded activations") from err
        if not (os.path.isdir(dir) and os.access(dir, os.W_OK | os.X_OK)):
            raise OffloadError(f"{source} {dir!r} is not a writable directory: name one for the offloaded activations")
        return os.path.abspath(dir)
    base = tempfile.gettempdir()
    wanted = os.environ.get("TMPDIR")
    if wanted and os.path.realpath(wanted) != os.path.realpath(base) and not _TMPDIR_WARNED:
        _TMPDIR_WARNED.append(True)
        warnings.warn(f"TMPDIR={wanted!r} is not a writable directory: remat's offload files go to {base} "
                      f"instead. Set {OFFLOAD_DIR_ENV} (or offload_dir=) to choose where they go.", stacklevel=2)
    return base


FOLDER_PREFIX = "remat-offload-"
LOCK_FILE = ".owner.lock"
_OWNED = re.compile(re.escape(FOLDER_PREFIX) + r"(\d+)-")
_SWEPT: set[str] = set()  # directories this process has swept
_SWEEP_LOCK = threading.Lock()


def _make_folder(base: str) -> tuple[str, int | None]:
    """A new private folder in ``base``, named after this process and locked by it, after a sweep of
    ``base``'s orphans (once per directory and process)."""
    with _SWEEP_LOCK:
        if base not in _SWEPT:
            _SWEPT.add(base)
            remove_orphans(base)
    folder = tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-", dir=base)
    lock = None
    if fcntl is not None:
        try:
            lock = os.open(os.path.join(folder, LOCK_FILE), os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(lock, fcntl.LOCK_EX)  # held while the folder lives; dropped by the kernel if we die
        except OSError:
            _remove_folder(folder, lock)
            raise
    return folder, lock


def _remove_folder(folder: str, lock: int | None) -> None:
    shutil.rmtree(folder, ignore_errors=True)  # before the lock goes: no sweeper sees it unlocked and full
    if lock is not None:
        os.close(lock)


def _owner_gone(folder: str, name: str, unknown_too: bool) -> bool:
    """Whether no live process owns ``folder``: its lock file is free, or (no lock file) the pid in
    its name is not running. A folder of an older remat (no pid, no lock) counts only with
    ``unknown_too``."""
    lock_path = os.path.join(folder, LOCK_FILE)
    if fcntl is not None and os.path.exists(lock_path):
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True  # free: its owner died (a second sweeper removing it too is harmless)
        except OSError:
            return False  # locked: its owner lives (this process's own folders included)
        finally:
            os.close(fd)
    owned = _OWNED.match(name)
    if owned is None:
        return unknown_too
    return not process_running(int(owned.group(1)))  # running: the folder may be in the making


def remove_orphans(dir: str | None = None, *, unknown_too: bool = False) -> list[tuple[str, int]]:
    """Remove the offload folders in ``dir`` (default: where stores write, :func:`offload_directory`)
    whose owner process is gone, and, with ``unknown_too``, those of older remat versions whose owner
    cannot be known. Returns ``(folder, bytes)`` for each folder removed. Live processes' folders stay."""
    base = dir or offload_directory()
    removed = []
    try:
        names = [n for n in os.listdir(base) if n.startswith(FOLDER_PREFIX)]
    except OSError:
        return removed
    for name in names:
        folder = os.path.join(base, name)
        if os.path.isdir(folder) and not os.path.islink(folder) and _owner_gone(folder, name, unknown_too):
            size = sum(e.stat().st_size for e in os.scandir(folder) if e.is_file(follow_symlinks=False))
            shutil.rmtree(folder, ignore_errors=True)
            if not os.path.exists(folder):
                removed.append((folder, size))
    return removed


def _extent(t: torch.Tensor) -> int:
    """Elements of the storage span ``t`` covers (its numel when dense)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))


def _store(store_id: int) -> OffloadStore:
    store = _STORES.get(store_id)
    if store is None:
        raise OffloadError(f"offload store {store_id} no longer exists (its compiled graph was deleted)")
    return store


def offload(store_id: int, tensor: torch.Tensor) -> torch.Tensor:
    """Copy ``tensor`` into offload store ``store_id``; return its handle (a 0-d int64 tensor).
    The caller drops ``tensor`` right after (boxed calling convention)."""
    return _store(store_id).offload(tensor)


def reload(store_id: int, handle: torch.Tensor) -> torch.Tensor:
    """The tensor behind ``handle``, with its shape, strides and dtype, on its device; raises
    :class:`~remat.errors.OffloadError` if its file is missing or corrupt."""
    return _store(store_id).reload(handle)


_COMPILED_STORES: dict[int, "OffloadStore"] = {}


def compiled_store(store_id: int, kind: str) -> "OffloadStore":
    """The store a compiled graph names by ``store_id`` (a random 62-bit number chosen when the graph
    was lowered), made on first use and kept for the process: compiled code holds no object, and
    Inductor's caches may serve the graph to another process, so the id is all it carries. A store
    empty between steps holds no folder."""
    store = _COMPILED_STORES.get(store_id)
    if store is None:
        store = _COMPILED_STORES[store_id] = OffloadStore(kind, dir=COMPILED_DIRS.get(store_id))
    return store


def reload_now(store: "OffloadStore", handle: torch.Tensor) -> torch.Tensor:
    """``store.reload``, then ``store.wait``: the tensor, its copy landed (compiled graphs, where
    the reload is one operator)."""
    return store.wait(handle, store.reload(handle))


def wait(store_id: int, handle: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` once its reload copy has landed (a no-op for the file store)."""
    return _store(store_id).wait(handle, tensor)

"""The measured cost model (``cost_model="profile"``): time each op on the real device.

Every distinct op signature — (op, input shapes, strides, dtypes, devices, constant
arguments), as in :mod:`remat.cost.workspace` — is run on real tensors of those shapes::

    seconds(node) = median over samples of (time of `inner` back-to-back calls) / inner

after one warm-up call. ``inner`` makes one sample last at least ~0.1 ms (CPU) or ~1 ms
(CUDA, where the device is synchronized around each sample), and the number of samples
is as many as fit in ``max_seconds`` (default 20 ms), at least 3 and at most ``repeats``.
Back-to-back calls measure what a graph pays for the op: launch/dispatch overhead for tiny
ops, kernel time for big ones.

Both are set from the faster of two single calls, never from one: on a busy CPU one call
in a few hundred is preempted for a scheduler slice (a 0.2 ms convolution measured
20 ms), and a plan made on such a number keeps it, cached on disk. Ops slower than
``max_seconds`` take three samples (the two calls and one more: up to 0.75 s for one op); ops
slower than ``LONG_OP_SECONDS`` (0.25 s) take the two calls and keep the faster; with
``repeats`` below 3, the faster of the samples taken counts.

Inputs: floats standard normal, bools random, integers uniform in ``[0, bound)`` where
``bound`` is the size an index must stay below (:func:`index_bound`: the embedding's
rows, the class dimension of ``nll_loss``, ``self.shape[dim]`` for ``gather``/``scatter``/
``index_*``, ...); for an op not in that table, the smallest dimension of its floating
point inputs (0 when it has none: all zeros), which is in range for any index into them.
Random ops run inside ``torch.random.fork_rng``, everything under ``torch.no_grad()``.

Costing nothing: views, ``getitem``, metadata ops and ``empty*`` (as in the flops model),
and ops that read and return no tensor. Falling back to the flops model's estimate
(:class:`~remat.cost.flops.FlopsCostModel`): an op that raises on the made-up inputs (one
warning per op) and non-ATen callables on tensors (higher-order ops, which cannot run alone).

Timings are cached in-process and on disk, in one JSON file per (device kind, device
name, torch threads, torch version) under :func:`remat.cost.machine.cache_dir`
(``$XDG_CACHE_HOME/remat``), keyed by the signature, so that later processes plan with the
very same numbers. Writes are atomic (temporary file + ``os.replace``) and merge with what
other processes wrote; a corrupt file is ignored with a warning and then rewritten.

Example::

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from remat.cost.profile import ProfileCostModel
    >>> gm = make_fx(lambda a, b: (a @ b).t(), tracing_mode="fake")(
    ...     torch.randn(64, 32), torch.randn(32, 16))
    >>> mm, t = [n for n in gm.graph.nodes if n.op == "call_function"]
    >>> model = ProfileCostModel("cpu")
    >>> model.node_seconds(mm) > 0, model.node_seconds(t)     # timed once, then cached
    (True, 0.0)
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from . import machine
from .flops import costs_nothing, fake_args, tensors_of
from .workspace import materialize, op_signature

__all__ = ["ProfileCostModel", "index_bound"]

aten = torch.ops.aten

# Bump when the timing procedure changes, so old cache files are not reused.
_METHOD_VERSION = 2  # 2: the sampling is set from the faster of two calls (1 kept one preempted call)

# an op slower than this is timed by two single calls, the faster kept (no third sample)
LONG_OP_SECONDS = 0.25

# cache file path -> {signature: seconds}, shared by all ProfileCostModel instances
_MEMO: dict[str, dict[str, float]] = {}
# signature -> error, for ops that could not be timed in this process
_FAILED: dict[str, str] = {}
_WARNED: set[str] = set()
_LOCK = threading.RLock()


# ----------------------------------------------------------------------------- integer inputs


def _dim(self, dim, *_, **__) -> int:
    return self.shape[dim]


def _classes(x) -> int:  # nll_loss input: (C) or (N, C, ...)
    return x.shape[0] if x.dim() == 1 else x.shape[1]


def _indexed(self, indices, *_, **__) -> int:
    return min(self.shape[i] for i, ix in enumerate(indices) if ix is not None)


# op packet -> f(*fake args, **fake kwargs) -> exclusive bound of its integer tensor inputs
_INDEX_BOUNDS: dict = {
    aten.embedding: lambda weight, *_, **__: weight.shape[0],
    aten.embedding_dense_backward: lambda grad, indices, num_weights, *_, **__: num_weights,
    aten.nll_loss_forward: lambda self, *_, **__: _classes(self),
    aten.nll_loss2d_forward: lambda self, *_, **__: _classes(self),
    aten.nll_loss_backward: lambda grad, self, *_, **__: _classes(self),
    aten.nll_loss2d_backward: lambda grad, self, *_, **__: _classes(self),
    aten.max_pool2d_with_indices_backward: lambda grad, self, *_, **__: math.prod(self.shape[-2:]),
    aten.max_pool3d_with_indices_backward: lambda grad, self, *_, **__: math.prod(self.shape[-3:]),
    aten.take: lambda self, *_, **__: self.numel(),
    aten.index: _indexed,
    aten._unsafe_index: _indexed,
    aten.index_put: _indexed,
    aten._unsafe_index_put: _indexed,
    **{op: _dim for op in (
        aten.gather, aten.scatter, aten.scatter_add, aten.scatter_reduce, aten.index_select,
        aten.index_add, aten.index_copy, aten.index_fill, aten.index_reduce,
    )},
}


def index_bound(node: fx.Node) -> int:
    """Integer tensor inputs of ``node`` are drawn from ``[0, index_bound(node))`` (zeros if <= 1).

    The indexed size for indexing ops that remat knows (embedding, nll_loss, gather, scatter,
    index_*, max-pool backward, ...); otherwise the smallest dimension of the node's floating
    point inputs, or 0 when it has none.
    """
    args, kwargs = fake_args(node)
    rule = _INDEX_BOUNDS.get(getattr(node.target, "overloadpacket", None))
    if rule is not None:
        try:
            return int(rule(*args, **kwargs))
        except Exception:  # an unexpected argument layout: use the generic rule
            pass
    dims = [int(d) for t in tensors_of((args, kwargs)) if t.is_floating_point() for d in t.shape]
    return min((d for d in dims if d >= 1), default=0)


# ----------------------------------------------------------------------------- the model


class ProfileCostModel:
    """Measured seconds of ATen op nodes on ``device`` (see the module docstring).

    ``repeats``: most timed samples per signature; ``max_seconds``: time to spend on the
    samples of one signature; ``cache_dir``: where the JSON cache lives (default
    :func:`remat.cost.machine.cache_dir`); ``fallback``: ``fx_node -> seconds`` for nodes that
    cannot be timed (default: the flops model of ``device``, made when first needed).
    """

    name = "profile"

    def __init__(
        self,
        device: torch.device | str = "cpu",
        *,
        repeats: int = 15,
        max_seconds: float = 0.02,
        cache_dir: str | os.PathLike | None = None,
        fallback: Callable[[fx.Node], float] | None = None,
    ):
        self.device = torch.device(device)
        self.repeats = max(1, int(repeats))
        self.max_seconds = float(max_seconds)
        self._fallback = fallback
        self.key = _cache_key(self.device)
        base = Path(cache_dir) if cache_dir is not None else machine.cache_dir()
        self.path = base / f"profile-{machine.key_hash(self.key)}.json"

    def node_seconds(self, node: fx.Node) -> float:
        """Measured (or cached) seconds of one node."""
        if costs_nothing(node):
            return 0.0
        touched = [node.meta.get("val")] + [n.meta.get("val") for n in node.all_input_nodes]
        if not tensors_of(touched):
            return 0.0  # no tensor in or out: SymInt arithmetic and the like
        if not isinstance(node.target, torch._ops.OpOverload):
            return self.fallback(node)  # a higher-order op: cannot be run alone
        sig = repr(op_signature(node))
        with _LOCK:
            memo = self._memo()
            if sig in memo:
                return memo[sig]
            if sig not in _FAILED:
                try:
                    # capture runs under AOTAutograd's fake mode: time real tensors
                    with _disable_current_modes():
                        seconds = self._time(node)
                except Exception as err:  # an op that rejects made-up inputs
                    _FAILED[sig] = f"{type(err).__name__}: {err}"
                else:
                    memo[sig] = seconds
                    self._store()
                    return seconds
        op = str(node.target)
        if op not in _WARNED:
            _WARNED.add(op)
            warnings.warn(
                f"remat could not time {op} on made-up inputs ({_FAILED[sig]}); "
                "using the flops model's estimate for it", RuntimeWarning, stacklevel=2,
            )
        return self.fallback(node)

    def fallback(self, node: fx.Node) -> float:
        if self._fallback is None:
            from .flops import FlopsCostModel

            self._fallback = FlopsCostModel(device=self.device).node_seconds
        return float(self._fallback(node))

    # ------------------------------------------------------------------------- timing

    def _time(self, node: fx.Node) -> float:
        bound = index_bound(node)
        real: dict[fx.Node, torch.Tensor] = {}

        def to_real(n: fx.Node):
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor):
                if n not in real:
                    real[n] = materialize(val, bound)
                return real[n]
            return val

        op = node.target
        fakes = tensors_of([node.meta.get("val")] + [n.meta.get("val") for n in node.all_input_nodes])
        cuda = sorted({t.device.index or 0 for t in fakes if t.device.type == "cuda"})
        # drawing the inputs and running random ops both leave the generators as they were
        with torch.random.fork_rng(devices=cuda), torch.no_grad():
            args, kwargs = fx.map_arg(node.args, to_real), fx.map_arg(node.kwargs, to_real)

            def batch(inner: int) -> float:
                """Seconds per call of ``inner`` back-to-back calls."""
                for i in cuda:
                    torch.cuda.synchronize(i)
                t0 = time.perf_counter()
                for _ in range(inner):
                    op(*args, **kwargs)
                for i in cuda:
                    torch.cuda.synchronize(i)
                return (time.perf_counter() - t0) / inner

            batch(1)  # warm-up: lazy initialisation, first touch of memory
            probes = [batch(1), batch(1)]
            first = min(probes)  # a call preempted by another process must not set the sampling
            if first > LONG_OP_SECONDS:
                return first
            min_sample = 1e-3 if cuda else 1e-4
            inner = min(1000, max(1, math.ceil(min_sample / max(first, 1e-9))))
            fits = int(self.max_seconds / max(first * inner, 1e-9))
            n = min(self.repeats, max(fits, 3))
            samples = probes if inner == 1 else []
            while len(samples) < n:
                samples.append(batch(inner))
        return float(statistics.median(samples) if len(samples) >= 3 else min(samples))

    # ------------------------------------------------------------------------- disk cache

    def _memo(self) -> dict[str, float]:
        memo = _MEMO.get(str(self.path))
        if memo is None:
            memo = _MEMO[str(self.path)] = self._load(warn=True)
        return memo

    def _load(self, warn: bool) -> dict[str, float]:
        try:
            with open(self.path) as f:
                data = json.load(f)
            if data["key"] != self.key:
                return {}  # another machine's file under the same hash: start afresh
            return {str(k): float(v) for k, v in data["seconds"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            if warn:
                warnings.warn(
                    f"remat ignores its corrupt profile cache {self.path} ({e}); it will be rewritten",
                    RuntimeWarning, stacklevel=4,
                )
            return {}

    def _store(self) -> None:
        """Merge this process's timings into the file (what others wrote is kept) atomically."""
        memo = self._memo()
        for sig, seconds in self._load(warn=False).items():
            memo.setdefault(sig, seconds)
        data = {"key": self.key, "seconds": dict(sorted(memo.items()))}
        machine.write_json_atomic(self.path, data, "its profile cache", "ops will be timed again in the next process")

    def __repr__(self) -> str:
        return f"ProfileCostModel({self.key['device_name']!r}, cache={str(self.path)!r})"


def _cache_key(dev: torch.device) -> dict:
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = machine.cache_key(dev, _METHOD_VERSION)
    if dev.type not in ("cpu", "cuda"):
        key["device_name"] = str(dev)
    return key

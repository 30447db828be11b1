"""Workspace: the memory an op allocates and frees inside itself, measured once per op signature.

Some kernels need scratch memory beyond their outputs: a CPU convolution's column
buffer, ``native_dropout``'s float noise before it becomes a bool mask, an attention
backward's intermediates. The simulator counts it at the op (``Node.workspace``), so a
plan whose peak falls on such an op is predicted honestly.

It is measured, not guessed: for each distinct (op, shapes, strides, dtypes, constant
arguments, device) the op runs once on real tensors of the right shapes (floats random,
integers zero — a valid index for every indexing op — bools random) and::

    workspace = peak memory growth during the op - bytes of its outputs

with peak growth from :func:`remat.measure.peak_memory_growth` (the allocator's own
accounting: CUDA memory statistics, or torch's CPU allocator events).
Every op is probed, small ones too: a CPU convolution on a 32 KiB input allocates 140 KiB of
reordered copies, more than its output, and the budget is a guarantee, so no size is "too
small to matter". The probes cost little (a few seconds on a GPT-2 step: one per distinct
signature) and results are cached per process.
Random ops run inside ``torch.random.fork_rng``, so probing leaves the generators as they were.
"""

from __future__ import annotations

import warnings

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from ..measure import allocated_bytes

_CACHE: dict[tuple, int] = {}


def _tensors_in(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _tensors_in(y)]
    return []


def _describe(x):
    if isinstance(x, fx.Node):
        val = x.meta.get("val")
        if isinstance(val, torch.Tensor):
            return ("T", tuple(val.shape), tuple(val.stride()), str(val.dtype), str(val.device))
        return ("N", repr(val))
    if isinstance(x, (tuple, list)):
        return tuple(_describe(y) for y in x)
    return repr(x)


def op_signature(node: fx.Node) -> tuple:
    return (str(node.target), _describe(node.args), _describe(tuple(sorted(node.kwargs.items()))))


def materialize(val: torch.Tensor, high: int = 0) -> torch.Tensor:
    """A real tensor with ``val``'s shape, strides (expanded ones too) and dtype.

    Floats are standard normal, bools random; integers are drawn uniformly from
    ``[0, high)``, or are all zero when ``high <= 1``.
    """
    span = 1 + val.storage_offset() + sum((s - 1) * st for s, st in zip(val.shape, val.stride()) if s > 0)
    base = torch.empty(span if val.numel() else 0, dtype=val.dtype, device=val.device)
    if base.is_floating_point() or base.is_complex():
        base.normal_()
    elif base.dtype == torch.bool:
        base.random_(0, 2)
    elif high > 1:
        base.random_(0, min(high, torch.iinfo(base.dtype).max))
    else:
        base.zero_()
    return base.as_strided(tuple(val.shape), tuple(val.stride()), val.storage_offset())


def _distinct_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        try:
            key = t.untyped_storage().data_ptr()
            size = t.untyped_storage().nbytes()
        except Exception:
            key, size = id(t), t.numel() * t.element_size()
        if key not in seen:
            seen.add(key)
            total += allocated_bytes(size, t.device)
    return total


def node_workspace(node: fx.Node) -> int:
    """Bytes of scratch memory ``node``'s op needs beyond its outputs (0 for views and non-ATen calls)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return 0
    if node.target.is_view:
        return 0
    key = op_signature(node)
    if key not in _CACHE:
        # the partition function runs under AOTAutograd's fake mode: probe with real tensors
        with _disable_current_modes():
            _CACHE[key] = _probe(node)
    return _CACHE[key]


def _probe(node: fx.Node) -> int:
    from ..measure import peak_memory_growth

    real: dict[fx.Node, torch.Tensor] = {}

    def to_real(n: fx.Node):
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            if n not in real:
                real[n] = materialize(val)
            return real[n]
        return val

    op = node.target
    try:
        args = fx.map_arg(node.args, to_real)
        kwargs = fx.map_arg(node.kwargs, to_real)
        device = next((t.device for t in _tensors_in(list(real.values()))), torch.device("cpu"))
        devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            op(*args, **kwargs)  # warm-up: lazy initialisation is not workspace
            peak, out = peak_memory_growth(lambda: op(*args, **kwargs), device, collect_garbage=False)
    except Exception as err:  # an op that rejects made-up inputs: say so, assume none
        warnings.warn(f"remat could not measure the workspace of {op} ({err}); assuming none", stacklevel=2)
        return 0
    inputs = {t.untyped_storage().data_ptr() for t in real.values()}
    produced = [t for t in _tensors_in(out) if t.untyped_storage().data_ptr() not in inputs]
    workspace = peak - _distinct_bytes(produced)
    return max(0, int(workspace))

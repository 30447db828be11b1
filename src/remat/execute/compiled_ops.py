"""Random-op replay, offloading and split running totals as registered PyTorch operators, for graphs a
compiler (Inductor) compiles.

The eager lowering calls plain Python functions (:func:`remat.execute.runtime.rng_state`,
:func:`remat.execute.runtime.replay_random`); Inductor compiles only registered operators, so a plan
lowered for Inductor runs every random op through two custom operators instead:

* ``remat::random_run(device, call, tensors, after, keep_state) -> [token, state, *outputs]`` -- the
  op's first run: read the generator state (empty when the plan never replays the op: ``keep_state``
  false), then run the op (drawing from the generator as usual);
* ``remat::random_replay(state, device, call, tensors) -> outputs`` -- a recomputation: run the op
  with the generator set to ``state``, then put the current state back.

``call`` is the op and its non-tensor arguments written as JSON (tensors by their index in
``tensors``), so that a compiled graph is self-contained: Inductor's on-disk caches can serve it
in another process. ``after`` lists the (empty) token of the previous first run in the same graph: that
data dependency keeps the generator draws in the order of the uncompiled graph, whatever order a
compiler picks for independent kernels. The operators are opaque to the compiler (it calls them
as they are), and they are never merged, since no two have the same arguments.

Offloads and reloads are ``remat::offload`` and ``remat::reload``; a split weight gradient's running total
is summed with ``remat::addmm`` (:func:`addmm`).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import torch

from .runtime import set_rng_state, rng_state

_TENSOR, _DTYPE, _DEVICE, _LAYOUT, _FORMAT, _LIST, _TUPLE = "t", "dtype", "device", "layout", "format", "list", "tuple"


def encode_call(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[str, list]:
    """``(call, tensors)``: ``op(*args, **kwargs)`` as JSON text, its tensor arguments (in FX: the
    argument nodes) in a list, referred to from the text by index."""
    tensors: list = []

    def enc(a):
        if isinstance(a, (torch.fx.Node, torch.Tensor)):
            tensors.append(a)
            return {_TENSOR: len(tensors) - 1}
        if isinstance(a, torch.dtype):
            return {_DTYPE: str(a).removeprefix("torch.")}
        if isinstance(a, torch.device):
            return {_DEVICE: str(a)}
        if isinstance(a, torch.layout):
            return {_LAYOUT: str(a).removeprefix("torch.")}
        if isinstance(a, torch.memory_format):
            return {_FORMAT: str(a).removeprefix("torch.")}
        if isinstance(a, list):
            return {_LIST: [enc(x) for x in a]}
        if isinstance(a, tuple):
            return {_TUPLE: [enc(x) for x in a]}
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        raise TypeError(f"remat cannot replay {op} under a compiler: argument {a!r} of type {type(a).__name__}")

    name = op._schema.name  # "aten::native_dropout"
    text = json.dumps({"op": name, "overload": op._overloadname,
                       "args": [enc(a) for a in args], "kwargs": {k: enc(v) for k, v in kwargs.items()}})
    return text, tensors


@functools.lru_cache(maxsize=4096)
def _parse(call: str) -> tuple[Any, list, dict]:
    """The op, JSON args and JSON kwargs of ``call``, parsed once per distinct text: a graph
    replays the same calls every step, and parsing costs more than a small random op."""
    spec = json.loads(call)
    namespace, name = spec["op"].split("::")
    op = getattr(getattr(getattr(torch.ops, namespace), name), spec["overload"])
    return op, spec["args"], spec["kwargs"]


def _decode(a, tensors: list):
    """One JSON argument of :func:`encode_call` back as a Python value, tensors from ``tensors``.

    A module-level function on purpose: a nested one that calls itself is a reference cycle
    (function, closure cell), and the cycle would hold ``tensors`` -- the op's inputs, activations
    of MiBs -- until Python's cycle collector ran. That kept the inputs of every replayed dropout
    alive past the backward (a 2-layer GPT-2 under Inductor with ``fallback_random``: 27.7 MB
    measured for a 12.1 MB plan)."""
    if isinstance(a, dict):
        (kind, x), = a.items()
        if kind == _TENSOR:
            return tensors[x]
        if kind == _DTYPE:
            return getattr(torch, x)
        if kind == _DEVICE:
            return torch.device(x)
        if kind in (_LAYOUT, _FORMAT):
            return getattr(torch, x)
        if kind == _LIST:
            return [_decode(y, tensors) for y in x]
        return tuple(_decode(y, tensors) for y in x)
    return a


def decode_call(call: str, tensors: list) -> tuple[Any, tuple, dict]:
    """``(op, args, kwargs)`` of ``call`` (from :func:`encode_call`), its tensors taken from ``tensors``."""
    op, args, kwargs = _parse(call)
    return op, tuple(_decode(a, tensors) for a in args), {k: _decode(v, tensors) for k, v in kwargs.items()}


def _outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _empty() -> torch.Tensor:
    """The token (and a state not kept): no bytes."""
    return torch.empty(0, dtype=torch.uint8)


@torch.library.custom_op("remat::random_run", mutates_args=())
def random_run(device: str, call: str, tensors: list[torch.Tensor], after: list[torch.Tensor],
               keep_state: bool = True) -> list[torch.Tensor]:
    # the generator's state is read into a new tensor (no copy of it): the only bytes the plan counts
    # (``rng_state_bytes``, for a node it replays; else empty); the token, empty, orders the next first run
    state = rng_state(device) if keep_state else _empty()
    op, args, kwargs = decode_call(call, tensors)
    return [_empty(), state] + _outputs(op(*args, **kwargs))


@random_run.register_fake
def _random_run_fake(device, call, tensors, after, keep_state=True):
    op, args, kwargs = decode_call(call, tensors)
    state = torch.empty(rng_state(device).numel() if keep_state else 0, dtype=torch.uint8)
    return [_empty(), state] + _outputs(op(*args, **kwargs))


@torch.library.custom_op("remat::random_replay", mutates_args=())
def random_replay(state: torch.Tensor, device: str, call: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    dev = torch.device(device)
    now = rng_state(device)
    set_rng_state(dev, state)
    try:
        op, args, kwargs = decode_call(call, tensors)
        return _outputs(op(*args, **kwargs))
    finally:
        set_rng_state(dev, now)


@random_replay.register_fake
def _random_replay_fake(state, device, call, tensors):
    op, args, kwargs = decode_call(call, tensors)
    return _outputs(op(*args, **kwargs))


# ---------------------------------------------------------------------------------------------
# Offloading: the store's calls as operators. ``store_id`` names the store of one lowered graph
# (:func:`remat.execute.offload.compiled_store`, made on first use), ``kind`` its kind; the reload waits
# for its copy before it returns, so a compiled graph's copies are synchronous (the plan is made
# with ``overlap=False``).


@torch.library.custom_op("remat::offload", mutates_args=())
def offload(store_id: int, kind: str, tensor: torch.Tensor) -> torch.Tensor:
    from .offload import compiled_store

    return compiled_store(store_id, kind).offload(tensor)


@offload.register_fake
def _offload_fake(store_id, kind, tensor):
    return torch.empty((), dtype=torch.int64)


@torch.library.custom_op("remat::reload", mutates_args=())
def reload(store_id: int, kind: str, handle: torch.Tensor, size: list[int], stride: list[int],
           dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    from .offload import compiled_store, reload_now

    return reload_now(compiled_store(store_id, kind), handle)


@reload.register_fake
def _reload_fake(store_id, kind, handle, size, stride, dtype, device):
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------------------
# A running total ``total + a @ b`` (a split weight gradient's chunks) as one opaque ``addmm``. On a GPU,
# Inductor's post-grad pass unfuses an ``aten.addmm`` whose every reader is pointwise into ``mm`` + add
# (``unfuse_bias_add_to_pointwise``); in a chain of totals that reaches back through every link (each
# link's reader becomes a pointwise add), and the adds then fuse into one kernel at the chain's end that
# reads every chunk's product: all of them alive at once (a 2-layer GPT-2 with a 32k vocabulary split
# into 8 chunks measured 35.3 MiB on an H100 for a plan of 11.9 MiB). This operator is the same kernel
# (``torch.addmm``, bitwise), which the compiler calls as it is: each product lives only in its ``addmm``.


@torch.library.custom_op("remat::addmm", mutates_args=())
def addmm(total: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    return torch.addmm(total, mat1, mat2)


@addmm.register_fake
def _addmm_fake(total, mat1, mat2):
    return total.new_empty((mat1.shape[0], mat2.shape[1]))


__all__ = ["encode_call", "decode_call", "random_run", "random_replay", "offload", "reload", "addmm"]

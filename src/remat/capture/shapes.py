"""Symbolic sizes: one joint graph for every input length, made concrete per bucket.

Dynamo captures a step with dynamic shapes once: its joint graph's fake tensors have sizes that
are expressions in symbols (``s0``: the sequence length, ``s1``: the batch ...), and the symbols
themselves are inputs of the graph. remat plans a concrete graph, so for each **bucket** (an upper
edge per symbol, :func:`bucket_edge`) it

1. binds each symbol to its value (:func:`bind_symbols`: from the runtime inputs, or the edges),
2. copies the joint graph and propagates fake tensors of those concrete sizes through the copy
   (:func:`concrete_joint`), so that the capture, the cost models and the lowering read ordinary
   static shapes; the copy's nodes keep the original's names and arguments, so a graph lowered
   from it still computes its view sizes from the symbol inputs and runs at every size,
3. checks that no value of a smaller size in the bucket is larger than at its edge
   (:func:`check_monotone`), which is what makes the edge's plan valid for the whole bucket.

Default buckets: powers of two and the midpoints between them (1, 2, 3, 4, 6, 8, 12, 16, 24, 32,
48, 64, 96, 128, ...): a plan covers sizes up to 1.5x (or 1.33x) its smallest, so a padded-to-the-
edge plan is never asked to hold more than 50% more than the size at hand.
"""

from __future__ import annotations

import bisect
from typing import Iterable, Sequence

import sympy
import torch
import torch.fx as fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from ..errors import CaptureError


def size_expr(x):
    """The sympy expression of a SymInt/SymFloat/SymBool (a plain number as is)."""
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return x.node.expr
    return sympy.sympify(x)


def _sym_vals(val) -> Iterable:
    if isinstance(val, torch.Tensor):
        yield from val.shape
        yield from val.stride()
        yield val.storage_offset()
    elif isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        yield val
    elif isinstance(val, (tuple, list)):
        for v in val:
            yield from _sym_vals(v)


def symbols_of(joint: fx.GraphModule) -> list[sympy.Symbol]:
    """The free size symbols of the joint graph's inputs, sorted by name (``[]``: a static graph)."""
    found: set = set()
    for n in joint.graph.find_nodes(op="placeholder"):
        for x in _sym_vals(n.meta.get("val")):
            if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                found |= size_expr(x).free_symbols
    return sorted(found, key=str)


def is_dynamic(joint: fx.GraphModule) -> bool:
    return bool(symbols_of(joint))


def example_binding(joint: fx.GraphModule) -> dict:
    """``{symbol: value}`` of the example the joint graph was traced with (the shape environment's hints)."""
    binding = {}
    for n in joint.graph.find_nodes(op="placeholder"):
        for x in _sym_vals(n.meta.get("val")):
            if isinstance(x, torch.SymInt):
                shape_env = x.node.shape_env
                hints = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
                for symbol in size_expr(x).free_symbols:
                    hint = hints.get(symbol)
                    if hint is not None:
                        binding[symbol] = int(hint)
    return binding


def symbol_sources(joint: fx.GraphModule) -> list[tuple[int, int | None, sympy.Symbol]]:
    """Where each symbol's value is read at run time: ``(input index, dimension or None, symbol)``,
    None for an input that is the symbol itself; the first source of each symbol only."""
    sources, seen = [], set()
    for i, n in enumerate(joint.graph.find_nodes(op="placeholder")):
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(size_expr(val), sympy.Symbol) and size_expr(val) not in seen:
            seen.add(size_expr(val))
            sources.append((i, None, size_expr(val)))
        elif isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and isinstance(size_expr(size), sympy.Symbol) and size_expr(size) not in seen:
                    seen.add(size_expr(size))
                    sources.append((i, d, size_expr(size)))
    return sources


def bind_symbols(joint: fx.GraphModule, args: Sequence, sources=None) -> dict:
    """``{symbol: value}`` read off the runtime inputs ``args`` (one per placeholder, in order): a
    symbol input's own value, or a tensor dimension whose size is the bare symbol (``sources``:
    :func:`symbol_sources` of ``joint``, computed once by a caller that binds every step)."""
    return {symbol: int(args[i] if d is None else args[i].shape[d])
            for i, d, symbol in (symbol_sources(joint) if sources is None else sources)}


def evaluate(x, binding: dict):
    """``x`` (a SymInt, SymFloat, SymBool or number) at ``binding``: a plain int/float/bool."""
    if not isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return x
    value = sympy.sympify(size_expr(x).xreplace({s: sympy.Integer(v) for s, v in binding.items()}))
    if value.free_symbols:
        raise CaptureError(
            f"remat cannot size {x} from the inputs: it depends on {sorted(map(str, value.free_symbols))}, which "
            "no input fixes (a data-dependent size, e.g. from nonzero() or a mask's sum); make that size static"
        )
    if isinstance(x, torch.SymBool):
        return bool(value)
    return int(value) if isinstance(x, torch.SymInt) else float(value)


DEFAULT_MIN_EDGE = 1


def default_edges(upto: int) -> list[int]:
    """Powers of two and their midpoints (1, 2, 3, 4, 6, 8, 12, ...), ending at the first one >= ``upto``."""
    edges, p = [1, 2, 3], 2
    while edges[-1] < upto:
        p *= 2
        edges += [p, p + p // 2]
    return edges[:bisect.bisect_left(edges, upto) + 1]


def bucket_edge(size: int, edges: Sequence[int] | None = None) -> int:
    """The bucket of ``size``: the smallest edge >= size (``edges``: the user's sorted edges; a size
    above them all, or no edges, takes the default policy's edge)."""
    if edges:
        i = bisect.bisect_left(edges, size)
        if i < len(edges):
            return int(edges[i])
    return default_edges(size)[-1]


def bucket_key(high: dict) -> tuple:
    """``((symbol name, edge), ...)`` of ``{symbol: edge}``, sorted by name: a bucket's key."""
    return tuple((str(s), int(e)) for s, e in sorted(high.items(), key=lambda kv: str(kv[0])))


def bucket_of(binding: dict, edges: Sequence[int] | None = None) -> tuple:
    """The :func:`bucket_key` of the bucket of every symbol's value."""
    return bucket_key({s: bucket_edge(v, edges) for s, v in binding.items()})


def _sizes(key: tuple) -> str:
    return ", ".join(f"{name}={edge}" for name, edge in key)


def refuse_unless_monotone(joint: fx.GraphModule, low: dict, high: dict) -> None:
    """Raise :class:`CaptureError` when a value of ``joint`` holds more bytes at the sizes ``low`` than
    at ``high`` (:func:`check_monotone`): the plan made at the bucket's edge would not hold there."""
    larger = check_monotone(joint, low, high)
    if larger:
        raise CaptureError(
            f"remat cannot plan the bucket up to {_sizes(bucket_key(high))}: {len(larger)} value(s) "
            f"({', '.join(larger[:4])}) hold more memory at the bucket's smallest sizes than at its edge, so its "
            "plan would not hold there; give bucket edges (buckets=[...], or the backend option 'buckets') that "
            "put those sizes in buckets of their own")


def name_bucket(err, key: tuple):
    """``err`` (an :class:`~remat.errors.InfeasibleBudgetError` raised planning the bucket ``key``) saying
    which sizes it is about, with ``err.bucket = {symbol name: edge}``."""
    err.args = (f"at input sizes up to {_sizes(key)} (this bucket; smaller ones may still fit): {err.args[0]}",)
    err.bucket = dict(key)
    return err


def lower_end(edge: int, edges: Sequence[int] | None = None) -> int:
    """The smallest size in the bucket whose edge is ``edge``."""
    user = sorted(edges or ())
    if edge in user:
        i = user.index(edge)
        return user[i - 1] + 1 if i else 1
    below = [e for e in default_edges(edge) + user if e < edge]
    return max(below) + 1 if below else 1


def _concrete_input(val, binding: dict, mode):
    if isinstance(val, torch.Tensor):
        shape = [evaluate(s, binding) for s in val.shape]
        stride = [evaluate(s, binding) for s in val.stride()]
        with mode:
            return torch.empty_strided(shape, stride, dtype=val.dtype, device=val.device,
                                       requires_grad=val.requires_grad)
    return evaluate(val, binding)


class _Evaluator:
    """:func:`evaluate` at one binding, remembering each expression's value (shapes repeat: s0 * 768)."""

    def __init__(self, binding: dict):
        self.binding = binding
        self.known: dict = {}

    def __call__(self, x):
        if not isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return x
        key = (type(x), size_expr(x))
        value = self.known.get(key)
        if value is None:
            value = self.known[key] = evaluate(x, self.binding)
        return value


def _sized(val, binding, mode, storages: dict):
    """``val`` (a node's symbolic value) at ``binding``: a fake tensor of the evaluated size, stride and
    offset on a storage of the evaluated bytes, shared with every other value of the same symbolic
    storage (views stay views); numbers evaluated; tuples element by element. The tensor is built
    on the meta device and wrapped as a fake one directly: no op goes through the fake mode."""
    if isinstance(val, torch.Tensor):
        from torch._subclasses.fake_tensor import FakeTensor

        key = val.untyped_storage()._cdata
        base = storages.get(key)
        if base is None:
            nbytes = binding(val.untyped_storage().nbytes())
            base = storages[key] = torch.empty(nbytes, dtype=torch.uint8, device="meta").untyped_storage()
        meta = torch.empty(0, dtype=val.dtype, device="meta")
        meta.set_(base, binding(val.storage_offset()), [binding(x) for x in val.shape],
                  [binding(x) for x in val.stride()])
        meta.requires_grad_(val.requires_grad)  # the fake tensor takes its element's (torch 2.11 has no argument for it)
        return FakeTensor(mode, meta, val.device)
    if isinstance(val, (tuple, list)):
        return type(val)(_sized(v, binding, mode, storages) for v in val)
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return binding(val)
    return val


def _sized_metas(graph: fx.Graph, originals, binding: dict, mode) -> None:
    """Every node's ``val`` evaluated at ``binding`` from its symbolic one (no op is run)."""
    storages: dict = {}
    evaluator = _Evaluator(binding)
    for new, old in zip(graph.nodes, originals):
        if "val" in old.meta:
            new.meta["val"] = _sized(old.meta["val"], evaluator, mode, storages)


class _UncompiledModule(fx.GraphModule):
    """A GraphModule without its Python code: the concrete copy is read and planned, never called
    (an ``fx.Interpreter`` reads the graph itself), and generating the code of a large joint graph
    took a tenth of a second per bucket."""

    def recompile(self):
        return None


def concrete_joint(joint: fx.GraphModule, binding: dict) -> fx.GraphModule:
    """A copy of ``joint`` whose fake tensors have the sizes ``binding`` gives its symbols. Node names
    and arguments are the original's (view sizes still read the symbol inputs).

    Each value is sized from its own symbolic fake tensor (sizes, strides, offsets and storage bytes
    are expressions in the symbols; :func:`_sized_metas`), with no op run: milliseconds where a fake
    propagation through every op takes seconds on a large graph. If that fails for some value, the
    copy is sized by propagating fake tensors of the concrete inputs through it instead."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    graph = fx.Graph()
    out = graph.graph_copy(joint.graph, {})
    graph.output(out)
    for old, new in zip(joint.graph.nodes, graph.nodes):
        new.meta = dict(old.meta)
    gm = _UncompiledModule(joint, graph)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        _sized_metas(graph, list(joint.graph.nodes), binding, mode)
        return gm
    except CaptureError:
        raise
    except Exception:  # noqa: BLE001  (anything unusual: the slower, general way below)
        for old, new in zip(joint.graph.nodes, graph.nodes):
            new.meta = dict(old.meta)
    placeholders = graph.find_nodes(op="placeholder")
    inputs = [_concrete_input(n.meta.get("val"), binding, mode) for n in placeholders]
    for n, value in zip(placeholders, inputs):  # a size input's too: torch 2.11's propagation keeps its symbol
        n.meta["val"] = value
    try:
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*inputs)
    except CaptureError:
        raise
    except Exception as err:
        sizes = ", ".join(f"{s}={v}" for s, v in sorted(binding.items(), key=lambda kv: str(kv[0])))
        raise CaptureError(f"remat could not size the captured step at {sizes}: {type(err).__name__}: {err}") from err
    return gm


def _symbol_ints(joint: fx.GraphModule) -> dict:
    """``{symbol: a SymInt of the joint graph's inputs that is exactly that symbol}``."""
    found: dict = {}
    for n in joint.graph.find_nodes(op="placeholder"):
        for x in _sym_vals(n.meta.get("val")):
            if isinstance(x, torch.SymInt) and isinstance(size_expr(x), sympy.Symbol):
                found.setdefault(size_expr(x), x)
    return found


def guard_bucket(joint: fx.GraphModule, edges: Sequence[int] | None = None) -> tuple[dict, dict]:
    """``(low, high)``: the ends of the bucket of every symbol's traced value (its hint), and a
    guard ``low <= symbol <= high`` for each in the shape environment, which the compiler that
    traced ``joint`` (Dynamo) checks before running what it compiles from it: a size outside the
    bucket makes it capture again, and the new graph is planned for that size's bucket.

    For a compiler whose graphs run every size the guards admit (Inductor's dynamic-shape kernels),
    this is what makes one plan per bucket: the plan is made at ``high`` (:func:`concrete_joint`) and,
    with :func:`check_monotone`, holds at every size down to ``low``."""
    hints = example_binding(joint)
    ints = _symbol_ints(joint)
    low, high = {}, {}
    for symbol, value in sorted(hints.items(), key=lambda kv: str(kv[0])):
        high[symbol] = bucket_edge(value, edges)
        low[symbol] = min(lower_end(high[symbol], edges), value)
        size = ints.get(symbol)
        if size is None:
            raise CaptureError(f"remat cannot bound the size {symbol}: no input of the captured step is that size")
        # evaluating the comparisons records them as guards (true at the hint, by construction)
        if not (bool(size <= high[symbol]) and bool(size >= low[symbol])):
            raise AssertionError(f"{symbol}={value} outside its bucket {low[symbol]}..{high[symbol]}")
    return low, high


def _storage_bytes_expr(val: torch.Tensor):
    try:
        return val.untyped_storage().nbytes()
    except Exception:
        return val.numel() * val.element_size()


def check_monotone(joint: fx.GraphModule, low: dict, high: dict) -> list[str]:
    """Names of the joint graph's tensors that hold more bytes at the sizes ``low`` than at ``high``
    (empty: no buffer of a smaller shape in the bucket is larger than at its edge, checked at both ends)."""
    bad = []
    for n in joint.graph.nodes:
        val = n.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        for v in vals:
            if isinstance(v, torch.Tensor):
                nbytes = _storage_bytes_expr(v)
                if evaluate(nbytes, low) > evaluate(nbytes, high):
                    bad.append(n.name)
                    break
    return bad


__all__ = ["size_expr", "symbols_of", "example_binding", "symbol_sources", "is_dynamic", "bind_symbols", "evaluate", "default_edges", "bucket_edge", "bucket_of",
           "lower_end", "concrete_joint", "check_monotone", "guard_bucket", "bucket_key", "refuse_unless_monotone",
           "name_bucket"]

"""The analytic cost model (``cost_model="flops"``): FLOPs and bytes moved, as a roofline.

The time of one ATen op (one ``call_function`` node of a joint graph) is::

    seconds(node) = max(flops(node) / F, bytes(node) / B) + t_op

- ``flops(node)``: the op's FLOPs from ``torch.utils.flop_counter``'s formulas (``mm``,
  ``addmm``, ``bmm``, ``baddbmm``, ``convolution``, ``convolution_backward``, the SDPA and
  flash/efficient attention kernels, ...), evaluated on the shapes of the node's fake
  values, plus the CPU flash-attention kernels that torch does not count, plus ``mv``/
  ``dot``-like ops. An op with no formula is decomposed under ``FlopCounterMode`` when it
  has a ``CompositeImplicitAutograd`` decomposition (as ``FlopCounterMode`` itself does);
  otherwise it has 0 FLOPs: it is memory-bound and its bytes account for it.
- ``bytes(node)``: bytes of the distinct tensor inputs plus the tensor outputs
  (``numel * element_size`` of the fake values; an output that aliases an input, as for
  ``copy_``, is not counted twice).
- ``F``, ``B``, ``t_op``: the device's measured peak matmul rate, streaming bandwidth and
  per-op overhead (:func:`remat.cost.machine.machine_roofline`, cached on disk).

Views (``t``, ``view``, ``expand``, ``slice``, ``detach``, ``_unsafe_view``, ...), ``getitem``,
metadata queries (``sym_size``), uninitialised allocations (``empty*``) and non-op nodes
(placeholders, outputs) cost exactly 0 seconds.

Example::

    >>> import torch
    >>> from torch.fx.experimental.proxy_tensor import make_fx
    >>> from remat.cost.flops import FlopsCostModel, node_bytes, node_flops
    >>> gm = make_fx(lambda a, b: (a @ b).relu(), tracing_mode="fake")(
    ...     torch.randn(64, 32), torch.randn(32, 16))
    >>> model = FlopsCostModel()                   # roofline of this machine's CPU
    >>> mm = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mm.default)
    >>> node_flops(mm), node_bytes(mm)             # 2*64*32*16, 4*(64*32 + 32*16 + 64*16)
    (65536.0, 14336)
    >>> model.node_seconds(mm) > 0
    True

The model is deterministic: for a given :class:`~remat.cost.machine.Roofline` the same
node always gets the same cost.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx
from torch.utils import flop_counter as _fc
from torch.utils._pytree import tree_flatten

from .machine import Roofline, machine_roofline

__all__ = ["node_flops", "node_bytes", "node_random_draws", "FlopsCostModel"]

aten = torch.ops.aten


# ----------------------------------------------------------------------------- formulas


def _mv_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    m, k = a_shape
    return 2 * m * k


def _addmv_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return _mv_flop(a_shape, b_shape)


def _dot_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0]


def _addbmm_flop(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return _fc.bmm_flop(a_shape, b_shape)


def _int_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return _fc.mm_flop(a_shape, b_shape)


# Formulas torch.utils.flop_counter lacks. The CPU flash-attention kernels take
# (query, key, value, ...) and (grad_out, query, key, value, ...) like the CUDA ones, so
# torch's own sdpa formulas apply (FlopCounterMode counts 0 for them on CPU).
_EXTRA_FORMULAS: dict[Any, Callable[..., int]] = {
    aten._scaled_dot_product_flash_attention_for_cpu: _fc.sdpa_flop,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _fc.sdpa_backward_flop,
    aten.mv: _fc.shape_wrapper(_mv_flop),
    aten.addmv: _fc.shape_wrapper(_addmv_flop),
    aten.dot: _fc.shape_wrapper(_dot_flop),
    aten.vdot: _fc.shape_wrapper(_dot_flop),
    aten.addbmm: _fc.shape_wrapper(_addbmm_flop),
    aten._int_mm: _fc.shape_wrapper(_int_mm_flop),
}


def _formula(target: Any) -> Callable[..., int] | None:
    """The FLOP formula for an OpOverload (by its packet) or a HigherOrderOperator."""
    key = target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target
    f = _EXTRA_FORMULAS.get(key)
    if f is None:
        f = _fc.flop_registry.get(key)
    return f


# Ops that move no data although their schema does not mark them as views.
_FREE_OPS = {
    aten._unsafe_view.default,
    aten.lift_fresh.default,
    aten.empty.memory_format,
    aten.empty_like.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.sym_size.int,
    aten.sym_stride.int,
    aten.sym_numel.default,
    aten.sym_storage_offset.default,
}


def costs_nothing(node: torch.fx.Node) -> bool:
    """Placeholders, outputs, getitem, views and metadata ops: no time, no bytes."""
    if node.op != "call_function":
        return True
    target = node.target
    if target is operator.getitem:
        return True
    if isinstance(target, torch._ops.OpOverload):
        return target.is_view or target in _FREE_OPS
    return False


# ----------------------------------------------------------------------------- helpers


def _val(node: torch.fx.Node) -> Any:
    return node.meta.get("val")


def fake_args(node: torch.fx.Node) -> tuple[tuple, dict]:
    args = torch.fx.node.map_arg(node.args, _val)
    kwargs = torch.fx.node.map_arg(node.kwargs, _val)
    return args, kwargs  # type: ignore[return-value]


def _as_int(x: Any) -> int:
    if isinstance(x, int):
        return x
    if isinstance(x, torch.SymInt):
        from torch.fx.experimental.symbolic_shapes import optimization_hint

        return int(optimization_hint(x, fallback=1))
    return int(x)


def _tensor_bytes(t: torch.Tensor) -> int:
    return _as_int(t.numel()) * t.element_size()


def tensors_of(value: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(value)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


# FLOPs of ops that go through the decomposition fallback, keyed by (op, signature).
_DECOMPOSED_FLOPS: dict[tuple, float] = {}


def _signature(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype, x.device.type)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_signature(y) for y in x))
    if isinstance(x, dict):
        return ("D", tuple(sorted((k, _signature(v)) for k, v in x.items())))
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return ("S", str(x))
    return x if isinstance(x, (int, float, bool, str, type(None))) else repr(x)


def _decomposed_flops(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> float:
    """FLOPs of an op without a formula, by running its decomposition under FlopCounterMode
    on the fake values (what FlopCounterMode does for such ops). Cached by signature."""
    try:
        key = (op, _signature(args), _signature(kwargs))
        hash(key)
    except TypeError:
        key = None
    if key is not None and key in _DECOMPOSED_FLOPS:
        return _DECOMPOSED_FLOPS[key]
    flops = 0.0
    tensors = tensors_of((args, kwargs))
    fake_mode = torch._guards.detect_fake_mode(tensors) if tensors else None
    if fake_mode is not None and all(
        isinstance(t, torch._subclasses.FakeTensor) for t in tensors
    ):
        try:
            with fake_mode, _fc.FlopCounterMode(display=False) as counter:
                op(*args, **kwargs)
            flops = float(_as_int(counter.get_total_flops()))
        except Exception:  # an exotic op that cannot run on fake values: no FLOPs known
            flops = 0.0
    if key is not None:
        _DECOMPOSED_FLOPS[key] = flops
    return flops


# ----------------------------------------------------------------------------- public


def node_flops(node: torch.fx.Node) -> float:
    """FLOPs of one ATen op node (``torch.utils.flop_counter`` conventions, 2 per MAC).

    0 for nodes that are not ``call_function`` ops and for ops without a formula.
    """
    if costs_nothing(node):
        return 0.0
    target = node.target
    formula = _formula(target)
    if formula is not None:
        args, kwargs = fake_args(node)
        try:
            return float(_as_int(formula(*args, **kwargs, out_val=_val(node))))
        except Exception:  # missing meta["val"] or an unexpected argument layout
            return 0.0
    if isinstance(target, torch._ops.OpOverload) and target._can_decompose():
        args, kwargs = fake_args(node)
        return _decomposed_flops(target, args, kwargs)
    return 0.0


def node_bytes(node: torch.fx.Node) -> int:
    """Bytes one op moves: its distinct tensor inputs plus its tensor outputs.

    Each input node is counted once however often it appears in the arguments; an output
    that aliases an input (``copy_``, ``out=`` ops) is not counted again. Views and other
    nodes that cost nothing move 0 bytes.
    """
    if costs_nothing(node):
        return 0
    total = 0
    for inp in node.all_input_nodes:  # distinct, in order
        total += sum(_tensor_bytes(t) for t in tensors_of(_val(inp)))
    out = _val(node)
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        returns = target._schema.returns
        outs = list(out) if isinstance(out, (tuple, list)) and len(returns) > 1 else [out]
        for i, o in enumerate(outs):
            alias = returns[i].alias_info if i < len(returns) else None
            if alias is not None:
                continue
            total += sum(_tensor_bytes(t) for t in tensors_of(o))
    else:
        total += sum(_tensor_bytes(t) for t in tensors_of(out))
    return total


# Inductor's replacement of random ops (a pure function of a seed, so not tagged random, but as slow)
SEEDED_RANDOM_OPS = ("prims.inductor_random.default", "prims.inductor_randint.default")


def node_random_draws(node: torch.fx.Node) -> int:
    """Random numbers a random op (``Tag.nondeterministic_seeded``, or Inductor's seeded
    ``prims.inductor_random``) draws: one per output element."""
    seeded = torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())
    if not seeded and str(node.target) not in SEEDED_RANDOM_OPS:
        return 0
    return max((_as_int(t.numel()) for t in tensors_of(_val(node))), default=0)


class FlopsCostModel:
    """Roofline cost of ATen op nodes on one device.

    ``node_seconds(node) = max(node_flops / F, node_bytes / B) + t_op`` for an op, 0 for a
    node that costs nothing (see the module docstring); a random op (dropout, or Inductor's seeded
    draw that replaces it: :func:`node_random_draws`) costs at least ``elements / R + t_op``, ``R``
    the measured rate of drawing random numbers. ``F``, ``B``, ``t_op`` come from ``roofline``, by
    default the measured (and disk-cached) roofline of ``device``.
    """

    name = "flops"

    def __init__(self, roofline: Roofline | None = None, device: torch.device | str = "cpu"):
        self.roofline = roofline if roofline is not None else machine_roofline(device)

    def node_seconds(self, node: torch.fx.Node) -> float:
        """Predicted seconds of one node."""
        if costs_nothing(node):
            return 0.0
        seconds = self.roofline.seconds(node_flops(node), node_bytes(node))
        drawn = node_random_draws(node)
        if drawn:  # one number per output element, at the measured rate
            seconds = max(seconds, drawn / self.roofline.random_elements_per_second + self.roofline.op_overhead_seconds)
        return seconds

    def __repr__(self) -> str:
        r = self.roofline
        return (
            f"FlopsCostModel({r.device_name!r}: {r.flops_per_second / 1e9:.1f} GFLOP/s, "
            f"{r.bytes_per_second / 1e9:.1f} GB/s, {r.op_overhead_seconds * 1e6:.2f} us/op)"
        )

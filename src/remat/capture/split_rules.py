"""Which ATen ops split into chunks of rows, and how their chunks combine: one table of rules.

A split site (:mod:`remat.capture.split`) runs a set of ops on ``k`` chunks of ``N`` rows. Every
tensor the site reads or makes is in one :class:`State`:

=========  ===========================================================================
``rows``   its first ``lead`` dims flatten to the ``N`` rows; a chunk is ``(n, *shape[lead:])``
``cols``   a 2-D tensor whose second dim is the rows (``t`` of a ``rows`` tensor)
``whole``  not split: every chunk reads all of it (a weight, a scalar, a loss's total weight)
``sum``    each chunk makes a part and the value is the sum of the parts (a weight's gradient)
``mean``   ``nll_loss``'s mean: the summed parts divided by the summed total weight
=========  ===========================================================================

A rule looks at one FX node and the states of its tensor inputs and returns a :class:`Split`
(the states of its outputs, and how a chunk's call differs from the original's) or None when
the op does not split that way. Examples: ``mm(rows, whole) -> rows`` (rows of a linear layer);
``mm(cols, rows) -> sum`` (a weight gradient sums over the rows); ``_log_softmax(rows, dim)`` over
a dim that is not a row dim ``-> rows``; ``nll_loss_forward(rows, rows)`` with ``reduction=mean`` runs
each chunk with ``reduction=sum`` and divides the summed losses by the summed total weights.

Row-independent rules give each row exactly the unsplit op's value wherever the kernel computes a
row the same way whatever the other rows; ``sum`` and ``mean`` add the parts in another order than
the unsplit reduction (equal to within rounding, 1e-6 relative in fp32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx

aten = torch.ops.aten


@dataclass(frozen=True)
class State:
    kind: str  # "rows", "cols", "whole", "sum" or "mean"
    lead: int = 1  # rows: how many leading dims flatten to the rows

    @property
    def split(self) -> bool:
        """Whether a chunk holds only its own rows of the value."""
        return self.kind in ("rows", "cols")


COLS = State("cols")
WHOLE = State("whole")
SUM = State("sum")
MEAN = State("mean")


def rows(lead: int = 1) -> State:
    return State("rows", lead)


ArgsFn = Callable[[tuple, dict, int], tuple[tuple, dict]]


@dataclass(frozen=True)
class Split:
    """How one op splits: ``outputs`` holds one state per output (one for a single tensor);
    ``args(args, kwargs, n)`` turns the original call's arguments, tensors already replaced by
    their chunks, into the call of a chunk of ``n`` rows (None: the same call); ``addmm``: the op
    is an ``mm`` whose ``sum`` output each chunk adds into the running total with one ``addmm``."""

    outputs: tuple[State, ...]
    args: ArgsFn | None = None
    addmm: bool = False


# A tensor argument's state (None for anything else). A value from outside the site is read by rows
# when its leading dims flatten to the rows, unless the rule asks for it ``whole`` (a weight whose
# size happens to equal the number of rows is still a weight).
StateOf = Callable[..., State | None]
Rule = Callable[[fx.Node, StateOf], Split | None]


def val(node) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _tensor_args(node: fx.Node) -> list[fx.Node]:
    return [a for a in node.all_input_nodes if isinstance(val(a), torch.Tensor)]


def _with_arg(index: int, value_fn: Callable[[int], Any]) -> ArgsFn:
    """An args function replacing positional argument ``index`` by ``value_fn(chunk rows)``."""
    def args_fn(args, kwargs, n):
        args = list(args)
        args[index] = value_fn(n)
        return tuple(args), kwargs
    return args_fn


# -- rules --------------------------------------------------------------------------------------

def _same(node, state_of):
    """detach, alias, clone, dtype casts: the state passes through."""
    s = state_of(node.args[0])
    if s is None or not s.split:
        return None
    if node.target is aten._to_copy.default and node.kwargs.get("device") not in (None, val(node.args[0]).device):
        return None
    return Split((s,))


def _pointwise(node, state_of):
    """An elementwise op: its split inputs all have the output's shape over the row dims; the
    others broadcast over the rows (size 1 or absent there)."""
    out = val(node)
    if not isinstance(out, torch.Tensor):
        return None
    states = [(a, state_of(a)) for a in _tensor_args(node)]
    leads = {s.lead for _, s in states if s is not None and s.kind == "rows"}
    if len(leads) != 1 or any(s is None or s.kind not in ("rows", "whole") for _, s in states):
        return None
    (lead,) = leads
    for a, s in states:
        v = val(a)
        if s.kind == "rows":
            if v.dim() != out.dim() or tuple(v.shape[:lead]) != tuple(out.shape[:lead]):
                return None
        else:  # broadcast over the rows: right-aligned, nothing but size 1 at the row dims
            offset = out.dim() - v.dim()
            if lead > 1 and offset < lead and v.numel() != 1:
                return None  # the chunk has fewer dims than the output: it would need a reshape
            if any(v.shape[i - offset] != 1 for i in range(lead) if i - offset >= 0):
                return None
    return Split((rows(lead),))


def _transpose_2d(node, state_of):
    """``t`` (or ``transpose(0, 1)``) of a 2-D tensor swaps rows and cols."""
    s = state_of(node.args[0])
    if val(node.args[0]).dim() != 2 or s is None:
        return None
    if node.target is aten.transpose.int and {d % 2 for d in node.args[1:3]} != {0, 1}:
        return None
    if s == rows(1):
        return Split((COLS,))
    if s == COLS:
        return Split((rows(1),))
    return None


def leading_rows(shape, count: int) -> int | None:
    """The smallest ``lead`` whose leading dims multiply to ``count`` (None when none does)."""
    product = 1
    for lead, size in enumerate(shape, start=1):
        product *= int(size)
        if product == count:
            return lead
        if product > count:
            return None
    return None


def _view(node, state_of):
    """A reshape that keeps the rows as leading dims: each chunk is reshaped alike."""
    s = state_of(node.args[0])
    src, out = val(node.args[0]), val(node)
    if s is None or s.kind != "rows" or not src.is_contiguous():
        return None
    count = math.prod(int(x) for x in src.shape[: s.lead])
    lead = leading_rows(out.shape, count)
    if lead is None:
        return None
    rest = [int(x) for x in out.shape[lead:]]
    return Split((rows(lead),), args=_with_arg(1, lambda n: [n, *rest]))


def _mm(node, state_of):
    a = state_of(node.args[0])
    if a == rows(1) and state_of(node.args[1], whole=True) == WHOLE:
        return Split((rows(1),))
    if a == COLS and state_of(node.args[1]) == rows(1):  # contracts over the rows: a weight's gradient
        return Split((SUM,), addmm=True)
    if state_of(node.args[1]) == COLS and state_of(node.args[0], whole=True) == WHOLE:
        return Split((COLS,))
    return None


def _addmm(node, state_of):
    bias, a, b = state_of(node.args[0], whole=True), state_of(node.args[1]), state_of(node.args[2], whole=True)
    if bias == WHOLE and val(node.args[0]).dim() <= 1 and a == rows(1) and b == WHOLE:
        return Split((rows(1),))
    return None


def _row_wise_over(node, inputs, dim_index: int) -> Split | None:
    """An op reducing over dim ``node.args[dim_index]`` of inputs that are all split alike by rows:
    row-wise when that dim is not a row dim (the chunk's call names the dim of the chunk)."""
    state = inputs[0]
    if state is None or state.kind != "rows" or any(s != state for s in inputs):
        return None
    dim = node.args[dim_index] % val(node.args[0]).dim()
    if dim < state.lead:
        return None
    return Split((state,), args=_with_arg(dim_index, lambda n: dim - state.lead + 1))


def _softmax(node, state_of):
    """``_softmax`` / ``_log_softmax(x, dim, half_to_float)``."""
    return _row_wise_over(node, [state_of(node.args[0])], 1)


def _softmax_backward(node, state_of):
    """``_softmax_backward_data`` / ``_log_softmax_backward_data(grad, output, dim, dtype)``."""
    return _row_wise_over(node, [state_of(node.args[0]), state_of(node.args[1])], 2)


def _nll_loss_forward(node, state_of):
    """``nll_loss_forward(log_probs [N, C], target [N], weight, reduction, ignore_index)``: the
    chunks sum their rows' losses and total weights; ``mean`` divides the two sums."""
    x, target, weight = node.args[0], node.args[1], node.args[2]
    if state_of(x) != rows(1) or state_of(target) != rows(1) or val(x).dim() != 2:
        return None
    if weight is not None and state_of(weight, whole=True) != WHOLE:
        return None
    reduction = node.args[3]
    if reduction == 1:
        return Split((MEAN, SUM), args=_with_arg(3, lambda n: 2))
    if reduction == 2:
        return Split((SUM, SUM))
    return None


def _nll_loss_backward(node, state_of):
    """``nll_loss_backward(grad, log_probs, target, weight, reduction, ignore_index, total_weight)``:
    row by row, given the whole step's total weight."""
    grad, x, target, weight, reduction, _ignore, total = node.args[:7]
    if state_of(x) != rows(1) or state_of(target) != rows(1) or state_of(total, whole=True) != WHOLE:
        return None
    if weight is not None and state_of(weight, whole=True) != WHOLE:
        return None
    if state_of(grad, whole=reduction != 0) != (rows(1) if reduction == 0 else WHOLE):
        return None
    return Split((rows(1),))


def _layer_norm(node, state_of):
    """``native_layer_norm(x, normalized_shape, ...)`` normalises within each row."""
    s = state_of(node.args[0])
    if s is None or s.kind != "rows" or len(node.args[1]) > val(node.args[0]).dim() - s.lead:
        return None
    if any(state_of(w, whole=True) not in (None, WHOLE) for w in node.args[2:4] if w is not None):
        return None
    return Split((s, s, s))


def _layer_norm_backward(node, state_of):
    """``native_layer_norm_backward``: the input's gradient row by row, the weight's and bias's
    summed over the rows."""
    grad, x, shape, mean, rstd, weight, bias = node.args[:7]
    s = state_of(x)
    if s is None or s.kind != "rows" or len(shape) > val(x).dim() - s.lead:
        return None
    if state_of(grad) != s or state_of(mean) != s or state_of(rstd) != s:
        return None
    if any(state_of(w, whole=True) != WHOLE for w in (weight, bias) if w is not None):
        return None
    return Split((s, SUM, SUM))


def _sum_over_rows(node, state_of):
    """``sum(x, dims)`` over exactly the row dims (a bias's gradient): a sum of the chunks' sums."""
    s = state_of(node.args[0])
    if s is None or s.kind != "rows":
        return None
    ndim = val(node.args[0]).dim()
    if node.target is aten.sum.default:
        return Split((SUM,))
    dims = sorted({d % ndim for d in node.args[1]})
    if dims != list(range(s.lead)):
        return None
    return Split((SUM,), args=_with_arg(1, lambda n: [0]))


RULES: dict[Any, Rule] = {
    aten.detach.default: _same,
    aten.alias.default: _same,
    aten.clone.default: _same,
    aten._to_copy.default: _same,
    aten.t.default: _transpose_2d,
    aten.transpose.int: _transpose_2d,
    aten.view.default: _view,
    aten._unsafe_view.default: _view,
    aten.reshape.default: _view,
    aten.mm.default: _mm,
    aten.addmm.default: _addmm,
    aten._softmax.default: _softmax,
    aten._log_softmax.default: _softmax,
    aten._softmax_backward_data.default: _softmax_backward,
    aten._log_softmax_backward_data.default: _softmax_backward,
    aten.nll_loss_forward.default: _nll_loss_forward,
    aten.nll_loss_backward.default: _nll_loss_backward,
    aten.native_layer_norm.default: _layer_norm,
    aten.native_layer_norm_backward.default: _layer_norm_backward,
    aten.sum.dim_IntList: _sum_over_rows,
    aten.sum.default: _sum_over_rows,
}


def rule_for(node: fx.Node) -> Rule | None:
    """The rule of an op node: from the table, or the elementwise rule for an op tagged pointwise;
    None for random ops (a chunk would draw other numbers) and for everything else."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    tags = getattr(target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags:
        return None
    if target in RULES:
        return RULES[target]
    if torch.Tag.pointwise in tags and not target._schema.is_mutable:
        return _pointwise
    return None


__all__ = ["State", "Split", "COLS", "WHOLE", "SUM", "MEAN", "rows", "leading_rows", "rule_for", "val", "RULES"]

"""Which ATen ops split into chunks of rows, and how their chunks combine: one table of rules.

A split site (:mod:`remat.capture.split`) runs a set of ops on ``k`` chunks of ``N`` rows. Every
tensor the site reads or makes is in one :class:`State`:

=========  ===========================================================================
``rows``   its first ``lead`` dims flatten to ``N * per`` rows, ``per`` rows for each of the
           site's ``N`` units (a unit is a row of the seed: a token, or a whole sequence or
           image when the site splits by batch); the chunk of units ``[s, e)`` is the
           ``(e - s) * per`` rows from ``s * per``, shaped ``(rows, *shape[lead:])``
``cols``   a 2-D tensor whose second dim is the rows (``t`` of a ``rows`` tensor)
``whole``  not split: every chunk reads all of it (a weight, a scalar, a loss's total weight)
``sum``    each chunk makes a part and the value is the sum of the parts (a weight's gradient)
``mean``   ``nll_loss``'s mean: the summed parts divided by the summed total weight
``first``  each chunk makes the same value (an attention kernel's random-number state, an empty
           tensor, a size): chunk 0's is the whole
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

A value's ``lead`` is always the fewest leading dims whose sizes multiply to a multiple of ``N``
(:func:`rows_of`): a ``[B, T, D]`` value of a site over ``B * T`` tokens has ``lead=2``, of a site
over ``B`` sequences ``lead=1``; so a batch-wise op (a convolution, attention over its heads, a
batched matmul) sees its batch dim as the rows whenever the site splits by batch.
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
    kind: str  # "rows", "cols", "whole", "sum", "mean", "first", or "stat" (a barrier's, split_barriers.py)
    lead: int = 1  # rows: how many leading dims flatten to the rows
    per: int = 1  # rows and cols: rows for each of the site's units

    @property
    def split(self) -> bool:
        """Whether a chunk holds only its own rows of the value."""
        return self.kind in ("rows", "cols")


WHOLE = State("whole")
SUM = State("sum")
MEAN = State("mean")
FIRST = State("first")  # each chunk makes the same value (a random-number state): chunk 0's is the whole


def rows(lead: int = 1, per: int = 1) -> State:
    return State("rows", lead, per)


def is_rows(state: State | None, lead: int | None = None) -> bool:
    return state is not None and state.kind == "rows" and (lead is None or state.lead == lead)


def units(shape, state: State) -> int:
    """The site's unit count ``N`` seen from a value split by rows in ``state``."""
    return math.prod(int(x) for x in shape[: state.lead]) // state.per


def rows_of(shape, count: int) -> State | None:
    """The ``rows`` state of a value of ``shape`` in a site of ``count`` units: the fewest leading
    dims whose sizes multiply to a multiple of ``count`` (None when none do)."""
    product = 1
    for lead, size in enumerate(shape, start=1):
        product *= int(size)
        if product and product % count == 0:
            return rows(lead, product // count)
    return None


ArgsFn = Callable[[tuple, dict, int], tuple[tuple, dict]]  # (args, kwargs, units in the chunk)


@dataclass(frozen=True)
class Split:
    """How one op splits: ``outputs`` holds one state per output (one for a single tensor);
    ``args(args, kwargs, n)`` turns the original call's arguments, tensors already replaced by
    their chunks, into the call of a chunk of ``n`` rows (None: the same call); ``addmm``: the op
    is an ``mm`` whose ``sum`` output each chunk adds into the running total with one ``addmm``."""

    outputs: tuple[State, ...]
    args: ArgsFn | None = None
    addmm: bool = False
    target: Any = None  # the op each chunk runs instead of the original (``mean`` as a ``sum``)
    divide: int = 1  # ``sum`` outputs: the combined total is divided by this (a mean's count)
    divide_dims: tuple | None = None  # the input dims whose sizes multiply to ``divide`` (None: all)
    barrier: Any = None  # a two-pass op (:mod:`remat.capture.split_barriers`): how its passes run


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


def _broadcast_over_first_dim(v: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether ``v``, an operand of an elementwise op making ``out``, has size 1 at ``out``'s first dim
    (or lacks it): it is the same for every row."""
    offset = out.dim() - v.dim()
    return out.dim() > 0 and out.shape[0] != 1 and (offset > 0 or v.shape[0] == 1)


def _pointwise(node, state_of):
    """An elementwise op: its split inputs all have the output's shape over the row dims; the
    others broadcast over the rows (size 1 or absent there)."""
    out = val(node)
    if not isinstance(out, torch.Tensor):
        return None
    states = []
    for a in _tensor_args(node):
        s = state_of(a)
        if s is not None and s.kind == "rows" and _broadcast_over_first_dim(val(a), out):
            # an outside value of size 1 at the output's first dim (always a row dim) broadcasts over the
            # rows: read whole (an arange of shape [1, 32000] is not 128 rows of 250, whatever its size)
            s = state_of(a, whole=True)
        states.append((a, s))
    leads = {(s.lead, s.per) for _, s in states if s is not None and s.kind == "rows"}
    if len(leads) != 1 or any(s is None or s.kind not in ("rows", "whole") for _, s in states):
        return None
    ((lead, per),) = leads
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
    return Split((rows(lead, per),))


def _transpose(node, state_of):
    """``t`` (or ``transpose(0, 1)``) of a 2-D tensor swaps rows and cols; a transpose of two dims
    after the row dims keeps the rows (the chunk's call names the chunk's dims)."""
    s = state_of(node.args[0])
    ndim = val(node.args[0]).dim()
    if s is None:
        return None
    dims = (0, 1) if node.target is aten.t.default else tuple(d % ndim for d in node.args[1:3])
    if is_rows(s) and min(dims) >= s.lead:
        return Split((s,), args=lambda a, kw, n: ((a[0], *(d - s.lead + 1 for d in dims)), kw))
    if ndim != 2 or set(dims) != {0, 1}:
        return None
    if is_rows(s, 1):
        return Split((State("cols", 1, s.per),))
    if s.kind == "cols":
        return Split((rows(1, s.per),))
    return None


def _permute(node, state_of):
    """``permute``: ``[1, 0]`` of a 2-D tensor swaps rows and cols; a permutation keeping the row
    dims in place keeps the rows."""
    s = state_of(node.args[0])
    ndim = val(node.args[0]).dim()
    perm = [d % ndim for d in node.args[1]]
    if s is None:
        return None
    if is_rows(s) and perm[: s.lead] == list(range(s.lead)):
        chunk_perm = [0, *(d - s.lead + 1 for d in perm[s.lead:])]
        return Split((s,), args=_with_arg(1, lambda n: chunk_perm))
    if ndim == 2 and perm == [1, 0] and is_rows(s, 1):
        return Split((State("cols", 1, s.per),))
    if ndim == 2 and perm == [1, 0] and s.kind == "cols":
        return Split((rows(1, s.per),))
    return None


def _expand(node, state_of):
    """``expand(x, sizes)`` that keeps the row dims (a mean's gradient spread over its window)."""
    s = state_of(node.args[0])
    src, out = val(node.args[0]), val(node)
    if not is_rows(s) or src.dim() != out.dim() or tuple(src.shape[: s.lead]) != tuple(out.shape[: s.lead]):
        return None
    rest = [int(x) for x in out.shape[s.lead:]]
    return Split((s,), args=_with_arg(1, lambda n: [n * s.per, *rest]))


def _unsqueeze_squeeze(node, state_of):
    """``unsqueeze(x, d)`` / ``squeeze(x, d)`` at a dim after the row dims."""
    s = state_of(node.args[0])
    ndim = val(node).dim() if node.target is aten.unsqueeze.default else val(node.args[0]).dim()
    if not is_rows(s) or len(node.args) < 2 or not isinstance(node.args[1], int):
        return None
    dim = node.args[1] % ndim
    if dim < s.lead:
        return None
    return Split((s,), args=_with_arg(1, lambda n: dim - s.lead + 1))


def _view(node, state_of):
    """A reshape that keeps the rows as leading dims: each chunk is reshaped alike."""
    s = state_of(node.args[0])
    src, out = val(node.args[0]), val(node)
    if not is_rows(s):
        return None
    if tuple(out.shape[: s.lead]) == tuple(src.shape[: s.lead]):  # only the dims after the rows change
        rest = [int(x) for x in out.shape[s.lead:]]
        return Split((s,), args=_with_arg(1, lambda n: [n * s.per, *rest]))
    if not src.is_contiguous():
        return None
    # the chunk of units [a, b) is the same run of elements of both (contiguous, same order)
    o = rows_of(out.shape, units(src.shape, s))
    if o is None:
        return None
    rest = [int(x) for x in out.shape[o.lead:]]
    return Split((o,), args=_with_arg(1, lambda n: [n * o.per, *rest]))


def _mm(node, state_of):
    a = state_of(node.args[0])
    if is_rows(a, 1) and state_of(node.args[1], whole=True) == WHOLE:
        return Split((a,))
    b = state_of(node.args[1])
    if a is not None and a.kind == "cols" and is_rows(b, 1) and b.per == a.per:  # over the rows: a weight's gradient
        return Split((SUM,), addmm=True)
    if b is not None and b.kind == "cols" and state_of(node.args[0], whole=True) == WHOLE:
        return Split((b,))
    return None


def _addmm(node, state_of):
    bias, a, b = state_of(node.args[0], whole=True), state_of(node.args[1]), state_of(node.args[2], whole=True)
    if bias == WHOLE and val(node.args[0]).dim() <= 1 and is_rows(a, 1) and b == WHOLE:
        return Split((a,))
    return None


def _rows_alike(node, state_of, read_whole: Callable[[int], bool]) -> State | None:
    """The one ``rows`` state (over dim 0) in which ``node`` reads every positional tensor argument but
    those at the positions ``read_whole`` names, which must be ``whole``; None where the arguments do
    not split so, or a tensor is passed by keyword."""
    state = None
    for i, arg in enumerate(node.args):
        if not isinstance(val(arg), torch.Tensor):
            continue
        s = state_of(arg, whole=read_whole(i))
        if read_whole(i):
            if s != WHOLE:
                return None
            continue
        if not is_rows(s, 1) or (state is not None and s != state):
            return None
        state = s
    if state is None or any(isinstance(val(v), torch.Tensor) for v in node.kwargs.values()):
        return None
    return state


def _batch_wise(node, state_of):
    """An op independent over dim 0 of every tensor it reads and makes (a batched matmul, a
    convolution's or pooling's batch): every input split by rows of one
    dim, alike; weights (``whole``) allowed where ``_WHOLE_ARGS`` names them."""
    whole_at = _WHOLE_ARGS.get(node.target, ())
    state = _rows_alike(node, state_of, lambda i: i in whole_at)
    if state is None:
        return None
    out = val(node)
    count = len(out) if isinstance(out, (tuple, list)) else 1
    return Split((state,) * count)


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
    if not is_rows(state_of(x), 1) or state_of(target) != state_of(x) or val(x).dim() != 2:
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
    s = state_of(x)
    if not is_rows(s, 1) or state_of(target) != s or state_of(total, whole=True) != WHOLE:
        return None
    if weight is not None and state_of(weight, whole=True) != WHOLE:
        return None
    if state_of(grad, whole=reduction != 0) != (s if reduction == 0 else WHOLE):
        return None
    return Split((s,))


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
    """``sum(x, dims)`` / ``mean(x, dims)`` over every row dim (and maybe others: a bias's gradient,
    a mean loss): the chunks' sums add up; a mean divides the total by the count it averages."""
    s = state_of(node.args[0])
    if not is_rows(s):
        return None
    x = val(node.args[0])
    ndim = x.dim()
    mean = node.target in (aten.mean.default, aten.mean.dim)
    if node.target in (aten.sum.default, aten.mean.default):
        if node.kwargs.get("dtype") is not None:
            return None
        return Split((SUM,), target=aten.sum.default if mean else None, divide=x.numel() if mean else 1)
    dims = sorted({d % ndim for d in (node.args[1] if len(node.args) > 1 and node.args[1] else range(ndim))})
    if min(dims) >= s.lead:  # within each row
        return _reduce_within_rows(node, state_of)
    if not set(range(s.lead)) <= set(dims) or node.kwargs:
        return None
    chunk_dims = [0, *(d - s.lead + 1 for d in dims if d >= s.lead)]
    count = math.prod(int(x.shape[d]) for d in dims) if mean else 1

    def args_fn(args, kwargs, n):
        return (args[0], chunk_dims, *args[2:]), kwargs
    return Split((SUM,), args=args_fn, target=aten.sum.dim_IntList if mean else None, divide=count,
                 divide_dims=tuple(dims))


# batch-wise ops: the positions of the arguments read whole (weights); every other tensor by rows
_WHOLE_ARGS: dict[Any, tuple[int, ...]] = {
    aten.bmm.default: (),
    aten.convolution.default: (1, 2),
    aten.convolution_backward.default: (2,),
    aten.max_pool2d_with_indices.default: (),
    aten.max_pool2d_with_indices_backward.default: (),
    aten.avg_pool2d.default: (),
    aten.avg_pool2d_backward.default: (),
    aten._adaptive_avg_pool2d.default: (),
    aten._adaptive_avg_pool2d_backward.default: (),
    # Inductor's max pooling: the offset of each window's maximum, then its index in the image plane
    torch.ops.prims._low_memory_max_pool_with_offsets.default: (),
    torch.ops.prims._low_memory_max_pool_offsets_to_indices.default: (),
}


def _cat(node, state_of):
    """``cat(tensors, dim)`` along a dim after the row dims of inputs split alike."""
    states = [state_of(t) for t in node.args[0]]
    s = states[0]
    dim = (node.args[1] if len(node.args) > 1 else 0) % val(node).dim()
    if not is_rows(s) or any(t != s for t in states) or dim < s.lead:
        return None
    return Split((s,), args=lambda a, kw, n: ((a[0], dim - s.lead + 1), kw))


def _split(node, state_of):
    """``split(x, size, dim)`` / ``split_with_sizes`` along a dim after the row dims."""
    s = state_of(node.args[0])
    dim = (node.args[2] if len(node.args) > 2 else 0) % val(node.args[0]).dim()
    if not is_rows(s) or dim < s.lead:
        return None
    return Split((s,) * len(val(node)), args=lambda a, kw, n: ((a[0], a[1], dim - s.lead + 1), kw))


def _slice(node, state_of):
    """``slice(x, dim, start, end, step)`` along a dim after the row dims (``x[..., :half]``; a
    ``cat``'s backward slices the incoming gradient so)."""
    if len(node.args) < 2 or node.kwargs:  # (no dim given: dim 0, a row dim)
        return None
    return _row_wise_over(node, [state_of(node.args[0])], 1)


def _slice_backward(node, state_of):
    """``slice_backward(grad, input_sizes, dim, start, end, step)`` along a dim after the row dims: a
    slice's gradient, zeros around it, row by row (rotary embeddings' halves in the backward)."""
    s = state_of(node.args[0])
    out = val(node)
    dim = node.args[2] % out.dim()
    if not is_rows(s) or dim < s.lead or tuple(out.shape[: s.lead]) != tuple(val(node.args[0]).shape[: s.lead]):
        return None
    rest = [int(x) for x in out.shape[s.lead:]]
    return Split((s,), args=lambda a, kw, n: ((a[0], [n * s.per, *rest], dim - s.lead + 1, *a[3:]), kw))


def _gather(node, state_of):
    """``gather(x, dim, index)`` along a dim after the rows, ``x`` and ``index`` split alike: row by
    row (Inductor's decomposed ``nll_loss`` picks each row's target log-probability so)."""
    s, index = state_of(node.args[0]), state_of(node.args[2])
    dim = node.args[1] % val(node.args[0]).dim()
    if not is_rows(s) or index != s or dim < s.lead or node.kwargs.get("sparse_grad"):
        return None
    return Split((s,), args=_with_arg(1, lambda n: dim - s.lead + 1))


def _scatter_add(node, state_of):
    """``scatter_add(x, dim, index, src)`` along a dim after the rows, all three split alike: row by
    row (Inductor's decomposed max-pooling backward adds each row's gradients into its own row)."""
    s = state_of(node.args[0])
    dim = node.args[1] % val(node.args[0]).dim()
    if not is_rows(s) or dim < s.lead or any(state_of(a) != s for a in node.args[2:4]):
        return None
    return Split((s,), args=_with_arg(1, lambda n: dim - s.lead + 1))


def _convolution_backward(node, state_of):
    """``convolution_backward``: the input's gradient by rows, the weight's and bias's summed."""
    split = _batch_wise(node, state_of)
    return None if split is None else Split((split.outputs[0], SUM, SUM))


def _argument(node: fx.Node, name: str, default=None):
    """The argument ``name`` of an op node's call, by its schema (positional or keyword)."""
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name == name:
            return node.args[i] if i < len(node.args) else node.kwargs.get(name, default)
    return default


# attention kernels over ``[batch, heads, tokens, dim]``, forward and backward: the arguments read by
# rows (by batch, like the query); every other tensor argument (a random-number state, an empty
# sequence-offset tensor) is read whole. A forward's first two outputs (the attention and its
# log-sum-exp) come by rows, the rest (random-number states, empty tensors, sizes; a debug mask is refused) are each
# chunk's own and equal: any chunk's stands for the whole (``FIRST``).
_ATTENTION_ROWS = {"query", "key", "value", "grad_out", "grad_out_", "out", "logsumexp"}
_ATTENTION_FORWARD = {aten._scaled_dot_product_flash_attention_for_cpu.default,
                      aten._scaled_dot_product_efficient_attention.default,
                      aten._scaled_dot_product_flash_attention.default,
                      aten._scaled_dot_product_cudnn_attention.default}
_ATTENTION_BACKWARD = {aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                       aten._scaled_dot_product_efficient_attention_backward.default,
                       aten._scaled_dot_product_flash_attention_backward.default,
                       aten._scaled_dot_product_cudnn_attention_backward.default}


def _attention(node, state_of):
    """An attention kernel (the CPU's flash kernel; CUDA's flash, memory-efficient and cuDNN ones)
    split by batch: each sequence's attention reads only its own queries, keys and values. Not with
    dropout (a chunk would draw other numbers) or a mask or bias (not split with the rows)."""
    if (_argument(node, "dropout_p", 0.0) or _argument(node, "return_debug_mask", False)  # (a mask per sequence)
            or any(_argument(node, name) is not None for name in ("attn_mask", "attn_bias"))):
        return None
    names = [a.name for a in node.target._schema.arguments]
    state = _rows_alike(node, state_of, lambda i: names[i] not in _ATTENTION_ROWS)
    if state is None:
        return None
    count = len(node.target._schema.returns)
    if node.target in _ATTENTION_FORWARD:
        return Split((state, state) + (FIRST,) * (count - 2))
    return Split((state,) * count)


def _reduce_within_rows(node, state_of):
    """A reduction (``sum``, ``mean``, ``amax``, ``amin``, ``var``, ``var_mean``) over dims after the
    row dims: row by row (the chunk's call names the chunk's dims)."""
    s = state_of(node.args[0])
    ndim = val(node.args[0]).dim()
    given = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if not is_rows(s) or not given or any(isinstance(v, torch.fx.Node) for v in node.kwargs.values()):
        return None
    dims = [d % ndim for d in given]
    if min(dims) < s.lead:
        return None
    shifted = [d - s.lead + 1 for d in dims]
    out = val(node)
    count = len(out) if isinstance(out, (tuple, list)) else 1

    def args_fn(args, kwargs, n):
        if len(args) > 1:
            return (args[0], shifted, *args[2:]), kwargs
        return args, {**kwargs, "dim": shifted}
    return Split((s,) * count, args=args_fn)


RULES: dict[Any, Rule] = {
    aten.detach.default: _same,
    aten.alias.default: _same,
    aten.clone.default: _same,
    aten._to_copy.default: _same,
    aten.t.default: _transpose,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
    aten.expand.default: _expand,
    aten.unsqueeze.default: _unsqueeze_squeeze,
    aten.cat.default: _cat,
    aten.split.Tensor: _split,
    aten.slice.Tensor: _slice,
    aten.slice_backward.default: _slice_backward,
    aten.gather.default: _gather,
    aten.scatter_add.default: _scatter_add,
    aten.split_with_sizes.default: _split,
    aten.squeeze.dim: _unsqueeze_squeeze,
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
    aten.mean.dim: _sum_over_rows,
    aten.mean.default: _sum_over_rows,
    aten.amax.default: _reduce_within_rows,
    aten.amin.default: _reduce_within_rows,
    aten.var_mean.correction: _reduce_within_rows,
    aten.var.correction: _reduce_within_rows,
    aten.convolution_backward.default: _convolution_backward,
    **{op: _attention for op in _ATTENTION_FORWARD | _ATTENTION_BACKWARD},
    **{op: _batch_wise for op in _WHOLE_ARGS if op is not aten.convolution_backward.default},
}


def rule_for(node: fx.Node) -> Rule | None:
    """The rule of an op node: from the table, or the elementwise rule for an op tagged pointwise;
    None for random ops (a chunk would draw other numbers) and for everything else."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return None
    tags = getattr(target, "tags", ())
    if target in RULES:  # attention kernels are tagged random: their rule splits them without dropout only
        return RULES[target]
    if torch.Tag.nondeterministic_seeded in tags:
        return None
    if torch.Tag.pointwise in tags and not target._schema.is_mutable:
        return _pointwise
    return None


__all__ = ["State", "Split", "WHOLE", "SUM", "MEAN", "FIRST", "rows", "rows_of", "is_rows", "units",
           "rule_for", "val", "RULES"]

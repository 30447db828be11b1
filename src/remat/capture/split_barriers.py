"""Ops that need every row before any row's output: BatchNorm, split in two passes.

A batch norm's output for one image depends on the statistics of the whole batch, so it is not
independent over the rows; it is a *barrier*. Split, it runs in two passes over the chunks: a
*reduce* pass (each chunk's partial statistics), a *combine* (the whole batch's statistics, small
``[C]`` vectors), then an *apply* pass (each chunk normalised with them). A site's ops before the
barrier run chunk after chunk in one stage, its ops after it in the next (see
:mod:`remat.capture.split`); the planner decides whether each chunk's input is kept between the
two passes or recomputed.

Forward (``_native_batch_norm_legit_functional``, training): each chunk's ``var_mean`` over every
dim but the channels, combined exactly (Chan et al.'s pairwise rule, the parts weighted by their
counts ``n_c`` of ``n``)::

    mean = sum_c n_c mean_c / n        var = sum_c n_c (var_c + (mean_c - mean)^2) / n

then ``invstd = 1 / sqrt(var + eps)``, the running statistics updated as ATen does (the running
variance unbiased, ``var * n / (n - 1)``), and each chunk normalised by
``_native_batch_norm_legit_no_training`` with the batch's mean and variance.

Backward (``native_batch_norm_backward``, training): each chunk's weight and bias gradients given
the batch's mean and ``invstd`` (``sum dy * xhat`` and ``sum dy``: exactly the parts of the whole
sums), summed; then each chunk's input gradient
``dx = w * invstd * (dy - db / n - xhat * dw / n)`` with ``xhat = (x - mean) * invstd``.

Under Inductor the op arrives decomposed (Inductor's decompositions run before its partitioner):
its statistics a ``var_mean`` over every dim but the channels, then ``rsqrt(var + eps)`` and
``(x - mean) * invstd * w + b`` as separate ops; its backward two ``sum``s over the same dims
(``sum dy`` and ``sum dy * (x - mean)``), small ops on them, then pointwise ops per element. The
``var_mean`` is a barrier of its own, a reduce and a combine with no apply pass (its outputs are
both statistics); the sums are ordinary ``sum`` splits (:mod:`remat.capture.split_rules`), and the
site's ops that read a combined value, directly or through small ops outside the site, run in the
stage after the one that made it (:func:`remat.capture.split_order.segments`).

Values agree with the unsplit kernels to rounding (1e-6 relative in fp32), not bitwise: the
statistics are summed in another order.

Under symbolic sizes (:mod:`remat.capture.split_sizes`) the counts are sizes computed at run time:
the rewriter hands each chunk's count to ``reduce`` as a :class:`~remat.capture.split_sizes.Size`,
and every ratio of counts is emitted as arithmetic on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import getitem as _getitem
from operator import truediv
from typing import Any, Callable

import torch

from .split_rules import WHOLE, Split, State, is_rows, val

aten = torch.ops.aten

STAT = State("stat")  # made whole by a barrier's combine, between its two passes

Emit = Callable[..., Any]  # emit(target, *args, **kwargs) -> a new node with its value


@dataclass(frozen=True)
class Barrier:
    """How a two-pass op runs: ``reduce(emit, args, count)`` gives a chunk's partial results (``count``:
    the chunk's elements per channel where they vary with the sizes, else None);
    ``combine(emit, partials, args)`` the whole results ``{output index: node}`` and a context;
    ``apply(emit, args, context)`` a chunk's row outputs ``{output index: node}`` (None: the op has
    no row outputs, only whole ones). ``args`` are the op's arguments with split tensors replaced
    by the chunk's (whole ones in ``combine``)."""

    reduce: Callable
    combine: Callable
    apply: Callable | None


def _channels_view(emit: Emit, vector, x) -> Any:
    """A ``[C]`` vector shaped to broadcast over ``x``'s ``[rows, C, *spatial]``."""
    return emit(aten.view.default, vector, [int(val(vector).shape[0])] + [1] * (val(x).dim() - 2))


def _count(x) -> int:
    """Elements per channel of a ``[rows, C, *spatial]`` chunk."""
    shape = val(x).shape
    return int(shape[0]) * math.prod(int(s) for s in shape[2:])


def _ratio(emit: Emit, a, b):
    """``a / b`` of two counts: a number, or emitted where either varies with the sizes."""
    if isinstance(a, int) and isinstance(b, int):
        return a / b
    return emit(truediv, a, b)


def _statistics(emit: Emit, partials, correction=0):
    """The whole batch's ``(var, mean)`` from its chunks' ``(var, mean, count)`` (each with
    ``correction=0``), by the pairwise rule of the module docstring; the variance divided by
    ``n - correction``."""
    n = sum(count for _, _, count in partials)
    mean = None
    for _var, part_mean, count in partials:
        term = emit(aten.mul.Tensor, part_mean, _ratio(emit, count, n))
        mean = term if mean is None else emit(aten.add.Tensor, mean, term)
    var = None
    for part_var, part_mean, count in partials:
        centred = emit(aten.sub.Tensor, part_mean, mean)
        spread = emit(aten.add.Tensor, part_var, emit(aten.mul.Tensor, centred, centred))
        term = emit(aten.mul.Tensor, spread, _ratio(emit, count, n - correction if correction else n))
        var = term if var is None else emit(aten.add.Tensor, var, term)
    return var, mean


# -- forward ------------------------------------------------------------------------------------

def _bn_reduce(emit: Emit, args, count=None):
    x = args[0]
    dims = [0, *range(2, val(x).dim())]
    stats = emit(aten.var_mean.correction, x, dims, correction=0)
    return emit(_getitem, stats, 0), emit(_getitem, stats, 1), _count(x) if count is None else count


def _bn_combine(emit: Emit, partials, args):
    _x, _w, _b, running_mean, running_var, _training, momentum, eps = args[:8]
    n = sum(count for _, _, count in partials)
    var, mean = _statistics(emit, partials)
    invstd = emit(aten.rsqrt.default, emit(aten.add.Tensor, var, eps))
    new_mean = emit(aten.add.Tensor, emit(aten.mul.Tensor, running_mean, 1 - momentum),
                    emit(aten.mul.Tensor, mean, momentum))
    # (a bucket's smallest size has at least 2 rows under symbolic sizes: n - 1 >= 1 there)
    unbiased = emit(aten.mul.Tensor, var, _ratio(emit, n, max(n - 1, 1) if isinstance(n, int) else n - 1))
    new_var = emit(aten.add.Tensor, emit(aten.mul.Tensor, running_var, 1 - momentum),
                   emit(aten.mul.Tensor, unbiased, momentum))
    return {1: mean, 2: invstd, 3: new_mean, 4: new_var}, (mean, var)


def _bn_apply(emit: Emit, args, context):
    x, weight, bias, _rm, _rv, _training, momentum, eps = args[:8]
    mean, var = context
    out = emit(aten._native_batch_norm_legit_no_training.default, x, weight, bias, mean, var, momentum, eps)
    return {0: emit(_getitem, out, 0)}


# -- backward -----------------------------------------------------------------------------------

def _bn_backward_reduce(emit: Emit, args, count=None):
    grad, x, weight, running_mean, running_var, mean, invstd, _train, eps, _mask = args[:10]
    parts = emit(aten.native_batch_norm_backward.default, grad, x, weight, running_mean, running_var, mean,
                 invstd, True, eps, [False, True, True])
    return emit(_getitem, parts, 1), emit(_getitem, parts, 2), _count(x) if count is None else count


def _bn_backward_combine(emit: Emit, partials, args):
    _grad, x, weight, _rm, _rv, mean, invstd = args[:7]
    n = sum(count for _, _, count in partials)
    grad_weight = grad_bias = None
    for part_weight, part_bias, _ in partials:
        grad_weight = part_weight if grad_weight is None else emit(aten.add.Tensor, grad_weight, part_weight)
        grad_bias = part_bias if grad_bias is None else emit(aten.add.Tensor, grad_bias, part_bias)
    shift = _channels_view(emit, emit(aten.div.Tensor, grad_bias, n), x)  # db / n
    slope = _channels_view(emit, emit(aten.mul.Tensor, invstd, emit(aten.div.Tensor, grad_weight, n)), x)
    scale = _channels_view(emit, emit(aten.mul.Tensor, weight, invstd), x)  # w * invstd
    return {1: grad_weight, 2: grad_bias}, (_channels_view(emit, mean, x), shift, slope, scale)


def _bn_backward_apply(emit: Emit, args, context):
    grad, x = args[0], args[1]
    mean, shift, slope, scale = context
    xhat_term = emit(aten.mul.Tensor, emit(aten.sub.Tensor, x, mean), slope)  # xhat * dw / n
    centred = emit(aten.sub.Tensor, emit(aten.sub.Tensor, grad, shift), xhat_term)
    return {0: emit(aten.mul.Tensor, centred, scale)}


def _var_mean_reduce(emit: Emit, args, count=None, *, keepdim: bool):
    x, dims = args[0], args[1]
    stats = emit(aten.var_mean.correction, x, dims, correction=0, keepdim=keepdim)
    return emit(_getitem, stats, 0), emit(_getitem, stats, 1), _count(x) if count is None else count


BATCH_NORM = Barrier(_bn_reduce, _bn_combine, _bn_apply)
BATCH_NORM_BACKWARD = Barrier(_bn_backward_reduce, _bn_backward_combine, _bn_backward_apply)


def _affine_float(x, weight, bias, state_of) -> State | None:
    """The rows state of a batch norm's input when the op splits: rows of one dim (the batch),
    an affine float norm (weight and bias read whole)."""
    s = state_of(x)
    if not is_rows(s, 1) or val(x).dim() < 2 or val(x).dtype not in (torch.float32, torch.float64):
        return None
    if weight is None or bias is None or any(state_of(t, whole=True) != WHOLE for t in (weight, bias)):
        return None
    return s


def _batch_statistics(node, state_of):
    """``var_mean(x, dims, correction, keepdim)`` over the batch and every dim but the channels
    (``[rows, C, *spatial]``, dims ``[0, 2, ...]``): a batch norm's statistics as Inductor decomposes
    it. A barrier without an apply pass: its two outputs are whole (``STAT``), and the ops that
    normalise with them (``rsqrt(var + eps)`` outside the site, ``(x - mean) * invstd`` in it) run
    in the stage after."""
    x = node.args[0]
    s = state_of(x)
    ndim = val(x).dim() if isinstance(val(x), torch.Tensor) else 0
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    correction = node.kwargs.get("correction", 1)
    keepdim = bool(node.kwargs.get("keepdim", False))
    if (not is_rows(s, 1) or ndim < 2 or dims is None or len(node.args) > 2
            or set(node.kwargs) - {"correction", "keepdim"} or not isinstance(correction, (int, float))):
        return None
    if sorted(d % ndim for d in dims) != [0, *range(2, ndim)] or val(x).dtype not in (torch.float32, torch.float64):
        return None

    def reduce(emit, args, count=None):
        return _var_mean_reduce(emit, args, count, keepdim=keepdim)

    def combine(emit, partials, args):
        var, mean = _statistics(emit, partials, correction)
        return {0: var, 1: mean}, None

    return Split((STAT, STAT), barrier=Barrier(reduce, combine, None))


def _batch_norm(node, state_of):
    """``_native_batch_norm_legit_functional(x, w, b, running_mean, running_var, training, ...)``."""
    x, weight, bias, running_mean, running_var, training = node.args[:6]
    s = _affine_float(x, weight, bias, state_of)
    if s is None or not training or any(state_of(t, whole=True) != WHOLE for t in (running_mean, running_var)):
        return None
    return Split((s, STAT, STAT, STAT, STAT), barrier=BATCH_NORM)


def _batch_norm_backward(node, state_of):
    """``native_batch_norm_backward(grad, x, w, running_mean, running_var, save_mean, save_invstd,
    train, eps, mask)`` in training, with the input's gradient asked for."""
    grad, x, weight, running_mean, running_var, mean, invstd, train, _eps, mask = node.args[:10]
    s = _affine_float(x, weight, weight, state_of)
    if s is None or not train or not mask[0] or state_of(grad) != s or mean is None or invstd is None:
        return None
    stats = [t for t in (running_mean, running_var, mean, invstd) if t is not None]
    if any(state_of(t, whole=True) != WHOLE for t in stats):
        return None
    return Split((s, STAT, STAT), barrier=BATCH_NORM_BACKWARD)


BARRIER_RULES = {
    aten.var_mean.correction: _batch_statistics,
    aten._native_batch_norm_legit_functional.default: _batch_norm,
    aten.native_batch_norm_backward.default: _batch_norm_backward,
}

__all__ = ["Barrier", "BARRIER_RULES", "STAT"]

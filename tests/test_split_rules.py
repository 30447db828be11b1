"""Every rule of the split table (``remat.capture.split_rules.RULES``), op by op: a small step whose
ops each rule must split, split into chunks by force, against the same step unsplit and eager.

Each case checks that every op it names runs once per chunk where the unsplit step runs it once, for
one call at least (the rule took that call into a site); that the loss is eager's to rounding; that
the gradients are eager's to the rounding of sums taken in another order; and that the split step's
measured peak is its prediction. Gradients are held against a float64 eager step: the split's error
may exceed eager float32's own by at most 1e-6 of the tensor's largest entry (a weight's gradient
sums the chunks' parts in another order than the unsplit reduction; against eager float32 alone,
convolution weight gradients differ by 1.7e-6 of their largest entry, within what eager float32 is
itself off from float64). A last test holds the table to the cases: a rule added without a case here
(or a named test elsewhere, for ops that only CUDA or Inductor's decompositions make) fails it.
"""

from __future__ import annotations

import collections
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import remat
from remat.api import capture_and_plan
from remat.capture.split_rules import RULES
from remat.measure import measure_step

from .test_split import _grads

aten = torch.ops.aten
MiB = 2**20
CHUNKS = 2


class Rows(nn.Module):
    """A linear layer (``t``, ``mm`` or ``addmm``, ``view``), then ``body``, then cross-entropy over
    the rows (``_log_softmax``, ``nll_loss``, their backwards; ``sum`` of the bias's gradient)."""

    def __init__(self, body, d=32, hidden=256, classes=256):
        super().__init__()
        self.body = body
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, classes)

    def forward(self, x, target):
        h = self.body(self.up(x))
        return F.cross_entropy(self.down(h).flatten(0, 1), target.flatten())


def _rows_args():
    torch.manual_seed(0)
    return torch.randn(4, 64, 32), torch.randint(0, 256, (4, 64))


class Stats(nn.Module):
    """Reductions within each row."""

    def forward(self, h):
        h = h - h.amax(-1, keepdim=True) + 0.5 * h.amin(-1, keepdim=True)
        var, mean = torch.var_mean(h, -1, keepdim=True)
        h = (h - mean) * torch.rsqrt(h.var(-1, keepdim=True) + var + 1e-5)
        return h + h.mean(-1, keepdim=True) + h.sum(-1, keepdim=True) * 1e-3


class Body(nn.Module):
    """``fn`` as a module: the ops a case puts between the two linear layers of :class:`Rows`."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, h):
        return self.fn(h)


def _split_cat(h):  # the cat's backward slices the incoming gradient, the split's concatenates
    a, b = F.gelu(h).split(h.shape[-1] // 2, dim=-1)
    return torch.cat([b, a], dim=-1)


def _split_sizes(h):
    a, b = torch.split(h, [100, h.shape[-1] - 100], dim=-1)
    return torch.cat([b, a], dim=-1)


def _views(h):  # view, transpose and permute of dims after the rows, a reshape of the non-contiguous result
    return h.view(*h.shape[:2], 16, -1).transpose(2, 3).permute(0, 1, 3, 2).reshape(h.shape) * h


class Matmul(nn.Module):
    """``matmul`` of a 3-D tensor by a weight: AOTAutograd's ``view``, ``mm``, ``_unsafe_view``."""

    def __init__(self, d=256):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d) / d**0.5)

    def forward(self, h):
        return torch.matmul(h, self.weight)


def _rotate_half(h):  # rotary embeddings' halves: slices, and their gradients put back in place
    half = h.shape[-1] // 2
    return torch.cat([-h[..., half:], h[..., :half]], dim=-1) * h


def _unsqueeze_softmax(h):
    return h.unsqueeze(-1).squeeze(-1).softmax(-1) * h


def _casts(h):
    return h.double().float().clone() * h


def _mean_expand(h):  # mean's gradient expands over the row
    return h.mean(-1, keepdim=True).expand(h.shape) * h


class Gathered(nn.Module):
    """A loss that picks each row's target log-probability itself (``gather``), mean over the rows."""

    def __init__(self, d=32, classes=256):
        super().__init__()
        self.head = nn.Linear(d, classes)

    def forward(self, x, target):
        logp = torch.log_softmax(self.head(x), -1)
        return -logp.gather(-1, target.unsqueeze(-1)).mean()


class ConvPools(nn.Module):
    """Convolutions and poolings, split by images."""

    def __init__(self, adaptive: bool = False):
        super().__init__()
        self.adaptive = adaptive
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        if self.adaptive:  # the loss sums a whole tensor (``sum.default``)
            return (self.conv2(F.adaptive_avg_pool2d(F.relu(self.conv(x)), 24)) ** 2).sum()
        h = F.max_pool2d(F.relu(self.conv(x)), 2)
        return F.avg_pool2d(self.conv2(h), 2).square().mean(dim=(1, 2, 3)).sum(0)


class Attention(nn.Module):
    """Projections, batched matmuls and the CPU flash kernel, split by sequences; the loss is a mean
    (``mean.default``)."""

    def __init__(self, d=64):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.bmm(q, k.transpose(1, 2)).softmax(-1)
        mixed = torch.bmm(scores, v)
        flash = F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)
        return (mixed * flash).mean()


def _seq_args():
    torch.manual_seed(0)
    return (torch.randn(8, 128, 64),)


def _image_args():
    torch.manual_seed(0)
    return (torch.randn(8, 3, 32, 32),)


# case -> (model builder, args builder, the ops each chunk must run)
CASES = {
    "linear, gelu, cross-entropy": (lambda: Rows(nn.GELU()), _rows_args, [
        aten.mm.default, aten.t.default, aten.view.default, aten.detach.default, aten.gelu.default,
        aten.gelu_backward.default,
        aten._log_softmax.default, aten._log_softmax_backward_data.default, aten.nll_loss_forward.default,
        aten.nll_loss_backward.default, aten.sum.dim_IntList]),
    "layer norm": (lambda: Rows(nn.LayerNorm(256)), _rows_args, [
        aten.native_layer_norm.default, aten.native_layer_norm_backward.default]),
    "reductions within rows": (lambda: Rows(Stats()), _rows_args, [
        aten.amax.default, aten.amin.default, aten.var_mean.correction, aten.var.correction, aten.mean.dim]),
    "split and cat": (lambda: Rows(Body(_split_cat)), _rows_args, [
        aten.split.Tensor, aten.slice.Tensor, aten.cat.default]),
    "rotary halves": (lambda: Rows(Body(_rotate_half)), _rows_args, [aten.slice.Tensor, aten.slice_backward.default]),
    "split with sizes": (lambda: Rows(Body(_split_sizes)), _rows_args, [aten.split_with_sizes.default]),
    "views, transposes and permutes": (lambda: Rows(Body(_views)), _rows_args, [
        aten.view.default, aten.transpose.int, aten.permute.default]),
    "matmul of a 3-D tensor": (lambda: Rows(Matmul()), _rows_args, [aten._unsafe_view.default]),
    "unsqueeze, squeeze and softmax": (lambda: Rows(Body(_unsqueeze_softmax)), _rows_args, [
        aten.unsqueeze.default, aten.squeeze.dim, aten._softmax.default, aten._softmax_backward_data.default]),
    "dtype casts and clone": (lambda: Rows(Body(_casts)), _rows_args, [aten._to_copy.default, aten.clone.default]),
    "mean over a row, its gradient expanded": (lambda: Rows(Body(_mean_expand)), _rows_args, [
        aten.mean.dim, aten.expand.default]),
    "gathered loss": (Gathered, _rows_args, [aten.gather.default, aten.mean.default]),
    "convolutions, max and average pooling": (ConvPools, _image_args, [
        aten.convolution.default, aten.convolution_backward.default, aten.max_pool2d_with_indices.default,
        aten.max_pool2d_with_indices_backward.default, aten.avg_pool2d.default, aten.avg_pool2d_backward.default]),
    "adaptive pooling, a summed loss": (lambda: ConvPools(adaptive=True), _image_args, [
        aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool2d_backward.default, aten.sum.default]),
    "attention": (Attention, _seq_args, [
        aten.bmm.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default, aten.addmm.default]),
}

# rules whose ops no CPU step of plain PyTorch makes here, and the tests that split them
ELSEWHERE = {
    **{op: "tests/test_split_cuda.py (needs CUDA)" for op in (
        aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_efficient_attention_backward.default,
        aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_flash_attention_backward.default,
        aten._scaled_dot_product_cudnn_attention.default, aten._scaled_dot_product_cudnn_attention_backward.default)},
    **{op: "tests/test_split_batch.py::test_under_inductor_a_batch_norm_cnn_splits_below_its_unsplit_floor "
           "(Inductor's decomposed max pooling and its backward)" for op in (
        aten.scatter_add.default, torch.ops.prims._low_memory_max_pool_with_offsets.default,
        torch.ops.prims._low_memory_max_pool_offsets_to_indices.default)},
}
# ops AOTAutograd's graphs do not hold (a reshape becomes a view or an _unsafe_view), split by the very
# rule of an op tested above
SAME_RULE_AS = {aten.alias.default: aten.detach.default, aten.reshape.default: aten.view.default}


def _as_exact_as_eager(ours: dict, eager: dict, exact: dict, rel: float = 1e-6):
    """Each gradient at most ``rel`` of its tensor's largest entry further from the float64 step's
    (``exact``) than eager float32's: sums in another order, no worse than eager's own rounding."""
    assert ours.keys() == eager.keys() == exact.keys()
    for name, g in ours.items():
        ref = exact[name]
        scale = ref.abs().max().item()
        split_error = (g.double() - ref).abs().max().item() / scale
        eager_error = (eager[name].double() - ref).abs().max().item() / scale
        assert split_error <= eager_error + rel, f"{name}: split {split_error:.3g}, eager {eager_error:.3g}"


# a chunk of a mean over every row runs a sum (the combined sums are divided by the count once)
CHUNK_TARGET = {aten.mean.default: aten.sum.default}


def _op_counts(graph_module) -> collections.Counter:
    return collections.Counter(n.target for n in graph_module.graph.nodes if isinstance(n.target, torch._ops.OpOverload))


@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_splits_its_op_into_chunks_that_give_the_unsplit_values(case):
    make, make_args, ops = CASES[case]
    torch.manual_seed(0)
    model, args = make(), make_args()
    eager_loss, eager = _grads(copy.deepcopy(model), *args)
    _, exact = _grads(copy.deepcopy(model).double(), *(a.double() if a.is_floating_point() else a for a in args))
    _, whole = capture_and_plan(copy.deepcopy(model), *args, split="off", cache=False)
    plan, cap = capture_and_plan(copy.deepcopy(model), *args, split=CHUNKS, cache=False)
    assert plan.info["split"]["chunks"] == CHUNKS, plan.info
    before, after = _op_counts(whole.joint), _op_counts(cap.joint)
    # at least one of the op's calls runs once per chunk (others may stay whole, outside the sites)
    def split_once(op) -> bool:
        target = CHUNK_TARGET.get(op, op)
        return before[op] > 0 and after[target] - before[target] >= (CHUNKS - 1 if target is op else CHUNKS)
    unsplit = [op for op in ops if not split_once(op)]
    assert not unsplit, {str(op): (before[op], after[op]) for op in unsplit}
    split = remat.optimize(copy.deepcopy(model), *args, split=CHUNKS, cache=False)
    loss, grads = _grads(split, *args)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-6, atol=0)
    _as_exact_as_eager(grads, eager, exact)
    predicted = split.plan.peak_bytes
    measured = measure_step(lambda: split(*args).backward(), setup=lambda: split.zero_grad(set_to_none=True),
                            warmup=1, repeats=1).peak_bytes
    assert abs(measured - predicted) <= max(0.05 * predicted, 2 * MiB), (measured, predicted)


def test_every_rule_of_the_table_has_a_case():
    """A rule added to the table needs a case above (or, for an op only CUDA or Inductor's
    decompositions make, a test elsewhere named in ``ELSEWHERE``)."""
    assert all(RULES[op] is RULES[same] for op, same in SAME_RULE_AS.items())
    covered = {op for _, _, ops in CASES.values() for op in ops} | set(ELSEWHERE) | set(SAME_RULE_AS)
    missing = [str(op) for op in RULES if op not in covered]
    assert not missing, f"split rules without a test case: {missing}"

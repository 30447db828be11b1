"""Splits of a step captured with symbolic sizes: one split graph runs every size of its bucket."""

from __future__ import annotations

import copy
import operator
import random

import pytest
import torch

import remat
from remat.capture.shapes import concrete_joint, evaluate, symbols_of
from remat.capture.split import find_sites, split_joint
from remat.capture.split_sizes import SymbolicSizes, chunk_bounds
from remat.measure import measure_step
from remat.models.small import MHABlock, SDPABlock

from .test_split import _close, _gpt2, _grads
from .test_split_batch import ConvBN

MiB = 2**20


def _dynamic_step(model, inputs_of, sizes=(80, 100)):
    """The bucketed step of ``model`` captured with dynamic sizes (two calls of other sizes)."""
    steps = []
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="remat", options={"cache": False, "on_step": steps.append})
    for size in sizes:
        args, kwargs = inputs_of(size)
        compiled(*args, **kwargs).backward()
    return steps[0]


def _joint_inputs(joint, binding: dict, vocab: int) -> list:
    torch.manual_seed(0)
    out = []
    for n in joint.graph.find_nodes(op="placeholder"):
        v = n.meta["val"]
        if isinstance(v, torch.SymInt):
            out.append(evaluate(v, binding))
            continue
        shape = [evaluate(x, binding) for x in v.shape]
        out.append(torch.randn(shape, dtype=v.dtype) if v.dtype.is_floating_point else torch.randint(0, vocab, shape))
    return out


def _tensors(outputs) -> list[torch.Tensor]:
    return [x for x in torch.utils._pytree.tree_leaves(outputs) if isinstance(x, torch.Tensor)]


def _gpt2_case():
    model, batch = _gpt2(vocab=4000, n_embd=32, batch=2, seq=128)
    return model, lambda t: ((), {"input_ids": batch["input_ids"][:, :t], "labels": batch["input_ids"][:, :t]})


def _block_case(cls):
    torch.manual_seed(0)
    return cls(), lambda t: ((torch.randn(6, t, 64),), {})


@pytest.mark.parametrize("case, chunks, expected", [
    ("gpt2", 4, "_log_softmax"),  # the LM head and loss over B * T tokens
    ("sdpa", 2, "_scaled_dot_product_flash_attention_for_cpu"),  # whole sequences: [T, D] after the rows
    ("mha", 2, "bmm"),  # the scores over B * H: [T, T] after the rows
])
def test_a_split_of_a_step_with_symbolic_sizes_runs_every_size_of_its_bucket(case, chunks, expected):
    model, inputs_of = {"gpt2": _gpt2_case, "sdpa": lambda: _block_case(SDPABlock),
                        "mha": lambda: _block_case(MHABlock)}[case]()
    step = _dynamic_step(model, inputs_of)
    joint, symbols = step.joint, symbols_of(step.joint)
    high, low = {s: 128 for s in symbols}, {s: 97 for s in symbols}  # the bucket 97..128
    concrete = concrete_joint(joint, high)
    sizes = SymbolicSizes(joint, low, high)
    sites = find_sites(concrete, step.num_fwd_outputs, sizes)
    assert any(expected in site.describe() for site in sites)
    assert sizes.allows(sites, chunks)
    split = split_joint(concrete, step.num_fwd_outputs, sites, chunks, sizes)
    # where the rows vary, the chunk bounds are computed from the sizes at run time, not fixed at the edge
    varying = any(sizes.units(site).free_symbols for site in sites)
    assert varying == (case != "sdpa")  # the SDPA block splits its 6 sequences: their sizes after the rows vary
    assert varying == any(n.target is operator.floordiv for n in split.graph.nodes)
    for length in (97, 100, 113, 128):  # 97 and 113 rows do not divide into equal chunks
        inputs = _joint_inputs(joint, {s: length for s in symbols}, vocab=4000)
        want = _tensors(torch.fx.Interpreter(joint).run(*inputs))
        got = _tensors(split(*inputs))
        assert [x.shape for x in got] == [x.shape for x in want]
        for a, b in zip(got, want):  # rows bitwise where split by rows; sums over chunks in another order
            assert (a - b).abs().max() <= 1e-5 * b.abs().max(), (length, (a - b).abs().max(), b.abs().max())
        # (the row-wise ones were bitwise on an Intel Xeon, not on an AMD EPYC, whose gemm rounds a chunk
        # of rows differently from the whole: the tolerance above is what holds on every CPU)


def test_chunks_at_every_size_of_a_bucket_are_no_larger_than_at_its_edge():
    for edge_rows, k in ((256, 4), (192, 8), (96, 32)):
        at_edge = edge_rows // k
        for rows in range(k, edge_rows + 1):
            sizes = [end - start for start, end in chunk_bounds(rows, k)]
            assert sum(sizes) == rows and 1 <= min(sizes) and max(sizes) <= at_edge, (edge_rows, k, rows, sizes)


def test_batch_norms_two_passes_split_under_symbolic_sizes_count_each_chunk_at_run_time():
    torch.manual_seed(0)
    step = _dynamic_step(ConvBN(), lambda b: ((torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,))), {}),
                         sizes=(10, 12))
    joint, symbols = step.joint, symbols_of(step.joint)
    high = {s: 16 for s in symbols}
    concrete = concrete_joint(joint, high)
    sizes = SymbolicSizes(joint, {s: 13 for s in symbols}, high)
    (site,) = find_sites(concrete, step.num_fwd_outputs, sizes)
    assert any(split.barrier is not None for split in site.splits.values())
    split = split_joint(concrete, step.num_fwd_outputs, [site], 4, sizes)
    assert any(n.target is operator.truediv for n in split.graph.nodes)  # each chunk's share of the count
    static = split_joint(concrete, step.num_fwd_outputs, find_sites(concrete, step.num_fwd_outputs), 4)
    for batch in (13, 14, 16):  # 13 and 14 images: chunks of 3 and 4
        inputs = _joint_inputs(joint, {s: batch for s in symbols}, vocab=10)
        want = _tensors(torch.fx.Interpreter(joint).run(*inputs))
        got = _tensors(split(*inputs))
        # statistics summed in another order, and BatchNorm's input gradient cancels: to rounding
        # (1.7e-5 of the largest magnitude at 13 images, 7.1e-6 at 16, the static split's too)
        for a, b in zip(got, want):
            assert (a - b).abs().max() <= 5e-5 * b.abs().max(), (batch, (a - b).abs().max(), b.abs().max())
        if batch == 16:  # at the edge, the same numbers as the step split for that one size
            assert all(torch.equal(a, b) for a, b in zip(got, _tensors(static(*inputs))))


def test_a_batch_norm_cnn_below_its_floor_trains_on_with_a_smaller_last_batch():
    """A smaller batch (the last of an epoch) makes Dynamo capture the step again with the batch
    symbolic; every later batch runs a bucket's plan, which needs BatchNorm split in two passes."""
    torch.manual_seed(0)
    model = ConvBN()
    eager = copy.deepcopy(model)
    x, target = torch.randn(10, 3, 32, 32), torch.randint(0, 10, (10,))
    planned = remat.optimize(model, x, target, budget=0.5, cache=False)
    assert planned.plan.info["split"]["chunks"] >= 2
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (planned, eager)]
    for step, batch in enumerate((10, 7, 10, 9)):
        x, target = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
        loss, grads = _grads(planned, x, target)
        eager_loss, eager_grads = _grads(eager, x, target)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
        _close(grads, eager_grads, rtol=1e-4, atol=1e-5)
        for optimizer in optimizers:
            optimizer.step()
        plan = planned.plan
        if step:
            assert plan.info["bucket"] and plan.info["split"]["chunks"] >= 2, plan.info
        kept = copy.deepcopy(planned.state_dict())  # the measuring run updates the running statistics
        measured = measure_step(lambda: planned(x, target).backward(), setup=lambda: planned.zero_grad(set_to_none=True),
                                warmup=0, repeats=1).peak_bytes
        planned.load_state_dict(kept)
        assert measured <= plan.peak_bytes + 64 * 1024, (batch, measured, plan.peak_bytes)
    for a, b in zip(planned.state_dict().values(), eager.state_dict().values()):  # running statistics too
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_lengths_below_the_unsplit_floor_train_with_a_split_plan_per_bucket():
    """A 32k vocabulary at 0.6x the unsplit step's smallest peak (93.75 MiB at 128 tokens): every
    bucket that needs it splits the LM head and loss; an optimizer's steps over lengths of three
    buckets end with the weights eager PyTorch's steps give, and each measured peak is within the
    budget and at most its bucket's prediction."""
    budget = 56 * MiB
    model, batch = _gpt2(vocab=32000, n_embd=32, batch=2, seq=128)
    eager = copy.deepcopy(model)
    planned = remat.optimize(model, **batch, budget=budget, cache=False)
    assert planned.plan.info["split"]["chunks"] >= 2
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (planned, eager)]
    lengths = random.Random(1).sample(range(40, 129), 6)
    for i, length in enumerate(lengths):
        ids = batch["input_ids"][:, :length]
        loss, grads = _grads(planned, input_ids=ids, labels=ids)
        eager_loss, eager_grads = _grads(eager, input_ids=ids, labels=ids)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=0)
        _close(grads, eager_grads)
        for optimizer in optimizers:
            optimizer.step()
        plan = planned.plan
        assert plan.info["bucket"] and plan.peak_bytes <= budget
        if length > 64:  # buckets 96 and 128: 130 tokens and more need the split
            assert plan.info["split"]["chunks"] >= 2, (length, plan.info)
        if i % 2 == 0:
            measured = measure_step(lambda: planned(input_ids=ids, labels=ids).backward(),
                                    setup=lambda: planned.zero_grad(set_to_none=True), warmup=0, repeats=1).peak_bytes
            assert measured <= plan.peak_bytes + 2 * MiB, (length, measured, plan.peak_bytes)
    for (name, a), b in zip(planned.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_a_buckets_full_plan_splits_where_that_is_predicted_faster(monkeypatch):
    """A bucket that fits unsplit gets a warm plan at once (a fast solver's, recomputing); once that
    has run ``UPGRADE_AFTER`` steps the bucket is planned in full, and split plans are weighed then as
    for a static step: two chunks leave the budget room to recompute nothing, predicted faster than
    the unsplit full plan. Gradients as eager's at every length, before and after."""
    from remat.capture.split import FASTER_SPLIT_GAIN
    from remat.execute import buckets

    monkeypatch.setattr(buckets, "UPGRADE_AFTER", 2)
    model, batch = _gpt2(vocab=32000, n_embd=32, batch=2, seq=128, layers=2)
    options = dict(cache=False, cost_model="flops")  # analytic costs: the premise does not move with the load
    store = remat.plan(model, **batch, solver="store_all", split="off", **options).peak_bytes
    least = remat.plan(model, **batch, budget="min", split="off", **options).peak_bytes
    budget = int(least + 0.05 * (store - least))  # fits unsplit with recomputation (rotor +5.4%, hybrid +4.8%)
    unsplit = remat.plan(model, **batch, budget=budget, split="off", **options)
    planned = remat.optimize(copy.deepcopy(model), **batch, budget=budget, **options)
    eager = copy.deepcopy(model)
    for length in (100, 113, 127):  # one bucket, 97..128: the third step runs the full plan
        ids = batch["input_ids"][:, :length]
        loss, grads = _grads(planned, input_ids=ids, labels=ids)
        eager_loss, eager_grads = _grads(eager, input_ids=ids, labels=ids)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=0)
        _close(grads, eager_grads)
    first, full = [p for p in planned.plans if p.info.get("bucket")]
    assert first.info.get("warm") and first.recomputations and "split" not in first.info
    assert full.info["split"]["chunks"] >= 2 and "predicted" in full.info["chosen by"] and full.peak_bytes <= budget
    assert full.simulation.step_seconds < unsplit.simulation.step_seconds * (1 - FASTER_SPLIT_GAIN)
    assert planned.plan is full


def test_plan_lengths_splits_the_buckets_no_plan_fits_as_captured():
    model, batch = _gpt2(vocab=32000, n_embd=32, batch=2, seq=128)
    budget = 56 * MiB
    unsplit = remat.plan_lengths(model, **batch, lengths=(65, 128), budget=budget, split="off", cache=False)
    split = remat.plan_lengths(model, **batch, lengths=(65, 128), budget=budget, cache=False)
    assert [r.edge for r in unsplit] == [r.edge for r in split] == [96, 128]
    for refused, row in zip(unsplit, split):
        assert refused.plan is None and refused.error.min_budget_bytes > budget  # the LM head's floor
        assert row.plan.peak_bytes <= budget and row.plan.info["split"]["chunks"] >= 2


def test_remat_compile_splits_a_bucket_with_dynamic_shape_kernels():
    """Under Inductor: the bucket 97..128 is planned once with the LM head split (its chunks' sizes
    computed at run time), compiled with dynamic-shape kernels, and runs three lengths of the bucket
    without compiling again; gradients as eager's to Inductor's tolerance, measured peaks within the
    budget and at most the prediction."""
    model, batch = _gpt2(vocab=32000, n_embd=32, batch=2, seq=128)
    budget = 56 * MiB  # the fused step needs 66.8 MiB unsplit (62.5 with offloading)
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = remat.compile(copy.deepcopy(model), budget=budget, cache=False)
    for length in (100, 113, 128):
        ids = batch["input_ids"][:, :length].clone()
        torch._dynamo.mark_dynamic(ids, 1)  # the sequence symbolic from the first call: no static compilation
        loss, grads = _grads(compiled, input_ids=ids, labels=ids)
        eager_loss, eager_grads = _grads(eager, input_ids=ids, labels=ids)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
        _close(grads, eager_grads, rtol=1e-4, atol=1e-5)
        measured = measure_step(lambda: compiled(input_ids=ids, labels=ids).backward(),
                                setup=lambda: compiled.zero_grad(set_to_none=True), warmup=0, repeats=1).peak_bytes
        plan = compiled.plan
        assert plan.info["bucket"] and plan.info["split"]["chunks"] >= 2 and plan.peak_bytes <= budget
        assert measured <= plan.peak_bytes + 2 * MiB, (length, measured, plan.peak_bytes)
    assert len(compiled.plans) == 1  # one plan, one compilation for the three lengths

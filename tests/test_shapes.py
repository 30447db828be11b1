"""Variable input shapes: one dynamic capture, a plan per size bucket, the budget at every length.

A causal LM from the zoo is fed 30 distinct sequence lengths; at each, its gradients equal eager
PyTorch's, the measured peak stays within the byte budget, and the step is captured at most twice
(the first shape, then once with dynamic sizes) with no more plans than buckets.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

import remat
from remat import models
from remat.capture.shapes import bucket_edge, default_edges, lower_end
from remat.errors import InfeasibleBudgetError
from remat.measure import measure_step

MiB = 2**20
BUDGET = "9MiB"  # store_all fits up to ~100 tokens; 129..192 need recomputation; 193..256 cannot fit
LENGTHS = random.Random(0).sample(range(5, 193), 30)


def test_default_buckets_are_powers_of_two_and_midpoints():
    assert default_edges(100) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]
    assert [bucket_edge(n) for n in (1, 5, 64, 65, 96, 97, 128, 129, 1000)] == [1, 6, 64, 96, 96, 128, 128, 192, 1024]
    assert [lower_end(e) for e in (1, 6, 64, 96, 1024)] == [1, 5, 49, 65, 769]


def test_user_edges_and_sizes_above_them():
    edges = [64, 200, 512]
    assert [bucket_edge(n, edges) for n in (1, 64, 65, 200, 201, 600)] == [64, 64, 200, 200, 512, 768]
    assert [lower_end(e, edges) for e in (64, 200, 512, 768)] == [1, 65, 201, 513]


def _gpt2():
    ex = models.build("gpt2", size="tiny")  # 2 layers, batch 2; dropout stays on
    return ex.model


def _ids(length: int) -> torch.Tensor:
    return torch.randint(0, 1000, (2, length), generator=torch.Generator().manual_seed(length))


def _grads(model, ids, seed):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    model(input_ids=ids, labels=ids).backward()
    return [p.grad.clone() for p in model.parameters()]


def _check_lengths(model, planned, lengths, measure_every=6):
    eager = copy.deepcopy(model)
    for i, length in enumerate(lengths):
        ids = _ids(length)
        got, want = _grads(planned, ids, seed=i), _grads(eager, ids, seed=i)
        for a, b in zip(got, want):
            assert torch.equal(a, b), f"length {length}: gradients differ from eager"
        if i % measure_every == 0:
            def step():
                torch.manual_seed(i)
                planned(input_ids=ids, labels=ids).backward()

            peak = measure_step(step, setup=lambda: model.zero_grad(set_to_none=True), warmup=0, repeats=1).peak_bytes
            assert peak <= 9 * MiB, f"length {length}: measured {peak / MiB:.2f} MiB over the 9 MiB budget"


def _captures(plans) -> int:
    return len({p.info.get("capture") for p in plans})


def test_thirty_lengths_through_optimize():
    model = _gpt2()
    m = remat.optimize(model, input_ids=_ids(64), labels=_ids(64), budget=BUDGET, cache=False)
    _check_lengths(model, m, LENGTHS)
    buckets = {bucket_edge(n) for n in LENGTHS}
    assert _captures(m.plans) <= 2
    assert len(m.plans) <= len(buckets) + 1  # the first, static capture's plan, and one per bucket
    assert all(p.peak_bytes <= 9 * MiB for p in m.plans)
    assert any(p.recomputations for p in m.plans), "the longest lengths must need recomputation"
    assert list(m.plan.info["bucket"].values()) == [bucket_edge(LENGTHS[-1])]  # the bucket that ran last


def test_thirty_lengths_through_torch_compile():
    model = _gpt2()
    plans = []
    compiled = torch.compile(model, backend="remat", options={"budget": BUDGET, "cache": False,
                                                               "on_plan": lambda p, c: plans.append(p)})
    _check_lengths(model, compiled, LENGTHS, measure_every=10)
    assert _captures(plans) <= 2 and len(plans) <= len({bucket_edge(n) for n in LENGTHS}) + 1


def test_a_length_over_the_budget_raises_and_the_next_one_runs():
    model = _gpt2()
    m = remat.optimize(model, input_ids=_ids(64), labels=_ids(64), budget="6MiB", solver="rotor", cache=False)
    ids = _ids(80)
    m(input_ids=ids, labels=ids).backward()  # the dynamic capture
    for _ in range(2):  # refused before anything runs, and again without planning again
        too_long = _ids(230)
        with pytest.raises(InfeasibleBudgetError, match="at input sizes up to .*256") as info:
            m(input_ids=too_long, labels=too_long)
        assert info.value.min_budget_bytes > 6 * MiB
    ids = _ids(120)
    eager = copy.deepcopy(model)
    for a, b in zip(_grads(m, ids, 0), _grads(eager, ids, 0)):
        assert torch.equal(a, b)
    assert m.plan.peak_bytes <= 6 * MiB and m.plan.info["bucket"]


def test_a_causal_lm_computing_its_loss_from_labels_is_one_graph_planned_once():
    """No ``loss_type`` set: transformers logs a warning inside forward, which used to break the graph
    at the loss (a fraction below 1 was then infeasible). ``labels=input_ids`` (one tensor twice)
    plans once, in optimize and in every step after."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=500, n_positions=128,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    assert getattr(model, "loss_type", None) is None
    ids = torch.randint(0, 500, (2, 64))
    m = remat.optimize(model, input_ids=ids, labels=ids, budget=0.5, cache=False)
    (plan,) = m.plans
    assert any("nll_loss" in n.op for n in plan.graph.nodes) and plan.peak_bytes <= plan.budget_bytes
    for _ in range(2):
        m(input_ids=ids, labels=ids).loss.backward()
    assert m.plans == [plan]


def test_plan_lengths_says_what_each_length_costs_before_it_arrives():
    rows = remat.plan_lengths(_gpt2(), input_ids=_ids(64), labels=_ids(64), lengths=(16, 256), budget="6MiB",
                              solver="rotor", cache=False)  # rotor: fast; auto's warm buckets are tested above
    assert [r.edge for r in rows] == [16, 24, 32, 48, 64, 96, 128, 192, 256]
    fitting, refused = rows[:7], rows[7:]  # rotor's smallest peak passes 6 MiB between 129 and 192 tokens
    assert all(r.plan is not None and r.plan.peak_bytes <= 6 * MiB for r in fitting)
    assert [r.plan.recomputations for r in fitting[:5]] == [0] * 5  # short lengths need no recomputation
    assert fitting[-1].plan.recomputations > 0
    for r in refused:
        assert r.plan is None and isinstance(r.error, InfeasibleBudgetError) and r.error.min_budget_bytes > 6 * MiB
    assert len({r.plan.info["capture"] for r in fitting}) == 1  # one capture for every length


def test_cli_plan_lengths_prints_a_row_per_bucket_and_plots(tmp_path, capsys):
    from remat.tools.cli import main

    out = tmp_path / "lengths.png"
    assert main(["plan", "gpt2", "--size", "tiny", "--lengths", "16:128", "--budget", "6MiB", "--solver", "rotor",
                 "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "97..128" in text and "65..96" in text and "rotor" in text and out.stat().st_size > 0
    assert main(["plan", "gpt2", "--size", "tiny", "--lengths", "128:16"]) == 2  # a usage error


class _Shrinking(torch.nn.Module):
    """Pads its input to 256 positions: the padding it makes is smaller the longer the input."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        pad = x.new_zeros(x.shape[0], 256 - x.shape[1], 8)
        return self.lin(torch.cat([x, pad], 1)).relu().sum()


def test_a_bucket_whose_values_shrink_as_sizes_grow_is_refused():
    """A plan made at a bucket's edge is valid for the whole bucket only if no value is larger at a
    smaller size; where one is, the bucket is refused, naming the value and what to do."""
    from remat.errors import CaptureError

    torch.manual_seed(0)
    m = remat.optimize(_Shrinking(), torch.randn(2, 64, 8), cache=False)
    with pytest.raises(CaptureError, match=r"more memory at the bucket's smallest sizes.*buckets"):
        m(torch.randn(2, 100, 8)).backward()


def test_batches_of_other_sizes_with_batch_norm_match_eager_gradients_and_statistics():
    """The last partial batch (and any other batch size): BatchNorm's running statistics and the
    gradients stay bitwise equal to eager PyTorch's; each size runs its own bucket's plan."""
    ex = models.build("cnn_bn", size="tiny")
    model, eager = ex.model, copy.deepcopy(ex.model)
    m = remat.optimize(model, *ex.args, budget=0.85, cache=False)
    shape = ex.args[0].shape
    for batch in (shape[0], 5, 3, 7, 2):
        x = torch.randn(batch, *shape[1:])
        for net in (m, eager):
            (model if net is m else eager).zero_grad(set_to_none=True)
            torch.manual_seed(batch)
            ex.loss(net(x)).backward()
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), eager.parameters())), batch
        assert all(torch.equal(a, b) for a, b in zip(model.buffers(), eager.buffers())), batch
    assert _captures(m.plans) <= 2 and m.plan.info["bucket"] and m.plan.peak_bytes <= m.plan.budget_bytes


def test_a_joint_graph_made_concrete_without_running_ops_matches_fake_propagation(monkeypatch):
    """Each value of a bucket's concrete copy is sized from its symbolic fake tensor: the same sizes,
    strides, storage bytes and storage sharing as propagating concrete fake tensors through every op."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from remat.capture import shapes

    torch._dynamo.reset()  # no automatic-dynamic state left by another test of the same model code
    steps = []
    ids = _ids(40)
    torch._dynamo.mark_dynamic(ids, 1)
    compiled = torch.compile(_gpt2(), backend="remat", options={"on_step": steps.append, "cache": False})
    compiled(input_ids=ids, labels=ids).backward()
    joint = steps[0].joint
    (symbol,) = shapes.symbols_of(joint)
    with monkeypatch.context() as patch:  # the fast way runs no op: fake propagation would fail here
        patch.setattr(FakeTensorProp, "propagate_dont_convert_inputs", None)
        propagated = shapes.concrete_joint(joint, {symbol: 72})

    def described(gm):
        owners, out = {}, []
        for n in gm.graph.nodes:
            if n.op == "output":
                continue
            vals = n.meta.get("val")
            for v in vals if isinstance(vals, (tuple, list)) else [vals]:
                if isinstance(v, torch.Tensor):
                    owner = owners.setdefault(v.untyped_storage()._cdata, n.name)
                    out.append((n.name, tuple(v.shape), v.stride(), v.storage_offset(),
                                v.untyped_storage().nbytes(), owner))
        return out

    fast = described(propagated)
    monkeypatch.setattr(shapes, "_sized_metas", lambda *a: (_ for _ in ()).throw(RuntimeError("slow path")))
    slow = described(shapes.concrete_joint(joint, {symbol: 72}))
    assert fast == slow and len(fast) > 100
    assert any(shape and 72 in shape for _name, shape, *_ in fast)


def test_a_warm_plan_that_recomputes_is_planned_in_full_once_its_bucket_has_run_enough(monkeypatch):
    from remat.execute import buckets

    monkeypatch.setattr(buckets, "UPGRADE_AFTER", 3)
    model = _gpt2()
    eager = copy.deepcopy(model)
    # unsplit: a split step's sums over its chunks differ from eager's in rounding, and the gradients here are
    # compared bitwise (with recompute_less, keep_set's plan of the step split in two can be predicted the faster)
    m = remat.optimize(model, input_ids=_ids(64), labels=_ids(64), budget=BUDGET, cache=False, split="off")
    seen, made = [], []
    for i, length in enumerate([80, 150, 150, 150, 150]):
        ids = _ids(length)
        for a, b in zip(_grads(m, ids, i), _grads(eager, ids, i)):
            assert torch.equal(a, b), length
        seen.append(m.plan)
        made.append(len(m.plans))
    warm = seen[1]
    assert warm.info.get("warm") and warm.recomputations > 0 and warm.peak_bytes <= 9 * MiB  # fast first
    assert made[2] == made[1] and made[3] == made[2] + 1 and made[4] == made[3]  # planned in full once
    full = m.plans[-1]
    assert not full.info.get("warm") and full.peak_bytes <= 9 * MiB and full.info["bucket"] == warm.info["bucket"]
    kept = seen[3]  # the full plan where it is no slower, else the warm one
    assert kept is (full if full.step_seconds <= warm.step_seconds else warm) and seen[4] is kept


@pytest.fixture(scope="module")
def compiled_gpt2():
    """The zoo's tiny GPT-2 under remat.compile at 9 MiB, dropout drawn as eager draws it
    (``fallback_random``), and an eager twin."""
    model = _gpt2()
    eager = copy.deepcopy(model)
    m = remat.compile(model, budget=BUDGET, cache=False, options={"fallback_random": True})
    return model, m, eager


def test_thirty_lengths_through_remat_compile(compiled_gpt2):
    """Inductor: the first shape compiled for itself, then one compilation per size bucket, with
    dynamic-shape kernels that every length of the bucket runs (no capture, no plan for those);
    gradients as eager's (Inductor's kernels: to a tolerance), the measured peak within the budget."""
    model, m, eager = compiled_gpt2
    # 2 buckets (128, 192): each bucket is one Inductor compilation, which is most of this test's time
    lengths = random.Random(1).sample(range(97, 193), 30)
    for i, length in enumerate(lengths):
        ids = _ids(length)
        for a, b in zip(_grads(m, ids, seed=i), _grads(eager, ids, seed=i)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert i == 0 or list(m.plan.info["bucket"].values()) == [bucket_edge(length)]  # the plan that ran
        if i % 6 == 0 or length == max(lengths):
            def step():
                torch.manual_seed(i)
                m(input_ids=ids, labels=ids).backward()

            peak = measure_step(step, setup=lambda: model.zero_grad(set_to_none=True), warmup=0, repeats=1).peak_bytes
            assert peak <= 9 * MiB, f"length {length}: measured {peak / MiB:.2f} MiB over the 9 MiB budget"
    buckets = {bucket_edge(n) for n in lengths[1:]}
    dynamic = [p for p in m.plans if "bucket" in p.info]
    assert sorted(edge for p in dynamic for edge in p.info["bucket"].values()) == sorted(buckets)  # one per bucket
    assert len(m.plans) == len(buckets) + 1 and all(p.peak_bytes <= 9 * MiB for p in m.plans)
    assert any(p.recomputations for p in dynamic), "the longest lengths must need recomputation"


def test_a_length_over_the_budget_raises_under_remat_compile_and_the_next_one_runs(compiled_gpt2):
    model, m, eager = compiled_gpt2
    for _ in range(2):  # the bucket is refused, then refused again without planning again
        too_long = _ids(250)
        torch._dynamo.mark_dynamic(too_long, 1)  # a bucket, also where this test runs first (else a static capture)
        with pytest.raises(InfeasibleBudgetError, match="at input sizes up to .*256") as info:
            m(input_ids=too_long, labels=too_long).backward()
        assert info.value.min_budget_bytes > 9 * MiB
    ids = _ids(150)
    for a, b in zip(_grads(m, ids, seed=3), _grads(eager, ids, seed=3)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert m.plan.info["bucket"] and m.plan.peak_bytes <= 9 * MiB

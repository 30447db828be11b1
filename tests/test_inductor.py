"""remat under Inductor: remat.compile, the fused-graph memory model, exactness, the budget checked.

Inductor compiles C++ kernels on the CPU, so every compiled model here is a zoo "tiny" one and is
compiled once per module (fixtures)."""

import collections
import copy
import operator
import pickle
import types
import warnings

import pytest
import torch

import remat
from remat import models as zoo
from remat.capture import unwrap_compile_error as _unwrap_compile_error
from remat.capture import capture_joint
from remat.errors import InfeasibleBudgetError
from remat.inductor.fusion import fuse
from remat.inductor import partition as inductor_module
from remat.inductor import scheduling
from remat.inductor import (INDUCTOR_CONSTRAINTS, MEMORY_BEFORE, PLAN_PEAK, inductor_options, measured_step_peak,
                            partitioner)
from remat.plan import COMPUTE
from remat.solvers.planner import clear_caches, make_plan, smallest_plan, store_all_plan

from .models.helpers import without_codegen

MiB = 2**20


def _grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def _step(module, ex, seed=0):
    torch.manual_seed(seed)
    for p in module.parameters():
        p.grad = None
    ex.loss(module(*ex.args, **ex.kwargs)).backward()


def _assert_same_grads(model, other, rtol=1e-5, atol=1e-6):
    for mine, theirs in zip(_grads(model), _grads(other)):
        torch.testing.assert_close(mine, theirs, rtol=rtol, atol=atol)


def _with_model(ex, model):
    """``ex`` (a zoo example) with ``model`` in place of its own."""
    twin = copy.copy(ex)
    twin.model = model
    return twin


def _recomputations(plan):
    return sum(1 for ins in plan.instructions if ins.kind == COMPUTE) - len(plan.graph.nodes)


@pytest.fixture(scope="module")
def dropout_case():
    """dropout_mlp planned at its smallest budget by recomputation under Inductor with ``fallback_random``
    (random ops draw from torch's generator as in eager mode), and Inductor's own step of a copy, likewise.
    (``hierarchical``: ``auto``'s smallest plan here offloads a value instead of recomputing its chain.)"""
    ex = zoo.build("dropout_mlp", size="tiny")
    reference = copy.deepcopy(ex.model)
    planned = remat.compile(ex.model, *ex.args, budget="min", solver="hierarchical", options={"fallback_random": True},
                            example_kwargs=ex.kwargs)
    unplanned = torch.compile(reference, dynamic=False, options={"fallback_random": True})
    return ex, planned, reference, unplanned


def test_random_ops_replay_and_gradients_match_inductors_own_step(dropout_case):
    ex, planned, reference, unplanned = dropout_case
    assert _recomputations(planned.plan) > 0, "the budget should make the plan recompute"
    assert any(n.random for n in planned.plan.graph.nodes)
    _step(planned, ex, seed=3)
    _step(unplanned, _with_model(ex, reference), seed=3)
    _assert_same_grads(ex.model, reference)
    _step(reference, _with_model(ex, reference), seed=3)  # eager PyTorch draws the same numbers too
    _assert_same_grads(ex.model, reference)


def test_inductors_own_random_numbers_replay_exactly():
    """Inductor's default RNG (seeds drawn once per graph): a plan that recomputes gives the
    gradients of the store-everything plan. (The seeds are drawn by remat's replay operator, not by
    Inductor's kernel, so they are not the numbers of Inductor's own unplanned step: for those,
    ``fallback_random``.)"""
    ex = zoo.build("dropout_mlp", size="tiny")
    twin = copy.deepcopy(ex.model)
    # (budget="min" no longer recomputes here: reordered, store_all's work peaks as low on this tiny model)
    smallest = remat.compile(ex.model, *ex.args, solver="checkpoint_all", example_kwargs=ex.kwargs, calibrate=False)
    store_all = remat.compile(twin, *ex.args, solver="store_all", example_kwargs=ex.kwargs, calibrate=False)
    assert _recomputations(smallest.plan) > 0 and _recomputations(store_all.plan) == 0
    assert smallest.plan.info["seeded_copies"] > 0  # the backward draws its masks again from the seeds
    _step(smallest, ex, seed=5)
    _step(store_all, _with_model(ex, twin), seed=5)
    _assert_same_grads(ex.model, twin)


def test_measured_peak_is_within_the_budget_and_near_the_prediction(dropout_case):
    """A plan that replays a random op: its first run keeps the generator state, and the replay holds
    the current one aside while it runs; both counted, so the measured peak is at most the prediction
    and within 5% of it (the prediction keeps the logits the user may hold)."""
    ex, planned, _, _ = dropout_case
    plan = planned.plan
    assert _replays_random_ops(plan)
    measured = measured_step_peak(planned, ex.args, ex.kwargs)
    recorded = plan.info["measured_peak"]  # measured by remat.compile ("min": recorded, not re-planned)
    assert 0.95 * plan.peak_bytes <= recorded <= plan.peak_bytes, (recorded, plan.peak_bytes)
    assert 0.95 * plan.peak_bytes <= measured <= plan.peak_bytes, (measured, plan.peak_bytes)


def _replays_random_ops(plan) -> bool:
    runs = collections.Counter(ins.target for ins in plan.instructions if ins.kind == COMPUTE)
    return any(plan.graph.nodes[n].random and count > 1 for n, count in runs.items())


def test_random_ops_the_plan_runs_once_hold_no_generator_state():
    """Under Inductor with ``fallback_random`` a random op's first run keeps the generator state only
    where the plan replays the op (each first run used to keep a state, and copy it: the tiny MLP's
    smallest plan, which replays none, measured 4.9% above its prediction, a 5 KiB CPU state per
    dropout). The measured peak is at most the prediction and within 5% of it (the prediction keeps
    the logits the user may hold). The replaying plan: ``test_measured_peak_is_within...``."""
    ex = zoo.build("dropout_mlp", size="tiny")
    planned = remat.compile(ex.model, *ex.args, budget="min", options={"fallback_random": True}, calibrate=False,
                            cache=False, example_kwargs=ex.kwargs)
    plan = planned.plan
    assert not _replays_random_ops(plan)
    measured = measured_step_peak(planned, ex.args, ex.kwargs)
    assert 0.95 * plan.peak_bytes <= measured <= plan.peak_bytes, (measured, plan.peak_bytes)


def _assert_within_budget_and_near_prediction(planned, ex):
    """The compiled step's measured peak is at most the budget (the guarantee) and within 5% of
    the prediction; tiny models, so the 5% is a few KiB, not the 2 MiB slack larger ones get."""
    plan = planned.plan
    measured = measured_step_peak(planned, ex.args, ex.kwargs)
    assert measured <= plan.info["budget_bytes"], (measured, plan.info["budget_bytes"], plan.peak_bytes)
    assert abs(measured - plan.peak_bytes) <= 0.05 * plan.peak_bytes, (measured, plan.peak_bytes)


def test_recomputed_chains_are_not_fused_together():
    """resnet (tiny) at its smallest budget recomputes the stem's chain once for each of two
    backward uses. Inductor's horizontal fusion would merge the two copies' kernels and keep both
    alive (measured 1.5x the prediction); remat lets kernels fuse only next to each other in the
    plan's order, so the measured peak is the predicted one, within the budget, with no calibration
    re-plan. Gradients are Inductor's own unplanned step's."""
    ex = zoo.build("resnet", size="tiny")
    reference = copy.deepcopy(ex.model)
    planned = remat.compile(ex.model, *ex.args, budget="min", example_kwargs=ex.kwargs, calibrate=False)
    assert _recomputations(planned.plan) > 0
    _assert_within_budget_and_near_prediction(planned, ex)
    unplanned = torch.compile(reference, dynamic=False)
    _step(planned, ex)
    _step(unplanned, _with_model(ex, reference))
    _assert_same_grads(ex.model, reference, rtol=1e-4, atol=1e-5)


def test_parameters_and_state_dict_are_the_models(dropout_case):
    ex, planned, _, _ = dropout_case
    assert [id(p) for p in planned.parameters()] == [id(p) for p in ex.model.parameters()]
    assert planned.state_dict().keys() == ex.model.state_dict().keys()


@pytest.mark.parametrize("budget", ["min", 1.0])
def test_batch_norm_statistics_are_updated_once(budget):
    """Inductor keeps the running-statistics update in the joint graph (``copy_`` into the buffer):
    the lowering writes it back once per step, whatever the plan recomputes. (The step as captured:
    a split step's statistics, combined over its chunks, are tested in ``test_split_batch.py``.)"""
    ex = zoo.build("cnn_bn", size="tiny")
    reference = copy.deepcopy(ex.model)
    planned = remat.compile(ex.model, *ex.args, budget=budget, example_kwargs=ex.kwargs, calibrate=False,
                            split="off")
    if budget == "min":
        assert _recomputations(planned.plan) > 0
    _assert_within_budget_and_near_prediction(planned, ex)
    before = {name: b.clone() for name, b in ex.model.named_buffers()}
    _step(planned, ex)
    _step(reference, _with_model(ex, reference))
    theirs = dict(reference.named_buffers())
    for name, mine in ex.model.named_buffers():
        torch.testing.assert_close(mine, theirs[name], rtol=1e-5, atol=1e-6)
        if name.endswith("num_batches_tracked"):
            assert mine.item() == before[name].item() + 1
        else:
            assert not torch.equal(before[name], mine)  # the statistics did move (once: equal to eager's)
    _assert_same_grads(ex.model, reference, rtol=1e-4, atol=1e-5)


def test_batch_norm_stages_are_recomputable_by_the_chain_planners(monkeypatch):
    """Inductor decomposes BatchNorm: its running-statistics updates are ops of their own that read
    the buffers the step mutates, which no backward op needs. They run in the forward only, so a
    chain stage holding one is still recomputable (its recomputation skips them): rotor and
    hierarchical reach lower peaks than with such stages pinned, and a plan at such a peak
    compiles, fits its budget, updates the statistics once and gives Inductor's gradients."""
    from remat.solvers import chain as chain_module
    from remat.solvers.chain import decompose, first_run_only

    ex = zoo.build("cnn_bn", size="tiny")
    unplanned = partitioner(budget=None)
    _step(_through_partitioner(unplanned, copy.deepcopy(ex)), ex)
    graph = unplanned.last_plan.graph  # the fused graph remat plans under Inductor
    once = first_run_only(graph)
    pinned = set(graph.meta["no_backward_recompute"])
    assert once and once == pinned  # the running-statistics updates, and only they
    assert all(not set(graph.users[v]) for n in once for v in graph.nodes[n].outputs)  # forward outputs only
    assert all(stage.recomputable for stage in decompose(graph).stages)
    smallest = {name: smallest_plan(graph, name).peak_bytes for name in ("rotor", "hierarchical")}
    for name in smallest:  # each recomputation of a stage leaves the statistics alone
        plan = make_plan(graph, smallest[name], name)
        fwd, bwd = plan.schedule()
        assert not once & set(bwd) and once <= set(fwd)
    clear_caches()  # the chain planners are cached per graph
    monkeypatch.setattr(chain_module, "first_run_only", lambda graph: frozenset())  # the stages pinned
    assert not all(stage.recomputable for stage in decompose(graph).stages)
    pinned_smallest = {name: smallest_plan(graph, name).peak_bytes for name in smallest}
    monkeypatch.undo()
    clear_caches()
    assert all(smallest[name] < pinned_smallest[name] for name in smallest), (smallest, pinned_smallest)

    reference = copy.deepcopy(ex.model)
    planned = remat.compile(ex.model, *ex.args, budget=smallest["hierarchical"], solver="hierarchical",
                            example_kwargs=ex.kwargs, calibrate=False)
    assert _recomputations(planned.plan) > 0
    _assert_within_budget_and_near_prediction(planned, ex)
    _step(planned, ex)
    _step(reference, _with_model(ex, reference))
    theirs = dict(reference.named_buffers())
    for name, mine in ex.model.named_buffers():
        torch.testing.assert_close(mine, theirs[name], rtol=1e-5, atol=1e-6)
    _assert_same_grads(ex.model, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("solver", ["checkpoint_all", "store_all"])
def test_input_mutations_kept_in_the_graph_are_written_back_once(solver):
    """AOTAutograd keeps BatchNorm's running-statistics update in the joint graph (``copy_`` into the
    buffer) for a compiler that supports it; remat's capture and lowering (here the eager one,
    without Inductor's C++ compile) write it back once, when the forward ends."""
    from torch._dynamo.backends.common import aot_autograd

    from remat.backend import BackendOptions, _compile_boxed, make_partition_fn

    ex = zoo.build("cnn_bn", size="tiny")
    reference = copy.deepcopy(ex.model)
    captured = {}
    options = BackendOptions(solver=solver, on_plan=lambda plan, capture: captured.update(plan=plan, capture=capture))
    backend = aot_autograd(fw_compiler=_compile_boxed, bw_compiler=_compile_boxed,
                           partition_fn=make_partition_fn(options), keep_inference_input_mutations=True)
    compiled = torch.compile(ex.model, backend=backend, fullgraph=True, dynamic=False)
    for _ in range(2):  # twice: each step moves the statistics once more
        _step(compiled, ex)
        _step(reference, _with_model(ex, reference))
    assert len(captured["capture"].input_mutations) == 12  # 4 BatchNorms: mean, var, batch count
    assert (_recomputations(captured["plan"]) > 0) == (solver == "checkpoint_all")
    theirs = dict(reference.named_buffers())
    for name, mine in ex.model.named_buffers():
        torch.testing.assert_close(mine, theirs[name], rtol=1e-5, atol=1e-6)
    assert all(b.item() == 2 for name, b in ex.model.named_buffers() if name.endswith("num_batches_tracked"))
    _assert_same_grads(ex.model, reference, rtol=1e-4, atol=1e-5)


def _joint_graph_of(ex):
    """The joint graph Inductor hands its partitioner for ``ex`` (and the forward's output count)."""
    captured = {}

    def spy(gm, joint_inputs, *, num_fwd_outputs, **kwargs):
        captured["joint"] = (copy.deepcopy(gm), num_fwd_outputs)
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        return min_cut_rematerialization_partition(gm, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    class Spy(torch._inductor.custom_graph_pass.CustomPartitionerFn):
        __call__ = staticmethod(spy)

        def uuid(self):
            return None

    compiled = torch.compile(ex.model, dynamic=False, options={"custom_partitioner_fn": Spy(), "fx_graph_cache": False})
    ex.loss(compiled(*ex.args, **ex.kwargs)).backward()
    return captured["joint"]


def test_the_fused_graph_hides_inlined_values_and_never_raises_the_store_all_peak():
    capture = capture_joint(*_joint_graph_of(zoo.build("mlp", size="tiny")))
    fused = fuse(capture)
    assert len(fused.graph.nodes) < len(capture.graph.nodes)
    assert sorted(n for members in fused.members for n in members) == list(range(len(capture.graph.nodes)))
    assert store_all_plan(fused.graph).peak_bytes <= store_all_plan(capture.graph).peak_bytes
    plan = make_plan(fused.graph, "min", "checkmate")
    expanded = fused.expand(plan)
    assert expanded.graph is capture.graph and expanded.peak_bytes >= plan.peak_bytes


def test_each_reader_of_a_seeded_dropout_mask_draws_its_own_copy():
    """Inductor's seeded random values: the mask the forward and the backward both read becomes one
    copy per reader, the backward's in the backward, reading the seeds; no mask is left to store."""
    from remat.inductor.fusion import INDUCTOR_RANDOM, draw_random_per_reader

    gm, num_fwd_outputs = _joint_graph_of(zoo.build("dropout_mlp", size="tiny"))
    draws = [n for n in gm.graph.nodes if str(n.target) == INDUCTOR_RANDOM]
    shared_before = [n for n in gm.graph.nodes if n.meta.get("val") is not None and n.meta["val"].dtype == torch.bool
                     and len(n.users) > 1]
    assert draws and shared_before  # the masks, read in the forward and in the backward
    copies = draw_random_per_reader(gm)
    assert copies >= len(draws)
    capture = capture_joint(gm, num_fwd_outputs)
    graph = capture.graph
    redrawn = [node for node in graph.nodes if node.op == INDUCTOR_RANDOM]
    assert len(redrawn) == 2 * len(draws)
    assert {node.phase for node in redrawn} == {"forward", "backward"}
    for node in graph.nodes:  # every value of a seeded chain has one reader now
        if node.op in (INDUCTOR_RANDOM, "aten.gt.Scalar"):
            assert all(len(graph.users[v]) <= 1 for v in node.outputs)
    plan = store_all_plan(fuse(capture).graph)
    saved = [plan.graph.values[v] for v in plan.simulation.saved]
    assert not any(v.dtype == str(torch.bool) for v in saved), [v.name for v in saved]
    assert any("inductor_seeds" in v.name for v in saved)  # the backward draws again from the seeds


class LightAndHeavy(torch.nn.Module):
    """``ln(h) * (h * sigmoid(h))``: the layer norm's output is light (its inputs, parameters aside,
    are no larger than it) and read by the product's backward; the sigmoid is heavy on the CPU and
    its backward reads its output; ``h * sigmoid(h)`` is light, but its inputs are twice its bytes."""

    def __init__(self, width=32):
        super().__init__()
        self.lin, self.ln, self.out = torch.nn.Linear(width, width), torch.nn.LayerNorm(width), torch.nn.Linear(width, 1)

    def forward(self, x):
        h = self.lin(x)
        return self.out(self.ln(h) * (h * torch.sigmoid(h))).sum()


def _light_heavy_example():
    torch.manual_seed(0)
    return types.SimpleNamespace(model=LightAndHeavy(), args=(torch.randn(64, 32),), kwargs={}, loss=lambda out: out)


def test_light_forward_values_are_computed_again_inside_each_backward_reader():
    """The layer norm's output gets a copy for its backward reader, in the backward, with one reader
    (the fused graph computes it inside that reader's kernel; the forward does not store it); the
    sigmoid's output (heavy) and ``h * sigmoid(h)`` (inputs larger than it) are still read by the backward."""
    from remat.inductor.fusion import _depends_on_tangents, recompute_light_values_per_reader

    aten = torch.ops.aten
    gm, num_fwd_outputs = _joint_graph_of(_light_heavy_example())
    backward = _depends_on_tangents(gm.graph)
    forward = [n for n in gm.graph.nodes if n not in backward]
    (sigmoid,) = [n for n in forward if n.target is aten.sigmoid.default]
    (gated,) = [n for n in forward if n.target is aten.mul.Tensor and list(n.args) == [sigmoid.args[0], sigmoid]]
    (product,) = [n for n in forward if n.target is aten.mul.Tensor and n.args[1] is gated]
    normalised = product.args[0]  # the layer norm's affine output
    assert normalised.target is aten.add.Tensor
    before = {n.name for n in gm.graph.nodes}

    def backward_readers(node):
        return [u for u in node.users if u in _depends_on_tangents(gm.graph)]

    assert backward_readers(normalised) and backward_readers(sigmoid) and backward_readers(gated)
    copies = recompute_light_values_per_reader(gm)
    assert copies >= 1
    assert not backward_readers(normalised), "the backward computes the layer norm's output again"
    assert backward_readers(sigmoid) and backward_readers(gated)
    capture = capture_joint(gm, num_fwd_outputs)
    new = [node for node in capture.graph.nodes if capture.op_node[node.id].name not in before]
    assert len(new) == copies
    for node in new:
        assert node.phase == "backward" and all(len(capture.graph.users[v]) == 1 for v in node.outputs)


def test_a_plan_with_light_copies_measures_its_prediction_with_inductors_gradients():
    """Compiled with the copies: measured peak within the budget and near the prediction, gradients
    those of Inductor's own unplanned step."""
    ex = _light_heavy_example()
    reference = copy.deepcopy(ex.model)
    planned = remat.compile(ex.model, *ex.args, budget=0.9, example_kwargs=ex.kwargs, calibrate=False)
    assert planned.plan.info["light_copies"] >= 1
    _assert_within_budget_and_near_prediction(planned, ex)
    _step(planned, ex)
    _step(torch.compile(reference, dynamic=False), _with_model(ex, reference))
    _assert_same_grads(ex.model, reference)


def test_uuid_covers_what_changes_the_plan_and_the_partitioner_pickles():
    a, b = partitioner(budget=0.5), partitioner(budget=0.5)
    assert a.uuid() == b.uuid()
    assert partitioner(budget=0.4).uuid() != a.uuid()
    assert partitioner(budget=0.5, solver="rotor").uuid() != a.uuid()
    assert a.options.cost_model == "inductor"  # extern kernels profiled, generated chains one kernel
    assert partitioner(budget=0.5, cost_model="flops").uuid() != a.uuid()
    assert pickle.loads(pickle.dumps(a)).uuid() == a.uuid()


def test_inductor_options_keep_remats_constraints():
    part = partitioner(budget=0.5)
    opts = inductor_options(part, mode="max-autotune-no-cudagraphs")
    assert opts["custom_partitioner_fn"] is part and all(opts[k] == v for k, v in INDUCTOR_CONSTRAINTS.items())
    assert opts.get("max_autotune") is True
    with pytest.raises(TypeError, match="layout_optimization"):
        inductor_options(part, options={"layout_optimization": True})


def test_an_infeasible_budget_names_the_minimum():
    ex = zoo.build("mlp", size="tiny")
    with pytest.raises(InfeasibleBudgetError) as info:
        remat.compile(ex.model, *ex.args, budget=1, example_kwargs=ex.kwargs)
    assert info.value.min_budget_bytes > 1


def test_a_tied_embeddings_late_gradient_add_keeps_its_product_where_the_plan_puts_it(monkeypatch):
    """tied (tiny): the embedding's gradient is ``embedding_backward + mm(logits_grad^T, hidden)``,
    added at the end of the backward. Inductor would run the product there as one ``addmm``, keeping
    the logits' gradient and the last hidden state alive through the backward and leaving no chain
    of blocks; remat's lowering keeps the product apart, so hierarchical plans blocks, the measured
    peak is the predicted one within the budget, and gradients are Inductor's own step's."""
    from remat.inductor import fusion

    deferred = []
    real = fusion.deferred_addmm_adds
    monkeypatch.setattr(fusion, "deferred_addmm_adds", lambda capture: deferred.append(real(capture)) or deferred[-1])
    ex = zoo.build("tied", size="tiny")
    reference = copy.deepcopy(ex.model)
    planned = remat.compile(ex.model, *ex.args, budget=0.75, solver="hierarchical", example_kwargs=ex.kwargs,
                            calibrate=False)
    assert deferred and deferred[-1], "the tied gradient's add comes long after its product"
    assert "fallback" not in planned.plan.info and planned.plan.info["blocks"] >= 2
    _assert_within_budget_and_near_prediction(planned, ex)
    unplanned = torch.compile(reference, dynamic=False)
    _step(planned, ex)
    _step(unplanned, _with_model(ex, reference))
    _assert_same_grads(ex.model, reference, rtol=1e-4, atol=1e-5)


class _Kernel:
    """A scheduler node as the fusion heuristics see it: its span in the graph's order."""

    def __init__(self, first, last):
        self.min_order, self.max_order = first, last
        self.node = None  # no FX origins, so no plan memory to check

    def get_nodes(self):
        return [self]


class _AlwaysFuse:
    def can_fuse(self, scheduler, node1, node2, shared_data_score):
        return True

    def score_fusion(self, *args):
        return "base's"


def test_kernels_fuse_only_next_to_each_other_in_remats_graphs():
    """Inductor runs a fused kernel where its earlier part ran, moving the later part's inputs up:
    in graphs remat planned, only kernels adjacent in the plan's order fuse; other graphs keep
    Inductor's own heuristics."""
    from remat.inductor import PlanOrderChoices

    choices = PlanOrderChoices(_AlwaysFuse())
    adjacent, apart = (_Kernel(3, 4), _Kernel(5, 5)), (_Kernel(3, 4), _Kernel(7, 9))
    with torch._inductor.config.patch(custom_partitioner_fn=partitioner(budget=0.5)):
        assert choices.can_fuse(None, *adjacent, 1) and choices.can_fuse(None, *reversed(adjacent), 1)
        assert not choices.can_fuse(None, *apart, 1) and not choices.can_fuse(None, *reversed(apart), 1)
    assert choices.can_fuse(None, *apart, 1)  # a graph remat did not plan
    assert choices.score_fusion() == "base's"


def test_a_small_gpt2_measures_its_prediction():
    """A 2-layer GPT-2 under Inductor at a fraction that recomputes: the measured peak is the
    predicted one within 5% and within the budget. Counted by the simulator: Inductor writing
    outputs into dying inputs' storage; switched off: Inductor keeping dead buffers for later
    allocations of the same size (measured 12% above the prediction with it)."""
    model, args, kwargs = zoo._gpt2(n_layer=2, n_embd=64, n_head=2, vocab=300, positions=64, batch=2, seq=64)
    planned = remat.compile(model.train(), *args, budget=0.4, example_kwargs=kwargs, calibrate=False)
    assert planned.plan.graph.meta.get("inplace_reuse")
    plan = planned.plan
    measured = measured_step_peak(planned, args, kwargs)
    assert measured <= plan.info["budget_bytes"], (measured, plan.info["budget_bytes"])
    assert abs(measured - plan.peak_bytes) <= 0.05 * plan.peak_bytes, (measured, plan.peak_bytes)


def test_bytes_inductor_reuses_buy_a_cheaper_plan_within_the_budget():
    """The planners do not count in-place reuse, the simulator does: plans made at raised budgets
    are kept while their simulated peak still fits the real one, the cheapest wins."""
    from dataclasses import dataclass, field

    from remat.inductor import plan_into_reused_bytes

    @dataclass
    class Stub:
        budget_bytes: int
        peak_bytes: int
        step_seconds: float
        info: dict = field(default_factory=dict)

    made = []

    def make(budget):  # each plan's simulated peak is 10 bytes under what it was planned for
        made.append(budget)
        return Stub(budget, budget - 10, 1000.0 / budget)

    plan = plan_into_reused_bytes(make(1000), 1000, make)
    assert plan.peak_bytes <= 1000 and plan.budget_bytes == 1000
    assert plan.step_seconds < 1.0 and plan.info["planned_at_bytes"] == 1010 == made[1]
    made.clear()
    unchanged = plan_into_reused_bytes(Stub(1000, 1000, 1.0), 1000, make)  # nothing left over
    assert unchanged.step_seconds == 1.0 and not made


@pytest.mark.parametrize("name", ["mlp", "inplace_views", "two_outputs", "gpt2"])
def test_every_test_model_measures_within_its_budget_with_inductors_gradients(name):
    """The zoo models the other tests here do not compile (tiny), at the smallest budget: the
    measured peak is at most 5% above the prediction (``min`` has no lower plan to calibrate to, so
    this is the prediction's own accuracy) and not below it by more than 5% or 2 MiB (the issue's
    bound: Inductor may fuse a reduction with the ops around it and never store a value the plan
    counts, a log-softmax's gradient on gpt2; AOTAutograd's copy of an expanded tangent dies early on
    two_outputs), and the gradients are Inductor's own unplanned step's. inplace_views failed to
    compile before views were folded by their op rather than by their fake tensors' storage."""
    ex = zoo.build(name, size="tiny")
    reference = copy.deepcopy(ex.model)
    random = {"fallback_random": True}  # dropout (gpt2) draws from torch's generator in both steps
    planned = remat.compile(ex.model, *ex.args, budget="min", example_kwargs=ex.kwargs, calibrate=False,
                            options=random, time_limit=5)  # the MILP's best plan within 5 s: the test is of its peak
    plan = planned.plan
    measured = measured_step_peak(planned, ex.args, ex.kwargs)
    assert measured <= 1.05 * plan.peak_bytes, (measured, plan.peak_bytes)
    assert measured >= plan.peak_bytes - max(0.05 * plan.peak_bytes, 2 * MiB), (measured, plan.peak_bytes)
    unplanned = torch.compile(reference, dynamic=False, options=random)
    _step(planned, ex)
    _step(unplanned, _with_model(ex, reference))
    _assert_same_grads(ex.model, reference, rtol=1e-4, atol=1e-5)


def _distance_from_float64(grads, exact) -> float:
    """The worst parameter's largest gradient error against a float64 step, relative to its largest
    gradient."""
    return max(float((g.double() - e).abs().max() / e.abs().max()) for g, e in zip(grads, exact))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name,size", [
    ("gpt2", "tiny"),
    ("resnet", "small"),
])
def test_compiled_plan_on_cuda_fits_its_budget_and_matches_inductors_gradients(name, size):
    """On a GPU (Triton kernels): a plan at fraction 0.5 with calibration measures within its budget
    and near its prediction, and its gradients are those of Inductor's own unplanned step (GPT-2), or,
    for the ResNet, no further from a float64 step's than eager's and Inductor's own: with TF32
    convolutions (cuDNN's default) and BatchNorm all three are about 0.12 away from float64 in the
    worst parameter and from each other (3.6e-3 with TF32 off), so they are compared through float64.
    (ResNet at ``small``: at ``tiny`` its step is 170 KiB, and on an H100 the compiled step held 31 KiB
    more than the plan, so 0.5 was refused as infeasible. At ``small`` the plan varied from process to
    process, and some measured 6 MB over it; calibration, which then planned below the budget by the
    excess, found no plan. Since calibration tries the smallest budget that plans first, it passed in
    five of five processes on an H100.)"""
    ex = zoo.build(name, size=size, device="cuda")
    reference, eager, exact = (copy.deepcopy(ex.model) for _ in range(3))
    planned = remat.compile(ex.model, *ex.args, budget=0.5, options={"fallback_random": True},
                            example_kwargs=ex.kwargs)
    _assert_within_budget_and_near_prediction(planned, ex)
    unplanned = torch.compile(reference, dynamic=False, options={"fallback_random": True})
    _step(planned, ex)
    _step(unplanned, _with_model(ex, reference))
    if name == "gpt2":
        _assert_same_grads(ex.model, reference, rtol=1e-4, atol=1e-5)
        return
    _step(eager, _with_model(ex, eager))
    wide = copy.copy(_with_model(ex, exact.double()))
    wide.args = tuple(a.double() if a.is_floating_point() else a for a in ex.args)
    _step(exact, wide)
    float64 = _grads(exact)
    mine = _distance_from_float64(_grads(ex.model), float64)
    theirs = max(_distance_from_float64(_grads(m), float64) for m in (reference, eager))
    assert mine <= 1.5 * theirs + 1e-4, (mine, theirs)


def test_offloading_plan_compiles_with_inductor():
    """``solver="hybrid"`` under Inductor: offloads and reloads run as the operators remat::offload
    and remat::reload (synchronous copies, planned so), the measured peak is within the budget and
    near the prediction, the gradients are Inductor's own unplanned step's, and no file is left."""
    from remat.execute import offload as runtime

    ex = zoo.build("mlp", size="small")
    reference = copy.deepcopy(ex.model)
    # time_limit: the exact solvers making the greedy's recomputation start spent ~9 s of their 30 below
    # recomputation's reach; with 5 the start, the greedy's rounds and simulations and the plan are the same
    planned = remat.compile(ex.model, *ex.args, budget="min", solver="hybrid", example_kwargs=ex.kwargs,
                            calibrate=False, time_limit=5)
    plan = planned.plan
    assert plan.offloaded_values and plan.graph.meta["transfer"]["overlap"] is False
    _assert_within_budget_and_near_prediction(planned, ex)
    unplanned = torch.compile(reference, dynamic=False)
    _step(planned, ex)
    _step(unplanned, _with_model(ex, reference))
    _assert_same_grads(ex.model, reference)
    stores = list(runtime._COMPILED_STORES.values())
    assert stores and all(not s.entries and s.folder is None for s in stores)


def test_replayed_random_ops_do_not_keep_their_inputs_alive():
    """decode_call (every remat::random_run / random_replay) leaves no reference cycle holding the
    op's input tensors: they are freed as soon as the compiled graph drops them, not when Python's
    cycle collector runs (which kept a 2-layer GPT-2's dropout inputs alive past the backward under
    ``fallback_random``: 27.7 MB measured for a 12.1 MB plan)."""
    import gc
    import weakref

    from remat.execute.compiled_ops import decode_call, encode_call

    op = torch.ops.aten.native_dropout.default
    call, _ = encode_call(op, (torch.empty(64, 64), 0.1, True), {})
    x = torch.randn(64, 64)
    alive = weakref.ref(x)
    gc.disable()
    try:
        tensors = [x]
        del x
        decoded = decode_call(call, tensors)
        result = decoded[0](*decoded[1], **decoded[2])
        del decoded, tensors, result
        assert alive() is None
    finally:
        gc.enable()


def _through_partitioner(part, ex):
    """``ex.model`` with ``part`` as partitioner and no code generation (the plan is what Inductor
    would compile)."""
    return without_codegen(ex.model, part)


def test_auto_offloads_below_what_recomputation_reaches_under_inductor():
    """Under Inductor ``auto`` plans recomputation alone while it reaches the budget, and offloads
    (the hybrid solver's plans) below that: ``"min"`` and the minimum an infeasible budget names
    include the offloading plans' reach. On GPT-2's fused graph that is 0.88-0.91x recomputation's: the
    hybrid's minimum is the same 10.0 MiB in every run, recomputation's (``keep_set``'s, a heuristic
    that weighs the op costs profiled on the machine) moved between 11.50 and 11.85 MiB over four
    profiles, so the margin asserted is 0.95x, not 0.9x (0.911x failed CI once). (Split
    steps are not weighed here, ``split="off"``: their search took 90 of this test's 146 s; splits
    under Inductor: ``test_split.py``.)"""
    ex = zoo.build("gpt2", size="small")
    smallest = partitioner(budget="min", split="off")
    _step(_through_partitioner(smallest, ex), ex)
    plan = smallest.last_plan
    assert plan.offloaded_values and "hybrid" in plan.info["chosen by"]
    recompute = smallest_plan(plan.graph, "auto", swaps=False).peak_bytes  # every recomputing solver's
    assert plan.peak_bytes < 0.95 * recompute

    between = partitioner(budget=(plan.peak_bytes + recompute) // 2, split="off")
    _step(_through_partitioner(between, ex), ex)
    assert between.last_plan.offloaded_values and between.last_plan.peak_bytes <= between.last_budget_bytes
    reference = copy.deepcopy(ex.model)
    _step(_through_partitioner(partitioner(budget=None), _with_model(ex, reference)), _with_model(ex, reference))
    _assert_same_grads(ex.model, reference)  # the unplanned graph, the same random numbers

    with pytest.raises(Exception) as raised:
        _step(_through_partitioner(partitioner(budget=plan.peak_bytes - 1, split="off"), ex), ex)
    err = _unwrap_compile_error(raised.value)
    assert isinstance(err, InfeasibleBudgetError) and err.min_budget_bytes == plan.peak_bytes

    above = partitioner(budget=0.6, split="off")  # recomputation reaches it: no offloads
    _step(_through_partitioner(above, ex), ex)
    assert "transfer" not in above.last_plan.graph.meta  # planned without the offload tier, as before


class _Buffer:
    def __init__(self, name, nbytes, *readers):
        self.name, self.nbytes, self.users = name, nbytes, [types.SimpleNamespace(node=r) for r in readers]

    def get_name(self):
        return self.name


class _Part:
    """A scheduler node with what the fusion memory check reads: its FX origins' plan tags, its
    outputs and their readers, the buffers it reads."""

    def __init__(self, name, step, before, reads=(), reduction=False, scheduler=None):
        self.name, self.reads, self.reduction, self.scheduler, self.outputs = name, reads, reduction, scheduler, []
        fx = types.SimpleNamespace(meta={MEMORY_BEFORE: (step, before), PLAN_PEAK: 100})
        self.node = types.SimpleNamespace(get_origins=lambda: [fx])
        self.read_writes = types.SimpleNamespace(reads=[types.SimpleNamespace(name=r) for r in reads])

    def get_nodes(self):
        return [self]

    def get_name(self):
        return self.name

    def get_outputs(self):
        return self.outputs

    def is_reduction(self):
        return self.reduction


def test_kernels_fuse_only_where_the_fused_kernel_stays_within_the_plans_peak(monkeypatch):
    """A fused kernel allocates all it keeps before it runs and frees its inputs after: a softmax
    (reading the dying scores in its row reductions) fused with the dropout after it would hold
    the scores, the probabilities, the dropout's output and its mask at once: 140 bytes where the
    plan peaks at 100. An output written into an input that dies inside the kernel adds nothing."""
    from remat.inductor import scheduling as inductor

    monkeypatch.setattr(inductor, "_buffer_bytes", lambda buf: buf.nbytes)
    scheduler = types.SimpleNamespace(name_to_buf={})
    later = _Part("later", 9, 0)
    softmax = _Part("softmax", 5, 50, reads=("scores",), reduction=True, scheduler=scheduler)
    dropout = _Part("dropout", 6, 20, reads=("probs",), scheduler=scheduler)
    row_sum = _Part("row_sum", 6, 20, reads=("probs",), reduction=True, scheduler=scheduler)
    scores = _Buffer("scores", 40, softmax)
    probs = _Buffer("probs", 40, dropout, row_sum, later)
    softmax.outputs = [probs]
    dropout.outputs = [_Buffer("dropped", 40, later), _Buffer("mask", 10, later)]
    row_sum.outputs = [_Buffer("sums", 5, later)]
    scheduler.name_to_buf = {b.name: b for b in (scores, probs, *dropout.outputs, *row_sum.outputs)}
    assert inductor.fusion_raises_peak(softmax, dropout)  # 50 + 40 + 40 + 10
    assert not inductor.fusion_raises_peak(softmax, row_sum)  # 50 + 40 + 5

    scale = _Part("scale", 5, 50, reads=("scores",), scheduler=scheduler)  # no reduction reads the scores
    scaled = _Buffer("scaled", 40, dropout)
    scale.outputs = [scaled]
    scheduler.name_to_buf.update(scaled=scaled)
    dropout.reads, dropout.read_writes.reads = ("scaled",), [types.SimpleNamespace(name="scaled")]
    assert not inductor.fusion_raises_peak(scale, dropout)  # 50 + 40 + 10, the output in the scores' storage

    # the part that writes the kept output reads only what the kernel computes: new memory for it
    divide = _Part("divide", 8, 30, reads=("shifted",), scheduler=scheduler)
    shift = _Part("shift", 7, 70, reads=("logits",), scheduler=scheduler)
    shift.outputs, divide.outputs = [_Buffer("shifted", 40, divide)], [_Buffer("softmax", 40, later)]
    scheduler.name_to_buf.update(logits=_Buffer("logits", 40, shift), shifted=shift.outputs[0],
                                 softmax=divide.outputs[0])
    assert inductor.fusion_raises_peak(shift, divide)  # 70 + 40, the dying logits still held


def test_cpu_kernels_run_one_call_each_in_remats_graphs():
    """Inductor's C++ backend would call consecutive kernels as one function, holding every
    output of the group at once; in remat's graphs it flushes after each kernel."""
    from torch._inductor.codegen.cpp import CppScheduling

    from remat.inductor import install_one_call_per_kernel

    install_one_call_per_kernel()
    install_one_call_per_kernel()  # once only
    backend = CppScheduling.__new__(CppScheduling)
    backend._ready_to_flush = False
    with torch._inductor.config.patch(custom_partitioner_fn=partitioner(budget=0.5)):
        assert backend.ready_to_flush()
    assert not backend.ready_to_flush()  # other graphs: Inductor's own grouping


def test_plan_memory_tags_follow_the_simulated_timeline():
    """Every lowered op carries the simulated bytes before its fused node and the plan's peak;
    a recomputed op carries its recomputation's step."""
    ex = zoo.build("mlp", size="small")
    part = partitioner(budget="min", solver="chen_sqrt")
    compiled = _through_partitioner(part, ex)
    graphs = []
    real = inductor_module.lower

    def keep(*args, **kwargs):
        graphs.extend(real(*args, **kwargs))
        return graphs[-2:]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inductor_module, "lower", keep)
        _step(compiled, ex)
    plan, timeline = part.last_plan, part.last_plan.simulation.timeline
    tags = [n.meta[MEMORY_BEFORE] for gm in graphs for n in gm.graph.nodes if MEMORY_BEFORE in n.meta]
    assert tags and _recomputations(plan) > 0
    assert all(before == (timeline[step - 1] if step else 0) for step, before in tags)
    assert all(n.meta[PLAN_PEAK] == plan.peak_bytes for gm in graphs for n in gm.graph.nodes if PLAN_PEAK in n.meta)
    assert len({step for step, _ in tags}) > len(plan.graph.nodes) // 2


def test_the_smallest_budget_measures_its_prediction_on_gpt2():
    """The zoo's 2-layer GPT-2 at hierarchical's smallest budget, the budget the plan fills: it
    measured 1.13x its prediction when Inductor fused a recomputed softmax with its dropout and
    called the kernels between two matrix products as one function; both are kept to the plan."""
    ex = zoo.build("gpt2", size="small")
    planned = remat.compile(ex.model, *ex.args, budget="min", solver="hierarchical", example_kwargs=ex.kwargs,
                            calibrate=False)
    measured = measured_step_peak(planned, ex.args, ex.kwargs)
    assert measured <= planned.plan.info["budget_bytes"] and measured >= 0.98 * planned.plan.peak_bytes, (
        measured, planned.plan.peak_bytes)


def test_a_smallest_budget_measured_above_its_plan_warns(monkeypatch):
    """``budget="min"`` has no lower plan to re-plan to: a measured peak above it is kept and said."""
    from remat.inductor import calibration as inductor
    from remat.errors import MeasuredAboveBudgetWarning

    plan = types.SimpleNamespace(peak_bytes=1000, info={})
    part = types.SimpleNamespace(last_budget_bytes=1000, options=types.SimpleNamespace(budget="min"))
    wrapped = types.SimpleNamespace(plan=plan, _remat_partitioner=part)
    monkeypatch.setattr(inductor, "measured_step_peak", lambda *a, **k: 1018)
    with pytest.warns(MeasuredAboveBudgetWarning, match="1018 bytes, 18 above"):
        inductor.calibrate(wrapped, None, (), {})
    assert plan.info["measured_peak"] == 1018
    monkeypatch.setattr(inductor, "measured_step_peak", lambda *a, **k: 990)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MeasuredAboveBudgetWarning)
        inductor.calibrate(wrapped, None, (), {})


def test_calibration_tries_the_smallest_budget_that_plans_before_refusing(monkeypatch):
    """A plan measured 300 bytes above a budget of 1000; planning 305 below it finds no plan (the
    smallest budget that plans is 800): the plan made at 800 is measured before the budget is refused,
    and kept when it fits. (On an H100 one ResNet plan measured 6.2 MB above its prediction, and the
    budget was refused, where a plan made in another process measured within it.)"""
    from remat.inductor import calibration as inductor

    plan = types.SimpleNamespace(peak_bytes=990, info={})
    part = types.SimpleNamespace(last_budget_bytes=1000, options=types.SimpleNamespace(budget=1000))
    margins = []
    wrapped = types.SimpleNamespace(plan=plan, _remat_partitioner=part, _recompile=lambda p: None)
    readings = iter([1300, InfeasibleBudgetError(695, 800), 950])

    def measure(*_):
        reading = next(readings)
        if isinstance(reading, Exception):
            raise reading
        return reading

    monkeypatch.setattr(inductor, "measured_step_peak", measure)
    inductor.calibrate(wrapped, margins.append, (), {})
    assert margins == [305, 200] and plan.info["measured_peak"] == 950
    assert "smallest budget that plans, 800" in plan.info["calibration"]
    # the plan at the smallest budget measured above too: refused at once, with what was tried
    readings = iter([1300, InfeasibleBudgetError(695, 800), 1100])
    margins.clear()
    with pytest.raises(InfeasibleBudgetError, match="also planned at the smallest budget.*smallest budget that plans, 800"):
        inductor.calibrate(wrapped, margins.append, (), {})
    assert margins == [305, 200]  # no re-plan below the smallest budget


def test_a_dropout_mask_the_fused_graph_stores_is_stored_where_its_copy_has_one_reader():
    """A recomputed copy of a dropout mask read by one op would be computed by Inductor inside that
    op, which would then write its output into the random values (see ``store_random_masks``). The
    copy goes through Inductor's stride prim (a stored buffer, the same values); other values, and
    masks with two readers (stored by Inductor anyway), are left alone."""
    from torch.fx.experimental.proxy_tensor import make_fx

    aten = torch.ops.aten

    def step(x):
        noise = aten.mul.Tensor(x, 2.0)  # stands for the random values: inlined into the mask
        mask = aten.gt.Scalar(noise, 1.0)  # stored in the fused graph, one reader here
        scaled = aten.mul.Tensor(x, 3.0)  # stored in the fused graph, not random: left to Inductor
        twice = aten.gt.Scalar(aten.mul.Tensor(x, 4.0), 1.0)  # a mask read twice
        return aten.add.Tensor(aten.mul.Tensor(mask, x), scaled) + aten.mul.Tensor(twice, x) + twice

    x = torch.randn(4, 8)
    gm = make_fx(step, tracing_mode="fake")(x)
    ops = [n for n in gm.graph.nodes if n.op == "call_function"]
    for i, n in enumerate(ops):
        n.meta["remat_instruction"] = i
    expanded = types.SimpleNamespace(instructions=[types.SimpleNamespace(target=i) for i in range(len(ops))])
    random_ops = {0, 3}
    original = types.SimpleNamespace(nodes=[
        types.SimpleNamespace(op=scheduling.INDUCTOR_RANDOM if i in random_ops else str(n.target))
        for i, n in enumerate(ops)])
    members = [[0, 1], [2], [3, 4], *([i] for i in range(5, len(ops)))]
    expected = gm(x)

    assert scheduling.store_random_masks([gm], expanded, types.SimpleNamespace(members=members, original=original)) == 1
    stored = [n for n in gm.graph.nodes if n.target is torch.ops.prims.inductor_force_stride_order.default]
    assert [n.args[0].name for n in stored] == [ops[1].name]
    assert stored[0].meta["remat_instruction"] == 1 and list(stored[0].users) == [ops[5]]
    assert torch.equal(gm(x), expected)


def test_values_inductor_would_compute_later_are_stored_where_the_plan_makes_them():
    """Inductor computes a pointwise value read only by extern kernels where its first reader is
    lowered, and a small max pool's outputs inside a single reader that loads them: both would keep
    their inputs alive past the plan's free. ``store_where_planned`` passes exactly those through
    Inductor's stride prim (a buffer stored where the plan makes it); the values are unchanged."""
    from torch.fx.experimental.proxy_tensor import make_fx

    aten, prims = torch.ops.aten, torch.ops.prims

    def step(x, w):
        early = aten.relu.default(x)  # read by mm only, with another product first: deferred
        other = aten.mm.default(x, w)
        late = aten.mm.default(early, w)
        adjacent = aten.mul.Tensor(x, 2.0)  # read by the next op, an mm: Inductor computes it there anyway
        product = aten.mm.default(adjacent, w)
        shifted = aten.add.Tensor(aten.mul.Tensor(x, 3.0), 1.0)  # the product inlined; the sum read by the output only
        image = aten.view.default(x, [1, 1, 4, 8])
        pooled, offsets = prims._low_memory_max_pool_with_offsets.default(image, [2, 2], [2, 2], [0, 0], [1, 1], False)
        indices = prims._low_memory_max_pool_offsets_to_indices.default(offsets, [2, 2], [4, 8], [2, 2], [0, 0], [1, 1])
        last = aten.add.Tensor(aten.mul.Tensor(pooled, 2.0), aten._to_copy.default(indices, dtype=torch.float32))
        return other, late, product, shifted, last

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    gm = make_fx(step, tracing_mode="fake")(x, w)
    for n in gm.graph.nodes:
        if n.op == "call_function":
            n.meta["remat_instruction"] = 0
    expected = gm(x, w)

    assert scheduling.store_where_planned([gm]) == 4
    stored = {n.args[0].name for n in gm.graph.nodes if n.target is torch.ops.prims.inductor_force_stride_order.default}
    relu = next(n.name for n in gm.graph.nodes if n.target is aten.relu.default)
    shifted = next(n.name for n in gm.graph.nodes if n.target is aten.add.Tensor)
    pool_outputs = [n.name for n in gm.graph.nodes if n.target is operator.getitem]
    assert stored == {relu, shifted, *pool_outputs}  # the pooled values and the offsets: one loading reader each
    for got, want in zip(gm(x, w), expected):
        assert torch.equal(got, want)


def test_a_pooling_cnn_recomputed_in_the_backward_measures_its_prediction():
    """``checkpoint_all`` on conv -> max pool -> conv -> relu -> conv: the backward recomputes the
    first conv and the pool between the threshold backward and the convolution backward that reads
    it. Inductor would compute the threshold backward at that reader, holding its inputs across the
    recomputed convolution (8.6% above the prediction before ``store_where_planned``). The measured
    peak is now at most the prediction and within 5% of it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 10))
    x = torch.randn(4, 3, 32, 32)
    planned = remat.compile(model, x, solver="checkpoint_all", calibrate=False, cache=False, split="off")
    assert planned.plan.info["stored_where_planned"] > 0
    measured = measured_step_peak(planned, (x,), {})
    assert 0.95 * planned.plan.peak_bytes <= measured <= planned.plan.peak_bytes, (measured, planned.plan.peak_bytes)


def test_a_scatter_inductor_runs_as_eagers_op_is_planned_with_its_stored_index():
    """On the CPU with more than one thread, Inductor runs max pooling's backward scatter as eager's
    ``scatter_reduce_`` on a copy of the zeros, with the index (int64) and the source stored, not as
    a loop that computes them inside (``remat.inductor.fusion.scatter_falls_back``). The fused graph
    used to inline them: a small ConvBN's smallest plan measured 1.19x its prediction. Its measured
    peak is now at most the prediction and within 5% of it."""
    from remat.inductor.fusion import scatter_falls_back
    from remat.models.small import ConvBN

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.manual_seed(0)
        model, args = ConvBN(c=8), (torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,)))
        planned = remat.compile(model, *args, budget="min", calibrate=False, cache=False, split="off")
        stored = {n.op for n in planned.plan.graph.nodes}  # the fused graph's nodes: what is stored
        assert "prims._low_memory_max_pool_offsets_to_indices.default" in stored  # the index, for eager's op
        measured = measured_step_peak(planned, args, {})
        falls_back = scatter_falls_back(scatters_fx := _scatter_add_node())
        torch.set_num_threads(1)
        assert falls_back and not scatter_falls_back(scatters_fx)  # one thread: Inductor writes the loop
    finally:
        torch.set_num_threads(threads)
    assert 0.95 * planned.plan.peak_bytes <= measured <= planned.plan.peak_bytes, (measured, planned.plan.peak_bytes)


def _scatter_add_node():
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda z, i, s: torch.ops.aten.scatter_add.default(z, 1, i, s), tracing_mode="fake")(
        torch.zeros(4, 8), torch.zeros(4, 2, dtype=torch.int64), torch.ones(4, 2))
    return next(n for n in gm.graph.nodes if n.target is torch.ops.aten.scatter_add.default)


def test_auto_plans_with_offloads_where_recomputation_reaches_only_when_much_cheaper(monkeypatch):
    """Where recomputation reaches the budget, ``auto`` under Inductor takes the plan made with the
    offload tier's costs only when it is predicted at least ``OFFLOAD_MIN_GAIN`` cheaper, and does
    not plan again at all when the recomputation plan costs little more than storing everything
    (no plan can then be that much cheaper)."""
    gain = inductor_module.OFFLOAD_MIN_GAIN
    ex = zoo.build("mlp", size="tiny")
    graph = remat.plan(ex.model, *ex.args, solver="store_all", cost_model="flops").graph
    store_all = store_all_plan(graph).step_seconds
    fused = types.SimpleNamespace(graph=graph)  # with_transfer_costs is stubbed below
    monkeypatch.setattr(inductor_module, "with_transfer_costs", lambda f, transfer: ("offloading", f))
    part = partitioner(budget=0.5)

    def plan_costing(seconds):
        return types.SimpleNamespace(step_seconds=seconds, info={})

    def offloading_plan_costs(seconds):
        made = []
        monkeypatch.setattr(part, "_plan", lambda f, **_: made.append(f) or plan_costing(seconds))
        return made

    cheap = plan_costing(store_all * (1 + gain / 2))  # near store-everything: offloading is not tried
    made = offloading_plan_costs(0.0)
    assert part._offload_if_much_cheaper(fused, cheap, "cpu") == (fused, cheap) and not made

    costly = plan_costing(store_all * 2)
    made = offloading_plan_costs(costly.step_seconds * (1 - gain / 2))  # cheaper, but not by enough
    assert part._offload_if_much_cheaper(fused, costly, "cpu") == (fused, costly) and made

    made = offloading_plan_costs(costly.step_seconds * (1 - 2 * gain))
    chosen_fused, chosen = part._offload_if_much_cheaper(fused, costly, "cpu")
    assert chosen_fused == ("offloading", fused) and chosen.step_seconds < costly.step_seconds
    assert chosen.info["recomputation plan's step"] == costly.step_seconds


def test_auto_takes_the_hybrid_plan_near_recomputations_smallest_budget_when_much_cheaper(monkeypatch):
    """resnet (tiny) just above the smallest budget recomputation reaches: auto's recomputation plan
    (hierarchical's, keep_set's) costs much more than storing everything; the hybrid
    solver's greedy refinement of it, planned with the offload tier's costs, costs much less (here
    without offloading anything), so ``auto`` takes it and says what the other would have cost. The
    compiled step stays within the budget, near the prediction, with the gradients of Inductor's own
    unplanned step. The recomputation plans are left as their solvers make them: since ``auto`` takes
    out the recomputations a plan's budget does not need (``recompute_less``), its own plan here is
    within 10% of the hybrid's (+17.1% of the step), and the rule under test never fires."""
    from remat.solvers import keep_set as keep_set_module
    from remat.solvers import planner as planner_module

    monkeypatch.setattr(keep_set_module, "recompute_less", lambda plan, budget, time_limit=None: plan)
    monkeypatch.setattr(planner_module, "_thinned", lambda graph, plans, budget: plans)
    ex = zoo.build("resnet", size="tiny")
    reference = copy.deepcopy(ex.model)
    probe = partitioner(budget=1.0)
    _step(_through_partitioner(probe, _with_model(ex, copy.deepcopy(ex.model))), ex)
    recompute_min = smallest_plan(probe.last_plan.graph, "auto", swaps=False).peak_bytes
    planned = remat.compile(ex.model, *ex.args, budget=int(1.03 * recompute_min), example_kwargs=ex.kwargs,
                            calibrate=False)
    plan = planned.plan
    recompute_seconds = plan.info["recomputation plan's step"]
    assert plan.solver == "hybrid" and plan.step_seconds < (1 - inductor_module.OFFLOAD_MIN_GAIN) * recompute_seconds
    _assert_within_budget_and_near_prediction(planned, ex)
    unplanned = torch.compile(reference, dynamic=False)
    _step(planned, ex)
    _step(unplanned, _with_model(ex, reference))
    _assert_same_grads(ex.model, reference, rtol=1e-4, atol=1e-5)

"""remat.inductor.fusion: the fused graph remat plans Inductor-compiled steps on.

The joint graphs here are traced with AOTAutograd and no code generation (fast); the measured
peaks of compiled steps are checked in test_inductor.py."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._functorch.partitioners import default_partition

from remat.capture import capture_joint
from remat.cost.flops import node_flops
from remat.inductor.cost import InductorCostModel
from remat.cost.machine import Roofline
from remat.inductor.fusion import generated_by_inductor as _generated_by_inductor, addmm_pairs, fuse, fusion_groups

from .models.helpers import without_codegen

WORKSPACE = 1000  # bytes every op is said to need besides its inputs and outputs


def _capture(model, *args, cost_fn=None):
    """The Capture of ``model(*args)``'s joint graph with Inductor's decompositions, as Inductor's
    partitioner sees it, every op given WORKSPACE bytes of workspace (and ``cost_fn``'s costs)."""
    got = {}

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        got["capture"] = capture_joint(joint, num_fwd_outputs, cost_fn=cost_fn, workspace_fn=lambda node: WORKSPACE)
        return default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)

    without_codegen(model, partition)(*args)
    return got["capture"]


class TiedProjection(nn.Module):
    """A weight read by a matrix product and by a pointwise op: its gradient is add(mm(...), ...)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))

    def forward(self, x):
        return torch.tanh(x @ self.w).sum() + (self.w * self.w).sum()


def _op(capture, node_id):
    return capture.op_node[node_id].target


def test_a_product_added_once_runs_where_the_sum_runs_as_inductors_addmm():
    capture = _capture(TiedProjection(), torch.randn(4, 16))
    pairs = addmm_pairs(capture)
    assert pairs, "the weight's gradient add(mm(x^T, g), 2w) is one addmm under Inductor"
    groups = fusion_groups(capture)
    for mm, add in pairs.items():
        assert _op(capture, mm) is torch.ops.aten.mm.default and _op(capture, add) is torch.ops.aten.add.Tensor
        (group,) = [g for g in groups if mm in g]
        assert group[-1] == add, "the product is grouped with the add that consumes it, at the add's place"
        assert not any(set(g) & {add} for g in groups if g is not group)


def test_a_product_with_another_reader_stays_where_it_is():
    class TwoReaders(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Parameter(torch.randn(8, 8)), nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            p = x @ self.a
            return (p + self.b).sum() + p.relu().sum()

    capture = _capture(TwoReaders(), torch.randn(8, 8))
    forward_mms = [n.id for n in capture.graph.nodes
                   if n.phase == "forward" and _op(capture, n.id) is torch.ops.aten.mm.default]
    assert forward_mms and not set(forward_mms) & set(addmm_pairs(capture))


def test_ops_inductor_generates_have_no_workspace_extern_kernels_keep_theirs():
    capture = _capture(TiedProjection(), torch.randn(4, 16))
    fused = fuse(capture)
    extern = {torch.ops.aten.mm.default}
    for node, members in zip(fused.graph.nodes, fused.members):
        calls_extern = any(_op(capture, m) in extern for m in members)
        assert node.workspace == (WORKSPACE if calls_extern else 0), [str(_op(capture, m)) for m in members]


def test_inductor_costs_price_a_generated_chain_as_one_kernel_and_extern_kernels_by_profile():
    """cost_model="inductor": an extern kernel costs what the profile times (here a stub), a group of
    generated ops one roofline kernel over its own inputs and outputs, less than its ops apart."""
    roofline = Roofline(flops_per_second=1e9, bytes_per_second=1e8, op_overhead_seconds=1e-5,
                        device_name="test", random_elements_per_second=1e8)
    costs = InductorCostModel("cpu", roofline=roofline)
    costs.extern.node_seconds = lambda node: 0.042  # what the profile would measure
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(approximate="tanh"), nn.Linear(64, 8))
    capture = _capture(model, torch.randn(16, 32), cost_fn=costs.node_seconds)
    summed = fuse(capture)
    kernels = fuse(capture, kernel_seconds=costs.kernel_seconds)
    chains = 0
    for node, as_kernel, members in zip(summed.graph.nodes, kernels.graph.nodes, kernels.members):
        ops = [capture.op_node[m] for m in members]
        if not all(_generated_by_inductor(op) for op in ops):
            assert as_kernel.cost == node.cost, "a group with an extern kernel keeps the sum of its ops' costs"
            externs = [op for op in ops if not _generated_by_inductor(op)]
            assert node.cost >= 0.042 * len(externs), [str(op.target) for op in externs]
            continue
        nbytes = sum(kernels.graph.values[v].bytes for v in (*as_kernel.inputs, *as_kernel.outputs))
        assert as_kernel.cost == pytest.approx(roofline.seconds(sum(node_flops(op) for op in ops), nbytes))
        if len(ops) > 2:
            chains += 1
            assert as_kernel.cost < node.cost, "one kernel: no intermediate moves bytes, one overhead"
    assert chains, "GELU's forward and backward are chains of several generated ops"


def test_a_random_op_keeps_its_workspace_it_runs_as_eagers_op():
    """Under ``fallback_random`` dropout stays ``native_dropout``, which Inductor could generate but
    remat runs through its replay operator, i.e. eager's op with its float noise (a 2-layer GPT-2 at
    its smallest budget measured 9% above the plan while this workspace was left out)."""

    class Dropout(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(16, 16))

        def forward(self, x):
            return F.dropout(x @ self.w, 0.5).tanh().sum()

    with torch._inductor.config.patch(fallback_random=True):
        capture = _capture(Dropout(), torch.randn(8, 16))
    fused = fuse(capture)
    (dropout,) = [node for node, members in zip(fused.graph.nodes, fused.members)
                  if any(capture.graph.nodes[m].random for m in members)]
    assert dropout.workspace == WORKSPACE


def test_max_pooling_offsets_are_computed_inside_the_scatter_that_reads_them():
    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)

        def forward(self, x):
            return F.max_pool2d(self.conv(x), 2).sum()

    capture = _capture(Pool(), torch.randn(2, 3, 8, 8))
    offsets = [n.id for n in capture.graph.nodes if "offsets_to_indices" in str(_op(capture, n.id))]
    if not offsets:
        pytest.skip("this torch's Inductor decomposes max pooling without offsets")
    fused = fuse(capture)
    for members in fused.members:
        for n in offsets:
            if n in members:
                assert members[-1] != n, "the indices are inlined into their reader, never materialised"


def test_an_embeddings_zeros_are_filled_inside_the_copy_its_backward_scatters_into():
    """Inductor lowers the embedding backward's scatter (``_unsafe_masked_index_put_accumulate`` of a
    ``full`` of zeros) as one buffer: a copy of its first input, which the zeros' loop body fills, then
    written into. The fused graph says so: the zeros are inlined into the scatter, not a vocabulary-sized
    value of their own beside its result (which held one such tensor too many at a tied LM head's peak)."""
    capture = _capture(nn.Embedding(1000, 16), torch.randint(0, 1000, (4, 8)))
    scatters = [n.id for n in capture.graph.nodes if "index_put" in str(_op(capture, n.id))]
    assert scatters, "the embedding's backward scatters into zeros"
    fused = fuse(capture)
    for n in scatters:
        (members,) = [m for m in fused.members if n in m]
        assert members[-1] == n and any(_op(capture, m) is torch.ops.aten.full.default for m in members), members


class ProductThenPointwise(nn.Module):
    """``tanh(x @ w) * 2`` and ``(x @ w).t() * 3``: the first reads the product at the index it
    writes, the second through a transpose."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        y = x @ self.w
        z = (x @ self.w).t()
        return (torch.tanh(y) * 2).sum() + (z * 3).sum()


def test_inplace_reuse_is_listed_for_reads_at_the_written_index_only():
    capture = _capture(ProductThenPointwise(), torch.randn(16, 16))
    fused = fuse(capture)
    graph = fused.graph
    reuses = graph.meta["inplace_reuse"]
    readers = {(graph.nodes[n].name, graph.values[v].name) for n, v, _ in reuses}
    products = [v for v in graph.values if v.producer is not None and graph.nodes[v.producer].op.startswith("aten.mm")]
    forward_products = [v for v in products if graph.nodes[v.producer].phase == "forward"]
    assert len(forward_products) == 2
    direct, transposed = forward_products  # y, then z's product
    assert any(value == direct.name for _, value in readers), readers  # tanh(y) * 2 may take y's storage
    assert not any(value == transposed.name for _, value in readers), readers  # z.t() * 3 reads y transposed
    for n, v, o in reuses:
        assert v in graph.nodes[n].inputs and o in graph.nodes[n].outputs
        assert graph.values[v].bytes == graph.values[o].bytes


class ScaledSoftmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        return (torch.softmax(x @ self.w * 0.5, dim=-1) * x).sum()


def test_softmax_in_place_claim_names_the_row_reductions_that_conflict_with_it():
    """``exp(s - max)`` may be written into the scores' storage and the probabilities into the
    exponentials', but the row max reads the scores and the row sum the exponentials at other
    indices: each claim lists its reduction as a conflict (the simulator drops the claim where
    Inductor fuses them into one kernel), and all of them are Inductor's kernels."""
    capture = _capture(ScaledSoftmax(), torch.randn(16, 16))
    graph = fuse(capture).graph
    conflicts = graph.meta["inplace_conflicts"]
    kernels = set(graph.meta["inductor_kernels"])
    claims = {(n, v) for n, v, _ in graph.meta["inplace_reuse"]}
    forward = [(n, v, readers) for n, v, readers in conflicts if graph.nodes[n].phase == "forward"]
    ops = set()
    for n, v, readers in forward:
        assert (n, v) in claims and n in kernels and all(r in kernels for r in readers)
        ops |= {graph.nodes[r].op for r in readers}
    assert ops == {"aten.amax.default", "aten.sum.dim_IntList"}, forward

"""Tests of the analytic cost model: remat.cost.flops and remat.cost.machine."""

from __future__ import annotations

import json
import math
import time
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from remat.cost import machine
from remat.cost.flops import FlopsCostModel, node_bytes, node_flops, node_random_draws
from remat.cost.machine import Roofline, machine_roofline

aten = torch.ops.aten

FIXED = Roofline(
    flops_per_second=1e11, bytes_per_second=1e10, op_overhead_seconds=2e-6, device_name="test"
)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """The real roofline of this CPU, measured once into a private cache directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
        mp.setattr(machine, "_MEMO", {})
        roofline = machine_roofline("cpu")
        yield roofline, machine.cache_dir()


def graph(fn, *args):
    """ATen graph of ``fn`` with fake values on every node (what remat's capture produces)."""
    return make_fx(fn, tracing_mode="fake")(*args)


def ops(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def eager_flops(fn, *args) -> tuple[int, Counter]:
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    per_op = Counter({str(k): v for k, v in counter.get_flop_counts()["Global"].items()})
    return counter.get_total_flops(), per_op


def graph_flops(gm) -> tuple[float, Counter]:
    per_op: Counter = Counter()
    for n in ops(gm):
        f = node_flops(n)
        if f:
            per_op[str(n.target.overloadpacket)] += f
    return sum(per_op.values()), per_op


def _grads(out, inputs):
    return torch.autograd.grad(out.square().sum(), inputs)


def case_mm():
    return (lambda a, b: a @ b), (torch.randn(32, 48), torch.randn(48, 16)), {"aten.mm"}


def case_addmm():
    return (lambda x, w, b: F.linear(x, w, b)), (
        torch.randn(8, 24), torch.randn(40, 24), torch.randn(40)), {"aten.addmm"}


def case_bmm():
    return torch.bmm, (torch.randn(3, 8, 24), torch.randn(3, 24, 5)), {"aten.bmm"}


def case_linear_backward():
    def fn(x, w, b):
        return _grads(F.linear(x, w, b), (x, w, b))

    args = (torch.randn(8, 24, requires_grad=True), torch.randn(40, 24, requires_grad=True),
            torch.randn(40, requires_grad=True))
    return fn, args, {"aten.addmm", "aten.mm"}


def case_conv():
    def fn(x, w, b):
        return _grads(F.conv2d(x, w, b, stride=2, padding=1), (x, w, b))

    args = (torch.randn(2, 3, 16, 16, requires_grad=True),
            torch.randn(8, 3, 3, 3, requires_grad=True), torch.randn(8, requires_grad=True))
    return fn, args, {"aten.convolution", "aten.convolution_backward"}


CASES = {
    "mm": case_mm, "addmm": case_addmm, "bmm": case_bmm,
    "linear_backward": case_linear_backward, "conv": case_conv,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_flops_match_flop_counter(name):
    fn, args, expected_ops = CASES[name]()
    gm = graph(fn, *args)
    total, per_op = graph_flops(gm)
    eager_total, eager_per_op = eager_flops(fn, *args)
    assert eager_total > 0
    assert total == eager_total
    assert per_op == eager_per_op
    assert set(per_op) == expected_ops


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_flops(causal):
    """CPU SDPA lowers to _scaled_dot_product_flash_attention_for_cpu(_backward), which
    FlopCounterMode does not count (0 FLOPs on CPU); remat counts them with torch's formulas
    for the CUDA flash/efficient kernels: forward = the math backend's two bmm's, backward =
    five bmm's of the same size (the kernel recomputes QK^T)."""

    def fwd_only(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd(q, k, v):
        out = fwd_only(q, k, v)
        return (out,) + _grads(out, (q, k, v))

    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    by_op = {str(n.target): node_flops(n) for n in ops(graph(fwd_bwd, q, k, v))}
    fwd = by_op["aten._scaled_dot_product_flash_attention_for_cpu.default"]
    bwd = by_op["aten._scaled_dot_product_flash_attention_for_cpu_backward.default"]

    with sdpa_kernel(SDPBackend.MATH):
        eager_fwd, eager_per_op = eager_flops(fwd_only, q, k, v)
    assert set(eager_per_op) == {"aten.bmm"}
    b, h, s, d = q.shape
    assert fwd == eager_fwd == 2 * (2 * b * h * s * s * d)  # full, not halved when causal
    assert bwd == flop_counter.sdpa_backward_flop_count(q.shape, q.shape, k.shape, v.shape)
    assert bwd == 2.5 * fwd


def test_decomposable_op_counts_through_its_decomposition():
    """Ops kept whole in a pre-dispatch graph (linear, matmul) are costed as FlopCounterMode
    does: by decomposing them."""
    fn = lambda x, w, b: F.linear(x, w, b).matmul(w)  # noqa: E731
    args = (torch.randn(4, 6, 8), torch.randn(8, 8), torch.randn(8))
    gm = make_fx(fn, tracing_mode="fake", pre_dispatch=True)(*args)
    targets = {n.target for n in ops(gm)}
    assert aten.linear.default in targets and aten.matmul.default in targets
    assert sum(node_flops(n) for n in ops(gm)) == eager_flops(fn, *args)[0] == 2 * 2 * 24 * 8 * 8


def test_bytes_of_add():
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    (add,) = ops(graph(lambda x, y: x + y, a, b))
    assert add.target is aten.add.Tensor
    assert node_bytes(add) == 3 * 15 * 4 and node_flops(add) == 0

    # An input used twice is read once; broadcasting reads the small operand's own size.
    (add,) = ops(graph(lambda x: x + x, a))
    assert node_bytes(add) == 2 * 15 * 4
    (add,) = ops(graph(lambda x, y: x + y, torch.randn(4, 8), torch.randn(8, dtype=torch.float16)))
    assert node_bytes(add) == 4 * 32 + 2 * 8 + 4 * 32


def test_bytes_of_multi_output_op():
    x, w, b = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    gm = graph(lambda x, w, b: F.layer_norm(x, (8,), w, b), x, w, b)
    (ln,) = [n for n in ops(gm) if n.target is aten.native_layer_norm.default]
    # inputs x, w, b; outputs y (4, 8), mean (4, 1), rstd (4, 1)
    assert node_bytes(ln) == 4 * (32 + 8 + 8) + 4 * (32 + 4 + 4)


def test_views_cost_nothing():
    gm = graph(lambda a, b: (a.t() @ b.view(4, 3)).expand(2, 5, 3).detach(),
               torch.randn(4, 5), torch.randn(12))
    model = FlopsCostModel(FIXED)
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target.is_view:
            assert node_flops(n) == 0 and node_bytes(n) == 0 and model.node_seconds(n) == 0.0
        else:
            assert model.node_seconds(n) > 0


def test_node_seconds_is_the_roofline():
    gm = graph(lambda a, b: (a @ b).relu(), torch.randn(256, 128), torch.randn(128, 64))
    mm, relu = ops(gm)
    model = FlopsCostModel(FIXED)
    flops = 2 * 256 * 128 * 64
    nbytes = 4 * (256 * 128 + 128 * 64 + 256 * 64)
    assert node_flops(mm) == flops and node_bytes(mm) == nbytes
    assert model.node_seconds(mm) == max(flops / 1e11, nbytes / 1e10) + 2e-6
    assert model.node_seconds(relu) == 2 * 4 * 256 * 64 / 1e10 + 2e-6
    # deterministic: same node, same model or an equal one, same cost
    assert [model.node_seconds(n) for n in gm.graph.nodes] == [
        FlopsCostModel(Roofline(**vars(FIXED))).node_seconds(n) for n in gm.graph.nodes]


def test_measured_roofline_is_plausible_and_cached(measured):
    roofline, cache = measured
    assert roofline.flops_per_second > 1e8 and roofline.bytes_per_second > 1e8
    assert 0 < roofline.op_overhead_seconds < 1e-3
    files = list(cache.glob("roofline-*.json"))
    assert len(files) == 1 and not list(cache.glob("*.tmp"))
    data = json.loads(files[0].read_text())
    assert data["key"]["num_threads"] == torch.get_num_threads()
    assert data["key"]["torch_version"] == torch.__version__

    # Second call in the same process: the memo. In a fresh process: the file. Never measure.
    def must_not_measure(dev):
        raise AssertionError("measured again")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(machine, "_measure", must_not_measure)
        assert machine_roofline() is roofline
        mp.setattr(machine, "_MEMO", {})
        assert machine_roofline(torch.device("cpu")) == roofline


def test_roofline_refresh_and_bad_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(machine, "_MEMO", {})
    calls = []

    def fake_measure(dev):
        calls.append(dev)
        return 1e9 * len(calls), 1e8, 1e-6, 1e8

    monkeypatch.setattr(machine, "_measure", fake_measure)
    first = machine_roofline()
    assert first.flops_per_second == 1e9 and len(calls) == 1
    (path,) = (tmp_path / "remat").glob("roofline-*.json")

    refreshed = machine_roofline(refresh=True)
    assert refreshed.flops_per_second == 2e9 and len(calls) == 2
    monkeypatch.setattr(machine, "_MEMO", {})
    assert machine_roofline() == refreshed and len(calls) == 2  # read back from disk

    path.write_text("{ not json")  # e.g. a half-written file from an old version
    monkeypatch.setattr(machine, "_MEMO", {})
    assert machine_roofline().flops_per_second == 3e9 and len(calls) == 3
    assert json.loads(path.read_text())["roofline"]["flops_per_second"] == 3e9
    assert not list((tmp_path / "remat").glob("*.tmp"))


def test_cost_model_uses_machine_roofline(measured):
    roofline, _ = measured
    assert FlopsCostModel().roofline == roofline
    assert FlopsCostModel(device="cpu").roofline == roofline
    assert "GFLOP/s" in repr(FlopsCostModel())


def test_predicted_big_mm_time_within_3x_of_measured(measured):
    roofline, _ = measured
    a, b = torch.randn(512, 1024), torch.randn(1024, 768)
    (mm,) = ops(graph(torch.mm, a, b))
    predicted = FlopsCostModel(roofline).node_seconds(mm)
    torch.mm(a, b)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    assert predicted / 3 < best < predicted * 3, (predicted, best)


def test_costing_a_graph_is_fast():
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    params = dict(layer.named_parameters())

    def step(params, x):
        out = torch.func.functional_call(layer, params, (x,))
        return torch.autograd.grad(out.sum(), list(params.values()))

    gm = graph(step, params, torch.randn(2, 8, 32))
    nodes = list(gm.graph.nodes)
    model = FlopsCostModel(FIXED)
    t0 = time.perf_counter()
    costs = [model.node_seconds(n) for n in nodes]
    elapsed = time.perf_counter() - t0
    assert len(nodes) > 100 and all(c >= 0 for c in costs)
    assert elapsed < 0.5, f"{len(nodes)} nodes costed in {elapsed:.3f}s"


def test_roofline_measured_under_fake_mode_is_real(tmp_path, monkeypatch):
    """The cost model is first built inside torch.compile, under AOTAutograd's fake mode;
    measuring there timed fake tensors (a 658 TFLOP/s "CPU"). It must time real ones."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(machine, "_MEMO", {})
    with FakeTensorMode():
        roofline = machine_roofline("cpu")
    assert roofline.flops_per_second < 1e13 and roofline.bytes_per_second < 1e12
    assert roofline.op_overhead_seconds < 3e-5


def test_random_ops_cost_at_least_their_drawing_rate():
    """A dropout draws one number per element: on a CPU that, not its bytes, bounds its time."""
    x = torch.randn(1 << 20)
    gm = torch.fx.symbolic_trace(lambda t: torch.ops.aten.native_dropout.default(t, 0.1, True))
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        FakeTensorProp(gm, mode).propagate(x)
    (node,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    slow_rng = Roofline(**{**vars(FIXED), "random_elements_per_second": 1e8})
    seconds = FlopsCostModel(slow_rng).node_seconds(node)
    assert seconds == pytest.approx((1 << 20) / 1e8 + slow_rng.op_overhead_seconds)
    assert FlopsCostModel(FIXED).node_seconds(node) < seconds  # the bytes alone say less


def test_inductors_seeded_random_op_costs_its_drawing_rate():
    """Inductor replaces a dropout's draw by ``prims.inductor_random(size, seed)``: a pure function of
    the seed (not tagged random, so remat may recompute it), as slow as the draw it replaces."""
    import torch._inductor.lowering  # noqa: F401  (registers Inductor's prims)

    graph = torch.fx.Graph()
    seed = graph.placeholder("seed")
    seed.meta["val"] = torch.tensor(7)
    draw = graph.call_function(torch.ops.prims.inductor_random.default, ([1 << 20], seed, "rand"))
    draw.meta["val"] = torch.empty(1 << 20)
    graph.output(draw)
    slow_rng = Roofline(**{**vars(FIXED), "random_elements_per_second": 1e8})
    assert node_random_draws(draw) == 1 << 20
    assert FlopsCostModel(slow_rng).node_seconds(draw) == pytest.approx((1 << 20) / 1e8 + slow_rng.op_overhead_seconds)

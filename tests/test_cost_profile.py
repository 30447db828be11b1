"""Tests of the measured cost model: remat.cost.profile."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from remat import models as zoo
from remat.api import capture_and_plan
from remat.cost import make_cost_fn, profile
from remat.cost.profile import ProfileCostModel, index_bound
from remat.cost.workspace import materialize

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """A private cache directory and empty in-process caches for every test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(profile, "_MEMO", {})
    monkeypatch.setattr(profile, "_FAILED", {})
    monkeypatch.setattr(profile, "_WARNED", set())
    return tmp_path


def nodes(fn, *args) -> dict[str, fx.Node]:
    """The op nodes of ``fn``'s fake ATen graph, by op name (the first of each)."""
    gm = make_fx(fn, tracing_mode="fake")(*args)
    found: dict[str, fx.Node] = {}
    for n in gm.graph.nodes:
        if n.op == "call_function":
            found.setdefault(str(n.target), n)
    return found


def profiled(model, *args, **kwargs):
    plan, capture = capture_and_plan(model, *args, budget=None, solver="store_all", cost_model="profile", **kwargs)
    return capture


def profile_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "could not time" in str(w.message)]


def test_matmul_costs_time_views_cost_nothing():
    ns = nodes(lambda a, b: (a @ b).t().reshape(-1).view(4, -1).relu(), torch.randn(64, 32), torch.randn(32, 16))
    model = ProfileCostModel("cpu")
    assert model.node_seconds(ns["aten.mm.default"]) > 0
    assert model.node_seconds(ns["aten.relu.default"]) > 0
    for view in ("aten.view.default", "aten.t.default", "aten._unsafe_view.default"):
        assert model.node_seconds(ns[view]) == 0.0


class _Clock:
    """A fake ``time.perf_counter`` whose timed calls last the given seconds, in turn (the last repeats)."""

    def __init__(self, *durations: float):
        self.durations, self.now, self.started = list(durations), 0.0, False

    def perf_counter(self) -> float:
        if self.started:
            self.now += self.durations.pop(0) if len(self.durations) > 1 else self.durations[0]
        self.started = not self.started
        return self.now


@pytest.mark.parametrize("preempted", ["first probe", "second probe"])
def test_one_preempted_call_does_not_become_the_ops_cost(monkeypatch, preempted):
    """On a busy CPU one call in a few hundred loses a scheduler slice: a 0.2 ms convolution timed
    20 ms, which made a plan of eight chunks look cheaper than two. That call is never the cost."""
    conv = nodes(lambda x, w: F.conv2d(x, w, padding=1), torch.randn(2, 4, 8, 8), torch.randn(4, 4, 3, 3))
    spikes = (0.025, 2e-4) if preempted == "first probe" else (2e-4, 0.025)
    clock = _Clock(5e-3, *spikes, 2e-4)  # the warm-up, two single calls, then every sample
    monkeypatch.setattr(profile, "time", clock)
    seconds = ProfileCostModel("cpu").node_seconds(conv["aten.convolution.default"])
    assert seconds == pytest.approx(2e-4)


def test_an_op_slower_than_a_quarter_second_keeps_the_faster_of_two_calls(monkeypatch):
    mm = nodes(lambda a, b: a @ b, torch.randn(8, 8), torch.randn(8, 8))["aten.mm.default"]
    monkeypatch.setattr(profile, "time", _Clock(1.0, 0.9, 0.3, 5.0))  # a fourth call would cost 5 s
    assert ProfileCostModel("cpu").node_seconds(mm) == pytest.approx(0.3)


def test_node_without_tensors_costs_nothing():
    g = fx.Graph()
    g.call_function(lambda a, b: a + b, (1, 2))
    (node,) = [n for n in g.nodes if n.op == "call_function"]
    assert ProfileCostModel("cpu").node_seconds(node) == 0.0


def test_big_matmul_ranks_above_small_elementwise():
    mm = nodes(torch.mm, torch.randn(256, 256), torch.randn(256, 256))["aten.mm.default"]
    relu = nodes(torch.relu, torch.randn(16))["aten.relu.default"]
    model = ProfileCostModel("cpu")
    assert model.node_seconds(mm) > 5 * model.node_seconds(relu)


def test_plan_uses_profile_costs_and_the_disk_cache(fresh, monkeypatch):
    ex = zoo.build("mlp", size="tiny")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = profiled(ex.model, *ex.args)
    assert not profile_warnings(record)
    costs = [n.cost for n in first.graph.nodes]
    assert all(c > 0 for c in costs)
    assert any(n.op.startswith("aten.mm") or n.op.startswith("aten.addmm") for n in first.graph.nodes)
    (path,) = (fresh / "remat").glob("profile-*.json")
    data = json.loads(path.read_text())
    assert data["key"]["torch_version"] == torch.__version__
    assert data["key"]["device_name"]
    assert len(data["seconds"]) >= 4

    # a new process: nothing in memory, everything on disk; nothing is timed again
    monkeypatch.setattr(profile, "_MEMO", {})
    timed = []
    monkeypatch.setattr(ProfileCostModel, "_time", lambda self, node: timed.append(node) or 1.0)
    second = profiled(ex.model, *ex.args)
    assert not timed
    assert [n.cost for n in second.graph.nodes] == costs


class EmbedClassify(nn.Module):
    def __init__(self, vocab=50, dim=8, classes=5):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.fc = nn.Linear(dim, classes)

    def forward(self, tokens, targets):
        logits = self.fc(self.emb(tokens))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def test_integer_inputs_are_drawn_in_range():
    model = EmbedClassify()
    tokens, targets = torch.randint(0, 50, (4, 6)), torch.randint(0, 5, (4, 6))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        capture = profiled(model, tokens, targets)
    assert not profile_warnings(record) and not profile._FAILED
    by_op = {str(n.target): n for n in capture.op_node}
    assert index_bound(by_op["aten.embedding.default"]) == 50
    assert index_bound(by_op["aten.embedding_dense_backward.default"]) == 50
    assert index_bound(by_op["aten.nll_loss_forward.default"]) == 5
    assert index_bound(by_op["aten.nll_loss_backward.default"]) == 5
    assert all(n.cost > 0 for n in capture.graph.nodes)


def test_index_bounds_of_gather_and_generic_ops():
    x, idx = torch.randn(3, 7), torch.zeros(3, 2, dtype=torch.long)
    assert index_bound(nodes(lambda x, i: x.gather(1, i), x, idx)["aten.gather.default"]) == 7
    assert index_bound(nodes(lambda x, i: x.index_select(-1, i[0]), x, idx)["aten.index_select.default"]) == 7
    assert index_bound(nodes(lambda x, i: x[i], x, idx)["aten.index.Tensor"]) == 3
    assert index_bound(nodes(lambda x, i: x.sum() + i, x, idx)["aten.add.Tensor"]) == 0  # no float dims
    assert index_bound(nodes(lambda x, i: x[:, :2] * i, x, idx)["aten.mul.Tensor"]) == 2


def test_materialize_draws_integers_below_the_bound():
    ints = materialize(torch.empty(1000, dtype=torch.long), 7)
    assert 0 <= int(ints.min()) and int(ints.max()) == 6
    assert int(materialize(torch.empty(10, dtype=torch.int32)).abs().sum()) == 0  # no bound: zeros
    expanded = materialize(torch.empty(1, 4, dtype=torch.long).expand(5, 4), 3)
    assert expanded.stride() == (0, 1) and int(expanded.max()) < 3


def test_corrupt_cache_is_ignored_and_rewritten():
    node = nodes(torch.mm, torch.randn(8, 8), torch.randn(8, 8))["aten.mm.default"]
    model = ProfileCostModel("cpu")
    model.path.parent.mkdir(parents=True, exist_ok=True)
    model.path.write_text('{"key": {"device_type": "cpu"}, "seconds": {')
    with pytest.warns(RuntimeWarning, match="corrupt profile cache"):
        seconds = model.node_seconds(node)
    assert seconds > 0
    assert list(json.loads(model.path.read_text())["seconds"].values()) == [seconds]


def test_store_keeps_what_other_processes_wrote():
    a = nodes(torch.mm, torch.randn(8, 8), torch.randn(8, 8))["aten.mm.default"]
    b = nodes(torch.relu, torch.randn(8))["aten.relu.default"]
    model = ProfileCostModel("cpu")
    model.node_seconds(a)
    data = json.loads(model.path.read_text())
    data["seconds"]["another process's op"] = 1.5
    model.path.write_text(json.dumps(data))
    model.node_seconds(b)
    assert len(json.loads(model.path.read_text())["seconds"]) == 3


def test_cache_files_are_separate_per_torch_version(monkeypatch):
    here = ProfileCostModel("cpu").path
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert ProfileCostModel("cpu").path != here


@torch.library.custom_op("remat_test::always_fails", mutates_args=())
def _always_fails(x: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("made-up inputs rejected")


@_always_fails.register_fake
def _(x):
    return torch.empty_like(x)


def test_an_op_that_raises_falls_back_with_one_warning():
    fn = lambda x: torch.ops.remat_test.always_fails(x)  # noqa: E731
    n1 = nodes(fn, torch.randn(4))["remat_test.always_fails.default"]
    n2 = nodes(fn, torch.randn(5))["remat_test.always_fails.default"]
    model = ProfileCostModel("cpu", fallback=lambda node: 0.25)
    with pytest.warns(RuntimeWarning, match="could not time remat_test.always_fails.*flops"):
        assert model.node_seconds(n1) == 0.25
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model.node_seconds(n2) == 0.25
        assert model.node_seconds(n1) == 0.25


def test_random_ops_leave_the_generator_alone():
    bernoulli = nodes(lambda x: F.dropout(x, 0.5, training=True), torch.randn(64))["aten.bernoulli_.float"]
    state = torch.get_rng_state()
    assert ProfileCostModel("cpu").node_seconds(bernoulli) > 0
    assert torch.equal(torch.get_rng_state(), state)


def test_make_cost_fn_profile():
    cost_fn = make_cost_fn("profile", "cpu")
    node = nodes(torch.mm, torch.randn(8, 8), torch.randn(8, 8))["aten.mm.default"]
    assert cost_fn(node) == cost_fn(node) > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_ops_are_timed_on_the_gpu():
    a, b = torch.randn(1024, 1024, device="cuda"), torch.randn(1024, 1024, device="cuda")
    mm = nodes(torch.mm, a, b)["aten.mm.default"]
    small = nodes(torch.relu, torch.randn(16, device="cuda"))["aten.relu.default"]
    model = ProfileCostModel("cuda")
    assert model.key["device_name"] == torch.cuda.get_device_name()
    assert model.node_seconds(mm) > model.node_seconds(small) > 0

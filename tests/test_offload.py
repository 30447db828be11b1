"""Offload/reload: the simulator's two tiers and transfer channel on hand-built graphs, and plans
with offloads executed through the file store (bitwise gradients, measured peak, no file left,
clear errors on missing or corrupt files). CUDA tests of the pinned store skip without CUDA."""

import gc
import os
import signal

import numpy
import pytest
import torch

from remat.execute import offload as runtime
from remat.errors import InvalidPlanError, OffloadError
from remat.graph import BACKWARD, GraphBuilder
from remat.plan import COMPUTE, FREE, OFFLOAD, RELOAD, Instruction, Plan, simulate
from remat.solvers import SOLVERS, register, solve

from .models.helpers import assert_bitwise, fresh, optimized, run_step

MiB = 2**20
TRANSFER = {"d2h_bytes_per_s": 100.0, "h2d_bytes_per_s": 50.0}


def two_layers(transfer=TRANSFER):
    """f1 -> f2 -> loss; b2 reads f1 and f2, b1 reads f1. Every op costs 1 s forward, 2 s backward."""
    b = GraphBuilder("two")
    x = b.input("x", 1000)
    t = b.tangent("t", 1)
    (a1,) = b.op("f1", [x], [100])
    (a2,) = b.op("f2", [a1], [100])
    (loss,) = b.op("loss", [a2], [1])
    (g2, w2) = b.op("b2", [t, a2, a1], [100, 10], phase=BACKWARD, cost=2.0)
    (_g1, w1) = b.op("b1", [g2, a1], [100, 10], phase=BACKWARD, cost=2.0)
    meta = {"transfer": dict(transfer)} if transfer else {}
    return b.build(forward_outputs=[loss], backward_outputs=[w2, w1], meta=meta), (x, t, a1, a2, loss)


# ----------------------------------------------------------------------------- simulator


def test_no_offload_step_time_is_compute_time():
    g, _ = two_layers()
    plan = solve("store_all", g, None)
    assert plan.step_seconds == plan.compute_seconds == 7.0
    assert plan.step_overhead == plan.overhead == 0.0
    assert plan.simulation.stall_seconds == 0.0 and plan.simulation.offload_peak_bytes == 0


def test_a_value_made_in_the_backward_cannot_be_offloaded():
    g, _ = two_layers()
    ins = list(solve("store_all", g, None).instructions)
    g2 = g.nodes[3].outputs[0]  # b2's input gradient, read by b1
    at = next(i for i, x in enumerate(ins) if x.kind == COMPUTE and x.target == 3)
    boundary = next(i for i, x in enumerate(ins) if x.kind == COMPUTE and g.nodes[x.target].phase == BACKWARD)
    swapped = ins[:at + 1] + [Instruction(OFFLOAD, g2), Instruction(RELOAD, g2)] + ins[at + 1:]
    with pytest.raises(InvalidPlanError, match="a value made in the backward cannot be offloaded"):
        simulate(g, swapped, boundary)


def test_offload_timing_stall_and_pending_release():
    g, (_x, _t, a1, _a2, _l) = two_layers()
    base = solve("store_all", g, None)
    # store_all: 0 f1, 1 f2, 2 loss | 3 b2 ...; offload f1 after f2, reload it before b2
    plan = base.with_swaps(offload_after={a1: 1}, reload_before={a1: 3})
    kinds = [(ins.kind, ins.target) for ins in plan.instructions[:6]]
    assert kinds[2] == (OFFLOAD, a1) and kinds[4] == (RELOAD, a1) and plan.boundary == 4
    sim = plan.simulation
    # offload issued at t=2, copy 100 B / 100 B/s -> done at 3: during loss (2..3) f1 still counts
    assert sim.timeline[2] == 200  # after offload: pending, still on the device
    assert sim.timeline[3] == 101  # after loss: the copy landed at t=3, f1 released
    assert sim.timeline[4] == 202  # reload allocates at once
    # reload issued at 3, 100 B / 50 B/s -> lands at 5; b2 (ready at 3) stalls 2 s
    assert sim.stall_seconds == pytest.approx(2.0)
    assert sim.transfer_seconds == pytest.approx(3.0)
    assert plan.step_seconds == pytest.approx(9.0) and plan.compute_seconds == 7.0
    assert plan.step_overhead == pytest.approx(9.0 / 7.0 - 1)
    assert sim.offload_peak_bytes == 100 and sim.offloaded == 1
    assert sim.saved_offloaded == (a1,) and a1 not in sim.saved
    assert plan.offloaded_values == (a1,)


def test_prefetch_hides_the_copy():
    g, (_x, _t, a1, _a2, _l) = two_layers({"d2h_bytes_per_s": 1000.0, "h2d_bytes_per_s": 1000.0})
    base = solve("store_all", g, None)
    # offload right after f2 (t=2, lands 2.1), reload before loss (t=2.1.. no: issued at 2, queued
    # behind the offload, lands 2.2), needed by b2 at t=3: no stall
    plan = base.with_swaps(offload_after={a1: 1}, reload_before={a1: 2})
    assert plan.simulation.stall_seconds == 0.0
    assert plan.simulation.transfer_seconds == pytest.approx(0.2)
    assert plan.step_seconds == plan.compute_seconds


def test_synchronous_copies_stall_compute_and_release_at_once():
    g, (_x, _t, a1, _a2, _l) = two_layers({**TRANSFER, "overlap": False, "latency_s": 0.5})
    plan = solve("store_all", g, None).with_swaps(offload_after={a1: 1}, reload_before={a1: 3})
    sim = plan.simulation
    assert sim.timeline[2] == 100  # the file write is done when offload returns
    assert sim.stall_seconds == pytest.approx(1.5 + 2.5)  # every copy (latency + bytes/bw) is a stall
    assert plan.step_seconds == pytest.approx(7.0 + 4.0)


def test_offloading_lowers_the_peak():
    b = GraphBuilder("chain")
    x = b.input("x", 10)
    t = b.tangent("t", 1)
    acts = [x]
    for i in range(4):
        acts += b.op(f"f{i}", [acts[-1]], [100])
    (loss,) = b.op("loss", [acts[-1]], [1])
    grad, grads = t, []
    for i in range(4, 0, -1):
        grad, gw = b.op(f"b{i}", [grad, acts[i], acts[i - 1]], [100, 1], phase=BACKWARD, cost=2.0)
        grads.append(gw)
    g = b.build(forward_outputs=[loss], backward_outputs=grads, meta={"transfer": {"d2h_bytes_per_s": 1e6, "h2d_bytes_per_s": 1e6}})
    base = solve("store_all", g, None)
    reads = {v: [i for i, ins in enumerate(base.instructions) if ins.kind == COMPUTE and v in g.nodes[ins.target].inputs]
             for v in acts[1:3]}
    swapped = base.with_swaps(offload_after={v: max(i for i in r if i < base.boundary) for v, r in reads.items()},
                              reload_before={v: min(i for i in r if i >= base.boundary) for v, r in reads.items()})
    assert swapped.peak_bytes < base.peak_bytes
    assert swapped.compute_seconds == base.compute_seconds and swapped.recomputations == 0


def test_free_of_an_offloaded_value_drops_its_host_copy():
    g, (_x, _t, a1, a2, _l) = two_layers()
    ins = list(solve("store_all", g, None).instructions)
    # offload f2 after loss and never reload: b2 needs it, so that fails; f1 offloaded and freed is fine
    plan = Plan(g, ins[:3] + [Instruction(OFFLOAD, a1), Instruction(RELOAD, a1)] + ins[3:], 5)
    assert plan.simulation.offload_peak_bytes == 100
    with pytest.raises(InvalidPlanError, match="offloaded"):
        Plan(g, ins[:3] + [Instruction(OFFLOAD, a2)] + ins[3:], 4)


def _expect(g, instructions, boundary, match):
    with pytest.raises(InvalidPlanError, match=match):
        simulate(g, instructions, boundary)


def test_validation_errors_name_the_instruction():
    g, (x, t, a1, a2, loss) = two_layers()
    C = lambda n: Instruction(COMPUTE, n)  # noqa: E731
    O, R, F = (lambda v: Instruction(OFFLOAD, v)), (lambda v: Instruction(RELOAD, v)), (lambda v: Instruction(FREE, v))
    fwd = [C(0), C(1), C(2)]
    bwd = [C(3), F(t), F(a2), C(4), F(a1)]
    _expect(g, [O(x)] + fwd + bwd, 4, r"instruction 0 offload\(x\): only activations")
    _expect(g, fwd + [O(t)] + bwd, 3, r"offload\(t\): only activations can be offloaded, not a tangent")
    _expect(g, fwd + [O(loss)] + bwd, 3, "belongs to the user")
    _expect(g, [C(0), F(a1), O(a1)], 3, "not resident")
    _expect(g, [C(0), O(a1), O(a1)], 3, "already offloaded")
    _expect(g, fwd + [R(a1)] + bwd, 3, r"reload\(f1\): the value is not offloaded \(it is resident\)")
    _expect(g, [C(0), O(a1), C(1)], 3, r"instruction 2 compute\(f2\): input f1 is offloaded")
    _expect(g, [C(0), C(1), C(2), O(a1)] + bwd, 4, r"instruction 4 compute\(b2\): input f1 is offloaded")
    _expect(g, [C(0), O(a1), C(0)], 3, "output f1 is offloaded")
    _expect(g, [C(0), C(1), C(2), O(loss)] + bwd, 4, "forward output loss is offloaded when the forward ends")
    _expect(g, [C(0), C(1), C(2), R(a1)], 4, "not offloaded")
    # the backward never reads f1 again after b1 ... but it is left offloaded at the end
    _expect(g, fwd + [C(3), F(t), F(a2), C(4), O(a1)], 3, "still offloaded")


def test_offloads_need_transfer_costs():
    g, (_x, _t, a1, _a2, _l) = two_layers(transfer=None)
    with pytest.raises(InvalidPlanError, match="no transfer costs"):
        solve("store_all", g, None).with_swaps(offload_after={a1: 1}, reload_before={a1: 3})


def test_with_swaps_checks_indices():
    g, (_x, _t, a1, _a2, _l) = two_layers()
    with pytest.raises(InvalidPlanError, match="outside"):
        solve("store_all", g, None).with_swaps(offload_after={a1: 99}, reload_before={a1: 3})


# ----------------------------------------------------------------------------- execution


def swap_largest(graph, budget_bytes, *, time_limit=None, count=3, **_):
    """store_all with its ``count`` largest saved activations offloaded after their last forward
    use and reloaded right before their first backward use."""
    plan = solve("store_all", graph, None)
    ins = plan.instructions

    def reads(v):
        return [i for i, x in enumerate(ins) if x.kind == COMPUTE and v in graph.nodes[x.target].inputs]

    def made(v):
        return next(i for i, x in enumerate(ins) if x.kind == COMPUTE and v in graph.nodes[x.target].outputs)

    chosen = sorted(plan.saved_values, key=lambda v: -graph.values[v].bytes)[:count]
    off = {v: max([i for i in reads(v) if i < plan.boundary] + [made(v)]) for v in chosen}
    rel = {v: min(i for i in reads(v) if i >= plan.boundary) for v in chosen}
    return plan.with_swaps(off, rel, solver="test_offload_swaps")


if "test_offload_swaps" not in SOLVERS:
    register("test_offload_swaps")(swap_largest)

MODELS = ["mlp", "cnn_bn", "dropout_mlp", "inplace_views", "tied", "two_outputs", "resnet", "gpt2"]


@pytest.mark.parametrize("name", MODELS)
def test_offload_plans_give_store_all_gradients_bitwise(name):
    ex = fresh(name)
    ref = run_step(ex, optimized(ex, solver="store_all", cost_model="unit", cache=False), steps=2)
    ex = fresh(name)
    module = optimized(ex, solver="test_offload_swaps", cost_model="unit", cache=False)
    assert module.plan.simulation.offloaded >= 2 and module.plan.simulation.saved_offloaded
    assert_bitwise(run_step(ex, module, steps=2), ref)


def new_stores(before: set):
    return [s for k, s in list(runtime._STORES.items()) if k not in before]


def test_measured_peak_matches_prediction_and_drops():
    from remat.measure import measure_step

    ex = fresh("mlp", size="small")

    def peak(module):
        def step():
            out = module(*ex.args, **ex.kwargs)
            ex.loss(out).backward()
        return measure_step(step, setup=lambda: ex.model.zero_grad(set_to_none=True), warmup=1, repeats=1).peak_bytes

    store_all = optimized(ex, solver="store_all", cache=False)
    swapped = optimized(ex, solver="test_offload_swaps", solver_options={"count": 4}, cache=False)
    assert swapped.plan.peak_bytes < store_all.plan.peak_bytes - 4 * MiB, "the test needs a clear saving"
    measured, measured_all = peak(swapped), peak(store_all)
    assert abs(measured - swapped.plan.peak_bytes) <= max(0.05 * swapped.plan.peak_bytes, 2 * MiB), (
        measured / MiB, swapped.plan.peak_bytes / MiB)
    assert measured < measured_all - 2 * MiB
    assert swapped.plan.graph.meta["transfer"]["store"] == "file"


def test_no_file_left_and_clear_errors():
    before = set(runtime._STORES)
    ex = fresh("mlp", size="small")
    module = optimized(ex, solver="test_offload_swaps", cost_model="unit", cache=False)
    (store,) = new_stores(before)
    assert store.kind == "file"

    out = module(*ex.args)
    folder = store.folder
    assert len(store.files()) == module.plan.simulation.offloaded  # files while the step runs
    ex.loss(out).backward()
    del out
    assert store.files() == [] and not os.path.exists(folder)  # after a step

    def loss_raises():
        out = module(*ex.args)
        assert store.files()
        raise ValueError("the loss failed")

    with pytest.raises(ValueError):
        loss_raises()
    gc.collect()
    assert store.files() == [] and store.folder is None  # after an exception inside the step

    out = module(*ex.args)
    out.register_hook(lambda grad: (_ for _ in ()).throw(RuntimeError("hook failed")))
    with pytest.raises(RuntimeError, match="hook failed"):
        ex.loss(out).backward()
    del out
    gc.collect()
    assert store.folder is None  # after a backward hook raised

    out = module(*ex.args)  # a missing file
    os.remove(os.path.join(store.folder, store.files()[0]))
    with pytest.raises(OffloadError, match="missing"):
        ex.loss(out).backward()
    del out
    gc.collect()
    assert store.folder is None

    out = module(*ex.args)  # a corrupt file: one bit flipped, same size
    path = os.path.join(store.folder, store.files()[-1])
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 1
    open(path, "wb").write(data)
    with pytest.raises(OffloadError, match="corrupt"):
        ex.loss(out).backward()
    del out

    out = module(*ex.args)  # a truncated file
    path = os.path.join(store.folder, store.files()[0])
    os.truncate(path, 8)
    with pytest.raises(OffloadError, match="corrupt"):
        ex.loss(out).backward()
    del out
    gc.collect()
    folder = None
    out = module(*ex.args)
    folder = store.folder
    del module, out
    gc.collect()
    assert not os.path.exists(folder)  # after del of the module


def test_two_modules_never_share_folders():
    before = set(runtime._STORES)
    ex1, ex2 = fresh("mlp"), fresh("mlp")
    m1 = optimized(ex1, solver="test_offload_swaps", cost_model="unit", cache=False)
    m2 = optimized(ex2, solver="test_offload_swaps", cost_model="unit", cache=False)
    s1, s2 = new_stores(before)
    o1, o2 = m1(*ex1.args), m2(*ex2.args)
    assert s1.folder and s2.folder and s1.folder != s2.folder
    assert not set(os.listdir(s1.folder)) & {os.path.join(s2.folder, f) for f in os.listdir(s2.folder)}
    ex1.loss(o1).backward()
    assert s1.folder is None and s2.files()
    ex2.loss(o2).backward()


@pytest.mark.parametrize("shape_stride", [((4, 6), None), ((6, 4), "t"), ((2, 3, 5), "perm"), ((0, 3), None)])
def test_store_round_trip_keeps_strides_and_dtype(shape_stride):
    shape, how = shape_stride
    store = runtime.OffloadStore("file")
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        t = torch.arange(int(torch.tensor(shape).prod())).reshape(shape).to(dtype)
        if how == "t":
            t = t.t()
        elif how == "perm":
            t = t.permute(2, 0, 1)
        handle = store.offload(t)
        back = store.wait(handle, store.reload(handle))
        assert back.dtype == t.dtype and back.shape == t.shape and back.stride() == t.stride()
        assert torch.equal(back, t)
    assert store.folder is None


def test_transfer_costs_are_measured_and_cached():
    from remat.execute.transfer import transfer_costs

    costs = transfer_costs("cpu")
    assert costs.d2h_bytes_per_s > 1e6 and costs.h2d_bytes_per_s > 1e6 and costs.latency_s >= 0
    assert costs.store == "file" and costs.overlap is False
    assert transfer_costs("cpu") is costs  # memoized


# ----------------------------------------------------------------------------- CUDA


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_pinned_store_round_trip_on_a_side_stream():
    store = runtime.OffloadStore("pinned")
    t = torch.randn(1024, 1024, device="cuda")
    expected = t.clone()
    handle = store.offload(t)
    del t  # freed while the copy may still read it: record_stream keeps the block
    torch.randn(1024, 1024, device="cuda")  # would reuse the block without record_stream
    back = store.wait(handle, store.reload(handle))
    assert torch.equal(back, expected)


@cuda
def test_pinned_offload_gradients_bitwise_on_cuda():
    from remat import models as zoo
    from remat.measure import peak_memory_growth

    ex = zoo.build("gpt2", size="tiny", device="cuda")  # its inputs are keyword arguments
    ref = run_step(ex, optimized(ex, solver="store_all", cost_model="unit", cache=False))
    module = optimized(ex, solver="test_offload_swaps", cost_model="unit", cache=False)
    assert module.plan.graph.meta["transfer"]["store"] == "pinned"
    assert module.plan.offloaded_values
    assert_bitwise(run_step(ex, module), ref)
    for p in module.parameters():
        p.grad = None
    peak, _ = peak_memory_growth(lambda: ex.loss(module(*ex.args, **ex.kwargs)).backward(), "cuda")
    assert abs(peak - module.plan.peak_bytes) <= max(0.05 * module.plan.peak_bytes, 2**21)


def test_hybrid_plan_at_its_smallest_budget_measures_within_the_budget():
    """The measured peak of an executed offloading plan is at most its budget, to the byte: the
    handles the store returns (one per value out) live outside torch's allocator. (They were 0-d
    torch tensors: a hybrid plan at its smallest budget measured 72 bytes over.)"""
    import remat.solvers.planner as planner
    from remat.measure import peak_memory_growth

    ex = fresh("gpt2", size="small")
    graph = optimized(ex, solver="store_all", cache=False).plan.graph
    budget = planner.smallest_plan(graph, "hybrid").peak_bytes
    module = optimized(ex, budget=budget, solver="hybrid", cache=False)
    assert module.plan.offloaded_values, "the test needs offloads"
    ex.model.zero_grad(set_to_none=True)
    measured, _ = peak_memory_growth(lambda: ex.loss(module(*ex.args, **ex.kwargs)).backward())
    assert measured <= budget, (measured, budget)


def test_file_store_checks_every_chunk_of_a_large_tensor(tmp_path):
    """Tensors over ``CHECK_CHUNK_BYTES`` are checksummed per chunk on the checker threads while
    they are written and read: the round trip is bitwise, and a bit flipped in any chunk, the short
    last one included, is caught."""
    store = runtime.OffloadStore(runtime.FILE_STORE, dir=str(tmp_path))
    chunk = runtime.CHECK_CHUNK_BYTES
    t = torch.randn(7 * chunk // 32 + 3, 4)[:, 1:3]  # 3.5 chunks of storage span, not contiguous
    for flipped in (None, 0, chunk + 5, 3 * chunk + 7):
        handle = store.offload(t)
        (entry,) = store.entries.values()
        assert len(entry.crcs) == 4
        if flipped is not None:
            path = os.path.join(store.folder, store.files()[0])
            data = bytearray(open(path, "rb").read())
            data[flipped] ^= 0x10
            open(path, "wb").write(data)
            with pytest.raises(OffloadError, match="corrupt"):
                store.reload(handle)
        else:
            back = store.wait(handle, store.reload(handle))
            assert back.stride() == t.stride() and torch.equal(back, t)
        del handle
        gc.collect()
    assert store.files() == []
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_file_store_checksums_in_a_forked_child(tmp_path):
    """A child forked after the parent started its checksum threads starts its own (it has none of
    the parent's: without that, its first large offload would wait forever)."""
    store = runtime.OffloadStore(runtime.FILE_STORE, dir=str(tmp_path))
    t = torch.arange(3 * runtime.CHECK_CHUNK_BYTES // 4, dtype=torch.float32)
    store.wait(h := store.offload(t), store.reload(h))  # the parent's threads exist now
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if a multi-chunk round trip works (no torch kernels here:
        ok = False  # OpenMP may not survive a fork); a hang ends by SIGALRM, a failure, not a stuck CI
        try:
            signal.alarm(60)
            h = store.offload(t)
            ok = numpy.array_equal(store.wait(h, store.reload(h)).numpy(), t.numpy())
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.close()


def _failing_writes(after: int):
    """An ``open`` for the offload module whose writes fail with ENOSPC once ``after`` files were
    written, leaving a partial file behind (what a full disk does)."""
    written = []

    class PartialFile:
        def __init__(self, path):
            self.f = open(path, "wb")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            if len(written) >= after:
                self.f.write(bytes(memoryview(data)[:100]))
                raise OSError(28, "No space left on device")
            written.append(len(data))
            return self.f.write(data)

    return lambda path, mode="r": PartialFile(path)


def test_a_failed_offload_write_is_an_offload_error_and_leaves_nothing(tmp_path, monkeypatch):
    """A write that fails (disk full) raises OffloadError naming the file, the bytes and the cause;
    the partial file and the folder are removed, and the store works again once the disk has room."""
    store = runtime.OffloadStore(runtime.FILE_STORE, dir=str(tmp_path))
    t = torch.randn(64, 64)
    monkeypatch.setattr(runtime, "open", _failing_writes(after=0), raising=False)
    with pytest.raises(OffloadError, match=r"16384 bytes to .*0\.bin: No space left on device"):
        store.offload(t)
    assert store.files() == [] and store.folder is None and not store.entries and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    h = store.offload(t)
    assert torch.equal(store.wait(h, store.reload(h)), t)
    store.close()


def test_a_step_whose_offload_fails_stops_cleanly_and_the_next_step_runs(monkeypatch):
    """In a planned step, the second offload's write fails: the step raises OffloadError, no file is
    left, and the next step (disk free again) runs with the same gradients as before."""
    before = set(runtime._STORES)
    ex = fresh("mlp", size="small")
    module = optimized(ex, solver="test_offload_swaps", cost_model="unit", cache=False)
    (store,) = new_stores(before)
    assert module.plan.simulation.offloaded >= 2
    ref = run_step(ex, module, steps=1)
    monkeypatch.setattr(runtime, "open", _failing_writes(after=1), raising=False)
    with pytest.raises(OffloadError, match="No space left on device"):
        ex.loss(module(*ex.args)).backward()
    gc.collect()
    assert store.files() == [] and store.folder is None
    monkeypatch.undo()
    ex.model.zero_grad(set_to_none=True)
    assert_bitwise(run_step(ex, module, steps=1), ref)


def test_a_store_that_cannot_be_measured_plans_with_conservative_costs(monkeypatch):
    """With no room to measure the file store (the 8 MiB test copy fails), optimize still plans: at
    budget None nothing is measured at all, and at a budget the plan uses slow, synchronous
    copies, said in a warning, instead of failing at every budget."""
    import remat
    from remat.execute import transfer

    calls = []

    def full_disk(dev, store):
        calls.append(store)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(transfer, "_measure", full_disk)
    monkeypatch.setattr(transfer, "_load", lambda path, key: None)
    monkeypatch.setattr(transfer, "_MEMO", {})
    ex = fresh("mlp", size="small")
    plain = remat.optimize(ex.model, *ex.args, budget=None, cost_model="unit", cache=False)
    assert calls == [] and "transfer" not in plain.plan.graph.meta
    with pytest.warns(UserWarning, match="could not measure the file offload store"):
        planned = remat.optimize(ex.model, *ex.args, budget=0.6, solver="chen_sqrt", cost_model="unit", cache=False)
    assert calls == ["file"] and planned.plan.graph.meta["transfer"]["d2h_bytes_per_s"] == 10e6
    assert planned.plan.peak_bytes <= planned.plan.budget_bytes


def test_offload_files_go_where_offload_dir_or_the_environment_says(tmp_path, monkeypatch):
    """``offload_dir=`` (else ``$REMAT_OFFLOAD_DIR``) holds the step's offload folder while it runs,
    empty after; a directory that cannot hold them is an OffloadError naming it, at optimize."""
    def folders(where):
        return sorted(where.glob("remat-offload-*"))

    for how, target in (("argument", tmp_path / "chosen dir"), ("environment", tmp_path / "from env")):
        ex = fresh("mlp", size="small")
        if how == "argument":
            module = optimized(ex, solver="test_offload_swaps", cost_model="unit", cache=False, offload_dir=str(target))
        else:
            monkeypatch.setenv("REMAT_OFFLOAD_DIR", str(target))
            module = optimized(ex, solver="test_offload_swaps", cost_model="unit", cache=False)
        out = module(*ex.args)
        (folder,) = folders(target)
        assert len(list(folder.glob("*.bin"))) == module.plan.simulation.offloaded
        ex.loss(out).backward()
        del out
        gc.collect()
        assert folders(target) == []
    monkeypatch.delenv("REMAT_OFFLOAD_DIR")
    (tmp_path / "a file").write_text("not a directory")
    with pytest.raises(OffloadError, match="offload_dir .*a file"):
        optimized(fresh("mlp", size="small"), solver="test_offload_swaps", cost_model="unit", cache=False,
                  offload_dir=str(tmp_path / "a file"))

"""Where a CUDA step's measured peak differs from the simulator's: the allocations op by op.

Run (on a machine with a CUDA GPU): ``python benchmarks/cuda_peak_gap.py --save F``. For each case,
one warmed-up step runs under ``torch.profiler`` with ``profile_memory=True``: every CUDA allocation
and free (bytes signed) in time order, each attributed to the innermost ATen op running on its thread
when it happened. Saved per case: the measured peak growth (allocated blocks), the requested one (what
the allocations asked for, before the allocator rounds blocks up) and the predicted one, the op during which
the measured peak is reached and the ops before it, and per op name the bytes its calls left allocated
beyond their outputs' share (transients that outlive the op, such as library workspaces).
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
import traceback

import common  # this folder is on the path

common.use_checkout_src()

import torch  # noqa: E402

import remat  # noqa: E402
from common import gpt2, log, measured_peak, mib, quiet, write_json  # noqa: E402

DEVICE = "cuda"
FULL = False  # --full: every event and instruction saved
GPT2_8L = dict(n_layer=8, n_embd=512, n_head=8, vocab=8192, positions=512, batch=8, seq=512)


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def memory_events(step, reset):
    """``(events, ops)``: CUDA memory events ``(t_ns, bytes, thread)`` in time order and op events
    ``(start_ns, end_ns, thread, name)`` of one ``step()`` under the profiler."""
    from torch.profiler import ProfilerActivity, profile

    reset()
    sync()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
        sync()
    cuda = getattr(torch._C._autograd.DeviceType, DEVICE.upper())
    mem, ops = [], []
    for e in prof.profiler.kineto_results.events():
        if e.name() == "[memory]":
            if e.device_type() == cuda:
                mem.append((e.start_ns(), e.nbytes(), e.start_thread_id()))
        elif e.name().startswith("aten::"):
            ops.append((e.start_ns(), e.start_ns() + e.duration_ns(), e.start_thread_id(), e.name()))
    mem.sort()
    ops.sort()
    return mem, ops


def innermost(ops, t, thread):
    """The innermost op of ``thread`` running at ``t`` (latest start among those covering it)."""
    i = bisect.bisect_right(ops, (t, float("inf"))) - 1
    for j in range(i, max(-1, i - 20000), -1):
        s, e, th, name = ops[j]
        if th == thread and s <= t <= e:
            return name
    return "(no op)"


def requested_peak(step, reset) -> int | None:
    """Peak growth of the bytes the step's allocations asked for (the caching allocator's
    ``requested_bytes``: before its rounding of blocks), or None off CUDA."""
    if DEVICE != "cuda":
        return None
    import gc

    reset()
    gc.collect()
    sync()
    start = torch.cuda.memory_stats().get("requested_bytes.all.current")
    torch.cuda.reset_peak_memory_stats()
    step()
    sync()
    peak = torch.cuda.memory_stats().get("requested_bytes.all.peak")
    return None if start is None or peak is None else max(peak - start, 0)


def analyse(step, reset, predicted: int | None, label: str) -> dict:
    """``reset()`` (outside what is measured) sets the gradients to None before each ``step()``."""
    reset()
    step()  # warm-up (lazy library state, autotuning)
    sync()
    reset()
    measured = measured_peak(None, step, DEVICE)
    mem, ops = memory_events(step, reset)
    running, peak, peak_at, series = 0, 0, -1, []
    for i, (t, nbytes, th) in enumerate(mem):
        running += nbytes
        series.append(running)
        if running > peak:
            peak, peak_at = running, i
    by_op: dict[str, list[int]] = {}
    for t, nbytes, th in mem:
        name = innermost(ops, t, th)
        acc = by_op.setdefault(name, [0, 0, 0])
        acc[0] += 1
        acc[1] += max(nbytes, 0)
        acc[2] += nbytes
    window = []
    for i in range(max(0, peak_at - 25), min(len(mem), peak_at + 5)):
        t, nbytes, th = mem[i]
        window.append(dict(i=i, op=innermost(ops, t, th), bytes=nbytes, running=series[i], thread=th))
    out = dict(label=label, measured=measured, requested=requested_peak(step, reset), profiled_peak=peak,
               predicted=predicted,
               threads=sorted({th for _, _, th in mem}), window=window,
               by_op=sorted(([k, *v] for k, v in by_op.items()), key=lambda r: -r[2])[:40],
               net_end=series[-1] if series else 0,
               events=[[nbytes, th, innermost(ops, t, th)] for t, nbytes, th in mem] if FULL else len(mem))
    log(f"{label}: measured {mib(measured)} MiB, profiled {mib(peak)} MiB, predicted {mib(predicted)} MiB; peak in "
        f"{window and [w['op'] for w in window if w['i'] == peak_at]}")
    return out


def mlp_case():
    """The eager MLP of tests/test_measure.py (hand-counted peak 84.0 MiB)."""
    sys.path.insert(0, "tests")
    from test_measure import BATCH, LAYERS, STEP_PEAK, WIDTH, _mlp

    model = _mlp(WIDTH, LAYERS, DEVICE)
    x = torch.randn(BATCH, WIDTH, device=DEVICE)

    def step():
        model(x).sum().backward()
    return analyse(step, lambda: model.zero_grad(set_to_none=True), STEP_PEAK, "MLP of test_measure, eager")


def plan_case(label, model, args, kwargs, loss, **options):
    with quiet():
        module = remat.optimize(model, *args, cache=False, **options, **kwargs)
    plan = module.plan

    def step():
        out = module(*args, **kwargs)
        (loss(out) if loss else out).backward()
    res = analyse(step, lambda: model.zero_grad(set_to_none=True), plan.peak_bytes, label)
    sim = plan.simulation
    k = sim.peak_index
    res["sim_peak_at"] = [dict(i=i, what=plan.instructions[i].describe(plan.graph), after=sim.timeline[i])
                          for i in range(max(0, k - 6), min(len(plan.instructions), k + 3))]
    if FULL:
        res["sim"] = [[ins.describe(plan.graph), sim.timeline[i],
                       plan.graph.nodes[ins.target].workspace if ins.kind == "compute" else 0]
                      for i, ins in enumerate(plan.instructions)]
        res["sim_boundary"] = plan.boundary if hasattr(plan, "boundary") else None
    res["sim_workspace_at_peak"] = [plan.graph.nodes[plan.instructions[i].target].workspace
                                   for i in range(max(0, k - 6), min(len(plan.instructions), k + 3))
                                   if plan.instructions[i].kind == "compute"]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--save")
    ap.add_argument("--cases", nargs="+", default=["mlp", "gpt2", "mha"])
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--full", action="store_true", help="save every memory event and plan instruction")
    a = ap.parse_args()
    global DEVICE, GPT2_8L, FULL
    FULL = a.full
    if a.cpu_smoke:
        DEVICE, GPT2_8L = "cpu", dict(GPT2_8L, n_layer=1, batch=1, seq=64, n_embd=64, vocab=500)
    elif not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    saved, t0 = dict(device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", torch=torch.__version__, cases=[]), time.perf_counter()

    def gpt2_case():
        model, args, kwargs = gpt2(GPT2_8L)
        model = model.to(DEVICE)
        kwargs = {k: v.to(DEVICE) for k, v in kwargs.items()}
        return plan_case("GPT-2 8L, hierarchical min", model, args, kwargs, None, budget="min",
                         solver="hierarchical")

    def mha_case():
        from remat.models.small import MHABlock
        torch.manual_seed(0)
        model = MHABlock(128, 4).to(DEVICE)
        x = torch.randn(8, 256, 128, device=DEVICE)
        return plan_case("MHA block, keep_set min 4 chunks", model, (x,), {}, None, budget="min", solver="keep_set",
                         split=4)

    cases = {"mlp": mlp_case, "gpt2": gpt2_case, "mha": mha_case}
    for name in a.cases:
        try:
            saved["cases"].append(cases[name]())
        except Exception as err:
            saved["cases"].append(dict(label=name, error=f"{type(err).__name__}: {err}"[:500]))
            traceback.print_exc()
        saved["elapsed"] = time.perf_counter() - t0
        if a.save:
            write_json(a.save, saved)
    print(json.dumps([{k: c.get(k) for k in ("label", "measured", "requested", "profiled_peak", "predicted", "error")}
                      for c in saved["cases"]], indent=1))


if __name__ == "__main__":
    main()

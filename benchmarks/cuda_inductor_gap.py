"""Where a ``remat.compile`` step on CUDA holds more than its plan: the live allocations at its peak.

Run (on a machine with a CUDA GPU): ``python benchmarks/cuda_inductor_gap.py [--model resnet --size small]
[--budget 0.5] [--cudnn on off]``. For each cuDNN setting the model is compiled by ``remat.compile`` at the
budget without calibration (the plan as made), warmed up, and one step runs under CUDA's memory history.
Replaying its allocations and frees gives the peak growth over the step's start and the blocks live at
that moment; each is printed with its size and the innermost frames that name it (Inductor's generated
code, with its source line, or the ATen operator that asked for it: a library's workspace shows so).
"""

from __future__ import annotations

import argparse
import linecache

import common  # this folder is on the path

common.use_checkout_src()

import torch  # noqa: E402

import remat  # noqa: E402
from remat import models as zoo  # noqa: E402


def _where(frames: list[dict]) -> str:
    """The frames that say who asked: generated code (with its line) and ATen/cuDNN C++ frames."""
    said = []
    for f in frames:
        name, file, line = f.get("name", ""), f.get("filename", ""), f.get("line", 0)
        if "torchinductor" in file or "/tmp/" in file:
            said.append(f"{name} @ {linecache.getline(file, line).strip()[:110]}")
        elif any(k in name for k in ("cudnn", "Cudnn", "workspace", "Workspace", "at::native::", "at::_ops::")):
            said.append(name[:110])
        if len(said) >= 3:
            break
    return " | ".join(said) or (frames[0].get("name", "?") if frames else "?")


def live_at_peak(step) -> tuple[int, list[tuple[int, str]]]:
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=200000, context="all", stacks="all")
    step()
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live, total, peak, at_peak = {}, 0, 0, {}
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            total += e["size"]
            if total > peak:
                peak, at_peak = total, dict(live)
        elif e["action"] == "free_completed":
            size = live.pop(e["addr"], (e["size"], None))[0]
            total -= size
    rows = sorted(((size, _where(frames)) for size, frames in at_peak.values()), reverse=True)
    return peak, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet")
    ap.add_argument("--size", default="small")
    ap.add_argument("--budget", type=float, default=0.5)
    ap.add_argument("--cudnn", nargs="+", default=["on", "off"])
    a = ap.parse_args()
    for setting in a.cudnn:
        torch.backends.cudnn.enabled = setting == "on"
        torch._dynamo.reset()
        ex = zoo.build(a.model, size=a.size, device="cuda")
        with common.quiet():
            compiled = remat.compile(ex.model, *ex.args, budget=a.budget, calibrate=False,
                                     options={"fallback_random": True}, example_kwargs=ex.kwargs, cache=False)

        def step():
            ex.model.zero_grad(set_to_none=True)
            ex.loss(compiled(*ex.args, **ex.kwargs)).backward()
        step()
        step()
        measured = common.measured_peak(None, step, "cuda")
        plan = compiled.plan
        peak, rows = live_at_peak(step)
        print(f"== cuDNN {setting}: budget {common.mib(plan.info['budget_bytes'], 2)} MiB, predicted "
              f"{common.mib(plan.peak_bytes, 2)} MiB, measured {common.mib(measured, 2)} MiB, replayed peak "
              f"{common.mib(peak, 2)} MiB, solver {plan.solver}, {len(rows)} blocks live at the peak")
        shown = 0
        for size, where in rows[:25]:
            print(f"  {size / 2**20:8.2f} MiB  {where}")
            shown += size
        print(f"  ... {(peak - shown) / 2**20:.2f} MiB in {max(0, len(rows) - 25)} smaller blocks")


if __name__ == "__main__":
    main()

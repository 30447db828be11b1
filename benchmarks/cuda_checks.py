"""What only a CUDA GPU can show: gradient accuracy, split plans, attention kernels, reordering.

Run (on a machine with a CUDA GPU): ``python benchmarks/cuda_checks.py --save F``; ``--render F``
writes ``benchmarks/cuda_checks.md`` from a saved run; ``--cpu-smoke`` runs tiny versions on the CPU
(checks the script only). Four sections, each saved as soon as it is measured:

1. **Gradient accuracy of ResNet-18** (the zoo's BatchNorm ResNet at ``tiny``, batch 2 at 32x32, and
   ``small``) against a float64 eager step on the same GPU, for eager PyTorch in float32 and for
   remat's ``store_all`` and ``checkpoint_all`` plans in float32, under four cuDNN settings: the
   default (TF32 convolutions allowed), TF32 off, deterministic algorithms with TF32 off, cuDNN off. Error of a gradient: max|got - ref| /
   max|ref| per parameter, the largest over parameters (and which); also the relative L2 norm over
   all parameters together. Also eager against itself (is the GPU deterministic?) and remat against
   eager in float32 (the figure ``benchmarks/cuda.md`` reports).
2. **The LM head split on the GPU**: a GPT-2 of the zoo with a 32,000-token vocabulary; the smallest
   budget of ``hierarchical`` without splits and with 8 chunks, each plan's measured peak against its
   prediction, gradients against ``store_all``'s, and step time of the split plan against the unsplit
   one at a budget both reach (median ratio of alternating rounds).
3. **Attention blocks** (``scaled_dot_product_attention``, ``nn.MultiheadAttention``): which ATen
   attention kernel the capture records on this device, the smallest budget without and with splits
   (``keep_set``, 4 chunks), the split plan's measured peak and its gradients against eager's.
4. **Reordering** (``distill``): ``store_all`` against ``reorder``, measured and predicted peaks,
   gradients bitwise equal.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path

import common  # this folder is on the path

common.use_checkout_src()

import torch  # noqa: E402

import remat  # noqa: E402
from remat import models as zoo  # noqa: E402
from common import (  # noqa: E402
    HERE, bitwise_equal, git_revision, gpt2, grad_errors, log, make_step, md_header, measured_peak, mib, quiet,
    seeded_grads, time_against, write_json)

DEVICE = "cuda"
GPT2_32K = dict(n_layer=2, n_embd=256, n_head=4, vocab=32000, positions=256, batch=4, seq=256)
SETTINGS = {"default (TF32 convolutions allowed)": dict(enabled=True, allow_tf32=True),
            "TF32 off": dict(enabled=True, allow_tf32=False),
            "deterministic cuDNN, TF32 off": dict(enabled=True, allow_tf32=False, deterministic=True),
            "cuDNN off": dict(enabled=False, allow_tf32=False)}


def to_device(xs, dtype=None):
    return tuple(x.to(DEVICE, dtype=dtype if dtype and x.is_floating_point() else None) for x in xs)


def gradient_accuracy(size: str) -> list[dict]:
    """Section 1 for one size of ResNet-18."""
    rows = []
    ex = zoo.build("resnet18", size=size, seed=0, device=DEVICE)
    names = [n for n, _ in ex.model.named_parameters()]
    ref_model = copy.deepcopy(ex.model).double()
    ref = seeded_grads(ref_model, make_step(ref_model, to_device(ex.args, torch.float64), {}, ex.loss), device=DEVICE)
    for label, flags in SETTINGS.items():
        row = dict(size=size, batch=int(ex.args[0].shape[0]), setting=label)
        try:
            with torch.backends.cudnn.flags(**flags), quiet():
                eager = make_step(ex.model, ex.args, ex.kwargs, ex.loss)
                e1 = seeded_grads(ex.model, eager, device=DEVICE)
                e2 = seeded_grads(ex.model, eager, device=DEVICE)
                row["eager_repeat_bitwise"] = bitwise_equal(e1, e2)
                row["eager"] = grad_errors(e1, ref, names)
                for solver in ("store_all", "checkpoint_all"):
                    module = remat.optimize(ex.model, *ex.args, solver=solver, cost_model="flops", cache=False,
                                            **ex.kwargs)
                    got = seeded_grads(ex.model, make_step(module, ex.args, ex.kwargs, ex.loss), device=DEVICE)
                    row[solver] = grad_errors(got, ref, names)
                    row[f"{solver}_vs_eager"] = grad_errors(got, e1, names)
                    if solver == "store_all":
                        store = got
                        row["batch_norm_ops"] = sorted({n.op for n in module.plan.graph.nodes if "batch_norm" in n.op})
                    else:
                        row["recompute_bitwise_store_all"] = bitwise_equal(got, store)
            log(f"  resnet18 {size} {label}: eager {row['eager']['max_rel']:.1e}, store_all "
                f"{row['store_all']['max_rel']:.1e}, store_all vs eager {row['store_all_vs_eager']['max_rel']:.1e}")
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            traceback.print_exc()
        rows.append(row)
    return rows


def plan_row(label, model, args, kwargs, loss, module, ref=None) -> dict:
    """A planned module's predicted and measured peak, and its gradients against ``ref``."""
    plan = module.plan
    step = make_step(module, args, kwargs, loss)
    got = seeded_grads(model, step, device=DEVICE)
    names = [n for n, _ in model.named_parameters()]
    row = dict(label=label, budget=plan.budget_bytes, predicted=plan.peak_bytes,
               measured=measured_peak(model, step, DEVICE), recomputations=plan.recomputations,
               overhead=plan.step_overhead, chunks=(plan.info.get("split") or {}).get("chunks"))
    if ref is not None:
        row["vs_ref"] = grad_errors(got, ref, names)
        row["bitwise_ref"] = bitwise_equal(got, ref)
    log(f"  {label}: predicted {mib(row['predicted'])}, measured {mib(row['measured'])} MiB, chunks {row['chunks']}")
    return row, step, got


def split_lm_head() -> dict:
    """Section 2."""
    model, args, kwargs = gpt2(GPT2_32K)
    model = model.to(DEVICE)
    kwargs = {k: v.to(DEVICE) for k, v in kwargs.items()}
    out = dict(config=GPT2_32K, rows=[])
    with quiet():
        store = remat.optimize(model, *args, solver="store_all", cache=False, **kwargs)
        row, _, ref = plan_row("store_all", model, args, kwargs, None, store)
        out["rows"].append(row)
        t0 = time.perf_counter()
        plain = remat.optimize(model, *args, budget="min", solver="hierarchical", split="off", cache=False, **kwargs)
        out["plain_plan_s"] = time.perf_counter() - t0
        row, plain_step, _ = plan_row("hierarchical min, no split", model, args, kwargs, None, plain, ref)
        out["rows"].append(row)
        t0 = time.perf_counter()
        split = remat.optimize(model, *args, budget="min", solver="hierarchical", split=8, cache=False, **kwargs)
        out["split_plan_s"] = time.perf_counter() - t0
        row, _, _ = plan_row("hierarchical min, 8 chunks", model, args, kwargs, None, split, ref)
        out["rows"].append(row)
        both = max(plain.plan.peak_bytes, split.plan.peak_bytes)  # a budget both reach
        at_plain = remat.optimize(model, *args, budget=both, solver="hierarchical", split=8,
                                  cache=False, **kwargs)
        row, split_step, _ = plan_row("hierarchical at the larger min, 8 chunks", model, args, kwargs, None,
                                      at_plain, ref)
        out["rows"].append(row)
    base, medians, ratios = time_against((model, plain_step), {"split": (model, split_step)}, 7, device=DEVICE,
                                         alternate=True)
    out.update(unsplit_ms=base * 1e3, split_ms=medians["split"] * 1e3, ratio=ratios["split"])
    return out


def attention_blocks(quick: bool) -> list[dict]:
    """Section 3."""
    from remat.api import capture_and_plan
    from remat.budget import fixed_bytes, fraction_to_bytes
    from remat.models.small import MHABlock, SDPABlock

    batch, seq, dim = (4, 64, 64) if quick else (8, 256, 128)
    out = []
    for label, cls in (("SDPA block", SDPABlock), ("nn.MultiheadAttention block", MHABlock)):
        torch.manual_seed(0)
        model = cls(dim, 4).to(DEVICE)
        x = torch.randn(batch, seq, dim, device=DEVICE)
        res = dict(label=f"{label} (width {dim}, {batch} x {seq} tokens)", rows=[])
        try:
            with quiet():
                store, captured = capture_and_plan(model, x, solver="store_all", split="off", cache=False)
                res["attention_ops"] = sorted({n.op for n in captured.graph.nodes
                                               if any(k in n.op for k in ("attention", "softmax", "bmm"))})
                res["store"] = store.peak_bytes
                res["half"] = fraction_to_bytes(0.5, store.peak_bytes, fixed_bytes(captured.graph))
                res["min_plain"] = remat.plan(model, x, budget="min", split="off", cache=False).peak_bytes
                ref = seeded_grads(model, lambda: model(x).backward(), device=DEVICE)
                split = remat.optimize(model, x, budget="min", solver="keep_set", split=4, cache=False)
                row, _, _ = plan_row("keep_set min, 4 chunks", model, (x,), {}, None, split, ref)
                res["rows"].append(row)
        except Exception as err:
            res["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
            traceback.print_exc()
        log(f"  {res['label']}: {res.get('attention_ops')} {res.get('error', '')}")
        out.append(res)
    return out


def reordering(quick: bool) -> dict:
    """Section 4."""
    ex = zoo.build("distill", size="tiny" if quick else "small", seed=0, device=DEVICE)
    out = dict(rows=[])
    with quiet():
        store = remat.optimize(ex.model, *ex.args, solver="store_all", cost_model="flops", cache=False, **ex.kwargs)
        row, _, ref = plan_row("store_all", ex.model, ex.args, ex.kwargs, ex.loss, store)
        out["rows"].append(row)
        reordered = remat.optimize(ex.model, *ex.args, solver="reorder", cost_model="flops", cache=False, **ex.kwargs)
        row, _, _ = plan_row("reorder", ex.model, ex.args, ex.kwargs, ex.loss, reordered, ref)
        out["rows"].append(row)
    return out


def render(saved: dict) -> str:
    meta = saved["meta"]
    out = ["# What only a CUDA GPU shows: gradient accuracy, split plans, attention kernels, reordering", "",
           f"Generated by `benchmarks/cuda_checks.py` at {meta['revision']} on {meta['device']} (torch "
           f"{meta['torch']}, CUDA {meta['cuda']}, allocator settings: {meta.get('allocator', 'default')}), {meta['elapsed']:.0f} s. Peaks: growth of allocated CUDA memory "
           "over the step's start (parameters and inputs excluded, gradients included). Gradient error: the "
           "largest over parameters of max|got − ref| / max|ref| (the parameter named), and the relative L2 norm "
           "over all parameters.", "", *meta.get("notes", [])]
    acc = saved.get("accuracy")
    if acc:
        out += ["## 1. ResNet-18 gradients against a float64 eager step on the GPU", "",
                *md_header(["size (batch)", "cuDNN", "eager fp32", "store_all fp32", "checkpoint_all fp32",
                            "store_all vs eager fp32", "eager repeat bitwise", "recompute bitwise = store_all",
                            "BatchNorm ops captured"])]
        for r in acc:
            if "error" in r:
                out.append(f"| {r['size']} ({r['batch']}) | {r['setting']} | {r['error']} |" + " |" * 6)
                continue

            def e(k):
                return f"{r[k]['max_rel']:.1e} ({r[k]['where']}); L2 {r[k]['l2']:.1e}"
            out.append(f"| {r['size']} ({r['batch']}) | {r['setting']} | {e('eager')} | {e('store_all')} | "
                       f"{e('checkpoint_all')} | {e('store_all_vs_eager')} | {r['eager_repeat_bitwise']} | "
                       f"{r['recompute_bitwise_store_all']} | {', '.join(r['batch_norm_ops'])} |")
        out.append("")

    def plan_table(rows):
        lines = md_header(["plan", "budget", "predicted", "measured", "measured / predicted", "chunks",
                           "recomputed", "predicted overhead", "gradients vs reference"])
        for r in rows:
            ref = r.get("vs_ref")
            lines.append(f"| {r['label']} | {mib(r['budget'])} MiB | {mib(r['predicted'])} MiB | {mib(r['measured'])} "
                         f"MiB | {r['measured'] / r['predicted']:.3f} | {r['chunks'] or '-'} | {r['recomputations']} | "
                         f"{r['overhead'] * 100:+.1f}% | " + ("-" if ref is None else (
                             "bitwise" if r.get("bitwise_ref") else f"{ref['max_rel']:.1e} ({ref['where']})")) + " |")
        return lines
    lm = saved.get("lm_head")
    if lm:
        out += ["## 2. The LM head split on the GPU", "", f"GPT-2 of the zoo, {lm.get('config', GPT2_32K)}; reference: store_all's "
                "gradients.", ""]
        if "error" in lm:
            out += [f"Error: {lm['error']}", ""]
        else:
            out += plan_table(lm["rows"]) + [
                "", f"Planning: unsplit min {lm['plain_plan_s']:.1f} s, split min {lm['split_plan_s']:.1f} s. Step at "
                f"the larger of the two minimums (a budget both reach): unsplit {lm['unsplit_ms']:.1f} ms, split into 8 chunks {lm['split_ms']:.1f} ms: "
                f"ratio **{lm['ratio']:.3f}** (median of 7 alternating rounds).", ""]
    att = saved.get("attention")
    if att:
        out += ["## 3. Attention blocks on the GPU", "", "Reference: eager PyTorch's gradients (float32).", ""]
        for r in att:
            out += [f"### {r['label']}", "", f"Attention ops captured: {', '.join(r.get('attention_ops', []))}.", ""]
            if "store" in r:
                out += [f"store_all {mib(r['store'])} MiB; smallest budget without splits {mib(r['min_plain'])} MiB; "
                        f"a fraction of 0.5 is {mib(r['half'])} MiB.", ""]
            if "error" in r:
                out += [f"Error: {r['error']}", ""]
            out += plan_table(r["rows"]) + [""]
    reo = saved.get("reorder")
    if reo:
        out += ["## 4. Reordering on the GPU (`distill`)", "", "Reference: store_all's gradients.", ""]
        out += ([f"Error: {reo['error']}"] if "error" in reo else plan_table(reo["rows"])) + [""]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--save", help="write the measurements as JSON here (after each section)")
    ap.add_argument("--render", help="write benchmarks/cuda_checks.md from a --save file; run nothing")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny versions on the CPU (checks the script only)")
    ap.add_argument("--sections", nargs="+", default=["accuracy", "lm_head", "attention", "reorder"])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"], help="ResNet-18 sizes of the accuracy section")
    ap.add_argument("--settings", nargs="+", help="cuDNN settings of the accuracy section (default: all)")
    a = ap.parse_args()
    global DEVICE, SETTINGS, GPT2_32K
    if a.render:
        text = render(json.loads(Path(a.render).read_text()))
        HERE.joinpath("cuda_checks.md").write_text(text)
        print(text)
        return
    if a.cpu_smoke:
        DEVICE = "cpu"
        SETTINGS = {"default (TF32 convolutions allowed)": dict(enabled=True, allow_tf32=True)}
        GPT2_32K = dict(GPT2_32K, vocab=2000, batch=2, seq=64)
    elif not torch.cuda.is_available():
        sys.exit("benchmarks/cuda_checks.py needs a CUDA GPU (--cpu-smoke checks the script on the CPU)")
    meta = dict(revision=git_revision(), device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
                torch=torch.__version__, allocator=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"), cuda=torch.version.cuda, elapsed=0.0)
    saved, start = dict(meta=meta), time.perf_counter()
    if a.settings:
        SETTINGS = {k: v for k, v in SETTINGS.items() if k in a.settings}
    sections = {"accuracy": lambda: [r for size in (("tiny",) if a.cpu_smoke else a.sizes)
                                     for r in gradient_accuracy(size)],
                "lm_head": split_lm_head, "attention": lambda: attention_blocks(a.cpu_smoke),
                "reorder": lambda: reordering(a.cpu_smoke)}
    for name in a.sections:
        log(f"section {name}")
        try:
            saved[name] = sections[name]()
        except Exception as err:
            saved[name] = dict(error=f"{type(err).__name__}: {str(err).splitlines()[0][:300]}", rows=[])
            traceback.print_exc()
        meta["elapsed"] = time.perf_counter() - start
        if a.save:
            write_json(a.save, saved)
    print(render(saved))


if __name__ == "__main__":
    main()

"""Batches of many lengths below the LM head's floor: splits under symbolic sizes, in one run.

Run: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/split_lengths.py [--steps 60] [--quick]``
(writes ``benchmarks/split_lengths.md``; ``--quick`` is a smoke test that writes nothing). With
``--device cuda`` the same on a GPU (writes ``benchmarks/split_lengths_cuda.md``, or ``--out``).

A GPT-2 of the zoo's family (``transformers``, random weights; 4 layers, width 128, a 32,000-token
vocabulary, 512 positions; its loss computed from ``labels`` inside ``forward``) is trained
``--steps`` AdamW steps, batch 4, on sequence lengths drawn log-normal (median 180) and clipped to
32..512. The budget is ``BUDGET_FRACTION`` of the 512-token step's changeable memory, in bytes:
below what any keep/recompute plan of the longest buckets reaches as captured (the logits, their
log-softmax and its gradient are each 250 MiB there). The same lengths, weights and seeds go to

(a) ``remat.optimize`` with ``split="off"``: one capture with dynamic sizes, a plan per size bucket;
    a bucket no plan fits raises ``InfeasibleBudgetError`` and its steps are skipped (counted);
(b) ``remat.optimize`` with ``split="auto"`` (the default): such a bucket is split into row chunks
    whose bounds follow the length at run time (``remat.capture.split_sizes``);
(c) eager PyTorch;
(d) ``remat.compile`` (Inductor), ``split="auto"``: the first length compiled for itself, then a
    compilation per size bucket with dynamic-shape kernels, split the same way (``fallback_random``:
    dropout drawn as eager draws it, for the gradient check).

Reported: steps trained and refused, total seconds (optimizer included; every capture, plan and
compilation counted), planning seconds, the largest measured peak (torch's CPU allocator, or CUDA's, forward +
backward, an extra untimed run every ``--check-every``-th step) and steps over the budget; at each
checked step, the gradients against an eager copy of the same weights on the same batch (largest
difference over each tensor's largest magnitude); (b)'s losses and final weights against (c)'s;
and, before anything runs, ``remat.plan_lengths`` with and without splits: each bucket's plan or
the smallest budget it needs.
"""

from __future__ import annotations

import argparse
import os
import time

import common

common.single_thread_env()
common.use_checkout_src()

BATCH, MAX_LEN, MIN_LEN, MEDIAN, VOCAB = 4, 512, 32, 180, 32000
CFG = dict(n_layer=4, n_embd=128, n_head=4, vocab=VOCAB, positions=MAX_LEN, batch=BATCH, seq=MEDIAN)
BUDGET_FRACTION = 0.5
DEVICE = "cpu"


def lengths(steps: int, seed: int = 0) -> list[int]:
    return common.lognormal_lengths(steps, MEDIAN, MIN_LEN, MAX_LEN, seed)


def batch(step: int, length: int) -> dict:
    import torch

    ids = torch.randint(0, VOCAB, (BATCH, length), generator=torch.Generator().manual_seed(step)).to(DEVICE)
    return {"input_ids": ids, "labels": ids}


def fresh_model():
    model, _, _ = common.gpt2(CFG)
    inner = model.model  # the transformers model itself: its forward returns an output with .loss
    inner.loss_type = None  # the zoo sets it; leave it unset, as users do
    return inner.train().to(DEVICE)


def grad_gap(model, step_fn, kwargs, seed: int) -> float:
    """Largest gradient difference (over each tensor's largest magnitude) of ``step_fn`` against an
    eager copy of ``model``'s weights, one batch, the same seed."""
    import copy

    import torch

    twin = copy.deepcopy(model)
    grads = []
    for module, fn in ((model, step_fn), (twin, twin)):
        module.zero_grad(set_to_none=True)
        torch.manual_seed(seed)
        fn(**kwargs).loss.backward()
        grads.append([p.grad for p in module.parameters()])
    model.zero_grad(set_to_none=True)
    return max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(*grads))


def train(method: str, model, step_fn, lens: list[int], check_every: int, budget_bytes: int) -> dict:
    import torch

    from remat.errors import InfeasibleBudgetError

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    peaks, losses, refused, gaps, measuring = [], [], [], [], 0.0
    start = time.perf_counter()
    for i, n in enumerate(lens):
        kwargs = batch(i, n)
        torch.manual_seed(i)
        try:
            loss = step_fn(**kwargs).loss
        except InfeasibleBudgetError:
            refused.append(n)
            losses.append(None)
            continue
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        if check_every and i % check_every == 0:
            t0 = time.perf_counter()

            def once():
                torch.manual_seed(i)
                step_fn(**kwargs).loss.backward()

            peaks.append((n, common.measured_peak(model, once, DEVICE)))
            model.zero_grad(set_to_none=True)
            if step_fn is not model:
                gaps.append(grad_gap(model, step_fn, kwargs, i))
            measuring += time.perf_counter() - t0
        if i % 10 == 0:
            common.log(f"{method}: step {i}/{len(lens)} length {n}")
    worst = max(peaks, key=lambda x: x[1]) if peaks else (None, 0)
    return {"seconds": time.perf_counter() - start - measuring, "worst_peak": worst[1], "worst_length": worst[0],
            "checked": len(peaks), "over": sum(p > budget_bytes for _n, p in peaks), "losses": losses,
            "refused": refused, "trained": len(lens) - len(refused), "grad_gap": max(gaps, default=None)}


def remat_run(name: str, lens, budget: int, split, check_every: int, inductor: bool = False):
    import torch._dynamo

    import remat

    model = fresh_model()
    torch._dynamo.reset()
    t0 = time.perf_counter()
    with common.quiet():
        if inductor:
            # dropout drawn as eager draws it, so that gradients compare with an eager copy's
            m = remat.compile(model, budget=budget, split=split, cache=False, options={"fallback_random": True})
        else:
            m = remat.optimize(model, **batch(0, lens[0]), budget=budget, split=split, cache=False)
    first = time.perf_counter() - t0
    with common.quiet():
        r = train(name, model, m, lens, check_every, budget)
    plans = m.plans
    r["seconds"] += first
    if inductor:  # each compilation's capture, plan and lowering (Inductor's compilation not counted)
        r.update(plans=len(plans), planning=sum(p.info.get("partition_seconds", 0.0) for p in plans))
    else:
        r.update(plans=len(plans), planning=plans[0].info.get("partition_seconds", first)
                 + sum(p.info.get("bucket_seconds", 0.0) for p in plans))
    buckets = common.bucket_plans(plans)
    return r, buckets, model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--check-every", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help="where the report goes (default: benchmarks/split_lengths[_cuda].md)")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if args.quick:
        args.steps, args.check_every = 8, 4
    started, revision = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), common.git_revision()
    common.process_setup(threads=2, quiet_future=True)
    import torch

    import remat
    from remat.solvers.planner import resolve

    lens = lengths(args.steps)
    common.log(f"{len(lens)} lengths, median {sorted(lens)[len(lens) // 2]}, max {max(lens)}")
    with common.quiet():
        probe = remat.plan(fresh_model(), **batch(0, MAX_LEN), solver="store_all", cache=False)
    budget = resolve(probe.graph, BUDGET_FRACTION)
    common.log(f"budget {common.mib(budget)} MiB (fraction {BUDGET_FRACTION} of the {MAX_LEN}-token step)")

    span = (MIN_LEN, MAX_LEN) if not args.quick else (MAX_LEN - 100, MAX_LEN)
    ahead = {}
    for split in ("off", "auto"):
        t0 = time.perf_counter()
        with common.quiet():
            rows = remat.plan_lengths(fresh_model(), **batch(0, MEDIAN), lengths=span, budget=budget, split=split,
                                      cache=False)
        ahead[split] = (rows, time.perf_counter() - t0)
        common.log(f"plan_lengths split={split}: {ahead[split][1]:.1f} s")

    results, tables, models = {}, {}, {}
    for name, split in (("(a) remat, split off", "off"), ("(b) remat, split auto", "auto")):
        results[name], tables[name], models[name] = remat_run(name, lens, budget, split, args.check_every)
    model = fresh_model()
    r = train("eager", model, model, lens, args.check_every, budget)
    r.update(plans=0, planning=0.0)
    results["(c) eager"], models["(c) eager"] = r, model
    name = "(d) remat.compile (Inductor), split auto"
    results[name], tables[name], _ = remat_run(name, lens, budget, "auto", args.check_every, inductor=True)

    b, c = results["(b) remat, split auto"], results["(c) eager"]
    loss_gap = max(abs(x - y) / abs(y) for x, y in zip(b["losses"], c["losses"]) if x is not None)
    # each tensor's largest difference over the most training moved it (AdamW moves a zero-initialised
    # bias by ~lr a step: a difference relative to its own magnitude would read large there)
    weight_gap = max(float((p - q).abs().max() / (q - q0).abs().max().clamp_min(1e-30))
                     for p, q, q0 in zip(models["(b) remat, split auto"].parameters(), model.parameters(),
                                         fresh_model().parameters()))
    if args.quick:
        for k, v in results.items():
            print(k, {key: val for key, val in v.items() if key != "losses"})
        print("loss gap", loss_gap, "weight gap", weight_gap)
        return
    report(results, tables, ahead, lens, budget, loss_gap, weight_gap, started, revision, args)


def _ahead_rows(ahead) -> list[str]:
    (off, off_s), (auto, auto_s) = ahead["off"], ahead["auto"]
    lines = common.md_header(["lengths", "split off: plan", "split off: smallest budget MiB", "split auto: plan",
                              "chunks", "predicted peak MiB", "overhead"])
    low = MIN_LEN
    for r_off, r_auto in zip(off, auto):
        left = (f"{r_off.plan.solver}, {common.mib(r_off.plan.peak_bytes)} MiB" if r_off.plan is not None
                else "**refused**")
        least = common.mib(getattr(r_off.error, "min_budget_bytes", None)) if r_off.plan is None else "–"
        if r_auto.plan is None:
            right = ["refused", "–", common.mib(getattr(r_auto.error, "min_budget_bytes", None)), "–"]
        else:
            p = r_auto.plan
            right = [p.solver, str(p.info.get("split", {}).get("chunks", "–")), common.mib(p.peak_bytes),
                     common.pct(p.overhead)]
        lines.append(f"| {low}..{r_off.edge} | {left} | {least} | {' | '.join(right)} |")
        low = r_off.edge + 1
    lines += ["", f"Planned before anything runs (`remat.plan_lengths`): {off_s:.1f} s without splits, "
              f"{auto_s:.1f} s with."]
    return lines


def report(results, tables, ahead, lens, budget, loss_gap, weight_gap, started, revision, args) -> None:
    import torch

    machine, allocator = common.machine_facts(), "torch's CPU allocator"
    if DEVICE != "cpu":
        machine = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}; host: {machine})"
        allocator = "CUDA allocator statistics, allocator settings " + os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default")
    lines = [
        "# Batches of many lengths below the LM head's floor: splits under symbolic sizes",
        "",
        common.made_by("split_lengths.py", revision, started, machine) + ".",
        "",
        f"GPT-2 (4 layers, width 128, vocabulary {VOCAB:,}, {MAX_LEN} positions, loss from `labels` in `forward`), "
        f"batch {BATCH}, {len(lens)} AdamW steps on lengths drawn log-normal (median {MEDIAN}) and clipped to "
        f"{MIN_LEN}..{MAX_LEN}: median {sorted(lens)[len(lens) // 2]}, max {max(lens)}, {len(set(lens))} distinct. "
        f"Budget: **{common.mib(budget)} MiB** in bytes, fraction {BUDGET_FRACTION} of the {MAX_LEN}-token step's "
        f"changeable memory. Peaks measured every {args.check_every}th step ({allocator}, forward + "
        "backward, an extra untimed run). Times include the optimizer and every capture and plan; the peak checks "
        "are left out.",
        "",
        "## Each bucket, before anything runs",
        "",
        *_ahead_rows(ahead),
        "",
        "## Training",
        "",
        *common.md_header(["method", "steps trained", "steps refused (lengths)", "total s", "plans", "planning s",
                           "largest measured peak MiB (length)", "checked steps over budget",
                           "gradients against eager (largest)"]),
    ]
    for name, r in results.items():
        refused = f"{len(r['refused'])}" + (f" ({min(r['refused'])}..{max(r['refused'])})" if r["refused"] else "")
        lines.append(f"| {name} | {r['trained']} | {refused} | {r['seconds']:.1f} | {r['plans']} | "
                     f"{r['planning']:.1f} | {common.mib(r['worst_peak'])} ({r['worst_length']}) | "
                     f"{r['over']} of {r['checked']} | {common.fmt(r['grad_gap'], '.1e')} |")
    b, c = results["(b) remat, split auto"], results["(c) eager"]
    lines += [
        "",
        f"(b) against (c): time **{b['seconds'] / c['seconds']:.2f}x**; losses within **{loss_gap:.1e}** "
        f"(relative, largest over the {b['trained']} steps); final weights within **{weight_gap:.1e}** of what "
        "training moved them (each tensor's largest difference over its largest change from the initial weights).",
    ]
    for name, seconds in (("(b) remat, split auto", "bucket_seconds"),
                          ("(d) remat.compile (Inductor), split auto", "partition_seconds")):
        lines += ["", f"## {name[:3]}'s buckets", "",
                  *common.md_header(["bucket (symbol: edge)", "solver", "chunks", "predicted peak MiB", "overhead",
                                     "made in s"])]
        for key, p in tables[name]:
            lines.append(f"| {', '.join(f'{s}: {e}' for s, e in key)} | {p.solver}"
                         f"{' (warm)' if p.info.get('warm') else ''} | {p.info.get('split', {}).get('chunks', '–')} | "
                         f"{common.mib(p.peak_bytes)} | {common.pct(p.overhead)} | {p.info.get(seconds, 0):.2f} |")
    lines.append("")
    default = common.HERE / ("split_lengths.md" if DEVICE == "cpu" else "split_lengths_cuda.md")
    common.publish("\n".join(lines), args.out or default)


if __name__ == "__main__":
    main()

"""Training on batches of many lengths: size buckets against padding, at one byte budget, in one run.

Run: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/shapes.py [--steps 300] [--quick]``
(writes ``benchmarks/shapes.md``; ``--quick`` is a smoke test that writes nothing).

A GPT-2 of the zoo's family (``transformers``, random weights; 4 layers, width 128, vocabulary
1000, 1024 positions; its loss computed from ``labels`` inside ``forward``, ``loss_type`` unset)
is trained ``--steps`` AdamW steps, batch 4, on sequence lengths drawn from a log-normal
distribution clipped to 32..1024 (median 180 tokens, as in instruction-tuning data). The same
lengths, weights and seeds go to four methods:

(a) ``remat.optimize`` fed each batch at its own length: one capture with dynamic sizes, a plan
    per size bucket (powers of two and midpoints), the budget in bytes at every bucket;
(b) ``remat.optimize`` with every batch padded to 1024 (labels -100 and attention mask 0 on the
    padding): one static capture, one plan at 1024;
(c) eager PyTorch, padded to 1024;
(d) ``torch.compile`` (Inductor) with ``dynamic=True`` and torch's
    ``activation_memory_budget`` (fraction ``TORCH_FRACTION``), unpadded;
(e) ``remat.compile`` (Inductor) fed each batch at its own length: the first shape compiled for
    itself, then one compilation per size bucket with dynamic-shape kernels, the budget in bytes.

The budget is ``BUDGET_FRACTION`` of the changeable memory of the 1024-token step, in bytes
(remat's fraction, resolved on that graph). For each method: total seconds (optimizer steps
included), captures, plans, seconds spent making plans (what remat does for each capture and
bucket: sizing, costs and workspaces measured, planning and lowering; Dynamo's tracing is not
planning, and the first capture's trace is shown apart for (a) and (b)), and the largest measured peak (torch's CPU
allocator, forward+backward, ``.grad`` None first) over every ``--check-every``-th step, each
measured in an extra untimed run of that step's batch.
"""

from __future__ import annotations

import argparse
import time

import common

common.single_thread_env()
common.use_checkout_src()

BATCH, MAX_LEN, MIN_LEN, MEDIAN = 4, 1024, 32, 180
CFG = dict(n_layer=4, n_embd=128, n_head=4, vocab=1000, positions=MAX_LEN, batch=BATCH, seq=MEDIAN)
BUDGET_FRACTION = 0.5
TORCH_FRACTION = 0.5


def lengths(steps: int, seed: int = 0) -> list[int]:
    return common.lognormal_lengths(steps, MEDIAN, MIN_LEN, MAX_LEN, seed)


def batch(step: int, length: int, pad_to: int | None):
    import torch

    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, CFG["vocab"], (BATCH, length), generator=g)
    if pad_to is None:
        return {"input_ids": ids, "labels": ids}
    padded = torch.zeros(BATCH, pad_to, dtype=torch.long)
    padded[:, :length] = ids
    labels = torch.full((BATCH, pad_to), -100, dtype=torch.long)
    labels[:, :length] = ids
    mask = torch.zeros(BATCH, pad_to, dtype=torch.long)
    mask[:, :length] = 1
    return {"input_ids": padded, "labels": labels, "attention_mask": mask}


def fresh_model():
    model, _, _ = common.gpt2(CFG)
    inner = model.model  # the transformers model itself: its forward returns an output with .loss
    inner.loss_type = None  # the zoo sets it; leave it unset, as users do
    return inner.train()


def train(method: str, model, step_fn, lens: list[int], pad_to, check_every: int, budget_bytes: int) -> dict:
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    peaks, start, losses = [], time.perf_counter(), []
    measuring = 0.0
    for i, n in enumerate(lens):
        kwargs = batch(i, n, pad_to)
        torch.manual_seed(i)
        loss = step_fn(**kwargs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
        if check_every and i % check_every == 0:
            t0 = time.perf_counter()

            def once():
                step_fn(**kwargs).loss.backward()

            peaks.append((n, common.measured_peak(model, once)))
            model.zero_grad(set_to_none=True)
            measuring += time.perf_counter() - t0
        if i % 50 == 0:
            common.log(f"{method}: step {i}/{len(lens)} length {n}")
    total = time.perf_counter() - start - measuring
    worst = max(peaks, key=lambda x: x[1]) if peaks else (None, 0)
    return {"seconds": total, "worst_peak": worst[1], "worst_length": worst[0], "checked": len(peaks),
            "over": sum(p > budget_bytes for _n, p in peaks), "final_loss": losses[-1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--check-every", type=int, default=15)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.check_every = 12, 4
    started, revision = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), common.git_revision()
    common.process_setup(threads=2, quiet_future=True)
    import torch
    import torch._dynamo
    import torch._functorch.config

    import remat

    lens = lengths(args.steps)
    common.log(f"{len(lens)} lengths, median {sorted(lens)[len(lens) // 2]}, max {max(lens)}")
    full = batch(0, MAX_LEN, None)
    with common.quiet():
        probe = remat.plan(fresh_model(), **full, solver="store_all", cache=False)
    from remat.solvers.planner import resolve

    budget = resolve(probe.graph, BUDGET_FRACTION)
    common.log(f"budget {common.mib(budget)} MiB (fraction {BUDGET_FRACTION} of the 1024-token step)")
    results = {}

    # (a) buckets
    model = fresh_model()
    t0 = time.perf_counter()
    with common.quiet():
        first = batch(0, lens[0], None)
        m = remat.optimize(model, **first, budget=budget, cache=False)
    first_capture = time.perf_counter() - t0
    with common.quiet():
        r = train("buckets", model, m, lens, None, args.check_every, budget)
    plans = m.plans
    first_planning = plans[0].info.get("partition_seconds", first_capture)
    r.update(captures=len({p.info.get("capture") for p in plans}), plans=len(plans),
             planning=first_planning + sum(p.info.get("bucket_seconds", 0.0) for p in plans),
             tracing=first_capture - first_planning,
             plan_peak=max(p.peak_bytes for p in plans))
    r["seconds"] += first_capture
    results["(a) remat, buckets"] = r
    buckets_table = common.bucket_plans(plans)

    # (b) remat padded
    model = fresh_model()
    t0 = time.perf_counter()
    with common.quiet():
        m = remat.optimize(model, **batch(0, MAX_LEN, MAX_LEN), budget=budget, cache=False)
    capture = time.perf_counter() - t0
    with common.quiet():
        r = train("padded remat", model, m, lens, MAX_LEN, args.check_every, budget)
    planning = m.plans[0].info.get("partition_seconds", capture)
    r.update(captures=len({p.info.get("capture") for p in m.plans}), plans=len(m.plans), planning=planning,
             tracing=capture - planning, plan_peak=max(p.peak_bytes for p in m.plans))
    r["seconds"] += capture
    results["(b) remat, padded to 1024"] = r

    # (c) eager padded
    model = fresh_model()
    r = train("padded eager", model, model, lens, MAX_LEN, args.check_every, budget)
    r.update(captures=0, plans=0, planning=0.0, plan_peak=None)
    results["(c) eager, padded to 1024"] = r

    # (d) torch.compile, dynamic, activation_memory_budget
    name = f"(d) torch.compile dynamic, activation_memory_budget={TORCH_FRACTION}"
    model = fresh_model()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, dynamic=True)
    try:
        with torch._functorch.config.patch(activation_memory_budget=TORCH_FRACTION), common.quiet():
            r = train("torch.compile", model, compiled, lens, None, args.check_every, budget)
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        r.update(captures=graphs, plans=graphs, planning=None, plan_peak=None)
    except Exception as err:  # reported in the table, not lost with the run
        common.log(f"torch.compile failed: {type(err).__name__}: {err}")
        r = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    results[name] = r

    # (e) remat.compile, buckets
    model = fresh_model()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    m = remat.compile(model, budget=budget, cache=False)
    with common.quiet():
        r = train("remat.compile", model, m, lens, None, args.check_every, budget)
    plans = m.plans
    r.update(captures=torch._dynamo.utils.counters["stats"]["unique_graphs"], plans=len(plans),
             planning=sum(p.info.get("partition_seconds", 0.0) for p in plans),
             plan_peak=max(p.peak_bytes for p in plans))
    results["(e) remat.compile (Inductor), buckets"] = r
    compiled_table = common.bucket_plans(plans)

    if args.quick:
        for k, v in results.items():
            print(k, v)
        return
    report(results, buckets_table, compiled_table, lens, budget, started, revision, args)


def _bucket_rows(table, seconds_key: str) -> list[str]:
    return [f"| {', '.join(f'{s}: {e}' for s, e in key)} | {p.solver}{' (warm)' if p.info.get('warm') else ''} "
            f"| {common.mib(p.peak_bytes)} | {common.pct(p.overhead)} | {p.info.get(seconds_key, 0):.2f} |"
            for key, p in table]


def report(results, buckets_table, compiled_table, lens, budget, started, revision, args) -> None:
    a, b = results["(a) remat, buckets"], results["(b) remat, padded to 1024"]
    lines = [
        "# Variable lengths: size buckets against padding",
        "",
        common.made_by("shapes.py", revision, started, common.machine_facts()) + ".",
        "",
        f"GPT-2 (4 layers, width 128, vocabulary 1000, 1024 positions, loss from `labels` in `forward`), batch "
        f"{BATCH}, {len(lens)} AdamW steps on lengths drawn log-normal (median {MEDIAN}) and clipped to "
        f"{MIN_LEN}..{MAX_LEN}: median {sorted(lens)[len(lens) // 2]}, max {max(lens)}, "
        f"{len(set(lens))} distinct. Budget: **{common.mib(budget)} MiB** in bytes, fraction {BUDGET_FRACTION} of "
        f"the 1024-token step's changeable memory. Peaks measured every {args.check_every}th step (torch's CPU "
        "allocator, forward + backward, an extra untimed run). Times include the optimizer and every capture "
        "and plan; the peak checks are left out.",
        "",
        *common.md_header(["method", "total s", "captures", "first trace s", "plans", "planning s", "planning share",
                           "largest plan peak MiB", "largest measured peak MiB (length)", "checked steps over budget"]),
    ]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error']} | | | | | | | | |")
            continue
        share = "–" if r["planning"] is None else f"{r['planning'] / r['seconds']:.1%}"
        lines.append(
            f"| {name} | {r['seconds']:.1f} | {r['captures']} | {common.fmt(r.get('tracing'), '.1f')} | {r['plans']} | "
            f"{common.fmt(r['planning'], '.1f')} | {share} | {common.mib(r['plan_peak'])} | "
            f"{common.mib(r['worst_peak'])} ({r['worst_length']}) | {r['over']} of {r['checked']} |")
    lines += [
        "",
        f"Time of (a) against (b): **{a['seconds'] / b['seconds']:.2f}x** (target <= 0.6x); planning "
        f"{a['planning'] / a['seconds']:.1%} of (a)'s time (target <= 5%).",
        "",
        "## (a)'s buckets",
        "",
        *common.md_header(["bucket (symbol: edge)", "solver", "predicted peak MiB", "overhead", "made in s"]),
    ]
    lines += _bucket_rows(buckets_table, "bucket_seconds")
    e = results["(e) remat.compile (Inductor), buckets"]
    lines += [
        "",
        "## (e)'s buckets (planned in full; planning = capture, plan and lowering, not Inductor's compilation)",
        "",
        *common.md_header(["bucket (symbol: edge)", "solver", "predicted peak MiB", "overhead", "planned in s"]),
        *_bucket_rows(compiled_table, "partition_seconds"),
        "",
        f"Time of (e) against (b): **{e['seconds'] / b['seconds']:.2f}x**; against (d): "
        f"**{e['seconds'] / results[next(k for k in results if k.startswith('(d)'))].get('seconds', float('nan')):.2f}x**.",
        "",
    ]
    common.publish("\n".join(lines), common.HERE / "shapes.md")


if __name__ == "__main__":
    main()

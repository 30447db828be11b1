"""Why a split step under ``remat.compile`` on CUDA held more than its plan (37.0 MB for 12.4 MB on an H100).

Run (on a machine with a CUDA GPU): ``python benchmarks/cuda_split_gap.py [--chunks 8] [--code FILE]``.
The model is ``tests/test_split_cuda.py``'s: a 2-layer GPT-2, width 32, a 32k vocabulary, 2 x 64 tokens,
whose LM head and loss set the floor. For the step unsplit and split into ``--chunks`` chunks, compiled
by ``remat.compile`` at ``budget="min"`` without calibration (the plan as made), and for the same split
step in the eager lowering (``remat.optimize``), it prints the predicted and measured peaks, the gradients'
largest relative error against eager PyTorch, and the allocations live at the measured peak with the
generated code that made each (``cuda_inductor_gap.live_at_peak``). ``--code FILE`` writes the split
step's generated Inductor code there, to read the buffers by name.
"""

from __future__ import annotations

import argparse
import copy
import logging

import common  # this folder is on the path

common.use_checkout_src()

import torch  # noqa: E402

import remat  # noqa: E402
from cuda_inductor_gap import live_at_peak  # noqa: E402


def _gpt2(device):
    from remat.models.hf import _finish_hf, _transformers

    tf = _transformers()
    torch.manual_seed(0)
    config = tf.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=32000, n_positions=64, bos_token_id=0,
                           eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "eager"
    model = _finish_hf(tf.GPT2LMHeadModel(config), "ForCausalLM", use_cache=False).to(device)
    ids = torch.randint(0, 32000, (2, 64), device=device)
    return model, {"input_ids": ids, "labels": ids.clone()}


def _grads(module, batch):
    module.zero_grad(set_to_none=True)
    module(**batch).backward()
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--code", default=None)
    ap.add_argument("--shown", type=int, default=30)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (no allocation list)")
    a = ap.parse_args()
    model, batch = _gpt2(a.device)
    eager = _grads(copy.deepcopy(model), batch)
    variants = {
        "compile, unsplit": lambda m: remat.compile(m, budget="min", split="off", example_kwargs=batch, cache=False,
                                                    calibrate=False),
        f"compile, split={a.chunks}": lambda m: remat.compile(m, budget="min", split=a.chunks, example_kwargs=batch,
                                                             cache=False, calibrate=False),
        f"optimize, split={a.chunks}": lambda m: remat.optimize(m, budget="min", split=a.chunks, cache=False, **batch),
    }
    for name, make in variants.items():
        torch._dynamo.reset()
        if a.code and name.startswith("compile, split"):
            handler = logging.FileHandler(a.code)
            logging.getLogger("torch._inductor.codecache").addHandler(handler)
            torch._logging.set_logs(output_code=True)
        module = make(copy.deepcopy(model))
        module(**batch).backward()  # compiles at its first call
        if a.code and name.startswith("compile, split"):
            torch._logging.set_logs(output_code=False)
        got = _grads(module, batch)
        error = max(float((got[n] - eager[n]).abs().max() / eager[n].abs().max()) for n in eager)
        measured = common.measured_peak(module, lambda: module(**batch).backward(), a.device)

        def step():
            module.zero_grad(set_to_none=True)
            module(**batch).backward()
        peak, rows = live_at_peak(step) if a.device == "cuda" else (measured, [])
        plan = module.plan
        print(f"== {name}: solver {plan.solver}, split {plan.info.get('split', {}).get('chunks', 1)}, predicted "
              f"{common.mib(plan.peak_bytes, 2)} MiB, measured {common.mib(measured, 2)} MiB, replayed peak "
              f"{common.mib(peak, 2)} MiB, gradients {error:.1e} from eager's, {len(rows)} blocks live at the peak",
              flush=True)
        for site in plan.info.get("split", {}).get("sites", []):
            print(f"   site: {site[:300]}")
        shown = 0
        for size, where in rows[: a.shown]:
            print(f"  {size / 2**20:8.3f} MiB  {where}")
            shown += size
        print(f"  ... {(peak - shown) / 2**20:.3f} MiB in {max(0, len(rows) - a.shown)} smaller blocks", flush=True)


if __name__ == "__main__":
    main()

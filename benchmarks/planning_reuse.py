"""Planning time of ``remat.compile`` against another checkout's, where Inductor plans a step twice.

Run: ``.venv/bin/python benchmarks/planning_reuse.py --baseline-src PATH [--rounds 2]`` (writes
``benchmarks/planning_reuse.md``; about 4 minutes on 2 cores).

Under Inductor a step whose recomputation plan costs much more than storing everything is planned
again with the offload tier's costs (``auto`` then also runs the ``hybrid`` solver). Case: the zoo's
2-layer GPT-2 (width 64, vocabulary 300, 2 x 64 tokens) compiled at a fraction of 0.4, calibration
off, a fresh plan cache. Each checkout in a fresh process (one torch thread), alternating, ``rounds`` times; reported:
the seconds ``remat.compile`` took to its first plan (capture, planning, lowering, Inductor's
compilation), the plan's predicted peak and step, and the ratio now / before.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"

CASE = r'''
import time, warnings
warnings.simplefilter("ignore")
import remat
from remat import models as zoo
model, args, kwargs = zoo._gpt2(n_layer=2, n_embd=64, n_head=2, vocab=300, positions=64, batch=2, seq=64)
t = time.perf_counter()
m = remat.compile(model.train(), *args, budget=0.4, example_kwargs=kwargs, calibrate=False)
print(time.perf_counter() - t, m.plan.peak_bytes, m.plan.step_seconds)
'''


def run(src: Path) -> tuple[float, int, float]:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1", REMAT_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", CASE], env=env, capture_output=True, text=True, check=True).stdout
    seconds, peak, step = out.strip().splitlines()[-1].split()
    return float(seconds), int(peak), float(step)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-src", type=Path, required=True, help="the other checkout's src folder")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "planning_reuse.md")
    ap.add_argument("--title", default="remat.compile's planning: the recomputation solvers once per step")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from common import git_revision, machine_facts

    def revision(src: Path) -> str:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "?"

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = ["| round | before: s | now: s | now / before | before: peak, step | now: peak, step |", "|---|---|---|---|---|---|"]
    ratios = []
    for k in range(args.rounds):
        before, now = run(args.baseline_src), run(SRC)
        ratios.append(now[0] / before[0])
        rows.append(f"| {k + 1} | {before[0]:.1f} | {now[0]:.1f} | {ratios[-1]:.3f} | {before[1]} B, {before[2] * 1e3:.4f} ms | "
                    f"{now[1]} B, {now[2] * 1e3:.4f} ms |")
        print(rows[-1], flush=True)
    text = "\n".join([
        f"# {args.title}", "",
        f"`benchmarks/planning_reuse.py` at {git_revision()} against {revision(args.baseline_src)}, {started}; {machine_facts()}.", "",
        (__doc__ or "").split("\n\n", 2)[2].strip(), "", *rows, "",
        f"now / before: {min(ratios):.3f}-{max(ratios):.3f} (same plan: peak and predicted step equal).", ""])
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

"""``python -m remat.models [size ...]``: re-measure the table in the package docstring.

For each model and size (all three by default) it prints one row: the MiB autograd saves for
backward, the growth of the resident-memory high-water mark over one forward+backward (measured
in a fresh process, Linux only) and the best of several step times in milliseconds.
"""

from __future__ import annotations

import torch

from . import SIZES, Example, build, names


def _saved_bytes(ex: Example) -> int:
    """Bytes autograd saves for backward (distinct storages, parameters/buffers/inputs excluded)."""
    skip = {t.untyped_storage().data_ptr() for t in ex.model.parameters()}
    skip |= {t.untyped_storage().data_ptr() for t in ex.model.buffers()}
    skip |= {t.untyped_storage().data_ptr() for t in (*ex.args, *ex.kwargs.values())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip and s.device.type != "meta":
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = ex.loss(ex.model(*ex.args, **ex.kwargs))
    loss.backward()
    return sum(seen.values())


def _peak_bytes(name: str, size: str) -> int:
    """Growth of VmHWM over one forward+backward on the CPU (Linux only), measured in a fresh
    process whose glibc sends blocks of 64 KiB and more straight to mmap, so freed memory
    leaves the resident set instead of hiding in the heap."""
    import os
    import subprocess
    import sys

    code = (
        "import torch, remat.models as z\n"
        f"ex = z.build({name!r}, size={size!r}); ex.step(); ex.model.zero_grad(set_to_none=True)\n"
        "def get(key):\n"
        "    with open('/proc/self/status') as f:\n"
        "        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key))\n"
        "peaks = []\n"
        "for _ in range(3):\n"
        "    open('/proc/self/clear_refs', 'w').write('5'); start = get('VmRSS:')\n"
        "    ex.step(); peaks.append(get('VmHWM:') - start); ex.model.zero_grad(set_to_none=True)\n"
        "print(sorted(peaks)[1])\n"
    )
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def _report(sizes: tuple[str, ...] = SIZES, repeat: int = 7) -> str:
    """One table row per model and size: saved MiB, peak MiB, best step ms of ``repeat``."""
    import time

    rows = []
    for name in names():
        for size in sizes:
            ex = build(name, size=size)
            ex.step()  # warm up
            saved = _saved_bytes(ex)
            times = []
            for _ in range(repeat):
                ex.model.zero_grad(set_to_none=True)
                t = time.perf_counter()
                ex.step()
                times.append(time.perf_counter() - t)
            step = min(times)
            peak = _peak_bytes(name, size)
            rows.append(f"{name:<13}  {size:<6}  {saved / 2**20:>11.1f}  {peak / 2**20:>10.1f}"
                        f"  {step * 1e3:>8.1f}")
            print(rows[-1], flush=True)
    return "\n".join(rows)


if __name__ == "__main__":
    import sys

    _report(tuple(sys.argv[1:]) or SIZES)

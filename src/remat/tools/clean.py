"""``remat clean``: remove what killed processes left behind.

    remat clean                       # offload folders whose owner is gone, half-written cache files
    remat clean --offload-dir /scratch

A remat process removes its offload folder when the step ends, and the next process that offloads
removes the folders of processes that died (the OOM killer's SIGKILL) in its directory. This
command does it on request, also for folders of older remat versions, which carry no owner, and
for the temporary files of cache writes that were killed half-way.
"""

from __future__ import annotations

from pathlib import Path

from ..cost.machine import cache_dir, remove_stale_temp_files
from ..errors import format_bytes
from ..execute.offload import remove_orphans
from ..solvers.cache import plan_cache_dir


def clean(offload_dir: str | None = None) -> list[tuple[str, int]]:
    """Remove the orphaned offload folders in ``offload_dir`` (default: ``$REMAT_OFFLOAD_DIR``, else the
    temporary directory), older remat's included, and the stale temporary files of remat's caches;
    ``(path, bytes)`` for each."""
    removed = [(str(p), n) for p, n in remove_orphans(offload_dir, unknown_too=True)]
    for folder in dict.fromkeys([cache_dir(), plan_cache_dir()]):
        removed += [(str(p), n) for p, n in remove_stale_temp_files(Path(folder))]
    return removed


def cmd_clean(args, ui) -> int:
    removed = clean(args.offload_dir)
    for path, nbytes in removed:
        ui.out.print(f"removed {path} ({format_bytes(nbytes)})")
    ui.out.print(f"{len(removed)} removed, {format_bytes(sum(n for _, n in removed))} freed")
    return 0


__all__ = ["clean", "cmd_clean"]

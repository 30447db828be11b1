"""Where a benchmark table came from: the commit, and the machine and library versions.

Imported by the scripts in this folder (run as ``python benchmarks/NAME.py``, so this folder is
on the path).
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def git_revision() -> str:
    """The commit the run used, and whether src/ had uncommitted changes (read-only git calls)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    try:
        rev, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "src")
    except OSError:
        return "unknown"
    return f"{rev}{' with uncommitted changes in src/' if dirty else ''}"


def machine_facts() -> str:
    """CPU model, visible cores, torch and its thread count, Python and transformers versions."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        import transformers

        hf = f", transformers {transformers.__version__}"
    except ImportError:
        hf = ""
    return (f"{cpu}, {os.cpu_count()} cores visible, torch {torch.__version__} with {torch.get_num_threads()} "
            f"thread(s) (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
            f"Python {platform.python_version()}{hf}")

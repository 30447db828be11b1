"""Faults a real training run meets: a process killed mid-step, a cache write killed half-way.

A killed process (SIGKILL: the OOM killer) cannot remove its offload folder; the next process that
offloads into the same directory removes it, and so does ``remat clean``. A live process's folder
is never touched. (Disk-full writes and a store that cannot be measured: tests/test_offload.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import remat
from remat.cost.machine import remove_stale_temp_files
from remat.execute import offload
from remat.tools.cli import main as cli_main

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX signals")

SRC = str(Path(remat.__file__).resolve().parent.parent)

# The child offloads (a store of its own, or a planned step's), says where, then is killed
# (by the parent, or by itself from inside the step).
_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {src!r})
    import torch
    from remat.execute import offload
    where = {where!r}
    if where == "between offload and reload":
        store = offload.OffloadStore("file", dir={dir!r})
        handle = store.offload(torch.randn(256, 256))
        print(store.folder, flush=True)
        time.sleep(120)
    else:  # inside a planned step's backward, with the forward's values offloaded
        import remat
        from remat import models
        sys.path.insert(0, {root!r})
        import tests.test_offload  # noqa: F401  (registers its solver "test_offload_swaps")

        ex = models.build("mlp", size="small")
        m = remat.optimize(ex.model, *ex.args, solver="test_offload_swaps", cost_model="unit", cache=False)
        assert m.plan.offloaded_values, "the child's plan must offload"
        out = m(*ex.args)
        out.register_hook(lambda grad: os.kill(os.getpid(), signal.SIGKILL))
        print("offloaded", flush=True)
        ex.loss(out).backward()
""")


def _start(where: str, tmp_path: Path) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    script = _CHILD.format(src=SRC, root=str(Path(__file__).resolve().parent.parent), where=where, dir=str(tmp_path))
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)


def _folders(tmp_path: Path) -> list[Path]:
    return sorted(p for p in tmp_path.iterdir() if p.name.startswith(offload.FOLDER_PREFIX))


def test_a_killed_processs_offload_folder_is_removed_by_the_next_store_and_a_live_ones_is_kept(tmp_path):
    child = _start("between offload and reload", tmp_path)
    try:
        folder = Path(child.stdout.readline().strip())
        assert folder.is_dir() and any(folder.glob("*.bin"))
        assert offload.remove_orphans(str(tmp_path)) == [] and folder.is_dir()  # its owner lives
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert folder.is_dir(), "SIGKILL leaves the folder, activations included"
    store = offload.OffloadStore("file", dir=str(tmp_path))  # the next process to offload here...
    handle = store.offload(torch.randn(8))
    assert not folder.exists() and _folders(tmp_path) == [Path(store.folder)]  # ...removes the orphan
    del handle
    store.close()
    assert _folders(tmp_path) == []


def test_a_step_killed_inside_its_backward_leaves_a_folder_that_remat_clean_removes(tmp_path, capsys):
    child = _start("inside the backward", tmp_path)
    assert child.stdout.readline().strip() == "offloaded"
    assert child.wait(timeout=300) == -signal.SIGKILL
    (left,) = _folders(tmp_path)
    assert any(left.glob("*.bin")), "the killed step's offloaded activations are on disk"
    old_remat = tmp_path / f"{offload.FOLDER_PREFIX}abc123"  # an older remat's folder: no owner known
    old_remat.mkdir()
    assert cli_main(["clean", "--offload-dir", str(tmp_path)]) == 0
    assert _folders(tmp_path) == []
    out = capsys.readouterr().out
    assert str(left) in out and str(old_remat) in out and "2 removed" in out


def test_temporary_files_of_killed_cache_writes_are_removed(tmp_path):
    """``.<name>-<pid>-<random>.tmp`` of a dead writer goes; a live writer's stays; without a pid
    (older remat) it goes once a day old."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = tmp_path / f".entry-{dead.pid}-x1y2.tmp"
    writing = tmp_path / f".entry-{os.getpid()}-a1b2.tmp"
    old = tmp_path / ".entry-zz9.tmp"
    recent = tmp_path / ".other-qq8.tmp"
    for p in (killed, writing, old, recent):
        p.write_text("{")
    os.utime(old, (time.time() - 2 * 86400,) * 2)
    removed = {p for p, _ in remove_stale_temp_files(tmp_path)}
    assert removed == {killed, old} and writing.exists() and recent.exists()

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


# The child mounts a file system (a tmpfs in a user and mount namespace of its own: no
# privileges needed where the kernel allows unprivileged user namespaces) as REMAT_OFFLOAD_DIR,
# plans, shrinks it to 4 KiB, runs a planned step that offloads more than that, then gives the
# disk room again and steps on.
_SMALL_DISK_CHILD = textwrap.dedent("""
    import os, subprocess, sys, warnings
    sys.path.insert(0, {src!r})
    sys.path.insert(0, {root!r})
    disk = {disk!r}
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", disk], check=True)
    os.environ["REMAT_OFFLOAD_DIR"] = disk
    warnings.simplefilter("ignore")
    import copy, torch, remat
    from remat import models
    from remat.errors import OffloadError
    import tests.test_offload  # noqa: F401  (registers its solver "test_offload_swaps")

    ex = models.build("mlp", size="small")
    eager = copy.deepcopy(ex.model)
    ex.loss(eager(*ex.args)).backward()
    m = remat.optimize(ex.model, *ex.args, solver="test_offload_swaps", cost_model="unit", cache=False)
    print("offload peak", m.plan.offload_peak_bytes, flush=True)
    subprocess.run(["mount", "-o", "remount,size=4k", disk], check=True)  # now the disk fills up
    try:
        ex.loss(m(*ex.args)).backward()
        print("no error", flush=True)
    except OffloadError as err:
        print("OffloadError:", str(err).replace(chr(10), " "), flush=True)
    print("left on the disk:", sorted(os.listdir(disk)), flush=True)
    subprocess.run(["mount", "-o", "remount,size=64m", disk], check=True)
    ex.model.zero_grad(set_to_none=True)
    ex.loss(m(*ex.args)).backward()
    same = all(torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6)
               for a, b in zip(ex.model.parameters(), eager.parameters()))
    print("next step same gradients:", same, "left:", sorted(os.listdir(disk)), flush=True)
""")


def _can_mount_tmpfs(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "mount", "-t", "tmpfs",
                               "-o", "size=4k", "tmpfs", str(probe)], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def test_a_full_disk_under_a_planned_step_is_an_offload_error_and_the_next_step_runs(tmp_path):
    """A real small file system, not a mock: the write that finds it full raises OffloadError naming
    the file and the bytes, nothing is left on it, and once it has room the same module steps on."""
    if not _can_mount_tmpfs(tmp_path):
        pytest.skip("this machine does not let an unprivileged user mount a tmpfs (unshare --user --mount)")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = _SMALL_DISK_CHILD.format(src=SRC, root=str(Path(__file__).resolve().parent.parent), disk=str(disk))
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert int(lines[0].split()[-1]) > 4096, "the plan must offload more than the disk holds"
    assert lines[1].startswith("OffloadError:") and "No space left on device" in lines[1] and "bytes to" in lines[1]
    assert lines[2] == "left on the disk: []"
    assert lines[3] == "next step same gradients: True left: []"

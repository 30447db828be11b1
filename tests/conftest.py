"""Test-wide settings: one torch thread per test process, and the suite never writes into
the user's cache folder."""

from __future__ import annotations

import os

# `make test` runs two pytest workers on two cores. With torch's default of one OpenMP thread
# per core, each worker's threads spin-wait for cores the other worker holds: a ResNet step
# measured 38 s instead of 2 s. One thread per process (set before torch is first imported,
# and inherited by the processes tests start) keeps every core busy with useful work.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _private_cache_home(tmp_path_factory):
    """remat's machine caches (roofline, op profiles) go to a folder of this test session,
    measured once per session, instead of ``~/.cache/remat``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


@pytest.fixture(autouse=True)
def _private_plan_cache(tmp_path_factory, monkeypatch):
    """Each test starts with an empty on-disk plan cache of its own (``REMAT_CACHE_DIR``)."""
    monkeypatch.setenv("REMAT_CACHE_DIR", str(tmp_path_factory.mktemp("plans")))

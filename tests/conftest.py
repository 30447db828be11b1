"""Test-wide settings: one torch thread per test process, and the suite never writes into
the user's cache folder."""

from __future__ import annotations

import os

# `make test` runs two pytest workers on two cores. With torch's default of one OpenMP thread
# per core, each worker's threads spin-wait for cores the other worker holds: a ResNet step
# measured 38 s instead of 2 s. One thread per process (set before torch is first imported,
# and inherited by the processes tests start) keeps every core busy with useful work.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _collector_skips_older_modules_objects():
    """Each test module starts with the objects of the modules before it frozen (``gc.freeze``):
    the cycle collector no longer walks them, so a ``gc.collect()`` costs what this module allocated.

    A worker's heap only grows: every step Dynamo compiles stays reachable from the globals of the
    module it compiled (``__compiled_fn_*`` in ``remat.api``), graphs, plans and fake tensors with it
    (1.7 million objects after ``tests/models``). ``max_batch_size`` and ``measure_step`` collect
    garbage before every measurement, and at 0.8 s a collection there the largest-batch search took
    53 s in the suite and 11 s alone. Freezing changes no result: frozen objects stay alive as they
    were, the objects a test makes are collected as before, and a measurement is not disturbed by
    old garbage freed inside it. This module's leftovers are collected before they are frozen in turn."""
    gc.collect()
    gc.freeze()
    yield


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

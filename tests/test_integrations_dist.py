"""DDP and FSDP2 with remat: two gloo processes on 127.0.0.1 give single-process gradients.

Both ranks run every scenario of tests/integrations_dist.py in one launch (one spawn of two
processes, bounded by a timeout); each test checks one scenario. Data parallelism must give,
on every rank, the gradients and parameters of training in one process on the whole batch
(mean-reduced): compared with rtol 1e-5, atol 1e-6 (float32 sums in another order).
"""

from __future__ import annotations

import pytest
import torch

import remat
from tests import integrations_dist as dist_runs

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)

TIMEOUT_S = 240  # the whole launch; it takes ~20 s on a loaded 2-core machine


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    names = [n for n in dist_runs.SCENARIOS if dist_runs.fsdp2_available() or "fsdp" not in n]
    return dist_runs.launch(str(tmp_path_factory.mktemp("dist")), names, timeout=TIMEOUT_S)


def _assert_matches_single_process(runs, name, width=dist_runs.SMALL):
    ref = dist_runs.reference(width)
    for rank, results in enumerate(runs):
        got = results[name]
        assert "error" not in got, f"rank {rank}: {got.get('traceback')}"
        for kind in ("grads", "params"):
            assert got[kind].keys() == ref[kind].keys()
            for k in ref[kind]:
                torch.testing.assert_close(got[kind][k], ref[kind][k], rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"rank {rank}, {kind} of {k}: {m}")
    return [results[name]["plans"] for results in runs]


def _assert_recomputes(plans_per_rank, at_least=1):
    """Each rank made ``at_least`` plans, all within their budget, and some recompute."""
    for plans in plans_per_rank:
        assert len(plans) >= at_least
        assert any(p["recomputations"] > 0 for p in plans)
        assert all(p["budget"] is None or p["peak"] <= p["budget"] for p in plans)


def test_ddp_around_optimized_module(runs):
    plans = _assert_matches_single_process(runs, "ddp_of_optimized")
    _assert_recomputes(plans)
    assert all(len(p) == 1 for p in plans)  # one plan for the whole step, made once


def test_ddp_around_compiled_module(runs):
    _assert_recomputes(_assert_matches_single_process(runs, "ddp_of_compiled"))


def test_compiled_ddp_plans_each_bucket_piece(runs):
    plans = _assert_matches_single_process(runs, "compiled_ddp", width=dist_runs.LARGE)
    _assert_recomputes(plans, at_least=2)  # DDPOptimizer split the graph; each piece was planned


def _assert_error(runs, name, *phrases):
    for results in runs:
        got = results[name]
        assert got.get("error") == "UnsupportedWrappingError", got.get("traceback", got)
        for phrase in phrases:
            assert phrase in got["message"]
        assert issubclass(remat.UnsupportedWrappingError, remat.RematError)


def test_optimize_of_ddp_module_says_which_order_works(runs):
    _assert_error(runs, "optimize_of_ddp", "DistributedDataParallel", "DistributedDataParallel(remat.optimize(")


fsdp2 = pytest.mark.skipif(not dist_runs.fsdp2_available(), reason="torch.distributed.fsdp.fully_shard is not available")


@fsdp2
def test_fsdp2_around_optimized_module(runs):
    plans = _assert_matches_single_process(runs, "fsdp_of_optimized")
    _assert_recomputes(plans)
    assert all(len(p) == 1 for p in plans)  # sharding did not make Dynamo recapture the step


@fsdp2
def test_fsdp2_blocks_compiled_with_remat(runs):
    _assert_recomputes(_assert_matches_single_process(runs, "fsdp_blocks_compiled"))


@fsdp2
def test_optimize_of_sharded_model_is_a_clear_error(runs):
    _assert_error(runs, "optimize_of_fsdp", "sharded by FSDP", "fully_shard(remat.optimize(")


@fsdp2
def test_sharding_the_original_after_optimize_is_a_clear_error(runs):
    _assert_error(runs, "fsdp_of_original_after_optimize", "sharded by FSDP", "fully_shard(remat.optimize(")

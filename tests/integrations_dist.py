"""Two-process DDP / FSDP2 runs for tests/test_integrations_dist.py (gloo on CPU, loopback only).

:func:`launch` starts two processes (``spawn``) that join one gloo process group on
127.0.0.1 and run every scenario of :data:`SCENARIOS` in turn, each rank training on its half
of the batch. Each rank saves, per scenario, the last step's gradients and the final
parameters (full tensors, also for FSDP's shards), the plans remat made (recomputations,
peak, budget), or the error raised. :func:`reference` trains the same model in one process
on the whole batch, which is what data parallelism must reproduce.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import traceback

import torch
import torch.nn as nn

T0 = time.perf_counter()  # when this module was imported (in a rank: soon after it started)
WORLD = 2
BATCH = 64  # whole batch; each rank takes BATCH // WORLD rows
STEPS = 2
LR = 0.1
SMALL, LARGE = 32, 512  # LARGE: 1 MiB weights, so that DDP's 1 MiB buckets split the model


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.lin(x)) * 0.5 + x


class Net(nn.Module):
    """A small residual MLP (its own class, so that Dynamo compiles its forward)."""

    def __init__(self, width: int = SMALL, depth: int = 3):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(torch.tanh(h))


def make_model(width: int = SMALL) -> Net:
    torch.manual_seed(0)
    return Net(width)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 1, generator=g)


def loss_fn(out, y):
    return ((out - y) ** 2).mean()


def _full(t: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(t, "full_tensor", None)  # a DTensor shard -> the whole tensor
    return (full_tensor() if full_tensor is not None else t).detach().clone()


def train(run: nn.Module, model: nn.Module, x, y) -> dict:
    """STEPS SGD steps of ``run`` (which trains ``model``'s parameters); the final state."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss_fn(run(x), y).backward()
        grads = {k: _full(p.grad) for k, p in model.named_parameters()}
        opt.step()
    params = {k: _full(p) for k, p in model.named_parameters()}
    return {"grads": grads, "params": params}


def reference(width: int = SMALL) -> dict:
    """Single-process training on the whole batch."""
    model = make_model(width)
    x, y = batch()
    return train(model, model, x, y)


# ------------------------------------------------------------------ scenarios (run on each rank)
def _plans_recorder(plans: list):
    return lambda plan, capture: plans.append(_plan_record(plan))


def _plan_record(plan) -> dict:
    return {"recomputations": plan.recomputations, "peak": plan.peak_bytes, "budget": plan.budget_bytes}


_BUDGETS: dict = {}


def _between_budget(model, x) -> int:
    """A budget halfway between keeping nothing and keeping everything: the plan must recompute.
    (Computed once per rank: every scenario that uses it plans the same model and input shape.)"""
    import remat

    if "between" not in _BUDGETS:
        front = remat.pareto(model, x, solvers=["checkpoint_all"], budgets=[1.0])  # one capture
        _BUDGETS["between"] = (front.store_all_peak + front["checkpoint_all"][0].peak_bytes) // 2
    return _BUDGETS["between"]


def ddp_of_optimized(x, y):
    import remat

    model = make_model()
    planned = remat.optimize(model, x, budget=_between_budget(model, x))
    run = nn.parallel.DistributedDataParallel(planned)
    return {**train(run, model, x, y), "plans": [_plan_record(p) for p in planned._remat_plans]}


def ddp_of_compiled(x, y):
    model, plans = make_model(), []
    options = {"budget": _between_budget(model, x), "on_plan": _plans_recorder(plans)}
    run = nn.parallel.DistributedDataParallel(torch.compile(model, backend="remat", options=options))
    return {**train(run, model, x, y), "plans": plans}


def compiled_ddp(x, y):
    """torch.compile around DDP: DDPOptimizer cuts the graph at 1 MiB bucket boundaries and
    remat plans each piece (here: recompute everything within each piece)."""
    model, plans = make_model(LARGE), []
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    run = torch.compile(ddp, backend="remat", options={"solver": "checkpoint_all", "on_plan": _plans_recorder(plans)})
    return {**train(run, model, x, y), "plans": plans}


def fsdp_of_optimized(x, y):
    import remat
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    planned = remat.optimize(model, x, budget=_between_budget(model, x))
    fully_shard(planned)
    return {**train(planned, model, x, y), "plans": [_plan_record(p) for p in planned._remat_plans]}


def fsdp_blocks_compiled(x, y):
    """FSDP2's usual per-block sharding, then each block compiled with the remat backend."""
    from torch.distributed.fsdp import fully_shard

    model, plans = make_model(), []
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    for block in model.blocks:
        block.compile(backend="remat", options={"solver": "checkpoint_all", "on_plan": _plans_recorder(plans)})
    return {**train(model, model, x, y), "plans": plans}


def optimize_of_fsdp(x, y):
    import remat
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    fully_shard(model)
    remat.optimize(model, x, solver="checkpoint_all")
    return {}


def fsdp_of_original_after_optimize(x, y):
    import remat
    from torch.distributed.fsdp import fully_shard

    model = make_model()
    planned = remat.optimize(model, x, solver="checkpoint_all")
    fully_shard(model)  # the original, not the planned module: its hooks would sit inside the graph
    planned(x)
    return {}


def optimize_of_ddp(x, y):
    import remat

    remat.optimize(nn.parallel.DistributedDataParallel(make_model()), x)
    return {}


SCENARIOS = {
    "ddp_of_optimized": ddp_of_optimized,
    "ddp_of_compiled": ddp_of_compiled,
    "compiled_ddp": compiled_ddp,
    "fsdp_of_optimized": fsdp_of_optimized,
    "fsdp_blocks_compiled": fsdp_blocks_compiled,
    "optimize_of_fsdp": optimize_of_fsdp,
    "fsdp_of_original_after_optimize": fsdp_of_original_after_optimize,
    "optimize_of_ddp": optimize_of_ddp,
}


def fsdp2_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def _loopback_interface() -> str | None:
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, port: int, out_dir: str, names: list[str]) -> None:
    """One rank: join the group on 127.0.0.1, run the scenarios, save what each gave."""
    import torch.distributed as dist

    import remat  # noqa: F401  (imported here, so that the setup time below includes it)

    torch.set_num_threads(1)
    lo = _loopback_interface()
    if lo is not None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)  # gloo's own connections stay on loopback too
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    results = {"_setup_seconds": time.perf_counter() - T0}
    x, y = batch()
    xs, ys = x.chunk(WORLD)[rank], y.chunk(WORLD)[rank]
    for name in names:
        start = time.perf_counter()
        try:
            results[name] = SCENARIOS[name](xs, ys)
        except Exception as err:  # reported per scenario by the test
            results[name] = {"error": type(err).__name__, "message": str(err), "traceback": traceback.format_exc()}
        torch._dynamo.reset()
        dist.barrier()
        results[name]["seconds"] = time.perf_counter() - start
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def launch(out_dir: str, names: list[str], timeout: float) -> list[dict]:
    """Run ``names`` on two spawned ranks; each rank's results. Kills the ranks at ``timeout``."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, out_dir, names), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    start = time.monotonic()
    for p in procs:
        p.join(max(0.0, timeout - (time.monotonic() - start)))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
        p.join(5)
    if alive:
        raise TimeoutError(f"the {WORLD} ranks did not finish within {timeout:.0f} s")
    codes = [p.exitcode for p in procs]
    if any(codes):
        raise RuntimeError(f"a rank failed (exit codes {codes})")
    return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]

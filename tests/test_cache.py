"""Plans on disk (graph hash, versions, clear errors) and the on-disk plan cache (remat.solvers.cache)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import remat
from remat.solvers import cache
from remat.errors import InvalidPlanError
from remat.plan import PlanGraphMismatchError

SRC = str(Path(remat.__file__).resolve().parent.parent)
BUDGET = 0.85  # a fraction: feasible, and store_all does not fit it (checked for both fraction meanings)
SOLVER = "chen_sqrt"  # fast: these tests are about storing plans, not finding them


def make_model(width: int = 32) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(16, width), nn.Tanh()]
    for _ in range(4):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(width, 4))


def example(batch: int = 64) -> torch.Tensor:
    return torch.randn(batch, 16)


@pytest.fixture(scope="module")
def planned() -> remat.Plan:
    """One captured plan, shared: the tests that only read, write or damage files start from it."""
    return remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET, cache=False)


def cached(graph) -> remat.Plan:
    """Plan ``graph`` through the cache, as the backend does."""
    return cache.plan_with_cache(graph, BUDGET, SOLVER)


def entries() -> list[Path]:
    return sorted(cache.plan_cache_dir().glob("*.json"))


# ------------------------------------------------------------------ plans on disk


def test_plan_file_names_graph_and_versions_and_round_trips(tmp_path):
    plan = remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET)
    path = tmp_path / "plan.json"
    plan.save(path)
    data = json.loads(path.read_text())
    assert data["graph_hash"] == plan.graph.structural_hash
    assert data["remat_version"] == remat.__version__ and data["torch_version"] == torch.__version__
    for graph in (None, plan.graph):
        loaded = remat.Plan.load(path, graph=graph)
        assert loaded.instructions == plan.instructions and loaded.peak_bytes == plan.peak_bytes
        assert loaded.budget_bytes == plan.budget_bytes and loaded.solver == plan.solver
    assert remat.Plan.load(path, graph=plan.graph).graph is plan.graph


def test_loading_a_plan_for_another_graph_is_a_typed_error(tmp_path):
    plan = remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET)
    other = remat.plan(make_model(), example(batch=65), solver=SOLVER, budget=BUDGET)  # another input shape
    assert other.graph.structural_hash != plan.graph.structural_hash
    path = tmp_path / "plan.json"
    plan.save(path)
    with pytest.raises(PlanGraphMismatchError, match="another graph") as err:
        remat.Plan.load(path, graph=other.graph)
    assert isinstance(err.value, InvalidPlanError) and str(path) in str(err.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not json object", "missing field", "bad instruction",
                                    "missing file", "graph edited"])
def test_unreadable_plan_files_raise_invalid_plan_error(tmp_path, damage, planned):
    plan = planned
    path = tmp_path / "plan.json"
    plan.save(path)
    text = path.read_text()
    data = json.loads(text)
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff\xfe garbage")
    elif damage == "not json object":
        path.write_text("[1, 2, 3]")
    elif damage == "missing field":
        del data["instructions"]
        path.write_text(json.dumps(data))
    elif damage == "bad instruction":
        data["instructions"] = data["instructions"][1:]  # the first compute is gone
        path.write_text(json.dumps(data))
    elif damage == "missing file":
        path.unlink()
    elif damage == "graph edited":
        data["graph"]["values"][-1]["bytes"] += 4
        path.write_text(json.dumps(data))
    with pytest.raises(InvalidPlanError) as err:
        remat.Plan.load(path)
    assert str(path) in str(err.value)


def test_structural_hash_covers_shapes_dtypes_and_edges():
    from remat.graph import GraphBuilder

    def build(shape=(2,), dtype="f32", wire_second_to_input=False, op="relu"):
        b = GraphBuilder()
        x = b.input("x", 8, (2,), "f32")
        (h,) = b.op("a", [x], [8], op=op, output_meta=[(shape, dtype)])
        (k,) = b.op("b", [x if wire_second_to_input else h], [8], output_meta=[((2,), "f32")])
        return b.build(forward_outputs=[k])

    base = build().structural_hash
    assert build().structural_hash == base
    for variant in (build(shape=(1, 2)), build(dtype="f16"), build(wire_second_to_input=True), build(op="tanh")):
        assert variant.structural_hash != base


# ------------------------------------------------------------------ the plan cache


def test_second_optimize_hits_the_cache_and_runs_the_same_plan():
    first = remat.optimize(make_model(), example(), solver=SOLVER, budget=BUDGET)
    assert first.plan.info["cache"] == "miss" and len(entries()) == 1
    second = remat.optimize(make_model(), example(), solver=SOLVER, budget=BUDGET)
    assert second.plan.info["cache"] == "hit"
    assert second.plan.instructions == first.plan.instructions and second.plan.peak_bytes == first.plan.peak_bytes
    x = example()
    second(x).sum().backward()  # the cached plan runs
    assert all(p.grad is not None for p in second.parameters())
    assert len(entries()) == 1


def test_budget_solver_and_options_are_part_of_the_key():
    remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET)
    assert remat.plan(make_model(), example(), solver=SOLVER, budget=0.95).info["cache"] == "miss"
    assert remat.plan(make_model(), example(), budget=BUDGET, solver="checkpoint_all").info["cache"] == "miss"
    assert remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET, time_limit=5.0).info["cache"] == "miss"
    assert remat.plan(make_model(width=40), example(), solver=SOLVER, budget=BUDGET).info["cache"] == "miss"
    assert len(entries()) == 5
    # a size is keyed by its bytes: "N B" and N share the entry
    n = remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET).budget_bytes
    assert remat.plan(make_model(), example(), solver=SOLVER, budget=n).info["cache"] == "miss"
    assert remat.plan(make_model(), example(), solver=SOLVER, budget=f"{n}B").info["cache"] == "hit"


_SCRIPT = textwrap.dedent("""
    import sys, time, torch, torch.nn as nn
    sys.path.insert(0, {src!r})
    import remat
    torch.manual_seed(0)
    layers = [nn.Linear(16, 32), nn.Tanh()]
    for _ in range(4):
        layers += [nn.Linear(32, 32), nn.Tanh()]
    model = nn.Sequential(*layers, nn.Linear(32, 4))
    m = remat.optimize(model, torch.randn(64, 16), budget={budget!r}, solver={solver!r})
    print("RESULT", m.plan.info["cache"], m.plan.solver, len(m.plan.instructions))
""")


def test_a_second_process_skips_solving():
    first = remat.optimize(make_model(), example(), solver=SOLVER, budget=BUDGET).plan  # fills the cache (and the roofline)
    assert first.info["cache"] == "miss"
    script = _SCRIPT.format(src=SRC, budget=BUDGET, solver=SOLVER)
    # same environment as this process: the thread count is part of the cost model's machine key
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT"))
    assert line.split()[1:] == ["hit", first.solver, str(len(first.instructions))]


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "empty", "stale version", "other graph",
                                    "invalid plan", "over budget"])
def test_a_damaged_or_stale_entry_is_ignored_and_rebuilt(damage, planned):
    good = cached(planned.graph)
    assert good.info["cache"] == "miss"
    (path,) = entries()
    text = path.read_text()
    data = json.loads(text)
    if damage == "corrupt":
        path.write_text(text.replace('"', "'", 50))
    elif damage == "truncated":
        path.write_text(text[: len(text) // 3])
    elif damage == "empty":
        path.write_text("")
    elif damage == "stale version":
        data["key"]["remat"] = "0.0.1+000000000000"
        path.write_text(json.dumps(data))
    elif damage == "other graph":
        data["plan"]["graph_hash"] = "0" * 16
        path.write_text(json.dumps(data))
    elif damage == "invalid plan":
        data["plan"]["instructions"] = data["plan"]["instructions"][2:]
        path.write_text(json.dumps(data))
    elif damage == "over budget":  # a plan that would not fit what was asked
        data["plan"]["budget_bytes"] = 1
        path.write_text(json.dumps(data))
    again = cached(planned.graph)
    assert again.info["cache"] == "miss"  # solved, not trusted
    assert again.instructions == good.instructions
    assert json.loads(path.read_text()) != data or damage in ("corrupt", "truncated", "empty")
    assert cached(planned.graph).info["cache"] == "hit"  # rebuilt entry


def test_cache_off_writes_nothing_and_reads_nothing():
    plan = remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET, cache=False)
    assert plan.info["cache"] == "off" and entries() == []
    m = remat.optimize(make_model(), example(), solver=SOLVER, budget=BUDGET, cache=False)
    assert m.plan.info["cache"] == "off" and entries() == []
    compiled = torch.compile(make_model(), backend="remat", dynamic=False,  # earlier tests compiled other shapes
                             options={"budget": BUDGET, "solver": SOLVER, "cache": False})
    compiled(example()).sum().backward()
    assert entries() == []
    remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET)
    assert len(entries()) == 1
    assert remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET, cache=False).info["cache"] == "off"


def test_cache_dir_comes_from_the_environment(tmp_path, monkeypatch):
    target = tmp_path / "my plans"
    monkeypatch.setenv("REMAT_CACHE_DIR", str(target))
    remat.plan(make_model(), example(), solver=SOLVER, budget=BUDGET)
    assert len(list(target.glob("*.json"))) == 1
    monkeypatch.delenv("REMAT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.plan_cache_dir() == tmp_path / "xdg" / "remat" / "plans"


def test_concurrent_writers_never_leave_a_torn_file(planned):
    plan = cached(planned.graph)
    key = cache.cache_key(plan.graph, BUDGET, SOLVER)
    path = cache.entry_path(key)
    stop = threading.Event()
    seen: list[str] = []

    def writer():
        while not stop.is_set():
            cache.store(key, plan)

    def reader():
        while not stop.is_set():
            if path.exists():
                seen.append("ok" if cache.lookup(plan.graph, key) is not None else "bad")

    threads = [threading.Thread(target=writer) for _ in range(3)] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    threading.Event().wait(1.0)
    stop.set()
    for t in threads:
        t.join()
    assert seen and set(seen) == {"ok"}
    assert [p.name for p in cache.plan_cache_dir().iterdir()] == [path.name]  # no temporary files left


def test_an_entry_planned_for_more_than_the_request_is_a_miss(planned):
    """An entry under a valid key whose plan (and recorded budget) exceed the requested fraction's
    bytes on the live graph is not used: the request is re-resolved on the graph and checked."""
    good = cached(planned.graph)
    (path,) = entries()
    data = json.loads(path.read_text())
    store_all = remat.solvers.solve("store_all", planned.graph, None)
    assert store_all.peak_bytes > good.budget_bytes
    data["plan"] = {**store_all.to_dict(include_graph=False), "solver": SOLVER,  # the key's solver,
                    "budget_bytes": 2 * good.budget_bytes}  # a budget it fits, twice the request's
    path.write_text(json.dumps(data))
    again = cached(planned.graph)
    assert again.info["cache"] == "miss" and again.instructions == good.instructions
    assert again.peak_bytes <= good.budget_bytes

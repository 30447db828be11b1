"""The on-disk plan cache: a second process planning the same step reads the plan instead of solving.

    m = remat.optimize(model, x, budget=0.5)        # solves, then stores the plan
    m.plan.info["cache"]                            # "miss" (solved and stored), "hit" or "off"
    remat.optimize(model, x, budget=0.5, cache=False)   # neither reads nor writes the cache

Where
    ``$REMAT_CACHE_DIR`` when set, else ``plans/`` under remat's cache folder
    (:func:`remat.cost.machine.cache_dir`: ``$XDG_CACHE_HOME/remat`` or ``~/.cache/remat``).
    One JSON file per entry; deleting the folder is always safe.

Key
    Everything a plan depends on: the graph's :attr:`~remat.graph.Graph.planning_hash`
    (structure, per-op costs, so the cost model's numbers, and meta), the requested budget
    (sizes resolved to bytes; a fraction or ``"min"`` as written, which the graph then fixes),
    the solver, the cost model's name, the time limit and solver options, and the remat
    version *and a digest of remat's source files*, so that a changed planner never reuses old
    plans. The file name is the graph's structural hash and a hash of the key; the key itself is
    stored in the file and compared in full on reading.

Never trusted
    An entry is used only if it parses, its key equals the requested key, the plan re-simulates
    on the live graph (:class:`~remat.plan.Plan` runs the simulator; the structural hash must
    match) and its simulated peak is within its budget (and equal to the requested budget when
    that was given in bytes). Anything else -- a truncated or corrupt file, another version,
    another graph -- is ignored and overwritten by a freshly solved plan.

Writers
    Entries are written to a temporary file in the same folder, then ``os.replace``-d into
    place, so concurrent writers and readers never see half a file (the last writer wins; both
    wrote equally valid plans). A folder that cannot be written only costs a warning.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from ..budget import parse_budget_text
from ..cost import DEFAULT_COST_MODEL
from ..cost.machine import cache_dir, key_hash, read_json_entry, write_json_atomic
from ..errors import RematError
from ..graph import Graph
from ..version import __version__
from ..plan import Plan
from .planner import make_plan, resolve

__all__ = ["ENV_VAR", "plan_cache_dir", "cache_key", "lookup", "store", "plan_with_cache"]

ENV_VAR = "REMAT_CACHE_DIR"
ENTRY_FORMAT = 1


def plan_cache_dir() -> Path:
    """``$REMAT_CACHE_DIR`` if set, else ``<remat cache folder>/plans``."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else cache_dir() / "plans"


_FINGERPRINT: list[str] = []


def code_fingerprint() -> str:
    """remat's version and a digest of its source files (computed once per process, ~ms)."""
    if not _FINGERPRINT:
        root = Path(__file__).resolve().parent.parent  # the whole package, not this folder
        h = hashlib.sha256()
        for path in sorted(root.rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
        _FINGERPRINT.append(f"{__version__}+{h.hexdigest()[:12]}")
    return _FINGERPRINT[0]


def _budget_key(budget) -> Any:
    """Budgets as the budget parser reads them: sizes as bytes (``"1KiB"`` and ``1024`` share entries),
    fractions as fractions (``"0.5"`` and ``0.5``); ``"min"`` and what cannot be read as written."""
    if isinstance(budget, str):
        try:
            budget = parse_budget_text(budget)
        except RematError:
            return ["spec", budget.strip().lower()]
        if isinstance(budget, str):
            return ["spec", budget]  # "min"
    if isinstance(budget, float):
        return ["fraction", budget]
    return budget  # int or None (bools and the like: make_plan rejects them)


def cache_key(graph: Graph, budget, solver: str, *, cost_model: Any = DEFAULT_COST_MODEL, time_limit: float | None = None,
              solver_options: dict | None = None) -> dict | None:
    """The JSON key of a planning request, or ``None`` when it cannot be keyed (options that are not
    JSON data): such requests are neither read from nor written to the cache."""
    key = {
        "format": ENTRY_FORMAT,
        "graph": graph.planning_hash,
        "structure": graph.structural_hash,
        "budget": _budget_key(budget),
        "solver": solver,
        "cost_model": cost_model if isinstance(cost_model, str) else type(cost_model).__qualname__,
        "time_limit": time_limit,
        "solver_options": solver_options or {},
        "remat": code_fingerprint(),
        "torch": str(torch.__version__),
    }
    try:
        return json.loads(json.dumps(key, sort_keys=True))  # JSON's own view (tuples become lists)
    except (TypeError, ValueError):
        return None


def entry_path(key: dict) -> Path:
    return plan_cache_dir() / f"{key['structure']}-{key_hash(key)}.json"


def lookup(graph: Graph, key: dict) -> Plan | None:
    """The cached plan for ``key`` over ``graph``, or ``None`` (absent, unreadable, stale or invalid)."""
    path = entry_path(key)
    stored = read_json_entry(path, key, "plan")  # None: absent, damaged, or written for another key
    if stored is None:
        return None
    try:
        plan = Plan.from_dict(stored, graph, source=str(path))  # re-simulated on the live graph
    except (ValueError, KeyError, TypeError, RematError):
        return None
    if plan.budget_bytes != _requested_bytes(graph, key["budget"], plan):
        return None  # planned for another budget than this request's, whatever the key says
    if plan.budget_bytes is not None and plan.peak_bytes > plan.budget_bytes:
        return None
    if key["solver"] not in ("auto", plan.solver):
        return None
    return plan


def _requested_bytes(graph: Graph, budget_key, plan: Plan) -> int | None:
    """The request's budget in bytes on the live ``graph``: a size as is, a fraction resolved against
    the graph's own store-all peak (a simulation). ``"min"`` is taken from the plan: its bytes would
    need the very solve the cache saves, so a "min" entry is checked for fitting its own budget only."""
    if isinstance(budget_key, list) and budget_key[0] == "spec":
        return plan.budget_bytes
    return resolve(graph, budget_key[1] if isinstance(budget_key, list) else budget_key)


def store(key: dict, plan: Plan) -> None:
    """Write ``plan`` under ``key`` (atomically; a failure only warns)."""
    entry = {"key": key, "plan": plan.to_dict(include_graph=False), "stored_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    write_json_atomic(entry_path(key), entry, "a plan cache entry",
                      f"the plan will be solved again next time (set {ENV_VAR}, or pass cache=False)")


def plan_with_cache(graph: Graph, budget=None, solver: str = "auto", *, time_limit: float | None = None,
                    solver_options: dict | None = None, cost_model: Any = DEFAULT_COST_MODEL, cache: bool = True) -> Plan:
    """:func:`remat.solvers.planner.make_plan`, reading and filling the on-disk cache when ``cache``.

    Sets ``plan.info["cache"]``: ``"hit"`` (read, not solved; ``solve_seconds`` is then the time
    the lookup took), ``"miss"`` (solved and stored) or ``"off"``."""
    options = dict(solver_options or {})
    key = cache_key(graph, budget, solver, cost_model=cost_model, time_limit=time_limit,
                    solver_options=options) if cache else None
    if key is not None:
        start = time.perf_counter()
        plan = lookup(graph, key)
        if plan is not None:
            plan.solve_seconds = time.perf_counter() - start
            plan.info["cache"] = "hit"
            return plan
    plan = copy.copy(make_plan(graph, budget, solver, time_limit=time_limit, **options))
    plan.info = dict(plan.info)  # make_plan's in-process cache shares its Plan objects
    plan.info["cache"] = "off" if key is None else "miss"
    if key is not None:
        store(key, plan)
    return plan

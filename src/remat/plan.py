"""Plans: the schedule a solver returns, validated by the simulator when it is built.

A :class:`Plan` is an ordered list of instructions over a :class:`~remat.graph.Graph`,
split at ``boundary`` into the forward part and the backward part::

    compute(node)   run the node; its outputs become resident
    free(value)     drop a resident value (or the host copy of an offloaded one)
    offload(value)  copy a resident activation to the offload tier, then drop it from the device
    reload(value)   copy an offloaded value back to the device (computes reading it wait for it)

Whatever is resident at the boundary is what the forward saves for the backward.
Most solvers only choose *which nodes run when*; :meth:`Plan.from_schedule` then
frees every value right after its last use before its next recomputation, which is
exactly what the lowered FX code does (boxed calling convention), so the simulator
predicts what runs.

The simulator (:mod:`remat.simulate`) walks the instructions; its memory model is stated there.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .errors import InvalidPlanError, format_bytes
from .graph import ACTIVATION, BACKWARD, FORWARD, TANGENT, Graph
from .simulate import COMPUTE, FREE, OFFLOAD, RELOAD, Instruction, Simulation, simulate, transfer_costs
from .version import __version__

# kind -> draw(plan, path, **kwargs) for Plan.plot. Plotting depends on Plan, not the reverse:
# remat.tools.plots fills this when it is imported (remat's __init__ imports it).
PLOT_KINDS: dict[str, Callable] = {}


@dataclass
class Plan:
    """A validated schedule with its predicted peak and compute time.

    >>> plan = remat.plan(model, x, budget=0.5)
    >>> plan.peak_bytes <= plan.budget_bytes, plan.overhead
    """

    graph: Graph
    instructions: tuple[Instruction, ...]
    boundary: int
    budget_bytes: int | None = None
    solver: str = ""
    solve_seconds: float = 0.0
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        self.instructions = tuple(self.instructions)
        self.simulation = simulate(self.graph, self.instructions, self.boundary)

    # ------------------------------------------------------------ construction
    @classmethod
    def from_schedule(cls, graph: Graph, forward: Iterable[int], backward: Iterable[int], **kwargs) -> "Plan":
        """A plan that runs ``forward`` then ``backward`` (node ids, repeats allowed = recomputation)
        and frees each value instance right after its last use before its next recomputation
        (:func:`schedule_instructions`)."""
        instructions, boundary = schedule_instructions(graph, forward, backward)
        return cls(graph, instructions, boundary, **kwargs)

    def with_swaps(self, offload_after=None, reload_before=None, **kwargs) -> "Plan":
        """This plan with offload/reload instructions inserted, simulated anew.

        ``offload_after``: ``{value id: i}`` inserts ``offload(value)`` right after instruction ``i``
        of this plan; ``reload_before``: ``{value id: j}`` inserts ``reload(value)`` right before
        instruction ``j`` (``j == len(instructions)``: at the very end). Indices are this plan's, so
        they do not shift while inserting. A value may be swapped several times: give a list of
        indices (the k-th offload pairs with the k-th reload only by the order the simulator sees).
        Within one gap, offloads come before reloads; an offload after the last forward
        instruction stays in the forward, a reload before the first backward one in the backward.
        ``kwargs`` override budget_bytes/solver/solve_seconds/info (default: this plan's).
        Raises :class:`InvalidPlanError` if the result breaks the simulator's rules::

            plan = solve("store_all", graph, None)
            i = last forward use of v, j = first backward use of v (instruction indices)
            swapped = plan.with_swaps(offload_after={v: i}, reload_before={v: j})
            swapped.peak_bytes < plan.peak_bytes        # if v was resident at the old peak
            swapped.step_seconds >= swapped.compute_seconds   # stalls included

        :func:`insert_swaps` does the same on bare instruction lists, without simulating.
        """
        instructions, boundary = insert_swaps(self.instructions, self.boundary, offload_after, reload_before)
        fields = {"budget_bytes": self.budget_bytes, "solver": self.solver,
                  "solve_seconds": self.solve_seconds, "info": dict(self.info), **kwargs}
        return type(self)(self.graph, instructions, boundary, **fields)

    # ------------------------------------------------------------ results
    @property
    def peak_bytes(self) -> int:
        return self.simulation.peak_bytes

    @property
    def compute_seconds(self) -> float:
        return self.simulation.compute_seconds

    @property
    def overhead(self) -> float:
        """Extra predicted compute as a fraction of the store_all plan's (0.25 = 25% more)."""
        base = self.graph.store_all_seconds
        return self.compute_seconds / base - 1.0 if base > 0 else 0.0

    @property
    def step_seconds(self) -> float:
        """Predicted step time: compute plus the stalls of waiting for offload/reload copies
        (equal to :attr:`compute_seconds` for a plan without offloads)."""
        return self.simulation.step_seconds

    @property
    def step_overhead(self) -> float:
        """Extra predicted step time (compute + stalls) over the store_all plan's compute."""
        base = self.graph.store_all_seconds
        return self.step_seconds / base - 1.0 if base > 0 else 0.0

    @property
    def offload_peak_bytes(self) -> int:
        """The most bytes the offload tier (host memory or files) holds at once."""
        return self.simulation.offload_peak_bytes

    @property
    def offloaded_values(self) -> tuple[int, ...]:
        """Value ids the plan offloads at least once, in order of first offload."""
        return tuple(dict.fromkeys(ins.target for ins in self.instructions if ins.kind == OFFLOAD))

    @property
    def saved_values(self) -> tuple[int, ...]:
        return self.simulation.saved

    @property
    def saved_bytes(self) -> int:
        return sum(self.graph.values[v].bytes for v in self.simulation.saved)

    @property
    def forward_instructions(self) -> tuple[Instruction, ...]:
        return self.instructions[: self.boundary]

    @property
    def backward_instructions(self) -> tuple[Instruction, ...]:
        return self.instructions[self.boundary :]

    def schedule(self) -> tuple[list[int], list[int]]:
        """(forward, backward) node ids in the order the plan computes them (repeats: recomputations)."""
        computes = [(i, ins.target) for i, ins in enumerate(self.instructions) if ins.kind == COMPUTE]
        return [t for i, t in computes if i < self.boundary], [t for i, t in computes if i >= self.boundary]

    @property
    def recomputations(self) -> int:
        return self.simulation.computes - len(self.graph.nodes)

    def fits(self) -> bool:
        return self.budget_bytes is None or self.peak_bytes <= self.budget_bytes

    def summary(self) -> str:
        budget = "none" if self.budget_bytes is None else format_bytes(self.budget_bytes)
        lines = [
            f"Plan by {self.solver or '?'} for {self.graph.name!r} ({len(self.graph.nodes)} nodes)",
            f"  budget          {budget}",
            f"  predicted peak  {format_bytes(self.peak_bytes)}",
            f"  saved for bwd   {format_bytes(self.saved_bytes)} in {len(self.saved_values)} values",
            f"  compute         {self.compute_seconds * 1e3:.2f} ms predicted "
            f"(overhead {self.overhead * 100:+.1f}% over store_all, {self.recomputations} recomputations)",
            f"  solve time      {self.solve_seconds:.3f} s",
        ]
        if self.simulation.offloaded:
            sim = self.simulation
            lines.insert(-1, f"  offload         {sim.offloaded} copies out, tier peak {format_bytes(sim.offload_peak_bytes)}, "
                             f"step {sim.step_seconds * 1e3:.2f} ms predicted ({sim.stall_seconds * 1e3:.2f} ms stalled)")
        for key, val in self.info.items():
            lines.append(f"  {key:<15} {val}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        bucket = self.info.get("bucket")  # a plan of one size bucket of a dynamic capture: its edges
        return (
            f"Plan(solver={self.solver!r}, peak={format_bytes(self.peak_bytes)}, "
            f"overhead={self.overhead * 100:.1f}%, nodes={len(self.graph.nodes)}"
            + (f", sizes up to {bucket}" if bucket else "") + ")"
        )

    def plot(self, path=None, kind: str = "timeline", **kwargs):
        """The predicted memory timeline (``kind="timeline"``) or Checkmate's schedule matrix
        (``kind="schedule"``), written to ``path`` (.png or .svg) or returned as a Figure
        (drawn by :mod:`remat.tools.plots`, which registers these kinds in :data:`PLOT_KINDS`)."""
        if kind not in PLOT_KINDS:
            choices = " or ".join(repr(k) for k in PLOT_KINDS) or "none: import remat first"
            raise ValueError(f"unknown plot kind {kind!r}; choose {choices}")
        return PLOT_KINDS[kind](self, path, **kwargs)

    def for_graph(self, graph: Graph, source: str = "the plan") -> "Plan":
        """This plan over ``graph``, checked before it runs: ``graph`` must have the structural hash
        of the plan's own graph (else :class:`PlanGraphMismatchError`: another model, input shape
        or dtype), and the plan is simulated again over ``graph`` (its costs, its meta), so a plan
        read with :meth:`load` and no graph is checked at its first use. ``source`` names the plan
        in the error."""
        if graph is self.graph:
            return self
        if graph.structural_hash != self.graph.structural_hash:
            raise PlanGraphMismatchError(source, self.graph.structural_hash, graph)
        return type(self)(graph, self.instructions, self.boundary, self.budget_bytes, self.solver,
                          self.solve_seconds, dict(self.info))

    # ------------------------------------------------------------ persistence
    def to_dict(self, include_graph: bool = True) -> dict:
        """The plan as JSON-ready data. It names the graph's :attr:`~remat.graph.Graph.structural_hash`
        and the remat and torch versions that made it; ``include_graph=False`` leaves the graph out
        (then :meth:`from_dict` needs the graph)."""
        import torch

        d = {
            "format": PLAN_FORMAT,
            "graph_hash": self.graph.structural_hash,
            "remat_version": _remat_version(),
            "torch_version": str(torch.__version__),
            "instructions": [[ins.kind, ins.target] for ins in self.instructions],
            "boundary": self.boundary,
            "budget_bytes": self.budget_bytes,
            "solver": self.solver,
            "solve_seconds": self.solve_seconds,
            "info": json.loads(json.dumps(self.info, default=str)),  # whatever a solver put there, as text
        }
        if include_graph:
            d["graph"] = self.graph.to_dict()
        return d

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan (with its graph) as JSON; :meth:`load` reads it back."""
        with open(path, "w") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def load(cls, path: str | os.PathLike, graph: Graph | None = None) -> "Plan":
        """Read a plan written by :meth:`save`.

        With ``graph`` (e.g. ``remat.plan(...).graph`` of the model at hand), the plan is checked
        to be for that graph (same structural hash, else :class:`PlanGraphMismatchError`) and is
        returned over it; without, it runs over the graph the file holds, and is checked against
        the model's own graph where it is used (``remat.optimize(model, x, plan=...)``, :meth:`for_graph`). A file that cannot be read or is not a valid plan raises
        :class:`~remat.errors.InvalidPlanError` naming the path and the reason.
        """
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidPlanError(f"cannot read the plan file {path}: {getattr(e, 'strerror', None) or e}") from e
        try:
            data = json.loads(text)
        except ValueError as e:
            raise InvalidPlanError(
                f"{path} is not a remat plan file: invalid JSON ({e}); it may be truncated or corrupt. "
                "Save the plan again (Plan.save or `remat plan ... --save`)."
            ) from e
        return cls.from_dict(data, graph, source=str(path))

    @classmethod
    def from_dict(cls, d, graph: Graph | None = None, *, source: str = "plan data") -> "Plan":
        """The plan ``d`` (from :meth:`to_dict`) describes, validated by the simulator.

        ``graph``: run the plan over this graph (it must have the structural hash ``d`` names);
        needed when ``d`` holds no graph. ``source`` names ``d`` in error messages."""
        if not isinstance(d, dict) or d.get("format") not in _READABLE_FORMATS:
            found = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise InvalidPlanError(f"{source}: not a remat plan (format {found!r}; this remat reads {_READABLE_FORMATS})")
        try:
            graph = cls._graph_for(d, graph, source)
            instructions = tuple(Instruction(str(k), int(t)) for k, t in d["instructions"])
            boundary = int(d["boundary"])
            budget = d.get("budget_bytes")
            fields = (None if budget is None else int(budget), str(d.get("solver", "")),
                      float(d.get("solve_seconds", 0.0)), dict(d.get("info") or {}))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            what = f"missing field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
            raise InvalidPlanError(f"{source}: not a valid remat plan ({what}); it may be corrupt") from e
        try:
            return cls(graph, instructions, boundary, *fields)
        except InvalidPlanError as e:  # the simulator's verdict
            raise InvalidPlanError(f"{source}: the plan does not run on its graph: {e}") from e

    @staticmethod
    def _graph_for(d: dict, graph: Graph | None, source: str) -> Graph:
        """The graph a plan dict runs over: ``graph`` after checking it is the plan's, else its own."""
        stored_hash = d.get("graph_hash")
        if graph is None:
            if "graph" not in d:
                raise InvalidPlanError(f"{source}: the plan holds no graph; pass the graph it was made for")
            graph = Graph.from_dict(d["graph"])
            if stored_hash is not None and graph.structural_hash != stored_hash:
                raise InvalidPlanError(f"{source}: its graph does not match the hash it names ({stored_hash}); "
                                       "the file is corrupt")
            return graph
        if stored_hash is None and "graph" in d:  # format 1 names no hash: compare the graph it holds
            stored_hash = Graph.from_dict(d["graph"]).structural_hash
        if stored_hash != graph.structural_hash:
            raise PlanGraphMismatchError(source, stored_hash, graph)
        return graph


def schedule_instructions(graph: Graph, forward: Iterable[int], backward: Iterable[int]) -> tuple[tuple[Instruction, ...], int]:
    """(instructions, boundary) of :meth:`Plan.from_schedule`, not simulated: ``forward`` then
    ``backward`` as computes, each value instance freed right after its last use before its next
    recomputation, except the forward outputs' instances live at the boundary (the user holds
    them) and the last instance of each gradient the step returns.

    One walk from the end: a value read at a position whose later instance (if any) has been met
    but not this one's later reads is at its last use there; a value made and not read before its
    next computation is freed right after it is made. Tangents are made at the boundary."""
    forward = list(forward)
    sequence = forward + list(backward)
    n, boundary_pos = len(sequence), len(forward)
    outputs_of, freeable_inputs_of, forward_outputs, backward_outputs = _schedule_reads(graph)
    first_make: dict[int, int] = {}  # value -> first position that makes it (a read before that reads nothing)
    first_backward_make: dict[int, int] = {}  # value -> first position >= the boundary that makes it
    for pos, nid in enumerate(sequence):
        for v in outputs_of[nid]:
            if v not in first_make:
                first_make[v] = pos
            if pos >= boundary_pos and v not in first_backward_make:
                first_backward_make[v] = pos
    if boundary_pos < n:
        for t in graph.tangents:  # autograd hands them in at the boundary, before its first computation
            first_make.setdefault(t, boundary_pos - 1)

    frees_after: dict[int, list[int]] = {}
    read_later: set[int] = set()  # values whose instance (the one current at the walk's position) is read later
    made_later: set[int] = set()  # values made at a position after the walk's
    made_later_in_forward: set[int] = set()  # ... and before the boundary

    for pos in range(n - 1, -1, -1):
        nid = sequence[pos]
        in_forward = pos < boundary_pos
        freed: list[int] = []  # the values freed right after this position (unpinned last uses)
        for v in outputs_of[nid]:
            if v not in read_later:
                pinned = (v in backward_outputs and v not in made_later) or (
                    in_forward and v in forward_outputs and v not in made_later_in_forward)
                if not pinned:
                    freed.append(v)
            else:
                read_later.discard(v)
            made_later.add(v)
            if in_forward:
                made_later_in_forward.add(v)
        for v in freeable_inputs_of[nid]:
            if v in read_later or first_make.get(v, n) >= pos:
                continue
            read_later.add(v)
            if v in backward_outputs and v not in made_later:
                continue  # pinned: the step returns this instance
            if v in forward_outputs:
                live_at_boundary = (v not in made_later_in_forward if in_forward
                                    else first_backward_make.get(v, n) >= pos)
                if live_at_boundary:
                    continue  # pinned: the user holds it
            freed.append(v)
        if pos == boundary_pos:  # autograd hands the tangents in here
            for t in graph.tangents:
                if t not in read_later and not (t in backward_outputs and t not in made_later):
                    freed.append(t)
                read_later.discard(t)
        if freed:
            frees_after[pos] = freed

    compute, free = _interned_instructions(graph)
    instructions: list[Instruction] = []
    append, extend, free_of = instructions.append, instructions.extend, free.__getitem__
    boundary = 0
    for pos, nid in enumerate(sequence):
        if pos == boundary_pos:
            boundary = len(instructions)
        append(compute[nid])
        freed = frees_after.get(pos)
        if freed:
            freed.sort()
            extend(map(free_of, freed))
    if boundary_pos == n:
        boundary = len(instructions)
    return tuple(instructions), boundary


def _schedule_reads(graph: Graph) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], set[int], set[int]]:
    """What :func:`schedule_instructions` reads of ``graph``, made once per graph (the hybrid's greedy
    builds thousands of schedules of one graph): for every node the values it makes and the values
    it reads that a schedule frees (activations and tangents); the forward outputs that are
    activations; the backward outputs a schedule could free."""
    def make():
        freeable = (ACTIVATION, TANGENT)
        kinds = [v.kind for v in graph.values]
        return ([tuple(node.outputs) for node in graph.nodes],
                [tuple(v for v in node.inputs if kinds[v] in freeable) for node in graph.nodes],
                {v for v in graph.forward_outputs if kinds[v] == ACTIVATION},
                {v for v in graph.backward_outputs if kinds[v] in freeable})
    return graph.memo.cached(("schedule reads", len(graph.nodes), len(graph.values)), make)


def _interned_instructions(graph: Graph) -> tuple[list[Instruction], list[Instruction]]:
    """``compute(node)`` for every node and ``free(value)`` for every value of ``graph``, made once
    (instructions are immutable; a plan of 20,000 instructions spent a third of its building
    time making them)."""
    return graph.memo.cached(("interned instructions", len(graph.nodes), len(graph.values)), lambda: (
        [Instruction(COMPUTE, i) for i in range(len(graph.nodes))],
        [Instruction(FREE, v) for v in range(len(graph.values))],
    ))


def insert_swaps(instructions, boundary: int, offload_after=None, reload_before=None):
    """``(instructions, boundary)`` with ``offload(v)`` after instruction ``offload_after[v]`` and
    ``reload(v)`` before instruction ``reload_before[v]`` (a list of indices swaps v several
    times); see :meth:`Plan.with_swaps`. Nothing is validated here."""
    instructions = list(instructions)
    n = len(instructions)

    def by_index(mapping, lo, hi, what):
        out: dict[int, list[int]] = {}
        for v, idx in (mapping or {}).items():
            for k in ([idx] if isinstance(idx, int) else list(idx)):
                if not lo <= int(k) <= hi:
                    raise InvalidPlanError(f"{what} index {k} for value {v} is outside 0..{hi}")
                out.setdefault(int(k), []).append(int(v))
        return out

    offloads = by_index(offload_after, 0, n - 1, "offload_after")
    reloads = by_index(reload_before, 0, n, "reload_before")
    result: list[Instruction] = []
    new_boundary = None
    done = 0  # instructions copied so far
    # gap k lies between instruction k-1 and instruction k; only gaps with an insertion (or the
    # boundary) are visited, the instructions between them copied as slices
    for gap in sorted({k + 1 for k in offloads} | set(reloads) | ({boundary} if 0 <= boundary <= n else set())):
        result.extend(instructions[done:gap])
        done = gap
        result.extend(Instruction(OFFLOAD, v) for v in offloads.get(gap - 1, ()))
        if gap == boundary:
            new_boundary = len(result)
        result.extend(Instruction(RELOAD, v) for v in reloads.get(gap, ()))
    result.extend(instructions[done:])
    return tuple(result), new_boundary


PLAN_FORMAT = 2  # 2: graph_hash and versions; the graph optional
_READABLE_FORMATS = (1, 2)


def _remat_version() -> str:
    return __version__


class PlanGraphMismatchError(InvalidPlanError):
    """A saved plan was loaded for a graph other than the one it was made for."""

    def __init__(self, source: str, plan_hash: str | None, graph: Graph):
        self.plan_hash, self.graph_hash = plan_hash, graph.structural_hash
        super().__init__(
            f"{source} was made for another graph (structural hash {plan_hash}) than {graph.name!r} "
            f"({len(graph.nodes)} nodes, hash {graph.structural_hash}): a different model, input shape or dtype. "
            "Plan this model again (remat.plan / remat plan) instead of loading that file."
        )


__all__ = ["Plan", "PlanGraphMismatchError", "Instruction", "Simulation", "simulate", "insert_swaps", "schedule_instructions",
           "transfer_costs", "COMPUTE", "FREE", "OFFLOAD", "RELOAD", "FORWARD", "BACKWARD", "TANGENT"]

"""Plans and the simulator: the single judge of whether a plan fits.

A :class:`Plan` is an ordered list of instructions over a :class:`~remat.graph.Graph`,
split at ``boundary`` into the forward part and the backward part::

    compute(node)   run the node; its outputs become resident
    free(value)     drop a resident value

Whatever is resident at the boundary is what the forward saves for the backward.
Most solvers only choose *which nodes run when*; :meth:`Plan.from_schedule` then
frees every value right after its last use before its next recomputation, which is
exactly what the lowered FX code does (boxed calling convention), so the simulator
predicts what runs.

Memory model of :func:`simulate` (bytes counted against the budget):

* inputs (parameters, buffers, user inputs) are resident throughout and not counted;
* at ``compute(n)`` the peak candidate is ``resident + bytes(outputs of n) + workspace(n)``:
  an op's inputs and outputs are alive together;
* at the boundary autograd hands in the tangents; like activations, they go at their last use;
* forward outputs belong to the user from the boundary on: they stay counted until the end
  even after the plan stops using them; backward outputs (gradients) must be resident at the end;
* a node reading an input that the step mutates (``graph.meta['no_backward_recompute']``)
  cannot run in the backward, where that input already holds its new value;
* a random node that is computed more than once keeps a generator state
  (``graph.meta['rng_state_bytes']``) from its first run until its last replay.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterable

from .errors import InvalidPlanError, format_bytes
from .graph import ACTIVATION, BACKWARD, FORWARD, INPUT, TANGENT, Graph

COMPUTE = "compute"
FREE = "free"
OFFLOAD = "offload"
RELOAD = "reload"


@dataclass(frozen=True)
class Instruction:
    kind: str  # COMPUTE (target = node id) or FREE (target = value id)
    target: int

    def describe(self, graph: Graph) -> str:
        if self.kind == COMPUTE:
            return f"compute({graph.nodes[self.target].name})"
        return f"{self.kind}({graph.values[self.target].name})"


@dataclass(frozen=True)
class Simulation:
    """What :func:`simulate` predicts for a plan."""

    peak_bytes: int
    compute_seconds: float
    timeline: tuple[int, ...]  # counted bytes after each instruction
    peak_index: int  # the instruction at which the peak is reached
    saved: tuple[int, ...]  # activations resident at the boundary besides the forward outputs
    computes: int  # number of compute instructions
    forward_peak_bytes: int = 0  # the peak over the forward instructions
    backward_peak_bytes: int = 0  # the peak from the boundary on (tangents included)


def simulate(graph: Graph, instructions: Iterable[Instruction], boundary: int) -> Simulation:
    """Walk the plan once; return its peak and time, or raise :class:`InvalidPlanError`."""
    instructions = list(instructions)
    values, nodes = graph.values, graph.nodes
    if not 0 <= boundary <= len(instructions):
        raise InvalidPlanError(f"boundary {boundary} is outside the plan of {len(instructions)} instructions")

    rng_bytes = int(graph.meta.get("rng_state_bytes", 0))
    runs: dict[int, int] = {}
    for ins in instructions:
        if ins.kind == COMPUTE and nodes[ins.target].random:
            runs[ins.target] = runs.get(ins.target, 0) + 1
    runs_left = dict(runs)
    no_backward_recompute = set(graph.meta.get("no_backward_recompute", ()))

    resident: set[int] = set()
    pinned: set[int] = set()  # forward outputs held by the user
    current = 0  # counted bytes resident in the plan
    external = 0  # forward outputs the user holds that the plan no longer tracks
    peak, peak_index = 0, -1
    forward_peak = 0  # the peak over the instructions before the boundary
    backward_peak = 0
    seconds = 0.0
    computes = 0
    timeline: list[int] = []
    saved: tuple[int, ...] = ()

    def fail(i: int, why: str):
        raise InvalidPlanError(f"instruction {i} {instructions[i].describe(graph)}: {why}")

    def enter_backward():
        nonlocal current, saved
        for v in graph.forward_outputs:
            if values[v].kind == ACTIVATION and v not in resident:
                raise InvalidPlanError(
                    f"forward output {values[v].name} is not resident when the forward ends (instruction {boundary})"
                )
        outputs = set(graph.forward_outputs)
        saved = tuple(sorted(v for v in resident if values[v].kind == ACTIVATION and v not in outputs))
        pinned.update(v for v in graph.forward_outputs if values[v].kind == ACTIVATION)
        for t in graph.tangents:
            resident.add(t)
            current += values[t].bytes

    for i, ins in enumerate(instructions):
        if i == boundary:
            forward_peak = peak
            enter_backward()
            backward_peak = current + external
        in_backward = i >= boundary
        if ins.kind == COMPUTE:
            if not 0 <= ins.target < len(nodes):
                raise InvalidPlanError(f"instruction {i}: no node with id {ins.target}")
            node = nodes[ins.target]
            if node.phase == BACKWARD and not in_backward:
                fail(i, "a backward node cannot run before the forward ends")
            if in_backward and node.id in no_backward_recompute:
                fail(i, "it reads an input the forward mutates, so it cannot be recomputed in the backward")
            for v in node.inputs:
                kind = values[v].kind
                if kind == INPUT:
                    continue
                if v not in resident:
                    fail(i, f"input {values[v].name} is not resident")
            out_bytes = 0
            for v in node.outputs:
                if v in resident:
                    if v in pinned:  # the user keeps the old copy; the plan makes a new one
                        pinned.discard(v)
                        resident.discard(v)
                        current -= values[v].bytes
                        external += values[v].bytes
                    else:
                        fail(i, f"output {values[v].name} is already resident")
                out_bytes += values[v].bytes
            if node.random and runs[node.id] > 1 and runs_left[node.id] == runs[node.id]:
                current += rng_bytes  # generator state kept for the replays
            here = current + external + out_bytes + node.workspace
            if here > peak:
                peak, peak_index = here, i
            if in_backward:
                backward_peak = max(backward_peak, here)
            current += out_bytes
            resident.update(node.outputs)
            if node.random and runs[node.id] > 1:
                runs_left[node.id] -= 1
                if runs_left[node.id] == 0:
                    current -= rng_bytes
            seconds += node.cost
            computes += 1
        elif ins.kind == FREE:
            v = ins.target
            if not 0 <= v < len(values):
                raise InvalidPlanError(f"instruction {i}: no value with id {v}")
            if values[v].kind == INPUT:
                fail(i, "inputs are never freed")
            if values[v].kind == TANGENT and not in_backward:
                fail(i, "tangents exist only in the backward")
            if v not in resident:
                fail(i, "the value is not resident")
            if v in pinned:
                fail(i, "a forward output belongs to the user and cannot be freed")
            resident.discard(v)
            current -= values[v].bytes
        else:
            fail(i, f"unknown instruction kind {ins.kind!r} (offload/reload need the hybrid runtime)")
        if current + external > peak:
            peak, peak_index = current + external, i
        if in_backward:
            backward_peak = max(backward_peak, current + external)
        timeline.append(current + external)
    if boundary == len(instructions):
        forward_peak = peak
        enter_backward()
        backward_peak = current + external
        peak = max(peak, current + external)
    for v in graph.backward_outputs:
        if values[v].kind in (ACTIVATION, TANGENT) and v not in resident:
            raise InvalidPlanError(f"backward output {values[v].name} is not resident when the step ends")
    return Simulation(int(peak), seconds, tuple(timeline), peak_index, saved, computes, int(forward_peak), int(backward_peak))


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
        and frees each value instance right after its last use before its next recomputation."""
        forward, backward = list(forward), list(backward)
        sequence = forward + backward
        boundary_pos = len(forward)
        values, nodes = graph.values, graph.nodes
        forward_outputs = {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}
        backward_outputs = {v for v in graph.backward_outputs if values[v].kind in (ACTIVATION, TANGENT)}

        # instance = (value, position created); find each instance's last use
        current: dict[int, int] = {}
        last_use: dict[tuple[int, int], int] = {}
        last_instance: dict[int, tuple[int, int]] = {}
        live_at_boundary: set[tuple[int, int]] = set()
        for pos, nid in enumerate(sequence):
            if pos == boundary_pos:
                live_at_boundary = {(v, p) for v, p in current.items()}
                for t in graph.tangents:  # autograd hands them in; dropped after their last use
                    current[t] = pos
                    last_use[(t, pos)] = pos
            node = nodes[nid]
            for v in node.inputs:
                if values[v].kind in (ACTIVATION, TANGENT) and v in current:
                    last_use[(v, current[v])] = pos
            for v in node.outputs:
                current[v] = pos
                last_use[(v, pos)] = pos
                last_instance[v] = (v, pos)
        if boundary_pos == len(sequence):
            live_at_boundary = {(v, p) for v, p in current.items()}

        def pinned(inst: tuple[int, int]) -> bool:
            v, created = inst
            if v in forward_outputs and inst in live_at_boundary and created < boundary_pos:
                return True
            return v in backward_outputs and last_instance.get(v, inst) == inst

        frees_after: dict[int, list[int]] = {}
        for inst, pos in last_use.items():
            if not pinned(inst):
                frees_after.setdefault(pos, []).append(inst[0])

        instructions: list[Instruction] = []
        boundary = 0
        for pos, nid in enumerate(sequence):
            if pos == boundary_pos:
                boundary = len(instructions)
            instructions.append(Instruction(COMPUTE, nid))
            for v in sorted(frees_after.get(pos, ())):
                instructions.append(Instruction(FREE, v))
        if boundary_pos == len(sequence):
            boundary = len(instructions)
        return cls(graph, tuple(instructions), boundary, **kwargs)

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
        for key, val in self.info.items():
            lines.append(f"  {key:<15} {val}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"Plan(solver={self.solver!r}, peak={format_bytes(self.peak_bytes)}, "
            f"overhead={self.overhead * 100:.1f}%, nodes={len(self.graph.nodes)})"
        )

    # ------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        return {
            "format": 1,
            "graph": self.graph.to_dict(),
            "instructions": [[ins.kind, ins.target] for ins in self.instructions],
            "boundary": self.boundary,
            "budget_bytes": self.budget_bytes,
            "solver": self.solver,
            "solve_seconds": self.solve_seconds,
            "info": self.info,
        }

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        with open(path) as f:
            d = json.load(f)
        if d.get("format") != 1:
            raise InvalidPlanError(f"{path}: not a remat plan file (format {d.get('format')!r})")
        return cls(
            Graph.from_dict(d["graph"]),
            tuple(Instruction(k, t) for k, t in d["instructions"]),
            d["boundary"],
            d["budget_bytes"],
            d["solver"],
            d["solve_seconds"],
            d.get("info", {}),
        )


__all__ = ["Plan", "Instruction", "Simulation", "simulate", "COMPUTE", "FREE", "FORWARD", "BACKWARD", "TANGENT"]

"""Plans and the simulator: the single judge of whether a plan fits.

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

Memory model of :func:`simulate` (bytes counted against the budget):

* inputs (parameters, buffers, user inputs) are resident throughout and not counted;
* at ``compute(n)`` the peak candidate is ``resident + bytes(outputs of n) + workspace(n)``:
  an op's inputs and outputs are alive together;
* at the boundary autograd hands in the tangents; like activations, they go at their last use,
  unless they are backward outputs: a captured graph lists its tangents there, because autograd
  keeps the gradients it hands to a backward until that backward returns;
* forward outputs belong to the user from the boundary on: they stay counted until the end
  even after the plan stops using them; backward outputs (gradients) must be resident at the end;
* a node reading an input that the step mutates (``graph.meta['no_backward_recompute']``)
  cannot run in the backward, where that input already holds its new value;
* on a graph that says so (``graph.meta['inplace_reuse']``, ``[node, input, output]`` triples: the
  fused graph of :mod:`remat.fusion`, whose kernels Inductor writes), an output takes the storage
  of an input of the same size that the plan frees right after that node (the node is the input's
  last reader): that output adds no bytes, and the input's ``free`` releases none -- unless a
  reader of the input at another index (``meta['inplace_conflicts']``, a row reduction) runs in
  the same Inductor kernel, i.e. right before it with only generated kernels between
  (``meta['inductor_kernels']``), where Inductor refuses the in-place write;
* a random node that is computed more than once keeps a generator state
  (``graph.meta['rng_state_bytes']``) from its first run until its last replay;
* offloaded bytes leave the budget only when their copy has finished; the offload tier
  (pinned host memory, or files on the CPU) is tracked apart (``offload_peak_bytes``), and
  the step time includes the stalls of copies compute has to wait for (see :func:`simulate`).
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
    kind: str  # COMPUTE (target = node id), or FREE, OFFLOAD, RELOAD (target = value id)
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
    timeline: tuple[int, ...]  # counted device bytes after each instruction
    peak_index: int  # the instruction at which the peak is reached
    saved: tuple[int, ...]  # activations resident at the boundary besides the forward outputs
    computes: int  # number of compute instructions
    forward_peak_bytes: int = 0  # the peak over the forward instructions
    backward_peak_bytes: int = 0  # the peak from the boundary on (tangents included)
    offload_peak_bytes: int = 0  # the most bytes the offload tier holds at once
    stall_seconds: float = 0.0  # compute waiting for copies (reloads not done, synchronous copies)
    transfer_seconds: float = 0.0  # busy time of the transfer channel, both directions
    step_seconds: float = -1.0  # compute + stalls (defaults to compute_seconds)
    offloaded: int = 0  # number of offload instructions
    saved_offloaded: tuple[int, ...] = ()  # activations offloaded at the boundary (the backward reloads them)

    def __post_init__(self):
        if self.step_seconds < 0:
            object.__setattr__(self, "step_seconds", self.compute_seconds)


def transfer_costs(graph: Graph) -> dict:
    """``graph.meta["transfer"]``, checked: the bandwidths (bytes/s) of each direction, the fixed
    ``latency_s`` of one copy (default 0) and ``overlap`` (default True: copies run on a channel
    beside compute; False: each copy blocks compute until it finishes, as the CPU file store does).
    Raises :class:`InvalidPlanError` when the graph has none."""
    t = graph.meta.get("transfer")
    if not t or not t.get("d2h_bytes_per_s") or not t.get("h2d_bytes_per_s"):
        raise InvalidPlanError(
            f"the plan offloads values but graph {graph.name!r} has no transfer costs "
            "(graph.meta['transfer'] with d2h_bytes_per_s and h2d_bytes_per_s); capture it with remat's "
            "capture, which measures them (remat.cost.transfer), or set them by hand"
        )
    return {
        "d2h_bytes_per_s": float(t["d2h_bytes_per_s"]),
        "h2d_bytes_per_s": float(t["h2d_bytes_per_s"]),
        "latency_s": float(t.get("latency_s", 0.0)),
        "overlap": bool(t.get("overlap", True)),
    }


def simulate(graph: Graph, instructions: Iterable[Instruction], boundary: int) -> Simulation:
    """Walk the plan once; return its peak and time, or raise :class:`InvalidPlanError`.

    Two memory tiers and one transfer channel (only plans with offload/reload use them):

    * a compute clock advances by each node's cost, plus stalls;
    * ``offload(v)`` queues a device→host copy on the channel: it starts at
      max(issue time, channel free) and lasts ``latency_s + bytes / d2h_bytes_per_s``; v's device
      bytes are released when it finishes (pending releases are applied before each instruction,
      once the clock has passed their time); the offload tier holds v from the issue on;
    * ``reload(v)`` allocates v's device bytes at once and queues the host→device copy; a compute
      reading v waits (stall) until it finishes; the reload consumes the host copy (the tier drops
      v when the copy finishes);
    * ``free(v)`` of an offloaded value drops its host copy;
    * with ``overlap=False`` (CPU file store) every copy blocks compute: it is all stall;
    * the step ends when compute and the channel are both done (waiting for the channel is a stall).
    """
    instructions = list(instructions)
    values, nodes = graph.values, graph.nodes
    if not 0 <= boundary <= len(instructions):
        raise InvalidPlanError(f"boundary {boundary} is outside the plan of {len(instructions)} instructions")
    transfer = None
    if any(ins.kind in (OFFLOAD, RELOAD) for ins in instructions):
        transfer = transfer_costs(graph)

    rng_bytes = int(graph.meta.get("rng_state_bytes", 0))
    runs: dict[int, int] = {}
    for ins in instructions:
        if ins.kind == COMPUTE and 0 <= ins.target < len(nodes) and nodes[ins.target].random:
            runs[ins.target] = runs.get(ins.target, 0) + 1
    runs_left = dict(runs)
    no_backward_recompute = set(graph.meta.get("no_backward_recompute", ()))

    reuse_candidates: dict[int, list[tuple[int, int]]] = {}  # node -> (input, output) pairs
    for n, v_in, v_out in graph.meta.get("inplace_reuse", ()):
        reuse_candidates.setdefault(int(n), []).append((int(v_in), int(v_out)))
    conflicts = {(int(n), int(v)): {int(r) for r in readers}
                 for n, v, readers in graph.meta.get("inplace_conflicts", ())}
    generated = {int(n) for n in graph.meta.get("inductor_kernels", ())}

    def fused_with_a_conflicting_reader(i: int, node_id: int, v_in: int) -> bool:
        """Whether a reader of ``v_in`` at another index runs in the same Inductor kernel as compute
        ``i``: the computes right before ``i`` (frees are not kernels) are all generated kernels back
        to that reader, and on the same side of the boundary (fusion follows the plan's order,
        neighbours only: :class:`remat.inductor.PlanOrderChoices`)."""
        readers = conflicts.get((node_id, v_in))
        if not readers:
            return False
        for j in range(i - 1, -1, -1):
            earlier = instructions[j]
            if earlier.kind == FREE:
                continue
            if earlier.kind != COMPUTE or earlier.target not in generated or (j < boundary) != (i < boundary):
                return False
            if earlier.target in readers:
                return True
        return False

    freed_next: dict[int, set[int]] = {}  # compute index -> values freed before the next compute
    last_compute = None
    for i, ins in enumerate(instructions if reuse_candidates else ()):
        if ins.kind == COMPUTE:
            last_compute = i
        elif ins.kind == FREE and last_compute is not None:
            freed_next.setdefault(last_compute, set()).add(ins.target)
        else:
            last_compute = None

    resident: set[int] = set()
    absorbed: set[int] = set()  # resident values whose storage an output took: their free releases nothing
    pinned: set[int] = set()  # forward outputs held by the user
    offloaded: set[int] = set()  # values whose only copy is in the offload tier
    ready: dict[int, float] = {}  # reloaded value -> time its copy finishes
    pending: list[tuple[float, int, int]] = []  # (time, device bytes, tier bytes) released then
    current = 0  # counted bytes resident in the plan
    external = 0  # forward outputs the user holds that the plan no longer tracks
    tier = tier_peak = 0  # bytes in the offload tier
    peak, peak_index = 0, -1
    forward_peak = 0  # the peak over the instructions before the boundary
    backward_peak = 0
    seconds = 0.0  # compute only
    clock = 0.0  # compute + stalls
    stall = 0.0
    channel_free = 0.0
    transfer_busy = 0.0
    offload_count = 0
    computes = 0
    timeline: list[int] = []
    saved: tuple[int, ...] = ()
    saved_offloaded: tuple[int, ...] = ()

    def fail(i: int, why: str):
        raise InvalidPlanError(f"instruction {i} {instructions[i].describe(graph)}: {why}")

    def release_due():
        nonlocal current, tier, pending
        if pending:
            due = [p for p in pending if p[0] <= clock]
            if due:
                pending = [p for p in pending if p[0] > clock]
                current -= sum(p[1] for p in due)
                tier -= sum(p[2] for p in due)

    def wait_until(t: float):
        nonlocal clock, stall
        if t > clock:
            stall += t - clock
            clock = t

    def copy(nbytes: int, bytes_per_s: float) -> float:
        """Queue a copy on the channel; return its finish time."""
        nonlocal channel_free, transfer_busy
        duration = transfer["latency_s"] + nbytes / bytes_per_s
        start = max(clock, channel_free)
        channel_free = start + duration
        transfer_busy += duration
        if not transfer["overlap"]:
            wait_until(channel_free)
        return channel_free

    def enter_backward():
        nonlocal current, saved, saved_offloaded
        for v in graph.forward_outputs:
            if values[v].kind == ACTIVATION and v not in resident:
                where = "offloaded" if v in offloaded else "not resident"
                raise InvalidPlanError(
                    f"forward output {values[v].name} is {where} when the forward ends (instruction {boundary})"
                )
        outputs = set(graph.forward_outputs)
        saved = tuple(sorted(v for v in resident if values[v].kind == ACTIVATION and v not in outputs))
        saved_offloaded = tuple(sorted(offloaded))
        pinned.update(v for v in graph.forward_outputs if values[v].kind == ACTIVATION)
        for t in graph.tangents:
            resident.add(t)
            current += values[t].bytes

    for i, ins in enumerate(instructions):
        release_due()
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
                if v in offloaded:
                    fail(i, f"input {values[v].name} is offloaded; reload it first")
                if v not in resident:
                    fail(i, f"input {values[v].name} is not resident")
            waits = [ready.pop(v) for v in node.inputs if v in ready]
            if waits:  # a reload still copying: compute stalls until it lands
                wait_until(max(waits))
                release_due()
            out_bytes = 0
            for v in node.outputs:
                if v in offloaded:
                    fail(i, f"output {values[v].name} is offloaded; free its host copy or reload it instead")
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
            reused, taken = 0, set()
            for v_in, v_out in reuse_candidates.get(node.id, ()):  # outputs written into dying inputs
                if (v_out not in taken and v_in in freed_next.get(i, ()) and v_in in resident
                        and v_in not in absorbed and v_in not in pinned and values[v_in].kind == ACTIVATION
                        and not fused_with_a_conflicting_reader(i, node.id, v_in)):
                    taken.add(v_out)
                    absorbed.add(v_in)
                    reused += values[v_in].bytes
            out_bytes -= reused
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
            clock += node.cost
            computes += 1
        elif ins.kind in (FREE, OFFLOAD, RELOAD):
            v = ins.target
            if not 0 <= v < len(values):
                raise InvalidPlanError(f"instruction {i}: no value with id {v}")
            kind = values[v].kind
            if ins.kind == FREE:
                if kind == INPUT:
                    fail(i, "inputs are never freed")
                if kind == TANGENT and not in_backward:
                    fail(i, "tangents exist only in the backward")
                if v in offloaded:  # drop the host copy
                    offloaded.discard(v)
                    tier -= values[v].bytes
                elif v not in resident:
                    fail(i, "the value is not resident")
                else:
                    if v in pinned:
                        fail(i, "a forward output belongs to the user and cannot be freed")
                    resident.discard(v)
                    if v in absorbed:  # an output lives in its storage now
                        absorbed.discard(v)
                    elif v in ready:  # its reload still writes into it: the bytes go when it lands
                        pending.append((ready.pop(v), values[v].bytes, 0))
                    else:
                        current -= values[v].bytes
            elif ins.kind == OFFLOAD:
                if kind != ACTIVATION:
                    fail(i, f"only activations can be offloaded, not {'an' if kind == INPUT else 'a'} {kind}")
                if v in offloaded:
                    fail(i, "the value is already offloaded")
                if v not in resident:
                    fail(i, "the value is not resident")
                if v in pinned:
                    fail(i, "a forward output belongs to the user and cannot be offloaded")
                resident.discard(v)
                ready.pop(v, None)  # the channel is serial: this copy starts after the reload's
                offloaded.add(v)
                tier += values[v].bytes
                tier_peak = max(tier_peak, tier)
                done = copy(values[v].bytes, transfer["d2h_bytes_per_s"])
                pending.append((done, values[v].bytes, 0))
                offload_count += 1
            else:  # RELOAD
                if v not in offloaded:
                    fail(i, "the value is not offloaded" + (" (it is resident)" if v in resident else ""))
                offloaded.discard(v)
                resident.add(v)
                current += values[v].bytes
                done = copy(values[v].bytes, transfer["h2d_bytes_per_s"])
                ready[v] = done
                pending.append((done, 0, values[v].bytes))
        else:
            fail(i, f"unknown instruction kind {ins.kind!r}")
        release_due()  # copies that landed while this instruction ran (all of them when synchronous)
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
    if offloaded:
        names = ", ".join(values[v].name for v in sorted(offloaded))
        raise InvalidPlanError(
            f"the step ends with {names} still offloaded: free (drop the host copy) or reload each offloaded value"
        )
    for v in graph.backward_outputs:
        if values[v].kind in (ACTIVATION, TANGENT) and v not in resident:
            raise InvalidPlanError(f"backward output {values[v].name} is not resident when the step ends")
    if transfer is not None:
        wait_until(channel_free)  # the step ends when its last copy has landed
    return Simulation(
        int(peak), seconds, tuple(timeline), peak_index, saved, computes, int(forward_peak), int(backward_peak),
        offload_peak_bytes=int(tier_peak), stall_seconds=stall, transfer_seconds=transfer_busy,
        step_seconds=clock if transfer is not None else seconds, offloaded=offload_count,
        saved_offloaded=saved_offloaded,
    )


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
        return (
            f"Plan(solver={self.solver!r}, peak={format_bytes(self.peak_bytes)}, "
            f"overhead={self.overhead * 100:.1f}%, nodes={len(self.graph.nodes)})"
        )

    def plot(self, path=None, kind: str = "timeline", **kwargs):
        """The predicted memory timeline (``kind="timeline"``) or Checkmate's schedule matrix
        (``kind="schedule"``), written to ``path`` (.png or .svg) or returned as a Figure (:mod:`remat.viz`)."""
        from . import viz

        plots = {"timeline": viz.plot_timeline, "schedule": viz.plot_schedule}
        if kind not in plots:
            raise ValueError(f"unknown plot kind {kind!r}; choose 'timeline' or 'schedule'")
        return plots[kind](self, path, **kwargs)

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
        returned over it. A file that cannot be read or is not a valid plan raises
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
    for gap in range(n + 1):  # gap k lies between instruction k-1 and instruction k
        result.extend(Instruction(OFFLOAD, v) for v in offloads.get(gap - 1, ()))
        if gap == boundary:
            new_boundary = len(result)
        result.extend(Instruction(RELOAD, v) for v in reloads.get(gap, ()))
        if gap < n:
            result.append(instructions[gap])
    return tuple(result), new_boundary


PLAN_FORMAT = 2  # 2: graph_hash and versions; the graph optional
_READABLE_FORMATS = (1, 2)


def _remat_version() -> str:
    from . import __version__  # at call time: the package is initialized by then

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


__all__ = ["Plan", "PlanGraphMismatchError", "Instruction", "Simulation", "simulate", "insert_swaps",
           "transfer_costs", "COMPUTE", "FREE", "OFFLOAD", "RELOAD", "FORWARD", "BACKWARD", "TANGENT"]

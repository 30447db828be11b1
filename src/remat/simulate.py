"""The simulator: the single judge of whether a plan fits, and how long it takes.

    sim = simulate(graph, instructions, boundary)   # raises InvalidPlanError on an invalid plan
    sim.peak_bytes, sim.step_seconds, sim.timeline

Every plan runs through it when it is built (:class:`remat.plan.Plan`); no solver, lowering or
tool decides on its own whether a plan fits.

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
  fused graph of :mod:`remat.inductor.fusion`, whose kernels Inductor writes, or an eager graph's
  ``add``s, which remat's lowering writes in place, ``meta['inplace_eager']``, into a value
  computed on the same side of the boundary only), an output takes the storage
  of an input of the same size that the plan frees right after that node (the node is the input's
  last reader): that output adds no bytes, and the input's ``free`` releases none -- unless a
  reader of the input at another index (``meta['inplace_conflicts']``, a row reduction) runs in
  the same Inductor kernel, i.e. right before it with only generated kernels between
  (``meta['inductor_kernels']``), where Inductor refuses the in-place write;
* an optimizer step inside the backward (``graph.meta['optimizer_updates']``, ``[node, parameter]``
  pairs, :mod:`remat.execute.optimizer`) runs once, and no node reads its parameter after it;
* every backward node runs (a plan that left one out would skip its effect: an optimizer update,
  a gradient's part), and no value made in the backward is offloaded: it lives from its producer
  to its last reader, as the lower bounds below assume (:func:`dependency_lower_bound`);
* a random node that is computed more than once keeps a generator state
  (``graph.meta['rng_state_bytes']``) from its first run until its last replay, and each replay
  holds one more while it runs (the generator's current state, put back afterwards);
* offloaded bytes leave the budget only when their copy has finished; the offload tier
  (pinned host memory, or files on the CPU) is tracked apart (``offload_peak_bytes``), and
  the step time includes the stalls of copies compute has to wait for (see :func:`simulate`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from .errors import InvalidPlanError
from .graph import ACTIVATION, BACKWARD, INPUT, TANGENT, Graph

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
    reused: tuple[tuple[int, int, int], ...] = ()  # (instruction, input, output): the output took the input's storage
    highs: tuple[int, ...] = ()  # with record_highs: the most bytes counted during each instruction

    def __post_init__(self):
        if self.step_seconds < 0:
            object.__setattr__(self, "step_seconds", self.compute_seconds)


def has_transfer_costs(graph: Graph) -> bool:
    """Whether ``graph.meta["transfer"]`` gives both directions' bandwidths (a plan may offload)."""
    t = graph.meta.get("transfer") or {}
    return bool(t.get("d2h_bytes_per_s")) and bool(t.get("h2d_bytes_per_s"))


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
            "capture, which measures them (remat.execute.transfer), or set them by hand"
        )
    return {
        "d2h_bytes_per_s": float(t["d2h_bytes_per_s"]),
        "h2d_bytes_per_s": float(t["h2d_bytes_per_s"]),
        "latency_s": float(t.get("latency_s", 0.0)),
        "overlap": bool(t.get("overlap", True)),
    }


def fixed_bytes(graph: Graph) -> int:
    """The bytes no plan can change: every plan ends the step holding them.

    They are the backward outputs (the gradients the step produces) and the forward outputs
    the caller holds (kind ``activation``: a forward output that is a parameter or an input
    is outside the budget anyway). A value that is both is counted once."""
    values = graph.values
    held = {v for v in graph.backward_outputs if values[v].kind in (ACTIVATION, TANGENT)}
    held |= {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}
    return sum(values[v].bytes for v in held)


def peak_lower_bound(graph: Graph) -> int:
    """Bytes below which no plan of ``graph`` can peak, whatever it keeps, recomputes or offloads
    (memoised per graph): the largest of

    * each node's working set when it runs -- its inputs other than the step's own inputs (they
      must be resident), its outputs (less the bytes of every input Inductor may write one into)
      and its workspace; for a backward node also the forward outputs, which the
      user holds from the boundary on;
    * the gradients and outputs every plan ends the step holding (:func:`fixed_bytes`),
      all resident at the last computation.

    It bounds what :func:`simulate` counts at any computation of a node, so a budget below it is
    infeasible without running a solver."""
    return graph.memo.cached(("peak_lower_bound",), lambda: _peak_lower_bound(graph))


def _reuse_credit(graph: Graph) -> dict[int, int]:
    """``{node: the most bytes in-place writes can save it}``, as :func:`simulate` counts them."""
    credit: dict[int, int] = {}
    for n, v_in, _v_out in graph.meta.get("inplace_reuse", ()):
        credit[int(n)] = credit.get(int(n), 0) + graph.values[int(v_in)].bytes
    return credit


def _peak_lower_bound(graph: Graph) -> int:
    values = graph.values
    reusable = _reuse_credit(graph)
    pinned = {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}
    bound = 0
    for node in graph.nodes:
        held = set(graph.held_inputs[node.id])
        if node.phase == BACKWARD:
            held |= pinned - set(node.outputs)
        here = sum(values[v].bytes for v in held) + graph.output_bytes[node.id]
        here += node.workspace - reusable.get(node.id, 0)
        bound = max(bound, here)
    return max(bound, fixed_bytes(graph))


def fixed_order_lower_bound(graph: Graph) -> int:
    """Bytes below which no plan that runs each backward node once, in the graph's order, can peak,
    whatever forward values it keeps, recomputes or offloads (memoised per graph): the plan space of
    the Checkmate MILP and of CP-SAT, whose stages follow the graph's order. At least
    :func:`dependency_lower_bound`. (The chain planners run the backward in their own stage order and
    defer gradient-only ops, and may peak below it: only :func:`dependency_lower_bound` bounds them.)

    Such a plan recomputes and offloads forward values only, so every value made in the backward,
    every tangent and every gradient has a fixed lifetime: from its producer (a tangent: the
    boundary) to its last reader, or to the end for a backward output. At backward node ``j`` the
    bound counts, beside ``j``'s working set (inputs, outputs, workspace) and the forward outputs the
    user holds, each such value made before ``j`` and read at or after it: Checkmate's constant term
    of stage ``j``."""
    return graph.memo.cached(("fixed_order_lower_bound",), lambda: _fixed_order_lower_bound(graph))


def _fixed_life(graph: Graph) -> list:
    """The values no plan can free early or make again: tangents, and values made in the backward."""
    nodes = graph.nodes
    return [v for v in graph.values if v.kind == TANGENT or (
        v.kind == ACTIVATION and v.producer is not None and nodes[v.producer].phase == BACKWARD)]


def _backward_bound(graph: Graph, alive: list[int], held: set[int], fixed_life: set[int]) -> int:
    """The largest, over backward nodes ``j``, of ``alive[j]`` (the fixed-life values counted at ``j``)
    plus what ``held`` holds throughout and ``j``'s working set; at least :func:`peak_lower_bound`."""
    values, reusable = graph.values, _reuse_credit(graph)
    held_bytes = sum(values[v].bytes for v in held)
    bound = 0
    for node in graph.backward_nodes:
        others = {v for v in node.inputs if values[v].kind != INPUT and v not in fixed_life and v not in held}
        here = alive[node.id] + held_bytes + sum(values[v].bytes for v in others)
        here += sum(values[v].bytes for v in node.outputs) + node.workspace - reusable.get(node.id, 0)
        bound = max(bound, here)
    return max(bound, peak_lower_bound(graph))


def _fixed_order_lower_bound(graph: Graph) -> int:
    values, nodes, users = graph.values, graph.nodes, graph.users
    kept = set(graph.backward_outputs)
    # held through the whole backward: the forward outputs (the user's) and gradients made in the forward
    held = {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}
    held |= {v for v in kept if values[v].kind == ACTIVATION and values[v].producer is not None
             and nodes[values[v].producer].phase != BACKWARD}
    fixed_life = _fixed_life(graph)
    change = [0] * (len(nodes) + 2)  # bytes of fixed-life values alive at each node: prefix sums
    for v in fixed_life:
        first = -1 if v.kind == TANGENT else v.producer
        last = len(nodes) if v.id in kept else max(users[v.id], default=first)
        if last > first:  # alive at every node first < j <= last
            change[first + 1] += v.bytes
            change[last + 1] -= v.bytes
    alive, running = [], 0
    for j in range(len(nodes)):
        running += change[j]
        alive.append(running)
    return _backward_bound(graph, alive, held, {v.id for v in fixed_life})


def dependency_lower_bound(graph: Graph) -> int:
    """Bytes below which no plan that runs each backward node once, in *any* order its data allows,
    can peak, whatever forward values it keeps, recomputes, offloads or reorders (memoised per graph):
    every plan of every solver (the chain planners run a backward in their own stage order and defer
    gradient-only ops; :mod:`remat.solvers.reorder` reorders store-all's computes). At least
    :func:`peak_lower_bound`, at most :func:`fixed_order_lower_bound`. On the zoo's CNN with BatchNorm
    and VGG-11 it is within 0.4% of the smallest peak found (where :func:`peak_lower_bound` is 1.3% and
    6% below), on its MLP within 0.2% (an op of its own makes each weight's gradient; 16% below
    before :func:`_deferred_gradients` counted them).

    As there, every value made in the backward, every tangent and every gradient has a fixed life:
    from its producer to its last reader. At backward node ``j`` the bound counts such a value when
    every order must have made it before ``j`` (its producer is an ancestor of ``j``; a tangent
    arrives at the boundary) and still hold it at ``j`` (a gradient, held to the end; or a value with
    a reader among ``j`` and its descendants), beside ``j``'s working set and the forward outputs the
    user holds; and, for each gradient op an order may run before or after ``j``, the smaller of the
    gradient it makes and the values it reads (:func:`_deferred_gradients`). It rests on two rules
    :func:`simulate` enforces: no plan offloads a value made in the backward or leaves a backward node
    out (plans that did either could peak below it)."""
    return graph.memo.cached(("dependency_lower_bound",), lambda: _dependency_lower_bound(graph))


def _dependency_lower_bound(graph: Graph) -> int:
    values, nodes, users = graph.values, graph.nodes, graph.users
    before = [0] * len(nodes)  # bit a of before[j]: node a is an ancestor of j (graph order is topological)
    for node in nodes:
        mask = 0
        for v in node.inputs:
            p = values[v].producer
            if p is not None:
                mask |= before[p] | (1 << p)
        before[node.id] = mask
    after = [0] * len(nodes)  # bit d of after[j]: node d is a descendant of j
    for node in reversed(nodes):
        mask = 0
        for v in node.outputs:
            for u in users[v]:
                mask |= after[u] | (1 << u)
        after[node.id] = mask
    backward_mask = sum(1 << n.id for n in graph.backward_nodes)
    kept = set(graph.backward_outputs)
    alive = [0] * len(nodes)
    fixed_life = _fixed_life(graph)
    counted: dict[int, int] = {}  # value -> the nodes at which it is counted (a bit mask)
    for v in fixed_life:
        where = backward_mask if v.kind == TANGENT else after[v.producer]  # nodes that run after it is made
        if v.id not in kept:
            still_read = 0
            for r in users[v.id]:
                still_read |= before[r] | (1 << r)  # nodes that run before (or are) one of its readers
            where &= still_read
        where &= backward_mask
        counted[v.id] = where
        while where:
            low = where & -where
            alive[low.bit_length() - 1] += v.bytes
            where ^= low
    deferred = _deferred_gradients(graph, before, after, backward_mask, kept, counted)
    alive = [a + int(d) for a, d in zip(alive, deferred)]
    held = {v for v in graph.forward_outputs if values[v].kind == ACTIVATION}
    return _backward_bound(graph, alive, held, {v.id for v in fixed_life})


def _bits(mask: int, n: int) -> np.ndarray:
    """The bits of ``mask`` as a 0/1 array of ``n`` entries, bit ``i`` at index ``i``."""
    raw = np.frombuffer(mask.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(np.int64)


def _deferred_gradients(graph: Graph, before: list[int], after: list[int], backward_mask: int,
                        kept: set[int], counted: dict[int, int]) -> np.ndarray:
    """What :func:`dependency_lower_bound` adds at each node for the gradient-making nodes an order may
    run before or after it (the chain planners defer a weight gradient's op).

    Let ``w`` make gradients ``K_w`` (held to the end) and be neither an ancestor nor a descendant of
    node ``j``. If ``w`` runs before ``j``, ``K_w`` is alive at ``j``; if after, so is each of its
    fixed-life inputs made before ``j`` (an ancestor made it). Neither is counted at ``j`` yet. So ``j``
    holds at least ``min(|K_w|, |F_w(j)|)`` more, where ``F_w(j)`` are those inputs not already
    counted at ``j``, each input owned by one such ``w`` only (the reader with the most gradient
    bytes), so that no byte is counted twice. On an MLP this is each layer's weight gradient, or the
    layer's output gradient its op reads."""
    values, nodes, users = graph.values, graph.nodes, graph.users
    n = len(nodes)
    extra = np.zeros(n, dtype=np.int64)
    gradient_bytes = {}
    for node in graph.backward_nodes:
        made = sum(values[v].bytes for v in node.outputs if v in kept and values[v].kind != INPUT)
        if made:
            gradient_bytes[node.id] = made
    if not gradient_bytes:
        return extra
    owned: dict[int, list[int]] = {}
    for v, where in counted.items():
        readers = [r for r in users[v] if r in gradient_bytes]
        if readers and v not in kept:
            owned.setdefault(max(readers, key=lambda r: (gradient_bytes[r], -r)), []).append(v)
    for w, inputs in owned.items():
        pending = backward_mask & ~before[w] & ~after[w] & ~(1 << w)
        forced = np.zeros(n, dtype=np.int64)
        for v in inputs:
            made = backward_mask if values[v].kind == TANGENT else after[values[v].producer]
            mask = pending & made & ~counted[v]
            if mask:
                forced += values[v].bytes * _bits(mask, n)
        extra += np.minimum(forced, gradient_bytes[w])
    return extra


def simulate(graph: Graph, instructions: Iterable[Instruction], boundary: int, *,
             record_highs: bool = False) -> Simulation:
    """Walk the plan once; return its peak and time, or raise :class:`InvalidPlanError`.
    ``record_highs``: also return, per instruction, the most bytes counted while it runs
    (``Simulation.highs``; their maximum is the peak).

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
    n_nodes, n_values = len(nodes), len(values)
    if not 0 <= boundary <= len(instructions):
        raise InvalidPlanError(f"boundary {boundary} is outside the plan of {len(instructions)} instructions")
    kinds = [ins.kind for ins in instructions]
    targets = [ins.target for ins in instructions]
    transfer = None
    if OFFLOAD in kinds or RELOAD in kinds:
        transfer = transfer_costs(graph)

    rng_bytes = int(graph.meta.get("rng_state_bytes", 0))
    runs: dict[int, int] = {}
    random_nodes = {node.id for node in nodes if node.random}
    if random_nodes:
        for kind, target in zip(kinds, targets):
            if kind == COMPUTE and target in random_nodes:
                runs[target] = runs.get(target, 0) + 1
    runs_left = dict(runs)
    no_backward_recompute = set(graph.meta.get("no_backward_recompute", ()))
    updates = {int(n): int(v) for n, v in graph.meta.get("optimizer_updates", ())}  # node -> parameter it updates
    updated: set[int] = set()
    ran_backward: set[int] = set()  # backward nodes computed

    reuse_candidates: dict[int, list[tuple[int, int]]] = {}  # node -> (input, output) pairs
    for n, v_in, v_out in graph.meta.get("inplace_reuse", ()):
        reuse_candidates.setdefault(int(n), []).append((int(v_in), int(v_out)))
    conflicts = {(int(n), int(v)): {int(r) for r in readers}
                 for n, v, readers in graph.meta.get("inplace_conflicts", ())}
    generated = {int(n) for n in graph.meta.get("inductor_kernels", ())}
    # remat's eager lowering writes in place only into a value the same graph made: never into a
    # tensor the forward saved for the backward (autograd still holds it)
    same_phase_only = bool(graph.meta.get("inplace_eager"))
    made_at: dict[int, int] = {}  # value -> the instruction that last computed it
    reused_at: list[tuple[int, int, int]] = []

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
    for i, kind in enumerate(kinds if reuse_candidates else ()):
        if kind == COMPUTE:
            last_compute = i
        elif kind == FREE and last_compute is not None:
            freed_next.setdefault(last_compute, set()).add(targets[i])
        else:
            last_compute = None

    resident: set[int] = set()
    absorbed: set[int] = set()  # resident values whose storage an output took: their free releases nothing
    pinned: set[int] = set()  # forward outputs held by the user
    offloaded: set[int] = set()  # values whose only copy is in the offload tier
    ready: dict[int, float] = {}  # reloaded value -> time its copy finishes
    pending: list[tuple[float, int, int]] = []  # heap of (time, device bytes, tier bytes) released then
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
        nonlocal current, tier
        while pending and pending[0][0] <= clock:
            _, device_bytes, tier_bytes = heapq.heappop(pending)
            current -= device_bytes
            tier -= tier_bytes

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

    kind_of = [value.kind for value in values]  # (the loop below runs once per instruction: locals)
    bytes_of = [value.bytes for value in values]
    append_timeline = timeline.append
    highs: list[int] = []
    append_high = highs.append if record_highs else None
    held_inputs, output_bytes = graph.held_inputs, graph.output_bytes
    resident_issuperset, resident_isdisjoint = resident.issuperset, resident.isdisjoint
    in_backward = False
    for i, (kind, target) in enumerate(zip(kinds, targets)):
        if pending:
            release_due()
        if i == boundary:
            forward_peak = peak
            enter_backward()
            backward_peak = current + external
            in_backward = True
        if kind == COMPUTE:
            if not 0 <= target < n_nodes:
                raise InvalidPlanError(f"instruction {i}: no node with id {target}")
            node = nodes[target]
            if node.phase == BACKWARD:
                if not in_backward:
                    fail(i, "a backward node cannot run before the forward ends")
                ran_backward.add(node.id)
            if in_backward and node.id in no_backward_recompute:
                fail(i, "it reads an input the forward mutates, so it cannot be recomputed in the backward")
            if not resident_issuperset(held_inputs[target]) or (updated and not updated.isdisjoint(node.inputs)):
                for v in node.inputs:  # (the first one wrong, named)
                    if updated and v in updated:
                        fail(i, f"it reads {values[v].name}, which the optimizer has updated already in this backward")
                    if kind_of[v] == INPUT or v in resident:
                        continue
                    if v in offloaded:
                        fail(i, f"input {values[v].name} is offloaded; reload it first")
                    fail(i, f"input {values[v].name} is not resident")
            waits = [ready.pop(v) for v in node.inputs if v in ready] if ready else None
            if waits:  # a reload still copying: compute stalls until it lands
                wait_until(max(waits))
                release_due()
            if resident_isdisjoint(node.outputs) and (not offloaded or offloaded.isdisjoint(node.outputs)):
                out_bytes = output_bytes[target]
            else:
                out_bytes = 0
                for v in node.outputs:
                    if v in offloaded:
                        fail(i, f"output {values[v].name} is offloaded; free its host copy or reload it instead")
                    if v in resident:
                        if v in pinned:  # the user keeps the old copy; the plan makes a new one
                            pinned.discard(v)
                            resident.discard(v)
                            current -= bytes_of[v]
                            external += bytes_of[v]
                        else:
                            fail(i, f"output {values[v].name} is already resident")
                    out_bytes += bytes_of[v]
            aside = 0  # a replay holds the generator's current state aside while it runs
            if node.random and runs[node.id] > 1:
                if runs_left[node.id] == runs[node.id]:
                    current += rng_bytes  # generator state kept for the replays
                else:
                    aside = rng_bytes
            pairs = reuse_candidates.get(node.id) if reuse_candidates else None
            if pairs:  # outputs written into dying inputs
                taken = set()
                for v_in, v_out in pairs:
                    if (v_out not in taken and v_in in freed_next.get(i, ()) and v_in in resident
                            and v_in not in absorbed and v_in not in pinned and values[v_in].kind == ACTIVATION
                            and not (same_phase_only and (made_at.get(v_in, -1) >= boundary) != in_backward)
                            and not fused_with_a_conflicting_reader(i, node.id, v_in)):
                        reused_at.append((i, v_in, v_out))
                        taken.add(v_out)
                        absorbed.add(v_in)
                        out_bytes -= bytes_of[v_in]
            here = current + external + out_bytes + node.workspace + aside
            if here > peak:
                peak, peak_index = here, i
            if in_backward and here > backward_peak:
                backward_peak = here
            current += out_bytes
            resident.update(node.outputs)
            if same_phase_only:
                for v in node.outputs:
                    made_at[v] = i
            if node.random and runs[node.id] > 1:
                runs_left[node.id] -= 1
                if runs_left[node.id] == 0:
                    current -= rng_bytes
            if updates and node.id in updates:
                if updates[node.id] in updated:
                    fail(i, "it would update a parameter a second time (an optimizer step runs once)")
                updated.add(updates[node.id])
            seconds += node.cost
            clock += node.cost
            computes += 1
        elif kind == FREE or kind == OFFLOAD or kind == RELOAD:
            v = target
            if not 0 <= v < n_values:
                raise InvalidPlanError(f"instruction {i}: no value with id {v}")
            value_kind = kind_of[v]
            if kind == FREE:
                if value_kind == INPUT:
                    fail(i, "inputs are never freed")
                if value_kind == TANGENT and not in_backward:
                    fail(i, "tangents exist only in the backward")
                if v in offloaded:  # drop the host copy
                    offloaded.discard(v)
                    tier -= bytes_of[v]
                elif v not in resident:
                    fail(i, "the value is not resident")
                else:
                    if v in pinned:
                        fail(i, "a forward output belongs to the user and cannot be freed")
                    resident.discard(v)
                    if v in absorbed:  # an output lives in its storage now
                        absorbed.discard(v)
                    elif v in ready:  # its reload still writes into it: the bytes go when it lands
                        heapq.heappush(pending, (ready.pop(v), bytes_of[v], 0))
                    else:
                        current -= bytes_of[v]
            elif kind == OFFLOAD:
                if value_kind != ACTIVATION:
                    fail(i, f"only activations can be offloaded, not {'an' if value_kind == INPUT else 'a'} {value_kind}")
                if nodes[values[v].producer].phase == BACKWARD:
                    fail(i, "a value made in the backward cannot be offloaded: it lives from its producer to its last reader")
                if v in offloaded:
                    fail(i, "the value is already offloaded")
                if v not in resident:
                    fail(i, "the value is not resident")
                if v in pinned:
                    fail(i, "a forward output belongs to the user and cannot be offloaded")
                resident.discard(v)
                ready.pop(v, None)  # the channel is serial: this copy starts after the reload's
                offloaded.add(v)
                tier += bytes_of[v]
                tier_peak = max(tier_peak, tier)
                done = copy(bytes_of[v], transfer["d2h_bytes_per_s"])
                heapq.heappush(pending, (done, bytes_of[v], 0))
                offload_count += 1
            else:  # RELOAD
                if v not in offloaded:
                    fail(i, "the value is not offloaded" + (" (it is resident)" if v in resident else ""))
                offloaded.discard(v)
                resident.add(v)
                current += bytes_of[v]
                done = copy(bytes_of[v], transfer["h2d_bytes_per_s"])
                ready[v] = done
                heapq.heappush(pending, (done, 0, bytes_of[v]))
        else:
            fail(i, f"unknown instruction kind {kind!r}")
        if pending:  # copies that landed while this instruction ran (all of them when synchronous)
            release_due()
        counted = current + external
        if counted > peak:
            peak, peak_index = counted, i
        if in_backward and counted > backward_peak:
            backward_peak = counted
        append_timeline(counted)
        if append_high is not None:  # (a compute's working set is counted at ``here``)
            append_high(max(here, counted) if kind == COMPUTE else counted)
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
    if len(ran_backward) < len(graph.backward_nodes):
        missing = [n.name for n in graph.backward_nodes if n.id not in ran_backward]
        raise InvalidPlanError(f"backward node(s) {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
                               f"never run: every backward node must run")
    for v in graph.backward_outputs:
        if values[v].kind in (ACTIVATION, TANGENT) and v not in resident:
            raise InvalidPlanError(f"backward output {values[v].name} is not resident when the step ends")
    if transfer is not None:
        wait_until(channel_free)  # the step ends when its last copy has landed
    return Simulation(
        int(peak), seconds, tuple(timeline), peak_index, saved, computes, int(forward_peak), int(backward_peak),
        offload_peak_bytes=int(tier_peak), stall_seconds=stall, transfer_seconds=transfer_busy,
        step_seconds=clock if transfer is not None else seconds, offloaded=offload_count,
        saved_offloaded=saved_offloaded, reused=tuple(reused_at), highs=tuple(highs),
    )


__all__ = ["Instruction", "Simulation", "simulate", "peak_lower_bound", "fixed_order_lower_bound", "dependency_lower_bound", "fixed_bytes", "transfer_costs", "has_transfer_costs", "COMPUTE", "FREE", "OFFLOAD", "RELOAD"]

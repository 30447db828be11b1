"""Rotor: the optimal checkpointing schedule of a chain of stages, by dynamic programming.

The graph is cut into stages ``0..L-1`` (:mod:`remat.solvers.chain`). Each stage ``k`` can run
its forward in one of three ways (Beaumont et al., "Optimal checkpointing for heterogeneous
chains"):

* ``F_∅`` — without saving anything (its outputs feed the next stage, then go);
* ``F_ck`` — the same, keeping its input ``x_{k-1}`` so that the stage can be run again;
* ``F_all`` with option ``o`` — keeping what option ``o``'s backward needs (Rotor: everything;
  Rockmate, :mod:`remat.solvers.hierarchical`: a menu of schedules of the stage), then ``B_k``.

``T(i, l, m, keep)`` is the least time to reverse stages ``i..l`` — run their forwards and then
their backwards — within ``m`` bytes, starting with ``x_{i-1}`` and the gradients ``H_l`` resident
and ending with the gradient of ``x_{i-1}`` (``keep``: ``x_{i-1}`` must stay for the caller)::

    T(i, l, m, keep) = min(
        min_o  f_o + b_o + T(i+1, l, m - hold_o - s_o, need_out_o)          # F_all(o) on i, then B_i
               if m ≥ max(a_{i-1} + H_l + pf_o,  hold_o + H'_i + pb_o),
        min_j  Σ_{q=i}^{j-1} fn_q + T(j, l, m - a_{i-1}, 0) + T(i, j-1, m, keep)  # F_ck on i, F_∅ to j-1
               if m ≥ a_{i-1} + H_l + max_q ([q>i] a_{q-1} + pn_q) )

    T(l+1, l, …) = 0;   hold_o = a_{i-1} · [keep or o's backward reads x_{i-1}]

``f_o, b_o, s_o, pf_o, pb_o``: forward and backward time, bytes kept for the backward, forward
and backward peaks of option ``o``, measured by simulating it on the stage's own graph;
``fn_q, pn_q``: time and peak of ``F_∅`` on stage ``q``; ``H'_i`` the gradient-side bytes
alive during ``B_i`` that its own graph does not see. The top problem is ``T(0, L-1, budget -
constants, 0)``.

One extension to Rotor: a flag ``have`` says that ``x_l`` is still resident, kept as the
checkpoint of a split; a stage whose backward reads nothing of its forward but ``x_{l-1}`` and
``x_l`` (a ReLU, a linear layer) then runs ``B_l`` straight away instead of ``F_all`` again
(``T(l, l, m, keep, have=1) = b_l``). And the last stage of a recomputed segment owes ``x_l`` to
no one but its own backward: there each option runs its forward pruned to what its backward
reads (a residual block skips its final add; a stage whose backward reads only ``x_{l-1}`` runs
no forward at all). Without these Rotor misses the optimum even on plain chains (keep ``x_2``,
recompute ``x_1`` only). The split offers both: ``x_{j-1}`` dropped after
``T(j, l, ·)`` or kept for ``T(i, j-1, ·, have=1)``. The graph is decomposed with each backward
deal of :mod:`~remat.solvers.chain` and the cheaper plan is kept.

Memory is counted in *slots* (sizes rounded up), so the DP fills, for every ``(i, l, keep)``,
a vector over all budgets ``m ≤ S`` slots at once — ``O(S·L²·(L + K))`` for ``K`` options per
stage (less in practice: every candidate of ``T(i, l, ·)`` needs at least ``a_{i-1} + H_l`` slots,
so each cell computes only its columns from there on, and the candidates of both values of
``keep`` in one pass). The slot is a power of two near ``budget / SLOTS``: rounding adds at most one slot (0.1%
of the budget) per term of a peak, and a table serves every budget within a factor of two, so a
new budget usually costs no DP at all. The chosen schedule is expanded into the graph's ops and
checked by the simulator; since rounding and the model are conservative, the DP is also read at
budgets up to 20% higher (``PROBES_UP``; lower ones if even the first plan does not fit) and the
cheapest simulated plan that fits is kept. A schedule's compute time is known without simulating it
(the sum of its ops' costs), so the probes up are simulated cheapest first, and only while one could
still beat the best fitting plan found.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..errors import SolverError
from ..graph import FORWARD, Graph
from ..plan import Plan
from ..simulate import peak_lower_bound
from .registry import register
from .chain import DEALS, Block, Chain, decompose
from .schedule import prune_unread

SLOTS = 1000  # a budget is at least SLOTS/2 slots (rounding error ≤ 0.2% per term)
PROBES_UP = (1.01, 1.02, 1.04, 1.07, 1.1, 1.15, 1.2)
PROBES_DOWN = (0.99, 0.97, 0.94, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5)


@dataclass(frozen=True)
class Option:
    """One way to run a stage with ``F_all``: its forward and backward op sequences (chain ids)."""

    label: str
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    forward_seconds: float
    backward_seconds: float
    saved_bytes: int  # what the forward leaves for the backward, besides x_k
    forward_peak: int  # above what was resident before (x_{k-1} and constants not counted)
    backward_peak: int  # during B_k, tangents and the saved values included
    needs_input: bool  # the backward reads (or recomputes from) x_{k-1}
    needs_output: bool  # the backward reads x_k

    def dominates(self, other: "Option") -> bool:
        return (
            self.forward_seconds + self.backward_seconds <= other.forward_seconds + other.backward_seconds
            and self.saved_bytes <= other.saved_bytes
            and self.forward_peak <= other.forward_peak
            and self.backward_peak <= other.backward_peak
            and self.needs_input <= other.needs_input
            and self.needs_output <= other.needs_output
        )


def option_from_schedule(block: Block, forward_local, backward_local, label: str, *, tail: bool = False) -> Option:
    """Measure a schedule of the stage's graph (local node ids) with the simulator; ``tail``: as the
    last stage of a segment (x_k no longer owed to the next stage), its forward pruned to what the
    backward needs. Identical blocks (a transformer's layers) are measured once: the measurement,
    in local ids, is kept per block class (:func:`_per_class`) and only renumbered for the others."""
    local = _per_class(("option", tuple(forward_local), tuple(backward_local), label, tail), block,
                       lambda: _local_option(block, list(forward_local), list(backward_local), label, tail))
    return dataclasses.replace(local, forward=tuple(block.to_chain_ids(local.forward)),
                               backward=tuple(block.to_chain_ids(local.backward)))


def _local_option(block: Block, forward_local: list, backward_local: list, label: str, tail: bool) -> Option:
    g = block.tail_graph if tail else block.graph
    if tail:
        forward_local, backward_local = _prune_forward(g, forward_local, backward_local)
    sim = Plan.from_schedule(g, forward_local, backward_local).simulation
    reads = {v for i in backward_local for v in g.nodes[i].inputs}
    needs_output = bool(reads & block.output_values)
    out_bytes = 0 if tail else sum(g.values[v].bytes for v in block.output_values)
    return Option(
        label,
        tuple(forward_local),
        tuple(backward_local),
        sum(g.nodes[i].cost for i in forward_local),
        sum(g.nodes[i].cost for i in backward_local),
        sum(g.values[v].bytes for v in sim.saved),
        sim.forward_peak_bytes,
        # the chain counts the graph's forward outputs itself; x_k goes early when B_k does not read it
        sim.backward_peak_bytes - block.pinned_bytes - (0 if needs_output else out_bytes),
        bool(reads & block.input_values),
        needs_output,
    )


_CLASS_MEMO: dict = {}  # (what, block class) -> a measurement in local ids
_CLASS_MEMO_SIZE = 20_000


def _per_class(what: tuple, block: Block, measure):
    """``measure()``, once per ``what`` and class of identical blocks (:attr:`Block.key`, and the
    graph outputs the block makes, which the measurement subtracts)."""
    key = (what, block.key, block.pinned_bytes, tuple(block.tail_graph.forward_outputs))
    known = _CLASS_MEMO.get(key)
    if known is None:  # (block menus run in threads: a clear by another one between a set and a get is harmless)
        if len(_CLASS_MEMO) >= _CLASS_MEMO_SIZE:
            _CLASS_MEMO.clear()
        known = _CLASS_MEMO[key] = measure()
    return known


def _prune_forward(g: Graph, forward: list[int], backward: list[int]) -> tuple[list[int], list[int]]:
    """Drop computations whose outputs nothing later reads (nor the graph's outputs need)."""
    needed = set(g.backward_outputs)
    kept_backward = prune_unread(g, backward, needed)
    needed.update(g.forward_outputs)  # resident when the forward ends
    return prune_unread(g, forward, needed), kept_backward


def store_all_option(block: Block) -> Option:
    """Rotor's F_all: the stage's forward keeping everything, then its backward."""
    g = block.graph
    fwd = [n.id for n in g.nodes if n.phase == FORWARD]
    bwd = [n.id for n in g.nodes if n.phase != FORWARD]
    return option_from_schedule(block, fwd, bwd, "store all")


def pareto_options(options) -> list[Option]:
    """Drop options another one dominates (the first of equal ones stays)."""
    kept: list[Option] = []
    for o in sorted(options, key=lambda o: (o.forward_seconds + o.backward_seconds, o.saved_bytes)):
        if not any(k.dominates(o) for k in kept):
            kept.append(o)
    return kept


def no_save_forward(block: Block) -> tuple[float, int]:
    """(time, peak) of F_∅: the stage's forward keeping nothing but x_k, as the simulator counts it
    (the forward of a plan that recomputes the whole stage before its backward; replaying a random op
    holds its generator state). A stage that cannot be recomputed never runs F_∅: (time, 0)."""
    g = block.graph
    fwd = [n.id for n in g.nodes if n.phase == FORWARD]
    bwd = [n.id for n in g.nodes if n.phase != FORWARD]
    seconds = sum(g.nodes[i].cost for i in fwd)
    if g.meta.get("no_backward_recompute"):
        return seconds, 0
    return seconds, _per_class(("no save",), block,
                               lambda: Plan.from_schedule(g, fwd, fwd + bwd).simulation.forward_peak_bytes)


# ------------------------------------------------------------------------------ the DP
class ChainDP:
    """The DP of the module docstring over ``chain`` with ``menus[k]`` (options of stage k)."""

    def __init__(self, chain: Chain, menus: list[list[Option]]):
        self.chain = chain
        self.menus = menus
        L = chain.length
        blocks = [chain.block_graph(k) for k in range(L)]
        self.a_in = [sum(b.graph.values[v].bytes for v in b.input_values) for b in blocks]
        self.a_out = [sum(b.graph.values[v].bytes for v in b.output_values) for b in blocks]
        # a stage whose backward reads nothing of its forward but x_{k-1} and x_k can run B_k
        # straight from a checkpointed x_k, without running its forward again
        # each option again as the last stage of a segment, its forward pruned (see option_from_schedule)
        self.tails = [
            [option_from_schedule(b, [b.local_id[c] for c in o.forward], [b.local_id[c] for c in o.backward],
                                  o.label, tail=True) for o in menu]
            for b, menu in zip(blocks, menus)
        ]
        self.direct: list[Option | None] = []  # B_k without F_k: its backward reads no tape
        self.skip: list[Option | None] = []  # ... and reads x_k: worth keeping x_k for it
        for b in blocks:
            o = store_all_option(b)
            self.direct.append(o if o.saved_bytes == 0 else None)
            self.skip.append(o if o.saved_bytes == 0 and o.needs_output else None)
        self.held = chain.held_backward
        self.unseen = [h - c for h, c in zip(chain.held_backward, chain.consumed_backward)]
        no_save = [no_save_forward(b) for b in blocks]
        self.fn = [t for t, _ in no_save]
        self.pn = [p for _, p in no_save]
        self.recomputable = [s.recomputable for s in chain.stages]
        self.constant = chain.constant_bytes + chain.pinned_bytes
        self.tables: OrderedDict[int, tuple] = OrderedDict()
        self.dp_seconds = 0.0

    # ---- tables
    def slot_for(self, memory: int) -> int:
        """The slot size (a power of two) of the table serving ``memory`` bytes."""
        return max(1, 2 ** math.ceil(math.log2(max(memory, 1) / SLOTS)))

    def table(self, slot: int, columns: int | None = None):
        """The DP's tables for ``slot``, over at least ``columns`` budgets (None: every budget it serves).
        Column ``m`` depends on columns ``≤ m`` only, so a table is filled as far as first asked (a
        planner asks up to its largest probe: 40% less work on average) and again in full if later
        asked further."""
        full = int(SLOTS * max(PROBES_UP)) + 2
        columns = full if columns is None else min(full, columns)
        if slot in self.tables and len(self.tables[slot][0][(0, self.chain.length - 1, 0, 0)]) >= columns:
            self.tables.move_to_end(slot)
            return self.tables[slot]
        start = time.perf_counter()
        tbl = self._fill(slot, columns if slot not in self.tables else full)
        self.dp_seconds += time.perf_counter() - start
        self.tables[slot] = tbl
        while len(self.tables) > 4:
            self.tables.popitem(last=False)
        return tbl

    def _fill(self, slot: int, size: int):
        L = self.chain.length
        up = lambda b: int(math.ceil(b / slot))  # noqa: E731
        a_in = [up(x) for x in self.a_in]
        a_out = [up(x) for x in self.a_out]
        held = [up(x) for x in self.held]
        unseen = [up(x) for x in self.unseen]
        pn = [up(x) for x in self.pn]
        def stats(menu):
            return [(o.forward_seconds + o.backward_seconds, up(o.saved_bytes), up(o.forward_peak),
                     up(o.backward_peak), o.needs_input, o.needs_output) for o in menu]

        menus = [stats(menu) for menu in self.menus]
        tails = [stats(menu) for menu in self.tails]
        inf = np.float32(np.inf)
        # value[i, l, keep, have] over all budgets; a cell never filled (x_l kept for nothing) stays
        # infinite: never chosen. Dense, so that a split's candidates for every j are two slices.
        value = np.full((L, L, 2, 2, size), inf, dtype=np.float32)
        choice: dict[tuple, np.ndarray] = {}
        fn_prefix = np.concatenate([[0.0], np.cumsum(self.fn)])
        a_in_array, pn_array = np.asarray(a_in), np.asarray(pn)
        # the first stage from i on that cannot run again bounds the splits of segments starting at i
        stop = [L] * (L + 1)
        for q in range(L - 1, -1, -1):
            stop[q] = q if not self.recomputable[q] else stop[q + 1]

        for length in range(L):
            for i in range(L - length):
                l = i + length
                # checkpoint x_{j-1} for j = i+1..last: stages i..j-1 run F_∅ (all must be recomputable)
                last = min(l, stop[i])
                splits = last - i
                if splits:
                    js = np.arange(i + 1, last + 1)
                    q = js - 1
                    run_peak = np.maximum.accumulate(np.where(q > i, a_in_array[q], 0) + pn_array[q])
                    split_fwd = (fn_prefix[js] - fn_prefix[i]).astype(np.float32)
                    split_codes = -(2 * js[:, None] + np.arange(2)[None, :]).reshape(-1)
                for have in (0, 1):
                    if have and self.skip[l] is None:
                        continue  # x_l kept for nothing: left infinite
                    # every candidate needs at least ``base`` slots: the columns below stay infinite,
                    # and only the window [lo, size) is computed
                    base = a_in[i] + held[l] + (a_out[l] if have else 0)
                    lo = min(base, size)
                    width = size - lo
                    # (segments ending before the last stage are recomputations: the forward pass has
                    # run every stage once by then)
                    direct = self.direct[l] if i == l < L - 1 else None
                    if direct is not None and direct.needs_output and not have:
                        direct = None  # B_l reads x_l, which is gone
                    options = [] if (i == l and have) else tails[i] if i == l < L - 1 else menus[i]
                    # (a recomputed segment's last stage: its pruned forward, the tail)
                    first_option = int(direct is not None)
                    first_split = first_option + len(options)
                    rows = first_split + 2 * splits
                    if not rows:  # no candidate: the cell stays infinite
                        for keep in (0, 1):
                            choice[(i, l, keep, have)] = np.full(size, -(L + 1), dtype=np.int16)
                        continue
                    # cands[keep, row, m - lo]: the candidates of (i, l, keep, have) for both keeps, in
                    # the order a loop would offer them (the first of equal candidates wins): B_l straight
                    # away, each option, each split; reach[keep, row]: the columns out of the row's reach
                    cands = np.empty((2, rows, width), dtype=np.float32)
                    reach = np.zeros((2, rows), dtype=np.int64)
                    codes = np.empty(rows, dtype=np.int16)
                    if direct is not None:
                        # B_l straight away: it reads x_{l-1} (held) and x_l only if kept
                        cands[:, 0] = direct.backward_seconds
                        for keep in (0, 1):
                            hold = a_in[i] if (keep or direct.needs_input) else 0
                            reach[keep, 0] = max(base, hold + unseen[i] + up(direct.backward_peak))
                        codes[0] = len(menus[i])
                    for c, (t, s, pf, pb, need_in, need_out) in enumerate(options):
                        r = first_option + c
                        codes[r] = c
                        for keep in (0, 1):
                            hold = a_in[i] if (keep or need_in) else 0
                            reach[keep, r] = max(base + pf, hold + unseen[i] + pb)
                            if i == l:
                                cands[keep, r] = t
                                continue
                            # column m reads the rest's value at m - hold - s
                            start = min(max(lo, hold + s), size)
                            cands[keep, r, :start - lo] = inf
                            np.add(value[i + 1, l, int(need_out), have, start - hold - s: size - hold - s], t,
                                   out=cands[keep, r, start - lo:])
                    if splits:
                        # checkpoint x_{j-1}, every j (up) and kept (0 then 1): T(j, l, m - a_{i-1}, kept,
                        # have) after the forwards, then T(i, j-1, m, keep, kept)
                        rest = np.empty((splits, 2, width), dtype=np.float32)
                        start = min(max(lo, a_in[i]), size)
                        rest[:, :, :start - lo] = inf
                        np.add(value[i + 1:last + 1, l, :, have, start - a_in[i]: size - a_in[i]],
                               split_fwd[:, None, None], out=rest[:, :, start - lo:])
                        first = value[i, i:last, :, :, lo:].transpose(1, 0, 2, 3)  # [keep, j, kept, m]
                        np.add(rest[None], first, out=cands[:, first_split:].reshape(2, splits, 2, width))
                        reach[:, first_split:] = np.repeat(base + run_peak, 2)[None, :]
                        codes[first_split:] = split_codes
                    reach -= lo
                    for r in np.flatnonzero(reach.max(axis=0) > 0):
                        if reach[0, r] == reach[1, r]:
                            cands[:, r, :reach[0, r]] = inf
                        else:
                            cands[0, r, :reach[0, r]] = inf
                            cands[1, r, :reach[1, r]] = inf
                    best_row = np.argmin(cands, axis=1)
                    lowest = np.take_along_axis(cands, best_row[:, None, :], axis=1)[:, 0, :]
                    found = lowest < inf
                    value[i, l, :, have, lo:] = lowest
                    for keep in (0, 1):
                        pick = np.full(size, -(L + 1), dtype=np.int16)
                        pick[lo:][found[keep]] = codes[best_row[keep][found[keep]]]
                        choice[(i, l, keep, have)] = pick
        return {(0, L - 1, 0, 0): value[0, L - 1, 0, 0].copy()}, choice

    # ---- schedules
    def events(self, slot: int, m: int) -> list[tuple] | None:
        """The schedule of ``T(0, L-1, m slots, 0, 0)``: events ('F'|'B', stage, option), ('N', stage)."""
        value, choice = self.table(slot, m + 1)
        L = self.chain.length
        top = value[(0, L - 1, 0, 0)]
        if m < 0 or m >= len(top) or not np.isfinite(top[m]):
            return None
        up = lambda b: int(math.ceil(b / slot))  # noqa: E731
        out: list[tuple] = []
        stack: list[tuple] = [("solve", 0, L - 1, 0, 0, m)]
        while stack:
            task = stack.pop()
            if task[0] != "solve":
                out.append(task)
                continue
            _, i, l, keep, have, mm = task
            c = int(choice[(i, l, keep, have)][mm])
            if c == len(self.menus[i]):  # B_l without its forward
                out.append(("S", i))
            elif c >= 0:
                tail = i == l < L - 1
                o = (self.tails if tail else self.menus)[i][c]
                hold = up(self.a_in[i]) if (keep or o.needs_input) else 0
                later = [("B", i, c, tail)]
                if i < l:
                    later.append(("solve", i + 1, l, int(o.needs_output), have, mm - hold - up(o.saved_bytes)))
                later.append(("F", i, c, tail))
                stack.extend(later)  # popped in reverse: F, solve, B
            else:
                j, kept = divmod(-c, 2)
                later = [("solve", i, j - 1, keep, kept, mm), ("solve", j, l, kept, have, mm - up(self.a_in[i]))]
                later += [("N", q) for q in range(j - 1, i - 1, -1)]
                stack.extend(later)
        return out

    def plan_from_events(self, events: list[tuple], **plan_kwargs) -> Plan:
        return Plan.from_schedule(self.chain.graph, *self.schedule_from_events(events), **plan_kwargs)

    def compute_seconds_of(self, schedule: tuple[list[int], list[int]]) -> float:
        """The compute time of a (forward, backward) schedule (its ops' costs, summed in the simulator's
        order), without simulating it."""
        nodes = self.chain.graph.nodes
        total = 0.0
        for part in schedule:
            for n in part:
                total += nodes[n].cost
        return total

    def schedule_from_events(self, events: list[tuple]) -> tuple[list[int], list[int]]:
        """The events expanded into the graph's forward and backward op lists."""
        chain, L = self.chain, self.chain.length
        forward: list[int] = list(chain.constant_nodes)
        backward: list[int] = []
        target = forward
        ran: set[int] = set()  # stages whose forward ran: a later run is a recomputation

        def run(stage: int, ops) -> None:
            if stage in ran:
                ops = [n for n in ops if n not in chain.first_run_only]
            ran.add(stage)
            target.extend(ops)

        for ev in events:
            if ev[0] == "N":
                run(ev[1], chain.stages[ev[1]].forward)
            elif ev[0] == "F":
                run(ev[1], (self.tails if ev[3] else self.menus)[ev[1]][ev[2]].forward)
                if ev[1] == L - 1:
                    target = backward  # the loss stage's forward ends the forward pass
            elif ev[0] == "S":
                target.extend(self.direct[ev[1]].backward)
            else:
                target.extend((self.tails if ev[3] else self.menus)[ev[1]][ev[2]].backward)
        return forward, backward

    def smallest_slots(self, slot: int) -> int | None:
        value, _ = self.table(slot)
        finite = np.flatnonzero(np.isfinite(value[(0, self.chain.length - 1, 0, 0)]))
        return int(finite[0]) if len(finite) else None

    def solve(self, budget_bytes: int | None, solver: str) -> Plan:
        """The cheapest simulated plan within ``budget_bytes`` that the DP finds (see module docstring);
        the smallest-peak plan the DP knows when none fits."""
        from .baselines import store_all

        if budget_bytes is None:
            return store_all(self.chain.graph, None)
        memory = budget_bytes - self.constant
        plans: list[Plan] = []
        seen: set = set()

        def fresh_events(factor: float, slot: int) -> list[tuple] | None:
            """The DP's schedule at ``factor`` x the memory, unless none or one already probed."""
            evs = self.events(slot, int(math.floor(memory * factor / slot)))
            if evs is None or tuple(evs) in seen:
                return None
            seen.add(tuple(evs))
            return evs

        def probe(factor: float, slot: int) -> Plan | None:
            evs = fresh_events(factor, slot)
            if evs is None:
                return None
            plan = self.plan_from_events(evs, solver=solver)
            plans.append(plan)
            return plan

        if memory > 0:
            slot = self.slot_for(memory)
            self.table(slot, int(math.floor(memory * max(PROBES_UP) / slot)) + 1)  # as far as the probes read
            first = probe(1.0, slot)
            if first is not None and first.peak_bytes <= budget_bytes:
                # every probe up may fit (the simulated peak is not monotone in the DP's budget), but only
                # one cheaper than the best fitting plan so far can win: simulated cheapest first, while so
                schedules = [self.schedule_from_events(evs)
                             for evs in (fresh_events(f, slot) for f in PROBES_UP) if evs is not None]
                best_fit = first.compute_seconds
                for cost, schedule in sorted(((self.compute_seconds_of(sc), sc) for sc in schedules),
                                             key=lambda c: c[0]):
                    if cost > best_fit:
                        break  # every later candidate costs at least this much
                    plan = Plan.from_schedule(self.chain.graph, *schedule, solver=solver)
                    plans.append(plan)
                    if plan.peak_bytes <= budget_bytes:
                        best_fit = min(best_fit, plan.compute_seconds)
            else:
                for f in PROBES_DOWN:
                    p = probe(f, slot)
                    if p is not None and p.peak_bytes <= budget_bytes:
                        break
        fitting = [p for p in plans if p.peak_bytes <= budget_bytes]
        if fitting:
            best = min(fitting, key=lambda p: (p.compute_seconds, p.peak_bytes))
        else:
            best = self.smallest_plan(solver)
        best.info.update(stages=self.chain.length, dp_seconds=round(self.dp_seconds, 3), probes=len(plans))
        return best

    def smallest_plan(self, solver: str) -> Plan:
        """The plan of smallest peak the DP knows (the memory-minimal table, read at its first finite entry).

        The first table tried is the finest whose budgets reach both a quarter of the largest stage's
        needs added up and the bound no plan's peak goes below (:func:`~remat.simulate.peak_lower_bound`,
        less the bytes outside the chain): a table that ends below that bound has no finite entry, and
        each one filled in vain costs as much as the one that answers (two of three on ``cnn_bn``)."""
        total = max(self.held) + max(self.a_in) + max(self.pn) + max(
            (o.forward_peak for menu in self.menus for o in menu), default=0) + 1
        floor = peak_lower_bound(self.chain.graph) - self.constant
        slot = self.slot_for(max(total // 4, floor, 1))
        m = self.smallest_slots(slot)
        while m is None:  # the table is too small: coarser slots
            slot *= 2
            m = self.smallest_slots(slot)
        return self.plan_from_events(self.events(slot, m), solver=solver)


# ------------------------------------------------------------------------------ the solver
NOT_A_CHAIN = 0.5  # a block with more than this share of the forward ops (and > 8) means no chain


def chains_or_error(graph: Graph, solver: str) -> list[Chain]:
    """The graph's chains of stages, one per backward deal (duplicates dropped), or the error."""
    chains: list[Chain] = []
    for deal in DEALS:
        chain = chain_or_error(graph, solver, deal)
        if all(_layout(chain) != _layout(c) for c in chains):
            chains.append(chain)
    return chains


def _layout(chain: Chain) -> list:
    return [(s.forward, s.backward) for s in chain.stages]


def best_plan(planners: list[ChainDP], budget_bytes: int | None, solver: str) -> Plan:
    """The cheapest fitting plan over several chains of the same graph (else the smallest peak)."""
    plans = [dp.solve(budget_bytes, solver) for dp in planners]
    fitting = [p for p in plans if budget_bytes is None or p.peak_bytes <= budget_bytes]
    if fitting:
        return min(fitting, key=lambda p: (p.compute_seconds, p.peak_bytes))
    return min(plans, key=lambda p: (p.peak_bytes, p.compute_seconds))


def chain_or_error(graph: Graph, solver: str, deal: str = "newest") -> Chain:
    """The graph's chain of stages, or :class:`SolverError` when one block is most of the forward."""
    chain = graph.memo.cached(("chain", deal), lambda: decompose(graph, deal=deal))  # rotor's and hierarchical's
    sizes = [len(s.forward) for s in chain.stages]
    big = max(range(chain.length), key=lambda k: sizes[k])
    if chain.length < 2 or (sizes[big] > NOT_A_CHAIN * sum(sizes) and sizes[big] > 8):
        nodes = graph.nodes
        stage = chain.stages[big]
        raise SolverError(
            f"{solver} needs a chain of blocks, but the forward of {graph.name!r} is mostly one block: "
            f"{sizes[big]} of its {sum(sizes)} ops, from {nodes[stage.forward[0]].name} to "
            f"{nodes[stage.forward[-1]].name}, with no articulation point between (a connection such as a "
            "skip spans them); use solver='checkmate' or 'hierarchical'"
        )
    return chain


def rotor_planner(graph: Graph) -> list[ChainDP]:
    """One DP per backward deal of ``graph`` (cached)."""
    def make() -> list[ChainDP]:
        return [ChainDP(chain, [[store_all_option(chain.block_graph(k))] for k in range(chain.length)])
                for chain in chains_or_error(graph, "rotor")]

    return graph.memo.cached(("rotor",), make)


@register("rotor")
def rotor(graph: Graph, budget_bytes: int | None, *, time_limit=None, **options) -> Plan:
    """Rotor's optimal chain DP (see module docstring): each stage stores all, its input, or nothing."""
    if options:
        raise SolverError(f"rotor takes no options, got {sorted(options)}")
    return best_plan(rotor_planner(graph), budget_bytes, "rotor")


__all__ = ["rotor", "ChainDP", "Option", "option_from_schedule", "store_all_option", "pareto_options",
           "no_save_forward", "rotor_planner", "chain_or_error", "chains_or_error", "best_plan"]

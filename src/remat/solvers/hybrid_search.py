"""The ``hybrid`` solver's search: plans as states, the switches between them, and the greedy.

A *state* is a plan in the form the greedy changes: the (forward, backward) node-id schedules
(repeats in the backward are recomputations) and, for each swapped value, the schedule position
before which it is reloaded. :class:`GreedySearch` turns a state into a simulated plan (cached), offers
the switches that change one (swap, drop a recomputation, recompute, reload later, keep, unswap),
and runs the greedy descent and its kicks. The algorithm, and why each rule is there, is the
``hybrid`` solver's (:mod:`remat.solvers.hybrid`).
"""

from __future__ import annotations

import functools
import re
import time
from bisect import bisect_left
from dataclasses import dataclass

from ..errors import InvalidPlanError, SolverError
from ..graph import ACTIVATION, FORWARD, Graph
from ..plan import COMPUTE, Plan, insert_swaps, schedule_instructions
from ..simulate import transfer_costs
from .hybrid_instances import BackwardReads, ForwardUses, Instances, instances, instances_after_removal
from .hybrid_prune import pruned_removal, same_until
from .hybrid_swaps import SwapKeys, choose_over_budget, judge

CANDIDATES = 32  # switches simulated per round
PER_KIND = 4  # of which at most this many alike ones (the same switch in identical layers)
# (2 made GPT-2 small's smallest plan 3.8% slower, flops costs: the best layer for a switch was
# no longer among those tried; 4 gives that plan's step as before, and 8 kinds a round at least)
KICKS = 8  # kicks tried from each plan the kicks reach
KICK_GAIN = 1e-3  # a kick must be this fraction of the step faster than the plan it tries to beat
# (each costs a descent back under the budget, dozens of simulations; on a 64-layer Llama-style
# model with synchronous copies the kicks won 0.005% a step each, 100 s in all, far below what
# the cost model can tell apart)
_CHAIN = 4  # a recompute switch reruns at most this many producers back from the value
_EPS = 1e-12
_LAYER_NUMBER = re.compile(r"\d+")  # a module path's layer numbers: alike switches differ only there


def _occurrences(nodes: tuple[int, ...]) -> list[tuple[int, int]]:
    """(node, how many times it ran before) at each position of a schedule."""
    seen: dict[int, int] = {}
    out = []
    for nid in nodes:
        seen[nid] = seen.get(nid, -1) + 1
        out.append((nid, seen[nid]))
    return out


def _bounded(cache: dict, key, make, size: int):
    """``cache[key]``, made by ``make()`` the first time; the cache is emptied when it holds ``size``."""
    if key not in cache:
        if len(cache) > size:
            cache.clear()
        cache[key] = make()
    return cache[key]


@dataclass(frozen=True)
class State:
    forward: tuple[int, ...]
    backward: tuple[int, ...]
    reloads: tuple[tuple[int, int], ...]  # (value, position in forward+backward it is reloaded before), sorted

    @property
    def swapped(self) -> dict[int, int]:
        return dict(self.reloads)


@dataclass
class Evaluation:
    state: State
    plan: Plan
    budget: int

    @property
    def peak(self) -> int:
        return self.plan.peak_bytes

    @property
    def step(self) -> float:
        return self.plan.step_seconds

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    @functools.cached_property
    def _key(self) -> tuple:
        budget = self.budget
        excess = sum(t - budget for t in self.plan.simulation.timeline if t > budget)
        return (self.peak, excess, self.step)

    def key(self) -> tuple:
        """Order while over the budget: peak, then bytes over the budget summed over the timeline."""
        return self._key

    @functools.cached_property
    def backward_computes(self) -> list[int]:
        """The instruction index of each backward computation of the plan, in order."""
        instructions = self.plan.instructions
        return [i for i in range(self.plan.boundary, len(instructions)) if instructions[i].kind == COMPUTE]


class GreedySearch:
    """Builds and simulates states of one graph; caches the plans of schedules."""

    def __init__(self, graph: Graph, budget: int):
        self.graph, self.budget = graph, budget
        transfer = transfer_costs(graph)
        self.h2d, self.d2h = transfer["h2d_bytes_per_s"], transfer["d2h_bytes_per_s"]
        self.overlap, self.latency = transfer["overlap"], transfer["latency_s"]
        self.costs = [node.cost for node in graph.nodes]
        self.forward_outputs = set(graph.forward_outputs) | set(graph.backward_outputs)
        self._schedules: dict[tuple, tuple] = {}
        self._instances: dict[tuple, dict] = {}
        self._reads: dict[tuple, BackwardReads] = {}  # per backward: where values are read and made
        self._forward_uses: dict[tuple, ForwardUses] = {}
        self._built: dict[State, Evaluation | None] = {}
        self._alike_keys: dict[tuple[int, int], tuple] = {}  # (node, output index) -> alike key but the kind
        self.simulations = 0
        self.swap_keys = None if self.overlap else SwapKeys(self)  # swaps judged without simulating

    # ---------------------------------------------------------------- schedules
    def schedule(self, fwd, bwd) -> tuple[tuple, int, list[int]]:
        """(instructions, boundary, index of each compute) of the schedule, without swaps and not
        simulated (a state with swaps is simulated once, with them)."""
        def make():
            instructions, boundary = schedule_instructions(self.graph, fwd, bwd)
            return instructions, boundary, [i for i, ins in enumerate(instructions) if ins.kind == COMPUTE]

        return _bounded(self._schedules, (fwd, bwd), make, 64)

    def instances(self, fwd, bwd) -> Instances:
        """For each activation the forward saves for the backward: (position of its last forward
        use, or of its computation; position of its first backward use). Cached per schedule; a
        switch's schedule gets them from its parent's (:mod:`.hybrid_instances`)."""
        return _bounded(self._instances, (fwd, bwd), lambda: instances(
            self.graph, self.forward_uses(fwd), len(fwd), bwd, self.forward_outputs), 64)

    def forward_uses(self, fwd) -> ForwardUses:
        return _bounded(self._forward_uses, fwd, lambda: ForwardUses(self.graph, fwd), 4)

    def reads(self, fwd, bwd) -> BackwardReads:
        return _bounded(self._reads, (fwd, bwd), lambda: BackwardReads(self.graph, self.forward_uses(fwd), len(fwd), bwd),
                        8)

    def copy_seconds(self, v: int) -> float:
        """Time of one value's offload and reload at the measured bandwidths (a stall bound)."""
        nbytes = self.graph.values[v].bytes
        return nbytes / self.h2d + nbytes / self.d2h

    def step_floor(self, state: State) -> float:
        """A lower bound of ``state``'s step time without simulating it: its compute; plus, when
        copies are synchronous (each stalls compute for its whole length), its copies, and then
        it is the step time itself. A switch whose floor is not below the step time to beat is
        not simulated."""
        seconds = sum(map(self.costs.__getitem__, state.forward)) + sum(map(self.costs.__getitem__, state.backward))
        if not self.overlap:
            seconds += sum(2 * self.latency + self.copy_seconds(v) for v, _ in state.reloads)
        return seconds

    def cannot_beat(self, state: State, step: float) -> bool:
        """Whether ``state``'s step time cannot be below ``step - _EPS`` (:meth:`step_floor`)."""
        return self.step_floor(state) >= step - _EPS / 2

    def cannot_fit(self, ev: Evaluation, state: State) -> bool:
        """Whether ``state`` certainly peaks above the budget, judged from ``ev`` (a simulated state
        with the same forward and the same copies in it) without simulating it: the bytes resident
        when the forward ends are ``ev``'s, plus the values ``state`` keeps for the backward that
        ``ev`` freed in the forward, minus those ``ev`` kept and ``state`` frees there, and the
        random-number states of the random nodes whose replays in the backward come or go. A *keep*
        within the budget usually overshoots it there; this costs a walk of the schedule instead of
        a simulation.

        Where ``state``'s backward is ``ev``'s with computations removed (a keep, a drop), the same
        difference holds on into the backward, up to the first removed computation (or the first
        that makes a value whose holding changed): the instructions before it are ``ev``'s, but for
        frees that come earlier because a removed computation was a value's last reader: their bytes
        are subtracted (the bound stays below ``state``'s peak; :func:`~.hybrid_prune.same_until`).

        Only where both states swap the same values and reload the same ones in the forward: a
        swapped value's offload may still be copying when the forward ends (beside compute), one
        copy fewer on the serial channel lands the later ones sooner, and a value reloaded in the
        forward is resident again there."""
        boundary = ev.plan.boundary
        if state.forward != ev.state.forward or boundary == 0:
            return False
        nf = len(state.forward)
        swapped = ev.state.swapped
        if (swapped.keys() != state.swapped.keys()
                or {r for r in ev.state.reloads if r[1] < nf} != {r for r in state.reloads if r[1] < nf}):
            return False
        old_held = {v for v in self.instances(ev.state.forward, ev.state.backward) if v not in swapped}
        new_held = {v for v in self.instances(state.forward, state.backward) if v not in swapped}
        values = self.graph.values
        change = sum(values[v].bytes for v in new_held - old_held) - sum(values[v].bytes for v in old_held - new_held)
        rng_bytes = int(self.graph.meta.get("rng_state_bytes", 0))
        if rng_bytes:  # a random node run again in the backward holds its generator state from its first run
            replayed = [{nid for nid in s.backward if self.graph.nodes[nid].random} for s in (ev.state, state)]
            change += rng_bytes * (len(replayed[1] - replayed[0]) - len(replayed[0] - replayed[1]))
        timeline = ev.plan.simulation.timeline
        if timeline[boundary - 1] + change > self.budget:
            return True
        same = same_until(self.graph, ev.state, state, old_held ^ new_held, ev.backward_computes, boundary,
                          len(timeline))
        return same is not None and max(timeline[boundary - 1:same[0]]) + change - same[1] > self.budget

    def reload_position(self, seq, lo: int, first_use: int, nbytes: int) -> int:
        """The latest position whose compute up to ``first_use`` covers the reload copy (≥ lo);
        ``first_use`` itself when copies are synchronous (nothing covers them)."""
        if not self.overlap:
            return first_use
        need = nbytes / self.h2d
        r, covered = first_use, 0.0
        while r - 1 >= lo and covered < need:
            r -= 1
            covered += self.graph.nodes[seq[r]].cost
        return r

    # ---------------------------------------------------------------- building
    def build(self, state: State) -> Evaluation | None:
        """The state's plan, simulated; None when the simulator rejects it (cached)."""
        return _bounded(self._built, state, lambda: self._build(state), 4096)

    def _build(self, state: State) -> Evaluation | None:
        try:
            instructions, boundary, computes = self.schedule(state.forward, state.backward)
            if state.reloads:
                info = self.instances(state.forward, state.backward)
                n_ins = len(instructions)
                offload_after, reload_before = {}, {}
                for v, r in state.reloads:
                    if v not in info:
                        return None
                    last, first = info[v]
                    if not last < r <= first:
                        return None
                    offload_after[v] = (computes[last + 1] if last + 1 < len(computes) else n_ins) - 1
                    reload_before[v] = computes[r]
                instructions, boundary = insert_swaps(instructions, boundary, offload_after, reload_before)
            plan = Plan(self.graph, instructions, boundary)
            self.simulations += 1
        except InvalidPlanError:
            return None
        return Evaluation(state, plan, self.budget)

    # ---------------------------------------------------------------- switches
    def swap(self, state: State, v: int, info, peak_pos: int | None = None) -> State:
        """Swap ``v``; its reload after ``peak_pos`` (the peak's position, while over the budget)."""
        seq = state.forward + state.backward
        last, first = info[v]
        r = self.reload_position(seq, last + 1, first, self.graph.values[v].bytes)
        if peak_pos is not None and r <= peak_pos < first:
            r = peak_pos + 1
        return State(state.forward, state.backward, tuple(sorted(state.reloads + ((v, r),))))

    def drop(self, state: State, positions: list[int], swap: bool = True) -> State | None:
        """``state`` without the backward computations at ``positions`` and the recomputations that
        only fed them; the values they recomputed are swapped instead (``swap``) or kept in memory."""
        nf, fwd = len(state.forward), state.forward
        reads = self.reads(fwd, state.backward)
        removed = pruned_removal(self.graph, nf, state.backward, positions, reads, self.forward_outputs)
        cut = sorted(removed)
        bounds = [nf - 1] + cut + [nf + len(state.backward)]
        new_bwd = tuple(nid for a, b in zip(bounds, bounds[1:]) for nid in state.backward[a - nf + 1:b - nf])
        old_info = self.instances(fwd, state.backward)
        # the new schedule's instances, carried over from this one's, for self.instances to find
        _bounded(self._instances, (fwd, new_bwd), lambda: instances_after_removal(
            self.graph, self.forward_uses(fwd), nf, state.backward, old_info, reads, removed, self.forward_outputs,
            new_bwd), 64)

        def shift(r: int) -> int:
            return r - bisect_left(cut, r)

        reloads = {v: shift(r) for v, r in state.reloads}
        if not swap:
            return State(state.forward, new_bwd, tuple(sorted(reloads.items())))
        info = self.instances(state.forward, new_bwd)
        old_seq, seq, nodes = state.forward + state.backward, state.forward + new_bwd, self.graph.nodes
        for pos in cut:
            for v in nodes[old_seq[pos]].outputs:
                if v in info and v not in reloads:
                    last, first = info[v]
                    reloads[v] = self.reload_position(seq, last + 1, first, self.graph.values[v].bytes)
        return State(state.forward, new_bwd, tuple(sorted(reloads.items())))

    def recompute(self, state: State, v: int) -> State | None:
        """``state`` with the saved (or swapped) value ``v`` recomputed right before its first
        backward use instead: its producer runs again there, after the producers of those of its
        inputs that would otherwise have to be kept from the forward for it (a chain back to values
        the backward holds anyway: saved, swapped, recomputed already, or not activations)."""
        nodes, values = self.graph.nodes, self.graph.values
        nf = len(state.forward)
        seq = state.forward + state.backward
        info = self.instances(state.forward, state.backward)
        if v not in info:
            return None
        p = info[v][1]
        latest: dict[int, int] = {}  # value -> position of its newest instance before p
        for pos in range(p):
            for o in nodes[seq[pos]].outputs:
                latest[o] = pos
        chosen: list[int] = []  # node ids to run before p, in topological order
        made: set[int] = set()

        def add(nid: int, depth: int) -> bool:
            node = nodes[nid]
            if node.phase != FORWARD:
                return False
            made.update(node.outputs)
            for u in node.inputs:
                if (values[u].kind != ACTIVATION or u in self.forward_outputs or u in made or u in info
                        or latest.get(u, -1) >= nf or depth >= _CHAIN):
                    continue  # held anyway (or the chain is long enough: kept from the forward)
                if not add(values[u].producer, depth + 1):
                    return False
            chosen.append(nid)
            return True

        if values[v].producer is None or not add(values[v].producer, 0):
            return None
        k = len(chosen)
        bwd = state.backward[: p - nf] + tuple(chosen) + state.backward[p - nf:]
        new_info = self.instances(state.forward, bwd)
        new_seq = state.forward + bwd
        reloads = {}
        for w, r in state.reloads:
            if w == v or w not in new_info:
                continue
            r = r + k if r >= p else r
            last, first = new_info[w]
            if r > first:  # an inserted node reads it now: reload it in time for that
                r = self.reload_position(new_seq, last + 1, first, values[w].bytes)
            reloads[w] = r
        return State(state.forward, bwd, tuple(sorted(reloads.items())))

    def candidates(self, ev: Evaluation, recompute: bool = True,
                   limit: int | None = CANDIDATES) -> list[tuple[float, str, int]]:
        """(estimated gain, kind, target) of the switches worth simulating, best first (the first
        ``limit``); over the budget, recompute switches only with ``recompute``."""
        state, graph = ev.state, self.graph
        nf = len(state.forward)
        seq = state.forward + state.backward
        info = self.instances(state.forward, state.backward)
        swapped = state.swapped
        out: list[tuple[float, str, int]] = []
        if not ev.fits:
            peak_pos = self.peak_position(ev)
            for v, (last, first) in info.items():
                if v in swapped:
                    if swapped[v] <= peak_pos < first:
                        out.append((graph.values[v].bytes, "later", v))
                elif last < peak_pos < first:
                    out.append((graph.values[v].bytes, "swap", v))
                    if recompute:
                        out.append((graph.values[v].bytes, "recompute", v))
            recomputed = [pos for pos in range(nf, len(seq)) if graph.nodes[seq[pos]].phase == FORWARD]
            near = sorted(recomputed, key=lambda p: abs(p - peak_pos))[: CANDIDATES // 4]
            out.extend((0.0, "drop", p) for p in near)
        else:  # within the budget: trade memory left under it for time
            for pos in range(nf, len(seq)):
                node = graph.nodes[seq[pos]]
                if node.phase == FORWARD:
                    copies = sum(self.copy_seconds(v) for v in node.outputs)
                    out.append((node.cost, "keep", pos))
                    out.append((node.cost - copies, "drop", pos))
            for v in swapped:
                out.append((self.copy_seconds(v), "unswap", v))
                out.append((self.copy_seconds(v) - graph.producer(v).cost, "recompute", v))
        out.sort(key=lambda c: -c[0])
        if limit is None:
            return out
        chosen, per_kind = [], {}
        for c in out:
            key = self.alike(state, c[1], c[2])
            if per_kind.get(key, 0) < PER_KIND:
                per_kind[key] = per_kind.get(key, 0) + 1
                chosen.append(c)
                if len(chosen) == limit:
                    break
        return chosen

    def apply(self, state: State, kind: str, target: int, peak_pos: int | None = None) -> State | None:
        if kind == "swap":
            return self.swap(state, target, self.instances(state.forward, state.backward), peak_pos)
        if kind == "drop":
            return self.drop(state, [target])
        if kind == "keep":
            return self.drop(state, [target], swap=False)
        if kind == "recompute":
            return self.recompute(state, target)
        if kind == "unswap":
            return State(state.forward, state.backward, tuple(r for r in state.reloads if r[0] != target))
        # "later": reload right after the peak position
        reloads = dict(state.reloads)
        reloads[target] = peak_pos + 1
        return State(state.forward, state.backward, tuple(sorted(reloads.items())))

    def prefetch(self, ev: Evaluation, v: int) -> Evaluation:
        """Move ``v``'s reload as early as the budget allows, if that lowers the step time (never
        with synchronous copies: all their time stalls, wherever they are)."""
        if not self.overlap or ev.plan.simulation.stall_seconds <= 0:
            return ev
        info = self.instances(ev.state.forward, ev.state.backward)
        if v not in info:
            return ev
        lo, hi = info[v][0] + 1, ev.state.swapped[v]  # find the earliest r in [lo, hi) within the bound
        bound = max(self.budget, ev.peak)
        best = ev
        while lo < hi:
            mid = (lo + hi) // 2
            reloads = dict(ev.state.reloads)
            reloads[v] = mid
            trial = self.build(State(ev.state.forward, ev.state.backward, tuple(sorted(reloads.items()))))
            if trial is not None and trial.peak <= bound:
                if trial.step < best.step - _EPS:
                    best = trial
                hi = mid
            else:
                lo = mid + 1
        return best

    # ---------------------------------------------------------------- the greedy
    def refine(self, start: State, deadline: float) -> tuple[Evaluation, Evaluation, int]:
        """(best fitting evaluation or None, smallest-peak evaluation, rounds): the descent from
        ``start``, then kicks from its best fitting plan (:meth:`kick`)."""
        cur = self.build(start)
        if cur is None:
            raise SolverError("hybrid: the starting schedule does not simulate")
        best_fit, smallest, rounds = self.descend(cur, deadline, recompute=False)
        if best_fit is not None:
            best_fit, more = self.kick(best_fit, deadline)
            rounds += more
        return best_fit, smallest, rounds

    def descend(self, cur: Evaluation, deadline: float, recompute: bool = True,
                beat: float | None = None) -> tuple[Evaluation, Evaluation, int]:
        """The greedy descent (step 3 of the module docstring) from ``cur``; over the budget it
        also recomputes values only with ``recompute`` (in a kick's way back under the budget).
        Within the budget the chosen switch's alike ones are then taken too (:meth:`take_alike`).

        ``beat``: the step time of the plan a kick must beat. Over the budget the descent gives up
        once its step floor (:meth:`step_floor`) is not below it: the repair already costs more
        than the kick won. (Not applied to the starts' descents, where it would be sound only if the
        step could not fall again within the budget: ViT ``small`` with synchronous copies at 0.3
        lost 6% of step when the recomputation start's descent was cut against the hierarchical
        start's plan.)"""
        best_fit = cur if cur.fits else None
        smallest = cur
        rounds = 0
        while time.perf_counter() < deadline:
            if beat is not None and not cur.fits and self.cannot_beat(cur.state, beat):
                break
            rounds += 1
            peak_pos = self.peak_position(cur)
            if cur.fits:
                choice = self._fastest_fitting(cur, self.candidates(cur, recompute), deadline)
            else:
                choice = choose_over_budget(self, cur, self.candidates(cur, recompute), peak_pos, deadline)
            if choice is None:
                break
            trial, kind, target = choice
            if kind == "swap":
                trial = self.prefetch(trial, target)
            if cur.fits:
                trial = self.take_alike(cur, trial, kind, target, deadline)
            else:
                trial = self.take_alike_over(cur, trial, kind, target, peak_pos, deadline)
            cur = trial
            if cur.fits and (best_fit is None or cur.step < best_fit.step):
                best_fit = cur
            if cur.key() < smallest.key():
                smallest = cur
        return best_fit, smallest, rounds

    def _fastest_fitting(self, cur: Evaluation, candidates, deadline: float) -> tuple | None:
        """(evaluation, kind, target) of the switch of ``cur`` (within the budget) whose plan fits and
        has the least (step, peak), if faster than ``cur``; None if none is.

        Best first: the switches are simulated in the order of their step floors
        (:meth:`step_floor`), and the search stops at the first floor above the best step found, which
        no later switch can beat. The choice is the one simulating every switch would make; with
        synchronous copies the floor is the step itself, so a round simulates only the switches
        faster than its choice (which all miss the budget) and the choice. Ties in (step, peak) go
        to the lower floor, then to the earlier candidate."""
        trials = []
        for _, kind, target in candidates:
            state = self.apply(cur.state, kind, target)
            if state is None:
                continue
            floor = self.step_floor(state)
            if floor < cur.step - _EPS / 2:
                trials.append((floor, len(trials), kind, target, state))
        trials.sort()
        choice = None
        for floor, _, kind, target, state in trials:
            if time.perf_counter() >= deadline or (choice is not None and floor > choice[0].step + _EPS):
                break
            if self.cannot_fit(cur, state):  # (judged here: a switch the search stops before costs nothing)
                continue
            trial = judge(self, state, kind)
            if (trial is not None and trial.fits and trial.step < cur.step - _EPS
                    and (choice is None or (trial.step, trial.peak) < (choice[0].step, choice[0].peak))):
                choice = (trial, kind, target)
        if choice is not None and self.swap_keys is not None:
            real = self.swap_keys.real(choice[0])
            if real is None:  # predicted wrong: simulated from now on
                return self._fastest_fitting(cur, candidates, deadline)
            choice = (real,) + choice[1:]
        return choice

    def peak_position(self, ev: Evaluation) -> int:
        """The schedule position of the computation at (or last before) the plan's peak."""
        ins = ev.plan.instructions
        return sum(1 for x in ins[: ev.plan.simulation.peak_index + 1] if x.kind == COMPUTE) - 1

    def alike(self, state: State, kind: str, target: int) -> tuple:
        """What a switch changes, but for which layer: its kind, its node's op, module path with
        layer numbers dropped (``layers.#.mlp``) and output sizes (and the output's index, for a
        switch named by value). The same switch in each of identical layers is alike."""
        if kind in ("keep", "drop"):  # a position in the backward
            node, out = self.graph.nodes[state.backward[target - len(state.forward)]], -1
        else:
            node = self.graph.producer(target)
            out = node.outputs.index(target)
        key = self._alike_keys.get((node.id, out))
        if key is None:
            key = self._alike_keys[(node.id, out)] = (
                node.op, _LAYER_NUMBER.sub("#", node.module), out, tuple(self.graph.values[v].bytes for v in node.outputs))
        return (kind,) + key

    def _alike_targets(self, before: Evaluation, taken: Evaluation, kind: str, target: int) -> list[int]:
        """The targets, on ``taken``'s schedule, of the switches alike to (``kind``, ``target``) that
        ``before`` offers (recompute switches among them over the budget only for a recompute)."""
        key = self.alike(before.state, kind, target)
        others = [c for c in self.candidates(before, recompute=kind == "recompute", limit=None)
                  if c[1] == kind and c[2] != target and self.alike(before.state, kind, c[2]) == key]
        return [t for t in self._locate(before.state, taken.state, others) if t is not None]

    def take_alike_over(self, before: Evaluation, taken: Evaluation, kind: str, target: int, peak_pos: int,
                        deadline: float) -> Evaluation:
        """Over the budget: ``taken`` (``before`` with the switch) with its alike ones on ``before``
        too (reloads after the same peak position): all of them when that lowers (peak, excess,
        step) and still misses the budget; when all of them fit, the shortest prefix that fits
        (swapping or recomputing no more than the budget needs); else a binary search for a
        longer prefix that lowers the key further (a simulation per probe). ``taken`` itself when
        it fits already."""
        if taken.fits:  # the switch alone reaches the budget: the descent goes on within it
            return taken
        rest = self._alike_targets(before, taken, kind, target)
        if not rest or time.perf_counter() >= deadline:
            return taken

        def trial(n: int):  # an Evaluation, or its key predicted (hybrid_swaps)
            return judge(self, self.apply_many(taken.state, kind, rest[:n], peak_pos), kind)

        def real(ev):
            return ev if self.swap_keys is None else (self.swap_keys.real(ev) or taken)

        whole = trial(len(rest))
        if whole is not None and whole.fits:  # the shortest prefix that fits
            lo, hi, best = 0, len(rest), whole
            while hi - lo > 1 and time.perf_counter() < deadline:
                mid = (lo + hi) // 2
                ev = trial(mid)
                if ev is not None and ev.fits:
                    hi, best = mid, ev
                else:
                    lo = mid
            return real(best)
        if whole is not None and whole.key() < taken.key():
            return real(whole)
        lo, hi, best = 0, len(rest), taken  # the longest prefix that lowers the key
        while hi - lo > 1 and time.perf_counter() < deadline:
            mid = (lo + hi) // 2
            ev = trial(mid)
            if ev is not None and ev.key() < best.key():
                lo, best = mid, ev
            else:
                hi = mid
        return real(best)

    def take_alike(self, before: Evaluation, taken: Evaluation, kind: str, target: int, deadline: float) -> Evaluation:
        """``taken`` (``before`` with the switch (``kind``, ``target``)) with as many of that
        switch's alike ones on ``before`` (:meth:`alike`) as keep it within the budget and lower
        its step time: all of them, or else the longest prefix, in the candidates' order, that
        does (binary search, a simulation per probe). A model of 64 identical layers offers each
        switch 64 times: a round per layer would be 64 rounds per kind of switch."""
        rest = self._alike_targets(before, taken, kind, target)
        if not rest:
            return taken
        whole = self._better(taken, self.apply_many(taken.state, kind, rest), deadline)
        if whole is not None:
            return whole
        lo, hi, best = 0, len(rest), taken
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ev = self._better(taken, self.apply_many(taken.state, kind, rest[:mid]), deadline)
            if ev is None:
                hi = mid
            else:
                lo, best = mid, ev
        return best

    def _better(self, ref: Evaluation, state: State | None, deadline: float) -> Evaluation | None:
        """``state``'s evaluation when it is within the budget and faster than ``ref``."""
        if (state is None or time.perf_counter() >= deadline or self.cannot_beat(state, ref.step)
                or self.cannot_fit(ref, state)):
            return None
        ev = self.build(state)
        return ev if ev is not None and ev.fits and ev.step < ref.step - _EPS else None

    @staticmethod
    def _locate(before: State, after: State, switches: list) -> list[int | None]:
        """The targets of ``switches`` (found on ``before``) on ``after``'s schedule: a value stays
        itself; a backward position is found by its node and occurrence among the backward's
        (None: gone)."""
        nf = len(before.forward)
        found: list[int | None] = [None if kind in ("keep", "drop") else target for _, kind, target in switches]
        at = {target - nf: k for k, (_, kind, target) in enumerate(switches) if kind in ("keep", "drop")}
        if at:
            wanted = {key: at[j] for j, key in enumerate(_occurrences(before.backward)) if j in at}
            for j, key in enumerate(_occurrences(after.backward)):
                if key in wanted:
                    found[wanted[key]] = nf + j
        return found

    def apply_many(self, state: State, kind: str, targets: list[int], peak_pos: int | None = None) -> State | None:
        """``state`` with switch ``kind`` applied at each of ``targets`` (all on ``state``)."""
        if kind in ("keep", "drop"):
            return self.drop(state, targets, swap=kind == "drop")
        if kind == "unswap":
            gone = set(targets)
            return State(state.forward, state.backward, tuple(r for r in state.reloads if r[0] not in gone))
        for target in targets:  # switches named by value: one after the other
            state = self.apply(state, kind, target, peak_pos)
            if state is None:
                return None
        return state

    def kick(self, best: Evaluation, deadline: float) -> tuple[Evaluation, int]:
        """Escape the descent's local optimum: apply a time-lowering switch of ``best`` that
        overshoots the budget (keep, unswap, drop; the ``KICKS`` of least peak, easiest to repair,
        one of each kind of :meth:`alike` switches),
        descend from there back under the budget (where other values are swapped or recomputed
        instead), and move to the result when it is faster; until no kick of the current best helps."""
        tried: set[State] = set()
        rounds = 0
        improved = True
        while improved and time.perf_counter() < deadline:
            improved = False
            kicks = []
            wanted = best.step * (1 - KICK_GAIN)
            for _, kind, target in self.candidates(best):
                if time.perf_counter() >= deadline:
                    break
                state = self.apply(best.state, kind, target)
                if state is None or state in tried or self.cannot_beat(state, wanted):
                    continue
                tried.add(state)
                kicked = self.build(state)
                if kicked is not None and not kicked.fits and kicked.step < wanted - _EPS:
                    # (a fitting switch is the descent's, a slower one gains nothing)
                    kicks.append((kicked, self.alike(best.state, kind, target)))
            kicked_kinds: set[tuple] = set()
            for kicked, alike in sorted(kicks, key=lambda k: (k[0].peak, k[0].step)):
                if time.perf_counter() >= deadline or len(kicked_kinds) == KICKS:
                    break
                if alike in kicked_kinds:  # the same kick in another identical layer: repaired alike
                    continue
                kicked_kinds.add(alike)
                fit, _, more = self.descend(kicked, deadline, beat=best.step)
                rounds += more
                if fit is not None and fit.step < best.step - _EPS:
                    best, improved = fit, True
                    break
        return best, rounds


__all__ = ["State", "Evaluation", "GreedySearch", "CANDIDATES", "PER_KIND", "KICKS", "KICK_GAIN"]

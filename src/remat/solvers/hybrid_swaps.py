"""Swaps judged without simulating them, where every copy stalls compute (synchronous copies).

With synchronous copies (the CPU's file store: each copy blocks compute until it lands) a set of
swaps ``S`` on one schedule (forward, backward) changes only two things in the plan: each swapped
value's bytes are not counted from its offload to its reload, and each copy's time is added to the
step. So, from the swap-free plan of that schedule, simulated once with its per-instruction highs,
at each of its instructions ``k``::

    counted_S[k] = counted_0[k] - sum(bytes(v) for v in S if off(v) <= k < rel(v))
    high_S[k]    = high_0[k]    - (the same sum)
    step_S       = step_0 + sum(2 latency + bytes(v) / d2h + bytes(v) / h2d for v in S)

where ``off(v)`` and ``rel(v)`` are the first instructions after the gaps the copies go into
(:func:`remat.plan.insert_swaps`: a gap's offloads, in value order, then the boundary, then its
reloads). The copies' own entries follow from the entry before their gap. The greedy's key over
the budget (peak, the bytes over it summed over the timeline, step) is then a few array operations
instead of a walk of the whole step in Python: on a 64-layer Llama-style model (15,000
instructions, 20 swaps) 0.5 ms a switch against 46 ms of simulation.

The greedy simulates the switch it takes (:func:`choose_over_budget`, :meth:`SwapKeys.real`) and
checks that the simulator agrees; where it does not (``mismatches``), that round and the rest of
the search simulate every switch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..simulate import simulate

SAME_STEP = 1e-9  # relative: the predicted step adds the copies in another order than the simulator's clock
_SWAP_KINDS = ("swap", "later", "unswap")  # switches that change the swaps and not the schedule


@dataclass(frozen=True)
class Predicted:
    """A state's key as :class:`SwapKeys` predicts it (the greedy's Evaluation, but not simulated)."""

    state: object
    peak: int
    excess: int
    step: float
    budget: int

    @property
    def fits(self) -> bool:
        return self.peak <= self.budget

    def key(self) -> tuple:
        return (self.peak, self.excess, self.step)


class SwapKeys:
    """Predicted keys of swap sets over the schedules of one :class:`~.hybrid_search.GreedySearch`."""

    def __init__(self, search):
        self.search = search
        graph = search.graph
        self.bytes = [value.bytes for value in graph.values]
        self.tangent_bytes = sum(graph.values[t].bytes for t in graph.tangents)
        self._bases: dict[tuple, tuple] = {}
        self.mismatches = 0

    def _base(self, fwd, bwd):
        """(timeline, highs, compute step, boundary, compute indices) of the swap-free plan."""
        key = (fwd, bwd)
        if key not in self._bases:
            if len(self._bases) > 8:
                self._bases.clear()
            instructions, boundary, computes = self.search.schedule(fwd, bwd)
            sim = simulate(self.search.graph, instructions, boundary, record_highs=True)
            self._bases[key] = (np.array(sim.timeline, dtype=np.int64), np.array(sim.highs, dtype=np.int64),
                                sim.step_seconds, boundary, computes)
        return self._bases[key]

    def predict(self, state) -> Predicted | None:
        """``state``'s (peak, excess, step), or None where the greedy's build would reject it."""
        search, sizes = self.search, self.bytes
        timeline, highs, step, boundary, computes = self._base(state.forward, state.backward)
        info = search.instances(state.forward, state.backward)
        n = len(timeline)
        diff = np.zeros(n + 1, dtype=np.int64)
        gaps: dict[int, tuple[list[int], list[int]]] = {}
        for v, r in state.reloads:
            if v not in info or not info[v][0] < r <= info[v][1]:
                return None
            last = info[v][0]
            off_gap = computes[last + 1] if last + 1 < len(computes) else n
            rel_gap = computes[r]
            diff[off_gap] += sizes[v]
            diff[rel_gap] -= sizes[v]
            gaps.setdefault(off_gap, ([], []))[0].append(v)
            gaps.setdefault(rel_gap, ([], []))[1].append(v)
            step += 2 * search.latency + sizes[v] / search.d2h + sizes[v] / search.h2d
        offset = np.cumsum(diff[:n])
        counted = timeline - offset
        budget = search.budget
        peak = int((highs - offset).max())
        excess = int(np.maximum(counted - budget, 0).sum())
        for gap, (offloads, reloads) in gaps.items():  # the copies' own entries
            held = int(counted[gap - 1]) if gap > 0 else 0
            entries = []
            for v in sorted(offloads):
                held -= sizes[v]
                entries.append(held)
            if gap == boundary:
                held += self.tangent_bytes
            for v in sorted(reloads):
                held += sizes[v]
                entries.append(held)
            peak = max(peak, *entries)
            excess += sum(e - budget for e in entries if e > budget)
        return Predicted(state, peak, excess, step, budget)

    def real(self, judged):
        """The simulated evaluation of ``judged`` (a Predicted one, or one simulated already); None
        where the simulator does not give the predicted key: the search then simulates every
        state from here on (``search.swap_keys`` is cleared; ``mismatches`` counts these)."""
        if not isinstance(judged, Predicted):
            return judged
        ev = self.search.build(judged.state)
        if (ev is None or (ev.peak, ev.key()[1]) != (judged.peak, judged.excess)
                or abs(ev.step - judged.step) > SAME_STEP * max(ev.step, 1e-12)):
            self.mismatches += 1
            self.search.swap_keys = None
            return None
        return ev


def choose_over_budget(search, cur, candidates, peak_pos: int, deadline: float):
    """(evaluation, kind, target) of the switch of ``cur`` (over the budget) of least key below
    ``cur``'s, or None. With :class:`SwapKeys` (``search.swap_keys``) the swap-only switches are
    predicted and only the one taken is simulated; where the simulator disagrees, every switch is
    simulated as without it."""
    keys = search.swap_keys
    choice = None
    for _, kind, target in candidates:
        if time.perf_counter() >= deadline:
            break
        trial = judge(search, search.apply(cur.state, kind, target, peak_pos), kind)
        if trial is not None and trial.key() < cur.key() and (choice is None or trial.key() < choice[0].key()):
            choice = (trial, kind, target)
    if choice is None or keys is None:
        return choice
    real = keys.real(choice[0])
    if real is None:  # the prediction is off: every switch judged by the simulator
        return choose_over_budget(search, cur, candidates, peak_pos, deadline)
    return (real,) + choice[1:]


def judge(search, state, kind: str):
    """``state`` (``kind``'s switch): its key predicted for a swap-only switch where
    ``search.swap_keys`` predicts, else simulated."""
    if state is None:
        return None
    keys = search.swap_keys
    return keys.predict(state) if keys is not None and kind in _SWAP_KINDS else search.build(state)


__all__ = ["Predicted", "SwapKeys", "choose_over_budget", "judge", "SAME_STEP"]

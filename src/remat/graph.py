"""The Graph: one training step as a DAG of operations over tensor values.

A :class:`Graph` is plain, immutable data. Every planner reads it; none of them
touches a tensor. It is built by :mod:`remat.capture` from the joint
forward+backward graph that AOTAutograd traces, with views and other aliases
folded into the value they alias (a view owns no memory of its own)::

    g = capture(...).graph
    for node in g.nodes:                      # topological: forward first
        print(node.name, node.phase, node.cost, [g.values[v].bytes for v in node.outputs])

Values are of three kinds:

* ``input``   parameters, buffers and user inputs: resident all step, outside the budget;
* ``tangent`` gradients of the outputs, fed to the backward by autograd;
* ``activation`` everything an op computes.

``Graph.forward_outputs`` must exist when the forward ends (they are handed to the
user), ``Graph.backward_outputs`` (parameter gradients) when the step ends.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from dataclasses import asdict, dataclass, field
from functools import cached_property

FORWARD = "forward"
BACKWARD = "backward"

INPUT = "input"
TANGENT = "tangent"
ACTIVATION = "activation"


@dataclass(frozen=True)
class Value:
    """A tensor's storage: ``bytes`` is what holding it costs."""

    id: int
    name: str
    bytes: int
    kind: str  # INPUT, TANGENT or ACTIVATION
    producer: int | None  # the node computing it; None for inputs and tangents
    shape: tuple[int, ...] = ()
    dtype: str = ""


@dataclass(frozen=True)
class Node:
    """One operation. ``inputs``/``outputs`` are value ids (aliases already folded)."""

    id: int
    name: str
    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    phase: str  # FORWARD or BACKWARD
    cost: float = 0.0  # seconds
    workspace: int = 0  # bytes the op allocates and frees internally
    random: bool = False  # draws random numbers: a recomputation must replay them
    module: str = ""  # innermost nn.Module path, for coarsening and display


class Memo(dict):
    """What planners learnt about one graph: plans made, each solver's smallest plan, chain DPs.

    Owned by the graph (:attr:`Graph.memo`), so it goes when the graph goes; graphs with equal
    :attr:`Graph.planning_key` (the same step, captured twice) share one memo while any of them
    lives. Keys are tuples whose first item names the owner (``("rotor",)``, ``("plan", ...)``)::

        dp = graph.memo.cached(("rotor",), lambda: build_dp(graph))   # built once per graph
    """

    def cached(self, key: tuple, make):
        """``self[key]``, made by ``make()`` the first time."""
        if key not in self:
            self[key] = make()
        return self[key]


_LIVE_MEMOS: "weakref.WeakValueDictionary[tuple, Memo]" = weakref.WeakValueDictionary()  # holds no memo alive


def forget_memos() -> None:
    """Empty the memo of every graph alive (tests and benchmarks that time planning from scratch)."""
    for memo in list(_LIVE_MEMOS.values()):
        memo.clear()


@dataclass(frozen=True)
class Graph:
    """An immutable DAG in topological order (forward nodes before backward nodes)."""

    nodes: tuple[Node, ...]
    values: tuple[Value, ...]
    forward_outputs: tuple[int, ...]
    backward_outputs: tuple[int, ...]
    name: str = "graph"
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        self._check()

    # ----------------------------------------------------------------- queries
    @cached_property
    def users(self) -> tuple[tuple[int, ...], ...]:
        """``users[v]``: ids of the nodes that read value ``v``, in order."""
        users: list[list[int]] = [[] for _ in self.values]
        for node in self.nodes:
            for v in node.inputs:
                users[v].append(node.id)
        return tuple(tuple(u) for u in users)

    @cached_property
    def held_inputs(self) -> tuple[tuple[int, ...], ...]:
        """``held_inputs[n]``: the inputs of node ``n`` a plan must hold when it runs (all but the
        step's own inputs, which are always resident)."""
        values = self.values
        return tuple(tuple(v for v in node.inputs if values[v].kind != INPUT) for node in self.nodes)

    @cached_property
    def output_bytes(self) -> tuple[int, ...]:
        """``output_bytes[n]``: the bytes node ``n``'s outputs take."""
        values = self.values
        return tuple(sum(values[v].bytes for v in node.outputs) for node in self.nodes)

    @cached_property
    def forward_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.phase == FORWARD)

    @cached_property
    def backward_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.phase == BACKWARD)

    @cached_property
    def inputs(self) -> tuple[int, ...]:
        return tuple(v.id for v in self.values if v.kind == INPUT)

    @cached_property
    def tangents(self) -> tuple[int, ...]:
        return tuple(v.id for v in self.values if v.kind == TANGENT)

    @cached_property
    def store_all_seconds(self) -> float:
        """Compute time of the plan that runs every node exactly once."""
        return sum(n.cost for n in self.nodes)

    def producer(self, value: int) -> Node | None:
        p = self.values[value].producer
        return None if p is None else self.nodes[p]

    @cached_property
    def structural_hash(self) -> str:
        """Hash of the step's structure: equal hashes, equal graphs up to names and costs.

        Covers every value (kind, bytes, shape, dtype, producing node), every node (ATen op,
        input and output value ids, i.e. the edges, phase, randomness, workspace bytes) and the
        forward/backward outputs, each field written with ``repr`` so that no two graphs run
        together into the same text. Names, module paths, costs and ``meta`` are left out (see
        :attr:`planning_hash`). Stable across processes: saved plans and the plan cache use it.
        """
        h = hashlib.sha256()
        for v in self.values:
            h.update(repr(("v", v.kind, v.bytes, tuple(v.shape), v.dtype, v.producer)).encode())
        for n in self.nodes:
            h.update(repr(("n", n.op, n.inputs, n.outputs, n.phase, n.random, n.workspace)).encode())
        h.update(repr(("o", self.forward_outputs, self.backward_outputs)).encode())
        return h.hexdigest()[:16]

    @cached_property
    def planning_hash(self) -> str:
        """Hash of everything a planner reads: the structure, each node's cost and module path,
        and ``meta`` (mutated inputs, random generator state size). Stable across processes;
        the on-disk plan cache keys on it."""
        h = hashlib.sha256(self.structural_hash.encode())
        h.update(repr(tuple(round(n.cost, 12) for n in self.nodes)).encode())
        h.update(repr(tuple(n.module for n in self.nodes)).encode())
        h.update(json.dumps(self.meta, sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    @cached_property
    def planning_key(self) -> tuple:
        """Structure, costs and meta: graphs with equal keys get the same plans (cache key)."""
        costs = tuple(round(n.cost, 12) for n in self.nodes)
        meta = json.dumps(self.meta, sort_keys=True, default=str)  # mutated inputs, RNG state size …
        return (self.structural_hash, hash(costs), meta)

    @cached_property
    def memo(self) -> Memo:
        """The planners' memo of this graph (see :class:`Memo`)."""
        memo = _LIVE_MEMOS.get(self.planning_key)
        if memo is None:
            memo = _LIVE_MEMOS[self.planning_key] = Memo()
        return memo

    def __getstate__(self) -> dict:  # a pickled graph carries its data, not what planners learnt about it
        return {k: v for k, v in self.__dict__.items() if k != "memo"}

    def __hash__(self) -> int:  # frozen dataclass with a dict field
        return hash(self.structural_hash)

    def summary(self) -> str:
        act = sum(v.bytes for v in self.values if v.kind == ACTIVATION)
        return (
            f"Graph {self.name!r}: {len(self.forward_nodes)} forward + {len(self.backward_nodes)} backward nodes, "
            f"{len(self.values)} values, {act / 2**20:.1f} MiB computed in all, "
            f"{self.store_all_seconds * 1e3:.2f} ms of compute"
        )

    # ----------------------------------------------------------------- checks
    def _check(self) -> None:
        seen_phase_backward = False
        defined = {v.id for v in self.values if v.kind in (INPUT, TANGENT)}
        for i, v in enumerate(self.values):
            if v.id != i:
                raise ValueError(f"value {v.name} has id {v.id}, expected {i}")
        for i, n in enumerate(self.nodes):
            if n.id != i:
                raise ValueError(f"node {n.name} has id {n.id}, expected {i}")
            if n.phase == BACKWARD:
                seen_phase_backward = True
            elif seen_phase_backward:
                raise ValueError(f"forward node {n.name} comes after a backward node")
            for v in n.inputs:
                if v not in defined:
                    raise ValueError(f"node {n.name} reads {self.values[v].name} before it is computed")
                if n.phase == FORWARD and self.values[v].kind == TANGENT:
                    raise ValueError(f"forward node {n.name} reads a tangent")
            for v in n.outputs:
                if self.values[v].producer != n.id:
                    raise ValueError(f"value {self.values[v].name} is not marked as produced by {n.name}")
                defined.add(v)

    # ----------------------------------------------------------------- (de)serialization
    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "nodes": [asdict(n) for n in self.nodes],
            "values": [asdict(v) for v in self.values],
            "forward_outputs": list(self.forward_outputs),
            "backward_outputs": list(self.backward_outputs),
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Graph":
        nodes = tuple(
            Node(**{**n, "inputs": tuple(n["inputs"]), "outputs": tuple(n["outputs"])}) for n in d["nodes"]
        )
        values = tuple(Value(**{**v, "shape": tuple(v["shape"])}) for v in d["values"])
        return cls(
            nodes,
            values,
            tuple(d["forward_outputs"]),
            tuple(d["backward_outputs"]),
            d.get("name", "graph"),
            d.get("meta", {}),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


class GraphBuilder:
    """Builds a :class:`Graph` by hand; used by capture and by tests' synthetic graphs.

    >>> b = GraphBuilder()
    >>> x = b.input("x", 4)
    >>> (h,) = b.op("f", [x], [8], cost=1.0)
    >>> (g,) = b.op("f_bwd", [h], [4], phase="backward", cost=2.0)
    >>> graph = b.build(forward_outputs=[h], backward_outputs=[g])
    """

    def __init__(self, name: str = "graph"):
        self.name = name
        self.nodes: list[Node] = []
        self.values: list[Value] = []

    def _value(self, name, nbytes, kind, producer, shape=(), dtype="") -> int:
        vid = len(self.values)
        self.values.append(Value(vid, name, int(nbytes), kind, producer, tuple(shape), str(dtype)))
        return vid

    def input(self, name: str, nbytes: int, shape=(), dtype="") -> int:
        return self._value(name, nbytes, INPUT, None, shape, dtype)

    def tangent(self, name: str, nbytes: int, shape=(), dtype="") -> int:
        return self._value(name, nbytes, TANGENT, None, shape, dtype)

    def op(
        self,
        name: str,
        inputs,
        output_bytes,
        *,
        phase: str = FORWARD,
        cost: float = 1.0,
        workspace: int = 0,
        random: bool = False,
        op: str | None = None,
        module: str = "",
        output_names=None,
        output_meta=None,
    ) -> list[int]:
        nid = len(self.nodes)
        outs = []
        for k, nbytes in enumerate(output_bytes):
            vname = output_names[k] if output_names else (name if len(output_bytes) == 1 else f"{name}.{k}")
            shape, dtype = output_meta[k] if output_meta else ((), "")
            outs.append(self._value(vname, nbytes, ACTIVATION, nid, shape, dtype))
        inputs = tuple(dict.fromkeys(inputs))  # dedupe, keep order
        self.nodes.append(
            Node(nid, name, op or name, inputs, tuple(outs), phase, float(cost), int(workspace), random, module)
        )
        return outs

    def build(self, forward_outputs=(), backward_outputs=(), meta=None) -> Graph:
        return Graph(
            tuple(self.nodes),
            tuple(self.values),
            tuple(dict.fromkeys(forward_outputs)),
            tuple(dict.fromkeys(backward_outputs)),
            self.name,
            meta or {},
        )

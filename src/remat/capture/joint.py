"""Joint forward+backward FX graph (from AOTAutograd) → :class:`~remat.graph.Graph`.

AOTAutograd hands the partition function a functionalized ATen graph of the whole
training step: placeholders ``primals_*`` (parameters, buffers, inputs) and
``tangents_*`` (gradients of the outputs), then the ops, then one output node
listing the forward outputs followed by the gradients of the primals.

:func:`capture_joint` turns it into a Graph:

* every op whose output owns storage becomes a node; ``getitem`` of a multi-output
  op is an output value of that op;
* views and other aliases (``t``, ``view``, ``detach``, ``expand``, ``split`` …) are
  recognized by sharing storage with an input and folded into the value they alias;
* the forward phase is every node the forward outputs depend on, and every node the new
  value of a mutated input depends on (see below); the rest is backward;
* mutations of inputs that AOTAutograd keeps in the graph (``copy_(primal, new)`` at the
  end of the forward, as it does for a compiler that supports them, e.g. Inductor with
  BatchNorm's running statistics) are recorded in ``Capture.input_mutations``; ``new`` is a
  forward output of the Graph (it must exist when the forward ends, where the lowering
  writes it back), and the ops that read the old value are never recomputed in the backward;
* sizes are storage bytes as the device's allocator counts them (:func:`allocated_bytes`: exact on
  the CPU, rounded up to CUDA's 512-byte blocks); random ops are flagged from
  ``Tag.nondeterministic_seeded``.

The :class:`Capture` keeps the mapping back to FX nodes that :mod:`remat.execute.lowering` needs.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx

from ..errors import CaptureError
from ..measure import allocated_bytes, warn_if_cuda_blocks_rounded
from ..graph import BACKWARD, FORWARD, Graph, GraphBuilder

CostFn = Callable[[fx.Node], float]


@dataclass
class Capture:
    """A Graph plus the FX nodes it was built from."""

    joint: fx.GraphModule
    graph: Graph
    num_fwd_outputs: int
    op_node: list[fx.Node]  # graph node id -> the FX op node
    value_node: list[fx.Node]  # value id -> the FX node holding it (op, getitem or placeholder)
    alias_base: dict[fx.Node, int]  # alias FX node -> id of the value it aliases
    value_id: dict[fx.Node, int]  # FX node holding a value -> value id
    primals: list[fx.Node]
    tangents: list[fx.Node]
    fwd_outputs: list  # FX nodes (or None) the forward returns, in order
    bwd_outputs: list  # FX nodes (or None) the backward returns, in order
    extra: dict = field(default_factory=dict)
    # (primal placeholder, FX node of its new value): written back when the forward ends
    input_mutations: list = field(default_factory=list)
    # ops computing sizes, not tensors (``s0 * 768`` in a graph captured with dynamic shapes)
    shape_nodes: set = field(default_factory=set)


# FX node meta that a rewrite of the joint graph may set on a node it adds (remat.execute.optimizer):
GIVEN_COST = "remat_cost"  # its seconds, used instead of the cost model's
GIVEN_WORKSPACE = "remat_workspace"  # its scratch bytes, used instead of a probe
UPDATES = "remat_updates"  # the placeholder of the input it updates in place: nothing may read it afterwards


def is_size_value(val) -> bool:
    """Whether an FX node's value is a size (a number or symbolic number), not a tensor."""
    return isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def storage_key(val) -> int | None:
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return val.untyped_storage()._cdata
    except Exception:  # tensors without storage (e.g. some subclasses)
        return None


def _storage_bytes(val: torch.Tensor) -> int:
    try:
        nbytes = int(val.untyped_storage().nbytes())
    except Exception:
        nbytes = int(val.numel() * val.element_size())
    return allocated_bytes(nbytes, val.device)


def _view_source(node: fx.Node) -> fx.Node | None:
    """The tensor a view op (``aten.view``, ``transpose``, ``slice``, ...: its schema says its output
    aliases its input) views; None for every other op."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or not target.is_view or not node.args:
        return None
    source = node.args[0]
    return source if isinstance(source, fx.Node) else None


def _is_random(node: fx.Node) -> bool:
    target = node.target
    tags = getattr(target, "tags", ())
    return torch.Tag.nondeterministic_seeded in tags


_ADD = torch.ops.aten.add.Tensor
_ADDMM = torch.ops.aten.addmm.default


def _layout(val) -> tuple | None:
    if not isinstance(val, torch.Tensor):
        return None
    return val.dtype, tuple(val.shape), tuple(val.stride()), val.storage_offset()


def _accumulator_positions(n: fx.Node) -> tuple[int, ...]:
    """The argument positions of ``n`` that an in-place variant may write into: both operands of
    ``add`` (only the first with an ``alpha``); ``addmm``'s ``self`` (``addmm_``: the running total of a
    split weight gradient, which the same gemm with ``beta`` accumulates into)."""
    if n.target is _ADD and len(n.args) == 2:
        return (0,) if n.kwargs.get("alpha", 1) != 1 else (0, 1)
    if n.target is _ADDMM and len(n.args) == 3:
        return (0,)
    return ()


def inplace_accumulations(op_node: list, builder, value_id: dict, value_node: list) -> dict:
    """Graph meta for remat's eager lowering: each ``add`` or ``addmm`` that may be written in place
    (``add_``, ``addmm_``: bitwise the same result, the same kernel writing into the input instead of a
    copy of it) into an input whose storage the output can take: ``inplace_reuse`` ``[node, input,
    output]`` triples (the simulator decides, per plan, whether the input dies there; see
    :func:`remat.simulate.simulate`) and ``inplace_eager``. The input is an op's own output (not a
    view), of the output's dtype, shape and strides, not sharing storage with the other operands
    (:func:`_accumulator_positions` names which inputs may be written)."""
    found = []
    for nid, n in enumerate(op_node):
        positions = _accumulator_positions(n)
        if not positions or len(builder.nodes[nid].outputs) != 1:
            continue
        (out,) = builder.nodes[nid].outputs
        out_val = value_node[out].meta.get("val")
        if value_node[out] is not n or not isinstance(out_val, torch.Tensor) or not out_val.is_contiguous():
            continue
        for k in positions:
            arg = n.args[k]
            if not isinstance(arg, fx.Node) or arg not in value_id or value_node[value_id[arg]] is not arg:
                continue
            val, vid = arg.meta.get("val"), value_id[arg]
            others = [a for j, a in enumerate(n.args) if j != k and isinstance(a, fx.Node)]
            if any(storage_key(o.meta.get("val")) == storage_key(val) for o in others):
                continue  # another operand is the input or a view of it: it would read what is written
            if (builder.values[vid].producer is not None and _layout(val) == _layout(out_val)
                    and builder.values[vid].bytes == builder.values[out].bytes):
                found.append([nid, vid, out])
    return {"inplace_reuse": found, "inplace_eager": True} if found else {}


def _module_path(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path, _ = list(stack.values())[-1]
    return str(path)


def _op_name(node: fx.Node) -> str:
    t = node.target
    return str(t) if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))


BATCH_NORM_FUNCTIONAL = torch.ops.aten._native_batch_norm_legit_functional.default


def is_batch_norm_with_stats(node: fx.Node) -> bool:
    """A training-mode batch norm that also updates running statistics. Its normalized
    output does not depend on the statistics, so a recomputation can skip them
    (:mod:`remat.execute.lowering` replays it as ``_native_batch_norm_legit.no_stats``)."""
    return node.target is BATCH_NORM_FUNCTIONAL and bool(node.args[5])


COPY_ = torch.ops.aten.copy_.default


def input_mutations_of(fx_graph: fx.Graph) -> list[tuple[fx.Node, fx.Node]]:
    """``(primal, new value)`` of each ``copy_`` into a primal placeholder: an input mutation
    AOTAutograd kept in the graph. Only forward mutations are supported (a CaptureError otherwise)."""
    found = []
    for n in fx_graph.find_nodes(op="call_function", target=COPY_):
        dest, src = n.args[0], n.args[1]
        if not (isinstance(dest, fx.Node) and dest.op == "placeholder"):
            continue
        if n.meta.get("partitioner_tag") in ("is_backward", "must_be_in_backward"):
            raise CaptureError(
                f"the step writes a new value into its input {dest.name} during the backward, which remat cannot "
                "plan yet: move that in-place update out of the autograd.Function's backward (or out of the "
                "backward hook), or compile without remat"
            )
        if not isinstance(src, fx.Node):
            raise CaptureError(f"remat cannot plan the in-place update of input {dest.name} (copy_ of a constant)")
        found.append((dest, src))
    return found


def forward_phase(fwd_outputs, input_mutations) -> set[fx.Node]:
    """The forward phase of a joint graph: every node the forward outputs and the new values of
    mutated inputs (:func:`input_mutations_of`) depend on."""
    forward: set[fx.Node] = set()
    stack = [n for n in fwd_outputs if isinstance(n, fx.Node)] + [src for _dest, src in input_mutations]
    while stack:
        n = stack.pop()
        if n not in forward:
            forward.add(n)
            stack.extend(n.all_input_nodes)
    return forward


def rng_state_bytes(device: torch.device) -> int:
    """Bytes of the generator state a replay of a random op keeps."""
    if device.type == "cuda":
        return int(torch.cuda.get_rng_state(device).numel())
    return int(torch.get_rng_state().numel())


def joint_device(joint: torch.fx.GraphModule) -> torch.device:
    """The device of the first tensor the joint graph computes (CPU when none)."""
    for n in joint.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            return val.device
    return torch.device("cpu")


def capture_joint(
    joint: fx.GraphModule,
    num_fwd_outputs: int,
    *,
    cost_fn: CostFn | None = None,
    workspace_fn: Callable[[fx.Node], int] | None = None,
    name: str = "graph",
    transfer: dict | None = None,
    eager_inplace: bool = False,
) -> Capture:
    """Build the Graph of a joint graph; ``cost_fn(fx_node) -> seconds`` prices each op,
    ``workspace_fn(fx_node) -> bytes`` gives its scratch memory (see :mod:`remat.cost.workspace`),
    ``transfer`` the offload tier's costs, kept as ``graph.meta["transfer"]`` (see
    :mod:`remat.execute.transfer`; plans that offload need them). ``eager_inplace``: the graph is for
    remat's eager lowering, which writes an ``add`` or ``addmm`` into an input that dies there
    (:func:`inplace_accumulations`)."""
    fx_graph = joint.graph
    (output_node,) = fx_graph.find_nodes(op="output")
    outputs = list(output_node.args[0])
    fwd_outputs, bwd_outputs = outputs[:num_fwd_outputs], outputs[num_fwd_outputs:]

    input_mutations = input_mutations_of(fx_graph)

    forward = forward_phase(fwd_outputs, input_mutations)

    builder = GraphBuilder(name)
    value_id: dict[fx.Node, int] = {}
    value_node: list[fx.Node] = []
    alias_base: dict[fx.Node, int] = {}
    storage_owner: dict[int, int] = {}  # storage key -> value id
    primals, tangents = [], []
    devices: set[torch.device] = set()

    def add_value(fx_node: fx.Node, vid: int):
        value_id[fx_node] = vid
        value_node.append(fx_node)
        key = storage_key(fx_node.meta.get("val"))
        if key is not None:
            storage_owner.setdefault(key, vid)

    def meta_of(val) -> tuple:
        return (tuple(int(s) for s in val.shape), str(val.dtype).replace("torch.", ""))

    for n in fx_graph.find_nodes(op="placeholder"):
        val = n.meta.get("val")
        if isinstance(val, torch.SymInt) or (
            isinstance(val, torch.Tensor) and any(not isinstance(d, int) for d in val.shape)
        ):
            raise CaptureError(
                f"remat plans concrete graphs, but input {n.name} has a symbolic shape: make the joint graph "
                "concrete first (remat.capture.shapes.concrete_joint, as the backend does per bucket)"
            )
        nbytes = _storage_bytes(val) if isinstance(val, torch.Tensor) else 0
        shape, dtype = meta_of(val) if isinstance(val, torch.Tensor) else ((), "")
        if str(n.target).startswith("tangents"):
            tangents.append(n)
            add_value(n, builder.tangent(n.name, nbytes, shape, dtype))
        else:
            primals.append(n)
            add_value(n, builder.input(n.name, nbytes, shape, dtype))

    # tensor constants made in forward (``torch.tensor([...])``) are attributes of the joint graph
    for n in fx_graph.find_nodes(op="get_attr"):
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor):
            shape, dtype = meta_of(val)
            add_value(n, builder.input(n.name, _storage_bytes(val), shape, dtype))

    def base_of(arg: fx.Node) -> int | None:
        if arg in value_id:
            return value_id[arg]
        if arg in alias_base:
            return alias_base[arg]
        return None

    def input_values(n: fx.Node) -> list[int]:
        ids = []
        for arg in n.all_input_nodes:
            vid = base_of(arg)
            if vid is not None:
                ids.append(vid)
        return ids

    # FX nodes in the order Graph wants: forward ones first, then backward ones
    ops = [n for n in fx_graph.nodes if n.op == "call_function"]
    ordered = [n for n in ops if n in forward] + [n for n in ops if n not in forward]
    op_node: list[fx.Node] = []
    pending_getitems: dict[fx.Node, list[fx.Node]] = {}
    for n in ops:
        if n.target is operator.getitem and isinstance(n.args[0], fx.Node):
            pending_getitems.setdefault(n.args[0], []).append(n)

    shape_nodes: set[fx.Node] = set()
    for n in ordered:
        if n.target is operator.getitem:
            continue  # handled with its parent
        val = n.meta.get("val")
        if is_size_value(val):  # arithmetic on sizes (s0 * 768): no memory, lowered where read
            shape_nodes.add(n)
            continue
        phase = FORWARD if n in forward else BACKWARD
        if isinstance(val, torch.Tensor):
            devices.add(val.device)
            # a view: fold into its base, known from the op's schema or else from the storage its fake
            # tensor shares. The schema comes first: after Inductor's joint-graph passes a rewritten
            # view has a new fake tensor of its own (taken for a new value, it was freed at its last
            # direct read while a view of it was still to be made)
            view_of = _view_source(n)
            base = base_of(view_of) if view_of is not None else None
            if base is None:
                base = storage_owner.get(storage_key(val))
            if base is not None:
                alias_base[n] = base
                continue
            holders = [n]
        elif isinstance(val, (tuple, list)):
            holders = []
            for g in pending_getitems.get(n, []):
                gval = g.meta.get("val")
                if not isinstance(gval, torch.Tensor):
                    continue
                devices.add(gval.device)
                key = storage_key(gval)
                if key is not None and key in storage_owner:
                    alias_base[g] = storage_owner[key]  # e.g. split/unbind: views
                elif g not in holders:
                    holders.append(g)
        else:
            holders = []  # an op without tensor outputs

        if not holders and isinstance(val, (tuple, list)) and all(
            g in alias_base for g in pending_getitems.get(n, [])
        ):
            # a multi-output view op (split, unbind): nothing to compute, an alias of its input
            bases = [base_of(a) for a in n.all_input_nodes if base_of(a) is not None]
            if bases:
                alias_base[n] = bases[0]
            continue
        out_bytes, names, metas = [], [], []
        for h in holders:
            hval = h.meta["val"]
            out_bytes.append(_storage_bytes(hval))
            names.append(h.name)
            metas.append(meta_of(hval))
        outs = builder.op(
            n.name,
            input_values(n),
            out_bytes,
            phase=phase,
            cost=float(n.meta[GIVEN_COST] if GIVEN_COST in n.meta else cost_fn(n) if cost_fn else 1.0),
            workspace=int(n.meta[GIVEN_WORKSPACE] if GIVEN_WORKSPACE in n.meta else workspace_fn(n) if workspace_fn else 0),
            random=_is_random(n),
            op=_op_name(n),
            module=_module_path(n),
            output_names=names,
            output_meta=metas,
        )
        op_node.append(n)
        for h, vid in zip(holders, outs):
            add_value(h, vid)

    def out_value(x) -> int | None:
        return base_of(x) if isinstance(x, fx.Node) else None

    # inputs the step mutates (BatchNorm running statistics …): AOTAutograd writes their new
    # value back after the forward, so the backward must not read them again
    descs = output_node.meta.get("desc") or []
    mutated = set()
    for desc in descs:
        inp = getattr(desc, "mutated_input", None)
        idx = getattr(inp, "idx", None)
        if idx is not None and idx < len(primals):
            mutated.add(value_id[primals[idx]])
    mutated.update(value_id[dest] for dest, _src in input_mutations)  # mutated in the graph itself
    no_backward_recompute = []
    for nid, n in enumerate(op_node):
        reads = set(builder.nodes[nid].inputs)
        if reads & mutated and not is_batch_norm_with_stats(n):
            no_backward_recompute.append(nid)

    # optimizer steps inside the backward: [node, parameter] pairs; no node may read the parameter after
    optimizer_updates = [[nid, value_id[n.meta[UPDATES]]] for nid, n in enumerate(op_node) if UPDATES in n.meta]

    fwd_vals = [out_value(x) for x in fwd_outputs] + [out_value(src) for _dest, src in input_mutations]
    bwd_vals = [out_value(x) for x in bwd_outputs]
    # the joint graph returns one gradient per primal (None where it needs none)
    grad_inputs = (
        sorted(value_id[p] for p, g in zip(primals, bwd_outputs) if g is not None and p in value_id)
        if len(bwd_outputs) == len(primals) else None
    )
    device = next(iter(devices)) if devices else torch.device("cpu")
    warn_if_cuda_blocks_rounded(device)  # planned peaks meet CUDA's allocator here
    # Autograd holds the gradients it hands to the backward (the tangents) until the backward
    # returns: the engine's Python call keeps them, whatever the plan frees. So they count as
    # backward outputs, resident to the end, for every planner (measured: an MLP whose loss is taken
    # outside the model peaked one tangent, 2 MiB, above a plan that freed it at its last use).
    graph = builder.build(
        forward_outputs=[v for v in fwd_vals if v is not None],
        backward_outputs=[v for v in bwd_vals if v is not None] + [value_id[t] for t in tangents],
        meta={
            "rng_state_bytes": rng_state_bytes(device),
            "device": str(device),
            "mutated_inputs": sorted(mutated),
            "no_backward_recompute": no_backward_recompute,
            **({"grad_inputs": grad_inputs} if grad_inputs is not None else {}),
            **({"optimizer_updates": optimizer_updates} if optimizer_updates else {}),
            **(inplace_accumulations(op_node, builder, value_id, value_node) if eager_inplace else {}),
            **({"transfer": dict(transfer)} if transfer else {}),
        },
    )
    return Capture(
        joint=joint,
        graph=graph,
        num_fwd_outputs=num_fwd_outputs,
        op_node=op_node,
        value_node=value_node,
        alias_base=alias_base,
        value_id=value_id,
        primals=primals,
        tangents=tangents,
        fwd_outputs=fwd_outputs,
        bwd_outputs=bwd_outputs,
        input_mutations=input_mutations,
        shape_nodes=shape_nodes,
    )


"""Plan → forward FX graph + backward FX graph, in AOTAutograd's calling convention.

The lowering decides nothing: it replays the plan's instructions on copies of the
joint graph's FX nodes.

* ``compute(n)`` copies n's op node (and the ``getitem``s of a multi-output op) into the
  graph of the current phase; a recomputation is just another copy. Views the op reads
  are re-derived from the current copy of their base, so they cost nothing and never
  keep an old copy alive.
* ``free(v)`` forgets the current copy of v; FX's code generator (boxed convention, see
  :func:`remat.execute.runtime.boxed`) drops the tensor right after its last use, which is the
  same point.
* The forward returns ``forward outputs + saved values``; the backward takes
  ``saved values + tangents`` and returns the gradients: exactly what the AOTAutograd
  runtime expects from a partition function. Saved values are found on demand: the
  first time the backward reads a value it did not compute, it becomes a placeholder.
* An input mutation AOTAutograd kept in the joint graph (``copy_(primal, new)``) is written
  back once, when the forward ends, from the new value's copy current there.
* A random op that the plan runs more than once has its first run preceded by ``rng_state(device)``;
  every later run goes through ``replay_random(state, ...)``, so it draws the same numbers (an op
  run once keeps no state).
* ``offload(v)`` becomes ``h = stores.offload(store_id, v)`` and the copy of v is forgotten,
  so the tensor dies right after the call; ``reload(v)`` becomes ``stores.reload(store_id, h)``,
  and the first op that reads the reloaded tensor is preceded by ``stores.wait(store_id, h, t)``
  (the copy has landed; a no-op for the file store). A value offloaded when the forward ends is
  saved as its handle ``h`` (a 0-d int64 tensor), which the backward reloads. The store (one per
  lowered plan, :class:`remat.execute.offload.OffloadStore`) is held by both GraphModules. For a compiler
  (``compiled``) the two calls are the operators ``remat::offload`` and ``remat::reload``
  (:mod:`remat.execute.compiled_ops`), and the reload waits for its copy itself.
* For a compiler, an ``addmm`` into a running total of its own shape (a split weight gradient's
  chunks) is the opaque ``remat::addmm``: Inductor would unfuse the chain on a GPU and add every
  chunk's product at its end (:func:`remat.execute.compiled_ops.addmm`).
"""

from __future__ import annotations

import collections
import operator
import secrets

import torch
import torch.fx as fx

from ..capture.joint import Capture, is_batch_norm_with_stats, is_size_value
from ..errors import CaptureError, InvalidPlanError
from ..plan import COMPUTE, FREE, OFFLOAD, RELOAD, Plan, PlanGraphMismatchError
from . import offload as stores
from .offload import FILE_STORE, PINNED_STORE, OffloadStore, offload_directory
from .optimizer import is_optimizer_step
from .runtime import replay_random, rng_state


BATCH_NORM_NO_STATS = torch.ops.aten._native_batch_norm_legit.no_stats


class _Lowering:
    def __init__(self, capture: Capture, plan: Plan, compiled: bool = False, keep_apart=frozenset(),
                 offload_dir: str | None = None):
        if capture.graph.structural_hash != plan.graph.structural_hash:
            raise PlanGraphMismatchError("the plan", plan.graph.structural_hash, capture.graph)
        self.cap = capture
        self.plan = plan
        self.compiled = compiled  # for a compiler: random ops and offloads through registered operators
        self.keep_apart = frozenset(keep_apart)  # adds whose mm Inductor must not move to them
        self.fwd = fx.Graph()
        self.bwd = fx.Graph()
        self.computed: set[int] = set()  # nodes run at least once so far
        # random nodes the plan runs more than once: only their first run keeps the generator state
        # (the simulator counts ``rng_state_bytes`` for these alone)
        runs = collections.Counter(ins.target for ins in plan.instructions if ins.kind == COMPUTE)
        self.replayed = {nid for nid, count in runs.items() if count > 1 and plan.graph.nodes[nid].random}
        # instruction -> input value: an ``add`` the plan's simulation let write into that input
        self.in_place = ({i: v_in for i, v_in, _v_out in plan.simulation.reused}
                         if plan.graph.meta.get("inplace_eager") and not compiled else {})
        self.index = -1  # the instruction being lowered
        self.store = None
        if any(ins.kind in (OFFLOAD, RELOAD) for ins in plan.instructions):
            if compiled:  # the graph names its store by a number: see remat.execute.offload.compiled_store
                self.store_id, self.store_kind = secrets.randbits(62), offload_store_kind(plan.graph)
                if offload_dir is not None:
                    stores.COMPILED_DIRS[self.store_id] = offload_directory(offload_dir)
            else:
                self.store = OffloadStore(offload_store_kind(plan.graph), dir=offload_dir)
        self.fake_mode = None
        for n in capture.joint.graph.nodes:
            val = n.meta.get("val")
            if isinstance(val, torch._subclasses.FakeTensor):
                self.fake_mode = val.fake_mode
                break

    # ---------------------------------------------------------------- helpers
    def _reset_phase(self, graph: fx.Graph):
        self.graph = graph
        self.current: dict[int, fx.Node] = {}  # value id -> node holding its current copy
        self.alias_copies: dict[int, dict[fx.Node, fx.Node]] = {}  # base value id -> {joint alias node: copy}
        self.rng: dict[int, fx.Node] = {}  # graph node id -> its saved generator state
        self.handles: dict[int, fx.Node] = {}  # offloaded value id -> its handle
        self.unwaited: dict[int, fx.Node] = {}  # reloaded value id -> handle, until a read waits for it
        self.last_token: fx.Node | None = None  # compiled: the latest first run's token (orders the draws)
        self.shape_copies: dict[fx.Node, fx.Node] = {}  # size node of the joint graph -> its copy

    def _resolve(self, arg: fx.Node) -> fx.Node:
        cap = self.cap
        if arg.op == "get_attr":  # a constant: read it again wherever it is needed
            vid = cap.value_id[arg]
            if vid not in self.current:
                self.current[vid] = self.graph.node_copy(arg)
            return self.current[vid]
        if arg in cap.value_id:
            vid = cap.value_id[arg]
            if vid not in self.current:
                self.current[vid] = self._demand_saved(("value", vid))
            if vid in self.unwaited:  # first read of a reload: wait for its copy
                handle = self.unwaited.pop(vid)
                waited = self.graph.call_function(stores.wait, (self.store.id, handle, self.current[vid]))
                waited.meta.update(self.current[vid].meta)
                self.current[vid] = waited
            return self.current[vid]
        if arg in cap.shape_nodes:  # a size (s0 * 768): computed once per graph, where first read
            copy = self.shape_copies.get(arg)
            if copy is None and self.graph is self.bwd and arg in self.fwd_shape_copies:
                copy = self.shape_copies[arg] = self._demand_saved(("size", arg))  # read off a forward tensor
            if copy is None:
                copy = self.shape_copies[arg] = self.graph.node_copy(arg, self._resolve)
            return copy
        if arg in cap.alias_base:
            copies = self.alias_copies.setdefault(cap.alias_base[arg], {})
            copy = copies.get(arg)
            if copy is None:
                copy = self.graph.node_copy(arg, self._resolve)
                copies[arg] = copy
            return copy
        raise InvalidPlanError(f"cannot lower a read of {arg.name}: it is neither a value nor an alias")

    def _available(self, arg: fx.Node) -> bool:
        cap = self.cap
        if arg in cap.value_id:
            return arg.op == "get_attr" or cap.value_id[arg] in self.current
        if arg in cap.alias_base:
            return cap.alias_base[arg] in self.current
        if arg in cap.shape_nodes:
            return arg in self.shape_copies or all(self._available(a) for a in arg.all_input_nodes)
        return False

    def _size_reads_tensor(self, node: fx.Node) -> bool:
        return any(a not in self.cap.shape_nodes and not is_size_value(a.meta.get("val")) for a in node.all_input_nodes)

    def _emit_ready_sizes(self):
        """In the forward: copy each size read off a tensor (``sym_size(x, 1)``) as soon as its
        tensors exist, so that the backward takes the number, not the tensor (which may be gone)."""
        still = []
        for node in self.pending_sizes:
            if all(self._available(a) for a in node.all_input_nodes):
                self._resolve(node)
            else:
                still.append(node)
        self.pending_sizes = still

    def _forget_aliases_of(self, vid: int):
        self.alias_copies.pop(vid, None)

    def _device(self, node: fx.Node) -> str:
        val = node.meta.get("val")
        if isinstance(val, (tuple, list)):
            val = next((v for v in val if isinstance(v, torch.Tensor)), None)
        return str(val.device) if isinstance(val, torch.Tensor) else "cpu"

    def _fake_handle(self):
        if self.fake_mode is None:
            return None
        with self.fake_mode:
            return torch.empty((), dtype=torch.int64)

    def _fake_state(self, device: str, keep: bool = True):
        n = int(self.plan.graph.meta.get("rng_state_bytes", 16)) if keep else 0
        if self.fake_mode is None:
            return None
        with self.fake_mode:
            return torch.empty(n, dtype=torch.uint8)

    # ---------------------------------------------------------------- saved values (backward side)
    def _demand_saved(self, key) -> fx.Node:
        if self.graph is not self.bwd:
            raise InvalidPlanError(f"the forward reads {self._key_name(key)} before computing it")
        if key in self.saved_placeholder:
            return self.saved_placeholder[key]
        if key[0] == "size":
            src = self.fwd_shape_copies[key[1]]
        elif key[0] == "value":
            vid = key[1]
            if vid not in self.fwd_current:
                raise InvalidPlanError(
                    f"the backward reads {self.plan.graph.values[vid].name}, which is neither recomputed "
                    "nor resident when the forward ends"
                )
            src = self.fwd_current[vid]
        elif key[0] == "handle":
            src = self.fwd_handles[key[1]]
        else:
            src = self.fwd_rng[key[1]]
        with self.bwd.inserting_before(self.first_tangent):
            ph = self.bwd.placeholder(self._key_name(key))
        # FX renames a placeholder whose name a node already has (x_18 -> x_19) but keeps its target,
        # the argument's name in the generated code: two placeholders could then bind one variable
        ph.target = ph.name
        ph.meta.update(src.meta)
        self.saved_placeholder[key] = ph
        self.saved_order.append((key, src))
        return ph

    def _bind_saved_symbols(self):
        """AOTAutograd's order for a compiler's graphs with symbolic sizes: the backward reads every
        size symbol of what it takes in from a saved number that is that symbol, and saved numbers
        come first in the backward's inputs (last in the forward's outputs), those binding a symbol
        before those computed from them. Adds the binding numbers the backward does not read itself
        (Inductor sizes its inputs from them)."""
        from torch.fx.experimental.symbolic_shapes import free_symbols, is_symbol_binding_fx_node

        placeholders = list(self.bwd.find_nodes(op="placeholder"))
        needed = set()
        for ph in placeholders:
            needed |= free_symbols(ph.meta.get("val"))
        if not needed:
            return
        bound = {is_symbol_binding_fx_node(ph) for ph in placeholders} - {None}
        forward_bindings = {}
        for n in self.fwd.nodes:
            symbol = is_symbol_binding_fx_node(n)
            if symbol is not None:
                forward_bindings.setdefault(symbol, n)
        for symbol in sorted(needed - bound, key=str):
            src = forward_bindings.get(symbol)
            if src is None:  # as AOTAutograd's own partitioner: nothing to pass (the compiler says if it needs it)
                continue
            key = ("size", src)
            with self.bwd.inserting_before(self.first_tangent):
                ph = self.bwd.placeholder(f"size_{src.name}")
            ph.target = ph.name  # as in _saved: one argument name per placeholder
            ph.meta.update(src.meta)
            self.saved_placeholder[key] = ph
            self.saved_order.append((key, src))

        def rank(item) -> int:  # numbers that are a bare symbol, other numbers, tensors
            ph = self.saved_placeholder[item[0]]
            if not is_size_value(ph.meta.get("val")):
                return 2
            return 0 if is_symbol_binding_fx_node(ph) is not None else 1

        # stable: within each rank, the order the backward first read them in
        self.saved_order = sorted(self.saved_order, key=rank)
        anchor = self.first_tangent or next(n for n in self.bwd.nodes if n.op != "placeholder")
        for key, _src in self.saved_order:
            anchor.prepend(self.saved_placeholder[key])
        # the forward returns its tensors first, then its numbers (their order as in the backward)
        self.saved_order = ([item for item in self.saved_order if rank(item) == 2]
                            + [item for item in self.saved_order if rank(item) != 2])

    def _key_name(self, key) -> str:
        if key[0] == "size":
            return f"size_{key[1].name}"
        if key[0] == "value":
            return self.plan.graph.values[key[1]].name
        if key[0] == "handle":
            return f"{self.plan.graph.values[key[1]].name}_offloaded"
        return f"rng_state_{self.plan.graph.nodes[key[1]].name}"

    # ---------------------------------------------------------------- instructions
    def _compute_in_place(self, op: fx.Node, v_in: int) -> fx.Node:
        """``x + y`` as ``x.add_(y)`` (or ``y.add_(x)``), ``addmm(t, a, b)`` as ``t.addmm_(a, b)``, where the
        plan's simulation let the output take the storage of input ``v_in``, which dies here
        (:func:`remat.capture.joint.inplace_accumulations`)."""
        if op.target is torch.ops.aten.addmm.default:
            target, args = torch.ops.aten.addmm_.default, op.args
        else:
            first = 0 if self.cap.value_id.get(op.args[0]) == v_in else 1
            target, args = torch.ops.aten.add_.Tensor, (op.args[first], op.args[1 - first])
        new = self.graph.call_function(target, fx.map_arg(args, self._resolve), dict(op.kwargs))
        new.meta.update(op.meta)
        return new

    def _compute(self, nid: int):
        cap, g = self.cap, self.graph
        op = cap.op_node[nid]
        node = self.plan.graph.nodes[nid]
        stats_free = g is self.bwd and nid in self.computed and is_batch_norm_with_stats(op)
        self.computed.add(nid)
        offset = None  # compiled random op: its outputs are items offset.. of a list
        if node.random and self.compiled:
            new, offset = self._compute_random_compiled(nid, op)
        elif node.random:
            new = self._compute_random(nid, op)
        elif stats_free:  # same normalized output, running statistics left alone
            x, w, b, _rm, _rv, training, momentum, eps = op.args
            x, w, b = fx.map_arg((x, w, b), self._resolve)
            new = g.call_function(BATCH_NORM_NO_STATS, (x, w, b, training, momentum, eps))
            new.meta.update(op.meta)
        elif self.index in self.in_place:  # written into an input that dies here: bitwise the same result
            new = self._compute_in_place(op, self.in_place[self.index])
        elif self.compiled and _adds_into_a_total(op):  # opaque to Inductor: each product dies in its addmm
            from . import compiled_ops  # noqa: F401  (registers the operator)
            new = g.call_function(torch.ops.remat.addmm.default, fx.map_arg(op.args, self._resolve))
            new.meta.update(op.meta)
        elif nid in self.keep_apart:  # x + y as x - (-1) * y, bitwise: Inductor keeps the mm where it is
            new = g.call_function(torch.ops.aten.sub.Tensor, fx.map_arg(op.args, self._resolve), {"alpha": -1})
            new.meta.update(op.meta)
        else:
            new = g.node_copy(op, self._resolve)
        for vid in node.outputs:
            holder = cap.value_node[vid]
            if stats_free and holder.args[1] >= 3:
                continue  # new running statistics: the forward's copy is the one that counts
            if offset is not None:
                index = 0 if holder is op else holder.args[1]
                item = g.call_function(operator.getitem, (new, offset + index))
                item.meta.update(holder.meta)
                self.current[vid] = item
            elif holder is op:
                self.current[vid] = new
            else:  # a getitem of a multi-output op
                self.current[vid] = g.node_copy(holder, lambda _a: new)
            self._forget_aliases_of(vid)

    def _rng_state_of(self, nid: int) -> fx.Node | None:
        """The generator state of random node ``nid``'s first run, if it has run (in the
        backward: saved by the forward); None before its first run."""
        state = self.rng.get(nid)
        if state is None and self.graph is self.bwd and nid in self.fwd_rng:
            state = self._demand_saved(("rng", nid))
        return state

    def _compute_random(self, nid: int, op: fx.Node) -> fx.Node:
        g = self.graph
        device = self._device(op)
        state = self._rng_state_of(nid)
        if state is None and nid not in self.replayed:  # its only run: nothing to replay
            return g.node_copy(op, self._resolve)
        if state is None:  # first run: remember the generator state, then run as usual
            state = g.call_function(rng_state, (device,))
            state.meta["val"] = self._fake_state(device)
            self.rng[nid] = state
            return g.node_copy(op, self._resolve)
        args = fx.map_arg(op.args, self._resolve)
        kwargs = fx.map_arg(op.kwargs, self._resolve)
        new = g.call_function(replay_random, (state, device, op.target, *args), kwargs)
        new.meta.update(op.meta)
        return new

    def _compute_random_compiled(self, nid: int, op: fx.Node) -> tuple[fx.Node, int]:
        """A random op through :mod:`remat.execute.compiled_ops`: ``random_run`` on its first run (its
        outputs follow the generator state it read), ``random_replay`` on every later one."""
        from .compiled_ops import encode_call  # registers the operators

        g = self.graph
        device = self._device(op)
        args = fx.map_arg(op.args, self._resolve)
        kwargs = fx.map_arg(op.kwargs, self._resolve)
        call, tensors = encode_call(op.target, args, kwargs)
        if any(is_size_value(t.meta.get("val")) for t in tensors if isinstance(t, fx.Node)):
            raise CaptureError(
                f"remat cannot replay {op.target} under a compiler with sizes that change from call to call (its "
                "call is written for one size): use Inductor's own random numbers (no fallback_random), "
                "remat.optimize, or inputs of one size")
        outputs_val = op.meta.get("val")
        outputs_val = list(outputs_val) if isinstance(outputs_val, (tuple, list)) else [outputs_val]
        state = self._rng_state_of(nid)
        if state is None:  # its first run: its token orders the draws; its state is kept where it is replayed
            after = [self.last_token] if self.last_token is not None else []
            keep = nid in self.replayed
            run = g.call_function(torch.ops.remat.random_run.default, (device, call, tensors, after, keep))
            run.meta["val"] = [self._fake_state(device, False), self._fake_state(device, keep)] + outputs_val
            token = g.call_function(operator.getitem, (run, 0))
            token.meta["val"] = run.meta["val"][0]
            self.last_token = token
            if keep:
                state = g.call_function(operator.getitem, (run, 1))
                state.meta["val"] = run.meta["val"][1]
                self.rng[nid] = state
            return run, 2
        replay = g.call_function(torch.ops.remat.random_replay.default, (state, device, call, tensors))
        replay.meta["val"] = outputs_val
        return replay, 0

    def _free(self, vid: int):
        self.current.pop(vid, None)
        self.handles.pop(vid, None)  # an offloaded value: its entry goes with the handle
        self.unwaited.pop(vid, None)
        self._forget_aliases_of(vid)

    def _offload(self, vid: int):
        tensor = self._resolve(self.cap.value_node[vid])
        if self.compiled:
            from .compiled_ops import offload  # registers the operators

            handle = self.graph.call_function(offload._opoverload, (self.store_id, self.store_kind, tensor))
        else:
            handle = self.graph.call_function(stores.offload, (self.store.id, tensor))
        handle.meta["val"] = self._fake_handle()
        self.handles[vid] = handle
        self.current.pop(vid, None)
        self._forget_aliases_of(vid)

    def _reload(self, vid: int):
        handle = self.handles.pop(vid, None)
        if handle is None:  # offloaded when the forward ended: the forward saved its handle
            handle = self._demand_saved(("handle", vid))
        if self.compiled:  # one operator that returns once the copy has landed
            from .compiled_ops import reload

            val = self.cap.value_node[vid].meta["val"]
            tensor = self.graph.call_function(reload._opoverload, (
                self.store_id, self.store_kind, handle, list(val.shape), list(val.stride()), val.dtype, val.device))
        else:
            tensor = self.graph.call_function(stores.reload, (self.store.id, handle))
            self.unwaited[vid] = handle
        tensor.meta.update(self.cap.value_node[vid].meta)
        self.current[vid] = tensor

    def _run(self, instructions, offset: int = 0):
        for i, ins in enumerate(instructions, offset):
            self.index = i
            if ins.kind == COMPUTE:
                self._compute(ins.target)
                if self.pending_sizes and self.graph is self.fwd:
                    self._emit_ready_sizes()
                for n in reversed(self.graph.nodes):  # tag the op node for tracing tools
                    if n.op == "call_function" and n.target is not operator.getitem:
                        n.meta["remat_instruction"] = i
                        break
            elif ins.kind == FREE:
                self._free(ins.target)
            elif ins.kind == OFFLOAD:
                self._offload(ins.target)
            elif ins.kind == RELOAD:
                self._reload(ins.target)
            else:
                raise InvalidPlanError(f"lowering does not support {ins.kind} instructions yet")

    def _write_back_mutated_inputs(self):
        """``copy_(primal, new value)`` for each input mutation kept in the joint graph (BatchNorm's
        running statistics under Inductor), once, when the forward ends, as in the joint graph: every
        read of the old value (recomputations included) comes before it, and the capture keeps the
        ops that read it out of the backward. The new value is a forward output of the plan's graph,
        so it is resident here."""
        for dest, src in self.cap.input_mutations:
            primal = self.current[self.cap.value_id[dest]]
            new = self._resolve(src)
            write = self.fwd.call_function(torch.ops.aten.copy_.default, (primal, new))
            write.meta.update(dest.meta)

    # ---------------------------------------------------------------- driver
    def lower(self) -> tuple[fx.GraphModule, fx.GraphModule]:
        cap = self.cap
        # forward: primals in, ops, (outputs added once the backward says what it needs)
        self._reset_phase(self.fwd)
        self.fwd_shape_copies: dict = {}
        for p in cap.primals:
            ph = self.fwd.node_copy(p)
            self.current[cap.value_id[p]] = ph
        self.pending_sizes = [n for n in cap.joint.graph.nodes if n in cap.shape_nodes and self._size_reads_tensor(n)]
        self._emit_ready_sizes()
        self._run(self.plan.forward_instructions)
        fwd_user_outputs = [self._resolve(x) if isinstance(x, fx.Node) else x for x in cap.fwd_outputs]
        self._write_back_mutated_inputs()
        for vid in list(self.unwaited):  # reloads saved for the backward: landed before the forward returns
            self._resolve(cap.value_node[vid])
        self.fwd_current, self.fwd_rng, self.fwd_handles = dict(self.current), dict(self.rng), dict(self.handles)
        self.fwd_shape_copies = dict(self.shape_copies)

        # backward: saved values appear as placeholders on demand, then the tangents
        self.saved_placeholder: dict = {}
        self.saved_order: list = []
        self._reset_phase(self.bwd)
        tangent_nodes = [self.bwd.node_copy(t) for t in cap.tangents]
        self.first_tangent = tangent_nodes[0] if tangent_nodes else None
        for t, ph in zip(cap.tangents, tangent_nodes):
            self.current[cap.value_id[t]] = ph
        self._run(self.plan.backward_instructions, self.plan.boundary)
        # an optimizer step inside the backward returns a token: the parameter gets no gradient
        grads = [None if is_optimizer_step(x) else self._resolve(x) if isinstance(x, fx.Node) else x
                 for x in cap.bwd_outputs]
        self.bwd.output(tuple(grads))

        if self.compiled:
            self._bind_saved_symbols()
        saved_sources = [src for _key, src in self.saved_order]
        self.fwd.output(tuple(fwd_user_outputs + saved_sources))
        fwd_gm = fx.GraphModule(cap.joint, self.fwd)
        bwd_gm = fx.GraphModule(cap.joint, self.bwd)
        if self.store is not None:  # the graphs keep their store (and its folder) alive
            fwd_gm.remat_offload_store = bwd_gm.remat_offload_store = self.store
        fwd_gm.graph.lint()
        bwd_gm.graph.lint()
        return fwd_gm, bwd_gm


def offload_store_kind(graph) -> str:
    """The offload store a plan over ``graph`` uses: ``graph.meta['transfer']['store']`` when set,
    else pinned host memory on CUDA and the file store elsewhere."""
    kind = (graph.meta.get("transfer") or {}).get("store")
    if kind:
        return kind
    return PINNED_STORE if str(graph.meta.get("device", "cpu")).startswith("cuda") else FILE_STORE


def _adds_into_a_total(op: fx.Node) -> bool:
    """Whether ``op`` is ``addmm(total, a, b)`` with a total of the product's shape (not a bias it
    broadcasts) and no scaling: the link of a running sum of products."""
    if op.target is not torch.ops.aten.addmm.default or len(op.args) != 3 or op.kwargs:
        return False
    total, out = op.args[0].meta.get("val"), op.meta.get("val")
    return (isinstance(total, torch.Tensor) and isinstance(out, torch.Tensor) and total.shape == out.shape
            and total.dtype == out.dtype)


def lower(capture: Capture, plan: Plan, *, compiled: bool = False, keep_apart=frozenset(),
          offload_dir: str | None = None) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward GraphModules that execute ``plan`` (not yet boxed). ``compiled``: the
    graphs are for a compiler (Inductor), which needs registered operators only, so random ops,
    offloads and reloads run through :mod:`remat.execute.compiled_ops` (``remat::offload`` and
    ``remat::reload`` copy synchronously). ``keep_apart``: op ids of ``add``s written as
    ``sub(x, y, alpha=-1)`` (bitwise ``x + y``), so that Inductor does not fuse an earlier ``mm`` into
    them (:attr:`remat.inductor.fusion.Fused.deferred_adds`). ``offload_dir``: where the file store's
    folders go (:func:`remat.execute.offload.offload_directory`)."""
    return _Lowering(capture, plan, compiled, keep_apart, offload_dir).lower()


__all__ = ["lower", "offload_store_kind"]

"""Split the ops that set the peak into chunks of rows: a rewrite of the joint graph.

Below the largest op's working set no keep, recompute or offload plan exists: the LM head's
``[tokens, vocab]`` logits, their log-softmax and its gradient are each one value, whole. A
*split site* is a connected set of ops that are independent over the same ``N`` rows (the
tokens); rewritten into ``k`` chunks, each large value of the site exists one chunk of rows at a
time, and the planner may free and recompute a chunk like any other value::

    sites = find_sites(joint, num_fwd_outputs)          # where splitting helps
    chunked = split_joint(joint, sites, k=4)            # a joint graph, planned like any other

:func:`find_sites` grows each site from a seed (an op whose output is among the step's largest
values) across every edge that carries a large split value, using the rules of
:mod:`remat.capture.split_rules`; edges carrying small values (the hidden states, a weight, the
loss) are where the site reads its inputs and combines its outputs. A site's forward ops and its
backward ops are *segments*, more than one per phase where an op needs a value combined over
every chunk (a barrier's statistics, a sum: :mod:`remat.capture.split_order`); each runs chunk
after chunk (chunk 1's ops, then chunk 2's, ...) where the original ran the segment's first op.
Inputs split by rows are sliced (views: no memory); outputs split by rows are concatenated when
the segment ends; ``sum`` outputs are added up chunk by chunk (a weight's gradient: ``addmm`` into
the running total); ``mean`` divides the summed losses by the summed weights. A ``first`` output
(each chunk makes the same: an attention kernel's random-number state) is chunk 0's.

A joint graph captured with symbolic sizes is split on its copy made concrete at a bucket's edge,
given its :class:`~remat.capture.split_sizes.SymbolicSizes`: its sites are only those whose values
hold a whole number of rows per unit at every size, and every size the rewrite computes from the
sizes (chunk bounds, view shapes, a mean's or BatchNorm's count) is emitted as arithmetic on the
size inputs, so the split graph runs every size of the bucket.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
import sympy
import torch
import torch.fx as fx

from .joint import forward_phase, input_mutations_of
from .split_barriers import BARRIER_RULES
from .split_order import Entry, convex, run_order, segments
from .split_rules import FIRST, SUM, WHOLE, Split, State, rows_of, rule_for, val
from .split_sizes import Size, SizeEmitter, SymbolicSizes, chunk_bounds, count_of

aten = torch.ops.aten

SPLIT_FACTORS = (2, 4, 8, 16, 32)  # the chunk counts split="auto" tries, fewest first
# a split step repeats its chunks' ops k times: auto's exact and hybrid searches take minutes on it
# (a 4-chunk BatchNorm CNN of 314 nodes: 66 s), keep_set's DP seconds at a cost within a point of
# auto's (2.7% against 2.1% overhead there); auto runs in full only where keep_set cannot fit
SPLIT_FIRST_SOLVER = "keep_set"
# split="auto" where the step fits as captured: a plan whose predicted overhead (recomputation and
# stalls) is above FASTER_SPLIT_OVERHEAD is weighed against split plans, taken when predicted
# FASTER_SPLIT_GAIN faster (both lowerings: the eager backend and the Inductor partitioner)
FASTER_SPLIT_OVERHEAD = 0.02
FASTER_SPLIT_GAIN = 0.02
# a value counts as large for a site when it holds at least this fraction of the site's seed
LARGE_FRACTION = 0.25
# seeds: values holding at least this fraction of the step's largest value
SEED_FRACTION = 0.25


@dataclass
class Site:
    """Ops of one joint graph that split over the same ``rows``. ``states`` holds the state of
    every value the site makes (op nodes and ``getitem`` nodes), ``splits`` each op's rule result,
    ``reads`` the state in which each op reads each value from outside the site."""

    rows: int
    seed: fx.Node
    states: dict[fx.Node, State] = field(default_factory=dict)
    splits: dict[fx.Node, Split] = field(default_factory=dict)
    reads: dict[tuple[fx.Node, fx.Node], State] = field(default_factory=dict)  # (op, outside value) -> as read
    gain: int = 0  # bytes of large values that never exist whole, less those concatenated for outside readers

    @property
    def seed_bytes(self) -> int:
        """Bytes of the site's seed: its largest value."""
        return _nbytes(self.seed)

    def describe(self) -> str:
        ops = [str(n.target).split(".")[1] for n in self.splits if not _is_view_like(n)]
        return f"{len(ops)} ops over {self.rows} rows ({', '.join(dict.fromkeys(ops))})"


def _nbytes(node) -> int:
    v = val(node)
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    return 0


def _is_view_like(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and (node.target.is_view or node.target in (
        aten.detach.default, aten.alias.default))


def _rows_state(node, count: int) -> State:
    """How a value from outside a site enters it: by rows when its leading dims, mergeable into one,
    multiply to a multiple of ``count``; else whole."""
    v = val(node)
    state = rows_of(v.shape, count)
    if state is None:
        return WHOLE
    strides, sizes = v.stride(), v.shape
    mergeable = all(strides[i] == strides[i + 1] * sizes[i + 1] for i in range(state.lead - 1))
    return state if mergeable else WHOLE


def _forward_nodes(joint: fx.GraphModule, num_fwd_outputs: int) -> set[fx.Node]:
    """The joint graph's forward phase (as :func:`~remat.capture.joint.capture_joint` finds it), with
    every output of a forward op (a loss's total weight that only the backward reads)."""
    (output,) = joint.graph.find_nodes(op="output")
    seen = forward_phase(list(output.args[0])[:num_fwd_outputs], input_mutations_of(joint.graph))
    return seen | {u for n in seen for u in n.users if u.target is operator.getitem}


class _Grower:
    """Grows one site from its seed (see the module docstring)."""

    def __init__(self, seed: fx.Node, count: int, forward: set[fx.Node], taken: set[fx.Node]):
        self.site = Site(rows=count, seed=seed)
        self.large = _nbytes(seed) * LARGE_FRACTION
        self.closing = False  # paths out of the site and back have been taken in once
        self.forward, self.taken = forward, taken
        # try_add's answer for a node depends only on the states of the values it reads and on which
        # readers of its own values are in the site: a node refused is not tried again until an op
        # next to it (one making a value it reads, or reading one it makes) has been added since
        self._added = 0  # ops added so far
        self._refused: dict[fx.Node, int] = {}  # node -> self._added when it was last refused
        self._neighbour_added: dict[fx.Node, int] = {}  # node -> self._added when a neighbour was last added
        self._is_large: dict[fx.Node, bool] = {}

    def _seen(self, value: fx.Node, state: State, consumer: fx.Node) -> State:
        """The state in which ``consumer`` reads the site's ``value``: a sum, a mean or a ``first``
        value is combined when its segment ends, so the other phase reads it whole; a barrier's
        statistics are whole."""
        if state.kind == "stat" or (state.kind in ("sum", "mean", "first")
                                    and (value in self.forward) != (consumer in self.forward)):
            return WHOLE
        return state

    def state_of(self, consumer: fx.Node, reads: dict):
        """The state function a rule of ``consumer`` sees; the outside values it reads go to ``reads``."""
        def state(arg, whole: bool = False):
            if not isinstance(arg, fx.Node) or not isinstance(val(arg), torch.Tensor):
                return None
            s = self.site.states.get(arg)
            if s is not None:
                return self._seen(arg, s, consumer)
            reads[(consumer, arg)] = WHOLE if whole else _rows_state(arg, self.site.rows)
            return reads[(consumer, arg)]
        return state

    def try_add(self, node: fx.Node) -> bool:
        if node in self.site.splits or node in self.taken:
            return False
        if self._refused.get(node, -1) >= self._neighbour_added.get(node, 0):
            return False  # refused, and nothing it depends on has changed since
        if not self._admit(node):
            self._refused[node] = self._added
            return False
        self._added += 1
        for arg in node.all_input_nodes:  # the neighbours whose answer may now change
            self._neighbour_added[arg.args[0] if arg.target is operator.getitem else arg] = self._added
        for out in (node.users if not isinstance(val(node), torch.Tensor) else (node,)):
            for user in out.users:
                self._neighbour_added[user] = self._added
        return True

    def _large(self, node: fx.Node) -> bool:
        """Whether ``node``'s value is large enough to grow the site through (memoised: the loop asks often)."""
        large = self._is_large.get(node)
        if large is None:
            large = self._is_large[node] = _nbytes(node) >= self.large
        return large

    def _admit(self, node: fx.Node) -> bool:
        """Add ``node`` to the site if its rule splits it in the states its inputs are in, consistently
        with how the site's ops already read its values; True if it was added."""
        rule = self._filled if node.target in _FILLED else _rule(node)
        if rule is None:
            return False
        reads: dict = {}
        split = rule(node, self.state_of(node, reads))
        if split is None:
            return False
        outs = self._output_states(node, split)
        if outs is None:
            return False
        # a value the site already reads from outside must keep the state it was read in (sizes, such
        # as a flash kernel's max_q, are read as they are: no state)
        for out, state in outs.items():
            if not isinstance(val(out), torch.Tensor):
                continue
            for user in out.users:
                if user in self.site.splits and self._seen(out, state, user) != self.site.reads.get((user, out)):
                    return False
        self.site.splits[node] = split
        self.site.states.update(outs)
        self.site.reads.update(reads)
        for out in outs:  # now made inside
            for user in out.users:
                self.site.reads.pop((user, out), None)
        return True

    def _filled(self, node: fx.Node, _state_of) -> Split | None:
        """A tensor of one value (``full``: the zeros Inductor's max-pooling backward adds into) that
        only the site's ops read, all by rows in one state: each chunk makes its own rows of it."""
        states = {self.site.reads.get((user, node)) for user in node.users}  # (None: a reader outside)
        state = states.pop() if len(states) == 1 else None
        if state is None or state.kind != "rows":
            return None
        rest = [int(x) for x in val(node).shape[state.lead:]]
        return Split((state,), args=lambda a, kw, n: (([n * state.per, *rest], *a[1:]), kw))

    @staticmethod
    def _output_states(node: fx.Node, split: Split) -> dict[fx.Node, State] | None:
        if isinstance(val(node), torch.Tensor):
            return {node: split.outputs[0]}
        outs = {}
        for user in node.users:
            if user.target is not operator.getitem:
                return None
            outs[user] = split.outputs[user.args[1]]
        return outs

    def _close_paths(self) -> bool:
        """Take in the ops on paths that leave the site and come back within a phase (a layer norm's
        small ``var + eps``, ``rsqrt``): else the site could not run as blocks. True if any was."""
        inside = self.site.splits.keys() | self.site.states.keys()
        order = {n: i for i, n in enumerate(self.site.seed.graph.nodes)}
        reached: set[fx.Node] = set()
        stack = [u for n in inside for u in n.users if u not in inside and u.op == "call_function"]
        while stack:
            n = stack.pop()
            if n not in reached and n not in inside:
                reached.add(n)
                stack.extend(u for u in n.users if u.op == "call_function")
        between = {n for n in reached if any(u in inside and (u in self.forward) == (n in self.forward)
                                             for u in n.users)}
        stack = list(between)
        while stack:  # and whatever lies between the site and those
            n = stack.pop()
            for a in n.all_input_nodes:
                if a in reached and a not in between:
                    between.add(a)
                    stack.append(a)
        added = False
        for n in sorted(between, key=order.__getitem__):
            target = n.args[0] if n.target is operator.getitem else n
            added |= self.try_add(target)
        return added

    def grow(self, seeded: bool = False) -> Site | None:
        if not seeded and not self.try_add(self.site.seed):
            return None
        # Each round offers every reader of the site's large split values, then every producer of a
        # large value its ops read by rows, to try_add, in the site's order, until a round adds nothing.
        # An offer that can no longer succeed (a reader or producer in the site or in another, a value
        # made inside) is dropped for the later rounds: a round walks the site's frontier, not the
        # whole site (the same offers in the same order otherwise; a 446-op GPT-2 step: 8.1 -> 6.6 s)
        readers: list[list[fx.Node]] = []  # per value of the site, in its order: readers still offered
        reads: list[tuple[fx.Node, list[fx.Node]]] = []  # per op of the site, in its order: inputs still offered
        changed = True
        while changed:
            changed = False
            values = list(self.site.states.items())
            readers += [[u for u in value.users if u.target is not operator.getitem]
                        if state.split and self._large(value) else [] for value, state in values[len(readers):]]
            for users in readers[:len(values)]:
                for user in list(users):
                    if user in self.site.splits or user in self.taken:
                        users.remove(user)
                    else:
                        changed |= self.try_add(user)
            ops = list(self.site.splits)
            reads += [(op, list(op.all_input_nodes)) for op in ops[len(reads):]]
            for op, args in reads[:len(ops)]:
                for arg in list(args):
                    if arg in self.site.states or not self._large(arg) or (
                            not self.site.reads.get((op, arg), WHOLE).split):
                        args.remove(arg)  # made inside now, small, or read whole: for good
                        continue
                    producer = arg.args[0] if arg.target is operator.getitem else arg
                    if producer in self.taken:
                        args.remove(arg)
                        continue
                    changed |= self.try_add(producer)
        site = self._with_small_results_reduced()
        if site is not None or self.closing:
            return site
        # not convex: take in the ops on paths that leave the site and come back, and grow again
        self.closing = True
        return self.grow(seeded=True) if self._close_paths() else None

    def _with_small_results_reduced(self) -> Site | None:
        """The checked site, grown first through the readers of its per-row values (one number a row: a
        loss's) that leave it, as far as each reader makes no more bytes than that value, so that
        the site ends in sums over its chunks rather than in a concatenation; else as it was. (Under
        Inductor a concatenation computes its inputs where it runs, after every chunk: the LM head's
        per-row losses, gathered from each chunk's log-probabilities, kept all eight chunks alive.)"""
        before = (dict(self.site.states), dict(self.site.splits), dict(self.site.reads))
        splits, states = self.site.splits, self.site.states
        grown, changed = False, True
        while changed:
            changed = False
            for value, state in list(states.items()):
                if not state.split or _nbytes(value) >= self.large or val(value).numel() > self.site.rows * state.per:
                    continue  # only values of one number per row
                for user in list(value.users):
                    if user in splits or user in states or user.target is operator.getitem or (
                            _nbytes(user) > _nbytes(value)):
                        continue
                    if self.try_add(user):
                        changed = grown = True
        site = self._checked()
        if site is None and grown:
            self.site.states, self.site.splits, self.site.reads = before  # (copies the growth left alone)
            self._refused.clear()  # set back to an earlier state: every refusal may be stale
            site = self._checked()
        return site

    def _checked(self) -> Site | None:
        """The grown site, or None where it does not pay or cannot run as blocks (see grow)."""
        inside = self.site.splits.keys() | self.site.states.keys()
        internal = exits = 0
        for v, s in self.site.states.items():
            if s.split and any(u not in inside for u in v.users) and (
                    s.kind == "rows" and s.lead > 1 and not val(v).is_contiguous() or _memory_order(val(v)) is None):
                return None  # read outside in a layout its concatenation would not have
            if s.split and _nbytes(v) >= self.large and not _is_view_like(v):
                if all(u in inside for u in v.users):
                    internal += _nbytes(v)
                else:  # read outside: concatenated whole again
                    exits += _nbytes(v)
        self.site.gain = internal - exits
        if self.site.gain <= 0 or not all(convex(seg) for seg in segments(self.site, self.forward)):
            return None
        if run_order(list(self.site.seed.graph.nodes), [self.site], self.forward) is None:
            return None  # its stages and the ops between them would wait on each other
        return self.site


def _memory_order(v: torch.Tensor) -> list[int] | None:
    """The dims of ``v`` from outermost to innermost in memory, when ``v`` is a permutation of a
    contiguous tensor (None otherwise). Read off the sizes and strides: no op runs (``v`` may belong
    to another fake mode than the one active)."""
    perm = sorted(range(v.dim()), key=lambda d: (-v.stride(d), d))
    if 0 in v.shape:
        return perm
    expected = 1
    for d in reversed(perm):
        if v.shape[d] != 1 and v.stride(d) != expected:
            return None
        expected *= v.shape[d]
    return perm


def _rule(node: fx.Node):
    """The barrier rule of ``node``'s op, else its plain rule; where it has both (``var_mean``: over
    the batch a barrier, within each row a plain reduction), the first that takes the node."""
    barrier, plain = BARRIER_RULES.get(node.target), rule_for(node)
    if barrier is None or plain is None:
        return barrier or plain
    return lambda n, state_of: barrier(n, state_of) or plain(n, state_of)


def find_sites(joint: fx.GraphModule, num_fwd_outputs: int, sizes: SymbolicSizes | None = None) -> list[Site]:
    """The split sites of a joint graph, largest first: one grown from each op whose output holds at
    least ``SEED_FRACTION`` of the step's largest value and is not in an earlier site.

    A seed's rows may be counted in several units: its tokens ``B * T`` (a fine split, up to a
    chunk per token), or its sequences ``B`` (so batch-wise ops such as attention and convolutions
    join the site), or any row count of another seed that divides its own. The site with the
    largest :attr:`Site.gain` wins; on a tie, the finer one. ``sizes``: ``joint`` is a bucket's concrete
    copy of a graph with symbolic sizes, and only the sites that split at every size are kept."""
    forward = _forward_nodes(joint, num_fwd_outputs)
    ops = [n for n in joint.graph.nodes if n.op == "call_function" and isinstance(val(n), torch.Tensor)
           and val(n).dim() >= 2 and not _is_view_like(n)]
    if not ops or any(not isinstance(s, int) for n in ops for s in val(n).shape):
        return []  # symbolic sizes: not split
    biggest = max(_nbytes(n) for n in ops)
    seeds = [n for n in sorted(ops, key=_nbytes, reverse=True) if _nbytes(n) >= biggest * SEED_FRACTION]
    counts = sorted({c for n in seeds for c in _leading_counts(val(n).shape)}, reverse=True)
    sites: list[Site] = []
    taken: set[fx.Node] = set()
    for seed in seeds:
        if seed in taken:
            continue
        rows_here = math.prod(int(x) for x in val(seed).shape[:-1])
        grown = [_Grower(seed, count, forward, taken).grow() for count in counts if rows_here % count == 0]
        # under symbolic sizes a candidate that cannot split at every size gives way to the next best
        grown = [site for site in grown if site is not None and (sizes is None or sizes.refusal(site) is None)]
        if grown:
            best = max(grown, key=lambda site: (site.gain, site.rows))
            sites.append(best)
            taken.update(best.states)
            taken.update(best.splits)  # multi-output ops too: their values are their getitems
    return sites


def _leading_counts(shape) -> set[int]:
    """The products of a value's leading dims (all but the last), 2 or more."""
    return {c for c in (math.prod(int(x) for x in shape[:lead]) for lead in range(1, len(shape))) if c >= 2}


def split_info(chunks: int | tuple[int, ...], sites: list[Site]) -> dict:
    """What a plan of a split step records in ``plan.info["split"]``: ``chunks``, the largest site's count
    (``site_chunks``: each site's, where they differ)."""
    if isinstance(chunks, int):
        return {"chunks": chunks, "sites": [site.describe() for site in sites]}
    return {"chunks": max(chunks), "site_chunks": list(chunks), "sites": [site.describe() for site in sites]}


def split_joint(joint: fx.GraphModule, num_fwd_outputs: int, sites: list[Site], k: int | tuple[int, ...],
                sizes: SymbolicSizes | None = None) -> fx.GraphModule:
    """A copy of ``joint`` with every site run in ``k`` chunks of rows (fewer when a site has fewer rows;
    a tuple: each site's count, :func:`site_chunks`; a site of 1 is left as it is).
    ``sizes``: ``joint`` is a bucket's concrete copy of a graph with symbolic sizes (``k`` then as
    :meth:`~remat.capture.split_sizes.SymbolicSizes.allows`): chunks follow the sizes at run time."""
    counts = (k,) * len(sites) if isinstance(k, int) else tuple(k)
    kept = [(site, c) for site, c in zip(sites, counts, strict=True) if c > 1]
    return _Rewriter(joint, num_fwd_outputs, [site for site, _ in kept], {id(site): c for site, c in kept}, sizes).run()


# views and expands whose size argument a rule rewrites for a chunk (``[n * per, *rest]``)
_SHAPED = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default)
# tensors of one value, made by rows when only a site's ops read them (their size argument first)
_FILLED = (aten.full.default,)


class _Rewriter:
    def __init__(self, joint: fx.GraphModule, num_fwd_outputs: int, sites: list[Site], counts: dict[int, int],
                 sizes: SymbolicSizes | None = None):
        self.joint, self.sites, self.counts, self.sizes = joint, sites, counts, sizes  # counts: id(site) -> k
        self.forward = _forward_nodes(joint, num_fwd_outputs)
        self.graph = fx.Graph()
        self.env: dict[fx.Node, fx.Node] = {}  # original node -> its whole value in the new graph
        self.chunks: dict[fx.Node, list[fx.Node]] = {}  # split value -> its chunks
        self.slices: dict[tuple, fx.Node] = {}
        self.contexts: dict[fx.Node, object] = {}  # barrier -> what its combine hands its apply pass
        placeholders = list(joint.graph.find_nodes(op="placeholder"))
        # the inputs' own mode: under a compiler's tracing context, detect_fake_mode would return the
        # context's (symbolic) mode first, not the one a bucket's concrete copy was sized in
        fakes = [v for v in map(val, placeholders) if isinstance(v, torch._subclasses.FakeTensor)]
        self.fake_mode = fakes[0].fake_mode if fakes else torch._guards.detect_fake_mode()
        self.emit_size = None if sizes is None else SizeEmitter(sizes, self.graph, lambda i: self.env[placeholders[i]])

    # -- emitting ------------------------------------------------------------------------------
    def _call(self, target, args, kwargs=None, meta_from: fx.Node | None = None) -> fx.Node:
        if self.emit_size is not None:  # sizes that vary with the symbols: arithmetic on the size inputs
            args, kwargs = self.emit_size.args(tuple(args)), self.emit_size.args(dict(kwargs or {}))
        node = self.graph.call_function(target, tuple(args), dict(kwargs or {}))
        if meta_from is not None:
            node.meta = {k: v for k, v in meta_from.meta.items() if k != "val"}
        fake_args, fake_kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
        return node

    def _rows(self, site: Site, arg: fx.Node, state: State, units):
        """Rows of ``arg`` (split in ``state``) in ``units`` of the site: an int, or a :class:`Size`
        under symbolic sizes."""
        if self.sizes is None:
            return units * state.per
        return units * Size(self.sizes.per(arg, state, site))

    def _bounds(self, site: Site) -> list[tuple]:
        k = max(1, min(self.counts[id(site)], site.rows))
        return chunk_bounds(site.rows if self.sizes is None else self.sizes.units(site), k)

    def _input_chunk(self, site: Site, arg: fx.Node, consumer: fx.Node, c: int, bounds) -> fx.Node:
        """A tensor argument of ``consumer``'s chunk ``c``."""
        state = site.states.get(arg)
        if state is not None and state.split:
            return self.chunks[arg][c]
        if state is not None or not isinstance(val(arg), torch.Tensor):
            return self.env[arg]  # a combined sum, or a size
        state = site.reads[(consumer, arg)]
        if not state.split:
            return self.env[arg]
        # (sites may run in different counts: chunk c of 2 is not chunk c of 8)
        key = (arg, site.rows if self.sizes is None else self.sizes.units(site), state, len(bounds), c)
        if key not in self.slices:
            base = self.env[arg]
            if state.lead > 1:
                rest = val(arg).shape[state.lead:] if self.sizes is None else map(Size, self.sizes.shape(arg)[state.lead:])
                base = self._call(aten.view.default, (base, [self._rows(site, arg, state, bounds[-1][1]), *rest]))
            start, end = bounds[c]
            self.slices[key] = self._call(aten.slice.Tensor, (base, 0, self._rows(site, arg, state, start),
                                                              self._rows(site, arg, state, end)))
        return self.slices[key]

    def _barrier_count(self, site: Site, node: fx.Node, start, end) -> Size:
        """Elements per channel of a barrier's ``[rows, C, *spatial]`` chunk of units ``[start, end)``,
        under symbolic sizes: its first split input's rows in the chunk times its spatial sizes."""
        for arg in node.all_input_nodes:
            state = site.states.get(arg) or site.reads.get((node, arg))
            if state is not None and state.split:
                spatial = Size(sympy.Mul(*self.sizes.shape(arg)[2:]))
                return (self._rows(site, arg, state, end) - self._rows(site, arg, state, start)) * spatial
        raise AssertionError(f"{node.name}: a barrier with no input split by rows")

    def _emit(self, target, *args, **kwargs) -> fx.Node:
        return self._call(target, args, kwargs)

    def _segment(self, site: Site, segment: list[Entry]) -> None:
        bounds = self._bounds(site)
        totals: dict[fx.Node, fx.Node] = {}  # sum/mean value -> its running total
        partials: dict[fx.Node, list] = {}  # barrier -> its chunks' partial results
        for c, (start, end) in enumerate(bounds):
            for node, part in segment:
                if part == "result":
                    continue
                if node.target is operator.getitem:
                    chunk = self._call(operator.getitem, (self.chunks[node.args[0]][c], node.args[1]), meta_from=node)
                    self._record(site, node, chunk, totals)
                    continue
                split = site.splits[node]
                args, kwargs = fx.node.map_arg((node.args, node.kwargs),
                                               lambda a: self._input_chunk(site, a, node, c, bounds))
                if part == "reduce":
                    count = None if self.sizes is None else self._barrier_count(site, node, start, end)
                    partials.setdefault(node, []).append(split.barrier.reduce(self._emit, args, count))
                    continue
                if part == "apply":
                    outs = split.barrier.apply(self._emit, args, self.contexts[node])
                    for user in node.users:
                        if user.args[1] in outs:
                            self.chunks.setdefault(user, []).append(outs[user.args[1]])
                    continue
                if split.args is not None:
                    args, kwargs = split.args(args, kwargs, end - start)
                if self.sizes is not None and node.target in _SHAPED:  # the chunk's shape, evaluated at run time
                    args = (args[0], self.sizes.chunk_shape(node, site.states[node], site, end - start), *args[2:])
                if self.sizes is not None and node.target in _FILLED:
                    args = (self.sizes.chunk_shape(node, site.states[node], site, end - start), *args[1:])
                if split.addmm and c > 0:
                    chunk = self._call(aten.addmm.default, (totals[node], *args), meta_from=node)
                    totals[node] = chunk
                    self.chunks.setdefault(node, []).append(chunk)
                    continue
                chunk = self._call(split.target or node.target, args, kwargs, meta_from=node)
                if isinstance(val(node), torch.Tensor):
                    self._record(site, node, chunk, totals)
                else:
                    self.chunks.setdefault(node, []).append(chunk)
        for node, parts in partials.items():  # a barrier's whole results, between its two passes
            args = fx.node.map_arg(node.args, lambda a: self._input_chunk(site, a, node, 0, bounds))
            outs, self.contexts[node] = site.splits[node].barrier.combine(self._emit, parts, args)
            for user in node.users:
                if user.args[1] in outs:
                    self.env[user] = outs[user.args[1]]
        self._combine(site, [n for n, part in segment if part in ("op", "result")], totals)

    def _record(self, site: Site, node: fx.Node, chunk: fx.Node, totals: dict) -> None:
        self.chunks.setdefault(node, []).append(chunk)
        if site.states[node].kind in ("sum", "mean"):
            previous = totals.get(node)
            totals[node] = chunk if previous is None else self._call(aten.add.Tensor, (previous, chunk), meta_from=node)

    def _concatenated(self, node: fx.Node, state: State) -> fx.Node:
        """The chunks of a split value, whole again, laid out as the original (an outside view may
        rely on its strides): concatenated in the original's memory order, then permuted back."""
        dim = 0 if state.kind == "rows" else 1
        perm = _memory_order(val(node)) if state.kind == "cols" or state.lead == 1 else None
        if perm is None or perm == list(range(len(perm))):
            return self._call(aten.cat.default, (self.chunks[node], dim), meta_from=node)
        parts = [self._call(aten.permute.default, (c, perm)) for c in self.chunks[node]]
        whole = self._call(aten.cat.default, (parts, perm.index(dim)))
        return self._call(aten.permute.default, (whole, [perm.index(d) for d in range(len(perm))]), meta_from=node)

    def _total_weight(self, site: Site, op: fx.Node, totals: dict) -> fx.Node:
        """The summed total weight of a split ``nll_loss_forward`` (its output 1)."""
        for user in op.users:
            if user.target is operator.getitem and user.args[1] == 1 and user in totals:
                return totals[user]
        total = None
        for chunk in self.chunks[op]:
            weight = self._call(operator.getitem, (chunk, 1))
            total = weight if total is None else self._call(aten.add.Tensor, (total, weight))
        return total

    def _combine(self, site: Site, segment: list[fx.Node], totals: dict) -> None:
        """The whole value of each of the segment's values that anything outside it reads."""
        for node in segment:
            state = site.states.get(node)
            if state is None or state.kind == "stat" or (
                    node.target is not operator.getitem and not isinstance(val(node), torch.Tensor)):
                continue
            if state == FIRST:  # each chunk's is the same (an attention kernel's random-number state)
                self.env[node] = self.chunks[node][0]
                continue
            if state.split:
                if all(u in site.states or u in site.splits for u in node.users):
                    continue
                whole = self._concatenated(node, state)
            elif state == SUM:
                whole = totals[node]
                op = node.args[0] if node.target is operator.getitem else node
                split = site.splits[op]
                if split.divide != 1:  # a mean: the summed parts over the count
                    divide = split.divide if self.sizes is None else Size(
                        count_of(self.sizes.shape(op.args[0]), split.divide_dims))
                    whole = self._call(aten.div.Tensor, (whole, divide), meta_from=node)
            else:  # mean: the summed losses over the summed total weights
                weight = self._total_weight(site, node.args[0], totals)
                whole = self._call(aten.div.Tensor, (totals[node], weight), meta_from=node)
            shape = list(val(node).shape)
            if list(val(whole).shape) != shape:
                if self.sizes is not None:
                    shape = [Size(s) for s in self.sizes.shape(node)]
                whole = self._call(aten.view.default, (whole, shape), meta_from=node)
            self.env[node] = whole

    def run(self) -> fx.GraphModule:
        units = run_order(list(self.joint.graph.nodes), self.sites, self.forward)
        assert units is not None, "split sites that wait on each other"  # find_sites checks each site
        output_node = None
        for unit, members in units:
            if members is not None:
                self._segment(self.sites[unit[0]], members)
            elif unit.op == "output":
                output_node = unit
            else:
                self.env[unit] = self.graph.node_copy(unit, lambda a: self.env[a])
        assert output_node is not None
        out = self.graph.output(fx.node.map_arg(output_node.args[0], lambda a: self.env[a]))
        out.meta = dict(output_node.meta)
        return fx.GraphModule(self.joint, self.graph)


__all__ = ["Site", "SPLIT_FACTORS", "SPLIT_FIRST_SOLVER", "find_sites", "split_info", "split_joint"]

"""Splits of a step captured with symbolic sizes: chunk bounds computed from the sizes at run time.

A step captured with dynamic shapes is planned per bucket, on a copy of its joint graph made
concrete at the bucket's edge (:mod:`remat.capture.shapes`), and the lowered graphs run every size
of the bucket. A split of that copy (:mod:`remat.capture.split`) would slice fixed row ranges; here
every size the split graph computes from the rows is an expression in the size symbols instead,
emitted as FX arithmetic on the symbol inputs (``sym_size(input, d)``), so the chunks follow the
rows at hand: with ``N`` units at run time, chunk ``c`` of ``k`` is units
``[floor(c N / k), floor((c + 1) N / k))``.

Every value a site splits holds ``per`` rows for each unit, then sizes after its rows; both may be
expressions (``per = T`` for a ``[B * T, D]`` value of a site over ``B`` sequences, ``[T, T]``
attention scores after their ``B * H`` rows), and a chunk of ``n`` units is shaped ``[n * per,
*rest]`` with both evaluated at run time (views and expands inside the site are called with that
shape). A site does not split under symbolic sizes where ``per`` is not a whole polynomial in the
symbols (rows that are not a whole number of units at every size). BatchNorm's two passes count
each chunk's elements per channel the same way (:mod:`remat.capture.split_barriers`). The plan is
made at the edge, where every chunk has
``N_edge / k`` units; ``k`` must divide ``N_edge`` and be at most the bucket's smallest ``N``, so that
no chunk at a smaller size is larger than at the edge (``ceil(N / k) <= N_edge / k``) and none is
empty: the edge's plan then holds for the whole bucket, as it does unsplit.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import sympy
import torch
import torch.fx as fx
from torch.utils._sympy.functions import FloorDiv

from .shapes import size_expr, symbol_sources

aten = torch.ops.aten


@dataclass(frozen=True)
class Size:
    """A size that varies with the symbols (a sympy expression): what a split rule's arguments
    function computes from the chunk's units ``n`` under symbolic sizes (``n * per``)."""

    expr: sympy.Expr

    def _other(self, x):
        return x.expr if isinstance(x, Size) else sympy.Integer(x)

    def __mul__(self, x):
        return Size(self.expr * self._other(x))

    __rmul__ = __mul__

    def __add__(self, x):
        return Size(self.expr + self._other(x))

    __radd__ = __add__

    def __sub__(self, x):
        return Size(self.expr - self._other(x))


@dataclass
class SymbolicSizes:
    """The symbolic sizes behind a joint graph made concrete at a bucket's edge: ``symbolic`` is the
    joint graph as captured (its fake tensors sized by expressions), ``low`` and ``high`` the
    bucket's ends (``{symbol: value}``); the concrete copy's nodes have the symbolic graph's names."""

    symbolic: fx.GraphModule
    low: dict
    high: dict
    _shapes: dict = field(default_factory=dict, repr=False)
    _units: dict = field(default_factory=dict, repr=False)  # (seed name, rows) -> the site's unit count

    def __post_init__(self):
        for n in self.symbolic.graph.nodes:
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                self._shapes[n.name] = tuple(size_expr(s) for s in v.shape)
        self.sources = symbol_sources(self.symbolic)

    def shape(self, node: fx.Node) -> tuple:
        """The sizes of ``node``'s tensor as sympy expressions (by name: the concrete copy's node)."""
        return self._shapes[node.name]

    def at(self, expr, binding: dict) -> int:
        return int(sympy.sympify(expr).xreplace({s: sympy.Integer(v) for s, v in binding.items()}))

    def units(self, site) -> sympy.Expr | None:
        """The site's unit count ``N`` as an expression: the rows of a value holding one row per unit
        (the seed's first), else the seed's rows over its ``per`` (None where that is not whole)."""
        key = (site.seed.name, site.rows)
        found = self._units.get(key, False)
        if found is not False:
            return found
        one_per_unit = [n for n, s in site.states.items() if s.kind == "rows" and s.per == 1 and n.name in self._shapes]
        state = site.states[site.seed]
        if one_per_unit:
            node = site.seed if site.seed in one_per_unit else one_per_unit[0]
            rows = sympy.Mul(*self.shape(node)[: site.states[node].lead])
        else:
            rows = sympy.expand(sympy.Mul(*self.shape(site.seed)[: state.lead]) / state.per)
        if not _whole_polynomial(rows) or self.at(rows, self.high) != site.rows:
            rows = None
        self._units[key] = rows
        return rows

    def per(self, node: fx.Node, state, site) -> sympy.Expr | None:
        """Rows of ``node``'s value (split in ``state``) for each of the site's units, as an expression
        (None when it is not a whole polynomial: not a whole number at every size)."""
        shape = self.shape(node)
        rows = shape[1] if state.kind == "cols" else sympy.Mul(*shape[: state.lead])
        per = sympy.expand(rows / self.units(site))
        return per if _whole_polynomial(per) and self.at(per, self.high) == state.per else None

    def chunk_shape(self, node: fx.Node, state, site, n: Size) -> list:
        """The shape of a chunk of ``n`` units of ``node``'s value (split by rows in ``state``)."""
        return [n * Size(self.per(node, state, site)), *(Size(s) for s in self.shape(node)[state.lead:])]

    def refusal(self, site) -> str | None:
        """Why ``site`` cannot split under symbolic sizes (None: it can; see the module docstring)."""
        units = self.units(site)
        if units is None:
            return "its rows are not a whole number of units at every size"
        if self.at(units, self.low) < 2:
            return "the bucket's smallest size has a single row"
        values = [(n, s) for n, s in site.states.items() if s.split and isinstance(n.meta.get("val"), torch.Tensor)]
        values += [(n, s) for (_, n), s in site.reads.items() if s.split]
        emittable = {source[2] for source in self.sources}
        if not _emittable(units, emittable):
            return f"its unit count {units} cannot be computed from the inputs' sizes"
        for node, state in values:
            per = self.per(node, state, site)
            if per is None:
                return f"{node.name}'s rows are not a whole number per unit at every size"
            if not all(_emittable(e, emittable) for e in (per, *self.shape(node))):
                return f"{node.name}'s sizes {self.shape(node)} cannot be computed from the inputs' sizes"
        return None

    def allows(self, sites: list, k: int) -> bool:
        """Whether ``k`` chunks keep every chunk at run time within its size at the edge and non-empty."""
        return all(site.rows % k == 0 and self.at(self.units(site), self.low) >= k for site in sites)


def _emittable(expr, symbols: set) -> bool:
    """Whether :class:`SizeEmitter` can compute ``expr`` at run time: sums, products, positive integer
    powers and floor divisions of integers and symbols that an input's size gives."""
    if expr.is_Integer:
        return True
    if isinstance(expr, sympy.Symbol):
        return expr in symbols
    if isinstance(expr, sympy.Pow):
        return expr.exp.is_Integer and expr.exp > 0 and _emittable(expr.base, symbols)
    if isinstance(expr, (sympy.Add, sympy.Mul, FloorDiv)):
        return all(_emittable(arg, symbols) for arg in expr.args)
    return False


def _whole_polynomial(expr) -> bool:
    if not expr.free_symbols:
        return expr.is_Integer
    try:
        return all(c.is_Integer for c in sympy.Poly(expr, *sorted(expr.free_symbols, key=str)).coeffs())
    except sympy.PolynomialError:
        return False


class SizeEmitter:
    """Emits the FX arithmetic that computes a :class:`Size` at run time in a rewritten graph: each
    symbol read once off an input (``sym_size``, or the input itself where it is the symbol), each
    expression emitted once; every node's ``val`` is its value at the bucket's edge."""

    def __init__(self, sizes: SymbolicSizes, graph: fx.Graph, input_node):
        self.sizes, self.graph, self.input_node = sizes, graph, input_node  # input_node(i): the graph's input i
        self.emitted: dict = {}

    def __call__(self, size):
        """``size`` as an FX argument: an int where it does not vary, else a node."""
        expr = size.expr if isinstance(size, Size) else sympy.sympify(size)
        if expr.is_Integer:
            return int(expr)
        found = self.emitted.get(expr)
        if found is None:
            found = self.emitted[expr] = self._emit(expr)
        return found

    def args(self, x):
        """``x`` (arguments, nested in lists and tuples) with every :class:`Size` emitted."""
        if isinstance(x, Size):
            return self(x)
        if isinstance(x, (list, tuple)):
            return type(x)(self.args(v) for v in x)
        if isinstance(x, dict):
            return {k: self.args(v) for k, v in x.items()}
        return x

    def _node(self, target, args, expr) -> fx.Node:
        node = self.graph.call_function(target, args)
        node.meta["val"] = self.sizes.at(expr, self.sizes.high)
        return node

    def _emit(self, expr):
        if isinstance(expr, sympy.Symbol):
            found = next((source for source in self.sizes.sources if source[2] == expr), None)
            if found is None:  # refusal() turns such sites down first
                raise NotImplementedError(f"remat cannot read the size {expr} off any input")
            index, dim, _ = found
            if dim is None:
                return self.input_node(index)
            return self._node(aten.sym_size.int, (self.input_node(index), dim), expr)
        if isinstance(expr, (sympy.Add, sympy.Mul)):
            combine = operator.add if isinstance(expr, sympy.Add) else operator.mul
            terms = [self(term) for term in expr.args]
            total = terms[0]
            for i, term in enumerate(terms[1:], start=2):
                total = self._node(combine, (total, term), expr.func(*expr.args[:i]))
            return total
        if isinstance(expr, FloorDiv):
            return self._node(operator.floordiv, (self(expr.args[0]), self(expr.args[1])), expr)
        if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
            return self(sympy.Mul(*[expr.base] * int(expr.exp), evaluate=False))
        raise NotImplementedError(f"remat cannot compute the size {expr} at run time")


def chunk_counts(sizes: SymbolicSizes | None, sites: list, candidates) -> list[int]:
    """The chunk counts among ``candidates`` that a split of ``sites`` may use: every one for a step
    of fixed sizes, under symbolic ``sizes`` those it :meth:`~SymbolicSizes.allows`."""
    return [k for k in candidates if sizes is None or sizes.allows(sites, k)]


def chunk_bounds(units, k: int) -> list[tuple]:
    """Chunk ``c`` of ``k`` over ``units`` (an int, or a sympy expression): ``[floor(cN/k), floor((c+1)N/k))``."""
    if isinstance(units, int):
        return [(c * units // k, (c + 1) * units // k) for c in range(k)]
    cuts = [Size(sympy.Integer(0))] + [Size(FloorDiv(c * units, k)) for c in range(1, k)] + [Size(units)]
    return list(zip(cuts[:-1], cuts[1:]))


def count_of(shape: tuple, dims) -> sympy.Expr:
    """The number of elements over ``dims`` of ``shape`` (every dim: None)."""
    return sympy.Mul(*(shape if dims is None else [shape[d] for d in dims]))


__all__ = ["Size", "SymbolicSizes", "SizeEmitter", "chunk_bounds", "chunk_counts", "count_of"]

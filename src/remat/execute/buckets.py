"""One captured step, a plan per shape bucket: the runtime of a graph captured with dynamic sizes.

AOTAutograd hands the partition function one joint graph whose sizes are symbols, and expects one
forward and one backward graph back, with a fixed list of what the forward saves. remat's plans
differ per bucket (what they keep, recompute and offload), so the graphs returned here are two
dispatchers:

* **forward**: bind the symbols from the inputs (:func:`remat.capture.shapes.bind_symbols`), find
  the bucket (an upper edge per symbol), plan it the first time it is seen (the joint graph made
  concrete at the edges, captured, planned, lowered; kept for the life of the step), run that
  bucket's forward, and return the user's outputs plus **one** saved object: a
  :class:`SavedByBucket` holding the bucket and whatever its plan keeps for the backward;
* **backward**: run the same bucket's backward on what the object holds (emptied as it is taken,
  so every saved tensor dies at its last use, as with AOTAutograd's own saved tensors).

The saved object is an *opaque object* to AOTAutograd (a registered reference type), which keeps it
on the autograd context and hands it back to the backward: the count of what the forward saves is
then one at every bucket. A bucket's plan is made at its edge and runs every size in it unchanged,
because no buffer of a smaller size is larger (checked per bucket, :func:`check_monotone`).
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx
from torch._opaque_base import OpaqueBase

from ..capture.shapes import (bind_symbols, bucket_of, concrete_joint, lower_end, name_bucket, refuse_unless_monotone,
                              symbol_sources)
from ..errors import CaptureError, InfeasibleBudgetError
from .runtime import boxed


def _random_state_kept():
    """Restore every generator's state (CPU, and CUDA where initialised) on exit."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    return torch.random.fork_rng(devices=devices)


class SavedByBucket(OpaqueBase):
    """What one forward of a bucketed step keeps for its backward: the bucket's lowered pair and the
    values its plan saves (taken, and so released, by the backward)."""

    __slots__ = ("bucket", "values")

    def __init__(self, bucket, values):
        self.bucket, self.values = bucket, values

    def take(self) -> list:
        values, self.values = self.values, None
        if values is None:
            raise RuntimeError("remat: this step's backward ran twice; call backward(retain_graph=True) only "
                               "without remat, or run the forward again")
        return values


def _saved_meta():
    """The ``val`` the graphs record for the saved object. torch 2.13's AOTAutograd counts any opaque
    value saved for the backward; 2.11's only a ``FakeScriptObject`` (else it takes the object for a
    tensor and fails its version check), so the object is wrapped in one there."""
    from torch._functorch._aot_autograd import graph_compile

    if hasattr(graph_compile, "is_opaque_node"):
        return SavedByBucket(None, None)
    from torch._library.fake_class_registry import FakeScriptObject

    return FakeScriptObject(SavedByBucket(None, None), "SavedByBucket", None)


def _register_opaque() -> None:
    from torch._library.opaque_object import is_opaque_type, register_opaque_type

    if not is_opaque_type(SavedByBucket):
        register_opaque_type(SavedByBucket, typ="reference")


@dataclass
class Bucket:
    """One bucket's plan and its two boxed graphs."""

    key: tuple  # ((symbol name, edge), ...)
    plan: object
    forward: Callable
    backward: Callable
    runs: int = 0  # forwards run with this bucket's plan


UPGRADE_AFTER = 50  # steps after which a bucket's warm plan is replaced by a full one


def _upgradable(plan) -> bool:
    """A warm plan that changes the step (recomputes or offloads): a full plan may do it cheaper."""
    return bool(plan.info.get("warm")) and (plan.recomputations > 0 or bool(plan.offloaded_values))


@dataclass
class BucketedStep:
    """The dispatcher behind the forward and backward graphs of a joint graph with symbolic sizes.

    ``plan_bucket(concrete_joint_gm, key, full, low, high) -> (capture, plan)`` captures and plans the
    joint graph made concrete at the bucket's edges ``high`` (``full``: with every solver, not the warm
    start; ``low``: the bucket's smallest sizes, ``{symbol: value}``); ``lower_fn(capture, plan) ->
    (fwd_gm, bwd_gm)`` lowers it.
    ``edges``: the user's bucket edges (None: powers of two and midpoints)."""

    joint: fx.GraphModule
    num_fwd_outputs: int
    plan_bucket: Callable
    lower_fn: Callable
    edges: tuple | None = None
    buckets: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)  # bucket key -> the error it raised, raised again
    on_run: Callable | None = None  # called with the plan of each forward's bucket
    last_binding: dict = field(default_factory=dict)  # the sizes of the latest forward
    sources: list | None = None  # where each symbol is read in the inputs (capture.shapes.symbol_sources)

    def bucket(self, args) -> Bucket:
        """The bucket of the runtime inputs ``args`` (planned now if it is new; planned again in
        full once a warm plan that recomputes or offloads has run ``UPGRADE_AFTER`` steps)."""
        if self.sources is None:
            self.sources = symbol_sources(self.joint)
        self.last_binding = bind_symbols(self.joint, args, self.sources)
        found = self.bucket_for(self.last_binding)
        found.runs += 1
        if found.runs == UPGRADE_AFTER and _upgradable(found.plan):
            upgraded = self._make(found.key, self.last_binding, full=True)
            if upgraded.plan.step_seconds <= found.plan.step_seconds:
                found = upgraded
            else:  # the warm plan was the better one: keep it
                self.buckets[found.key] = found
        if self.on_run is not None:
            self.on_run(found.plan)
        return found

    def bucket_for(self, binding: dict) -> Bucket:
        """The bucket of the sizes ``binding`` (``{symbol: value}``), planned now if it is new;
        raises the bucket's error (e.g. :class:`InfeasibleBudgetError`) if it cannot be planned."""
        key = bucket_of(binding, self.edges)
        found = self.buckets.get(key)
        if found is None:
            if key in self.refused:
                raise self.refused[key]
            found = self._make(key, binding)
        return found

    def _make(self, key: tuple, binding: dict, full: bool = False) -> Bucket:
        start = time.perf_counter()
        by_name = {str(s): s for s in binding}
        high = {by_name[name]: edge for name, edge in key}
        low = {by_name[name]: lower_end(edge, self.edges) for name, edge in key}
        try:
            refuse_unless_monotone(self.joint, low, high)
        except CaptureError as err:
            self.refused[key] = err
            raise
        try:
            with _random_state_kept():  # profiling runs random ops: the step must draw as if it had not
                capture, plan = self.plan_bucket(concrete_joint(self.joint, high), key, full, low, high)
        except InfeasibleBudgetError as err:
            self.refused[key] = name_bucket(err, key)
            raise
        # a fraction's bytes grow when a larger bucket is planned: a bucket refused before may fit now
        self.refused = {k: e for k, e in self.refused.items() if not isinstance(e, InfeasibleBudgetError)}
        fwd, bwd = self.lower_fn(capture, plan)
        plan.info["bucket"] = dict(key)
        plan.info["bucket_seconds"] = time.perf_counter() - start  # sized, captured, planned, lowered
        bucket = Bucket(key, plan, boxed(fwd), boxed(bwd), runs=UPGRADE_AFTER if full else 0)
        self.buckets[key] = bucket
        return bucket

    def forward(self, *args):
        bucket = self.bucket(args)
        outs = bucket.forward(list(args))
        n = self.num_fwd_outputs
        # a saved tensor that is also a user output gets the autograd node as its grad_fn when the
        # forward returns: keep a detached alias of it, or the node would hold itself (a cycle).
        # Nothing else is replaced: an offloaded value's entry lives as long as its handle object.
        user = {id(x) for x in outs[:n]}
        saved = [x.detach() if id(x) in user else x for x in outs[n:]]
        return (*outs[:n], SavedByBucket(bucket, saved))

    def backward(self, saved: SavedByBucket, *tangents):
        args = saved.take()  # the only list of the saved values: the boxed backward empties it,
        args.extend(tangents)  # so each dies at its last use, as the plan says
        return tuple(saved.bucket.backward(args))


def dispatching_graphs(step: BucketedStep, capture_outputs: list, primals: list, tangents: list,
                       bwd_outputs: list) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The forward and backward GraphModules AOTAutograd runs: each one call of ``step``. The
    forward returns the joint graph's forward outputs and one :class:`SavedByBucket`; the backward
    takes it and the tangents and returns the joint graph's gradients (None where it has none)."""
    _register_opaque()
    fwd = fx.Graph()
    ins = [fwd.node_copy(p) for p in primals]
    call = fwd.call_function(step.forward, tuple(ins))
    outs = []
    for i, joint_out in enumerate(capture_outputs):
        item = fwd.call_function(operator.getitem, (call, i))
        if isinstance(joint_out, fx.Node):
            item.meta.update(joint_out.meta)
        outs.append(item)
    saved = fwd.call_function(operator.getitem, (call, len(capture_outputs)))
    saved.meta["val"] = _saved_meta()
    fwd.output(tuple(outs + [saved]))

    bwd = fx.Graph()
    saved_in = bwd.placeholder("saved_by_bucket")
    saved_in.meta["val"] = _saved_meta()
    tangent_ins = [bwd.node_copy(t) for t in tangents]
    call = bwd.call_function(step.backward, (saved_in, *tangent_ins))
    grads = []
    for i, joint_grad in enumerate(bwd_outputs):
        if joint_grad is None:
            grads.append(None)
            continue
        item = bwd.call_function(operator.getitem, (call, i))
        if isinstance(joint_grad, fx.Node):
            item.meta.update(joint_grad.meta)
        grads.append(item)
    bwd.output(tuple(grads))
    return fx.GraphModule(step.joint, fwd), fx.GraphModule(step.joint, bwd)


__all__ = ["BucketedStep", "Bucket", "SavedByBucket", "dispatching_graphs"]

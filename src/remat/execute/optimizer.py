"""The optimizer step inside the backward: each parameter is updated as soon as its gradient exists.

    m = remat.optimize(model, x, budget="1GiB", optimizer=opt)
    for x in batches:
        m(x).backward()          # opt has updated every parameter; no p.grad is kept

A step that ends with every gradient resident holds as many bytes as the parameters themselves
(GPT-2 8L: the gradients alone are 0.56x the smallest recompute-only peak). Here the joint graph
gets one node per optimized parameter, :func:`optimizer_step`, reading that parameter's gradient:
it hands the gradient to the user's optimizer for that one parameter and returns an empty token in
its place, so the gradient dies at that node and the backward returns no gradient for the
parameter. The planners see the node as any other (its workspace and time measured on a
scratch parameter, :func:`measure_update`); the simulator frees each gradient after its update
and refuses any plan that reads a parameter after its update (``graph.meta["optimizer_updates"]``).

The user's own optimizer object steps, one parameter at a time (its param group narrowed to that
parameter for the call), so its state, ``state_dict`` and learning-rate schedulers work unchanged.
What it cannot combine with, refused with :class:`OptimizerInBackwardError`:

* **gradient accumulation** -- each backward steps; a parameter that already has a ``.grad``
  (accumulated by another backward) is refused;
* **clipping by the global norm** -- it needs every gradient before any update: calling
  ``opt.step()`` yourself (as a loop that clips, accumulates or steps every k batches does) raises;
  ``opt.zero_grad()`` is harmless;
* **DDP and FSDP** -- gradients would be used before they are reduced across ranks;
* optimizers whose ``step`` needs a closure (L-BFGS).
"""

from __future__ import annotations

import functools
import itertools
import time
import weakref

import torch
import torch.fx as fx
from torch.utils._python_dispatch import _disable_current_modes

from ..capture.joint import GIVEN_COST, GIVEN_WORKSPACE, UPDATES, storage_key
from ..errors import RematError
from ..measure import peak_memory_growth


class OptimizerInBackwardError(RematError):
    """The training loop does something the optimizer step inside the backward cannot do (accumulate
    gradients, clip by their global norm, step the optimizer itself, reduce gradients across ranks)."""


_STEPPERS: "weakref.WeakValueDictionary[int, StepperInBackward]" = weakref.WeakValueDictionary()
_KEYS = itertools.count()


class StepperInBackward:
    """Steps ``optimizer`` for one parameter at a time, from inside the backward."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, not {type(optimizer).__name__}")
        if isinstance(optimizer, torch.optim.LBFGS):
            raise OptimizerInBackwardError(
                "L-BFGS evaluates the loss again inside its step (a closure), which the optimizer step inside the "
                "backward cannot do: give remat.optimize no optimizer and call opt.step(closure) yourself")
        _refuse_distributed()
        self.optimizer = optimizer
        self.key = next(_KEYS)
        _STEPPERS[self.key] = self
        self._params: dict[int, weakref.ref] = {}  # slot -> parameter
        self._groups: dict[int, dict] = {}  # slot -> its param group, found at its first update
        if optimizer not in _HOOKED:  # once per optimizer, however many modules it steps inside
            optimizer.register_step_pre_hook(_refuse_outside_steps)
            _HOOKED.add(optimizer)

    def owns(self, tensor) -> bool:
        return any(p is tensor for group in self.optimizer.param_groups for p in group["params"])

    def slot(self, param: torch.Tensor) -> int:
        """The number :func:`optimizer_step` is given for ``param``."""
        for slot, ref in self._params.items():
            if ref() is param:
                return slot
        slot = len(self._params)
        self._params[slot] = weakref.ref(param)
        return slot

    def _group_of(self, param: torch.Tensor) -> dict:
        for group in self.optimizer.param_groups:
            if any(p is param for p in group["params"]):
                return group
        raise OptimizerInBackwardError("a parameter planned with the optimizer step inside the backward is no longer "
                                       "in the optimizer's param groups")

    def step(self, slot: int, grad: torch.Tensor) -> None:
        """``optimizer.step()`` for the parameter of ``slot`` alone, with ``grad`` as its gradient."""
        param = self._params[slot]()
        if param is None:
            raise OptimizerInBackwardError("a parameter planned with the optimizer step inside the backward is gone")
        if param.grad is not None:
            raise OptimizerInBackwardError(
                "a parameter stepped inside the backward already has a .grad: gradients are being accumulated (a "
                "backward without remat, or a gradient set by hand). The optimizer step inside the backward updates "
                "every parameter at every backward and cannot accumulate; plan without optimizer= to accumulate")
        _refuse_distributed()
        if slot not in self._groups:  # the training step's hot path: looked up once, not per update
            self._groups[slot] = self._group_of(param)
        opt, group = self.optimizer, self._groups[slot]
        groups, params = opt.param_groups, group["params"]
        group["params"], opt.param_groups = [param], [group]
        param.grad = grad
        _STEPPING.add(id(opt))
        try:
            opt.step()
        finally:
            _STEPPING.discard(id(opt))
            param.grad = None
            group["params"], opt.param_groups = params, groups


_HOOKED: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()  # optimizers that refuse outside steps
_STEPPING: set[int] = set()  # ids of the optimizers stepping one parameter inside a backward now


def _refuse_outside_steps(optimizer, args, kwargs):
    if id(optimizer) not in _STEPPING:
        raise OptimizerInBackwardError(
            "this optimizer steps inside the backward (remat.optimize(..., optimizer=opt)): loss.backward() has "
            "updated every parameter already. Remove opt.step() (and opt.zero_grad(), which is harmless) from the "
            "loop. Gradient accumulation and clipping by the global norm need every gradient before any update, "
            "which the step inside the backward exists to avoid: for those, plan without optimizer=")
    return None


def _refuse_distributed() -> None:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise OptimizerInBackwardError(
            "the optimizer step inside the backward updates each parameter before DDP or FSDP could reduce its "
            "gradient across ranks: plan without optimizer= when training on several processes")


def optimizer_step(grad: torch.Tensor, key: int, slot: int) -> torch.Tensor:
    """Run in the backward: update the parameter of ``slot`` with ``grad``; an empty token in its place."""
    stepper = _STEPPERS.get(key)
    if stepper is None:
        raise OptimizerInBackwardError("the optimizer this step was planned with is gone")
    stepper.step(slot, grad)
    return grad.new_empty(0)


def is_optimizer_step(node) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target is optimizer_step


SCRATCH_ELEMENTS = 1 << 20  # an update is measured on at most this many elements, then scaled


@functools.lru_cache(maxsize=256)
def _measured(kind: type, hyper: tuple, numel: int, dtype: torch.dtype, device: str) -> tuple[int, float]:
    # called from the partition function, under AOTAutograd's fake mode: real tensors here
    with _disable_current_modes(), torch.no_grad():
        return _measure_scratch_update(kind, hyper, numel, dtype, device)


def _measure_scratch_update(kind: type, hyper: tuple, numel: int, dtype: torch.dtype, device: str):
    scratch = torch.nn.Parameter(torch.zeros(numel, dtype=dtype, device=device))
    opt = kind([{"params": [scratch], **dict(hyper)}])
    scratch.grad = torch.full_like(scratch, 1e-3)
    opt.step()  # the first step makes the state (outside the budget, like the parameters)
    opt.step()
    peak, _ = peak_memory_growth(opt.step, device)
    seconds = []
    for _ in range(3):
        started = time.perf_counter()
        opt.step()
        if scratch.is_cuda:
            torch.cuda.synchronize(scratch.device)
        seconds.append(time.perf_counter() - started)
    return int(peak), sorted(seconds)[1]


def measure_update(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> tuple[int, float]:
    """``(scratch bytes, seconds)`` of ``optimizer``'s update of ``param``: measured on a scratch
    parameter of the same dtype and device, a fresh optimizer of the same kind and settings, its
    third step (the first makes the state); above ``SCRATCH_ELEMENTS`` elements, scaled linearly."""
    group = next(g for g in optimizer.param_groups if any(p is param for p in g["params"]))
    hyper = tuple(sorted((k, v) for k, v in group.items() if k != "params" and _hashable(v)))
    numel = param.numel()
    size = min(numel, SCRATCH_ELEMENTS)
    peak, seconds = _measured(type(optimizer), hyper, size, param.dtype, str(param.device))
    scale = numel / size
    return -(-peak * numel // size), seconds * scale


def _hashable(v) -> bool:
    try:
        hash(v)
        return not isinstance(v, torch.Tensor)
    except TypeError:
        return False


def with_optimizer_steps(joint: fx.GraphModule, num_fwd_outputs: int, stepper: StepperInBackward,
                         params: dict[int, torch.Tensor]) -> fx.GraphModule:
    """A copy of ``joint`` in which the gradient of each primal in ``params`` (primal index -> the
    parameter) goes to an :func:`optimizer_step` node instead of out of the backward.

    Each node is placed after the gradient's producer and after every reader of the parameter (or
    of a view of it), so that in the graph's order nothing reads a parameter after its update."""
    gm = fx.GraphModule(joint, _copied(joint.graph))
    graph = gm.graph
    primals = [p for p in graph.find_nodes(op="placeholder") if not str(p.target).startswith("tangents")]
    (output,) = graph.find_nodes(op="output")
    outputs = list(output.args[0])
    grads = outputs[num_fwd_outputs:]
    order = {n: i for i, n in enumerate(graph.nodes)}
    for index, param in params.items():
        grad = grads[index] if index < len(grads) else None
        if not isinstance(grad, fx.Node):
            continue
        primal = primals[index] if index < len(primals) else None
        val = primal.meta.get("val") if primal is not None else None
        if not isinstance(val, torch.Tensor) or tuple(val.shape) != tuple(param.shape) or val.dtype != param.dtype:
            raise OptimizerInBackwardError(
                "remat cannot tell which input of the captured step is which parameter of the optimizer (the step "
                "takes its inputs in another order than Dynamo gave them): plan without optimizer=")
        readers = [u for a in _aliases(graph, primal) for u in a.users if u.op != "output"]
        after = max([grad, *readers], key=order.__getitem__)
        workspace, seconds = measure_update(stepper.optimizer, param)
        with graph.inserting_after(after):
            node = graph.call_function(optimizer_step, (grad, stepper.key, stepper.slot(param)))
        node.meta["val"] = grad.meta["val"].new_empty(0)
        node.meta[GIVEN_WORKSPACE], node.meta[GIVEN_COST], node.meta[UPDATES] = workspace, seconds, primal
        outputs[num_fwd_outputs + index] = node  # (the order of the nodes already there is unchanged)
    output.args = (tuple(outputs),)
    gm.recompile()
    return gm


def _copied(graph: fx.Graph) -> fx.Graph:
    """A copy of ``graph`` whose nodes keep their meta (fake values; the output's ``desc``, which
    names the inputs the step mutates)."""
    new = fx.Graph()
    value_remap: dict = {}
    out = new.graph_copy(graph, value_remap)
    new_output = new.output(out)
    (old_output,) = graph.find_nodes(op="output")
    new_output.meta = dict(old_output.meta)
    for old, n in value_remap.items():
        n.meta = dict(old.meta)
    return new


def _aliases(graph: fx.Graph, primal: fx.Node) -> list[fx.Node]:
    """``primal`` and the nodes whose value shares its storage (its views, views of views)."""
    key = storage_key(primal.meta.get("val"))
    if key is None:
        return [primal]
    return [primal] + [n for n in graph.nodes if n is not primal and storage_key(n.meta.get("val")) == key]


__all__ = ["StepperInBackward", "OptimizerInBackwardError", "optimizer_step", "is_optimizer_step",
           "measure_update", "with_optimizer_steps"]

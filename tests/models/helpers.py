"""Shared helpers of the end-to-end tests: run one training step, compare results."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import remat
from remat import models as zoo


@dataclass
class StepResult:
    loss: torch.Tensor
    outputs: list[torch.Tensor]
    grads: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


def _flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out.detach().clone()]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flatten(o)]
    return []


def run_step(example: zoo.Example, module: torch.nn.Module, seed: int = 1234, steps: int = 1) -> StepResult:
    """``steps`` training steps (grads accumulate) from the same RNG seed; the last step's results."""
    for p in module.parameters():
        p.grad = None
    for _ in range(steps):
        torch.manual_seed(seed)
        out = module(*example.args, **example.kwargs)
        loss = example.loss(out)
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in module.named_parameters() if p.grad is not None}
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    return StepResult(loss.detach().clone(), _flatten(out), grads, buffers)


def fresh(name: str, size: str = "tiny", seed: int = 0) -> zoo.Example:
    return zoo.build(name, size=size, seed=seed)


def max_rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    scale = max(b.abs().max().item(), 1e-12)
    return (a - b).abs().max().item() / scale


def assert_close(got: StepResult, ref: StepResult, rel: float = 1e-5):
    assert max_rel_err(got.loss, ref.loss) <= rel
    assert len(got.outputs) == len(ref.outputs)
    for a, b in zip(got.outputs, ref.outputs):
        assert max_rel_err(a, b) <= rel
    assert got.grads.keys() == ref.grads.keys()
    for k in ref.grads:
        assert max_rel_err(got.grads[k], ref.grads[k]) <= rel, f"gradient of {k}"
    assert got.buffers.keys() == ref.buffers.keys()
    for k in ref.buffers:
        if ref.buffers[k].is_floating_point():
            assert max_rel_err(got.buffers[k], ref.buffers[k]) <= rel, f"buffer {k}"
        else:
            assert torch.equal(got.buffers[k], ref.buffers[k]), f"buffer {k}"


def assert_bitwise(got: StepResult, ref: StepResult):
    assert torch.equal(got.loss, ref.loss)
    for a, b in zip(got.outputs, ref.outputs):
        assert torch.equal(a, b)
    assert got.grads.keys() == ref.grads.keys()
    for k in ref.grads:
        assert torch.equal(got.grads[k], ref.grads[k]), f"gradient of {k} differs"
    for k in ref.buffers:
        assert torch.equal(got.buffers[k], ref.buffers[k]), f"buffer {k} differs"


def optimized(example: zoo.Example, **kwargs) -> remat.RematModule:
    return remat.optimize(example.model, *example.args, **example.kwargs, **kwargs)


def without_codegen(model, partition_fn):
    """``model`` compiled through AOTAutograd with Inductor's decompositions and ``partition_fn``
    (Inductor's partitioner signature), the graphs run as they are, no code generated: what
    Inductor's partitioner sees and returns, in seconds."""
    import torch._inductor.lowering  # noqa: F401  (Inductor's decompositions refer to it)
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.decomposition import select_decomp_table

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), partition_fn=partition_fn,
                           decompositions=select_decomp_table())
    torch._dynamo.reset()
    return torch.compile(model, backend=backend, fullgraph=True, dynamic=False)

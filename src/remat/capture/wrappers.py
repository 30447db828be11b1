"""remat inside the training stacks people already use.

* **Hugging Face Trainer / accelerate.** ``TrainingArguments(torch_compile_backend="remat")``
  reaches ``torch.compile`` through accelerate's ``TorchDynamoPlugin``, which accepts only the
  backend names of its ``DynamoBackend`` enum. :func:`register_accelerate_backend` adds
  ``"REMAT"`` to that enum (it is called when ``remat`` is imported, if accelerate is installed),
  so the plugin passes ``backend="remat"`` on to ``torch.compile``; the budget then comes from
  the ``REMAT_BUDGET`` environment variable (see :class:`remat.backend.BackendOptions`).
* **DDP and FSDP2.** remat plans a module whose parameters are plain tensors. Wrapping the
  *result* of :func:`remat.optimize` in ``DistributedDataParallel`` or ``fully_shard`` works;
  handing remat a module already wrapped by them (or sharding the original model after
  ``optimize``) cannot, because Dynamo cannot trace their hooks as one graph and sharded
  parameters are DTensors. :func:`check_unwrapped` detects those cases and raises
  :class:`~remat.errors.UnsupportedWrappingError`, which says which order works.
"""

from __future__ import annotations

import importlib.util
import sys

import torch
import torch.nn as nn

from ..errors import CaptureError, UnsupportedWrappingError

ACCELERATE_NAME = "REMAT"


def register_accelerate_backend() -> bool:
    """Make accelerate's ``DynamoBackend("REMAT")`` valid; True when accelerate is installed.

    accelerate validates ``TorchDynamoPlugin(backend=...)`` against a closed enum and then
    calls ``torch.compile(model, backend=plugin.backend.value.lower())``. Adding a member
    whose value is ``"REMAT"`` is all it needs. Idempotent; never raises (an accelerate whose
    enum cannot be extended is left as it is, and Trainer then reports the unknown backend).
    """
    if importlib.util.find_spec("accelerate") is None:
        return False
    try:
        from accelerate.utils.dataclasses import DynamoBackend
    except Exception:  # a broken accelerate install must not break `import remat`
        return False
    if ACCELERATE_NAME in DynamoBackend._value2member_map_:
        return True
    try:
        member = str.__new__(DynamoBackend, ACCELERATE_NAME)
        member._name_ = ACCELERATE_NAME
        member._value_ = ACCELERATE_NAME
        DynamoBackend._member_map_[ACCELERATE_NAME] = member
        DynamoBackend._value2member_map_[ACCELERATE_NAME] = member
        DynamoBackend._member_names_.append(ACCELERATE_NAME)
    except Exception:
        return False
    return True


TRANSFORMERS_LOGGING = "transformers.utils.logging"


def quiet_transformers_logging() -> bool:
    """Let Dynamo skip transformers' ``logger.warning_once`` / ``info_once`` instead of breaking the graph.

    A causal LM whose ``loss_type`` is unset calls ``logger.warning_once`` inside ``forward`` when it
    computes the loss from ``labels``; Dynamo cannot trace that cached logging call, so the loss
    became a graph of its own (planned apart, and a fraction below 1 looked infeasible). Adding the
    two methods to ``torch._dynamo.config.ignore_logging_functions`` makes them no-ops inside
    compiled code (the message is still logged by eager runs), so the step is captured whole without
    the user setting anything. True once transformers' logging is loaded and the methods are added.
    """
    if TRANSFORMERS_LOGGING not in sys.modules:
        return False
    import logging

    ignored = torch._dynamo.config.ignore_logging_functions
    for name in ("warning_once", "info_once"):
        method = getattr(logging.Logger, name, None)
        if method is not None and method not in ignored:
            ignored.add(method)
    return True


class _AfterTransformersLogging:
    """A meta-path finder that calls :func:`quiet_transformers_logging` once transformers' logging
    module has run (when transformers is imported after remat), then steps aside."""

    def find_spec(self, name, path=None, target=None):
        if name != TRANSFORMERS_LOGGING:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            quiet_transformers_logging()

        spec.loader.exec_module = exec_module
        return spec


def watch_for_transformers() -> None:
    """:func:`quiet_transformers_logging` now if transformers is loaded, else when it is (idempotent)."""
    if quiet_transformers_logging():
        return
    if not any(isinstance(f, _AfterTransformersLogging) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTransformersLogging())


def _loaded_classes(module_name: str, *names: str) -> tuple[type, ...]:
    """The classes ``names`` of ``module_name`` if that module is already imported.

    A model cannot be wrapped by a class whose module was never imported, so nothing is
    imported here: the check costs nothing for users of neither DDP nor FSDP.
    """
    module = sys.modules.get(module_name)
    return tuple(getattr(module, n) for n in names if module is not None and hasattr(module, n))


_ORDER_ADVICE = (
    "Plan first, then wrap: `DistributedDataParallel(remat.optimize(model, x, budget=...))` or "
    "`fully_shard(remat.optimize(model, x, budget=...))` (one FSDP unit around the planned module); "
    "to shard block by block, call `fully_shard` on each block and on the model and then "
    "`block.compile(backend=\"remat\", options={...})` on each block (see docs/integrations.md)."
)


def check_unwrapped(model: nn.Module) -> None:
    """Raise :class:`UnsupportedWrappingError` if ``model`` is wrapped by DDP or FSDP, or holds
    FSDP-sharded (DTensor) parameters: remat cannot capture such a module as one graph."""
    ddp = _loaded_classes("torch.nn.parallel.distributed", "DistributedDataParallel")
    if ddp and isinstance(model, ddp):
        raise UnsupportedWrappingError(
            "remat.optimize was given a DistributedDataParallel module: DDP's forward cannot be captured "
            "as one graph and its gradient hooks must see remat's backward. " + _ORDER_ADVICE
        )
    fsdp = _loaded_classes("torch.distributed.fsdp", "FSDPModule", "FullyShardedDataParallel")
    if fsdp:
        for name, sub in model.named_modules():
            if isinstance(sub, fsdp):
                where = f"its submodule {name!r}" if name else "the model"
                raise UnsupportedWrappingError(
                    f"remat cannot plan a model sharded by FSDP ({where} is a {type(sub).__name__}): FSDP's "
                    "pre/post-forward hooks swap sharded and unsharded parameters, which Dynamo cannot capture "
                    "in remat's one graph. " + _ORDER_ADVICE
                )
    dtensor = _loaded_classes("torch.distributed.tensor", "DTensor")
    if dtensor:
        for name, p in model.named_parameters():
            if isinstance(p, dtensor):
                raise UnsupportedWrappingError(
                    f"remat cannot plan a model with DTensor (sharded) parameters ({name!r}); remat plans "
                    "modules whose parameters are plain tensors. " + _ORDER_ADVICE
                )


__all__ = ["register_accelerate_backend", "check_unwrapped", "UnsupportedWrappingError"]


def check_materialized(model: nn.Module, args: tuple = (), kwargs: dict | None = None) -> None:
    """Raise :class:`~remat.errors.CaptureError` when ``model``'s parameters or buffers, or the example
    inputs, are on the meta device: remat captures, times and measures the real step."""
    meta = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    inputs = any(isinstance(t, torch.Tensor) and t.is_meta for t in torch.utils._pytree.tree_leaves((args, kwargs)))
    if not (meta or inputs):
        return
    what = (f"its parameters and buffers ({', '.join(meta[:3])}{', ...' if len(meta) > 3 else ''}) are"
            if meta else "the example inputs are")
    raise CaptureError(
        f"remat needs real tensors, but {what} on the meta device: it captures the training step with real "
        "example inputs, times its ops and measures its memory on the device it will run on. Materialise the "
        "model first (model.to_empty(device=...) and initialise or load its weights) and pass real inputs "
        "of the shape you train with."
    )

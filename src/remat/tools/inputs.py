"""What the ``remat`` command's arguments name: exit codes, the one-line :class:`CliError`, and loading
MODEL (a built-in example or ``package.module:factory``), a saved plan, and checking a plot's path.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any, Callable

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INFEASIBLE = 0, 1, 2, 3
SIZES = ("tiny", "small", "medium")
PLOT_SUFFIXES = (".png", ".svg")


class CliError(Exception):
    """A mistake in what the user asked for: printed as one line, exit status ``status``."""

    def __init__(self, message: str, status: int = EXIT_ERROR):
        super().__init__(message)
        self.status = status


# ------------------------------------------------------------------------------ models and plans


def _import_factory(spec: str) -> Callable:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CliError(f"cannot read MODEL {spec!r}: write package.module:factory")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # `remat plan mymodels:build` from the folder holding mymodels.py
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise CliError(f"cannot import {module_name!r} for MODEL {spec!r}: {err} "
                       "(run from the folder that holds it, or add it to PYTHONPATH)") from err
    try:
        factory = getattr(module, attr)
    except AttributeError as err:
        raise CliError(f"module {module_name!r} has no {attr!r} (MODEL {spec!r})") from err
    if not callable(factory):
        raise CliError(f"{spec!r} is not callable: MODEL must name a function returning (model, args)")
    return factory


def _as_example(spec: str, made: Any):
    import torch.nn as nn

    from .. import models as zoo

    if isinstance(made, zoo.Example):
        return made
    if isinstance(made, (tuple, list)) and len(made) in (2, 3) and isinstance(made[0], nn.Module):
        args = made[1]
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        kwargs = dict(made[2]) if len(made) == 3 else {}
        return zoo.Example(spec, made[0], args, kwargs)
    raise CliError(f"{spec!r} returned a {type(made).__name__}; it must return (model, args), "
                   "(model, args, kwargs) or a remat.models.Example")


def check_device(device: str) -> None:
    """A one-line :class:`CliError` for a device name torch does not know or cannot use here."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as err:
        raise CliError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CliError(f"--device {device}: CUDA is not available here (torch.cuda.is_available() is False); "
                       "use --device cpu")


def load_example(spec: str, size: str = "small", *, batch: int | None = None, device: str = "cpu"):
    """The :class:`remat.models.Example` MODEL names: a built-in example or ``module:factory``."""
    from .. import models as zoo

    if device != "cpu":
        check_device(device)

    if ":" not in spec:
        if spec not in zoo.names():
            raise CliError(f"unknown model {spec!r}: give a built-in one ({', '.join(zoo.names())}) "
                           "or package.module:factory")
        if size not in SIZES:
            raise CliError(f"unknown size {size!r}: choose one of {', '.join(SIZES)}")
        options: dict = {"size": size, "device": device}
        if batch is not None:
            if "batch" not in inspect.signature(zoo.build).parameters:
                raise CliError("this version of remat.models.build cannot change the batch size")
            options["batch"] = batch
        try:
            return zoo.build(spec, **options)
        except ImportError as err:
            raise CliError(f"model {spec!r} needs a package that is not installed ({err}); "
                           "install the extras: pip install 'remat[models]'") from err
    factory = _import_factory(spec)
    if batch is not None:
        if "batch" not in inspect.signature(factory).parameters:
            raise CliError(f"{spec!r} takes no 'batch' argument; remat maxbatch calls the factory with batch=N")
        example = _as_example(spec, factory(batch=batch))
    else:
        example = _as_example(spec, factory())
    if device != "cpu":
        example.model.to(device)
        example.args = tuple(a.to(device) if hasattr(a, "to") else a for a in example.args)
        example.kwargs = {k: v.to(device) if hasattr(v, "to") else v for k, v in example.kwargs.items()}
    return example


def load_plan(path: str):
    """A saved :class:`remat.Plan`, or a one-line :class:`CliError` saying why it cannot be read."""
    from ..errors import RematError
    from ..plan import Plan

    try:
        return Plan.load(path)
    except RematError as err:  # Plan.load names the file and the reason (missing, not JSON, not a plan)
        raise CliError(str(err)) from err


def check_output(path: str | None) -> None:
    if path is not None and os.path.splitext(path)[1].lower() not in PLOT_SUFFIXES:
        raise CliError(f"cannot write a plot to {path!r}: the file name must end in .png or .svg", EXIT_USAGE)


__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_INFEASIBLE", "SIZES", "PLOT_SUFFIXES", "CliError",
           "check_device", "load_example", "load_plan", "check_output"]

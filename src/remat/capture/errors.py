"""Errors of capture: what Dynamo could not capture, said in the user's terms.

    try:
        compiled(*args)
    except Exception as err:
        raise unwrap_compile_error(err) from err   # remat's own error, or a CaptureError naming the line

Dynamo wraps a backend's exceptions (``BackendCompilerFailed``) and reports a graph break with its
own trace; :func:`unwrap_compile_error` finds remat's error inside the wrapper, and turns a graph
break into a :class:`~remat.errors.CaptureError` naming the user's file, line and source text.
"""

from __future__ import annotations

import linecache
import os
import re

import torch

from ..errors import CaptureError, RematError
from .step import detached_copies, no_lasting_effects, training_step_mode


class PlanReady(Exception):
    """Raised from inside the backend by :func:`remat.plan` to stop once planned, before anything runs."""


def unwrap_compile_error(err: BaseException, model=None) -> BaseException:
    """The remat error inside Dynamo's wrapper, or a CaptureError naming the graph break (and, given
    the ``model``, the modules that caused it where that is known)."""
    seen = err
    while seen is not None:
        if isinstance(seen, (RematError, PlanReady)):
            return seen
        seen = getattr(seen, "inner_exception", None) or seen.__cause__
    dynamo_exc = torch._dynamo.exc
    if isinstance(err, (dynamo_exc.Unsupported, dynamo_exc.UserError)):
        return capture_error(err, model)
    return err


NOT_USER_CODE = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # remat's folder, then torch's
                  os.path.dirname(os.path.abspath(torch.__file__)))


def user_frame(err: BaseException) -> tuple[str, int, str] | None:
    """(file, line, source text) of the innermost frame of the user's code where Dynamo stopped.

    Dynamo's graph-break exceptions carry the traced user stack as ``real_stack``; its
    message repeats it under "from user code:", which is read when the attribute is missing.
    Frames of remat and torch are skipped."""
    frames = [(f.filename, f.lineno, (f.line or "").strip()) for f in getattr(err, "real_stack", None) or ()]
    if not frames:
        found = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', str(err))
        frames = [(f, int(n), src.strip()) for f, n, src in found]
    for filename, lineno, line in reversed(frames):
        if not os.path.abspath(filename).startswith(NOT_USER_CODE):
            if not line:
                line = linecache.getline(filename, lineno).strip()
            return filename, lineno, line
    return None


_RNN_REFUSED = "Attempted to wrap RNN, GRU, or LSTM"


def _recurrent_modules_error(err: BaseException, model) -> CaptureError:
    names = [n or type(m).__name__ for n, m in model.named_modules() if isinstance(m, torch.nn.RNNBase)] if model else []
    here = f" ({', '.join(names)})" if names else ""
    return CaptureError(
        f"remat cannot capture the model's recurrent modules{here}: Dynamo refuses nn.RNN, nn.GRU and nn.LSTM "
        "in one graph (its allow_rnn option crashes on torch 2.13's CPU build), so no plan can include them. "
        "Write the recurrence as a loop over nn.LSTMCell, nn.GRUCell or nn.RNNCell (captured and planned like "
        "any layer), or optimize the parts before and after the recurrent module separately."
    )


def capture_error(err: BaseException, model=None) -> CaptureError:
    """A CaptureError for Dynamo's graph-break ``err``: what, where (file, line, source) and what to do."""
    if _RNN_REFUSED in str(err):
        return _recurrent_modules_error(err, model)
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    reason = lines[0] if lines else type(err).__name__
    where = user_frame(err)
    if where is None:
        at = ""
        caused = next((ln for ln in lines if ln.startswith("Caused by:")), "")
        reason = f"{reason} {caused}".strip()
    else:
        at = f" at {where[0]}, line {where[1]}: `{where[2]}`"
    return CaptureError(
        f"remat needs the model's forward as one graph, but Dynamo could not capture it{at} "
        f"({type(err).__name__}: {reason}). Rewrite that line without data-dependent Python control flow "
        "(an `if` on a tensor's value, .item() in a condition or a shape) or the unsupported call, for example "
        "with torch.where, or plan the parts on either side of it separately.",
        filename=where and where[0], lineno=where and where[1], line=where and where[2],
    )



def _raised_by_user_code(err: BaseException) -> bool:
    """Whether Dynamo stopped because the traced code itself raised (its ``ObservedException``)."""
    seen, observed = err, torch._dynamo.exc.ObservedException
    while seen is not None:
        if isinstance(seen, observed):
            return True
        seen = getattr(seen, "inner_exception", None) or seen.__cause__
    return False


def users_own_exception(err: BaseException, model, args: tuple, kwargs: dict) -> BaseException | None:
    """The user's own exception behind Dynamo's ``err``, or None.

    With ``fullgraph=True`` an exception the model's forward raises reaches the caller as Dynamo's
    ``Unsupported("Observed exception")``, which holds no exception object of the user's. So the
    forward is run again eagerly, on copies of the inputs and leaving no lasting effects: what it
    raises is the user's exception, with its type, message and traceback, as plain PyTorch raises
    it; a note says remat ran it. None when ``err`` is not such a failure or the eager run passes."""
    if not _raised_by_user_code(err):
        return None
    try:
        with training_step_mode(), no_lasting_effects(model):
            model(*detached_copies(args), **detached_copies(kwargs))
    except Exception as own:
        own.add_note("(raised by the model's forward, run by remat while it captured the training step)")
        return own
    return None


__all__ = ["PlanReady", "unwrap_compile_error", "users_own_exception", "capture_error", "user_frame", "NOT_USER_CODE"]

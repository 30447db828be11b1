"""The errors remat raises. Each one says what went wrong and what to do."""

from __future__ import annotations


class RematError(Exception):
    """Base class of every error remat raises on purpose."""


LITTLE_TO_FREE = 0.9  # a smallest plan this far towards store-all's peak: the refusal says why, and what helps


class InfeasibleBudgetError(RematError):
    """No plan fits the budget.

    ``min_budget_bytes`` is the smallest budget that works for the call that raised it (with
    ``solver="auto"``: the smallest over every solver ``auto`` may use), and
    ``min_budget_fraction`` the same budget as a fraction (see :mod:`remat.budget`; None when
    no fraction reaches it). Passing either back as the budget, or ``budget="min"``, plans.

    A budget below ``lower_bound_bytes`` (set when the budget was refused without searching: no plan
    can peak below it) is answered at once; ``min_budget_bytes`` is then the smallest peak the quick
    planners found, a budget that plans, and the exact minimum lies between the two.
    """

    def __init__(self, budget_bytes: int, min_budget_bytes: int, detail: str = "", *,
                 min_budget_fraction: float | None = None, budget_fraction: float | None = None,
                 solver: str | None = None, lower_bound_bytes: int | None = None):
        self.budget_bytes = int(budget_bytes)
        self.min_budget_bytes = int(min_budget_bytes)
        self.min_budget_fraction = min_budget_fraction
        self.budget_fraction = budget_fraction
        self.solver = solver
        self.lower_bound_bytes = lower_bound_bytes
        asked = f"{format_bytes(budget_bytes)} ({budget_bytes} bytes"
        asked += f", fraction {budget_fraction:g})" if budget_fraction is not None else ")"
        least = f"{format_bytes(min_budget_bytes)} ({min_budget_bytes} bytes"
        least += f", fraction {min_budget_fraction:.4f})" if min_budget_fraction is not None else ")"
        who = f"with solver {solver!r}" if solver and solver != "auto" else "(over every solver 'auto' may use)"
        raise_to = f"{min_budget_bytes} bytes"
        if min_budget_fraction is not None:
            raise_to += f" (or the fraction {min_budget_fraction:.4f})"
        if lower_bound_bytes is not None and lower_bound_bytes < min_budget_bytes:
            msg = (
                f"no plan fits a budget of {asked}: no plan can peak below {format_bytes(lower_bound_bytes)} "
                f"({lower_bound_bytes} bytes), and the smallest budget remat's quick planners found is {least}. Raise the budget to "
                f"{raise_to} (it plans), pass budget='min' for the exact minimum, or lower the batch size."
            )
        else:
            msg = (
                f"no plan fits a budget of {asked}; the smallest feasible budget {who} is {least}. "
                f"Raise the budget to at least {raise_to}, pass budget='min', or lower the batch size."
            )
        if min_budget_fraction is not None and min_budget_fraction >= LITTLE_TO_FREE:
            msg += (
                f" Little of this step can be freed: its smallest plan lies {min_budget_fraction:.0%} of the way from "
                "the bytes every plan holds (the gradients, the outputs) to the store-everything peak, so a fraction "
                "below that cannot plan. A larger batch leaves remat more to free (activations grow with it, "
                "gradients do not), and remat.optimize(..., optimizer=opt) frees each parameter's gradient inside "
                "the backward."
            )
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)

class CaptureError(RematError):
    """The model could not be captured as one graph (a graph break, an unsupported op).

    For a graph break, ``filename``, ``lineno`` and ``line`` name the user's source line
    (None when unknown); the message names it too."""

    def __init__(self, message: str, *, filename: str | None = None, lineno: int | None = None,
                 line: str | None = None):
        super().__init__(message)
        self.filename, self.lineno, self.line = filename, lineno, line


class InvalidPlanError(RematError):
    """A plan breaks the rules of the simulator; the message names the instruction."""


class SolverError(RematError):
    """A solver was misused (unknown name, a graph it does not handle)."""


class UnsupportedWrappingError(RematError):
    """remat was given a module wrapped by DDP or FSDP (or with sharded parameters); the message
    says which order of wrapping works."""


def format_bytes(n: float) -> str:
    """``format_bytes(3 * 2**20) == '3.00 MiB'``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


class SolverTimeLimitWarning(UserWarning):
    """A solver stopped at its time limit and returned its best plan, which may not be optimal."""


class MeasuredAboveBudgetWarning(UserWarning):
    """A compiled step measured above its plan's smallest budget (``budget="min"``), which has no lower
    plan to re-plan to: the measured peak is the smallest this compiler reaches."""


class AllocatorRoundingWarning(UserWarning):
    """On CUDA without expandable segments, PyTorch's caching allocator may give a tensor over 1 MiB a
    cached block up to 1 MiB larger than the tensor and count the whole block as allocated: measured
    peaks then exceed the plan's by up to 1 MiB per such tensor alive at the peak."""


class NotTrainingWarning(UserWarning):
    """``optimize`` or ``plan`` was called on a model in eval mode or with gradients disabled:
    what gets planned, or what runs, is not the training step the user probably means."""


_THROUGH_DYNAMO: dict[type, type] = {}


def through_dynamo(err: RematError) -> RematError:
    """``err`` as an instance of a subclass of its own class that Dynamo lets through.

    A ``torch.compile`` backend's exceptions reach the user wrapped in Dynamo's
    ``BackendCompilerFailed``, whose message leads with Dynamo's words, except for
    subclasses of ``torch._dynamo.exc.ShortenTraceback``, which Dynamo re-raises as they
    are (Inductor's own errors use this). The subclass keeps the class name, module,
    message and attributes, so ``except remat.InfeasibleBudgetError`` still catches it
    and the traceback ends in ``remat.errors.InfeasibleBudgetError: <remat's message>``.
    """
    from torch._dynamo.exc import ShortenTraceback

    if isinstance(err, ShortenTraceback):
        return err
    cls = type(err)
    if cls not in _THROUGH_DYNAMO:
        _THROUGH_DYNAMO[cls] = type(cls.__name__, (cls, ShortenTraceback), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
            "__init__": BaseException.__init__,
            # Dynamo appends its own lines ("from user code", TORCHDYNAMO_VERBOSE) to the args of
            # exceptions it re-raises; the message stays remat's
            "__str__": lambda self: self.__dict__.get("_remat_message", BaseException.__str__(self)),
        })
    passed = _THROUGH_DYNAMO[cls](*err.args)
    passed.__dict__.update(err.__dict__)
    passed._remat_message = str(err)
    passed.first_useful_frame = None  # keep the whole traceback (it starts in the user's code)
    passed.__cause__, passed.__context__, passed.__traceback__ = err.__cause__, err.__context__, err.__traceback__
    return passed


class OffloadError(RematError):
    """An offloaded value could not be brought back intact: its file in the offload store is
    missing or corrupt (wrong size or checksum), or its handle is unknown. The step is aborted
    rather than run on wrong data; run it again (and keep other programs out of remat's
    temporary folder)."""

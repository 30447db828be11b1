"""The errors remat raises. Each one says what went wrong and what to do."""

from __future__ import annotations


class RematError(Exception):
    """Base class of every error remat raises on purpose."""


class InfeasibleBudgetError(RematError):
    """No plan fits the budget. ``min_budget_bytes`` is the smallest budget that does."""

    def __init__(self, budget_bytes: int, min_budget_bytes: int, detail: str = ""):
        self.budget_bytes = int(budget_bytes)
        self.min_budget_bytes = int(min_budget_bytes)
        msg = (
            f"no plan fits a budget of {format_bytes(budget_bytes)} ({budget_bytes} bytes); "
            f"the smallest feasible budget is {format_bytes(min_budget_bytes)} ({min_budget_bytes} bytes). "
            f"Raise the budget to at least {min_budget_bytes} bytes, or lower the batch size."
        )
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)


class CaptureError(RematError):
    """The model could not be captured as one graph (a graph break, an unsupported op)."""


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

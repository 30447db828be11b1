"""What a budget means, and how the user may write it.

The budget bounds the *peak increase of allocated memory during one forward+backward*
over what was live when the step began (gradients set to ``None`` first): activations,
temporaries, the gradients the step produces and the outputs the caller holds.
Parameters, buffers and inputs are outside it. Its Python type decides its unit:

* ``int``   bytes: ``budget=3 * 2**30``;
* ``str``   a size: ``"1.5GiB"``, ``"800MB"``, ``"512 KiB"``, ``"1e9"`` (bytes);
* ``float`` in (0, 1]: that fraction of the memory a plan *can* change (see below);
* ``"min"`` the smallest budget any plan meets (found by solving; see :mod:`remat.solvers.planner`);
* ``None``  no limit.

**Fractions.** Part of the peak is the same for every plan: the gradients the step must
hand back (the graph's backward outputs) and the forward outputs the caller holds (the
loss, logits). No schedule can free them, so they are :func:`fixed_bytes`. A fraction ``f``
scales only the rest::

    budget_bytes = fixed + f * (store_all_peak - fixed)

``1.0`` is the store-everything peak; ``0.5`` keeps half of what a plan can trade (mostly
activations) on top of the gradients; small fractions are usually below what any plan can
reach (:class:`~remat.errors.InfeasibleBudgetError` then names the smallest, in bytes and as
a fraction). A fraction of the *whole* peak would mostly measure the gradients, which no
plan can reduce (on the zoo's tiny ``dropout_mlp`` they and the loss are 77% of the peak,
and the smallest feasible budget is 0.87 of the whole peak but 0.45 of the part a plan can
change); PyTorch's
``torch._functorch.config.activation_memory_budget`` is likewise a fraction of the
activation memory, not of the whole step.
"""

from __future__ import annotations

import math
import re
from typing import Callable

from .errors import RematError
from .simulate import fixed_bytes  # noqa: F401  (re-exported: the bytes every plan holds, defined with the memory model)

MIN = "min"

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
}

_HOW = ("an int of bytes, a size such as '1.5GiB', '800MB' or '512KiB', a float in (0, 1] for a fraction "
        "of the memory a plan can change, 'min' for the smallest feasible budget, or None for no limit")


class BudgetError(RematError, ValueError):
    """A budget that cannot be understood."""


def parse_size(text: str) -> int:
    """``parse_size("1.5GiB") == 1610612736``; decimal units (MB) are powers of ten."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise BudgetError(f"cannot read the budget {text!r}: write {_HOW}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_budget_text(text: str, *, source: str = "the budget"):
    """A budget written as text (command line, environment) as the API takes it:
    ``"0.5"`` -> 0.5 (a fraction), ``"min"`` -> ``"min"``, ``"2GiB"`` -> 2147483648 (bytes).

    A bare number must be a fraction in (0, 1]: ``"1"`` is all of the store-everything peak,
    never one byte; bytes take a unit. Anything else is a :class:`BudgetError` naming ``source``.
    """
    value = text.strip()
    if value.lower() == MIN:
        return MIN
    try:
        number = float(value)
    except ValueError:
        try:
            return parse_size(value)
        except BudgetError:
            raise BudgetError(
                f"cannot read {source} {text!r}: write a fraction in (0, 1] (0.5), a size with a unit "
                "(2GiB, 800MB, 123B), or 'min' for the smallest feasible budget"
            ) from None
    if 0.0 < number <= 1.0:
        return number
    if number > 1.0:
        raise BudgetError(
            f"{source} {text!r} has no unit: a bare number is a fraction in (0, 1]; for bytes add a unit, "
            f"e.g. {value}B, {value}MiB or {value}GiB"
        )
    raise BudgetError(f"{source} {text!r} must be positive: a fraction in (0, 1], 'min', or a size with a unit (2GiB)")


def is_min(budget) -> bool:
    """Whether ``budget`` asks for the smallest feasible budget (``"min"``, any case)."""
    return isinstance(budget, str) and budget.strip().lower() == MIN


def is_fraction(budget) -> bool:
    """Whether ``budget`` is a fraction (a float, or a string such as ``"0.5"``), resolved per graph."""
    if isinstance(budget, str) and not is_min(budget):
        budget = parse_budget_text(budget)
    return isinstance(budget, float)


def resolve_budget(budget, store_all_peak: int, fixed: int, *, smallest: Callable[[], int] | None = None) -> int | None:
    """The budget in bytes.

    ``store_all_peak`` is the store-everything plan's peak and ``fixed`` the graph's
    :func:`fixed_bytes` (both for fractions); ``smallest()`` returns the smallest feasible
    budget (for ``"min"``; the planner supplies it)."""
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise BudgetError(f"a budget cannot be a bool; write {_HOW}")
    if isinstance(budget, int):
        if budget < 0:
            raise BudgetError(f"a budget in bytes must be >= 0, got {budget}")
        return budget
    if isinstance(budget, float):
        if not 0.0 < budget <= 1.0:
            raise BudgetError(
                f"a float budget is a fraction of the memory a plan can change and must be in (0, 1], got {budget}; "
                "pass an int for bytes or a string such as '2GiB'"
            )
        return fraction_to_bytes(budget, store_all_peak, fixed)
    if isinstance(budget, str):  # read as on the command line: one meaning everywhere
        value = parse_budget_text(budget)
        if value == MIN:
            if smallest is None:
                raise BudgetError("budget='min' is resolved by solving: pass it to remat.optimize, plan or pareto")
            return int(smallest())
        return resolve_budget(value, store_all_peak, fixed)
    raise BudgetError(f"a budget must be {_HOW}; got a {type(budget).__name__}")


def fraction_to_bytes(fraction: float, store_all_peak: int, fixed: int) -> int:
    """``fixed + fraction * (store_all_peak - fixed)``, rounded down to a byte."""
    return int(fixed + math.floor(fraction * max(0, store_all_peak - fixed)))


def bytes_to_fraction(nbytes: int, store_all_peak: int, fixed: int) -> float | None:
    """The smallest fraction, to 4 decimals, that :func:`resolve_budget` turns into at least
    ``nbytes``; None when no fraction in (0, 1] does (``nbytes`` above the store-everything peak)."""
    if nbytes > store_all_peak:
        return None
    span = store_all_peak - fixed
    if span <= 0:
        return 1.0
    f = max(1, math.ceil((nbytes - fixed) / span * 1e4)) / 1e4
    while f < 1.0 and fraction_to_bytes(f, store_all_peak, fixed) < nbytes:  # float rounding
        f = round(f + 1e-4, 4)
    return min(f, 1.0)

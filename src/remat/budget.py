"""What a budget means, and how the user may write it.

The budget bounds the *peak increase of allocated memory during one forward+backward*
over what was live when the step began (gradients set to ``None`` first): activations,
temporaries and the gradients the step produces. Parameters, buffers and inputs are
outside it. Its Python type decides its unit:

* ``int``   bytes: ``budget=3 * 2**30``;
* ``str``   a size: ``"1.5GiB"``, ``"800MB"``, ``"512 KiB"``, ``"1e9"`` (bytes);
* ``float`` in (0, 1]: that fraction of the store-everything plan's peak (``1.0`` = all of it);
* ``None``  no limit.
"""

from __future__ import annotations

import re

from .errors import RematError

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


class BudgetError(RematError, ValueError):
    """A budget that cannot be understood."""


def parse_size(text: str) -> int:
    """``parse_size("1.5GiB") == 1610612736``; decimal units (MB) are powers of ten."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise BudgetError(
            f"cannot read the budget {text!r}: write a size such as '1.5GiB', '800MB' or '512KiB', "
            "an int of bytes, or a float in (0, 1] for a fraction of the store-everything peak"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def resolve_budget(budget, store_all_peak: int) -> int | None:
    """The budget in bytes, given the store_all plan's peak (for fractions)."""
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise BudgetError("a budget cannot be a bool")
    if isinstance(budget, int):
        if budget < 0:
            raise BudgetError(f"a budget in bytes must be >= 0, got {budget}")
        return budget
    if isinstance(budget, float):
        if not 0.0 < budget <= 1.0:
            raise BudgetError(
                f"a float budget is a fraction of the store-everything peak and must be in (0, 1], got {budget}; "
                "pass an int for bytes or a string such as '2GiB'"
            )
        return int(budget * store_all_peak)
    if isinstance(budget, str):
        return parse_size(budget)
    raise BudgetError(f"a budget must be an int (bytes), a str ('1.5GiB'), a float in (0, 1] or None, not {type(budget).__name__}")

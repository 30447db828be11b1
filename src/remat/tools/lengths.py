"""``remat plan MODEL --lengths 128:2048``: the predicted peak and overhead of every length bucket.

Users choose their batch size and longest sequence from this table: one capture of the step with
the sequence dimension symbolic, then a plan at each size bucket's edge (:func:`remat.plan_lengths`),
each bucket's row saying what any length in it will cost, or the smallest budget it needs.
``--output`` plots the predicted peak (and the budget) against the length.
"""

from __future__ import annotations

from rich.table import Table

from ..api import LengthPlan, plan_lengths
from ..errors import InfeasibleBudgetError, format_bytes


def parse_lengths(text: str) -> tuple[int, int]:
    """``"128:2048"`` -> ``(128, 2048)``; ``"512"`` -> ``(512, 512)``."""
    lo, _, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--lengths takes SMALLEST:LARGEST, e.g. 128:2048 (got {text!r})") from None
    if not 1 <= low <= high:
        raise ValueError(f"--lengths needs 1 <= SMALLEST <= LARGEST (got {text!r})")
    return low, high


def lengths_table(title: str, rows: list[LengthPlan], budget_bytes: int | None) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("lengths", "solver", "predicted peak", "overhead", "recomputed", "offloaded", "split"):
        table.add_column(name, justify="left" if name == "solver" else "right")
    low = 1
    for row in rows:
        span = f"{low}..{row.edge}"
        low = row.edge + 1
        if row.plan is None:
            least = getattr(row.error, "min_budget_bytes", None)
            why = f"needs {format_bytes(least)}" if isinstance(row.error, InfeasibleBudgetError) else str(row.error)
            table.add_row(span, "[red]infeasible[/]", why, "", "", "", "")
            continue
        p = row.plan
        chunks = p.info.get("split", {}).get("chunks")
        table.add_row(span, p.solver, format_bytes(p.peak_bytes), f"{p.overhead:+.1%}", str(p.recomputations),
                      str(len(p.offloaded_values)), f"{chunks} chunks" if chunks else "-")
    if budget_bytes is not None:
        table.caption = f"budget {format_bytes(budget_bytes)} at every length; a bucket's plan is made at its largest length"
    return table


def plot_lengths(rows: list[LengthPlan], budget_bytes: int | None, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    planned = [r for r in rows if r.plan is not None]
    ax.step([r.edge for r in planned], [r.plan.peak_bytes / 2**20 for r in planned], where="pre", marker="o",
            label="predicted peak (plan at the bucket's edge)")
    refused = [r for r in rows if r.plan is None and getattr(r.error, "min_budget_bytes", None)]
    if refused:
        ax.scatter([r.edge for r in refused], [r.error.min_budget_bytes / 2**20 for r in refused], marker="x",
                   color="red", label="infeasible: smallest budget it needs")
    if budget_bytes is not None:
        ax.axhline(budget_bytes / 2**20, color="gray", linestyle="--", label="budget")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length")
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plan_each_length(example, lengths: tuple[int, int], *, budget, solver: str, cost_model: str,
                     time_limit: float | None, split="auto") -> tuple[list[LengthPlan], int | None]:
    """The rows of :func:`remat.plan_lengths` for a loaded example, and the budget in bytes they used."""
    rows = plan_lengths(example.model, *example.args, lengths=lengths, budget=budget, solver=solver,
                        cost_model=cost_model, time_limit=time_limit, split=split, **example.kwargs)
    budgets = [r.plan.budget_bytes for r in rows if r.plan is not None and r.plan.budget_bytes is not None]
    return rows, (max(budgets) if budgets else None)


__all__ = ["parse_lengths", "lengths_table", "plot_lengths", "plan_each_length"]

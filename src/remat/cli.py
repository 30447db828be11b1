"""The ``remat`` command.

    remat demo                          GPT-2 trained at 100%, 50% and the smallest budget, measured
    remat plan gpt2 --budget 0.5        plan a built-in model (or module:factory), print the plan
    remat plan mypkg.models:build --budget 2GiB --solver chen_sqrt --save plan.json

A ``module:factory`` is a callable returning ``(model, example_args)`` or a
:class:`remat.zoo.Example`. ``sweep``, ``bench``, ``maxbatch`` and ``plot`` come with the
planners of the next issues.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from rich.console import Console


def _budget(text: str):
    if text.lower() in ("none", "all"):
        return None
    try:
        value = float(text)
    except ValueError:
        return text  # a size such as 1.5GiB
    if "." in text or "e" in text.lower():
        return value if value <= 1.0 else int(value)
    return int(text)


def _load(spec: str, size: str):
    from . import zoo

    if ":" not in spec:
        return zoo.build(spec, size=size)
    module_name, _, attr = spec.partition(":")
    made = getattr(importlib.import_module(module_name), attr)()
    if isinstance(made, zoo.Example):
        return made
    model, args = made
    return zoo.Example(spec, model, tuple(args), {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="remat", description="Fit a PyTorch training step into a memory budget.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="train a small GPT-2 at several budgets and measure it")
    demo.add_argument("--model", default="gpt2")
    demo.add_argument("--size", default="small", choices=["tiny", "small", "medium"])
    demo.add_argument("--steps", type=int, default=3)

    plan = sub.add_parser("plan", help="plan one model's training step and print the plan")
    plan.add_argument("model", help="a built-in model name (see remat.zoo.names()) or module:factory")
    plan.add_argument("--size", default="small", choices=["tiny", "small", "medium"])
    plan.add_argument("--budget", type=_budget, default=None,
                      help="bytes (int), a size ('1.5GiB'), or a fraction of store_all's peak (0.5)")
    plan.add_argument("--solver", default="auto")
    plan.add_argument("--cost-model", default="flops", choices=["flops", "unit"])
    plan.add_argument("--save", help="write the plan as JSON to this path")

    args = parser.parse_args(argv)
    console = Console(width=max(Console().width, 110))  # the tables need ~110 columns
    if args.command == "demo":
        from .demo import run_demo

        rows = run_demo(args.model, args.size, args.steps, console=console)
        return 0 if all(r.max_rel_err <= 1e-5 for r in rows) else 1
    if args.command == "plan":
        from .api import plan as make_plan
        from .errors import RematError

        example = _load(args.model, args.size)
        try:
            result = make_plan(example.model, *example.args, budget=args.budget, solver=args.solver,
                               cost_model=args.cost_model, **example.kwargs)
        except RematError as err:
            console.print(f"[red]{type(err).__name__}[/]: {err}")
            return 2
        console.print(result.graph.summary())
        console.print(result.summary())
        if args.save:
            result.save(args.save)
            console.print(f"saved to {args.save}")
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())

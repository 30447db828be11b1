"""The user's tools: the ``remat`` command, the demo, the Pareto sweep, max batch size, plots.

Owns what a person runs on top of the library: :mod:`.cli` (``remat plan|sweep|bench|maxbatch|
plot|demo``), :mod:`.demo`, :mod:`.pareto` (overhead against budget per planner),
:mod:`.max_batch` (the largest batch whose measured step fits) and :mod:`.plots` (timeline,
schedule matrix, Pareto front; it registers Plan.plot's kinds).

May import everything below it: ``remat.api``, the stages, and the example models
(``remat.models``). Nothing in the library imports this folder.

    from remat.tools.plots import plot_timeline
    plot_timeline(remat.plan(model, x, budget=0.5), "timeline.png")
"""

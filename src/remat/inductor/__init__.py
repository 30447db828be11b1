"""remat inside Inductor: Inductor's fused kernels, remat's plans and budget.

Owns the custom partitioner Inductor calls with the joint graph (:mod:`.partition`), the model
of what Inductor fuses and materialises (:mod:`.fusion`: the fused Graph remat plans), and the
cost model of Inductor's kernels (:mod:`.cost`, registered as ``cost_model="inductor"``).

May import: ``remat.capture``, ``remat.solvers``, ``remat.execute``, ``remat.cost`` and the
shared data below them. Only the entry points (``remat.api``, the ``remat`` package) import it.

    m = remat.compile(model, x, budget=0.4)       # what users type
    torch.compile(model, options={"custom_partitioner_fn": remat.partitioner(budget=0.4),
                                  **remat.inductor.INDUCTOR_CONSTRAINTS})   # by hand
"""

from . import cost  # noqa: F401  (registers cost_model="inductor")
from .fusion import Fused, draw_random_per_reader, fuse, recompute_light_values_per_reader
from .calibration import CALIBRATION_ROUNDS, calibrate, measured_step_peak
from .partition import (INDUCTOR_CONSTRAINTS, OFFLOAD_MIN_GAIN, OFFLOADING_SOLVERS, RematPartitioner, compiled_transfer_meta,
                          inductor_options, partitioner, plan_into_reused_bytes, with_transfer_costs)
from .scheduling import (MAX_FUSION_GAP, MEMORY_BEFORE, PLAN_PEAK, PlanOrderChoices, fusion_raises_peak, install_one_call_per_kernel,
                         install_plan_order_choices, store_random_masks, store_where_planned, tag_plan_memory)

__all__ = ["RematPartitioner", "partitioner", "inductor_options", "INDUCTOR_CONSTRAINTS", "OFFLOAD_MIN_GAIN",
           "OFFLOADING_SOLVERS", "compiled_transfer_meta", "plan_into_reused_bytes", "with_transfer_costs",
           "calibrate", "measured_step_peak", "CALIBRATION_ROUNDS",
           "PlanOrderChoices", "install_plan_order_choices", "install_one_call_per_kernel", "fusion_raises_peak",
           "tag_plan_memory", "store_random_masks", "store_where_planned", "MAX_FUSION_GAP", "MEMORY_BEFORE", "PLAN_PEAK",
           "Fused", "fuse", "draw_random_per_reader", "recompute_light_values_per_reader"]

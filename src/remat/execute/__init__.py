"""Execution: a Plan turned into the forward and backward graphs that run it.

Owns the lowering (:mod:`.lowering`: Plan + captured FX graph -> forward and backward FX graphs in
the boxed calling convention, recomputations replaying their random numbers exactly), what those
graphs call at run time (:mod:`.runtime`), the offload stores of the second memory tier
(:mod:`.offload`: pinned host memory on CUDA, checksummed files on the CPU), the custom operators
a compiled graph calls instead (:mod:`.compiled_ops`), and the measured bandwidth of the stores
(:mod:`.transfer`), which the simulator uses to time copies. It never decides: what to keep,
recompute or offload comes from the plan.

May import: ``remat.capture``, ``remat.cost``, ``remat.plan``, ``remat.simulate``, ``remat.graph``,
``remat.measure``, ``remat.errors``.

    fw, bw = lower(capture, plan)     # boxed GraphModules: AOTAutograd's partition result
"""

from .lowering import lower, offload_store_kind
from .offload import FILE_STORE, PINNED_STORE, OffloadStore
from .transfer import TransferCosts, make_transfer_meta, transfer_costs

__all__ = ["lower", "offload_store_kind", "OffloadStore", "FILE_STORE", "PINNED_STORE",
           "TransferCosts", "transfer_costs", "make_transfer_meta"]

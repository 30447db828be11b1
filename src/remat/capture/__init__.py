"""Capture: a model's training step as one joint forward+backward graph, and a Graph of it.

Owns the contact with Dynamo and AOTAutograd's joint graph (:mod:`.joint`: the FX graph to a
:class:`~remat.graph.Graph`, with exact bytes, aliases folded, random ops marked), running the
step once without lasting effects (:mod:`.step`), turning Dynamo's failures into errors that name
the user's line (:mod:`.errors`), the checks of DDP/FSDP/accelerate wrapping (:mod:`.wrappers`),
and the rewrite of the ops that set the peak into row chunks (:mod:`.split`, rules in
:mod:`.split_rules`). It builds; it never plans or lowers.

May import: ``remat.measure``, ``remat.graph``, ``remat.errors``.

    capture = capture_joint(joint_gm, num_fwd_outputs, cost_fn=make_cost_fn("flops"))
    capture.graph          # the Graph every solver reads
    capture.node_of[i]     # graph node id -> the FX node it came from
"""

from .errors import PlanReady, capture_error, unwrap_compile_error, user_frame, users_own_exception
from .joint import Capture, capture_joint, is_batch_norm_with_stats, joint_device, rng_state_bytes
from .step import detached_copies, no_lasting_effects, training_step_mode
from .wrappers import (check_materialized, check_unwrapped, quiet_transformers_logging, register_accelerate_backend,
                       watch_for_transformers)
from ..measure import allocated_bytes  # noqa: F401  (where capture's byte counts come from; its old home)

__all__ = ["Capture", "capture_joint", "joint_device", "is_batch_norm_with_stats", "rng_state_bytes",
           "PlanReady", "capture_error", "unwrap_compile_error", "user_frame", "users_own_exception",
           "detached_copies", "no_lasting_effects", "training_step_mode",
           "check_materialized", "check_unwrapped", "register_accelerate_backend", "quiet_transformers_logging",
           "watch_for_transformers"]

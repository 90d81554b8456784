"""Who a Ray worker is: its node, job, actor (class, name, id), placement-group bundle and GPUs.

Read from Ray's runtime context in the worker itself, only when `ray` is already imported and
connected there (a worker always is): the recorder never imports Ray into a program that has none.
"""
from __future__ import annotations

import re
import sys
import warnings
from typing import Any

# A placement-group bundle's resources are named `CPU_group_<index>_<pg id>` in the assigned resources.
_BUNDLE = re.compile(r"_group_(\d+)_[0-9a-f]+$")


def ray_identity() -> dict[str, Any] | None:
    """{ray_node_id, ray_job_id, ray_worker_id, ray_actor_id, ray_actor_class, ray_actor_name,
    ray_placement_group, ray_bundle_index, ray_gpu_ids} in a connected Ray process, else None."""
    with warnings.catch_warnings():  # Ray's deprecation notes about its own internals: not the job's output
        warnings.simplefilter("ignore")
        return _read()


def _read() -> dict[str, Any] | None:
    ray = sys.modules.get("ray")
    try:
        if ray is None or not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        fields: dict[str, Any] = {"ray_node_id": ctx.get_node_id(), "ray_job_id": ctx.get_job_id(),
                                  "ray_worker_id": ctx.get_worker_id()}
        actor_id = ctx.get_actor_id()
        if actor_id:
            fields["ray_actor_id"] = actor_id
            fields["ray_actor_name"] = ctx.get_actor_name() or None
            fields["ray_actor_class"] = _actor_class(ctx)
            fields["ray_restarted"] = bool(getattr(ctx, "was_current_actor_reconstructed", False))
        fields["ray_placement_group"] = ctx.get_placement_group_id()
        fields["ray_bundle_index"] = _bundle_index(_raw_resources(ctx))
        fields["ray_gpu_ids"] = [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]
        return fields
    except Exception:  # a Ray that lacks one of these: the process is still recorded, without them
        return None


def _actor_class(ctx) -> str | None:
    try:
        return ctx.current_actor._ray_actor_creation_function_descriptor.class_name
    except Exception:
        return None


def _raw_resources(ctx) -> dict[str, Any]:
    """The worker's resources under their placement-group names (`CPU_group_0_<pg>`): the public
    `get_assigned_resources` folds them back into `CPU`, losing the bundle."""
    try:
        return dict(ctx.worker.core_worker.resource_ids())
    except Exception:
        return {}


def _bundle_index(resources: dict[str, Any]) -> int | None:
    for name in resources:
        found = _BUNDLE.search(name)
        if found:
            return int(found.group(1))
    return None

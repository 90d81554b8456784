"""`RAY_RUNTIME_ENV_HOOK=miles_profile.cluster.hook.runtime_env_hook`: `record` sets it for its command.

Ray calls it in the driver inside `ray.init`, with the job's runtime env already merged (the submission's
and the script's). It adds the run's variables to `env_vars` where the job does not set them already (a
user's or a submission's value wins; adding one that is there would be the same merge) and leaves every
other field alone, so the user's `env_vars`, `worker_process_setup_hook`, `pip`, ... stay as they were.
Then, once connected, it starts one sampler per node (driver.py). A hook the user had set before
`record` is kept in MILES_PROFILE_NEXT_RUNTIME_ENV_HOOK and called first. Never raises for the
recording's sake: the job runs on, unrecorded, with one warning.
"""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

from miles_profile import names
from miles_profile.cluster.env import worker_env

NEXT_HOOK_ENV = "MILES_PROFILE_NEXT_RUNTIME_ENV_HOOK"


def runtime_env_hook(runtime_env: dict[str, Any] | None) -> dict[str, Any] | None:
    runtime_env = _next_hook(runtime_env)
    carried = worker_env()
    if not carried.get(names.RUN_DIR_ENV):
        return runtime_env
    try:
        merged = dict(runtime_env or {})
        env_vars = dict(merged.get("env_vars") or {})
        for key, value in carried.items():
            env_vars.setdefault(key, value)
        merged["env_vars"] = env_vars
        _mark_hook_ran(carried[names.RUN_DIR_ENV])
        _after_init(lambda: _start_cluster(carried[names.RUN_DIR_ENV]))
        return merged
    except Exception as exc:  # noqa: BLE001 - the job's ray.init must never fail for us
        print(f"miles_profile: warning: Ray workers not recorded: {exc}", file=sys.stderr, flush=True)
        return runtime_env


def _mark_hook_ran(run_dir: str) -> None:
    """cluster.json before connecting: `record` then knows the hook ran, whether or not the cluster answers."""
    from miles_profile.logdir.cluster import read_cluster, write_cluster
    if read_cluster(Path(run_dir)) is None:
        try:
            write_cluster(Path(run_dir), {"hook_ran": True, "connected": False, "driver_pid": os.getpid(), "nodes": []})
        except OSError:  # a driver on another machine than the run directory (ray job submit): the nodes say
            pass


def _next_hook(runtime_env):
    target = os.environ.get(NEXT_HOOK_ENV)
    if not target:
        return runtime_env
    module, _, name = target.rpartition(".")
    return getattr(importlib.import_module(module), name)(runtime_env)


def _after_init(callback) -> None:
    from ray._private import worker  # Ray's post-init hooks: run once ray.init has connected
    hooks = worker._post_init_hooks
    if not any(getattr(h, "_miles_profile", False) for h in hooks):
        callback._miles_profile = True
        hooks.append(callback)


def _start_cluster(run_dir: str) -> None:
    try:
        from miles_profile.cluster import driver
        driver.start(run_dir)
    except Exception as exc:  # noqa: BLE001 - the job runs on; the report says its nodes are missing
        print(f"miles_profile: warning: no per-node samplers for this Ray job: {exc}", file=sys.stderr, flush=True)

"""What a Ray job's processes need to join the run, and where a node writes it. No `ray` import here:
`phases` calls `node_run_dir` in every recorded process.

- `RAY_RUNTIME_ENV_HOOK` (read by `ray.init` in the driver) names `hook.runtime_env_hook`, which adds
  `worker_env()` to the job's runtime env `env_vars`, so every worker (actor or task, on every node)
  finds the run directory as a child of `record --exec` does.
- `MILES_PROFILE_NODE_LOG_DIR`, set in a node's environment at `ray start`, makes that node's processes
  write under it (a local disk) instead of the driver's path; the node's sampler gathers it to the driver.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from miles_profile import names, stacks
from miles_profile.identity import RUN_ID_ENV

HOOK = "miles_profile.cluster.hook.runtime_env_hook"
HOOK_ENV = "RAY_RUNTIME_ENV_HOOK"
NODE_LOG_DIR_ENV = "MILES_PROFILE_NODE_LOG_DIR"
# Ray sets it in every worker process it starts (ray_constants.RAY_INTERNAL_FLAGS).
RAY_JOB_ID_ENV = "RAY_JOB_ID"
# Also set by the raylet in each worker it starts: which node (raylet) a worker belongs to.
RAY_RAYLET_PID_ENV = "RAY_RAYLET_PID"
# Set by the job submission in the entrypoint's environment (job_supervisor.py).
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
# Every variable a recorded process reads (record sets them for its child; workers get them from the job).
CARRIED = (names.RUN_DIR_ENV, RUN_ID_ENV, names.HEAP_ENV, stacks.STACKS_ENV, stacks.MAX_ENTRIES_ENV, names.METRICS_PORT_ENV,
           names.INTERVAL_ENV)


def worker_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of ours set in `environ` (default: this process's) that workers need."""
    environ = os.environ if environ is None else environ
    return {key: environ[key] for key in CARRIED if environ.get(key)}


def in_ray_worker() -> bool:
    return bool(os.environ.get(RAY_JOB_ID_ENV))


def node_run_dir(run_dir: str | os.PathLike) -> Path:
    """Where this process writes the run `run_dir`: there, unless it is a Ray worker on a node with its
    own log dir (MILES_PROFILE_NODE_LOG_DIR) or one that can't see the driver's path (no shared file
    system): then a node-local directory of the same name, created with a run meta of its own."""
    run_dir = Path(run_dir)
    if not in_ray_worker():
        return run_dir
    base = os.environ.get(NODE_LOG_DIR_ENV)
    local = Path(base) / run_dir.name if base else run_dir
    if not (local / "meta.json").is_file():
        make_node_run_dir(local)
    return local


def make_node_run_dir(local: Path) -> None:
    """A node's copy of the run: the driver's run id, so its files merge into the driver's run."""
    from miles_profile.logdir.writer import write_run_meta
    local.mkdir(parents=True, exist_ok=True)
    if not (local / "meta.json").is_file():
        write_run_meta(local, {"run_id": os.environ.get(RUN_ID_ENV) or local.name, "node_copy": True,
                               "pid": os.getpid()})


def job_config_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    """env_vars of the submitted job's runtime env (`ray job submit --runtime-env-json`), if any."""
    text = (os.environ if environ is None else environ).get(RAY_JOB_CONFIG_ENV)
    try:
        return dict(((json.loads(text) or {}).get("runtime_env") or {}).get("env_vars") or {}) if text else {}
    except (ValueError, AttributeError, TypeError):
        return {}

"""The forecast of a run recorded before plans were stored: the trainer's planner (trainer/plan.py) re-run on
the flags in the run's meta. The run model asks the trainer, never the other way round.

    plan_for_run(run, cpu_count=None) -> (pids, plan dict) | None
"""
from __future__ import annotations

from miles_profile.runmodel.forecast import plan_pids
from trainer.args import parse_args
from trainer.plan import forecast

# Commit d37e03b (2026-12-02 20:43 UTC): from then on the engine's release clears cuBLAS's workspaces.
# Runs recorded before it (sample_logs/h200/1-8) are planned with the trainer they were recorded with.
WORKSPACES_CLEARED_SINCE = 1796244213


def plan_for_run(run, cpu_count: int | None = None) -> tuple[dict[str, int], dict] | None:
    """(pids, plan dict) for a run recorded before plans were stored: the plan of the trainer's flags
    (its own command line under torchrun, else record's after `--`), on cuda when the run saw a GPU,
    with the rollout memory backend and engine its meta announced. None without a trainer process.
    `cpu_count`: the recording machine's cores, which logs do not hold (default: this machine's)."""
    trainer = next((p for p in run.processes if p.get("role") in ("in_process", "actor")), None)
    if trainer is None:
        return None
    command = list(trainer.get("command") or [])
    if command and command[0].endswith("trainer/train.py"):
        flags = command[1:]
    elif "--" in command:
        flags = command[command.index("--") + 1:]
    else:
        return None
    backend = (trainer.get("annotations") or {}).get("rollout_memory_backend")
    if backend and "--rollout-memory-backend" not in flags:
        flags += ["--rollout-memory-backend", backend]
    if trainer.get("role") == "actor" and "--rollout-engine" not in flags:
        flags += ["--rollout-engine", "server"]  # torchrun's default
    cuda = any(p.get("devices") for p in run.processes)
    cfg = parse_args(flags, cuda_available=cuda, world_size=int(trainer.get("world_size") or 1),
                     check_environment=False)
    clears = float(run.meta.get("start_time") or WORKSPACES_CLEARED_SINCE) >= WORKSPACES_CLEARED_SINCE
    return plan_pids(run, trainer), forecast(cfg, clears_workspaces=clears, cpu_count=cpu_count).to_json()

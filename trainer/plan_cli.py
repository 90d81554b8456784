"""`python -m trainer.train --plan <flags>`: print the memory forecast of a configuration and exit.

Nothing is allocated and CUDA is never touched: the flags are validated without this machine's
environment (`args.validate(check_environment=False)`), so an H200 configuration can be planned on a
laptop with `--device cuda`. `--device auto` plans for cuda when this machine has a GPU.
"""
from __future__ import annotations

from trainer.args import build_parser, parse_args
from trainer.config import GiB
from trainer.plan import Plan, forecast

TOP_CATEGORIES = 4
# Commit d37e03b (2026-12-02 20:43 UTC): from then on the engine's release clears cuBLAS's workspaces.
# Runs recorded before it (sample_logs/h200/1-8) are planned with the trainer they were recorded with.
WORKSPACES_CLEARED_SINCE = 1796244213


def plan_args(argv: list[str]):
    """The RunConfig a --plan describes (exits 2 with one line on invalid flags, as a run would)."""
    argv = [a for a in argv if a != "--plan"]
    device = build_parser().parse_args(argv).device
    cuda = device == "cuda" or (device == "auto" and _cuda_available())
    return parse_args(argv, cuda_available=cuda, world_size=1, check_environment=False)


def _cuda_available() -> bool:
    import torch  # is_available() counts devices through the driver; it creates no context
    return torch.cuda.is_available()


def render(plan: Plan) -> str:
    """One line per (phase, device): the peak (allocator's view beside it where they differ) and the
    largest categories at that peak."""
    a = plan.assumptions
    lines = [f"forecast for {plan.device}: policy {a['num_params'] / 1e6:.1f}M params"
             + (f", critic {a['critic_params'] / 1e6:.1f}M" if a.get("critic_params") else "")
             + f", rollout memory backend {a['rollout_memory_backend']}, train offload backend "
             f"{a['offload_train_backend']}, generate batch {a['generate_batch']}",
             f"{'phase':<16} {'device':<6} {'peak GiB':>9} {'alloc GiB':>9}  largest parts (GiB)"]
    for p in plan.phases:
        parts = sorted(p.breakdown.items(), key=lambda kv: -kv[1])[:TOP_CATEGORIES]
        text = ", ".join(f"{name} {nbytes / GiB:.3f}" for name, nbytes in parts)
        allocator = f"{p.allocator / GiB:>9.3f}" if p.device == "cuda" else f"{'-':>9}"
        lines.append(f"{p.phase:<16} {p.device:<6} {p.peak / GiB:>9.3f} {allocator}  {text}")
    lines.append("host: bytes the trainer puts in host memory (offload copies, host optimizer, staging; on a "
                 "CPU run every tensor), not the process's own footprint")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    print(render(forecast(plan_args(argv))), flush=True)
    return 0


def plan_for_run(run, cpu_count: int | None = None) -> tuple[dict[str, int], dict] | None:
    """(pids, plan dict) for a run recorded before plans were stored: the plan of the trainer's flags
    (its own command line under torchrun, else record's after `--`), on cuda when the run saw a GPU,
    with the rollout memory backend and engine its meta announced. None without a trainer process.
    `cpu_count`: the recording machine's cores, which logs do not hold (default: this machine's)."""
    from miles_profile.runmodel.forecast import plan_pids
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
